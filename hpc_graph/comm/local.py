"""``LocalCommunicator``: the size-1 communicator used when no launcher started the process.

Every collective is the identity, ``exchange`` only copies a rank's message to
itself, nothing is counted in ``bytes_sent`` and MPI is never imported. It lets
the ``single`` engine and every tool run as a plain ``python`` process.
"""
from __future__ import annotations

import logging
import os
from typing import Any, NoReturn

import numpy as np
import torch

from hpc_graph.comm.communicator import MAX_MESSAGE_BYTES, Communicator, _flush_streams

log = logging.getLogger(__name__)


class LocalCommunicator(Communicator):
    """Rank 0 of 1; see the module docstring."""

    backend = "local"

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES):
        super().__init__(0, 1, 0, 1, max_message_bytes=max_message_bytes)

    def _device_capable(self, device: torch.device) -> bool:
        return True

    def _no_peer(self, *args: Any) -> Any:
        raise RuntimeError("LocalCommunicator has no peers to communicate with")

    _isend = _no_peer
    _irecv = _no_peer

    def _waitall(self, handles: list[Any]) -> None:
        if handles:
            self._no_peer()

    def _allreduce_flat(self, t: torch.Tensor, op: str) -> None:
        return None

    def dup(self) -> "LocalCommunicator":
        return LocalCommunicator(self.max_message_bytes)

    def _bcast_flat(self, buf: torch.Tensor, root: int) -> None:
        return None

    def _alltoall_int64(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.int64).copy()

    def _alltoallv_bytes(self, send, send_bytes, send_displs, recv, recv_bytes, recv_displs) -> None:
        recv.copy_(send)

    def allgather_object(self, obj: Any) -> list:
        return [obj]

    def barrier(self) -> None:
        return None

    def abort(self, code: int = 1) -> NoReturn:
        """Exit this (only) process immediately with status ``code``."""
        log.error("aborting with exit status %d", code)
        _flush_streams()
        os._exit(int(code))
