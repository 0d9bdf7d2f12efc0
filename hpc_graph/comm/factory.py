"""``get_communicator``: the communicator of this process, from the backend asked for and the launcher.

Backends are imported only when one is created, so importing this module never initialises MPI.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from hpc_graph.comm.communicator import Communicator

# the factory's messages keep the logger name they had beside the Communicator class
log = logging.getLogger("hpc_graph.comm.communicator")

_CACHE: dict[str, Communicator] = {}
_BACKENDS = ("mpi", "torch", "local")


def init(backend: str = "mpi", **options: Any) -> Communicator:
    """Start this process as one rank of a job: the process-wide settings
    (:func:`~hpc_graph.comm.env.prepare_process`: huge pages for torch's large tensors, the MPI library Open
    MPI's launcher needs), the communicator (:func:`get_communicator`: rank and size from the launcher --
    ``mpiexec``, ``srun``, ``torchrun`` -- or one process without one), and on more than one rank the abort
    handler (:func:`~hpc_graph.comm.abort.install_abort_handler`: an exception on any rank ends the whole job
    instead of leaving the others waiting). Call it first, before creating tensors.

    Returns the communicator: ``comm.rank``, ``comm.size``, ``comm.local_rank``.
    """
    from hpc_graph.comm.env import prepare_process

    prepare_process()
    comm = get_communicator(backend, **options)
    if comm.size > 1:
        from hpc_graph.comm.abort import install_abort_handler
        install_abort_handler(comm)
    return comm


def get_communicator(backend: str = "mpi", **options: Any) -> Communicator:
    """The communicator of this process.

    Args:
        backend: ``"mpi"`` (mpi4py, default), ``"torch"`` (torch.distributed:
            gloo on CPU, NCCL for CUDA tensors, oneCCL when installed) or
            ``"local"`` (one process). ``"mpi"`` and ``"torch"`` fall back to a
            size-1 :class:`~hpc_graph.comm.local.LocalCommunicator` when no
            launcher is detected (and, for ``"mpi"``, mpi4py was not already
            imported; for ``"torch"``, torch.distributed is not initialised).
        options: passed to the backend constructor (e.g. ``max_message_bytes``);
            without options the same communicator is returned on every call.
    Raises:
        ValueError for an unknown backend; RuntimeError when the launcher and
        MPI disagree (e.g. mpi4py built against another MPI than ``mpiexec``).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"communication backend must be one of {_BACKENDS}, got {backend!r}")
    if not options and backend in _CACHE:
        return _CACHE[backend]
    comm = _create(backend, options)
    if not options:
        _CACHE[backend] = comm
    return comm


def _create(backend: str, options: dict[str, Any]) -> Communicator:
    from hpc_graph.comm.env import detect_rank_size, launcher_name
    from hpc_graph.comm.local import LocalCommunicator

    launcher = launcher_name()
    env_rank, env_size = detect_rank_size()
    if backend == "local":
        return LocalCommunicator(**options)
    if backend == "mpi":
        if launcher == "none" and "mpi4py.MPI" not in sys.modules:
            log.debug("no MPI launcher detected: using a single-process communicator")
            return LocalCommunicator(**options)
        if launcher == "torchrun":
            raise ValueError("started by torchrun (RANK/WORLD_SIZE set, no MPI launcher): "
                             "use communication backend 'torch'")
        from hpc_graph.comm.mpi import MPICommunicator

        comm: Communicator = MPICommunicator(**options)
    else:
        if launcher == "none" and not _torch_dist_initialized():
            log.debug("no launcher detected: using a single-process communicator")
            return LocalCommunicator(**options)
        from hpc_graph.comm.torch_dist import TorchDistCommunicator

        comm = TorchDistCommunicator(**options)
    if launcher != "none" and (comm.size, comm.rank) != (env_size, env_rank):
        raise RuntimeError(
            f"launcher {launcher!r} says rank {env_rank} of {env_size} but the {backend} backend says "
            f"rank {comm.rank} of {comm.size}: is mpi4py built against the MPI of this mpiexec?")
    log.debug("communicator: %r", comm)
    return comm


def _torch_dist_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
