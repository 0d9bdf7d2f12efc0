"""``apt`` engine: sampled mini-batch training with four parallel strategies for the input layer (APT).

Every rank samples blocks for its own seeds exactly as ``minibatch`` does in
``exact`` mode (:class:`~hpc_graph.graph.sampler.NeighborSampler`: the sample of
a node is keyed by (seed, epoch, layer, node), so every strategy trains on the
same samples). Blocks 1 and above are the rank's own (data parallel); block 0,
the input-most and largest, is laid out by ``engine.strategy``
(:mod:`hpc_graph.graph.strategies`):

* ``gdp`` (graph data parallel): the rank loads its block-0 sources' features
  (owned rows, then its cache of remote rows, then a fetch from the owners).
* ``nfp`` (node feature parallel, P3): each rank holds a slice of the feature
  columns of every node; block-0 structures are all-broadcast, each rank
  computes layer 1 on its slice for every rank's block and the partial rows
  are summed at the seed rank. GCN/SAGE only (a layer affine in its input).
* ``snp`` (source node parallel, GSplit): the owner of a source computes the
  partial aggregation of its sources for every destination (a *virtual node*
  of the seed rank) and sends it back, where partials are summed.
* ``dnp`` (destination node parallel, new in APT): each block-0 destination is
  sent to its owner, which samples it, loads its sources and computes its
  layer-1 row once for every rank that asked, and returns it.

``strategy: auto`` runs a dry run (sampling ``dry_run_batches`` batches once,
counting for every strategy the bytes of each communication operation, the
rows and edges each rank would compute, and how often each remote row is
read) and a short profile of the machine (:mod:`hpc_graph.plan`), predicts an
epoch of each strategy and takes the cheapest; a strategy that would not fit
in memory is ruled out. ``cache_mb`` > 0 fills a per-rank cache of the hottest
remote feature rows from the same dry run. The dry run samples the first epochs'
own batches; training takes their samples from it instead of drawing them again.

Per-epoch ``engine_stats``: ``strategy``, ``bytes_by_op`` (``sample``,
``structure``, ``load``, ``shuffle`` forward and ``shuffle_bwd``), cache hits
and rows fetched, the seconds spent building batches and the batches whose
samples came from the dry run (``batches_reused``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Iterator

import numpy as np
import torch

from hpc_graph.engines.base import Batch, SeedEngine
from hpc_graph.graph.block import Block, BlockStack
from hpc_graph.graph.dist_graph import load_sampled_engine_data
from hpc_graph.graph.halo_graph import HaloGraph
from hpc_graph.graph.sampler import (NeighborSampler, SamplerOptions, SeedSchedule, check_fanouts_for_model, block_csr,
                                     check_fanouts, relabel, sample_key)
from hpc_graph.graph.strategies import DNPReturn, NFPBlock, NFPReduce, SNPContext
from hpc_graph.ops.csr import column_slice_csr
from hpc_graph.options import OPT_PATH, choice_spec, float_spec, int_spec, option
from hpc_graph.engines.apt.dry_run import TIMED_IN_TRAINING
from hpc_graph.store.feature_store import FeatureStore

log = logging.getLogger(__name__)

STRATEGIES = ("gdp", "nfp", "snp", "dnp")
PLAN_TIMINGS = ("training", "dry_run")  # engine.plan_timing
TUNE_ROUNDS = 2  # rounds of timed batches, a gap apart (the machine's speed drifts over seconds): averaged
TUNE_PAIR = 2  # batches of each strategy in a row within a round: the faster counts
SETTLE = 16  # at most this many untimed iterations before the timing starts (and between its rounds)
LEADER = "*"  # in the timing order: the fastest strategy timed so far (training's gap between the rounds)
AFFINE_MODELS = ("gcn", "sage")  # layer 1 affine in its input: NFP's partial sums are exact


@dataclasses.dataclass
class APTOptions(SamplerOptions):
    """``apt``'s options: sampling (section ``sampler``), the strategy and the hot-row cache, the dry run and
    the machine profile of its cost model. ``model``, ``hidden``, ``heads``, ``dropout`` and ``model_flags``
    describe the model to the cost model and to NFP's check; the trainer takes them from ``model``
    (:meth:`APTEngine.options_from_config`)."""
    strategy: str = option("auto", choice_spec("auto", *STRATEGIES),
                           "How the input layer is parallelised. `gdp`: each rank loads its batch's "
                           "input features (cache, owned, fetched); `nfp`: features split by columns, every rank "
                           "projects its slice for every batch (gcn/sage only); `snp`: the owner of a source "
                           "computes its partial aggregation; `dnp`: the owner of a destination computes its "
                           "row. `auto`: a dry run and the cost model pick the fastest that fits (the table of "
                           "predictions is logged).", section="engine")
    cache_mb: float = option(0.0, float_spec(0.0),
                             "MiB per rank of remote input-feature rows cached, the hottest in the dry "
                             "run for the chosen strategy. 0: no cache.", section="engine")
    dry_run_batches: int = option(20, int_spec(1),
                                  "Batches the dry run samples (with `strategy: auto` or a cache): the first "
                                  "iterations of the first 8 epochs, whose samples training then takes from the dry "
                                  "run instead of sampling them again.", section="engine")
    plan_timing: str = option("training", choice_spec(*PLAN_TIMINGS),
                              "With `strategy: auto`: what times each strategy's batch building and "
                              "training step. `training`: training's first iterations (a warm-up, then two rounds "
                              "of two timed batches of GDP, SNP and DNP each, an eighth of an epoch of the "
                              "fastest between the rounds, each a real training step; NFP on zero column slices "
                              "after the first round, then trained and timed for real if it leads, else timed so "
                              "again after the second), then the cheapest is chosen and logged; "
                              "`dry_run`: all four are timed on the engine's copy of the model before training "
                              "starts (about eight iterations' work more; what `hpc-graph plan` does).",
                              section="engine")
    profile_mb: float = option(64.0, float_spec(0.0, lo_open=True),
                               "Largest message (MiB) of the machine profile the cost model fits "
                               "(alltoallv, exchange, all-reduce from 1 KiB up).", section="engine")
    profile_file: object = option(None, OPT_PATH,
                                  "A JSON file that keeps the machine profile between jobs: read when it was "
                                  "measured for the same launch (ranks, dtype, sizes), else measured and written "
                                  "there. `null`: measured in every job.", section="engine")
    memory_mb: float = option(0.0, float_spec(0.0),
                              "Memory per rank the cost model checks each strategy against (MiB); 0: this "
                              "host's memory divided among its ranks.", section="engine")
    model: str = dataclasses.field(default="sage", metadata={"help": "the model's name (model.name)"})
    hidden: int = dataclasses.field(default=64, metadata={"help": "layer 1's output width d'"})
    heads: int = dataclasses.field(default=1, metadata={"help": "layer 1's attention heads (gat)"})
    dropout: float = dataclasses.field(default=0.0, metadata={"help": "the model's dropout"})
    model_flags: tuple = dataclasses.field(default=(), metadata={"help": "residual, batchnorm where set"})


def _rounds_mean(seconds: list[float]) -> float:
    """The fastest of each round's :data:`TUNE_PAIR` timed batches, averaged over the rounds (a batch is only
    ever slowed by something else, e.g. the kernel compacting memory; the machine's speed drifts between
    rounds)."""
    fastest = [min(seconds[i:i + TUNE_PAIR]) for i in range(0, len(seconds), TUNE_PAIR)]
    return sum(fastest) / len(fastest)


class APTEngine(SeedEngine):
    """APT's four strategies on one model definition (module docstring). ``source``: a partition
    directory, or a dataset file on one process.

    Options: ``fanouts`` (seed hop first, >= 2 layers), ``batch_size``, ``strategy``
    (``auto|gdp|nfp|snp|dnp``), ``cache_mb`` (remote feature rows cached per rank, MiB),
    ``dry_run_batches``, ``model`` (the model's name: ``nfp`` needs gcn/sage, the cost model counts
    attention traffic for gat), ``hidden`` (layer-1 output width d' the cost model uses),
    ``dropout`` (the model's, for the cost model's timed step), ``memory_mb`` (per-rank memory the cost
    model checks; 0: this machine's memory / ranks per host),
    ``profile_mb`` (largest message of the machine profile, MiB), ``profile_file`` (a JSON file keeping the
    profile between jobs of the same launch),
    ``feature_norm``, ``seed``.
    """

    name = "apt"
    summary = ("sampled mini-batches with APT's four parallel strategies for the input layer (`engine.strategy`, "
               "docs/apt.md).")
    shared_rng = True
    data_source = "partition_or_file"
    Options = APTOptions
    malloc_mmap_threshold = 0  # per-batch tensors of changing sizes: reuse the heap's pages

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        if not model.layer_stack:
            from hpc_graph.nn.models import models_with

            return f"engine 'apt' runs the layer stacks ({', '.join(models_with('layer_stack'))}), not {mc.name!r}"
        return None

    @classmethod
    def check_config(cls, config: Any, model: Any) -> None:
        from hpc_graph.options import ConfigError

        mc, strategy = config.model, config.engine.strategy
        if mc.num_layers < 2:
            raise ConfigError("model.num_layers: engine 'apt' parallelises the input layer and returns its rows to "
                              "the next one: it needs at least 2 layers")
        if mc.batchnorm and strategy in ("nfp", "dnp"):
            raise ConfigError(f"model.batchnorm: engine 'apt' with strategy {strategy!r} computes "
                              "layer 1's rows away from the seed's rank; batch statistics need strategy gdp or snp")
        if strategy == "nfp" and (not model.affine_input or mc.residual):
            raise ConfigError(f"engine.strategy: nfp splits the input features by columns, so layer 1 must be affine "
                              f"in its input: model gcn or sage without residual (got {mc.name!r}"
                              f"{', residual' if mc.residual else ''}); use gdp, snp or dnp")
        check_fanouts_for_model(config.sampler.fanouts, model, mc)

    @classmethod
    def dry_run_report(cls, config: Any, comm: Any) -> dict[str, Any]:
        """What ``hpc-graph plan`` shows for apt (collective): every rank loads its part and the engine runs its
        dry run and cost model with ``strategy: auto``, every strategy timed here (nothing trains after it): the
        table of predicted epochs per strategy and the choice."""
        dtype = {"float32": torch.float32, "float64": torch.float64}[config.train.dtype]
        logging.getLogger("hpc_graph.engines.apt.dry_run").setLevel(logging.WARNING)  # the table is the report
        options = {**cls.options_from_config(config), "strategy": "auto", "plan_timing": "dry_run"}
        engine = cls(config.data.path, comm, torch.device("cpu"), dtype, options)
        plan = engine.plan
        return {"table": plan.table(),
                "summary": f"choice: {plan.choice} (predicted epoch {plan.predicted(plan.choice):.3f} s on "
                           f"{comm.size} rank(s))",
                "json": {"ranks": int(comm.size), "choice": plan.choice, "iterations": plan.iterations,
                         "dry_run_seconds": plan.dry_seconds, "profile": plan.profile.as_dict(),
                         "strategies": {s: {"epoch_seconds": c.total, "seconds": c.seconds, "bytes": c.bytes,
                                            "memory_mb": c.memory_mb, "fits": c.fits, "reason": c.reason}
                                        for s, c in plan.costs.items()}}}

    @classmethod
    def options_from_config(cls, config: Any) -> dict[str, Any]:
        """The config's options, and what the cost model (and NFP's check) must know of the model."""
        mc = config.model
        gat = mc.name == "gat"
        return {**super().options_from_config(config), "model": mc.name, "heads": mc.heads if gat else 1,
                "hidden": mc.hidden * (mc.heads if gat else 1), "dropout": mc.dropout,
                "model_flags": tuple(f for f in ("residual", "batchnorm") if getattr(mc, f))}

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        o = self.opts
        self.fanouts = check_fanouts(o.fanouts, "apt", min_layers=2)
        self.batch_size = int(o.batch_size)
        strategy = o.strategy
        self.cache_mb = float(o.cache_mb)
        self.dry_run_batches = int(o.dry_run_batches)
        self.model_name = str(o.model)
        self.hidden = int(o.hidden)
        self.memory_mb = float(o.memory_mb or 0)
        self.profile_bytes = max(int(float(o.profile_mb) * (1 << 20)), 1 << 10)
        self.model_flags = tuple(o.model_flags)
        self.plan_timing = str(o.plan_timing)
        self.ruled_out = self._rule_out()
        if strategy in self.ruled_out:
            raise ValueError(f"engine.strategy: {strategy} {self.ruled_out[strategy]}")
        self.seed = int(self.options["seed"])
        if device.type != "cpu" and strategy not in ("gdp", "auto"):
            raise ValueError(f"engine.strategy: {strategy} shuffles layer 1's rows between ranks on the host; "
                             f"with train.device {device.type} use gdp (or auto, which then picks gdp)")
        # sampling, the feature store and the batches on the host; evaluation on the model's device
        dg, data, edg, edata = load_sampled_engine_data(self.source, comm, self.device, dtype, self.name,
                                                        self.options["feature_norm"])
        self.dg = dg
        self.graph = HaloGraph(edg, comm)  # evaluation: exact, full neighbourhoods
        self.feat, self.label, self.masks = edata["feat"], edata["label"], edata["masks"]
        self.host_feat, self.host_label, host_masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self.first, self.num_owned = dg.first_gid, dg.num_owned
        self.rank, self.size = int(comm.rank), int(comm.size)
        self.sampler = NeighborSampler(dg, comm)
        self.owned_degree = dg.in_degree.to(torch.int64)
        self.store = FeatureStore(self.host_feat, self.owned_degree, dg.node_ranges, comm)
        self.train_idx = (host_masks["train"] & (self.host_label >= 0)).nonzero().squeeze(1)
        self.schedule = SeedSchedule(self.train_idx, self.batch_size, self.seed, comm)
        self.counter: dict[str, int] = {}
        self._nfp: dict[str, Any] | None = None
        self.plan: Any = None
        self._epoch = None
        self.build_seconds = 0.0
        self._iterations_done = 0
        self.built_strategies: set[str] = set()  # strategies that built a batch in this process (kernels loaded)
        self.first_epoch = 1  # the trainer's first epoch: the dry run samples the first epochs' batches
        self._presampled: dict[tuple[int, int], tuple] = {}  # the dry run's batches, taken by batch()
        self._reused = 0
        self.strategy = ""
        self._tune: dict[str, Any] | None = None  # training's first iterations timing the strategies (auto)
        self._tuning_iterations = 0
        self.layout_seconds = 0.0  # spent making NFP's column layout (the real one)
        self.fill_seconds = 0.0  # spent filling the feature cache (any run with a cache pays it once)
        if strategy == "auto" or self.cache_mb > 0:
            online = strategy == "auto" and self.plan_timing == "training" and device.type == "cpu"
            self.run_dry_run(strategy, "training" if online else "dry_run" if strategy == "auto" else "none")
            if strategy == "auto" and not online:
                strategy = self.plan.choice if device.type == "cpu" else "gdp"
                if strategy != self.plan.choice:
                    log.info("apt: auto on %s runs gdp (the cost model chose %s; nfp, snp and dnp shuffle on the "
                             "host)", device.type, self.plan.choice)
        if self._tune is None:
            self.use_strategy(strategy)
        else:
            self.reset_stats()

    def use_strategy(self, strategy: str, reset: bool = True) -> None:
        """Switch to ``strategy`` (collective): refill the cache with its hottest rows from the dry run, lay the
        features out by columns for ``nfp``, zero the counters (unless ``reset`` is False). Benchmarks compare
        strategies this way. Training's timing of the strategies (``auto``), if still going on, stops."""
        self._tune = None
        if strategy not in STRATEGIES:
            raise ValueError(f"engine.strategy: must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if strategy in self.ruled_out:
            raise ValueError(f"engine.strategy: {strategy} {self.ruled_out[strategy]}")
        self.strategy = strategy
        if self.cache_mb > 0:
            self._fill_cache(self.plan.hot_rows(strategy, self.cache_rows()))
        self.prepare(strategy)
        if strategy != "nfp":
            self._nfp = None  # every node's column slice: not kept for the other strategies
        if reset:
            self.reset_stats()

    def prepare(self, strategy: str, timing: bool = False) -> None:
        """Make ``strategy``'s one-time layout if it is missing (NFP: every node's slice of this rank's feature
        columns; collective for ``nfp``); nothing else changes. ``timing``: a layout only to time batches on
        (the dry run): NFP's slices of the right shape, zero, without exchanging the features (a gather and a
        product take as long whatever the values); a later ``prepare`` without ``timing`` makes the real one."""
        if strategy == "nfp" and (self._nfp is None or (self._nfp["timing"] and not timing)):
            self._setup_nfp(timing)

    def run_dry_run(self, requested: str = "auto", timing: str = "dry_run") -> Any:
        """Run the dry run and cost model (collective; :mod:`hpc_graph.engines.apt.dry_run`), keep and return the
        :class:`~hpc_graph.engines.apt.dry_run.Plan`. The engine's counters are left as they were.

        ``timing="training"``: GDP, SNP and DNP are timed by the next iterations training runs (:attr:`tuning`
        until then): each of them builds a warm-up batch if it has not built one in this process, then
        :data:`TUNE_ROUNDS` rounds of :data:`TUNE_PAIR` timed batches each, in turn, each a real training
        iteration (build, then whatever the caller does until its next :meth:`batch` or :meth:`end_epoch`:
        forward, backward, gradient all-reduce, optimiser step); between the rounds, an eighth of an epoch (at
        most :data:`SETTLE` iterations) of the fastest so far, untimed, so that the rounds see the machine at
        different seconds. A strategy's time: the faster batch of each round, averaged over the rounds. NFP,
        which cannot train on the zero column slices it is timed on, is timed on the engine's copy of the model
        after the first round (:meth:`_time_nfp`; its warm-up the first time: lost work); if it leads then, it
        trains for real from the gap on, timed like the others (:meth:`_lead_with_nfp`), else it is timed so
        again after the last round (the faster counts). The next batch after the last finalizes the plan and
        switches to its choice (with its cache).
        The feature cache stays empty meanwhile, as the cost model times builds without it."""
        from hpc_graph.engines.apt.dry_run import dry_run

        self._tune = None
        order, ends = self._tune_order() if timing == "training" else ([], [])
        # (NFP leading the first round times TUNE_PAIR iterations more: _lead_with_nfp)
        self.plan = dry_run(self, requested, timing=timing, tune_iterations=len(order) + (TUNE_PAIR if order else 0))
        self._presampled, self.plan.samples = self.plan.samples, {}
        if timing == "training":
            if self.cache_mb > 0:  # builds are timed without the cache (the cost model adds it; collective)
                self.store.cache(torch.zeros(0, dtype=torch.int64))
            # NFP, if it may run here (its layout fits), is timed between the rounds (its zero layout made now)
            nfp = "nfp" not in self.ruled_out and self.plan.costs["nfp"].fits
            self._tune = {"order": order, "pos": 0, "pending": None, "build": {}, "iteration": {}, "nfp": nfp,
                          "nfp_at": set(ends), "nfp_built": [], "nfp_steps": [], "leader": None}
            if nfp:
                self.prepare("nfp", timing=True)
            self.strategy = order[0][0]
        return self.plan

    @property
    def tuning(self) -> bool:
        """Whether training's next iterations still time the strategies (``auto``; :meth:`run_dry_run`)."""
        return self._tune is not None

    def _tune_order(self) -> tuple[list[tuple[str, bool]], list[int]]:
        """``(strategy, timed)`` of each iteration that times the strategies (a warm-up for those not built in
        this process yet, then :data:`TUNE_ROUNDS` rounds of :data:`TUNE_PAIR` batches of each, in turn, the
        rounds a gap of :data:`LEADER` iterations apart), and the positions that end a round."""
        names = [s for s in TIMED_IN_TRAINING if s not in self.ruled_out]
        # in a fresh process the first iterations are the slowest (every strategy's, by up to 2x): GDP trains
        # them untimed first, an eighth of an epoch (at most SETTLE)
        eighth = min(self.schedule.iterations() // 8, SETTLE)
        order = [(names[0], False)] * (0 if self.built_strategies else eighth)
        order += [(s, False) for s in names if s not in self.built_strategies]
        ends = []
        for k in range(TUNE_ROUNDS):
            # a machine shared with others runs +-15 % faster or slower from one second to the next: the rounds
            # are an eighth of an epoch apart (training meanwhile runs the fastest strategy timed so far)
            order += [(LEADER, False)] * (eighth if k else 0)
            order += [(s, True) for s in names for _ in range(TUNE_PAIR)]
            ends.append(len(order))
        return order, ends

    def _leader(self) -> str:
        """The strategy with the fastest timed iteration so far (the slowest rank's; collective, once). NFP,
        timed on lost work after the first round, competes with its iteration as training would run it (its
        build, step and Adam, and the gradient all-reduce the profile predicts); if it leads and the gap holds
        a timed pair, NFP takes over: :meth:`_lead_with_nfp`."""
        t = self._tune
        if t["leader"] is None:
            names = list(t["iteration"])
            vals = [min(t["iteration"][s]) for s in names]
            gap = sum(1 for s, _ in t["order"][t["pos"]:] if s == LEADER)
            if t["nfp_built"] and t["nfp_steps"] and gap >= TUNE_PAIR:
                c = self.plan.costs["nfp"]
                allreduce = self.plan.profile.comm_time("allreduce", 1.0, c.bytes["allreduce"]
                                                        / max(c.calls["allreduce"], 1.0))
                names.append("nfp")
                vals.append(min(t["nfp_built"]) / max(self.schedule.iterations(), 1) + sum(min(t["nfp_steps"]))
                            + allreduce)
            v = torch.tensor(vals, dtype=torch.float64)
            if self.size > 1:
                self.comm.allreduce_(v, "max")
            t["leader"] = names[int(torch.argmin(v))]
            if t["leader"] == "nfp":
                self._lead_with_nfp()
        return t["leader"]

    def _lead_with_nfp(self) -> None:
        """NFP led the first round (collective): its real column layout is made now and it trains for real from
        here on: the gap's first :data:`TUNE_PAIR` iterations and as many after the last round are its timed
        rounds (real iterations, measured as the others are), and no lost work times it any more."""
        t = self._tune
        pos, order = t["pos"], t["order"]
        gap = [i for i in range(pos, len(order)) if order[i][0] == LEADER]
        for j, i in enumerate(gap):
            order[i] = ("nfp", j < TUNE_PAIR)
        order += [("nfp", True)] * TUNE_PAIR
        t["nfp_at"] = set()
        self.prepare("nfp")

    def _tune_record(self) -> None:
        """The step that followed the last timed batch ended now: keep its build and iteration seconds."""
        t = self._tune
        if t is None or t["pending"] is None:
            return
        s, timed, build, t_ret = t["pending"]
        t["pending"] = None
        if timed:
            t["build"].setdefault(s, []).append(build)
            t["iteration"].setdefault(s, []).append(build + time.perf_counter() - t_ret)

    def _tune_next(self) -> str | None:
        """The strategy the next timing batch builds, or None once all are timed: then the plan is finalized
        and its choice taken (collective)."""
        t = self._tune
        self._tune_record()
        order, pos = t["order"], t["pos"]
        if t["nfp"] and pos in t["nfp_at"]:
            self._time_nfp()  # after each timed round (the first time with NFP's own warm-up)
        if pos < len(order):
            s = order[pos][0]
            if s == LEADER:
                s = self._leader()
            t["pos"] += 1
            self.strategy = s
            return s
        self._finish_tuning()
        return None

    def _finish_tuning(self) -> None:
        """Finalize the plan from the strategies timed so far and switch to its choice (collective). After the
        last timing batch; or earlier, when a checkpoint is written meanwhile: the run then goes on with the
        choice the checkpoint records, so that a run resumed from it continues exactly as this one."""
        t = self._tune
        self._tune_record()
        # every rank's batches of each strategy: the faster of each round, averaged over the rounds (its build
        # and its whole iteration); the slowest rank's
        names = list(t["build"])  # (NFP's too, where it led: trained for real)
        if not names:  # nothing timed yet: the strategy in use stays
            self._tune = None
            self.use_strategy(self.strategy, reset=False)
            return
        v = torch.tensor([_rounds_mean(t["build"][s]) for s in names]
                         + [_rounds_mean(t["iteration"][s]) for s in names], dtype=torch.float64)
        if self.size > 1:
            self.comm.allreduce_(v, "max")
        iters, n = self.schedule.iterations(), len(names)
        built = {s: float(v[i]) * iters for i, s in enumerate(names)}
        steps = {s: (max(float(v[n + i] - v[i]), 0.0), 0.0) for i, s in enumerate(names)}
        self._tune = None
        if t["nfp_built"] and "nfp" not in built:  # NFP's fastest lost-work batch and step (the slowest rank's)
            built["nfp"] = min(t["nfp_built"])
            if t["nfp_steps"]:
                steps["nfp"] = min(t["nfp_steps"])
        self.plan.finalize(built, steps, trained=names)
        self.use_strategy(self.plan.choice, reset=False)
        if self.rank == 0:
            log.info("apt: %d training iterations timed %s%s; training goes on with %s", t["pos"],
                     ", ".join(names), " (and nfp between them)" if t["nfp"] and "nfp" not in names else "",
                     self.strategy)

    def _time_nfp(self) -> None:
        """One NFP batch and step timed between the rounds of training's timing iterations (collective): on zero
        column slices and the engine's copy of the model (lost work: a training step cannot use zero features),
        so that NFP is timed in a process as warm, and between the same other work, as the others are."""
        from hpc_graph.engines.apt.dry_run import time_builds

        t = self._tune
        self._tune = None  # the batches built within are the timing's own
        try:
            built, steps = time_builds(self, ["nfp"], self.schedule.iterations(), int(self.first_epoch), batches=1)
        finally:
            self._tune = t
        t["nfp_built"].append(built["nfp"])
        if "nfp" in steps:
            t["nfp_steps"].append(steps["nfp"])

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        self._tune_record()  # the epoch's last step, if it was timing a strategy

    def discard_samples(self) -> None:
        """Forget the dry run's sampled batches: the first epochs then sample every batch again (benchmarks
        timing steady-state iterations). Collective in effect: every rank must call it."""
        self._presampled = {}

    def _rule_out(self) -> dict[str, str]:
        """Strategies this model cannot run exactly, with the reason."""
        out = {}
        if self.model_name not in AFFINE_MODELS or "residual" in self.model_flags or "batchnorm" in self.model_flags:
            out["nfp"] = ("splits the input features by columns, so layer 1 must be affine in its input (gcn or "
                          f"sage without residual or batchnorm), not {self.model_name}"
                          + "".join(f" with {f}" for f in self.model_flags) + ": use gdp, snp or dnp")
        if "batchnorm" in self.model_flags:
            out["dnp"] = ("computes layer 1's rows at their owners, once for every rank that asks: batch "
                          "statistics (model.batchnorm) need gdp or snp")
        return out

    # -- set-up -------------------------------------------------------------------------------------
    def cache_rows(self) -> int:
        """How many remote feature rows ``cache_mb`` holds (a row: its features and its int64 id)."""
        row = self.num_features * self.host_feat.element_size() + 8
        return int(self.cache_mb * (1 << 20) // row)

    def _fill_cache(self, gids: np.ndarray) -> None:
        """Cache the rows of ``gids`` (remote nodes, hottest first; collective)."""
        t0 = time.perf_counter()
        self.store.cache(torch.from_numpy(np.asarray(gids, dtype=np.int64)))
        self.fill_seconds += time.perf_counter() - t0
        log.info("apt: rank %d caches %d remote feature rows (%.1f MiB)", self.rank, self.store.cache_gid.size,
                 self.store.cache_gid.size * (self.num_features * self.host_feat.element_size() + 8) / 2**20)

    def column_bounds(self) -> np.ndarray:
        """int64[P+1]: rank r holds feature columns ``bounds[r]:bounds[r+1]`` under NFP."""
        return np.linspace(0, self.num_features, self.size + 1).round().astype(np.int64)

    def _setup_nfp(self, timing: bool = False) -> None:
        """Redistribute the features by columns (every node's slice of this rank's columns) and gather every
        node's in-degree (collective). ``timing``: zero slices instead of the features (see :meth:`prepare`)."""
        self._nfp = None  # a layout made for timing is not held alongside the real one
        t0 = time.perf_counter()
        bounds = self.column_bounds()
        ranges = np.asarray(self.dg.node_ranges, dtype=np.int64)
        width = int(bounds[self.rank + 1] - bounds[self.rank])
        if timing:
            cols = torch.zeros(int(ranges[-1]), width, dtype=self.host_feat.dtype)
        else:
            parts = [self.host_feat[:, bounds[q]:bounds[q + 1]].contiguous().reshape(-1) for q in range(self.size)]
            got, _ = self.comm.alltoallv(torch.cat(parts), np.array([p.numel() for p in parts], dtype=np.int64))
            cols = got.view(int(ranges[-1]), width)
        deg, _ = self.comm.alltoallv(self.owned_degree.repeat(self.size), np.full(self.size, self.num_owned))
        self._nfp = {"bounds": bounds, "cols": cols, "degree": deg, "lo": int(bounds[self.rank]), "width": width,
                     "timing": timing}
        if not timing:
            self.layout_seconds += time.perf_counter() - t0

    @contextlib.contextmanager
    def scratch(self, cache: bool = True) -> Iterator[None]:
        """Within: batches of any strategy and epoch may be built without leaving a trace (the dry run).
        On the way out the strategy, counters, build time, iteration count, NFP layout and feature cache
        are as before, the current epoch is forgotten and the store's statistics are zeroed. With
        ``cache=False`` the cache is empty within (builds timed without it)."""
        st = self.store
        saved = (self.strategy, dict(self.counter), self.build_seconds, self._iterations_done,
                 self._nfp, st.cache_gid, st.cache_feat, st.cache_degree, self._presampled, self._reused)
        self._presampled = {}  # batches built within sample for themselves
        if not cache:
            st.cache_gid = np.zeros(0, np.int64)
        try:
            yield
        finally:
            (self.strategy, self.counter, self.build_seconds, self._iterations_done, self._nfp,
             st.cache_gid, st.cache_feat, st.cache_degree, self._presampled, self._reused) = saved
            self._epoch = None
            st.reset_stats()

    # -- statistics ---------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        super().reset_stats()
        if hasattr(self, "store"):
            self.counter = {}
            self.store.reset_stats()
            self.build_seconds = 0.0
            self._iterations_done = 0
            self._reused = 0
            self._tuning_iterations = 0

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().stats())
        st = self.store.stats()
        out["strategy"] = self.strategy
        out["bytes_by_op"] = {k: int(self.counter.get(k, 0))
                              for k in ("sample", "structure", "load", "shuffle", "shuffle_bwd")}
        remote = st["cached"] + st["fetched"]
        out["cache_hit_rate"] = st["cached"] / remote if remote and self.store.cache_gid.size else None
        out["rows_fetched"] = st["fetched"]
        out["rows_cached"] = int(self.store.cache_gid.size)
        out["build_seconds"] = self.build_seconds
        out["iterations"] = self._iterations_done
        out["batches_reused"] = self._reused  # sampled by the dry run, not again
        out["tuning_iterations"] = self._tuning_iterations  # iterations that ran a strategy to time it
        if self.plan is not None:
            out["predicted_epoch_seconds"] = self.plan.predicted(self.strategy)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The strategy in use, which a resumed run keeps instead of planning again (collective). Strategies
        still being timed by training are decided now from the timings so far (:meth:`_finish_tuning`): the
        timings of a resumed run would differ, so only a decision recorded here lets it continue exactly."""
        if self._tune is not None:
            self._finish_tuning()
        return {"strategy": self.strategy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        strategy = state.get("strategy")
        if strategy and (strategy != self.strategy or self._tune is not None):  # no timing again either
            log.info("apt: resuming with strategy %s (the checkpoint's)", strategy)
            self.use_strategy(strategy)

    # -- epochs and iterations ----------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        if self._presampled:  # the dry run's batches of epochs already past are not needed any more
            self._presampled = {k: v for k, v in self._presampled.items() if k[0] >= epoch}

    def batch(self, epoch: int, iteration: int) -> Batch:
        """Sample and lay out iteration ``iteration`` of ``epoch`` (collective)."""
        seeds = self.seeds(epoch, iteration)
        tuned = self._tune_next() if self._tune is not None else None  # a batch that times a strategy
        t0 = time.perf_counter()
        pre = self._presampled.pop((int(epoch), int(iteration)), None)  # sampled by the dry run (same samples)
        if tuned is not None:
            pre = None  # timed as training samples
        if pre is None:
            upper, dst = self.sample_upper(seeds + self.first, epoch)
            hop0 = None
        else:
            upper, dst, hop0 = pre
            self._reused += 1
        block0, feat, hook, dst_deg = getattr(self, "_build_" + self.strategy)(dst, epoch, hop0)
        blocks = [block0] + self.upper_blocks(upper, dst_deg, hook)
        build = time.perf_counter() - t0
        self.build_seconds += build
        self.built_strategies.add(self.strategy)
        self._iterations_done += 1
        out = Batch(BlockStack(blocks), feat, self.host_label[seeds], seeds)
        if tuned is not None:
            self._tuning_iterations += 1
            timed = self._tune["order"][self._tune["pos"] - 1][1]
            self._tune["pending"] = (tuned, timed, build, time.perf_counter())
        return out

    # -- sampling (shared by every strategy and the dry run) ----------------------------------------
    def _count(self, op: str, nbytes: int) -> None:
        self.counter[op] = self.counter.get(op, 0) + int(nbytes)

    def hop(self, dst: np.ndarray, layer: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample ``layer``'s in-neighbours of ``dst`` (global ids) for ``epoch``: the sampler's
        ``(counts, neighbours, degrees)``; its bytes are counted under ``sample`` (collective)."""
        b0 = self.sampler.bytes_sent
        fanout = self.fanouts[len(self.fanouts) - 1 - layer]
        out = self.sampler.hop(dst, fanout, sample_key(self.seed, epoch, layer))
        self._count("sample", self.sampler.bytes_sent - b0)
        return out

    def sample_upper(self, seed_gid: torch.Tensor, epoch: int) -> tuple[list[tuple], np.ndarray]:
        """Hops of layers L-1 .. 1 from the seeds: ``[(layer, dst, dst_deg, counts, col, src)]`` (seed hop
        first) and the block-0 destinations (block 1's sources)."""
        dst = seed_gid.numpy().astype(np.int64)
        hops = []
        for layer in range(len(self.fanouts) - 1, 0, -1):
            counts, nbrs, deg = self.hop(dst, layer, epoch)
            src, col = relabel(dst, nbrs)
            hops.append((layer, dst, deg, counts, col, src))
            dst = src
        return hops, dst

    def upper_blocks(self, hops: list[tuple], dst_deg0: np.ndarray, hook: Any) -> list[Block]:
        """Blocks 1 .. L-1 (input layer first); block 1 completes its input with ``hook``."""
        blocks = []
        src_deg = dst_deg0
        for i, (layer, dst, deg, counts, col, src) in enumerate(reversed(hops)):
            csr = block_csr(counts, col, src.size)
            src_t = torch.from_numpy(src)
            blocks.append(Block(csr, src_t, src_t, torch.from_numpy(np.asarray(src_deg)),  # keys: see _build_gdp
                                self.comm, hook if i == 0 else None))
            src_deg = deg
        return blocks

    def _load(self, gids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and degrees of ``gids``: owned, cached, fetched (collective)."""
        b0 = self.store.stats()["bytes_sent"]
        feat, deg = self.store.fetch(torch.from_numpy(gids))
        self._count("load", self.store.stats()["bytes_sent"] - b0)
        return feat, deg

    # -- the four strategies: block 0, its input rows, block 1's hook, block 1's source degrees -----
    def _build_gdp(self, dst: np.ndarray, epoch: int, hop0: tuple | None = None):
        counts, nbrs, deg = hop0 if hop0 is not None else self.hop(dst, 0, epoch)
        src, col = relabel(dst, nbrs)
        feat, src_deg = self._load(src)
        src_t = torch.from_numpy(src)
        # the dropout hashes key a node on its global id, which every rank knows (a dataset id only where the
        # node is owned or in the halo): every strategy, whichever rank computes a row, draws it alike
        block = Block(block_csr(counts, col, src.size), src_t, src_t, src_deg, self.comm)
        return block, feat, None, deg

    def _broadcast(self, payload: np.ndarray) -> list[np.ndarray]:
        """Every rank's ``payload`` (int64), in rank order (an all-broadcast through one alltoallv)."""
        P, r = self.size, self.rank
        counts = np.full(P, payload.size, dtype=np.int64)
        counts[r] = 0
        b0 = self.comm.bytes_sent
        got, got_counts = self.comm.alltoallv(torch.from_numpy(np.tile(payload, P - 1)), counts)
        self._count("structure", self.comm.bytes_sent - b0)
        out, pos = [], 0
        g = got.numpy()
        for q in range(P):
            if q == r:
                out.append(payload)
            else:
                out.append(g[pos:pos + got_counts[q]])
                pos += int(got_counts[q])
        return out

    def _build_nfp(self, dst: np.ndarray, epoch: int, hop0: tuple | None = None):
        if self._nfp is None:  # (within the dry run, a layout made for timing is used as it is)
            self.prepare("nfp")
        nfp = self._nfp
        counts, nbrs, deg = hop0 if hop0 is not None else self.hop(dst, 0, epoch)
        src, col = relabel(dst, nbrs)
        mine = np.concatenate([[dst.size, src.size, col.size], src, counts, col]).astype(np.int64)
        blocks = []
        for buf in self._broadcast(mine):
            nd, ns, ne = (int(v) for v in buf[:3])
            s = buf[3:3 + ns]
            blocks.append((nd, s, buf[3 + ns:3 + ns + nd], buf[3 + ns + nd:3 + ns + nd + ne]))
        nds = np.array([b[0] for b in blocks], dtype=np.int64)
        extras = np.array([b[1].size - b[0] for b in blocks], dtype=np.int64)
        d_off = np.concatenate([[0], np.cumsum(nds)])
        phantom = int(d_off[-1])
        x_off = phantom + 1 + np.concatenate([[0], np.cumsum(extras)])
        u_src = np.concatenate([b[1][:b[0]] for b in blocks] + [np.array([-1])] + [b[1][b[0]:] for b in blocks])
        u_counts = np.concatenate([b[2] for b in blocks] + [np.zeros(1, np.int64)])
        u_col = np.concatenate([np.where(b[3] < b[0], d_off[q] + b[3], x_off[q] + b[3] - b[0])
                                for q, b in enumerate(blocks)]).astype(np.int64)
        rows = u_src.size
        gid = np.where(u_src < 0, 0, u_src)
        gid_t = torch.from_numpy(gid)
        values = nfp["cols"].index_select(0, gid_t)
        values[phantom] = 0
        x = column_slice_csr(values, nfp["lo"], self.num_features)
        degree = nfp["degree"].index_select(0, gid_t)
        degree[phantom] = 0
        src_t = torch.from_numpy(u_src.copy())
        block = NFPBlock(block_csr(u_counts, u_col, rows), src_t, src_t,
                         degree, self.comm)
        return block, x, NFPReduce(nds, self.comm, self.counter), deg

    def _build_snp(self, dst: np.ndarray, epoch: int, hop0: tuple | None = None):
        P, r = self.size, self.rank
        counts, nbrs, deg = hop0 if hop0 is not None else self.hop(dst, 0, epoch)
        n = dst.size
        rows = np.repeat(np.arange(n, dtype=np.int64), counts)
        own = self.sampler.owner(nbrs) if nbrs.size else np.zeros(0, np.int64)
        order = np.lexsort((rows, own))  # edges by owner of the source, then destination
        o_rows, o_nbrs, o_own = rows[order], nbrs[order], own[order]
        # virtual nodes: (owner q != r, destination i) pairs, grouped by q
        key = o_own * max(n, 1) + o_rows
        first = np.ones(key.size, dtype=bool)
        first[1:] = key[1:] != key[:-1]
        v_own, v_row = o_own[first], o_rows[first]
        v_cnt = np.diff(np.append(np.flatnonzero(first), key.size))
        remote_v = v_own != r
        remote_e = o_own != r
        v_counts_q = np.bincount(v_own[remote_v], minlength=P).astype(np.int64)
        e_counts_q = np.bincount(o_own[remote_e], minlength=P).astype(np.int64)
        b0 = self.comm.bytes_sent
        got_vc, got_vq = self.comm.alltoallv(torch.from_numpy(v_cnt[remote_v].astype(np.int64)), v_counts_q)
        got_u, _ = self.comm.alltoallv(torch.from_numpy(o_nbrs[remote_e]), e_counts_q)
        self._count("structure", self.comm.bytes_sent - b0)
        local_e = o_own == r
        loc_rows, loc_u = o_rows[local_e], o_nbrs[local_e]
        u = np.unique(np.concatenate([loc_u, got_u.numpy()]))
        loc_counts = np.bincount(loc_rows, minlength=n).astype(np.int64)
        loc_order = np.argsort(loc_rows, kind="stable")
        cols = n + np.searchsorted(u, np.concatenate([loc_u[loc_order], got_u.numpy()]))
        all_counts = np.concatenate([loc_counts, got_vc.numpy()])
        csr = block_csr(all_counts, cols, n + u.size)
        feat_d, deg_d = self._load(dst)
        lid = torch.from_numpy(u - self.first)
        x = torch.cat([feat_d, self.host_feat.index_select(0, lid)], 0)
        degree = torch.cat([deg_d, self.owned_degree.index_select(0, lid)])
        gids = torch.from_numpy(np.concatenate([dst, u]))
        ctx = SNPContext(csr, n, counts, degree, gids, got_vq, v_row[remote_v], v_counts_q, self.comm, self.counter)
        return ctx, x, None, deg

    def _build_dnp(self, dst: np.ndarray, epoch: int, hop0: tuple | None = None):
        P, r = self.size, self.rank
        own = self.sampler.owner(dst)
        mine = own == r
        own_pos = np.flatnonzero(mine)
        rpos = np.flatnonzero(~mine)
        rpos = rpos[np.argsort(own[rpos], kind="stable")]
        b0 = self.comm.bytes_sent
        asked, asked_counts = self.comm.alltoallv(torch.from_numpy(dst[rpos]),
                                                  np.bincount(own[rpos], minlength=P).astype(np.int64))
        asked = asked.numpy()
        nodes = np.concatenate([dst[own_pos], asked])
        uniq, inverse = np.unique(nodes, return_inverse=True)
        fanout = self.fanouts[-1]
        c, nb, dg = self.sampler.local(uniq, fanout, sample_key(self.seed, epoch, 0))
        got_deg, _ = self.comm.alltoallv(torch.from_numpy(dg[inverse[own_pos.size:]].astype(np.int64)), asked_counts)
        self._count("sample", self.comm.bytes_sent - b0)
        deg = np.empty(dst.size, np.int64)
        deg[own_pos] = dg[inverse[:own_pos.size]]
        deg[rpos] = got_deg.numpy()
        src, col = relabel(uniq, nb)
        feat, src_deg = self._load(src)
        src_t = torch.from_numpy(src)
        block = Block(block_csr(c, col, src.size), src_t, src_t, src_deg, self.comm)  # keys: see _build_gdp
        hook = DNPReturn(own_pos, inverse[:own_pos.size], inverse[own_pos.size:], asked_counts, rpos, dst.size,
                         self.comm, self.counter)
        return block, feat, hook, deg
