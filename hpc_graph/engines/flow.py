"""``flow`` engine: layer-pipelined training of deep GNNs (UniTG's flow parallelism, GPipe schedule).

Every rank loads the whole dataset (like ``single``) but holds only the layers of
its *stage*: the model is a chain of units (:meth:`forward_units` of the layer
stacks and the reversible models), cut into ``P`` = ranks contiguous stages by
their measured cost (forward + backward time of each unit on one micro-batch,
measured on rank 0; units of the same structure get their group's median, so
timing noise does not move the cut between identical layers), or by count. Parameters of the other stages are released
(moved to the ``meta`` device): parameters and saved activations per rank are
about ``1/P`` of the model's.

The graph is split into ``M`` micro-batches (METIS parts, relabelled into
contiguous row ranges). One training step (:mod:`hpc_graph.train.pipeline`)
is GPipe's: every micro-batch forward through every stage, then every
micro-batch backward in reverse order, one optimiser step. Activations go
forward and gradients back point to point (channel 1 forward, 2 backward,
ordered by micro-batch); no gradient all-reduce (stages hold disjoint
parameters). Bytes per stage boundary and epoch: ``2 N d itemsize`` (``d``
the width crossing it), in every mode.

Edges between micro-batches (``cross_edges``, :mod:`hpc_graph.graph.microbatch`):

* ``exact``: a stage runs its layers on the whole graph once every
  micro-batch of its input is there -- the same as ``single`` for any ``M``;
  the stages no longer overlap (idle fraction about ``(P-1)/P``), which is
  the price of exactness with dependencies between all micro-batches.
* ``stale``: each micro-batch runs alone; its halo rows come from a per-layer
  history (GNNAutoScale): stages overlap as in GPipe, idle fraction
  ``(P-1)/(M+P-1)``; evaluation runs ``exact``.
* ``drop`` (the thesis): the cut edges are removed, in training and
  evaluation (``single`` on the graph without them).

Options: ``stages`` (0: the number of ranks; anything else must equal it),
``microbatches`` (M), ``cross_edges``, ``stage_split`` (``cost`` or
``count``), ``seed`` (METIS). Every rank keeps the one random stream and each
stage replays the draws of the units it does not run (:mod:`hpc_graph.train.pipeline`),
so every layer draws the dropout key it draws on one process, keyed on dataset
ids: ``exact`` equals ``single`` with dropout on, whatever the cut between
stages (a cost split that timings decide, or a resumed run's).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Iterator

import numpy as np
import torch

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from hpc_graph.engines.base import Engine
from hpc_graph.graph.microbatch import CROSS_EDGES, History, MicroBatchPlan, split_stages
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.ops.csr import CSR, column_dtype
from hpc_graph.ops.dropout import record_key_draws
from hpc_graph.options import choice_spec, int_spec, option

log = logging.getLogger(__name__)

_FORWARD, _BACKWARD = 1, 2  # exchange channels


def _same_units_same_cost(units: list[list[torch.nn.Module]], costs: list[float]) -> list[float]:
    """Units of one structure (module types and parameter shapes) cost the same: each gets the median of its
    group's measured costs, so timing noise does not move the cut between identical layers."""
    groups: dict[tuple, list[int]] = {}
    for i, unit in enumerate(units):
        key = tuple((type(mod).__name__, tuple((n, tuple(p.shape)) for n, p in mod.named_parameters()))
                    for mod in unit)
        groups.setdefault(key, []).append(i)
    out = list(costs)
    for members in groups.values():
        mid = float(np.median([costs[i] for i in members]))
        for i in members:
            out[i] = mid
    return out


@contextlib.contextmanager
def _probing(model: torch.nn.Module) -> Iterator[None]:
    """Run the start-up probes of ``model``'s units in training mode, then leave everything as it was: torch's
    random stream, the GAT layers' call counters and the model's mode."""
    calls = {mod: mod._calls for mod in model.modules() if hasattr(mod, "_calls")}
    training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        model.train(training)
        for mod, c in calls.items():
            mod._calls = c


