"""Training engines, one module each; they never import each other.

``create_engine(name, ...)`` imports the engine's module on demand.
"""
from __future__ import annotations

import importlib

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


def engine_class(name: str) -> type[Engine]:
    """The Engine subclass registered under ``name`` (``ValueError`` naming the choices otherwise)."""
    if name not in ENGINES:
        raise ValueError(f"engine: unknown engine {name!r}; choose one of {sorted(ENGINES)}")
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create_engine(name: str, *args, **kwargs) -> Engine:
    """Construct engine ``name``; arguments as for :class:`Engine`."""
    return engine_class(name)(*args, **kwargs)
