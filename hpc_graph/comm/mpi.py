"""``MPICommunicator``: the default backend, mpi4py on NumPy (or CUDA) buffers.

CPU tensors are handed to MPI as zero-copy NumPy views with the uppercase
buffer methods (``Isend``/``Irecv`` + ``Waitall``, ``Alltoallv``,
``Allreduce(IN_PLACE)``, ``Bcast``). CUDA tensors go directly to MPI when the
library is CUDA-aware, otherwise they are staged through host memory by the
base class. CUDA awareness is not queryable portably; it is taken from, in
order: ``HPC_GRAPH_CUDA_AWARE_MPI=0|1``, ``MPI.Query_cuda_support()`` (newer
mpi4py), and the switches sites set to turn it on (``MPICH_GPU_SUPPORT_ENABLED``
on Cray MPICH, ``MV2_USE_CUDA``, ``OMPI_MCA_opal_cuda_support``); else False.

All traffic runs on a duplicate of ``MPI.COMM_WORLD``, so it never matches
messages of other code using the world communicator.
"""
from __future__ import annotations

import logging
import os
import pickle
from typing import Any, NoReturn

import numpy as np
import torch

from hpc_graph.comm.abort import ABORT_GRACE_S
from hpc_graph.comm.communicator import (MAX_MESSAGE_BYTES, Communicator,
                                         _env_flag, _flush_streams)

log = logging.getLogger(__name__)

_TYPE_NAMES = {
    torch.float32: "FLOAT", torch.float64: "DOUBLE",
    torch.int64: "INT64_T", torch.int32: "INT32_T", torch.int16: "INT16_T", torch.int8: "INT8_T",
    torch.uint8: "UINT8_T", torch.bool: "C_BOOL",
    torch.complex64: "C_FLOAT_COMPLEX", torch.complex128: "C_DOUBLE_COMPLEX",
}
_OP_NAMES = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN"}
_BOOL_OPS = {"sum": "LOR", "max": "LOR", "prod": "LAND", "min": "LAND"}


def detect_cuda_aware(mpi_module: Any = None) -> bool:
    """Whether the MPI library can read and write CUDA device memory (see module docstring)."""
    forced = _env_flag("HPC_GRAPH_CUDA_AWARE_MPI")
    if forced is not None:
        return forced
    query = getattr(mpi_module, "Query_cuda_support", None) if mpi_module is not None else None
    if query is not None:
        try:
            return bool(query())
        except Exception:  # not implemented by this MPI library
            pass
    for name in ("MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA", "OMPI_MCA_opal_cuda_support"):
        if _env_flag(name):
            return True
    return False


