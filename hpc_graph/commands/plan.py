"""``hpc-graph plan --config CFG.yaml [--set key=value ...]``: what a job will cost, before it trains.

The engines that can be planned on shapes (``hpc_graph.engines.plannable_engines``: ``single``, ``dp``, ``sar``,
``sylvie``, ``flow``, and any plug-in that declares ``Engine.plan_instance``; ``engine.name`` of the config,
``auto``, or ``--engines``): one process predicts, per rank, the peak memory (by component) and the epoch time
(compute, halo exchange, gradient all-reduce) for each engine and rank count, the bottleneck, and with
``--memory-per-rank`` the smallest rank count that fits, by running each rank's step on shapes
(``hpc_graph.plan.predict``, docs/plan.md). The graph comes from ``--data`` (default ``data.path``): a dataset file or
a partition directory (exact per-rank statistics at its part count, the cut model at other counts), or from a
description (``--nodes --edges --features --classes`` ...) when there is no file at all. Rates are
measured here at plan time (kernels on the real graph; the links only when the plan itself runs
under ``mpiexec`` with 2 or more ranks, or read from ``--profile FILE``; otherwise a stated default
link); every assumption is printed. Nothing is trained.

An engine that plans itself by a dry run on the data (``Engine.dry_run_report``: ``apt``, its dry run and cost
model over a profile of this launch, ``engine.dry_run_batches`` sampled batches, each strategy's bytes by
operation, timed builds and kernels, a memory check): every rank loads its partition and rank 0 prints the
engine's report. Run it under the same launcher and rank count as the job
(``mpiexec -n 4 hpc-graph plan --config configs/apt_sage.yaml``).

``--json FILE`` also writes the predictions as JSON.

Exit status: 0 done; 2 bad config, data or option (one line naming it).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from typing import Any

from hpc_graph.cli import CLIError, add_model_option, add_threads_option, model_overrides

log = logging.getLogger(__name__)

#: the CLI leaves the thread decision to this command (``train.threads`` takes part in it)
CONFIGURES_THREADS = True

#: the link assumed when none was measured (no ``--profile`` file, one process, no ``comm.link_*``)
DEFAULT_LINK = ("10GB/s", "5us")
DESCRIPTION_FLAGS = ("nodes", "edges", "features", "classes")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="predict a job's memory and epoch time per rank before training",
        description="Predict per-rank peak memory and epoch time over rank counts by running each rank's step on "
                    "shapes (single, dp, sar, sylvie, flow), or run an engine's own dry run (apt); nothing is "
                    "trained (docs/plan.md).")
    parser.add_argument("--config", required=True, metavar="CFG.yaml", help="training config (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field (repeatable)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the predictions as JSON")
    add_model_option(parser)
    fb = parser.add_argument_group("engines planned on shapes (single, dp, sar, sylvie, flow)")
    fb.add_argument("--data", default=None, metavar="DATASET.h5|PARTITION_DIR",
                    help="the graph to plan for (default: the config's data.path)")
    fb.add_argument("--engines", default=None, metavar="LIST",
                    help="comma-separated engines that can be planned (single, dp, sar, sylvie, flow), or 'all' "
                         "(default: the config's engine; "
                         "single, dp and sar for engine.name auto; 'all': the five)")
    fb.add_argument("--ranks", default=None, metavar="LIST|A-B",
                    help="rank counts: '1,2,4' or a range 'A-B' (powers of two in the table, every count searched "
                         "for the smallest that fits); default: the partition's part count, else 1 (a description: "
                         "1-256)")
    fb.add_argument("--memory-per-rank", default=None, metavar="SIZE",
                    help="memory each rank may use (e.g. 24GB, 192GiB): report which rank counts fit")
    fb.add_argument("--nodes", type=int, default=None, metavar="N", help="description: number of nodes")
    fb.add_argument("--edges", type=int, default=None, metavar="E",
                    help="description: stored edges (CSR entries; an undirected graph counts both directions)")
    fb.add_argument("--features", type=int, default=None, metavar="F", help="description: input feature width")
    fb.add_argument("--classes", type=int, default=None, metavar="C", help="description: number of classes")
    fb.add_argument("--train-fraction", type=float, default=None, metavar="FRAC",
                    help="description: fraction of nodes with a training label (default 0.1)")
    fb.add_argument("--directed", action="store_true",
                    help="description: the graph is directed (its CSR is not its own transpose)")
    fb.add_argument("--cut-fraction", default=None, metavar="C[@P]",
                    help="edge-cut fraction for rank counts without a partition: C at every count, or C@P measured "
                         "at P parts and extended by recursive bisection (default: the partition's measured cut "
                         "at its part count; for a dataset, a random partition's 1 - 1/P)")
    fb.add_argument("--edge-imbalance", type=float, default=1.0, metavar="X",
                    help="cut model: in-edges of the fullest rank over the mean (default 1.0)")
    fb.add_argument("--profile", default=None, metavar="FILE",
                    help="machine profile JSON with the links' alpha-beta fits: read when it exists, else measured "
                         "(under mpiexec with 2+ ranks) and written")
    fb.add_argument("--link-bandwidth", default=None, metavar="BW",
                    help=f"link assumed when none is measured (default: comm.link_bandwidth, else {DEFAULT_LINK[0]})")
    fb.add_argument("--link-latency", default=None, metavar="LAT",
                    help=f"latency of that link (default: comm.link_latency, else {DEFAULT_LINK[1]})")
    fb.add_argument("--cores-per-node", type=int, default=None, metavar="C",
                    help="CPU cores of a node (default: this machine's)")
    fb.add_argument("--ranks-per-node", type=int, default=None, metavar="R",
                    help="ranks sharing a node (default: all ranks on one node, like this machine)")
    fb.add_argument("--floor", default=None, metavar="SIZE",
                    help="per-process floor (Python, torch, kernels, MPI; default: measured by a 2-epoch run of the "
                         "model on a 1024-node graph in a subprocess)")
    fb.add_argument("--rates", choices=("graph", "synthetic", "none"), default="graph",
                    help="kernel rates: measured on the graph given (default), on a synthetic R-MAT graph, or none "
                         "(memory only)")
    fb.add_argument("--calibration", default="measure", metavar="measure|none|SECONDS",
                    help="seconds an epoch takes beyond its kernels, added to every rank's compute: 'measure' "
                         "(default) times a few real training epochs of the model on an R-MAT calibration graph in "
                         "a subprocess (most of a plan's 50-130 s on 2 cores) and subtracts what the kernel rates "
                         "predict for them, and where the ranks planned oversubscribe this host's cores, runs as many "
                         "copies at once to measure how much slower they run; 'none': 0; or a number of seconds (one "
                         "measured before)")
    add_threads_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hpc_graph.comm.threads import configure_threads, parse_threads
    from hpc_graph.train.config import ConfigError, config_from_dict, read_config, train_section

    try:
        args.overrides = model_overrides(args)
        raw = read_config(args.config, args.overrides)
        tc = train_section(raw)  # the threads are decided before torch and the engines are imported
        threads = parse_threads(args.threads, "--threads") if args.threads is not None else tc.threads
        configure_threads(threads, explicit_name="--threads" if args.threads is not None else "train.threads",
                          world=True)
        try:
            config = config_from_dict(raw)
        except ConfigError as exc:
            # a plan needs no data.path when the graph comes from --data or a description (--nodes ...)
            given = args.data if args.data is not None else ("described graph" if args.nodes is not None else None)
            if not str(exc).startswith("data.path: required"):
                raise
            if given is None:
                raise CLIError("--data: no graph given (--data, data.path, or a description with --nodes ...)") \
                    from None
            config = config_from_dict(read_config(args.config, list(args.overrides)
                                                  + [f"data.path={json.dumps(str(given))}"]))
        from hpc_graph.engines import Engine, engine_class, plannable, plannable_engines

        cls = None if config.engine.name == "auto" else engine_class(config.engine.name, config.data.path)
        own_dry_run = cls is not None and cls.dry_run_report.__func__ is not Engine.dry_run_report.__func__
        if args.engines is None and cls is not None and not own_dry_run and not plannable(cls):
            raise ConfigError(f"engine.name: hpc-graph plan covers engines {', '.join(plannable_engines())} (and "
                              f"those with a dry run of their own), not {config.engine.name!r} (or choose engines "
                              "with --engines)")
    except (ConfigError, ValueError, OSError) as exc:
        raise CLIError(str(exc)) from exc
    if args.engines is None and own_dry_run:
        return _run_dry_run(args, config, cls)
    return _run_planned(args, config)


# -- an engine's own dry run ---------------------------------------------------------------------------
def _run_dry_run(args: argparse.Namespace, config: Any, cls: Any) -> int:
    from hpc_graph.comm import get_communicator
    from hpc_graph.train.config import ConfigError

    try:
        comm = get_communicator(config.train.comm_backend)
        report = cls.dry_run_report(config, comm)
    except (ConfigError, ValueError, OSError) as exc:
        raise CLIError(str(exc)) from exc
    if comm.rank == 0:
        print(report["table"])
        print(report["summary"])
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(report["json"], fh, indent=1, default=float)
        sys.stdout.flush()
    return 0


# -- full-batch engines --------------------------------------------------------------------------------
def _smallest_fit(counts: list[int], fits: dict[int, bool], fits_at: Any) -> int | None:
    """The smallest of ``counts`` (ascending) at which a run fits, given ``fits`` (the counts planned already)
    and ``fits_at(P)`` to plan another: the first planned count that fits, then bisection over the counts
    between it and the planned count below it (per-rank memory falls as ranks are added within that
    interval; a range's planned counts are its powers of two)."""
    def first_fit(candidates: list[int]) -> int | None:  # candidates[hi:] fit, candidates[:lo] do not
        lo, hi = 0, len(candidates)
        while lo < hi:
            mid = (lo + hi) // 2
            if fits_at(candidates[mid]):
                hi = mid
            else:
                lo = mid + 1
        return candidates[lo] if lo < len(candidates) else None

    known = sorted(fits)
    first = next((P for P in known if fits[P]), None)
    if first is None:  # beyond every planned count: search the rest
        return first_fit([P for P in counts if P > (known[-1] if known else 0)])
    below = max((P for P in known if P < first), default=0)
    return first_fit([P for P in counts if below < P < first]) or first


def parse_ranks(text: str | None, default: list[int]) -> tuple[list[int], list[int]]:
    """``(shown, searched)`` rank counts from ``--ranks``: a list ``1,2,4`` (both the same) or a range
    ``A-B`` (shown: the powers of two in it and B; searched: every count). ValueError naming ``--ranks``."""
    if text is None:
        return default, default
    t = text.strip()
    try:
        if "-" in t and "," not in t:
            lo_s, hi_s = t.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo < 1 or hi < lo:
                raise ValueError
            shown, p = [], 1
            while p <= hi:
                if p >= lo:
                    shown.append(p)
                p *= 2
            if not shown or shown[0] != lo:
                shown.insert(0, lo)
            if shown[-1] != hi:
                shown.append(hi)
            if hi - lo > 100_000:
                raise ValueError
            return shown, list(range(lo, hi + 1))
        values = sorted({int(x) for x in t.split(",") if x.strip()})
        if not values or values[0] < 1:
            raise ValueError
        return values, values
    except ValueError:
        raise CLIError(f"--ranks: expected positive rank counts like '1,2,4' or a range like '1-64', got {text!r}") \
            from None


def parse_engines(text: str | None, config_engine: str) -> list[str]:
    """The engines to plan: ``--engines`` (a list, or ``all``: every engine that can be planned), else the
    config's engine, or for ``auto`` every plannable engine that trains what one process trains (``exact``)."""
    from hpc_graph.engines import engine_class, plannable_engines

    able = plannable_engines()
    if text is None:
        if config_engine in able:
            return [config_engine]
        return [n for n in able if engine_class(n).exact]
    if text.strip() == "all":
        return list(able)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in able]
    if not names or bad:
        raise CLIError(f"--engines: choose among {', '.join(able)} or 'all', got {text!r}")
    return list(dict.fromkeys(names))


