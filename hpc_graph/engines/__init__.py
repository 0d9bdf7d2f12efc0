"""Training engines, one module each; they never import each other.

``create_engine(name, source, ...)`` imports the engine's module on demand. On a graph-level
dataset file (``/graphs/ptr``) ``dp`` is :class:`~hpc_graph.engines.dp.GraphDPEngine` (data parallel
over batches of graphs).
"""
from __future__ import annotations

import importlib
import os

from hpc_graph.engines.base import Engine

ENGINES = {
    "single": "hpc_graph.engines.single:SingleEngine",
    "dp": "hpc_graph.engines.dp:DPEngine",
    "sar": "hpc_graph.engines.sar:SAREngine",
    "sylvie": "hpc_graph.engines.sylvie:SylvieEngine",
    "minibatch": "hpc_graph.engines.minibatch:MinibatchEngine",
    "apt": "hpc_graph.engines.apt:APTEngine",
    "seqpar": "hpc_graph.engines.seqpar:SeqParEngine",
    "flow": "hpc_graph.engines.flow:FlowEngine",
}

# the engines that train on a graph-level dataset file, where that is another class
GRAPH_LEVEL = {"dp": "hpc_graph.engines.dp:GraphDPEngine"}


def is_graph_level(source: str | os.PathLike | None) -> bool:
    """Whether ``source`` is a graph-level dataset file (``task = "graph"``: many graphs, one label each)."""
    if source is None or not os.path.isfile(source):
        return False
    from data_io.dataset import dataset_task

    return dataset_task(source) == "graph"


def engine_class(name: str, source: str | os.PathLike | None = None) -> type[Engine]:
    """The Engine subclass registered under ``name`` for data ``source`` (``ValueError`` naming the choices
    otherwise)."""
    if name not in ENGINES:
        raise ValueError(f"engine: unknown engine {name!r}; choose one of {sorted(ENGINES)}")
    spec = GRAPH_LEVEL[name] if name in GRAPH_LEVEL and is_graph_level(source) else ENGINES[name]
    module, _, cls = spec.partition(":")
    return getattr(importlib.import_module(module), cls)


def create_engine(name: str, source: str, *args, **kwargs) -> Engine:
    """Construct engine ``name`` on ``source``; arguments as for :class:`Engine`."""
    return engine_class(name, source)(source, *args, **kwargs)
