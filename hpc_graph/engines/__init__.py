"""Training engines, one module each; they never import each other. This package is their registry.

An engine is an :class:`~hpc_graph.engines.base.Engine` subclass that declares what the rest of the suite needs
to know of it (``name``, ``kind``, ``data_source``, ``replicated``, its ``Options`` dataclass, its config checks;
see :mod:`hpc_graph.engines.base`). The trainer, the config, the planner and the CLI iterate over the registry
and never compare an engine's name:

* the built-in engines below, imported on demand;
* engines of other packages, found through the ``hpc_graph.engines`` entry-point group (the entry point's
  object is the Engine class, or a ``"module:Class"`` string);
* engines registered at run time with :func:`register_engine` (a test, a notebook).

On a graph-level dataset file (``/graphs/ptr``) an engine may hand over to a variant of itself
(:meth:`Engine.for_source`): ``dp`` to :class:`~hpc_graph.engines.dp.GraphDPEngine` (data parallel over batches
of graphs), ``single`` to :class:`~hpc_graph.engines.single.GraphLevelSingleEngine`.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from typing import Any

from hpc_graph.engines.base import DATA_SOURCES, KINDS, Engine  # noqa: F401 - the contract, re-exported
from hpc_graph.engines.graph_batches import is_graph_level
from hpc_graph.options import ConfigError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hpc_graph.engines"

_BUILTIN = {
    "single": "hpc_graph.engines.single:SingleEngine",
    "dp": "hpc_graph.engines.dp:DPEngine",
    "sar": "hpc_graph.engines.sar:SAREngine",
    "sylvie": "hpc_graph.engines.sylvie:SylvieEngine",
    "minibatch": "hpc_graph.engines.minibatch:MinibatchEngine",
    "apt": "hpc_graph.engines.apt:APTEngine",
    "seqpar": "hpc_graph.engines.seqpar:SeqParEngine",
    "flow": "hpc_graph.engines.flow:FlowEngine",
}
#: the engines ``engine.name: auto`` may resolve to (:func:`resolve_engine`)
AUTO_CANDIDATES = ("single", "dp", "seqpar")

_registered: dict[str, type[Engine]] = {}
_entry_points: dict[str, Any] | None = None
_loaded: dict[str, type[Engine]] = {}


def _discover() -> dict[str, Any]:
    """The ``hpc_graph.engines`` entry points of the installed packages, by name (read once)."""
    global _entry_points
    if _entry_points is None:
        from importlib.metadata import entry_points

        _entry_points = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in _BUILTIN:
                log.warning("engines: entry point %s (%s) ignored: %r is a built-in engine", ep.name, ep.value,
                            ep.name)
                continue
            _entry_points[ep.name] = ep
    return _entry_points


def _check_engine(cls: Any, where: str) -> type[Engine]:
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{where}: not an Engine subclass: {cls!r}")
    if not cls.name:
        raise TypeError(f"{where}: {cls.__name__}.name is empty")
    return cls


def register_engine(cls: type[Engine]) -> type[Engine]:
    """Register ``cls`` under ``cls.name`` (usable as a class decorator). Replaces an earlier registration of
    the same name; a built-in engine cannot be replaced (``ValueError``)."""
    _check_engine(cls, "register_engine")
    if cls.name in _BUILTIN or cls.name == "auto":
        raise ValueError(f"register_engine: {cls.name!r} is a built-in engine name")
    _registered[cls.name] = cls
    _loaded.pop(cls.name, None)
    return cls


def unregister_engine(name: str) -> None:
    """Forget an engine registered with :func:`register_engine` (no-op if there is none)."""
    _registered.pop(name, None)
    _loaded.pop(name, None)


def engine_names() -> tuple[str, ...]:
    """Every engine this installation knows: built-in, entry points, registered."""
    return tuple(_BUILTIN) + tuple(n for n in _discover() if n not in _registered) + tuple(_registered)


def _load(name: str) -> type[Engine]:
    if name in _registered:
        return _registered[name]
    if name in _loaded:
        return _loaded[name]
    if name in _BUILTIN:
        module, _, cls = _BUILTIN[name].partition(":")
        obj = getattr(importlib.import_module(module), cls)
    elif name in _discover():
        ep = _discover()[name]
        obj = ep.load()
        if isinstance(obj, str):
            module, _, attr = obj.partition(":")
            obj = getattr(importlib.import_module(module), attr)
        obj = _check_engine(obj, f"entry point {ENTRY_POINT_GROUP}:{name} ({ep.value})")
        if obj.name != name:
            raise TypeError(f"entry point {ENTRY_POINT_GROUP}:{name}: its class is named {obj.name!r}")
    else:
        raise ConfigError(f"engine.name: unknown engine {name!r}; choose one of "
                          f"{', '.join(('auto',) + engine_names())}")
    _loaded[name] = obj
    return obj


def engine_class(name: str, source: str | os.PathLike | None = None) -> type[Engine]:
    """The Engine class registered under ``name``, or its variant for data ``source``
    (:meth:`~hpc_graph.engines.base.Engine.for_source`). :class:`~hpc_graph.options.ConfigError` (a
    ``ValueError``) naming the choices for an unknown name."""
    cls = _load(name)
    return cls.for_source(None if source is None else os.fspath(source))


def engine_classes() -> dict[str, type[Engine]]:
    """Every engine class by name (imports them all)."""
    return {name: _load(name) for name in engine_names()}


def create_engine(name: str, source: str, *args, **kwargs) -> Engine:
    """Construct engine ``name`` on ``source``; arguments as for :class:`Engine`."""
    return engine_class(name, source)(source, *args, **kwargs)


def plannable(cls: type[Engine]) -> bool:
    """Whether ``hpc-graph plan`` can run a rank of engine ``cls`` on shapes (it declares
    :meth:`~Engine.plan_graph` or :meth:`~Engine.plan_instance`)."""
    return (cls.plan_instance.__func__ is not Engine.plan_instance.__func__
            or cls.plan_graph.__func__ is not Engine.plan_graph.__func__)


def plannable_engines() -> tuple[str, ...]:
    """The engines :func:`plannable` says ``hpc-graph plan`` runs on shapes."""
    return tuple(n for n, cls in engine_classes().items() if plannable(cls))


def reference_engine() -> str:
    """The engine every other is checked against: one process, the whole graph from a dataset file, exact."""
    for name, cls in engine_classes().items():
        if cls.max_ranks == 1 and cls.data_source == "file" and cls.exact and cls.kind == "full":
            return name
    raise LookupError("no one-process whole-graph engine is registered")


def resolve_engine(name: str, size: int, data_path: str | os.PathLike | None, model: Any = None) -> str:
    """``engine.name`` resolved: ``auto`` is ``single`` on one process with a dataset file, else ``dp``; for a
    graph transformer (``model.sequence``: a :class:`~hpc_graph.nn.models.ModelSpec`) ``single`` on one process,
    else ``seqpar``; on a graph-level dataset file, for every model, ``single`` on one process, else ``dp``
    (over batches of graphs). A named engine is returned as it is once its class accepts ``size`` ranks.

    Raises :class:`~hpc_graph.options.ConfigError` for an unknown engine, or ``single`` on more than one rank.
    """
    if name == "auto":
        if is_graph_level(data_path):
            return "single" if size == 1 else "dp"
        if model is not None and getattr(model, "sequence", False):
            return "single" if size == 1 else "seqpar"
        return "single" if size == 1 and data_path is not None and os.path.isfile(data_path) else "dp"
    cls = engine_class(name, data_path)
    if cls.max_ranks is not None and size > cls.max_ranks:
        where = "one process" if cls.max_ranks == 1 else f"at most {cls.max_ranks} processes"
        raise ConfigError(f"engine.name: {name!r} runs on {where}, but this job has {size} "
                          "ranks; " + ("use 'dp' (data parallel over the batches of graphs)"
                                       if is_graph_level(data_path)
                                       else "use 'dp' or 'sar' with a partitioned dataset (hpc-graph partition)"))
    return name


def option_sections() -> dict[str, dict[str, tuple[dataclasses.Field, tuple[str, ...]]]]:
    """The config fields the engines declare, by section (``engine``, ``sampler``, ``hec``, ...): ``{section:
    {field name: (field, names of the engines that declare it)}}``, in registry order. Two engines that declare a
    field of the same section and name must declare the same default and checks (``TypeError`` otherwise); the
    first one's help text describes it."""
    out: dict[str, dict[str, tuple[dataclasses.Field, tuple[str, ...]]]] = {}
    for name, cls in engine_classes().items():
        for f in dataclasses.fields(cls.Options):
            section, fname = f.metadata.get("section"), f.name
            if not section:
                continue
            have = out.setdefault(section, {})
            if fname in have:
                first, users = have[fname]
                same = {k: v for k, v in first.metadata.items() if k != "help"} == \
                    {k: v for k, v in f.metadata.items() if k != "help"} and first.default == f.default
                if not same:
                    raise TypeError(f"engine {name!r}: option {section}.{fname} differs from engine {users[0]!r}'s "
                                    "(default or checks); declare it once and share it")
                have[fname] = (first, users + (name,))
            else:
                have[fname] = (f, (name,))
    return out