def parse_cut(text: str | None) -> tuple[float, int | None] | None:
    if text is None:
        return None
    value, _, at = text.partition("@")
    try:
        c = float(value)
        p = int(at) if at else None
    except ValueError:
        raise CLIError(f"--cut-fraction: expected C or C@P (e.g. 0.3 or 0.3@8), got {text!r}") from None
    if not 0.0 <= c <= 1.0 or (p is not None and p < 2):
        raise CLIError(f"--cut-fraction: C must lie in [0, 1] and P be at least 2, got {text!r}")
    return c, p


def _size(text: str, option: str) -> int:
    from data_io.memory import parse_bytes

    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise CLIError(f"{option}: {exc}") from None
    if value <= 0:
        raise CLIError(f"{option}: must be positive, got {text!r}")
    return value


def _description(args: argparse.Namespace) -> Any:
    """The :class:`GraphShape` of the description flags, or None when none is given."""
    from hpc_graph.plan.shapes import GraphShape

    given = {f: getattr(args, f) for f in DESCRIPTION_FLAGS}
    if all(v is None for v in given.values()) and args.train_fraction is None:
        return None
    missing = [f for f, v in given.items() if v is None]
    if missing:
        raise CLIError(f"--{missing[0]}: required to describe the graph (with --nodes, --edges, --features and "
                       f"--classes)")
    for f, v in given.items():
        if v < (0 if f == "features" else 1):
            raise CLIError(f"--{f}: must be a positive integer, got {v}")
    frac = 0.1 if args.train_fraction is None else args.train_fraction
    if not 0.0 <= frac <= 1.0:
        raise CLIError(f"--train-fraction: must lie in [0, 1], got {frac}")
    return GraphShape(nodes=args.nodes, edges=args.edges, features=args.features, classes=args.classes,
                      train_nodes=int(round(frac * args.nodes)), directed=bool(args.directed), disk_index_bytes=8,
                      name="described graph")


