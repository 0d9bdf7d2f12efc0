"""The ``apt`` engine's dry run and cost model: which strategy to run, and what each would cost.

:func:`dry_run` samples ``dry_run_batches`` batches once, spread over the training's first :data:`FOLDS`
epochs (the samples of every strategy are the same), and counts for every strategy, on every rank:

* bytes and calls of each communication operation: ``sample`` (remote sampling; DNP's last hop only
  sends ids and returns degrees), ``structure`` (NFP's all-broadcast of block 0, SNP's virtual nodes),
  ``load`` (feature rows fetched from their owners: ``8`` bytes per id asked, ``F * itemsize + 8`` per
  row served; rows in the cache are not fetched, the cache's hit rate cross-validated across the
  dry-run epochs), ``shuffle`` / ``shuffle_bwd`` (hidden rows of layer 1 and their gradients: NFP
  ``d'`` per destination of every other rank; SNP ``d'`` per virtual node, or the input width and no
  gradient when GraphSAGE aggregates its raw inputs first; DNP ``d'`` per destination computed by its
  owner) and the gradient all-reduce;
* rows projected and edges aggregated in layer 1 (the upper layers are the same for every strategy),
  and how often each remote row is read (*hotness*, which fills the feature cache).

Unlike APT, the prediction includes compute and memory, and times what it can instead of modelling
it: ``epoch = build + load + shuffle + compute`` for the slowest rank, where ``build`` (sampling,
structure, blocks) is each strategy's batch building timed on a few batches (timed without a cache,
the loading of the input rows included: its modelled time is taken off; NFP timed on zero column
slices, so that the plan does not exchange the features by columns), ``load`` and ``shuffle`` are
``alpha * calls + bytes / beta`` with the :mod:`~hpc_graph.plan.profile` fits (``load`` with the
cache), and ``compute`` is a training step of the model timed on the strategy's own batches right after
building them, as training runs them (forward, loss, backward, Adam; :func:`time_builds`; its layer-1
shuffles included, shown apart as modelled), plus the gradient all-reduce. Where a strategy has no step
(ruled out, or a model the engine's options cannot build), layer 1's kernels timed at the dry run's own
batch shapes (:func:`~hpc_graph.plan.profile.time_layer`, forward and backward), scaled by the strategy's
rows and edges, replace GDP's in GDP's step (or, without that, add to the upper layers' kernels and Adam's
step). A strategy whose predicted peak memory exceeds the per-rank limit is ruled out, with the reason
shown.

Where the builds and steps are timed (``timing``): ``dry_run`` times all of them here, on the engine's copy of
the model (:func:`time_builds`); ``training`` (the engine's default with ``auto``) leaves them to the engine,
which times GDP, SNP and DNP on training's own first iterations (real training steps) and NFP between them,
and hands the times to :meth:`Plan.finalize`: until then the plan is provisional.

The sampled batches are real training batches (those epochs' first iterations): the engine keeps them (up to
:data:`KEEP_MB` per rank) and training takes their samples instead of drawing them again, so the dry run's
sampling is not lost work; :attr:`Plan.reused_seconds` is what that saves.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np
import torch

from hpc_graph.graph.sampler import block_csr, relabel
from hpc_graph.nn.optim import Adam
from hpc_graph.plan.profile import Profile, profile_machine, time_layer

log = logging.getLogger(__name__)

STRATEGIES = ("gdp", "nfp", "snp", "dnp")
TIMED_IN_TRAINING = ("gdp", "snp", "dnp")  # timing "training": these by training's iterations, NFP between them
FOLDS = 8  # dry-run epochs (folds of the cache cross-validation): the training's first FOLDS epochs
KEEP_MB = 256  # at most this much of the dry run's samples is kept for training to reuse (per rank)
OPS = ("sample", "structure", "load", "shuffle", "shuffle_bwd", "allreduce")


@dataclasses.dataclass
class StrategyCost:
    """One strategy's prediction on this rank (``bytes``/``calls`` per op and epoch, ``seconds`` per
    term) and the slowest rank's ``total`` and ``memory_mb``."""

    name: str
    bytes: dict[str, float]
    calls: dict[str, float]
    seconds: dict[str, float]
    memory_mb: float
    total: float = 0.0
    fits: bool = True
    reason: str = ""


