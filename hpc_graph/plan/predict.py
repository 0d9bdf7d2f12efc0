"""Predicted peak memory and epoch time per rank, for every engine that can be planned and every model.

Each rank of a :class:`~hpc_graph.plan.shapes.Layout` is planned by running the engine's and the model's own step
on shapes (:func:`hpc_graph.plan.rank.plan_rank`): its high-water mark is the memory the real step would reach,
the work it recorded (SpMM edges x width, attention, GEMM flops, elementwise bytes, dropout masks, codec values,
messages) turns into seconds at the machine's measured rates (:class:`~hpc_graph.plan.rates.Rates`). The epoch is
the slowest rank's; a pipeline's (an engine of kind ``pipeline``) is its stages' steps one after the other, each
transfer counted once. Plus what no step shows: the process floor (Python, torch, numba and its kernels, MPI:
measured by ``hpc-graph plan``) and, while an engine loads, the transient copies it declares
(``Engine.plan_load_extra``).

See docs/plan.md for what is assumed and how close the predictions came to measured runs.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any

from hpc_graph.plan.rank import RankPlan, plan_rank
from hpc_graph.plan.rates import Rates
from hpc_graph.plan.shapes import (GraphShape, Layout, RankShape, graph_from_dataset, graph_from_partition,
                                   rank_from_partition, replicated_layout, single_layout)

log = logging.getLogger(__name__)

DTYPE_BYTES = {"float32": 4, "float64": 8}
#: what the process floor is when it cannot be measured: Python, torch, numba with the compiled kernels
#: and MPI, measured by a 3-epoch training run on a 1024-node graph on the development machine
DEFAULT_FLOOR_BYTES = 480 << 20
#: resident memory the compiled kernels add to a process that imported torch and numba (measured:
#: ~290 MiB after the imports, ~450-480 MiB after a training epoch on a tiny graph)
KERNEL_ALLOWANCE_BYTES = 170 << 20
#: what MPI adds to a rank of a multi-rank job (measured: 2 and 4 ranks of a 1024-node graph, 14-20 MiB above
#: the same run on one process)
MPI_ALLOWANCE_BYTES = 16 << 20
COMPONENTS = ("floor", "graph", "features", "params", "activations", "halo", "workspace")


# -- what is trained --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepSpec:
    """The model and the training settings of a plan: the config's ``model`` section (any registered model),
    the input and output widths, and the trainer's settings that shape its memory.

    ``layers``: the model's pipeline units (a pipeline's stages split them), or its message-passing layers.
    """

    model: Any
    in_dim: int
    classes: int
    dtype: str = "float32"
    optimizer: str = "adam"
    momentum: float = 0.0
    feature_norm: str = "none"
    label_aug: float = 0.0
    layers: int = 1
    parameters: int = 0

    @functools.cached_property
    def attention(self) -> bool:
        """Whether the model's step runs the fused attention kernels (their rates are then measured): its step
        planned on a small graph, once per spec and only when asked."""
        return _uses_attention(self)

    @property
    def name(self) -> str:
        return str(self.model.name)

    @property
    def dbytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def num_params(self) -> int:
        return self.parameters

    def describe(self) -> str:
        mc = self.model
        return (f"{self.name}, {self.layers} layer(s), hidden {getattr(mc, 'hidden', '?')}, input width {self.in_dim},"
                f" {self.classes} classes, {self.parameters:,} parameters, {self.dtype}, {self.optimizer}")


def step_spec(model: Any, num_features: int, num_classes: int, *, dtype: str = "float32", optimizer: str = "adam",
              momentum: float = 0.0, feature_norm: str = "none", label_aug: float = 0.0) -> StepSpec:
    """The :class:`StepSpec` of a config's ``model`` section on data of ``num_features`` features and
    ``num_classes`` classes (the model is built once to count its parameters and units).

    Raises:
        ValueError naming the field for an unknown model or dtype.
    """
    from hpc_graph.nn.models import build_from_config

    if dtype not in DTYPE_BYTES:
        raise ValueError(f"train.dtype: must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    classes = max(int(num_classes), 1)
    in_dim = int(num_features) + (classes if label_aug and label_aug > 0 else 0)
    net = build_from_config(model, in_dim, classes)
    units = net.pipeline_units() if hasattr(net, "pipeline_units") else None
    layers = len(units) if units is not None else int(getattr(net, "message_passing_layers", 0) or
                                                      getattr(model, "num_layers", 1))
    spec = StepSpec(model=model, in_dim=in_dim, classes=classes, dtype=dtype, optimizer=str(optimizer),
                    momentum=float(momentum), feature_norm=str(feature_norm), label_aug=float(label_aug or 0.0),
                    layers=max(int(layers), 1), parameters=sum(p.numel() for p in net.parameters()))
    return spec


def _uses_attention(spec: StepSpec) -> bool:
    """Whether the model's step runs the fused attention kernels: its step planned on a small graph."""
    from hpc_graph.engines import engine_class, reference_engine

    graph = GraphShape(nodes=64, edges=256, features=spec.in_dim - (spec.classes if spec.label_aug else 0),
                       classes=spec.classes, train_nodes=16)
    try:
        cls = engine_class(reference_engine())
        plan = _plan(cls, {}, spec, graph, single_layout(graph).parts[0], 1)
    except Exception:  # noqa: BLE001 - a model the whole-graph engine cannot run: no attention rates then
        return False
    return any(w.attention for w in plan.work.values())


