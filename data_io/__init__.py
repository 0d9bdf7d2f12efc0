"""data_io: on-disk formats, generators, converters and partitioners of hpc_graph.

May import :mod:`numba_kernels`; never imports :mod:`hpc_graph`.
"""
from data_io.errors import DataError, FormatError, OutputExistsError
from data_io.dataset import Dataset, DatasetWriter, GraphData, open_dataset, validate_dataset, write_dataset

__all__ = [
    "DataError", "FormatError", "OutputExistsError",
    "Dataset", "DatasetWriter", "GraphData", "open_dataset", "validate_dataset", "write_dataset",
]
