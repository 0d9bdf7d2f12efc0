"""The modules of the API reference (``scripts/api_docs.sh``, tests/test_api_docs.py): the public face and what
its names live in. Everything else is internal and may change without notice."""
MODULES = (
    "hpc_graph",
    "hpc_graph.comm.communicator", "hpc_graph.comm.factory", "hpc_graph.comm.env",
    "hpc_graph.graph.base",
    "hpc_graph.nn",
    "hpc_graph.engines", "hpc_graph.engines.base",
    "hpc_graph.train.trainer", "hpc_graph.train.config", "hpc_graph.train.steps",
    "data_io.dataset", "data_io.partition", "data_io.partitioner", "data_io.converters",
)