def spec_from_config(config: Any, graph: GraphShape) -> StepSpec:
    """:func:`step_spec` of a training config on ``graph``."""
    return step_spec(config.model, graph.features, graph.classes, dtype=config.train.dtype,
                     optimizer=config.optim.name, momentum=config.optim.momentum,
                     feature_norm=config.data.feature_norm, label_aug=getattr(config.recipes, "label_aug", 0.0))


# -- estimates ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class MemoryEstimate:
    """One rank's predicted memory (bytes).

    ``peak``: the high-water mark over loading, two training steps and an evaluation pass (the floor included);
    ``components``: what is live at that moment, by :data:`COMPONENTS`; ``where``: the moment (``loading``, or the
    phase of the step). ``saved``: what autograd keeps for the backward pass at the end of the forward pass.
    ``graph``, ``features``, ``params``: what the rank holds between steps. ``load_peak``: the high-water mark while
    the engine loads.
    """

    rank: int
    peak: int
    components: dict[str, int]
    where: str
    saved: int
    graph: int
    features: int
    params: int
    load_peak: int


@dataclasses.dataclass
class TimeEstimate:
    """One rank's predicted training step (seconds): ``compute`` (``terms``: ``spmm``, ``attention``, ``gemm``,
    ``elementwise``, ``codec``, ``overhead``), ``halo`` (exchanges the step waits for), ``allreduce``."""

    rank: int
    compute: float
    halo: float
    allreduce: float
    terms: dict[str, float]
    messages: int = 0
    halo_bytes: float = 0.0
    bytes_sent: float = 0.0
    hidden: float = 0.0  # exchange time behind the computation, not in ``halo``

    @property
    def total(self) -> float:
        return self.compute + self.halo + self.allreduce