def _cut_edges(csr: CSR, offsets: np.ndarray) -> int:
    """Edges of ``csr`` whose source lies in another micro-batch than their destination (rows ``offsets``)."""
    m = int(offsets.shape[0] - 1)
    if m <= 1:
        return 0
    part = np.repeat(np.arange(m, dtype=np.int32), np.diff(offsets))
    deg = np.diff(csr.indptr.numpy())
    return int(np.count_nonzero(part[csr.indices.numpy()] != np.repeat(part, deg)))


@dataclasses.dataclass
class FlowOptions:
    """``flow``'s options: the pipeline's stages and micro-batches, and the edges between micro-batches."""
    stages: int = option(0, int_spec(0),
                         "Pipeline stages, one per rank (0: the number of ranks; another value must equal it).",
                         section="engine")
    microbatches: int = option(1, int_spec(1),
                               "METIS micro-batches the graph is split into (GPipe's M); the stages' idle "
                               "fraction is about (P-1)/(M+P-1) with `cross_edges` stale or drop.", section="engine")
    cross_edges: str = option("exact", choice_spec(*CROSS_EDGES),
                              "Edges between micro-batches. `exact`: every layer sees its true neighbours "
                              "(the same as `single`; a stage waits for all micro-batches of a layer); `stale`: "
                              "neighbours in other micro-batches give their latest stored rows (GNNAutoScale "
                              "history, no gradient; evaluation exact); `drop`: those edges are removed (UniTG).",
                              section="engine")
    stage_split: str = option("cost", choice_spec("cost", "count"),
                              "How the layers are cut into stages: by their forward+backward time "
                              "measured on one micro-batch (`cost`) or by count.", section="engine")


