"""hpc_graph: MPI-native training of graph neural networks and graph transformers.

Layers (bottom up): ``numba_kernels`` (array kernels), ``data_io`` (formats,
generators, converters, partitioners), then this package: ``comm``, ``graph``,
``ops``, ``nn``, ``engines``, ``train`` and the ``hpc-graph`` CLI.
"""
import logging
import os

# Large CPU tensors on transparent huge pages. torch reads this once, at its first CPU
# allocation, so it is set here, before this package creates any tensor (a value the
# user set, "0" included, is kept). Without it every fresh 128 MiB activation or gradient
# takes 32,768 page faults to write (64 with 2 MiB pages) and its rows miss the TLB when
# gathered at random.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from hpc_graph.comm.env import select_mpi_library as _select_mpi_library  # noqa: E402

_select_mpi_library()  # ranks started by Open MPI's mpiexec load Open MPI (before anything imports mpi4py)

from hpc_graph.version import __version__  # noqa: E402,F401

logging.getLogger(__name__).addHandler(logging.NullHandler())
