"""The modules of the API reference (``scripts/api_docs.sh``, tests/test_api_docs.py): what the public names of
``import hpc_graph`` live in (the package page itself is docs/python-api.md: its names are imported on first use,
which a generator cannot follow). Everything else is internal and may change without notice.

``SPECS`` is pdoc's module list in order: a package brings its submodules, so each is followed by a negative
pattern ("!") that leaves out its internal ones."""
SPECS = (
    "hpc_graph.comm.communicator", "hpc_graph.comm.factory", "hpc_graph.comm.env",
    "hpc_graph.graph.base", "hpc_graph.ops.message",
    "hpc_graph.nn", "!hpc_graph\\.nn\\..*",
    "hpc_graph.engines", "!hpc_graph\\.engines\\..*", "hpc_graph.engines.base",
    "hpc_graph.train.trainer", "hpc_graph.train.config", "hpc_graph.train.steps",
    "data_io.dataset", "data_io.partition", "data_io.partitioner", "data_io.integrity",
    "data_io.converters", "!data_io\\.converters\\..*", "numba_kernels.warm",
)
#: the modules that get a page
MODULES = tuple(s for s in SPECS if not s.startswith("!"))