@dataclasses.dataclass
class Plan:
    """The dry run's result: ``costs`` per strategy, the ``choice``, hotness, and what the plan cost."""

    costs: dict[str, StrategyCost]
    choice: str
    profile: Profile
    batches: int
    iterations: int
    dry_seconds: float
    hot: dict[str, tuple[np.ndarray, np.ndarray]]
    remote_nodes: np.ndarray
    limit_mb: float
    # the sampled batches kept for training, {(epoch, iteration): (upper hops, block-0 destinations, block-0
    # hop)}, and per strategy the slowest rank's seconds of the sampling that training will not repeat
    samples: dict[tuple[int, int], tuple] = dataclasses.field(default_factory=dict)
    reused_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    # how the builds and steps were timed: "dry_run" (all of them, before training), "training" (GDP, SNP and
    # DNP by training's first iterations, NFP between their rounds: :meth:`finalize`), "none" (modelled only)
    timing: str = "dry_run"
    tuned: bool = True  # False until :meth:`finalize` has the times of training's first iterations
    requested: str = "auto"
    _predict: Any = dataclasses.field(default=None, repr=False, compare=False)
    _rank: int = dataclasses.field(default=0, repr=False, compare=False)

    def finalize(self, built: dict[str, float], steps: dict[str, tuple[float, float]],
                 trained: Any = ("gdp", "snp", "dnp")) -> None:
        """Predict again with the times training measured (collective): ``built`` seconds per epoch of each
        strategy's batch building, ``steps`` seconds per iteration of its training step (forward, backward,
        gradient all-reduce, optimiser; ``(step, 0.0)``) for the strategies ``trained`` timed on real training
        iterations; any other strategy's step is ``(forward + backward, Adam)``, its all-reduce modelled. Those
        strategies' predictions replace the modelled ones; the choice is made again and, for ``auto``, the table
        logged."""
        if self._predict is None:
            raise RuntimeError("apt: this plan has nothing left to finalize")
        self.costs, self.choice = self._predict(built, steps, frozenset(trained))
        self._predict, self.tuned = None, True
        self._log()

    def _log(self) -> None:
        if self.requested == "auto" and self._rank == 0:
            log.info("apt: predicted epoch per strategy\n%s", self.table())
        if self.requested == "auto" and not any(c.fits for c in self.costs.values()):
            log.warning("apt: no strategy fits in %.0f MB per rank; running gdp", self.limit_mb)

    def predicted(self, strategy: str) -> float:
        return float(self.costs[strategy].total)

    def predicted_bytes(self, strategy: str) -> dict[str, float]:
        """Bytes this rank sends per epoch, by operation."""
        return dict(self.costs[strategy].bytes)

    def hot_rows(self, strategy: str, n: int) -> np.ndarray:
        """Up to ``n`` remote global ids to cache for ``strategy``: the rows it read most in the dry run, then
        (with room left) every other remote row."""
        gids, counts = self.hot.get(strategy, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        order = np.lexsort((gids, -counts))
        out = gids[order][:n]
        if out.size < n:
            rest = np.setdiff1d(self.remote_nodes, out, assume_unique=False)
            out = np.concatenate([out, rest[:n - out.size]])
        return out

    def table(self) -> str:
        """The predictions as a text table (one row per strategy), and the choice."""
        head = f"{'strategy':>8} {'build s':>9} {'load s':>9} {'shuffle s':>9} {'compute s':>9} {'epoch s':>9} " \
               f"{'memory MB':>10}  note"
        lines = [head]
        for s in STRATEGIES:
            c = self.costs[s]
            sec = c.seconds
            note = ("<- chosen" if s == self.choice else "") if c.fits else f"ruled out: {c.reason}"
            lines.append(f"{s:>8} {sec['build']:9.3f} {sec['load']:9.3f} {sec['shuffle']:9.3f} "
                         f"{sec['compute']:9.3f} {c.total:9.3f} {c.memory_mb:10.1f}  {note}")
        reuse = self.reused_seconds.get(self.choice, 0.0)
        lines.append(f"dry run: {self.batches} batches (an epoch has {self.iterations}), {self.dry_seconds:.2f} s "
                     f"(profile {self.profile.seconds:.2f} s; {reuse:.2f} s of sampling kept for training); "
                     f"memory limit {self.limit_mb:.0f} MB per rank")
        if self.timing == "training":
            lines.append("builds and steps timed by training's first iterations" if self.tuned else
                         "provisional: training's first iterations time the builds and steps (compute not counted "
                         "until then)")
        return "\n".join(lines)


def memory_limit_mb(comm: Any) -> float:
    """This host's physical memory divided among the ranks that share it (MB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return float("inf")
    return total / max(int(getattr(comm, "local_size", 1) or 1), 1) / 2**20


def _stepper(engine: Any) -> Any:
    """A training step of the engine's model, ``step(batch) -> seconds`` of its forward, loss and backward (the
    layer-1 shuffles and their waits for the other ranks included: collective), and the seconds of its Adam
    step; ``(None, 0.0)`` where the model cannot be built from what the engine knows of it (``model``,
    ``hidden``, ``heads``, ``model_flags``, ``dropout``, one layer per fan-out). The RNG is left as it was."""
    import torch.nn.functional as nnf

    from hpc_graph.nn import build_model

    heads = max(int(engine.options.get("heads", 1)), 1)
    gat = engine.model_name == "gat"
    flags = tuple(engine.model_flags)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            model = build_model(engine.model_name, engine.num_features,
                                max(engine.hidden // heads, 1) if gat else max(engine.hidden, 1), engine.num_classes,
                                num_layers=len(engine.fanouts), dropout=float(engine.options.get("dropout", 0.0)),
                                heads=heads, residual="residual" in flags, batchnorm="batchnorm" in flags)
        except (ValueError, TypeError, KeyError) as exc:  # a model the engine's options do not describe
            log.debug("apt: the cost model times kernels only (%s)", exc)
            return None, 0.0
    model = model.to(engine.dtype)
    opt = Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    t0 = time.perf_counter()
    opt.step()
    t_opt = time.perf_counter() - t0

    def step(batch: Any) -> float:
        with torch.random.fork_rng(devices=[]):
            model.zero_grad(set_to_none=True)
            n = max(int(batch.label.numel()), 1)
            t0 = time.perf_counter()
            nnf.cross_entropy(model(batch.graph, batch.feat), batch.label, reduction="sum").div(n).backward()
            return time.perf_counter() - t0

    return step, t_opt


def time_builds(engine: Any, strategies: list[str], iters: int, epoch: int,
                 batches: int = 2) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Seconds per epoch of each strategy's batch building (sampling, structure, input rows, blocks), without a
    cache, and of a training step of the model on each batch built, as training runs them: build, then step
    (collective). Every strategy builds the same ``batches`` batches (iterations ``0..batches-1`` of
    ``epoch``), in rounds (one batch of each strategy per round, so a slow moment does not fall on one
    strategy's every batch); a strategy's build time is its fastest batch (a batch is only ever slowed down:
    page-fault storms, the other ranks), and so is its step (``(forward + loss + backward, Adam)`` per
    strategy; ``{}`` without a model, see :func:`_stepper`). A strategy that has not built a batch in this
    process yet first builds one, and steps on it, untimed (its kernels loaded); NFP's column layout is made
    before the timed batches (zero slices unless the engine holds the real one). The engine's state is
    restored; NFP's column layout is kept only if the engine already had it."""
    if iters == 0 or not strategies:
        return {}, {}
    step, t_opt = _stepper(engine)
    n = min(max(batches, 1), max(iters, 1))
    times: dict[str, list[float]] = {s: [] for s in strategies}
    step_times: dict[str, list[float]] = {s: [] for s in strategies}
    with engine.scratch(cache=False):
        for s in strategies:
            engine.strategy = s
            # NFP's column layout, made here and not in a timed batch: zero slices of the features' shape unless
            # the engine holds the real one (the exchange is paid once NFP is chosen; undone after the plan)
            engine.prepare(s, timing=True)
            if s not in engine.built_strategies:
                warm = engine.batch(epoch, 0)
                if step is not None:
                    step(warm)
        for it in range(n):
            for s in strategies:
                engine.strategy = s
                t0 = time.perf_counter()
                batch = engine.batch(epoch, it % max(iters, 1))
                times[s].append(time.perf_counter() - t0)
                if step is not None:
                    step_times[s].append(step(batch))
                del batch
                if engine.size > 1:  # as training's gradient all-reduce: the next build starts together, its
                    engine.comm.barrier()  # time not holding a wait for a slower rank's step
    t = torch.tensor([min(times[s]) for s in strategies], dtype=torch.float64)
    if engine.size > 1:
        engine.comm.allreduce_(t, "max")
    steps = {s: (min(step_times[s]), t_opt) for s in strategies} if step is not None else {}
    return {s: float(v) * iters for s, v in zip(strategies, t.tolist())}, steps