class MPICommunicator(Communicator):
    """Communicator over mpi4py.

    Args:
        comm: the mpi4py communicator to duplicate (default ``MPI.COMM_WORLD``).
        max_message_bytes: largest single message; larger payloads are chunked.
        cuda_aware: pass CUDA tensors to MPI directly; default :func:`detect_cuda_aware`.
    """

    backend = "mpi"
    shorter_receives = True  # MPI receives a message into a larger posted buffer

    def __init__(self, comm: Any = None, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 cuda_aware: bool | None = None):
        from hpc_graph.comm.env import select_mpi_library
        select_mpi_library()  # before mpi4py loads a library: Open MPI's under its launcher
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = (MPI.COMM_WORLD if comm is None else comm).Dup()
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self._comm.Get_rank())
        local_rank, local_size = node.Get_rank(), node.Get_size()
        node.Free()
        super().__init__(self._comm.Get_rank(), self._comm.Get_size(), local_rank, local_size,
                         max_message_bytes=max_message_bytes)
        self.cuda_aware = detect_cuda_aware(MPI) if cuda_aware is None else bool(cuda_aware)

    @property
    def mpi_comm(self) -> Any:
        """The private mpi4py communicator (a duplicate of the one given)."""
        return self._comm

    # --------------------------------------------------------------- buffers
    def _device_capable(self, device: torch.device) -> bool:
        return device.type == "cpu" or (device.type == "cuda" and self.cuda_aware)

    @staticmethod
    def _raw(t: torch.Tensor) -> Any:
        """The object mpi4py reads: a NumPy view on CPU, the tensor (CUDA array interface) on GPU."""
        return t if t.is_cuda else t.numpy()

    def _typed(self, t: torch.Tensor) -> list:
        return [self._raw(t), getattr(self._MPI, _TYPE_NAMES[t.dtype])]

    # ------------------------------------------------------------ primitives
    def _isend(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        return self._comm.Isend([self._raw(buf), self._MPI.BYTE], dest=peer, tag=tag)

    def _irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        return self._comm.Irecv([self._raw(buf), self._MPI.BYTE], source=peer, tag=tag)

    def _waitall(self, handles: list[Any]) -> None:
        if handles:
            self._MPI.Request.Waitall(handles)

    def _testall(self, handles: list[Any]) -> bool:
        return (not handles) or bool(self._MPI.Request.Testall(handles))

    def _iallreduce_flat(self, t: torch.Tensor) -> list[Any]:
        if t.dtype not in _TYPE_NAMES or t.dtype in (torch.float16, torch.bfloat16, torch.bool):
            raise ValueError(f"allreduce_start: dtype {t.dtype} is not supported by the MPI backend")
        return [self._comm.Iallreduce(self._MPI.IN_PLACE, self._typed(t), op=self._MPI.SUM)]

    def dup(self) -> "MPICommunicator":
        """A duplicate of this communicator (``MPI_Comm_dup``; collective)."""
        return MPICommunicator(self._comm, self.max_message_bytes, self.cuda_aware)

    def _allreduce_flat(self, t: torch.Tensor, op: str) -> None:
        if t.dtype in (torch.float16, torch.bfloat16):  # no portable MPI type: reduce as float32
            wide = t.float()
            self._allreduce_flat(wide, op)
            t.copy_(wide)
            return
        if t.dtype not in _TYPE_NAMES:
            raise ValueError(f"allreduce_: dtype {t.dtype} is not supported by the MPI backend")
        if t.is_complex() and op in ("max", "min"):
            raise ValueError(f"allreduce_: op {op!r} is undefined for complex tensors")
        op_name = (_BOOL_OPS if t.dtype == torch.bool else _OP_NAMES)[op]
        self._comm.Allreduce(self._MPI.IN_PLACE, self._typed(t), op=getattr(self._MPI, op_name))

    def _bcast_flat(self, buf: torch.Tensor, root: int) -> None:
        self._comm.Bcast([self._raw(buf), self._MPI.BYTE], root=root)

    def _alltoall_int64(self, values: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(values, dtype=np.int64)
        recv = np.empty_like(send)
        self._comm.Alltoall([send, self._MPI.INT64_T], [recv, self._MPI.INT64_T])
        return recv

    def _alltoallv_bytes(self, send: torch.Tensor, send_bytes: np.ndarray, send_displs: np.ndarray,
                         recv: torch.Tensor, recv_bytes: np.ndarray, recv_displs: np.ndarray) -> None:
        as_int = lambda a: [int(x) for x in a]  # noqa: E731  (C int counts; checked by caller)
        self._comm.Alltoallv(
            [self._raw(send), (as_int(send_bytes), as_int(send_displs)), self._MPI.BYTE],
            [self._raw(recv), (as_int(recv_bytes), as_int(recv_displs)), self._MPI.BYTE])

    # ------------------------------------------------------------ public API
    def allgather_object(self, obj: Any) -> list:
        """Gather one picklable object per rank; the list in rank order on every rank."""
        if self.size == 1:
            return [obj]
        with self._timed("allgather_object"):
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            gathered = self._comm.allgather(data)
            self._count("allgather_object", len(data))
            return [obj if r == self.rank else pickle.loads(blob) for r, blob in enumerate(gathered)]

    def barrier(self) -> None:
        """Block until every rank reached the barrier."""
        with self._timed("barrier"):
            self._comm.Barrier()

    def abort(self, code: int = 1) -> NoReturn:
        """``MPI_Abort`` on ``COMM_WORLD``: every rank of the job ends with status ``code``."""
        _flush_streams(ABORT_GRACE_S)
        try:
            self._MPI.COMM_WORLD.Abort(int(code))
        finally:  # Abort does not return; if the library did, do not keep running
            os._exit(int(code))