def _train_subprocess(raw: dict, cfg: str, threads: int, timeout: float, failure: str, copies: int = 1) -> None:
    """Write the config ``raw`` to ``cfg`` and run ``hpc-graph train`` on it in a subprocess of its own: ``threads``
    threads, no memory limit, none of the MPI launcher's variables (a child of a rank must start as a process of
    its own, not join the job). ``copies`` > 1: that many at once, copy ``k`` in ``train.run_dir`` + ``.k``
    (each its own config file, ``cfg`` + ``.k``). A failed run raises CLIError ``failure`` with the end of its
    stderr, the other copies stopped."""
    import subprocess

    import yaml

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))}
    env.update(OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    env.pop("HPC_GRAPH_MEMORY_LIMIT", None)
    procs = []
    try:
        for k in range(copies):
            path = cfg if copies == 1 else f"{cfg}.{k}"
            own = (raw if copies == 1
                   else {**raw, "train": {**raw["train"], "run_dir": f"{raw['train']['run_dir']}.{k}"}})
            with open(path, "w", encoding="utf-8") as fh:
                yaml.safe_dump(own, fh)
            # stderr to a file: a pipe left unread while another copy is waited for could fill and stall it
            with open(path + ".err", "w", encoding="utf-8") as err:
                procs.append((subprocess.Popen([sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", path,
                                                "--force"], env=env, stdout=subprocess.DEVNULL, stderr=err),
                              path + ".err"))
        for proc, err_path in procs:
            proc.wait(timeout=timeout)
            if proc.returncode != 0:
                with open(err_path, encoding="utf-8", errors="replace") as fh:
                    raise CLIError(failure.format(stderr=fh.read().strip()[-300:]))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def measure_floor(config: Any) -> tuple[int, str]:
    """Peak RSS of a 2-epoch ``single`` run of the config's model on a 1024-node R-MAT graph, in a subprocess:
    Python, torch, numba and the kernels this model loads, the thread pools (bytes, and how it was measured)."""
    import tempfile

    from data_io.generators.rmat import write_rmat

    mc = config.model
    with tempfile.TemporaryDirectory(prefix="hpc-graph-plan-") as d:
        write_rmat(os.path.join(d, "g.h5"), 10, 8, feat_dim=16, num_classes=4, seed=0)
        model = {"name": mc.name, "hidden": 8, "num_layers": max(2, int(mc.num_layers)), "dropout": float(mc.dropout)}
        if mc.name == "gat":
            model.update(heads=2, out_heads=1)
        raw = {"data": {"path": os.path.join(d, "g.h5")}, "engine": {"name": "single"}, "model": model,
               "train": {"epochs": 2, "progress": False, "run_dir": os.path.join(d, "run"), "eval_every": 2,
                         "dtype": config.train.dtype}}
        _train_subprocess(raw, os.path.join(d, "floor.yaml"), 1, 600,
                          "--floor: measuring the process floor failed ({stderr}); give it with --floor SIZE")
        with open(os.path.join(d, "run", "summary.json"), encoding="utf-8") as fh:
            peak_mb = float(json.load(fh)["peak_rss_mb"][0])
    return int(peak_mb * 2**20), f"measured: peak RSS of a 2-epoch {mc.name} run on a 1024-node graph"


#: the calibration graph: R-MAT (edge factor 16) of at most this scale, and no larger than the fullest rank
CALIBRATION_MAX_SCALE = 17
CALIBRATION_EPOCHS = 6  # at least this many epochs (the median of epochs 2.. is timed), and as many as run for at
CALIBRATION_SECONDS = 8.0  # least this many seconds as the kernels predict them (at most 4x CALIBRATION_EPOCHS)
CONTENTION_EPOCHS = 4  # the oversubscription measurement's first lone run: the median of epochs 2.. (at most 4x as
CONTENTION_SECONDS = 8.0  # many for the copies and the second lone run, which run at least this many seconds of epochs)
CONTENTION_MAX_COPIES = 64  # ranks per node beyond which no contention is measured (the plain model stands)


def parse_calibration(text: str) -> float | None:
    """``--calibration``: None for ``measure``, 0 for ``none``, else seconds per epoch >= 0 (``0.4`` or
    ``0.4s``; CLIError naming the option otherwise)."""
    t = str(text).strip().lower()
    if t == "measure":
        return None
    if t == "none":
        return 0.0
    try:
        value = float(t[:-1] if t.endswith("s") else t)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 3600.0:
        raise CLIError(f"--calibration: expected 'measure', 'none' or the seconds an epoch takes beyond its kernels "
                       f"(e.g. 0.4), got {text!r}")
    return value


def _calibration_graph(config: Any, spec: Any, nodes: int, d: str, max_scale: int) -> tuple[dict, str, int]:
    """Write the R-MAT calibration graph of ``min(nodes, 2^max_scale)`` nodes (the input width and classes of
    ``spec``) in folder ``d``; the config (as a dict) that trains the config's model on it with ``single``, its
    path, and its scale."""
    from data_io.generators.rmat import write_rmat
    from hpc_graph.train.config import config_to_dict

    scale = int(min(max(10, math.ceil(math.log2(max(nodes, 2)))), max_scale))
    path = os.path.join(d, "g.h5")
    write_rmat(path, scale, 16, feat_dim=int(spec.in_dim), num_classes=int(max(spec.classes, 2)), seed=1)
    from hpc_graph.engines import reference_engine

    raw = config_to_dict(config)
    raw["data"] = {**raw["data"], "path": path, "feature_layout": "dense"}
    raw["engine"] = {"name": reference_engine()}  # one process, the whole graph
    raw.pop("lm", None)
    return raw, path, scale


def _calibration_epochs(raw: dict, d: str, name: str, threads: int, epochs: int, copies: int = 1) -> list[float]:
    """The median epoch (epochs 2..) of each of ``copies`` runs of ``raw`` started at once, ``threads`` threads
    each (run folders ``d/name``...)."""
    import statistics

    run_dir = os.path.join(d, name)
    raw = {**raw, "train": {**raw["train"], "epochs": epochs, "eval_every": epochs, "progress": False,
                            "run_dir": run_dir, "threads": threads, "checkpoint_every": 0, "device": "cpu"}}
    _train_subprocess(raw, os.path.join(d, f"{name}.yaml"), threads, 1800,
                      "--calibration: the calibration run failed ({stderr}); pass --calibration none or a number of "
                      "seconds", copies=copies)
    out = []
    for k in range(copies):
        with open(os.path.join(run_dir if copies == 1 else f"{run_dir}.{k}", "metrics.jsonl"), encoding="utf-8") as fh:
            got = [json.loads(line)["epoch_seconds"] for line in fh if line.strip()]
        out.append(statistics.median(got[1:] or got))
    return out


def calibration_epochs(predicted: float) -> int:
    """Epochs of a calibration run whose epoch the kernels predict at ``predicted`` seconds: CALIBRATION_EPOCHS,
    or more, up to 4x as many, until epochs 2.. span CALIBRATION_SECONDS. The median epoch of a run is what the
    plan adds to; on a machine whose speed moves by 1.5-2x for seconds at a time, a run of a few short epochs
    sees one of those phases (plans of the same configuration made with six-epoch calibration runs spread
    1.2-2.2x on this machine)."""
    want = math.ceil(CALIBRATION_SECONDS / max(float(predicted), 1e-3)) + 1
    return int(min(max(CALIBRATION_EPOCHS, want), 4 * CALIBRATION_EPOCHS))


def measure_calibration(config: Any, spec: Any, nodes: int, threads: list[int], dtype: Any, *,
                        rank_graph: tuple[Any, str] = (None, ""), max_scale: int = CALIBRATION_MAX_SCALE
                        ) -> tuple[dict[int, tuple[float, str]], Any]:
    """``({t: (seconds, how)}, rates)``. ``seconds``, for every thread count ``t`` in ``threads``: the step's
    overhead beyond its kernels (autograd, allocations, Python, the optimizer), added to every rank's predicted
    compute (:attr:`hpc_graph.plan.rates.Rates.step_overhead`): the median epoch (epochs 2..) of a real
    ``single`` run of the config's model on an R-MAT graph of ``min(nodes, 2^max_scale)`` nodes (the input width
    and classes of ``spec``), in a subprocess at ``t`` threads, less the step the planner predicts for it from
    kernel rates measured on that graph here (first: the prediction sets the run's length,
    :func:`calibration_epochs`).

    ``rates``: the :class:`~hpc_graph.plan.profile.KernelRates` of ``rank_graph`` (``(csr, label)``, the graph the
    plan's rates come from; csr None: the synthetic graph), measured here too, its probes in rounds alternating
    with the calibration graph's (:func:`~hpc_graph.plan.profile.paired_kernel_rates`): the overhead is a small
    difference of two large times, and rates measured seconds apart on a shared machine differ by 10-20 %; paired,
    both sets err alike, and what the plan adds (the rank's kernels plus the overhead) does not carry the drift.
    Both are measured at the fewest of ``threads`` (the thread count of the ranks when the plan is for one rank
    count: their kernels measured, not extrapolated; an Amdahl fraction measured from a speed-up or two moved by
    half from one plan to the next on this machine, 0.56 to 0.99). The calibration graph's rates take the rank
    graph's Amdahl fraction, so that an overhead measured at more threads than the rates also absorbs the error
    of that extrapolation."""
    import tempfile

    from hpc_graph.plan.predict import predict
    from hpc_graph.plan.profile import paired_kernel_rates
    from hpc_graph.plan.rates import Rates
    from hpc_graph.plan.shapes import graph_from_dataset, rank_csr, single_layout

    counts = sorted(set(int(x) for x in threads))
    out: dict[int, tuple[float, str]] = {}
    with tempfile.TemporaryDirectory(prefix="hpc-graph-calibrate-") as d:
        raw, path, scale = _calibration_graph(config, spec, nodes, d, max_scale)
        graph = graph_from_dataset(path)
        cal_csr, _ = rank_csr(path, single_layout(graph), 4_000_000)
        kr, kr_cal = paired_kernel_rates([rank_graph, (cal_csr, "calibration graph")], dtype, gat=spec.attention,
                                         threads=counts[0])
        del cal_csr
        rates = Rates.from_kernels(kr_cal)
        for t in counts:
            pred = predict(raw["engine"]["name"], spec, graph, single_layout(graph), floor=0, rates=rates, threads=t,
                           cores_per_node=t, ranks_per_node=1, source=path)
            predicted = float(pred.rank_seconds[0])
            n = calibration_epochs(predicted)
            seconds = _calibration_epochs(raw, d, f"run{t}", t, n)[0]
            extra = seconds - predicted
            if not -0.5 * predicted <= extra <= 2.0 * predicted:
                log.warning("plan: the calibration run's epoch (%.3g s at %d thread(s)) is far from the %.3g s its "
                            "kernels predict (a busy machine?); using it anyway", seconds, t, predicted)
            out[t] = (extra, f"{n}-epoch single run of this model on an R-MAT scale-{scale} graph at {t} thread(s): "
                             f"epoch {seconds:.4g} s, {predicted:.4g} s predicted (kernel rates measured in rounds "
                             "alternating with the plan's)")
    return out, kr


def measure_contention(config: Any, spec: Any, nodes: int, crowds: list[tuple[int, int]], cores: int, *,
                       max_scale: int = CALIBRATION_MAX_SCALE) -> dict[float, tuple[float, str]]:
    """``{over: (factor, how)}`` for every ``(copies, threads)`` in ``crowds`` (ranks per node and their threads
    that oversubscribe this host's ``cores``; ``over = copies * threads / cores``): ``copies`` real ``single``
    runs of the config's model on the calibration graph (:func:`measure_calibration`'s), ``threads`` threads each,
    started at once, against one run alone at as many threads before them and one after: the copies' median
    epoch over the lone runs' mean.
    It replaces the "``over`` ranks per core run ``over`` times slower" of the plain model
    (:meth:`hpc_graph.plan.rates.Rates.slowdown`): cores time-shared between ranks also share their caches,
    and kernels with large working sets (GAT's attention) lose more than the time slice."""
    import statistics
    import tempfile

    out: dict[float, tuple[float, str]] = {}
    log.info("plan: measuring how much slower ranks sharing cores run (%s copies of a calibration run at once)",
             ", ".join(str(c) for c, _ in sorted(set(crowds))))
    with tempfile.TemporaryDirectory(prefix="hpc-graph-contention-") as d:
        raw, _, scale = _calibration_graph(config, spec, nodes, d, max_scale)
        for copies, t in sorted(set(crowds)):
            # alone, the copies, alone again: a machine whose speed drifts over the measurement (a shared one
            # does, by 10-40 % from one second to the next) is seen by both sides of the ratio alike
            before = _calibration_epochs(raw, d, f"alone{t}", t, CONTENTION_EPOCHS)[0]
            # at least CONTENTION_SECONDS of epochs on each side (short epochs see a second's speed each)
            n = int(min(max(CONTENTION_EPOCHS, math.ceil(CONTENTION_SECONDS / max(before, 1e-3)) + 1),
                        4 * CONTENTION_EPOCHS))
            crowd = _calibration_epochs(raw, d, f"crowd{copies}x{t}", t, n, copies=copies)
            after = _calibration_epochs(raw, d, f"again{t}", t, n)[0]
            alone = 0.5 * (before + after)
            over = round(copies * t / cores, 6)
            factor = statistics.median(crowd) / alone
            out[over] = (factor, f"x{factor:.2f} for {over:g} threads per core: {copies} copies of a {n}-epoch "
                                 f"single run of this model on an R-MAT scale-{scale} graph at {t} thread(s) "
                                 f"each on {cores} cores, epoch {statistics.median(crowd):.4g} s against {alone:.4g} s "
                                 f"alone (before and after them)")
    return out


def _links(args: argparse.Namespace, config: Any, comm: Any) -> tuple[Any, Any, Any, str]:
    """``(exchange, allreduce, link, source)``: measured alpha-beta fits and/or a link model."""
    from hpc_graph.comm.link import LinkModel, parse_bandwidth, parse_latency
    from hpc_graph.plan.profile import load_profile, profile_machine, save_profile

    exchange = allreduce = link = None
    source = ""
    if args.profile and os.path.exists(args.profile):
        loaded = load_profile(args.profile)
        if loaded is None:
            raise CLIError(f"--profile: {args.profile} is not a readable machine profile")
        prof, key = loaded
        if not all(k in prof.alpha and k in prof.beta for k in ("exchange", "allreduce")):
            raise CLIError(f"--profile: {args.profile} has no exchange/allreduce fits")
        exchange = (prof.alpha["exchange"], prof.beta["exchange"])
        allreduce = (prof.alpha["allreduce"], prof.beta["allreduce"])
        source = f"links: alpha-beta fits read from {args.profile} (measured for {key})"
    elif comm.size > 1:
        prof = profile_machine(comm, max_bytes=16 << 20, reps=3, reuse=False)
        exchange = (prof.alpha["exchange"], prof.beta["exchange"])
        allreduce = (prof.alpha["allreduce"], prof.beta["allreduce"])
        source = f"links: alpha-beta fits measured now on {comm.size} ranks"
        if args.profile and comm.rank == 0:
            save_profile(args.profile, prof, comm.size)
            source += f" (written to {args.profile})"
    bw_text = args.link_bandwidth if args.link_bandwidth is not None else config.comm.link_bandwidth
    lat_text = args.link_latency if args.link_latency is not None else config.comm.link_latency
    try:
        if bw_text is not None and parse_bandwidth(bw_text, "--link-bandwidth") is not None:
            link = LinkModel(parse_bandwidth(bw_text, "--link-bandwidth"), parse_latency(lat_text, "--link-latency"))
            origin = "--link-bandwidth" if args.link_bandwidth is not None else "comm.link_bandwidth"
            source = (source + "; " if source else "links: ") + f"modelled link {bw_text}, {lat_text or 0} ({origin})"
        elif exchange is None:
            link = LinkModel(parse_bandwidth(DEFAULT_LINK[0]), parse_latency(DEFAULT_LINK[1]))
            source = (f"links: default link {DEFAULT_LINK[0]}, {DEFAULT_LINK[1]} per message (not measured: run the "
                      "plan under mpiexec -n 2 with --profile FILE to measure them)")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return exchange, allreduce, link, source


def _run_planned(args: argparse.Namespace, config: Any) -> int:
    from data_io.errors import DataError
    from hpc_graph.comm import get_communicator
    from hpc_graph.engines import engine_class
    from hpc_graph.plan import predict as pr
    from hpc_graph.plan import shapes

    engines = parse_engines(args.engines, config.engine.name)
    classes = {e: engine_class(e, args.data or config.data.path) for e in engines}
    memory = _size(args.memory_per_rank, "--memory-per-rank") if args.memory_per_rank is not None else None
    calibration = parse_calibration(args.calibration)
    cut = parse_cut(args.cut_fraction)
    if not args.edge_imbalance >= 1.0:
        raise CLIError(f"--edge-imbalance: must be at least 1.0, got {args.edge_imbalance}")
    for opt in ("cores_per_node", "ranks_per_node"):
        v = getattr(args, opt)
        if v is not None and v < 1:
            raise CLIError(f"--{opt.replace('_', '-')}: must be a positive integer, got {v}")
    comm = get_communicator(config.train.comm_backend)
    assumptions: list[str] = []
    graph = _description(args)
    data = None
    try:
        if graph is None:
            data = args.data or config.data.path
            if not data:
                raise CLIError("--data: no graph given (--data, data.path, or a description with --nodes ...)")
            if not os.path.exists(data):
                raise CLIError(f"--data: no such file or directory: {data}")
            from hpc_graph.engines import is_graph_level

            if is_graph_level(data):
                raise CLIError(f"--data: {data} is a graph-level dataset (many small graphs, /graphs/ptr): hpc-graph "
                               "plan describes full-batch training of one graph, not steps over batches of graphs")
            graph = shapes.graph_from_partition(data) if os.path.isdir(data) else shapes.graph_from_dataset(data)
            assumptions.append(f"graph: {data}: {graph.nodes:,} nodes, {graph.edges:,} stored edges, "
                               f"{graph.features} features, {graph.classes} classes, {graph.train_nodes:,} training "
                               f"nodes, {'directed' if graph.directed else 'undirected'}")
        else:
            if args.data is not None:
                raise CLIError("--data: give a dataset/partition or a description (--nodes ...), not both")
            assumptions.append(f"graph: described: {graph.nodes:,} nodes, {graph.edges:,} stored edges (CSR entries), "
                               f"{graph.features} features, {graph.classes} classes, {graph.train_nodes:,} training "
                               f"nodes, {'directed' if graph.directed else 'undirected (CSR = its transpose)'}")
        spec = pr.spec_from_config(config, graph)
    except DataError as exc:
        raise CLIError(str(exc)) from None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    parted = None
    if data is not None and os.path.isdir(data):
        try:
            parted = shapes.layout_from_partition(data)
        except DataError as exc:
            raise CLIError(str(exc)) from None
    default = [parted.ranks] if parted is not None else ([1] if data is not None else [2 ** k for k in range(9)])
    shown, searched = parse_ranks(args.ranks, default)
    one = [e for e in engines if classes[e].max_ranks == 1]  # engines of one process
    dropped = [e for e in one if len(engines) > 1 and 1 not in searched]
    engines = [e for e in engines if e not in dropped]
    if engines and all(classes[e].max_ranks == 1 for e in engines) and 1 not in searched:
        raise CLIError(f"--engines: {engines[0]!r} runs on one rank, but --ranks has no 1")
    if engines and all(classes[e].kind == "pipeline" for e in engines) and min(searched) > spec.layers:
        raise CLIError(f"--ranks: {engines[0]} runs one stage of layers per rank, and the model has {spec.layers} "
                       f"layers; no rank count in {args.ranks or searched} is at most that")
    degrees = None
    if data is not None and os.path.isfile(data) and graph.edges <= 500_000_000:
        degrees = _degrees(data, graph)
    if cut is None and parted is not None:
        cut = (parted.cut_fraction, parted.ranks) if parted.ranks > 1 else None
        if cut is not None:
            assumptions.append(f"cut model at other rank counts: the partition's measured cut {cut[0]:.3f} at "
                               f"{cut[1]} parts, extended by recursive bisection")
    elif cut is None:
        assumptions.append("cut model: no --cut-fraction: a random partition's cut 1 - 1/P (an upper bound)")
    else:
        assumptions.append(f"cut model: --cut-fraction {args.cut_fraction}"
                           + (" (recursive bisection from that count)" if cut[1] else " at every rank count"))

    def layout(P: int) -> Any:
        if P == 1:
            return shapes.single_layout(graph)
        if parted is not None and parted.ranks == P:
            return parted
        c, at = cut if cut is not None else (1.0 - 1.0 / P, None)
        if cut is None:
            c, at = 1.0 - 1.0 / P, None
        return shapes.layout_from_cut_model(graph, P, c, at=at, edge_imbalance=args.edge_imbalance,
                                            out_degrees=degrees)

    # floor, threads, rates
    from hpc_graph.comm.threads import affinity_cpus

    if args.floor is not None:
        floor, floor_src = _size(args.floor, "--floor"), "--floor"
    elif comm.rank == 0:
        floor, floor_src = measure_floor(config)
    else:
        floor, floor_src = 0, ""
    cores = args.cores_per_node or len(affinity_cpus()) or (os.cpu_count() or 1)
    threads_fixed = config.train.threads
    rates = None
    rate_src = "none (--rates none): memory only"
    links_src = ""
    if args.rates != "none":
        exchange, allreduce, link, links_src = _links(args, config, comm)
    if comm.rank != 0:
        return 0
    if args.rates != "none":
        import torch

        from hpc_graph.plan.profile import kernel_rates

        dtype = torch.float64 if config.train.dtype == "float64" else torch.float32
        gat = spec.attention
        csr, what = (None, "")
        if args.rates == "graph" and data is not None:
            csr, what = shapes.rank_csr(data, parted or shapes.single_layout(graph), 4_000_000)
        by_threads: dict[int, float] = {}
        # the thread counts the planned ranks run (at most this process's): the fewest and the most; the kernels
        # are measured at the fewest (the ranks of the most ranks per node), extrapolated to the others
        here = int(torch.get_num_threads())
        wanted = set()
        for P in shown:
            rpn = min(P, args.ranks_per_node) if args.ranks_per_node else P
            wanted.add(min(threads_fixed or pr.threads_for(rpn, cores)[0], here))
        wanted = {min(wanted), max(wanted)}
        if calibration is None:
            found, kr = measure_calibration(config, spec, _fullest_nodes(parted or shapes.single_layout(graph)),
                                            sorted(wanted), dtype, rank_graph=(csr, what))
            del csr
            by_threads = {t: f for t, (f, _) in found.items()}
            overhead = by_threads[max(by_threads)]
            cal_src = "; ".join(f"{f:+.3f} s from a {how}" for f, how in found.values())
            contention, cont_src = _contention(args, config, spec, parted or shapes.single_layout(graph), shown, cores,
                                               threads_fixed)
        else:
            kr = kernel_rates(csr, dtype, gat=gat, label=what, threads=min(wanted))
            del csr
            overhead, cal_src = calibration, f"{calibration:+.3f} s (--calibration)"
            contention, cont_src = {}, ("not measured (--calibration given): a rank running k threads per core runs "
                                        "k times slower" if _crowds(args, shown, cores, threads_fixed) else "")
        from hpc_graph.plan.rates import Rates

        rates = Rates.from_kernels(kr, exchange=exchange, allreduce=allreduce, link=link, step_overhead=overhead,
                                      step_overhead_threads=by_threads, contention=contention,
                                      sources={"kernels": f"measured now on {kr.graph} at {kr.threads} thread(s) "
                                                          f"({kr.seconds:.1f} s)", "links": links_src,
                                               "calibration": cal_src, "contention": cont_src})
        rate_src = rates.sources["kernels"]
    preds: list[Any] = []
    smallest: dict[str, int | None] = {}
    shown_set = set(shown)
    unplanned: set[str] = set()
    for e in dropped:
        assumptions.append(f"{e}: not planned (one process; --ranks has no 1)")
    for engine in engines:
        cls = classes[engine]
        opts = cls.options_from_config(config)
        counts = [1] if cls.max_ranks == 1 else searched
        if cls.kind == "pipeline":  # one stage of at least one layer per rank
            counts = [P for P in searched if P <= spec.layers]
            if len(counts) < len(searched):
                assumptions.append(f"{engine}: not planned on more ranks than the model's {spec.layers} layers")
            if not counts:
                unplanned.add(engine)

        def plan_at(P: int) -> Any:
            rpn = min(P, args.ranks_per_node) if args.ranks_per_node else P
            t_rank, share = pr.threads_for(rpn, cores)
            try:
                return pr.predict(engine, spec, graph, pr.layout_for(cls, graph, P, layout),
                                  floor=floor + (pr.MPI_ALLOWANCE_BYTES if P > 1 else 0),
                                  rates=rates if P in shown_set else None, memory_per_rank=memory,
                                  cores_per_node=cores, ranks_per_node=rpn, threads=threads_fixed or t_rank,
                                  options=opts, source=data)
            except (ValueError, NotImplementedError) as exc:
                raise CLIError(str(exc)) from None

        fits = {}
        for P in (P for P in counts if P in shown_set):
            pred = plan_at(P)
            preds.append(pred)
            fits[P] = bool(pred.fits)
        smallest[engine] = _smallest_fit(counts, fits, lambda P: bool(plan_at(P).fits)) if memory is not None \
            else None
        assumptions += cls.plan_assumptions(opts)
    assumptions += _model_assumptions(spec, config)
    assumptions.append(f"process floor: {floor / 2**20:.0f} MiB ({floor_src})"
                       + (f", + {pr.MPI_ALLOWANCE_BYTES >> 20} MiB with 2+ ranks (MPI)"
                          if any(p > 1 for p in shown) else ""))
    assumptions.append(f"threads: {cores} cores per node; ranks per node: "
                       f"{args.ranks_per_node or 'all ranks on one node'}; a rank runs max(1, cores // ranks per "
                       "node) threads" + (f" (train.threads = {threads_fixed})" if threads_fixed else ""))
    if rates is not None:
        assumptions.append(f"kernel rates: {rate_src}")
        assumptions.append(f"compute time + per-epoch overhead beyond the kernels (calibration) "
                           f"{rates.sources['calibration']}")
        if rates.sources.get("contention"):
            assumptions.append(f"ranks oversubscribing a node's cores: {rates.sources['contention']}")
        assumptions.append(rates.sources["links"])
    else:
        assumptions.append(f"rates: {rate_src}")
    if memory is not None and len(searched) > len(shown):
        assumptions.append("smallest rank count: bisection between the planned counts of the range (per-rank "
                           "memory falls as ranks are added)")
    print(format_table(preds, memory))
    if memory is not None:
        for engine in engines:
            if engine in unplanned:
                print(f"smallest rank count that fits {args.memory_per_rank} per rank, {engine}: not planned at these "
                      f"rank counts (at most {spec.layers}, one layer per rank)")
                continue
            p = smallest.get(engine)
            counts = [1] if classes[engine].max_ranks == 1 else searched
            if classes[engine].kind == "pipeline":  # one layer per rank at the most
                counts = [P for P in counts if P <= spec.layers] or counts
            lim = max(counts)
            print(f"smallest rank count that fits {args.memory_per_rank} per rank, {engine}: "
                  + (str(p) if p is not None else f"none up to {lim}"))
    print("assumptions:")
    for a in assumptions:
        print(f"  - {a}")
    for note in sorted({n for p in preds for n in p.layout.notes}):
        print(f"  - {note}")
    if args.json:
        out = {"engines": engines, "ranks": shown, "memory_per_rank": memory, "floor_bytes": floor,
               "smallest_fitting": smallest, "assumptions": assumptions,
               "rates": None if rates is None else {k: v for k, v in rates.__dict__.items() if k not in ("link",)},
               "model": {**spec.__dict__, "model": vars(spec.model), "attention": spec.attention},
               "graph": graph.__dict__,
               "predictions": [p.as_dict() for p in preds]}
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(out, fh, indent=1, default=str)
        except OSError as exc:
            raise CLIError(f"--json: cannot write {args.json} ({exc.strerror or exc})") from None
    sys.stdout.flush()
    return 0


def _crowds(args: argparse.Namespace, shown: list[int], cores: int, threads_fixed: int | None) -> set[tuple[int, int]]:
    """``(ranks per node, threads)`` of the rank counts shown that run more threads than a node's ``cores``."""
    from hpc_graph.plan.predict import threads_for

    crowds = set()
    for P in shown:
        rpn = min(P, args.ranks_per_node) if args.ranks_per_node else P
        t_rank, _ = threads_for(rpn, cores)
        thr = threads_fixed or t_rank
        if thr * rpn > cores:
            crowds.add((rpn, thr))
    return crowds


def _contention(args: argparse.Namespace, config: Any, spec: Any, layout: Any, shown: list[int], cores: int,
                threads_fixed: int | None) -> tuple[dict[float, float], str]:
    """Measure how much slower ranks that oversubscribe a node's cores run (:func:`measure_contention`), for the
    rank counts shown, on this host when it is the node planned for (``cores`` its own); ``({}, why)`` where
    nothing needs or allows it."""
    from hpc_graph.comm.threads import affinity_cpus

    crowds = _crowds(args, shown, cores, threads_fixed)
    if not crowds:
        return {}, ""
    here = len(affinity_cpus()) or (os.cpu_count() or 1)
    if cores != here:
        return {}, (f"not measured (--cores-per-node {cores} is not this host's {here}): a rank running k threads per "
                    "core runs k times slower")
    if any(c > CONTENTION_MAX_COPIES for c, _ in crowds):
        return {}, (f"not measured (more than {CONTENTION_MAX_COPIES} ranks per node): a rank running k threads per "
                    "core runs k times slower")
    found = measure_contention(config, spec, _fullest_nodes(layout), sorted(crowds), cores)
    return {o: f for o, (f, _) in found.items()}, "; ".join(how for _, how in found.values())


def _fullest_nodes(layout: Any) -> int:
    """Owned nodes of the rank with the most edges (the calibration graph is no larger)."""
    part = max(layout.parts, key=lambda r: r.edges)
    return int(part.owned)


def _degrees(path: str, graph: Any) -> Any:
    """Out-degrees of a dataset's nodes (in-degrees of an undirected graph: its row lengths)."""
    import numpy as np

    from data_io.dataset import open_dataset

    with open_dataset(path, check_values=False) as ds:
        indptr = np.asarray(ds.indptr(), dtype=np.int64)
        if not graph.directed:
            return np.diff(indptr)
        return np.bincount(np.asarray(ds.indices()), minlength=graph.nodes)


def _model_assumptions(spec: Any, config: Any) -> list[str]:
    out = [f"model: {spec.describe()}"
           f"{' (feature_norm row: two copies of the features)' if spec.feature_norm == 'row' else ''}",
           "each rank's step (two training steps and the evaluation pass) run on shapes through the engine's and "
           "the model's own code; column indices int32, row pointers and ids int64 in memory; peaks include "
           "loading; freed memory is returned to the system (glibc with a low mmap threshold, e.g. "
           "MALLOC_MMAP_THRESHOLD_=1048576)"]
    if config.data.feature_layout == "sparse":
        out.append("data.feature_layout sparse: features counted as dense (the planner does not model CSR features)")
    return out


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f}"