class FlowEngine(Engine):
    """See the module docstring. ``source``: a dataset file (every rank reads all of it)."""

    name = "flow"
    summary = "layer-pipelined deep GNNs, one stage of layers per rank, the graph in micro-batches (docs/flow.md)."
    kind = "pipeline"
    data_source = "file"
    replicated = True  # every rank holds every node: accuracies and counts need no all-reduce
    cotraining = True
    # one random stream on every rank: each stage replays the draws of the others' units (train/pipeline.py), so
    # every layer draws the dropout key it draws on one process, and masks are keyed on dataset ids
    shared_rng = True
    Options = FlowOptions

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        if not model.pipeline:
            from hpc_graph.nn.models import models_with

            return f"engine 'flow' pipelines the layer chains ({', '.join(models_with('pipeline'))}), not {mc.name!r}"
        return None

    @classmethod
    def plan_assumptions(cls, options: dict[str, Any]) -> list[str]:
        m = int(options.get("microbatches", 1) or 1)
        return [f"flow: the whole graph on every rank, one stage of layers each, {m} micro-batch(es) of equal size, "
                "cross_edges exact (stages run one after the other); the epoch adds the stages' steps and every "
                "activation transfer"]

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """Renaming the nodes into micro-batch order (several micro-batches): the file's columns, four int64
        arrays per edge (rows, sources, the sort order, the sorted columns) and a renamed copy of the features;
        one micro-batch: the file's int64 columns while they become int32."""
        E, n, disk = int(graph.edges), int(graph.nodes), int(getattr(graph, "disk_index_bytes", 4))
        d = 8 if dtype == "float64" else 4
        if int(options.get("microbatches", 1) or 1) > 1:
            return E * disk + 4 * E * 8 + n * int(graph.features) * d
        return max(E * disk if disk != 4 else 0, cls._read_as_float32_extra(graph, n, dtype))

    @classmethod
    def plan_instance(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                      options: dict[str, Any], hints: dict[str, Any] | None = None) -> "FlowEngine":
        """Stage ``rank.rank`` of ``ranks`` from sizes alone (the planner's): the whole graph, the micro-batches of
        equal size (METIS decides them from the data), exact cross edges; ``hints["boundaries"]``: the stage
        split the planner chose (else this engine's own, by count or by the units' costs measured on shapes).
        Raises NotImplementedError for cross edges stale or drop with several micro-batches (their sizes come
        from the data): ``train`` then starts without a memory estimate, ``hpc-graph plan`` names the option."""
        eng = cls.__new__(cls)
        Engine.__init__(eng, "<flow: sizes only>", comm, torch.device("meta"), dtype, options)
        o = eng.opts
        eng.num_stages, eng.stage = int(ranks), int(rank.rank)
        cls.check_options(eng.options, eng.num_stages)
        m, n = int(o.microbatches), int(graph.nodes)
        if m > 1 and o.cross_edges != "exact":
            raise NotImplementedError(f"engine.cross_edges: the planner runs flow's exact mode (or one micro-batch), "
                                      f"not {o.cross_edges!r} with {m} micro-batches")
        eng.cross_edges, eng.stage_split, eng.seed = o.cross_edges, o.stage_split, int(eng.options["seed"])
        eng.num_microbatches = m
        eng.offsets = np.array([n * k // m for k in range(m + 1)], dtype=np.int64)
        eng.order = None
        eng.graph = WholeGraph(CSR.of_shape(n, n, int(graph.edges), symmetric=not graph.directed))
        eng.plan, eng.cut_edges, eng.history, eng._contexts = None, 0, None, {}
        eng.num_classes, eng.num_features = int(graph.classes), int(graph.features)
        eng.units, eng.boundaries, eng.unit_costs = (0, 0), [], []
        eng._resume_boundaries = list((hints or {}).get("boundaries") or []) or None
        eng._in_tail = eng._out_tail = ()
        eng._sends, eng._idle, eng._training_pass, eng._busy_start, eng._step_stats = [], 0.0, True, 0.0, {}
        return eng

    @classmethod
    def check_config(cls, config: Any, model: Any) -> None:
        from hpc_graph.options import ConfigError

        rc = config.recipes
        if rc.label_aug > 0 or rc.correct_smooth:
            raise ConfigError("recipes: label_aug and correct_smooth are not available on engine 'flow' (they need "
                              "the whole model on one rank)")

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        o = self.opts
        self.num_stages = int(getattr(comm, "size", 1))
        self.stage = int(getattr(comm, "rank", 0))
        self.check_options(self.options, self.num_stages)
        m = o.microbatches
        self.cross_edges = o.cross_edges
        self.stage_split = o.stage_split
        self.seed = int(self.options["seed"])

        with open_dataset(self.source) as ds:
            if not ds.has("feat"):
                raise FormatError(self.source, "/node/feat", "missing (training needs node features)")
            if ds.has("graph_ptr"):
                raise FormatError(self.source, "/graphs/ptr", "a graph-level dataset; the flow engine trains node "
                                  "classifiers (use engine single)")
            n = ds.num_nodes
            indptr = np.asarray(ds.indptr(), dtype=np.int64)
            indices = np.asarray(ds.indices())
            feat = ds.feat_rows(0, n)
            label, masks = ds.node_labels(), ds.split_masks()
            self.num_classes = int(ds.num_classes) or int(label.max()) + 1
        if m > n:
            raise ValueError(f"engine.microbatches: {m} micro-batches but {self.source} has only {n} nodes")
        self.num_microbatches = m
        order, offsets = self._microbatches(indptr, indices, masks["train"], m)
        if m == 1:  # one micro-batch: the graph as stored (no renaming, no copies of the structure or features)
            csr = CSR(torch.from_numpy(indptr), torch.from_numpy(indices.astype(column_dtype(n), copy=False)), n,
                      validate=False)
        else:
            csr = CSR.permuted(indptr, indices, order)
        del indices
        self.order = torch.from_numpy(order)  # row r of this engine is dataset node order[r]
        self.offsets = offsets
        # attention dropout hashes the dataset ids, as on single
        self.graph = WholeGraph(csr.to(self.device), global_ids=self.order)
        # exact runs every stage on the whole graph: the micro-batches' own structures are never used
        self.plan = MicroBatchPlan(csr.indptr.numpy(), csr.indices.numpy(), offsets, order, self.device) \
            if m > 1 and self.cross_edges != "exact" else None
        self.cut_edges = self.plan.cut_edges if self.plan is not None else _cut_edges(csr, offsets)
        self.history = History(n) if (self.cross_edges == "stale" and m > 1) else None
        self._contexts: dict[tuple, Any] = {}
        ident = m == 1
        self.feat = torch.from_numpy(np.ascontiguousarray(feat if ident else feat[order])).to(device=self.device,
                                                                                             dtype=dtype)
        del feat
        self.label = torch.from_numpy(np.asarray(label, dtype=np.int64) if ident else
                                      np.asarray(label, dtype=np.int64)[order]).to(self.device)
        self.masks = {k: torch.from_numpy(np.asarray(v, dtype=bool) if ident else np.asarray(v, dtype=bool)[order])
                      .to(self.device) for k, v in masks.items()}
        self.num_features = int(self.feat.shape[1])
        self.units: tuple[int, int] = (0, 0)
        self.key_draws: tuple[list[int], list[int]] = ([], [])
        self.boundaries: list[int] = []
        self.unit_costs: list[float] = []
        self._resume_boundaries: list[int] | None = None
        self._in_tail: tuple[int, ...] = ()
        self._out_tail: tuple[int, ...] = ()
        self._sends: list[Any] = []
        self._idle = 0.0
        self._training_pass = True
        self._busy_start = 0.0
        self._step_stats: dict[str, float] = {}
        log.info("flow engine: %s, %d nodes, %d edges, stage %d of %d, %d micro-batch(es), %d cut edges (%.1f %%), "
                 "cross edges %s", self.source, n, csr.num_edges, self.stage, self.num_stages, m,
                 self.cut_edges, 100.0 * self.cut_edges / max(csr.num_edges, 1), self.cross_edges)

    # -- set-up ---------------------------------------------------------------------------------------
    def _microbatches(self, indptr: np.ndarray, indices: np.ndarray, train: np.ndarray, m: int):
        """``(order, offsets)``: the dataset nodes in micro-batch order and the micro-batches' row offsets.
        METIS parts (rank 0 computes, every rank receives the same), ascending dataset id inside each."""
        n = indptr.shape[0] - 1
        if m == 1:
            return np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64)
        parts = None
        if self.stage == 0:
            from data_io.partitioner import assign_parts

            t0 = time.perf_counter()
            parts = np.asarray(assign_parts(indptr, indices, m, method="metis", seed=self.seed, train_mask=train),
                               dtype=np.int64)
            log.info("flow engine: %d METIS micro-batches in %.2f s", m, time.perf_counter() - t0)
        if self.num_stages > 1:
            parts = self.comm.bcast_object(parts, 0)
        counts = np.bincount(parts, minlength=m)
        if np.any(counts == 0):
            raise ValueError(f"engine.microbatches: METIS left {int((counts == 0).sum())} of {m} micro-batches "
                             f"empty on this graph; use fewer")
        order = np.argsort(parts, kind="stable").astype(np.int64)
        return order, np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    @classmethod
    def check_options(cls, options: dict[str, Any], size: int) -> None:
        """``stages``: 0 or the number of ranks."""
        stages = cls.parse_options(options).stages
        if stages not in (0, size):
            raise ValueError(f"engine.stages: the flow engine runs one stage per rank; this job has "
                             f"{size} rank(s) but engine.stages is {stages} (launch {stages} ranks, or set 0)")

    def check_model(self, model: torch.nn.Module) -> None:
        """``ValueError`` (the same on every rank) for a model that is no chain of units, has fewer units than
        stages, or is reversible under ``cross_edges: stale`` (its chain needs every layer to keep the rows)."""
        if not hasattr(model, "forward_units") or not hasattr(model, "pipeline_units"):
            raise ValueError(f"engine 'flow': model {type(model).__name__} cannot be cut into pipeline stages; "
                             "the flow engine runs gcn, sage, gat, revgcn and revgat")
        if self.history is not None and getattr(model, "reversible", None) is not None:
            raise ValueError(f"engine.cross_edges: 'stale' appends halo rows to every layer, which a reversible "
                             f"chain ({type(model).__name__}) cannot take; use cross_edges exact or drop")
        units = len(model.pipeline_units())
        if units < self.num_stages:
            raise ValueError(f"engine.stages: {self.num_stages} stages but model {type(model).__name__} has only "
                             f"{units} pipeline units (layers); use fewer ranks or more layers")

    def attach_model(self, model: torch.nn.Module, feat: torch.Tensor | None = None) -> None:
        """Cut ``model`` (checked by :meth:`check_model`) into this job's stages: rank 0 measures the units on
        ``feat`` (the trainer's input; default the engine's features), every rank keeps its stage's and
        releases the other units' parameters to the ``meta`` device."""
        units = model.pipeline_units()
        costs, tails, draws = None, None, [[] for _ in units]
        planned = self.device.type == "meta"  # sizes only (the planner): every stage finds the shapes itself
        if self.stage == 0 or planned:
            x = self.feat if feat is None else (feat if feat.layout == torch.strided else feat.to_dense())
            if planned and self.stage > 0:
                # a later stage receives the shapes from rank 0: find them on a throw-away copy of the graph,
                # so that the caches the probe builds for other stages' layers are not this stage's
                costs, tails = self._planned_shapes(model, len(units), x)
            elif self.stage_split == "cost":
                costs, tails, draws = self._measure_units(model, len(units), x)
                costs = _same_units_same_cost(units, costs)
            else:  # by count: only the units' output shapes are needed
                tails, draws = self._unit_shapes(model, len(units), x)
                costs = [1.0] * len(units)
        if self.num_stages > 1 and not planned:
            costs, tails, draws = self.comm.bcast_object((costs, tails, draws), 0)
        self.unit_costs = costs
        weights = costs if self.stage_split == "cost" else [1.0] * len(units)
        self.boundaries = self._resume_boundaries or split_stages(weights, self.num_stages)
        start, stop = self.boundaries[self.stage], self.boundaries[self.stage + 1]
        self.units = (start, stop)
        # the random draws of the units before and after this stage's, replayed around each of its passes
        self.key_draws = ([h for d in draws[:start] for h in d], [h for d in draws[stop:] for h in d])
        self._in_tail = tuple(tails[start - 1]) if start > 0 else ()
        self._out_tail = tuple(tails[stop - 1])
        for i, unit in enumerate(units):
            if not start <= i < stop:
                for module in unit:
                    module.to_empty(device=torch.device("meta"))
        mine = sum(p.numel() for i in range(start, stop) for mod in units[i] for p in mod.parameters())
        log.info("flow engine: stage %d runs units %d..%d of %d (%s split; %d parameters)", self.stage, start,
                 stop - 1, len(units), self.stage_split, mine)

    def _planned_shapes(self, model: torch.nn.Module, count: int, x: torch.Tensor) -> tuple[list[float], list]:
        """On shapes (the planner), for a stage after the first: the units' output shapes found on a copy of the
        graph made outside the planner's tracking (a real later stage is sent them by rank 0 and builds
        nothing for them). Costs by count: the planner hands the stage split over as a hint."""
        import copy

        from torch.utils._python_dispatch import _disable_current_modes

        graph = self.graph
        try:
            with _disable_current_modes():
                self.graph = copy.deepcopy(graph)
                tails = self._unit_shapes(model, count, x)[0]
        finally:
            self.graph = graph
        return [1.0] * count, tails

    def _probe_context(self, x: torch.Tensor) -> tuple[Any, int, int]:
        """``(context, lo, hi)`` of the start-up probes: the first training group (its own history under stale)."""
        group = self.groups(training=True)[0]
        lo, hi = self.group_rows(group)
        probe_history = History(self.graph.num_nodes) if self.history is not None else None
        if probe_history is not None:
            probe_history.inputs = x
        return self.context(group, True, probe_history), lo, hi

    def _unit_shapes(self, model: torch.nn.Module, count: int,
                     x: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
        """The shape (after the rows) of every unit's output and the random draws of its training pass
        (:func:`~hpc_graph.ops.dropout.record_key_draws`): one forward pass without autograd on the first
        micro-batch, in training mode (the random streams, GAT call counters and the model's mode left as they
        were)."""
        ctx, lo, hi = self._probe_context(x)
        tails, draws = [], []
        with _probing(model), torch.no_grad():
            h = x[lo:hi]
            for i in range(count):
                with record_key_draws() as highs:
                    h = model.forward_units(ctx, h, i, i + 1)
                tails.append(list(h.shape[1:]))
                draws.append(list(highs))
        return tails, draws

    def _measure_units(self, model: torch.nn.Module, count: int,
                       x: torch.Tensor) -> tuple[list[float], list[list[int]], list[list[int]]]:
        """Forward + backward seconds of every unit on the first micro-batch (best of two passes), the shape
        (after the rows) of every unit's output and the random draws of its training pass (as
        :meth:`_unit_shapes`). The random streams, GAT call counters and the model's mode are left as they were.
        Each unit's output is let go before its backward pass and made again without autograd for the next unit,
        so the probe needs no more memory than a training step."""
        ctx, lo, hi = self._probe_context(x)
        best = [float("inf")] * count
        tails: list[list[int]] = [[] for _ in range(count)]
        draws: list[list[int]] = [[] for _ in range(count)]
        with _probing(model):
            for _ in range(2):
                h = x[lo:hi]
                for i in range(count):
                    h_in = h.detach().requires_grad_(i > 0)
                    t0 = time.perf_counter()
                    with record_key_draws() as highs:
                        out = model.forward_units(ctx, h_in, i, i + 1)
                    draws[i] = list(highs)
                    tails[i] = list(out.shape[1:])
                    # backward from a gradient of ones without holding the output through it (as training does
                    # not: there the next layer has consumed it); rank 0's peak stays that of a training step
                    total = out.sum()
                    del out
                    total.backward()
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    best[i] = min(best[i], time.perf_counter() - t0)
                    del total
                    h_in.grad = None
                    if i + 1 < count:  # the next unit's input, made again without autograd (not timed)
                        with torch.no_grad():
                            h = model.forward_units(ctx, h_in.detach(), i, i + 1)
        for p in model.parameters():
            p.grad = None
        return best, tails, draws

    # -- what the pipeline loop (hpc_graph.train.pipeline) asks ---------------------------------------
    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    def groups(self, training: bool) -> list[list[int]]:
        """Micro-batches computed together: all of them at once under ``exact`` (and when evaluating
        ``stale``), one at a time otherwise."""
        m = self.num_microbatches
        together = self.cross_edges == "exact" or (self.cross_edges == "stale" and not training) or m == 1
        return [list(range(m))] if together else [[i] for i in range(m)]

    def group_rows(self, group: list[int]) -> tuple[int, int]:
        """Rows ``lo:hi`` of a group of consecutive micro-batches."""
        return int(self.offsets[group[0]]), int(self.offsets[group[-1] + 1])

    def context(self, group: list[int], training: bool, history: History | None = None):
        """The GraphContext a stage runs a group on (``training`` is implied by the groups; ``history``: another
        than the engine's, for the cost probe)."""
        if len(group) == self.num_microbatches:
            return self.graph
        mode = self.cross_edges
        if history is not None and history is not self.history:
            return self.plan.context(group[0], mode, history)
        key = (mode, group[0])
        if key not in self._contexts:
            self._contexts[key] = self.plan.context(group[0], mode, self.history)
        return self._contexts[key]

    def begin_step(self, x: torch.Tensor, training: bool = True) -> None:
        """A pipeline pass starts on input features ``x`` float[N, F] (rows in this engine's order); the times of
        a training pass are what :meth:`stats` reports."""
        if self.history is not None:
            self.history.inputs = x
        self._training_pass = training
        self._p2p_start = int(getattr(self.comm, "bytes_by_op", {}).get("exchange", 0))
        self._idle = 0.0
        self._sends = []
        self._busy_start = time.perf_counter()

    def send(self, direction: str, m: int, t: torch.Tensor) -> None:
        """Start sending micro-batch ``m``'s rows ``t`` forward (to the next stage) or backward (to the previous)."""
        peer, channel = (self.stage + 1, _FORWARD) if direction == "forward" else (self.stage - 1, _BACKWARD)
        self._sends.append(self.comm.exchange_start({peer: t}, {}, channel=channel))

    def recv(self, direction: str, m: int) -> torch.Tensor:
        """Micro-batch ``m``'s rows from the previous stage (``forward``) or the next (``backward``); the time
        spent waiting counts as idle."""
        rows = int(self.offsets[m + 1] - self.offsets[m])
        if direction == "forward":
            peer, channel, tail = self.stage - 1, _FORWARD, self._in_tail
        else:
            peer, channel, tail = self.stage + 1, _BACKWARD, self._out_tail
        t0 = time.perf_counter()
        req = self.comm.exchange_start({}, {peer: ((rows,) + tail, self.dtype)}, device=self.device, channel=channel)
        if self.idle_hook is not None:  # a cooperative wait: other work may fill the bubble
            with self.comm.watched("exchange"):  # a polling loop: the stall watchdog still sees it
                self.idle_hook(req.test, (direction, m, self._training_pass))
        out = req.wait()[peer]
        self._idle += time.perf_counter() - t0
        return out

    def end_step(self, saved_bytes: int | None = None) -> None:
        """Complete this pass's sends (waiting for them counts as idle) and record the pass's times (and the bytes
        autograd kept for its backward half)."""
        t0 = time.perf_counter()
        for req in self._sends:
            req.wait()
        self._sends = []
        self._idle += time.perf_counter() - t0
        total = time.perf_counter() - self._busy_start
        if self._training_pass:
            sent = int(getattr(self.comm, "bytes_by_op", {}).get("exchange", 0)) - self._p2p_start
            self._step_stats = {"pipeline_seconds": total, "idle_seconds": self._idle, "p2p_bytes": float(sent),
                                "idle_fraction": self._idle / total if total > 0 else 0.0}
            if saved_bytes is not None:
                self._step_stats["saved_bytes"] = float(saved_bytes)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out.update(self._step_stats)
        out["cut_fraction"] = self.cut_edges / max(self.graph.csr.num_edges, 1)
        if self.history is not None:
            out["history_bytes"] = float(self.history.nbytes())
        return out

    def state_dict(self) -> dict[str, Any]:
        """This stage's state: the stage split, so that a resumed run keeps its layers where its optimiser
        state is, and under ``stale`` the stage's history (N x width per layer of the stage), so that a
        resumed run reads the same stale rows as an uninterrupted one."""
        return {"boundaries": list(self.boundaries),
                "history": None if self.history is None else self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Use a checkpoint's stage split and this stage's history (called before :meth:`attach_model`)."""
        history = state.get("history")
        if self.history is not None and history is not None:
            self.history.load_state_dict(history, self.device)
        bounds = state.get("boundaries")
        if bounds:
            if len(bounds) != self.num_stages + 1:
                raise ValueError(f"--resume: the checkpoint's pipeline has {len(bounds) - 1} stages, this job "
                                 f"{self.num_stages}")
            self._resume_boundaries = [int(b) for b in bounds]

    def predictions_from_last(self, pred: torch.Tensor) -> torch.Tensor:
        """Broadcast the last stage's predictions int64[N] to every rank."""
        if self.num_stages > 1:
            self.comm.bcast(pred, self.num_stages - 1)
        return pred
