"""Communication layer: one :class:`Communicator` interface over mpi4py or torch.distributed.

>>> from hpc_graph.comm import get_communicator, install_abort_handler
>>> comm = get_communicator()          # "mpi" by default; size 1 without a launcher
>>> install_abort_handler(comm)        # an exception on any rank ends the job

Launcher detection that never imports MPI lives in :mod:`hpc_graph.comm.env`.
Backends are imported lazily so ``import hpc_graph.comm`` never initialises MPI.
"""
from hpc_graph.comm.abort import install_abort_handler
from hpc_graph.comm.communicator import MAX_MESSAGE_BYTES, Communicator, Request, get_communicator
from hpc_graph.comm.env import (describe_environment, detect_local_rank, detect_local_size,
                                detect_rank_size, launcher_name, local_device)

__all__ = ["Communicator", "Request", "get_communicator", "install_abort_handler", "MAX_MESSAGE_BYTES",
           "detect_rank_size", "detect_local_rank", "detect_local_size", "launcher_name",
           "describe_environment", "local_device"]
