"""hpc_graph: MPI-native training of graph neural networks and graph transformers.

    import hpc_graph as hg

    comm = hg.init()                                      # rank and size from the launcher; errors abort the job
    config = hg.load_config("configs/sar_gcn.yaml", ["data.path=data/cora-2parts"])
    summary = hg.Trainer(config, comm).fit()              # the config's model on its engine
    summary = hg.Trainer(config, comm, model=MyNet).fit() # or a model of one's own: MyNet(in_dim, out_dim, mc)

    engine = hg.create_engine("dp", "data/cora-2parts", comm)   # or a loop of one's own over an engine
    out = my_module(engine.graph, engine.feat)            # engine.graph: a hg.GraphContext

Every name of ``__all__`` is imported on first use, so ``import hpc_graph`` is cheap and changes nothing in the
process: no environment variable is set, no MPI library is loaded and no tensor is created. :func:`init` (and the
``hpc-graph`` command) make the process-wide settings once, before torch creates a tensor
(:func:`hpc_graph.comm.env.prepare_process`).

Layers (bottom up): ``numba_kernels`` (array kernels), ``data_io`` (formats, generators, converters,
partitioners), then this package: ``comm``, ``graph``, ``ops``, ``nn``, ``engines``, ``train`` and the
``hpc-graph`` CLI.
"""
import importlib as _importlib
import logging as _logging

from hpc_graph.version import __version__

_logging.getLogger(__name__).addHandler(_logging.NullHandler())  # library code logs; the application configures

# public name -> module it lives in (imported on first use, PEP 562)
_EXPORTS = {
    # the communicator
    "init": "hpc_graph.comm.factory", "Communicator": "hpc_graph.comm.communicator",
    # data: dataset files, partitions, partitioning
    "open_dataset": "data_io.dataset", "write_dataset": "data_io.dataset", "GraphData": "data_io.dataset",
    "read_partition": "data_io.partition", "read_partition_meta": "data_io.partition",
    "partition_dataset": "data_io.partitioner",
    "from_pyg": "data_io.converters.pyg", "to_pyg": "data_io.converters.pyg",
    "from_dgl": "data_io.converters.dgl", "to_dgl": "data_io.converters.dgl",
    # engines and the graph interface layers use
    "create_engine": "hpc_graph.engines", "engine_names": "hpc_graph.engines", "register_engine": "hpc_graph.engines",
    "Engine": "hpc_graph.engines.base", "GraphContext": "hpc_graph.graph.base",
    # models
    "nn": None, "ModelSpec": "hpc_graph.nn.models", "register_model": "hpc_graph.nn.models",
    # training
    "Trainer": "hpc_graph.train.trainer", "load_config": "hpc_graph.train.config", "Config": "hpc_graph.train.config",
    "ConfigError": "hpc_graph.train.config",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpc_graph' has no attribute {name!r}")
    if _EXPORTS[name] is None:
        return _importlib.import_module(f"hpc_graph.{name}")
    return getattr(_importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return list(__all__)