TIMINGS = ("dry_run", "training", "none")


def cross_validated_fetches(gids: np.ndarray, owner: np.ndarray, inverse: np.ndarray, fold: np.ndarray,
                            cache_rows: int, num_remote: int, P: int) -> np.ndarray:
    """Remote rows fetched per owner (float64[P]) with a cache of ``cache_rows`` rows, cross-validated across the
    dry-run epochs: for each fold, the cache holds the ``cache_rows`` rows read most often in the other folds (ties:
    the lower id; only rows read there) and the fold's reads it misses are counted. A node's sample is the same
    all epoch long, so choosing and scoring on the same epoch would flatter the cache.

    ``gids`` (sorted, distinct) and ``owner``: the rows read; ``inverse``, ``fold``: per read, its row's index in
    ``gids`` and its fold. ``num_remote``: the remote rows there are (a cache that large holds all of them)."""
    n = gids.size
    out = np.zeros(P, np.float64)
    if n == 0 or cache_rows >= num_remote:
        return out
    per_fold = np.bincount(fold * n + inverse, minlength=FOLDS * n).reshape(FOLDS, n)
    total = per_fold.sum(0)
    tie = n - 1 - np.arange(n, dtype=np.int64)  # among equal counts the lower id ranks higher
    for f in range(FOLDS):
        score = per_fold[f]
        if not score.any():
            continue
        pick = total - score
        cand = np.flatnonzero(pick)
        cached = np.zeros(n, dtype=bool)
        if cand.size <= cache_rows:
            cached[cand] = True
        else:
            key = pick[cand] * n + tie[cand]
            cached[cand[np.argpartition(-key, cache_rows - 1)[:cache_rows]]] = True
        out += np.bincount(owner[~cached], weights=score[~cached], minlength=P)
    return out


