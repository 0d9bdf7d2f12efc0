"""hpc_graph: MPI-native training of graph neural networks and graph transformers.

Layers (bottom up): ``numba_kernels`` (array kernels), ``data_io`` (formats,
generators, converters, partitioners), then this package: ``comm``, ``graph``,
``ops``, ``nn``, ``engines``, ``train`` and the ``hpc-graph`` CLI.
"""
import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