def memory_of(plan: RankPlan, floor: int, load_extra: int = 0) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of a planned rank, with ``floor`` bytes of process floor and ``load_extra``
    bytes the engine holds only while it loads."""
    held = plan.load_held
    load = sum(held.values()) + int(load_extra)
    if load > plan.peak:
        parts, where, peak = {**held, "workspace": held.get("workspace", 0) + int(load_extra)}, "loading", load
    else:
        parts, where, peak = dict(plan.components), plan.where, plan.peak
    return MemoryEstimate(rank=plan.rank, peak=int(peak + floor),
                          components={"floor": int(floor), **{c: int(parts.get(c, 0)) for c in COMPONENTS[1:]}},
                          where=where, saved=int(plan.saved), graph=int(plan.held.get("graph", 0)),
                          features=int(plan.held.get("features", 0)), params=int(plan.held.get("params", 0)),
                          load_peak=int(load + floor))


def time_of(plan: RankPlan, rates: Rates, *, threads: int, cores_share: float, ranks: int,
            overlap: bool = True) -> TimeEstimate:
    """The :class:`TimeEstimate` of a planned rank's training step at ``rates`` for a rank of ``threads`` threads on
    ``cores_share`` cores. ``overlap``: exchanges started in the background travel while the rank computes (a
    network link); False: they cost their full time (ranks of one node, whose transfers are copies by the same
    cores, as measured on this machine)."""
    k = rates.slowdown(threads, cores_share)
    train = [plan.work[p] for p in ("forward", "backward", "optimizer")]

    def lin(items: list[tuple[int, int]], ab: tuple[float, float]) -> float:
        a, b = ab
        return sum(e * (a + b * width) for e, width in items)

    fwd, bwd = plan.work["forward"], plan.work["backward"]
    spmm = (lin(fwd.spmm, rates.spmm_fwd) + lin(bwd.spmm, rates.spmm_bwd)) * k
    att = (lin(fwd.attention, rates.gat_fwd) + lin(bwd.attention, rates.gat_bwd)) * k
    gemm = sum(w.flops for w in train) / rates.gemm_flops * k
    elem = sum(w.stream / rates.stream + w.mask / rates.mask + w.score / rates.score for w in train) * k
    codec = sum(w.codec for w in train) / rates.codec * k
    compute = spmm + att + gemm + elem + codec
    # the step's overhead beyond its kernels (Rates.step_overhead): a pipeline stage carries its units' share; a
    # rank with less than a core runs it slower; a measured overhead below zero takes at most half the kernels
    extra = rates.step_overhead_for(threads) * plan.share
    measured = rates.oversubscribed(threads / cores_share) if cores_share > 0 and threads > cores_share else None
    if measured is not None:  # the copies measured the whole step, its overhead included
        extra *= measured
    elif cores_share > 0:
        extra *= max(1.0, 1.0 / cores_share)
    extra = max(extra, -0.5 * compute)
    compute += extra
    exchanges = [x for w in train for x in w.exchanges]
    background = [x for w in train for x in w.background]
    halo = sum(rates.exchange_time(o, i, p) for o, i, p in exchanges)
    behind = sum(rates.exchange_time(o, i, p) for o, i, p in background)
    hidden = min(behind, compute) if overlap else 0.0
    halo += behind - hidden
    reduces = [x for w in train for x in w.allreduce]
    nbytes = sum(b for b, _ in reduces)
    calls = max(1, -(-nbytes // (25 << 20))) if nbytes else 1
    ar = rates.allreduce_time(nbytes, ranks, calls) if ranks > 1 else 0.0
    every = exchanges + background
    terms = {"spmm": spmm, "attention": att, "gemm": gemm, "elementwise": elem}
    if codec:
        terms["codec"] = codec
    terms["overhead"] = extra
    return TimeEstimate(rank=plan.rank, compute=compute, halo=halo, allreduce=ar, terms=terms,
                        messages=len(every), halo_bytes=sum(max(o, i) for o, i, _ in every),
                        bytes_sent=float(plan.bytes_sent), hidden=hidden)


# -- a prediction ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Prediction:
    """One engine on one rank count: the bottleneck rank's memory, the slowest rank's step, and why.

    ``bottleneck``: ``memory`` (``fits`` is False), else the largest of ``compute``, ``halo exchange``,
    ``all-reduce``. ``time`` is None without rates (memory only).
    """

    engine: str
    ranks: int
    memory: MemoryEstimate
    time: TimeEstimate | None
    fits: bool | None
    bottleneck: str
    layout: Layout
    threads: int
    cores_share: float
    rank_peaks: list[int] = dataclasses.field(default_factory=list)
    rank_seconds: list[float] = dataclasses.field(default_factory=list)
    rank_bytes_sent: list[float] = dataclasses.field(default_factory=list)
    stages: list[list[int]] = dataclasses.field(default_factory=list)  # a pipeline: [first unit, stop] per rank

    def as_dict(self) -> dict[str, Any]:
        out = {"engine": self.engine, "ranks": self.ranks, "threads_per_rank": self.threads,
               "cores_per_rank": self.cores_share, "fits": self.fits, "bottleneck": self.bottleneck,
               "layout": self.layout.source, "cut_fraction": self.layout.cut_fraction,
               "memory": dataclasses.asdict(self.memory), "rank_peaks": self.rank_peaks}
        if self.rank_seconds:
            out.update(rank_seconds=self.rank_seconds, rank_bytes_sent=self.rank_bytes_sent)
        if self.stages:
            out["stages"] = self.stages
        if self.time is not None:
            out["time"] = {**dataclasses.asdict(self.time), "epoch_seconds": self.time.total}
        return out


def threads_for(ranks_per_node: int, cores_per_node: int) -> tuple[int, float]:
    """``(threads, cores)`` of a rank when ``ranks_per_node`` ranks share ``cores_per_node`` cores: the
    threads ``hpc_graph.comm.threads`` gives by default (the rank's share, at least 1) and the cores
    it really gets (less than one when the ranks oversubscribe the node)."""
    r, c = max(1, int(ranks_per_node)), max(1, int(cores_per_node))
    return max(1, c // r), c / r


def layout_for(engine_cls: Any, graph: GraphShape, ranks: int, partitioned: Any) -> Layout:
    """The layout engine ``engine_cls`` runs on ``ranks`` ranks: the whole graph (an engine of one process), the
    whole graph on every rank (an engine that replicates it), or ``partitioned(ranks)`` (a partition's or the
    cut model's)."""
    if engine_cls.max_ranks == 1:
        if ranks != 1:
            raise ValueError(f"engine {engine_cls.name!r} runs on one rank, not {ranks}")
        return single_layout(graph)
    if engine_cls.replicated:
        return replicated_layout(graph, ranks)
    return partitioned(ranks)


def stage_bounds(units: int, stages: int, costs: list[float] | None = None) -> list[int]:
    """Where a pipeline cuts a ``units``-unit model into ``stages`` stages: by ``costs`` (one per unit) or by
    count (None)."""
    from hpc_graph.graph.microbatch import split_stages

    if not 1 <= stages <= units:
        raise ValueError(f"engine.stages: {stages} stages (ranks) but the model has {units} layers; a pipeline "
                         "needs at least one layer per stage")
    return split_stages(list(costs) if costs is not None else [1.0] * units, stages)


def _plan(engine_cls: Any, options: dict, spec: StepSpec, graph: GraphShape, rs: RankShape, P: int,
          hints: dict | None = None, link: Any = None) -> RankPlan:
    return plan_rank(engine_cls, options, spec.model, graph, rs, P, dtype=spec.dtype, optimizer=spec.optimizer,
                     momentum=spec.momentum, feature_norm=spec.feature_norm, label_aug=spec.label_aug, link=link,
                     hints=hints)


def unit_costs(engine_cls: Any, options: dict, spec: StepSpec, graph: GraphShape, rates: Rates, *, threads: int,
               cores_share: float) -> list[float]:
    """Predicted forward + backward seconds of each of the model's units on the whole graph (what a pipeline's
    ``stage_split: cost`` weighs): each unit planned as a stage of its own."""
    whole = replicated_layout(graph, spec.layers).parts
    costs = []
    for u in range(spec.layers):
        plan = _plan(engine_cls, options, spec, graph, whole[u], spec.layers,
                     hints={"boundaries": list(range(spec.layers + 1))})
        t = time_of(plan, rates, threads=threads, cores_share=cores_share, ranks=1)
        costs.append(t.compute - t.terms["overhead"])
    return costs


def predict(engine: str, spec: StepSpec, graph: GraphShape, layout: Layout, *, floor: int,
            rates: Rates | None = None, memory_per_rank: int | None = None, cores_per_node: int | None = None,
            ranks_per_node: int | None = None, threads: int | None = None, options: dict | None = None,
            source: str | None = None) -> Prediction:
    """Predict ``engine`` on ``layout.ranks`` ranks: plan every rank of the layout, keep the largest peak memory
    and the slowest step. ``options``: the engine's (``Engine.options_from_config``; default its defaults).
    ``source``: the data path, for an engine that hands over to a variant of itself.

    A pipeline engine (kind ``pipeline``): its stages split the model's units by count, or by their predicted
    costs (``stage_split: cost``, when there are rates); its epoch is the stages' steps one after the other
    with every transfer between them."""
    from hpc_graph.engines import engine_class

    cls = engine_class(engine, source)
    opts = dict(options or {})
    P = layout.ranks
    if cls.max_ranks is not None and P > cls.max_ranks:
        raise ValueError(f"engine {engine!r} runs on {cls.max_ranks} rank(s), not {P}")
    cores = int(cores_per_node or os.cpu_count() or 1)
    rpn = int(ranks_per_node or P)
    t_default, share = threads_for(rpn, cores)
    thr = int(threads or t_default)
    hints: list[dict | None] = [None] * len(layout.parts)
    bounds: list[int] = []
    pipeline = cls.kind == "pipeline"
    if pipeline:
        layout = replicated_layout(graph, P)
        split = str(opts.get("stage_split", "count"))
        costs = None
        if split == "cost" and rates is not None:
            costs = unit_costs(cls, opts, spec, graph, rates, threads=thr, cores_share=share)
        bounds = stage_bounds(spec.layers, P, costs)
        layout.notes.append(f"{engine}: {P} stage(s), layers "
                            f"{', '.join(f'{a + 1}-{b}' for a, b in zip(bounds, bounds[1:]))}"
                            f" ({'predicted layer costs' if costs else 'by count'}"
                            f"{'; stage_split cost without rates: by count' if split == 'cost' and not costs else ''})")
        hints = [{"boundaries": bounds}] * len(layout.parts)
    load_extra = [int(cls.plan_load_extra(graph, rs, P, spec.dtype, opts)) for rs in layout.parts]
    best: MemoryEstimate | None = None
    worst: TimeEstimate | None = None
    peaks, seconds, sent, stage_times = [], [], [], []
    for rs, hint, extra in zip(layout.parts, hints, load_extra):
        plan = _plan(cls, opts, spec, graph, rs, P, hints=hint, link=getattr(rates, "link", None))
        mem = memory_of(plan, floor, extra)
        peaks.append(mem.peak)
        if best is None or mem.peak > best.peak:
            best = mem
        if rates is not None:
            # background exchanges overlap the computation over a network (a modelled link, or peers on other
            # nodes), not between ranks of one node measured by the profile (their transfers are CPU copies)
            overlap = rates.link is not None or rpn < P
            tm = time_of(plan, rates, threads=thr, cores_share=share, ranks=P, overlap=overlap)
            seconds.append(tm.total)
            sent.append(tm.bytes_sent)
            stage_times.append(tm)
            if worst is None or tm.total > worst.total:
                worst = tm
    assert best is not None
    if pipeline and stage_times:
        # the stages compute one after the other, each transfer once (counted by both of its ends)
        worst = TimeEstimate(rank=worst.rank, compute=sum(x.compute for x in stage_times),
                             halo=sum(x.halo for x in stage_times) / 2,
                             allreduce=max(x.allreduce for x in stage_times),
                             terms={k: sum(x.terms.get(k, 0.0) for x in stage_times) for k in stage_times[0].terms},
                             messages=sum(x.messages for x in stage_times) // 2,
                             halo_bytes=sum(x.halo_bytes for x in stage_times) / 2, bytes_sent=max(sent))
    fits = None if memory_per_rank is None else best.peak <= memory_per_rank
    if fits is False:
        bottleneck = "memory"
    elif worst is None:
        bottleneck = "-"
    else:
        terms = {"compute": worst.compute, "halo exchange": worst.halo, "all-reduce": worst.allreduce}
        bottleneck = max(terms, key=terms.get)
    return Prediction(engine=engine, ranks=P, memory=best, time=worst, fits=fits, bottleneck=bottleneck,
                      layout=layout, threads=thr, cores_share=share, rank_peaks=peaks, rank_seconds=seconds,
                      rank_bytes_sent=sent, stages=[[a, b] for a, b in zip(bounds, bounds[1:])])


# -- the training refusal ------------------------------------------------------------------------------
class PlanError(RuntimeError):
    """The planner could not estimate a run (the trainer refuses to start then, unless forced)."""


def train_estimate(config: Any, engine: str, rank: int, size: int) -> tuple[int, str] | None:
    """What rank ``rank`` of a ``size``-rank ``hpc-graph train`` job of ``config`` will still allocate, in bytes:
    the predicted peak without the process floor, plus the kernels and thread pools a process that imported torch
    loads on its first step (:data:`KERNEL_ALLOWANCE_BYTES`). No timing, nothing collective: reads
    ``partition.json`` and this rank's part offsets, or the dataset's header.

    Returns ``(bytes, text describing the prediction)``, or None where there is nothing to plan: an engine
    without a planning path (``Engine.plan_instance`` gives None), or a graph-level dataset (many small graphs,
    batched).

    Raises:
        PlanError: the engine can be planned but the estimate failed (the message says why).
    """
    from data_io.memory import format_bytes
    from hpc_graph.engines import engine_class

    path = str(config.data.path)
    cls = engine_class(engine, path)
    if cls.kind == "sampled":
        return None  # batches of sampled (or small) graphs: no full-graph step to plan
    try:
        if os.path.isfile(path):
            graph = graph_from_dataset(path)
            P = size
            rs = (single_layout(graph) if cls.max_ranks == 1 else replicated_layout(graph, size)).parts[rank]
        else:
            graph = graph_from_partition(path)
            layout, rs = rank_from_partition(path, rank)
            P = layout.ranks
        spec = spec_from_config(config, graph)
        opts = cls.options_from_config(config)
        hints = None
        if cls.kind == "pipeline":
            if not 1 <= P <= spec.layers:
                return None  # fewer layers than stages: the engine refuses the model itself, naming why
            hints = {"boundaries": stage_bounds(spec.layers, P)}  # the engine may split by cost: by count here
        plan = _plan(cls, opts, spec, graph, rs, P, hints=hints)
        mem = memory_of(plan, 0, int(cls.plan_load_extra(graph, rs, P, spec.dtype, opts)))
    except NotImplementedError as exc:
        log.info("memory check: no plan of engine %s with model %s (%s)", engine, config.model.name, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - any failure of an engine that can be planned is reported
        raise PlanError(f"{type(exc).__name__}: {exc}") from exc
    need = mem.peak + KERNEL_ALLOWANCE_BYTES
    text = (f"{engine} {spec.name}, rank {rank}: peak {format_bytes(mem.peak)} at {mem.where} + "
            f"{format_bytes(KERNEL_ALLOWANCE_BYTES)} of kernels")
    return int(need), text


def train_estimate_apart(config: Any, engine: str, rank: int, size: int,
                         timeout: float = 600.0) -> tuple[int, str] | None:
    """:func:`train_estimate` in a forked child process, for a process about to train.

    Running the step on shapes imports torch's tracing stack and leaves ~100 MiB resident in the process that
    ran it: in the training process that memory would stay beside the training it was meant to predict. The
    child inherits everything imported and registered (engines and models added at run time included), runs
    the estimate alone on one thread, sends the result back through a pipe and exits without running the
    parent's exit handlers (no MPI call: it is not part of the job). Where ``os.fork`` does not exist the
    estimate runs in this process.

    Raises:
        PlanError: the estimate failed, the child died, or it gave no answer within ``timeout`` seconds.
    """
    import json
    import select
    import time

    if not hasattr(os, "fork"):
        return train_estimate(config, engine, rank, size)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(rfd)
            try:
                out: dict[str, Any] = {"estimate": train_estimate(config, engine, rank, size)}
            except PlanError as exc:
                out = {"error": str(exc)}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which refuses
                out = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(wfd, "wb") as fh:
                fh.write(json.dumps(out).encode())
        except BaseException:  # noqa: BLE001 - the parent sees an empty answer and a non-zero exit
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                os.kill(pid, 9)
                raise PlanError(f"the estimate gave no answer in {timeout:.0f} s")
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
    try:
        out = json.loads(b"".join(chunks).decode())
    except ValueError:
        raise PlanError(f"the estimate's process ended without an answer (wait status {status})") from None
    if "error" in out:
        raise PlanError(out["error"])
    est = out["estimate"]
    return None if est is None else (int(est[0]), str(est[1]))
