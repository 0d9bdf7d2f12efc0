"""``TorchDistCommunicator``: the same interface over ``torch.distributed``.

Process-group backends: gloo for CPU tensors, NCCL for CUDA tensors when
CUDA and NCCL are present, oneCCL for XPU tensors when its bindings are
installed (``"cpu:gloo,cuda:nccl"`` style specs, one group). Override with the
``dist_backend`` argument or ``HPC_GRAPH_TORCH_BACKEND``. Tensors on a device
without a backend for it are staged through host memory.

Rendezvous without extra setup: when ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
``WORLD_SIZE`` are not all set (i.e. not under torchrun), they are derived
from MPI: rank 0 picks a free TCP port and broadcasts it with mpi4py; the
address is ``127.0.0.1`` when all ranks share a node, else rank 0's hostname
(``HPC_GRAPH_MASTER_ADDR`` overrides). ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``
come from an MPI shared-memory split. Point-to-point traffic is posted with
``batch_isend_irecv`` so NCCL cannot deadlock on the order of sends.
"""
from __future__ import annotations

import atexit
import datetime
import logging
import os
import pickle
import socket
import sys
from typing import Any, NoReturn

import numpy as np
import torch

from hpc_graph.comm.abort import ABORT_GRACE_S
from hpc_graph.comm.communicator import (MAX_MESSAGE_BYTES, Communicator,
                                         _flush_streams)

log = logging.getLogger(__name__)

_RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def bootstrap_env_from_mpi() -> None:
    """Set ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` from MPI (collective over ``MPI.COMM_WORLD``); variables
    already set are kept. Without any launcher: a one-process rendezvous on 127.0.0.1.
    """
    from hpc_graph.comm.env import launcher_name

    if launcher_name() == "none":
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    hosts = world.gather(socket.gethostname(), root=0)
    chosen = None
    if world.Get_rank() == 0:
        addr = os.environ.get("MASTER_ADDR") or os.environ.get("HPC_GRAPH_MASTER_ADDR")
        if not addr:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostname()
        port = os.environ.get("MASTER_PORT") or str(_free_port())
        chosen = (addr, port)
    addr, port = world.bcast(chosen, root=0)
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ.setdefault("MASTER_PORT", port)
    os.environ.setdefault("RANK", str(world.Get_rank()))
    os.environ.setdefault("WORLD_SIZE", str(world.Get_size()))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(local_size))


def _default_backend_spec() -> str:
    import torch.distributed as dist

    spec = os.environ.get("HPC_GRAPH_TORCH_BACKEND")
    if spec:
        return spec
    parts = ["cpu:gloo"]
    if torch.cuda.is_available() and dist.is_nccl_available():
        parts.append("cuda:nccl")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
            parts.append("xpu:ccl")
        except ImportError:
            pass
    return ",".join(parts)


