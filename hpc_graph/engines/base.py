"""``Engine``: how one rank's graph, data and aggregation are set up for training.

The trainer (``hpc_graph.train``) builds an engine, then runs the model on
``engine.graph`` (a :class:`~hpc_graph.graph.base.GraphContext`) and
``engine.feat``. Engines never import each other; shared pieces live in
``hpc_graph.graph`` and ``hpc_graph.ops``.
"""
from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC
from typing import Any, ClassVar, Iterator

import torch

from hpc_graph.graph.base import GraphContext
from hpc_graph.options import ConfigError, check_value

#: what an engine's ``kind`` may be, and the training loop each selects (:mod:`hpc_graph.train.loops`):
#: ``full``: one step over ``graph`` and ``feat`` per epoch; ``sequence``: the same over a sequence of tokens
#: (graph transformers); ``sampled``: ``iterations``/``batch_sizes``/``batch`` per epoch; ``pipeline``:
#: stages and micro-batches (:mod:`hpc_graph.train.pipeline`).
KINDS = ("full", "sequence", "sampled", "pipeline")
#: what an engine's ``data_source`` may be: a dataset file, a partition directory (one part per rank), or a
#: partition directory with a dataset file allowed on one process.
DATA_SOURCES = ("file", "partition", "partition_or_file")
#: what every engine is handed beside its own options: the training seed, the ``data.feature_norm`` setting
CONTEXT = {"seed": 0, "feature_norm": "none"}


@dataclasses.dataclass
class NoOptions:
    """An engine without options of its own."""


@dataclasses.dataclass
class Batch:
    """One iteration's input from an engine of ``kind = "minibatch"``: ``graph`` (a GraphContext, e.g.
    sampled blocks or a batch of small graphs), ``feat`` float[input rows, F], ``label`` int64[outputs],
    ``seeds`` int64[outputs] (local ids of the rows the loss covers)."""

    graph: Any
    feat: torch.Tensor
    label: torch.Tensor
    seeds: torch.Tensor

    def to(self, device: torch.device | str) -> "Batch":
        """This batch on ``device`` (the model's): itself when built there, else its graph (``graph.to``) and
        tensors copied over. Sampling engines build batches on the CPU; the trainer moves them."""
        device = torch.device(device)
        if self.feat.device == device:
            return self
        return Batch(self.graph.to(device), self.feat.to(device), self.label.to(device), self.seeds.to(device))