def format_table(preds: list[Any], memory: int | None) -> str:
    """The plan's table: one row per engine and rank count; memory in MiB per rank (bottleneck rank), time in s."""
    head = ["engine", "ranks", "peak MiB", "graph", "feat", "activ", "halo", "param", "work", "floor", "epoch s",
            "compute", "halo s", "allred s", "bottleneck"] + (["fits"] if memory is not None else [])
    rows = []
    for p in preds:
        c = p.memory.components
        t = p.time
        rows.append([p.engine, str(p.ranks), _mib(p.memory.peak), _mib(c["graph"]), _mib(c["features"]),
                     _mib(c["activations"]), _mib(c["halo"]), _mib(c["params"]), _mib(c["workspace"]),
                     _mib(c["floor"]),
                     "-" if t is None else f"{t.total:.3f}", "-" if t is None else f"{t.compute:.3f}",
                     "-" if t is None else f"{t.halo:.3f}", "-" if t is None else f"{t.allreduce:.3f}",
                     p.bottleneck] + (["yes" if p.fits else "no"] if memory is not None else []))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    for r in rows:
        lines.append("  ".join(x.rjust(w) if i > 1 else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths))))
    lines.append("memory: the peak of the fullest rank and what is live then (MiB); epoch: the slowest rank's "
                 "training step")
    return "\n".join(lines)