def _destroy_group(dist) -> None:
    """atexit hook: destroy the default process group if it is still there."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # at exit, a failing teardown must not mask the real status
        log.debug("destroy_process_group at exit failed: %s", exc)


class TorchDistCommunicator(Communicator):
    """Communicator over an initialised (or, here, initialised on demand) default process group.

    Args:
        dist_backend: process-group backend spec (``"gloo"``, ``"nccl"``,
            ``"cpu:gloo,cuda:nccl"``...); default per the module docstring. A plain
            ``"nccl"`` becomes ``"cpu:gloo,cuda:nccl"``: counts and objects travel in CPU tensors.
        max_message_bytes: largest single message; larger payloads are chunked.
        timeout_s: collective timeout given to ``init_process_group`` (seconds).
    """

    backend = "torch"

    def __init__(self, dist_backend: str | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 timeout_s: float = 600.0):
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this torch build")
        self._dist = dist
        if not dist.is_initialized():
            if any(name not in os.environ for name in _RENDEZVOUS_VARS):
                bootstrap_env_from_mpi()
            spec = dist_backend or _default_backend_spec()
            if spec == "nccl":  # keep a CPU backend for counts and pickled objects
                spec = "cpu:gloo,cuda:nccl"
            if "nccl" in spec and torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            dist.init_process_group(backend=spec, init_method="env://",
                                    timeout=datetime.timedelta(seconds=timeout_s))
            # Tear the group down before interpreter exit: gloo's worker threads still
            # running at exit abort the process ("terminate called without an active exception").
            atexit.register(_destroy_group, dist)
            log.debug("torch.distributed initialised: backend %s, rank %d of %d via %s:%s",
                      spec, dist.get_rank(), dist.get_world_size(),
                      os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        self.dist_backend = str(dist.get_backend())
        rank, size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        super().__init__(rank, size, local_rank, local_size, max_message_bytes=max_message_bytes)

    def _device_capable(self, device: torch.device) -> bool:
        if device.type == "cpu":
            return True
        needed = {"cuda": "nccl", "xpu": "ccl"}.get(device.type)
        return needed is not None and needed in self.dist_backend

    # ------------------------------------------------------------ primitives
    def _isend(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        return self._dist.P2POp(self._dist.isend, buf, peer, tag=tag)

    def _irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        return self._dist.P2POp(self._dist.irecv, buf, peer, tag=tag)

    def _launch(self, handles: list[Any]) -> list[Any]:
        return self._dist.batch_isend_irecv(handles) if handles else []

    def _waitall(self, handles: list[Any]) -> None:
        for handle in handles:
            handle.wait()

    def _allreduce_flat(self, t: torch.Tensor, op: str) -> None:
        if t.dtype == torch.bool:  # gloo has no bool reduction: any / all through uint8
            wide = t.to(torch.uint8)
            self._allreduce_flat(wide, "max" if op in ("sum", "max") else "min")
            t.copy_(wide.bool())
            return
        ops = {"sum": self._dist.ReduceOp.SUM, "prod": self._dist.ReduceOp.PRODUCT,
               "max": self._dist.ReduceOp.MAX, "min": self._dist.ReduceOp.MIN}
        if t.is_complex() and op in ("max", "min"):
            raise ValueError(f"allreduce_: op {op!r} is undefined for complex tensors")
        self._dist.all_reduce(t, op=ops[op])

    def _bcast_flat(self, buf: torch.Tensor, root: int) -> None:
        self._dist.broadcast(buf, src=root)

    def _alltoall_int64(self, values: np.ndarray) -> np.ndarray:
        send = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        recv = torch.empty_like(send)
        self._dist.all_to_all_single(recv, send)
        return recv.numpy()

    def _alltoallv_bytes(self, send: torch.Tensor, send_bytes: np.ndarray, send_displs: np.ndarray,
                         recv: torch.Tensor, recv_bytes: np.ndarray, recv_displs: np.ndarray) -> None:
        self._dist.all_to_all_single(recv, send, output_split_sizes=[int(x) for x in recv_bytes],
                                     input_split_sizes=[int(x) for x in send_bytes])

    # ------------------------------------------------------------ public API
    def allgather_object(self, obj: Any) -> list:
        """Gather one picklable object per rank; the list in rank order on every rank."""
        if self.size == 1:
            return [obj]
        with self._timed("allgather_object"):
            out: list[Any] = [None] * self.size
            self._dist.all_gather_object(out, obj)
            self._count("allgather_object", len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))
            out[self.rank] = obj
            return out

    def barrier(self) -> None:
        """Block until every rank reached the barrier."""
        with self._timed("barrier"):
            self._dist.barrier()

    def abort(self, code: int = 1) -> NoReturn:
        """End the job: ``MPI_Abort`` when MPI was used for the rendezvous, else exit this
        process at once (the launcher, or the peers' broken connections, end the rest)."""
        _flush_streams(ABORT_GRACE_S)
        mpi = sys.modules.get("mpi4py.MPI")
        try:
            if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
                mpi.COMM_WORLD.Abort(int(code))
        finally:
            os._exit(int(code))