def dry_run(engine: Any, requested: str = "auto", profile: Profile | None = None, timing: str = "dry_run",
            tune_iterations: int = 0) -> Plan:
    """Sample, count, profile and predict (collective; see the module docstring). ``engine``: an
    ``apt`` engine after its data are loaded (its sampler, store, schedule and options are used).

    ``timing``: ``dry_run`` times every strategy's build and step here; ``training`` times none here: the
    engine times GDP, SNP and DNP on training's first ``tune_iterations`` iterations (whose batches the dry run
    does not sample: they are sampled as training draws them; its first epoch's batches are the next ones, kept
    for training) and NFP between their rounds, and hands the times to
    :meth:`Plan.finalize`; until then the plan is provisional (its compute not timed); ``none`` times nothing (a
    cache's hotness is all that is wanted)."""
    if timing not in TIMINGS:
        raise ValueError(f"engine.plan_timing: must be one of {', '.join(TIMINGS)}, got {timing!r}")

    comm, P, r = engine.comm, int(engine.size), int(engine.rank)
    t_start = time.perf_counter()
    sampler, first = engine.sampler, engine.first
    iters = engine.schedule.iterations()
    nb = min(engine.dry_run_batches, FOLDS * iters)
    # batches cycle through the training's first FOLDS epochs: a node's sample is fixed within an epoch, so the
    # cache's hit rate is cross-validated across them (chosen on the others, scored on one); training takes
    # these batches' samples from the dry run instead of drawing them again (the same samples)
    dry_epochs = tuple(int(engine.first_epoch) + f for f in range(FOLDS))
    L = len(engine.fanouts)
    acc: dict[str, float] = {k: 0.0 for k in (
        "sample", "nd", "rows1", "edges1", "up_rows", "up_edges", "up_dst", "nfp_struct",
        "snp_struct", "snp_local_edges", "dnp_rows1", "dnp_edges1", "dnp_dst", "dnp_asked", "dnp_remote", "dnp_sample",
        "max_rows1", "max_dnp_rows1", "max_up_rows", "local_sample_s", "seeds")}
    loads: dict[str, list[np.ndarray]] = {s: [] for s in ("gdp", "snp", "dnp")}
    snp_v = np.zeros(P, np.int64)
    snp_e = np.zeros(P, np.int64)
    snp_u = np.zeros(P, np.int64)
    local_times: list[float] = []  # per batch: sampling outside communication
    # kept for training (the first epochs' batches, in sampling order until one would pass KEEP_MB), with the
    # seconds of their upper hops and of their block-0 hop
    kept: list[tuple[tuple[int, int], tuple, float, float]] = []
    kept_bytes = 0
    n_skipped = 0  # batches of the iterations training times (not kept)
    # batch i belongs to dry epoch i % FOLDS (its fold); they are sampled epoch by epoch (one seed order each)
    order = sorted(range(nb), key=lambda i: (i % FOLDS, i))
    fold_of: list[int] = []
    mark = np.zeros(engine.num_owned, dtype=bool)  # DNP's counting: my destinations of a batch (left all False)
    sampler.keep_served = True
    with engine.scratch():  # counters, epoch and the rest as they were afterwards
        for n_done, it in enumerate(order):
            fold_of.append(it % FOLDS)
            # the first epoch's batches from past the iterations training times (which sample for themselves)
            skip = tune_iterations if it % FOLDS == 0 and tune_iterations < iters else 0
            epoch, iteration = dry_epochs[it % FOLDS], (skip + it // FOLDS) % max(iters, 1)
            seeds = engine.seeds(epoch, iteration)
            acc["seeds"] += seeds.numel()
            t0, c0 = time.perf_counter(), comm.comm_seconds
            s0 = engine.counter.get("sample", 0)
            upper, D = engine.sample_upper(seeds + first, epoch)
            s_up = engine.counter.get("sample", 0) - s0
            t1 = time.perf_counter()
            sampler.served = None
            counts, nbrs, deg = engine.hop(D, 0, epoch)
            served = sampler.served  # what this rank sampled for the others' block-0 destinations (DNP's below)
            s_all = engine.counter.get("sample", 0) - s0
            t2 = time.perf_counter()
            src, col = relabel(D, nbrs)
            local_times.append((time.perf_counter() - t0) - (comm.comm_seconds - c0))
            size = sum(a.nbytes for h in upper for a in h[1:]) + D.nbytes + counts.nbytes + nbrs.nbytes + deg.nbytes
            kept_bytes += size
            tuned_here = epoch == dry_epochs[0] and iteration < tune_iterations  # training times it: sampled there
            if kept_bytes <= KEEP_MB << 20 and len(kept) == n_done - n_skipped and not tuned_here:
                # training takes this batch's sampling from here
                kept.append(((epoch, iteration), (upper, D, (counts, nbrs, deg)), t1 - t0, t2 - t1))
            n_skipped += tuned_here
            if n_done == nb - 1:  # the shapes the kernels are timed at (below)
                blocks = engine.upper_blocks(upper, deg, None)
                csr0 = block_csr(counts, col, src.size)
            acc["sample"] += s_all
            for (_, dst, _, c, _, s) in upper:
                acc["up_rows"] += s.size
                acc["up_edges"] += int(c.sum())
                acc["up_dst"] += dst.size
            acc["max_up_rows"] = max(acc["max_up_rows"], sum(h[5].size for h in upper))
            nd = D.size
            acc["nd"] += nd
            acc["rows1"] += src.size
            acc["edges1"] += nbrs.size
            acc["max_rows1"] = max(acc["max_rows1"], src.size)
            owned_src = sampler.is_owned(src)
            loads["gdp"].append(src[~owned_src])
            # NFP: block 0 all-broadcast
            acc["nfp_struct"] += (P - 1) * 8 * (3 + src.size + nd + nbrs.size)
            # SNP: virtual nodes (destination, owner of a source) and edges per source owner
            own = sampler.owner(nbrs) if nbrs.size else np.zeros(0, np.int64)
            rows = np.repeat(np.arange(nd, dtype=np.int64), counts)
            pair = np.zeros((nd, P), dtype=bool)
            pair[rows, own] = True
            v = pair.sum(0).astype(np.int64)
            e = np.bincount(own, minlength=P).astype(np.int64)
            distinct = np.zeros(src.size, dtype=bool)  # the distinct sources: the rows each owner projects for me
            distinct[col] = True
            snp_u += np.bincount(sampler.owner(src[distinct]), minlength=P).astype(np.int64)
            acc["snp_local_edges"] += int(e[r])
            v[r], e[r] = 0, 0
            snp_v += v
            snp_e += e
            acc["snp_struct"] += 8 * (int(v.sum()) + int(e.sum()))
            d_owned = owned_src[:nd]  # src starts with D
            loads["snp"].append(D[~d_owned])
            # DNP: destinations to their owners (as in training), who sample and load their sources. The
            # destinations other ranks would send me are those whose block-0 neighbours they just asked me to
            # sample (GDP's remote sampling above), and a node's sample is the same whoever draws it: my own
            # destinations' samples are GDP's, the others' are those I served
            mine = d_owned
            rpos = np.flatnonzero(~mine)
            asked, c_s, n_s = served if served is not None else (np.zeros(0, np.int64),) * 3
            d_mine = D[mine]
            # the asked destinations I do not hold already (distinct, in id order): a mask of my destinations
            mark[d_mine - first] = True
            keep = np.flatnonzero(~mark[asked - first])
            mark[d_mine - first] = False
            new, at = np.unique(asked[keep], return_index=True)
            sel = keep[at]  # each new destination's first answer
            cnt = c_s[sel]
            starts = np.cumsum(c_s) - c_s
            nb_new = n_s[np.repeat(starts[sel] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))]
            src_d, _ = relabel(np.concatenate([d_mine, new]), np.concatenate([nbrs[np.repeat(mine, counts)], nb_new]))
            loads["dnp"].append(src_d[~sampler.is_owned(src_d)])
            acc["dnp_rows1"] += src_d.size
            acc["dnp_dst"] += d_mine.size + new.size  # the destinations this rank computes for everyone
            acc["dnp_edges1"] += int(counts[mine].sum()) + nb_new.size
            acc["max_dnp_rows1"] = max(acc["max_dnp_rows1"], src_d.size)
            acc["dnp_asked"] += asked.shape[0]
            acc["dnp_remote"] += rpos.size
            acc["dnp_sample"] += s_up + 8 * (rpos.size + asked.shape[0])
    sampler.keep_served, sampler.served = False, None
    # every rank reuses the same batches (the sampling is collective): the shortest run of kept batches
    n_kept = torch.tensor([len(kept)], dtype=torch.int64)
    if P > 1:
        comm.allreduce_(n_kept, "min")
    kept = kept[:int(n_kept.item())]
    samples = {key: batch for key, batch, _, _ in kept}
    reuse_up, reuse_h0 = sum(k[2] for k in kept), sum(k[3] for k in kept)
    # what the other ranks counted
    row_bytes = engine.num_features * engine.host_feat.element_size() + 8
    cache_rows = engine.cache_rows() if engine.cache_mb > 0 else 0
    remote_nodes = np.concatenate([np.arange(engine.dg.node_ranges[0], first),
                                   np.arange(first + engine.num_owned, engine.dg.node_ranges[-1])]).astype(np.int64)
    hot, fetch_by_owner, fetch_nocache = {}, {}, {}
    for s, lst in loads.items():
        allg = np.concatenate(lst) if lst else np.zeros(0, np.int64)
        folds = np.repeat(np.asarray(fold_of, dtype=np.int64), [a.size for a in lst]) if lst else allg
        gids, inv = np.unique(allg, return_inverse=True)
        own = sampler.owner(gids) if gids.size else np.zeros(0, np.int64)
        cnt = np.bincount(inv, minlength=gids.size)
        hot[s] = (gids, cnt)
        fetch_nocache[s] = np.bincount(own, weights=cnt, minlength=P).astype(np.float64)
        fetch_by_owner[s] = (cross_validated_fetches(gids, own, inv, folds, cache_rows, remote_nodes.size, P)
                             if cache_rows else fetch_nocache[s])
    # sampling per batch outside communication (a ruled-out strategy's build is modelled from it): the median
    acc["local_sample_s"] = float(np.median(local_times)) * nb if local_times else 0.0
    # the model's work at this batch's real shapes: layer 1 (block 0) and the upper layers
    F, dp, C = engine.num_features, max(engine.hidden, 1), engine.num_classes
    # GraphSAGE aggregates before projecting when the layer widens (nn/sage_conv.py): its aggregation then
    # runs at the input width, and SNP's partial sums travel at that width
    agg_first = engine.model_name == "sage" and dp > F
    t_gemm1 = t_spmm1 = t_gemm1_pf = t_spmm1_pf = t_up = t_step = 0.0
    last_rows1 = last_edges1 = last_nd = 1.0
    params = 2 * (F * dp + max(L - 2, 0) * dp * dp + dp * C)  # the model's parameters (the all-reduce)
    # counts scale to an epoch by seeds (every training node is a seed once per epoch)
    k = engine.train_idx.numel() / max(acc["seeds"], 1)
    mine_info = {"nd": acc["nd"] * k, "rows1": acc["rows1"] * k, "edges1": acc["edges1"] * k,
                 "snp_v": (snp_v * k).tolist(), "snp_e": (snp_e * k).tolist(), "snp_u": (snp_u * k).tolist(),
                 "fetch": {s: (v * k).tolist() for s, v in fetch_by_owner.items()},
                 "fetch0": {s: (v * k).tolist() for s, v in fetch_nocache.items()}, "max_rows1": acc["max_rows1"]}
    every = comm.allgather_object(mine_info) if P > 1 else [mine_info]  # per epoch, each rank's own scale
    prof = profile if profile is not None else profile_machine(comm, engine.dtype, max_bytes=engine.profile_bytes,
                                                               width=max(engine.hidden, 1),
                                                               path=engine.options.get("profile_file") or None)
    item = engine.host_feat.element_size()
    heads = max(int(engine.options.get("heads", 1)), 1)
    gat = engine.model_name == "gat"
    costs = {}
    limit = engine.memory_mb or memory_limit_mb(comm)
    owned_bytes = engine.num_owned * (F * item + 8)
    N = int(engine.dg.node_ranges[-1])
    load_nocache: dict[str, float] = {}
    # builds and steps of each strategy: the model timed on its own batches; without the model, layer 1's
    # kernels scaled per strategy, the upper layers' kernels at the dry run's shapes and Adam on as many weights
    later = [s for s in STRATEGIES if s not in engine.ruled_out] if timing == "training" else []
    timed = [s for s in STRATEGIES if s not in engine.ruled_out] if timing == "dry_run" else []
    built, steps = time_builds(engine, timed, iters, dry_epochs[0])
    step = steps.get("gdp")
    # layer 1's kernels, for the strategies that will have no step of their own (ruled out; or nothing timed)
    if nb and any(s not in steps and s not in later for s in STRATEGIES):
        t_gemm1, t_spmm1 = time_layer(csr0, F, dp, engine.dtype, aggregate_first=agg_first)
        # NFP's input is a column slice (a CSR matrix): SAGE projects it first whatever the widths, from the
        # slice's width (the widest rank's): a narrow GEMM writing as many output rows as a full one
        w_nfp = int(np.diff(engine.column_bounds()).max())
        t_gemm1_pf, t_spmm1_pf = time_layer(csr0, w_nfp, dp, engine.dtype)
        last_rows1, last_edges1, last_nd = float(src.size), float(max(nbrs.size, 1)), float(D.size)
    if step is None and nb and not later:  # GDP's step will not be timed: the upper layers' kernels and Adam
        for i, blk in enumerate(blocks):
            fout = C if i == len(blocks) - 1 else dp
            g, a = time_layer(blk.csr, dp, fout, engine.dtype,
                              aggregate_first=engine.model_name == "sage" and fout > dp)
            t_up += g + a
        weights = torch.zeros(params, dtype=engine.dtype, requires_grad=True)
        weights.grad = torch.zeros_like(weights)
        opt = Adam([weights])
        opt.step()
        t0 = time.perf_counter()
        opt.step()
        t_step = time.perf_counter() - t0
    def predict(built: dict[str, float], steps: dict[str, tuple[float, float]],
                measured: frozenset = frozenset()) -> tuple[dict[str, StrategyCost], str]:
        """Every strategy's cost and the choice (collective). ``measured``: the strategies whose steps training
        timed, their gradient all-reduce included (the others' steps, timed here, are without)."""
        step = steps.get("gdp")
        layer1: dict[str, float] = {}  # per iteration: layer 1's modelled forward and backward
        for s in STRATEGIES:
            b = {op: 0.0 for op in OPS}
            calls = {op: 0.0 for op in OPS}
            b["allreduce"], calls["allreduce"] = params * item * iters, iters
            b["sample"] = (acc["dnp_sample"] if s == "dnp" else acc["sample"]) * k
            calls["sample"] = 2 * L * iters
            if s in ("gdp", "snp", "dnp"):
                f = every[r]["fetch"][s]
                asked_of_me = sum(every[p]["fetch"][s][r] for p in range(P) if p != r)
                b["load"] = 8 * (sum(f) - f[r]) + row_bytes * asked_of_me
                f0 = every[r]["fetch0"][s]
                load_nocache[s] = 8 * (sum(f0) - f0[r]) + row_bytes * sum(every[p]["fetch0"][s][r] for p in range(P)
                                                                           if p != r)
                calls["load"] = 2 * iters
            rows1, edges1, csr_rows1 = acc["rows1"] * k, acc["edges1"] * k, 0.0
            if s == "nfp":
                b["structure"], calls["structure"] = acc["nfp_struct"] * k, iters
                others = sum(every[p]["nd"] for p in range(P) if p != r)
                b["shuffle"] = dp * item * others
                b["shuffle_bwd"] = dp * item * (P - 1) * acc["nd"] * k
                calls["shuffle"] = calls["shuffle_bwd"] = iters
                csr_rows1 = sum(e["rows1"] for e in every)
                rows1, edges1 = 0.0, sum(e["edges1"] for e in every)
            elif s == "snp":
                b["structure"], calls["structure"] = acc["snp_struct"] * k, 2 * iters
                on_me = sum(every[p]["snp_v"][r] for p in range(P))
                mine_v = float(snp_v.sum()) * k
                w = heads * (dp // heads + 2) if gat else (F if agg_first else dp)
                b["shuffle"] = item * (w * on_me + (heads * mine_v if gat else 0))
                # aggregating the raw inputs first (SAGE widening), the partials need no gradient
                b["shuffle_bwd"] = 0.0 if agg_first else item * (w * mine_v + (heads * on_me if gat else 0))
                calls["shuffle"] = (2 if gat else 1) * iters
                calls["shuffle_bwd"] = 0 if agg_first else calls["shuffle"]
                edges1 = acc["snp_local_edges"] * k + sum(every[p]["snp_e"][r] for p in range(P))
                rows1 = acc["nd"] * k + sum(every[p]["snp_u"][r] for p in range(P))
            elif s == "dnp":
                b["shuffle"] = dp * item * acc["dnp_asked"] * k
                b["shuffle_bwd"] = dp * item * acc["dnp_remote"] * k
                calls["shuffle"] = calls["shuffle_bwd"] = iters
                rows1, edges1 = acc["dnp_rows1"] * k, acc["dnp_edges1"] * k
            sec = {}
            # build (sampling, structure, blocks): timed in the dry run without a cache, its loading of the input
            # rows taken off; load: the alpha-beta time of the rows fetched with the cache
            sec["load"] = prof.comm_time("alltoallv", calls["load"], b["load"])
            if s in built:  # the timed build holds the loading without a cache: the modelled load replaces it
                sec["build"] = max(built[s] - (prof.comm_time("alltoallv", calls["load"], load_nocache[s])
                                               if s in load_nocache else 0.0), 0.0)
            else:
                sec["build"] = acc["local_sample_s"] * iters / max(nb, 1) + prof.comm_time(
                    "alltoallv", calls["sample"] + calls["structure"], b["sample"] + b["structure"])
            sec["shuffle"] = prof.comm_time("alltoallv", calls["shuffle"] + calls["shuffle_bwd"],
                                            b["shuffle"] + b["shuffle_bwd"])
            # compute: the measured layer times of one dry-run batch, scaled by each strategy's rows and edges
            att = 3.0 if gat else 1.0
            per_it = iters
            rows_it = (rows1 + csr_rows1) / per_it
            edges_it = edges1 / per_it
            # projections scale with the rows projected (all input rows, or the destinations when SAGE
            # aggregates first; NFP always projects its column slice first), aggregation with the edges
            tg, ts = (t_gemm1_pf, t_spmm1_pf) if s == "nfp" else (t_gemm1, t_spmm1)
            # destination rows projected here: DNP's owner computes the destinations every rank asked for, NFP
            # every rank's destinations (at its slice's width)
            if s == "nfp":
                dst_it = sum(e["nd"] for e in every) / per_it
            else:
                dst_it = (acc["dnp_dst"] if s == "dnp" else acc["nd"]) * k / per_it
            if agg_first and s != "nfp":
                gemm_scale = dst_it / max(last_nd, 1.0)
            else:
                gemm_scale = (rows_it + dst_it) / max(last_rows1 + last_nd, 1.0)
            layer1[s] = tg * gemm_scale + att * ts * edges_it / last_edges1
            allreduce = prof.comm_time("allreduce", calls["allreduce"], b["allreduce"])
            if s in steps:  # the strategy's own step, measured (its shuffles included: shown apart, as modelled)
                sec["compute"] = max(per_it * sum(steps[s]) - sec["shuffle"], 0.0) + (
                    0.0 if s in measured else allreduce)  # training's steps hold their all-reduce
            elif step is not None:  # GDP's step, its layer 1 (modelled) replaced by this strategy's (a ruled-out one)
                sec["compute"] = per_it * (max(step[0] - layer1["gdp"], 0.0) + step[1] + layer1[s]) + (
                    0.0 if "gdp" in measured else allreduce)
            else:
                sec["compute"] = per_it * (layer1[s] + att * t_up + t_step) + allreduce
            # memory: stored features (+ NFP's column slices, + cache), the largest batch's layer-1 input and
            # activations
            store = owned_bytes + (cache_rows * row_bytes if s != "nfp" else 0)
            if s == "nfp":
                store += N * ((F // P + 1) * item + 8)
                batch_rows = sum(e["max_rows1"] for e in every)
                batch = batch_rows * ((F // P + 1) * (item + 8) + 4 * dp * item)
            else:
                batch_rows = acc["max_dnp_rows1"] if s == "dnp" else acc["max_rows1"]
                batch = batch_rows * (F * item + 4 * dp * item)
            batch += acc["max_up_rows"] * 4 * dp * item * (heads if gat else 1)
            costs[s] = StrategyCost(s, b, calls, sec, (store + batch) / 2**20)
        # the slowest rank decides every strategy's epoch; memory: the largest rank
        vec = torch.tensor([sum(costs[s].seconds.values()) for s in STRATEGIES]
                           + [costs[s].memory_mb for s in STRATEGIES], dtype=torch.float64)
        if P > 1:
            comm.allreduce_(vec, "max")
        for i, s in enumerate(STRATEGIES):
            costs[s].total, costs[s].memory_mb = float(vec[i]), float(vec[len(STRATEGIES) + i])
            if costs[s].memory_mb > limit:
                costs[s].fits, costs[s].reason = False, f"needs {costs[s].memory_mb:.0f} MB > {limit:.0f} MB per rank"
        for s, why in engine.ruled_out.items():
            costs[s].fits, costs[s].reason = False, f"{s} {why.split(':')[0]}"
        fitting = [s for s in STRATEGIES if costs[s].fits]
        choice = min(fitting, key=lambda s: costs[s].total) if fitting else "gdp"
        return costs, choice

    costs, choice = predict(built, steps)
    # the sampling of the kept batches, the slowest rank's: every strategy reuses their upper hops, all but DNP
    # (whose owners sample block 0) their block-0 hop too
    vec = torch.tensor([reuse_up, reuse_h0], dtype=torch.float64)
    if P > 1:
        comm.allreduce_(vec, "max")
    dry = time.perf_counter() - t_start - prof.seconds if profile is None else time.perf_counter() - t_start
    reused = {s: float(vec[0]) + (0.0 if s == "dnp" else float(vec[1])) for s in STRATEGIES}
    plan = Plan(costs, choice, prof, nb, iters, dry, hot, remote_nodes, limit, samples, reused, timing=timing,
                tuned=timing != "training", requested=requested,
                _predict=(lambda b, st, m: predict({**built, **b}, {**steps, **st}, m)) if timing == "training"
                else None, _rank=r)
    log.debug("apt: rank %d predicted terms %s", r, {s: c.seconds for s, c in costs.items()})
    if timing != "training":  # else once training has timed the strategies (finalize)
        plan._log()
    return plan
