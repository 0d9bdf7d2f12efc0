"""Communication layer: one :class:`Communicator` interface over mpi4py or torch.distributed.

>>> from hpc_graph.comm import get_communicator, install_abort_handler
>>> comm = get_communicator()          # "mpi" by default; size 1 without a launcher
>>> install_abort_handler(comm)        # an exception on any rank ends the job

Launcher detection that never imports MPI lives in :mod:`hpc_graph.comm.env`.
Backends are imported lazily so ``import hpc_graph.comm`` never initialises MPI.
"""
import importlib

# Lazy exports (PEP 562): importing hpc_graph.comm.env (the CLI does, for log
# prefixes) must not pull in torch or MPI.
_EXPORTS = {
    "install_abort_handler": "abort",
    "MAX_MESSAGE_BYTES": "communicator", "Communicator": "communicator", "Request": "communicator",
    "get_communicator": "factory", "init": "factory",
    "describe_environment": "env", "detect_local_rank": "env", "detect_local_size": "env",
    "detect_rank_size": "env", "launcher_name": "env", "local_device": "env",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"hpc_graph.comm.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'hpc_graph.comm' has no attribute {name!r}")