class Engine(ABC):
    """One rank's share of a node-classification problem.

    Args:
        source: a dataset file (``single``) or a partition directory (``dp``, ``sar``).
        comm: a :class:`hpc_graph.comm.Communicator` (size 1 for ``single``).
        device: torch device for tensors and kernels.
        dtype: floating dtype of features and parameters.
        options: engine-specific settings (e.g. ``prefetch`` for ``sar``); the
            names an engine accepts are its ``OPTIONS``. Every engine accepts
            ``seed`` (the training seed, for engines that draw random numbers).

    After construction: ``graph`` (GraphContext), ``feat`` float[num_nodes, F],
    ``label`` int64[num_nodes], ``masks`` {"train"|"val"|"test": bool[num_nodes]},
    ``num_classes`` (int), ``num_features`` (int).

    An engine whose epochs are several optimiser steps has ``kind = "sampled"`` and provides
    ``iterations(epoch)``, ``batch_sizes(epoch, iterations)`` and ``batch(epoch, iteration)`` (a
    :class:`Batch`); an engine of ``kind = "pipeline"`` (``flow``) runs the model in stages and micro-batches
    through :mod:`hpc_graph.train.pipeline`; the others (``kind = "full"``) train on ``graph`` and ``feat`` in
    one step. An engine whose every rank holds every node sets ``replicated = True`` (counts and accuracies
    are then not summed over the ranks).

    The trainer tells an engine where training stands (every method has a
    no-op default): :meth:`begin_epoch` before an epoch's forward pass,
    :meth:`end_epoch` after its optimiser step (with the global loss), and
    :meth:`evaluation` around forward passes that only evaluate. An engine
    whose decisions depend on the history (``sylvie``'s bit policy) saves it
    through :meth:`state_dict` / :meth:`load_state_dict` in checkpoints.

    ``idle_hook``: when set (by the trainer), an engine about to block on a message first calls
    ``idle_hook(test, key)``: ``test()`` says without blocking whether the message is there, ``key`` names the
    wait so the same wait can be predicted next epoch. The hook may run other work meanwhile (the LM
    co-training's bubble interleaver) and returns when the message is there or it has nothing to run. The
    ``flow`` engine's pipeline receives use it.

    ``malloc_mmap_threshold``: the C allocator's large-block policy this engine's allocations need (bytes; 0:
    glibc's adaptive default), applied by the trainer before anything is loaded unless
    ``train.malloc_mmap_threshold`` says otherwise (:mod:`hpc_graph.comm.malloc`). Default 1 MiB: a step that
    allocates the same large tensors every time keeps them off the heap, where they would fragment it. An
    engine whose iterations allocate tensors of changing sizes many times a second (sampled batches) declares
    0, so that their pages are reused instead of faulted in every iteration.

    ``exact``: True where the engine trains the model ``single`` trains on one process, whatever the rank count
    (``dp``, ``sar``); False where it trades that for speed or memory (quantised, stale or dropped messages).

    ``shared_rng``: True where every rank's model makes the calls one process would make on the whole graph
    and keys its randomness on node ids (``GraphContext.row_ids``: ``dp``, ``sar``, ``sylvie``, ``seqpar``, and
    ``apt``, whose strategies then agree with dropout): the ranks
    then keep the one torch random stream the model was built from, and draw the dropout masks ``single``
    draws. False (the default): after the model is built each rank reseeds its own stream.
    """

    # -- the declarations (class attributes every engine sets; the registry, config, trainer, planner and CLI
    #    read these instead of knowing engines by name) -------------------------------------------------
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    kind: ClassVar[str] = "full"
    data_source: ClassVar[str] = "partition"
    replicated: ClassVar[bool] = False
    max_ranks: ClassVar[int | None] = None
    graph_level: ClassVar[bool] = False
    cotraining: ClassVar[bool] = False
    exact: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions
    idle_hook: Any = None
    shared_rng: ClassVar[bool] = False
    #: True where :meth:`state_dict` differs between ranks (each rank's in-flight halo rows): a checkpoint keeps
    #: every rank's, and each rank gets its own back
    rank_state: ClassVar[bool] = False
    malloc_mmap_threshold: ClassVar[int] = 1 << 20
    #: keys beside :data:`CONTEXT` that this engine's ``options_from_config`` adds from the rest of the config for
    #: its own checks (``check_options``), accepted and left out of ``Options``
    extra_context: ClassVar[tuple[str, ...]] = ()

    graph: GraphContext
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict[str, torch.Tensor]
    num_classes: int
    num_features: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind not in KINDS:
            raise TypeError(f"{cls.__name__}.kind: must be one of {KINDS}, got {cls.kind!r}")
        if cls.data_source not in DATA_SOURCES:
            raise TypeError(f"{cls.__name__}.data_source: must be one of {DATA_SOURCES}, got {cls.data_source!r}")
        if not dataclasses.is_dataclass(cls.Options):
            raise TypeError(f"{cls.__name__}.Options: must be a dataclass, got {cls.Options!r}")

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        self.source = str(source)
        self.comm = comm
        self.device = torch.device(device)
        self.dtype = dtype
        #: the engine's validated options (an ``Options`` instance, defaults filled in)
        self.opts = self.parse_options(options)
        #: the same as a dict, with the context (``seed``, ``feature_norm``) every engine is handed
        self.options = {**dataclasses.asdict(self.opts), **{k: (options or {}).get(k, v) for k, v in CONTEXT.items()}}
        self._base = (0, 0.0, 0.0, 0.0)
        self.reset_stats()

    # -- options --------------------------------------------------------------------------------------
    @classmethod
    def option_fields(cls) -> tuple[dataclasses.Field, ...]:
        """The fields of this engine's ``Options``, each with its config ``section`` in its metadata."""
        return dataclasses.fields(cls.Options)

    @classmethod
    def parse_options(cls, options: dict[str, Any] | None) -> Any:
        """``options`` (a dict of option values, as a Python caller or the trainer gives them) checked against
        ``Options`` and completed with its defaults: an ``Options`` instance. Keys of :data:`CONTEXT` are
        accepted and left out. Raises :class:`~hpc_graph.options.ConfigError` (a ``ValueError``) naming the
        field (``section.name``), or the engine for an option it does not have."""
        if isinstance(options, cls.Options):
            return options
        options = dict(options or {})
        fields = {f.name: f for f in cls.option_fields()}
        unknown = sorted(k for k in options if k not in fields and k not in CONTEXT and k not in cls.extra_context)
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"engine options: {', '.join(map(repr, unknown))} not an option of engine "
                              f"{cls.name!r} (its options: {known})")
        values = {}
        for name, f in fields.items():
            if name in options:  # a field without a spec (derived from the rest of the config) passes as given
                values[name] = (check_value(f"{f.metadata.get('section', 'engine')}.{name}", options[name],
                                            f.metadata) if "kind" in f.metadata else options[name])
        return cls.Options(**values)

    @classmethod
    def options_from_config(cls, config: Any) -> dict[str, Any]:
        """The options this engine takes from a training config: each ``Options`` field read from its section
        (``config.<section>.<name>``), plus the context (``train.seed``, ``data.feature_norm``). An engine whose
        options depend on the rest of the config (the model's shape, say) extends this."""
        out = {f.name: getattr(getattr(config, f.metadata.get("section", "engine")), f.name)
               for f in cls.option_fields() if f.metadata.get("section")}
        out.update(seed=config.train.seed, feature_norm=config.data.feature_norm)
        return out

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        """Why this engine cannot run the model, or None: ``model`` is the model's registry entry
        (:class:`hpc_graph.nn.models.ModelSpec`: what the model can do), ``mc`` the config's ``model`` section.
        The config names the engines that can instead. Default: any model."""
        return None

    @classmethod
    def check_config(cls, config: Any, model: Any) -> None:
        """Raise :class:`~hpc_graph.options.ConfigError` naming the field if ``config`` cannot run on this
        engine for reasons beyond :meth:`model_problem` (the model's depth, the recipes, ...); ``model`` as
        there. Called before anything is loaded. Default: nothing."""

    @classmethod
    def plan_graph(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                   options: dict[str, Any]) -> GraphContext | None:
        """The graph context rank ``rank`` of a ``ranks``-rank job would hold, built from sizes alone on the
        ``meta`` device, for the planner to run the training step on (:mod:`hpc_graph.plan.rank`): ``graph``
        describes the whole graph (``nodes``, ``edges``, ``directed``, ...), ``rank`` what this rank holds
        (``rank``, ``owned``, ``edges``, ``local_edges``, ``halo_from``, ``send_to``, ``train``); ``comm``
        counts the messages. None (the default): this engine cannot be planned."""
        return None

    @classmethod
    def plan_instance(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                      options: dict[str, Any], hints: dict[str, Any] | None = None) -> "Engine | None":
        """This engine as rank ``rank`` would hold it, built from sizes alone (arguments as :meth:`plan_graph`):
        what the planner runs the trainer's step on (its ``graph``, and the hooks the trainer calls:
        :meth:`begin_epoch`, :meth:`end_epoch`, :meth:`attach_model`, :meth:`evaluation`). Default: an engine
        around :meth:`plan_graph`'s context (None if that is None); the planner adds the rank's features, labels
        and masks. An engine whose context needs more of its own state overrides this. ``hints``: what the
        planner decided for the engine where the engine would measure it (``boundaries``: a pipeline's stage
        split)."""
        ctx = cls.plan_graph(graph, rank, ranks, comm, dtype, options)
        if ctx is None:
            return None
        eng = cls.__new__(cls)
        Engine.__init__(eng, f"<{cls.name}: sizes only>", comm, torch.device("meta"), dtype, options)
        eng.graph = ctx
        eng.num_classes, eng.num_features = int(graph.classes), int(graph.features)
        return eng

    @classmethod
    def plan_assumptions(cls, options: dict[str, Any]) -> list[str]:
        """What a plan of this engine with ``options`` assumes beyond the step it runs (printed by ``hpc-graph
        plan``). Default: nothing."""
        return []

    @classmethod
    def dry_run_report(cls, config: Any, comm: Any) -> dict[str, Any] | None:
        """An engine that plans its own runs by a dry run on the data (collective: every rank of the job calls
        it): ``{"table": text, "summary": one line, "json": dict}``. Default None: the planner runs the step on
        shapes (:meth:`plan_instance`)."""
        return None

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """Bytes this engine holds only while it loads, beyond what the rank then keeps (copies the loading code
        makes and drops: the file's int64 columns while an int32 copy is made, say); the planner adds them to
        what the loaded rank holds (arguments as :meth:`plan_graph`; ``dtype`` a name). Default: 0."""
        return 0

    @staticmethod
    def _read_as_float32_extra(graph: Any, rows: int, dtype: str) -> int:
        """float64 features are read as float32, then converted: the float32 copy while both exist."""
        return int(rows) * int(graph.features) * 4 if dtype == "float64" else 0

    @classmethod
    def for_source(cls, source: str | None) -> type["Engine"]:
        """The class that runs on ``source`` (a dataset file or partition directory): this one, or a variant
        (``dp`` on a graph-level dataset file trains data parallel over batches of graphs)."""
        return cls

    def _counters(self) -> tuple[float, ...]:
        c = self.comm
        by_op, wait_by_op = getattr(c, "modeled_by_op", {}), getattr(c, "modeled_wait_by_op", {})
        return (int(getattr(c, "bytes_sent", 0)), float(getattr(c, "comm_seconds", 0.0)),
                float(by_op.get("exchange", 0.0)), float(wait_by_op.get("exchange", 0.0)))

    def stats(self) -> dict[str, float]:
        """Counters since the last :meth:`reset_stats`: ``bytes_sent``, ``comm_seconds`` (everything the
        rank's communicator sent, the trainer's gradient all-reduce included), and with a modelled link
        ``modeled_exchange_seconds`` / ``modeled_exchange_wait_seconds``: the link time of the point-to-point
        exchanges and the part of it not hidden behind computation."""
        now = self._counters()
        out = {"bytes_sent": float(now[0] - self._base[0]), "comm_seconds": now[1] - self._base[1]}
        if getattr(self.comm, "link", None) is not None:
            out["modeled_exchange_seconds"] = now[2] - self._base[2]
            out["modeled_exchange_wait_seconds"] = now[3] - self._base[3]
        return out

    def reset_stats(self) -> None:
        """Zero the counters returned by :meth:`stats`."""
        self._base = self._counters()

    # -- training-progress hooks (called by the trainer on every rank) -------------------------------
    def begin_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (1-based) starts its training forward pass."""

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        """Epoch ``epoch`` ended: ``loss`` is the global training loss (the same on every rank; NaN
        when non-finite), ``seconds`` this rank's time for the step."""

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """Forward passes inside this block only evaluate (no backward pass follows)."""
        yield

    @classmethod
    def check_options(cls, options: dict[str, Any], size: int) -> None:
        """Raise ``ValueError`` naming the option if ``options`` cannot work on a job of ``size`` ranks; the
        trainer calls it on every rank before anything is loaded, so the refusal is one line, not an abort.
        Default: nothing (an engine checks the rest as it loads)."""

    def check_model(self, model: torch.nn.Module) -> None:
        """Raise ``ValueError`` if this engine cannot run ``model`` (every rank decides the same). Default: nothing."""

    @staticmethod
    def _shape_partition(graph: Any, rank: Any, ranks: int, dtype: torch.dtype) -> Any:
        """The :class:`~hpc_graph.graph.dist_graph.DistGraph` of ``rank`` with sizes and no data (planning)."""
        from hpc_graph.graph.dist_graph import DistGraph

        return DistGraph.of_shape(part_id=rank.rank, num_parts=ranks, owned=rank.owned, edges=rank.edges,
                                  local_edges=rank.local_edges, halo_from=rank.halo_from, send_to=rank.send_to,
                                  global_num_nodes=graph.nodes, directed=graph.directed, dtype=dtype,
                                  edges_from=tuple(getattr(rank, "edges_from", ()) or ()))

    def _check_attention_pattern(self, model: torch.nn.Module) -> None:
        """For the engines holding part of the graph (``graph.dg``): a graph transformer's sparse attention
        adds each node's self loop itself and holds each edge once (as ``single``'s pattern does), so self-loop
        and repeated edges in the data are refused before training, on every rank alike (collective: the ranks
        add up their counts)."""
        from hpc_graph.graph.halo_graph import pattern_problem, repeated_edges, self_loop_edges
        from hpc_graph.nn._transformer import TransformerLayer

        if not any(isinstance(m, TransformerLayer) for m in model.modules()):
            return
        counts = torch.tensor([float(self_loop_edges(self.graph)), float(repeated_edges(self.graph))],
                              dtype=torch.float64)
        if self.comm.size > 1:
            self.comm.allreduce_(counts)
        problem = pattern_problem(*(int(c) for c in counts.tolist()))
        if problem:
            raise ValueError(f"model.name: {getattr(model, 'name', type(model).__name__)} on engine {self.name!r}: "
                             f"{problem}")

    def attach_model(self, model: torch.nn.Module, feat: torch.Tensor | None = None) -> None:
        """The trainer built ``model`` (the same parameters on every rank) and hands it over before training: an
        engine may check it or keep part of it (a pipeline stage releases the other stages' layers to the
        ``meta`` device; the trainer optimises the parameters left). ``feat``: the input the model will get
        (float[num_nodes, F']: ``self.feat``, or wider when the trainer appends columns). Default: nothing."""

    def close(self) -> None:
        """Training is over: complete anything still in flight (called on every rank)."""

    def state_dict(self) -> dict[str, Any]:
        """Engine state to keep in a checkpoint (picklable; the same on every rank unless :attr:`rank_state`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class SeedEngine(Engine):
    """The epoch protocol of the engines that train on sampled mini-batches of seed nodes (``kind = "sampled"``).

    A subclass sets ``schedule`` (a :class:`hpc_graph.graph.sampler.SeedSchedule`, made on every rank) and
    ``batch_size`` in its constructor and provides :meth:`batch`; the iterations per epoch, the batch sizes and
    each iteration's seeds come from the schedule here. An override of :meth:`begin_epoch` calls this one.
    """

    kind = "sampled"
    schedule: Any
    batch_size: int
    _epoch: int | None = None

    def iterations(self, epoch: int) -> int:
        """Iterations of every rank in ``epoch``: the largest ``ceil(train nodes / batch_size)``; every training
        node is a seed once per epoch."""
        return self.schedule.iterations()

    def batch_sizes(self, epoch: int, iterations: int) -> tuple[list[int], list[float]]:
        """This rank's seeds per iteration and the global (all-reduced) batch of every iteration."""
        return self.schedule.batch_sizes(iterations)

    def begin_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)
        self._seeds = self.schedule.order(epoch)

    def seeds(self, epoch: int, iteration: int) -> torch.Tensor:
        """int64[<= batch_size] local ids of this rank's seeds at ``iteration`` of ``epoch`` (starts the epoch when
        it is not the current one)."""
        if self._epoch != epoch:
            self.begin_epoch(epoch)
        start, stop = self.schedule.span(iteration)
        return self._seeds[start:stop]

    def batch(self, epoch: int, iteration: int) -> Batch:
        """Iteration ``iteration`` of ``epoch``: the sampled blocks, their input rows and the seeds' labels."""
        raise NotImplementedError
