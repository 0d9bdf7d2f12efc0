"""Benchmark: ``hpc-graph plan`` against real ``dp``, ``sar`` and ``sylvie`` training runs (peak memory and epoch
time per rank).

    python benchmarks/bench_plan.py --scales 16 18 --ranks 1 2 4 --models gcn sage gat --engines dp sar \\
        --epochs 5 --out results/bench_plan.json --plot docs/img/plan_vs_measured.png

Engines: ``dp``, ``sar``, ``sylvie`` (2-bit halo rows, synchronous), ``sylvie-pipe`` (2 bits, its
pipeline on: halo rows one epoch stale) and ``flow`` (one stage of layers per rank, split by cost, on the
dataset file; at most as many ranks as layers), each passed to ``plan`` and ``train`` as ``--set`` overrides.

For every scale an R-MAT graph is generated once (``hpc-graph generate rmat --scale S --edge-factor 16
--feat-dim 128 --num-classes 16``, as benchmarks/bench_training.py) and METIS-partitioned once per rank
count (``hpc-graph partition``, 1 part too: ``dp``/``sar`` on one rank). Models: 3 layers, GCN and
SAGE hidden 128, GAT 4 heads x 32 (bench_training's). Then, per scale, model and rank count:

1. ``hpc-graph plan --config CFG --data PARTITION --engines dp,sar --ranks P --floor F --profile
   WORK/links-P.json --json OUT`` in one process: the predicted per-rank peak and the slowest rank's
   epoch. The floor ``F`` is measured once per model (``hpc_graph.commands.plan.measure_floor``, what
   ``plan`` does when ``--floor`` is not given); the links' alpha-beta fits once per rank count by
   ``mpiexec -n P hpc-graph plan ... --profile WORK/links-P.json`` (written there, read by the plans);
   the kernel rates by the plan itself, on the fullest part of the partition, and its calibration (a
   ``single`` run of the model on an R-MAT graph of up to scale 17, 6-24 epochs, minus its predicted step: the
   per-epoch overhead added to every rank, at the thread counts the ranks run).
2. ``mpiexec -n P python -m hpc_graph.cli train --config CFG --set data.path=PARTITION --set
   engine.name=E`` per engine, ``--epochs`` epochs, one evaluation at the end, with
   ``OMP_NUM_THREADS = NUMBA_NUM_THREADS = max(1, cores // P)``, ``OMP_WAIT_POLICY=PASSIVE`` and
   ``MALLOC_MMAP_THRESHOLD_=1048576`` (bench_training's settings: freed buffers go back to the system).
   Measured: every rank's peak RSS (``summary.json``, getrusage), the median over epochs 2..E of the
   slowest rank's epoch time, and the bytes each rank sent per epoch (against the prediction, exactly).

The machine is shared: before a plan or a run, other processes must keep at most ``--max-busy`` cores
busy (``/proc/stat`` over 3 s; waiting up to ``--wait`` seconds; recorded with the load average); a
run whose epochs 2..E spread by more than ``--noise-limit``, or whose job got less than
``--min-cpu-share`` of the cores it could use (CPU over wall seconds: another user took some), is
repeated up to ``--repeat-noisy`` times: the first attempt that passes both checks is kept, else the one
whose epochs spread least (not the fastest: on a machine whose speed moves by 2x over seconds that would
pick its fast phases); the plan of a run is re-made right before each repetition, so rates and run see the
same machine.

``--rounds N`` measures every configuration N times, in rounds over all configurations of a scale (a
round plans and runs each configuration once, the next round starts over): on a machine whose speed moves
by 2x over seconds one plan and one run of a configuration each see a phase of their own, N rounds spread
over the benchmark's whole duration. The record of a configuration then compares the median of its N
predicted epochs with the median of its N measured ones; every round's own plan, run and error stay in it
(``rounds``), and the summary gives the errors of single rounds too, and the runs' own reproducibility:
each round's measured epoch taken as the prediction of another round's (what a perfect planner would score
against single runs).

``--papers100m`` also plans ogbn-papers100M (111,059,956 nodes; 1,615,685,872 edges as OGB counts
them, and 3,231,371,744 as SAR trains it, symmetrised; 128 features, 172 classes, 1.1 % training
nodes; 3-layer SAGE hidden 256, SAR's setup) at 192 GB per rank, with every assumption printed.

``--replan`` makes the plans of finished runs again with the planner as it is now (after a change to
it), on a quiet machine, and keeps the runs: the old prediction stays in the record as ``predicted_first``.

Results: ``--out`` (one JSON record per run, re-running a configuration replaces it), a table on
stdout and, with ``--plot``, predicted vs measured memory and time (``docs/img/plan_vs_measured.png``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = {"gcn": 128, "sage": 128, "gat": 32}
HEADS, LAYERS = 4, 3
MB = 2.0 ** 20
PAPERS = {"nodes": 111_059_956, "features": 128, "classes": 172, "train_fraction": 0.011}
#: the engines measured: the engine's name and the config overrides of each
ENGINES = {"dp": ("dp", []), "sar": ("sar", []),
           "sylvie": ("sylvie", ["engine.bits=2"]),
           "sylvie-pipe": ("sylvie", ["engine.bits=2", "engine.pipeline=on"]),
           "flow": ("flow", ["engine.stage_split=cost"])}


def _data(work: Path, scale: int, ranks: int, engine: str) -> Path:
    """What ``engine`` trains on: flow reads the whole dataset on every rank, the others their partition."""
    return work / f"rmat-s{scale}.h5" if engine == "flow" else part_dir(work, scale, ranks)


def _engine_args(variant: str) -> tuple[str, list[str]]:
    """``(engine name, ['--set', 'k=v', ...])`` of a measured engine variant."""
    name, sets = ENGINES[variant]
    out: list[str] = ["--set", f"engine.name={name}"]
    for kv in sets:
        out += ["--set", kv]
    return name, out


def _cli() -> list[str]:
    return [sys.executable, "-m", "hpc_graph.cli"]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def busy_cores(seconds: float = 3.0) -> float:
    """Cores kept busy by every process on the machine over ``seconds`` (``/proc/stat``); called while
    nothing of ours runs, it is what other users take."""
    def sample() -> tuple[float, float]:
        with open("/proc/stat") as fh:
            v = [float(x) for x in fh.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0.0)
        return sum(v), idle

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    ncpu = os.cpu_count() or 1
    return round(max(0.0, (t1 - t0) - (i1 - i0)) / max(t1 - t0, 1e-9) * ncpu, 2)


def speed_ms(reps: int = 7) -> float:
    """This machine's speed now: milliseconds of a fixed one-thread workload (a 768^2 GEMM and an elementwise
    pass over 8 MiB, as a training step's kernels), the median of ``reps`` after 0.3 s of warming up. A shared host
    runs the same work up to 2x slower for seconds at a time (busy_cores does not see its other tenants): the
    plan's and the run's values say whether the two saw the same machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(768, 768, generator=gen)
        x = torch.randn(1 << 21, generator=gen)
        t_warm = time.perf_counter() + 0.3  # warm: without this, eight calls a second apart spread 10-32 ms
        while time.perf_counter() < t_warm:
            a @ a
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ a
            torch.add(x, x)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return round(1000.0 * statistics.median(times), 2)


def wait_for_quiet(max_busy: float, wait: float) -> dict[str, Any]:
    """Wait (at most ``wait`` seconds) until other processes keep at most ``max_busy`` cores busy; then this
    machine's speed (:func:`speed_ms`)."""
    t0 = time.time()
    busy = busy_cores()
    while busy > max_busy and time.time() - t0 < wait:
        time.sleep(10)
        busy = busy_cores()
    return {"load_before": _load(), "busy_before": busy, "waited_s": round(time.time() - t0, 1),
            "speed_ms": speed_ms()}


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 7200) -> subprocess.CompletedProcess:
    print("$ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    proc = subprocess.run([str(c) for c in cmd], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {proc.stderr.strip()[-3000:]}")
    return proc


def _run_timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmd``; ``(wall seconds, CPU seconds of the whole job)`` (every process: ``wait4``)."""
    print("$ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {err.strip()[-3000:]}")
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, ru.ru_utime + ru.ru_stime


def _env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["MALLOC_MMAP_THRESHOLD_"] = "1048576"
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.pop("HPC_GRAPH_MEMORY_LIMIT", None)
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)
        if threads is not None:
            env[var] = str(threads)
    return env


# -- data and configs ------------------------------------------------------------------------------
def part_dir(work: Path, scale: int, parts: int) -> Path:
    """The METIS partition of the scale-``scale`` graph into ``parts`` parts."""
    return work / f"rmat-s{scale}-p{parts}"


def prepare(work: Path, scale: int, ranks: list[int]) -> dict[int, Path]:
    src = work / f"rmat-s{scale}.h5"
    if not src.exists():
        _run(_cli() + ["-q", "generate", "rmat", "-o", src, "--scale", scale, "--edge-factor", 16, "--feat-dim", 128,
                       "--num-classes", 16], _env(None))
    out = {}
    for p in ranks:
        d = part_dir(work, scale, p)
        if not (d / "partition.json").exists():
            _run(_cli() + ["-q", "partition", src, "-o", d, "-n", p, "--method", "metis", "--force"], _env(None))
        out[p] = d
    return out


def write_config(work: Path, model: str, epochs: int) -> Path:
    path = work / f"bench_plan_{model}.yaml"
    text = (f"# written by benchmarks/bench_plan.py\n"
            f"data: {{path: PLACEHOLDER, feature_norm: none}}\n"
            f"engine: {{name: dp, prefetch: true}}\n"
            f"model: {{name: {model}, hidden: {HIDDEN[model]}, num_layers: {LAYERS}, heads: {HEADS}, out_heads: 1, "
            f"dropout: 0.5, attn_dropout: 0.0}}\n"
            f"optim: {{name: adam, lr: 0.01, weight_decay: 0.0}}\n"
            f"train: {{epochs: {epochs}, seed: 0, eval_every: {epochs}, progress: false}}\n")
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


# -- one configuration -----------------------------------------------------------------------------
def plan(cfg: Path, data: Path, ranks: int, engines: list[str], floor_mb: float, work: Path, out: Path,
         args: argparse.Namespace) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    (variant,) = engines
    name, sets = _engine_args(variant)
    cmd = _cli() + ["-q", "plan", "--config", cfg, "--data", data, "--engines", name, "--ranks", ranks,
                    "--floor", f"{floor_mb:.1f}MiB", "--json", out] + sets
    if ranks > 1:
        cmd += ["--profile", work / f"links-{ranks}.json"]
    quiet = wait_for_quiet(args.max_busy, args.wait)
    t0 = time.perf_counter()
    _run(cmd, _env(None))
    quiet["plan_seconds"] = round(time.perf_counter() - t0, 1)
    return json.loads(out.read_text()), [str(c) for c in cmd], quiet


def train(cfg: Path, data: Path, ranks: int, engine: str, run_dir: Path, args: argparse.Namespace
          ) -> tuple[dict[str, Any], list[str]]:
    threads = max(1, args.cores // ranks)
    cmd = (["mpiexec", "-n", ranks] if ranks > 1 else []) + _cli() + [
        "-q", "train", "--config", cfg, "--set", f"data.path={data}", *_engine_args(engine)[1],
        "--run-dir", run_dir]
    quiet = wait_for_quiet(args.max_busy, args.wait)
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, cpu_total = _run_timed(cmd, _env(threads))
    cpu = cpu_total - (before.ru_utime + before.ru_stime)
    from hpc_graph.train.metrics import read_metrics

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    epochs = sorted({r["epoch"] for r in rows})
    slowest = [max(r["epoch_seconds"] for r in rows if r["epoch"] == e) for e in epochs]
    later = slowest[1:] or slowest
    sent = {}
    for r in rows:
        if r["epoch"] == epochs[-1]:
            sent[r["rank"]] = r["bytes_sent"]
    env_text = f"OMP_NUM_THREADS={threads} NUMBA_NUM_THREADS={threads} OMP_WAIT_POLICY=PASSIVE " \
               "MALLOC_MMAP_THRESHOLD_=1048576"
    usable = min(args.cores, ranks * threads)
    return ({"peak_rss_mb": summary["peak_rss_mb"], "median_epoch_s": statistics.median(later),
             "epoch_seconds": slowest, "spread": max(later) / max(min(later), 1e-9), "wall_s": round(wall, 1),
             "cpu_s": round(cpu, 1), "cpu_share": round(cpu / max(wall * usable, 1e-9), 2),
             "bytes_sent": [sent.get(r) for r in range(ranks)], **quiet, "load_after": _load(),
             "speed_after_ms": speed_ms(), "threads": threads}, [env_text] + [str(c) for c in cmd])


def one(args: argparse.Namespace, work: Path, scale: int, model: str, ranks: int, data: Path, floor_mb: float,
        rnd: int = 0) -> list[dict[str, Any]]:
    cfg = write_config(work, model, args.epochs)
    out = []
    for engine in args.engines:
        if engine == "flow" and ranks > LAYERS:
            continue  # a stage needs a layer
        data = _data(work, scale, ranks, engine)
        best = None
        tries = []
        for attempt in range(1 + args.repeat_noisy):
            pj = work / f"plan-s{scale}-{model}-{engine}-{ranks}.json"
            planned, plan_cmd, plan_quiet = plan(cfg, data, ranks, [engine], floor_mb, work, pj, args)
            pred = planned["predictions"][0]
            run_dir = work / "runs" / f"s{scale}-{model}-{engine}-{ranks}-{attempt}" / f"round{rnd}"
            measured, train_cmd = train(cfg, data, ranks, engine, run_dir, args)
            rec = {"scale": scale, "model": model, "engine": engine, "ranks": ranks, "predicted": _predicted(pred),
                   "measured": measured, "plan_command": plan_cmd, "train_command": train_cmd,
                   "plan_load": plan_quiet, "floor_mb": floor_mb, "attempt": attempt, "round": rnd,
                   "assumptions": planned["assumptions"]}
            _errors(rec)
            tries.append({"attempt": attempt, "median_epoch_s": measured["median_epoch_s"],
                          "spread": measured["spread"], "load_before": measured["load_before"],
                          "busy_before": measured["busy_before"], "cpu_share": measured["cpu_share"],
                          "err_time": rec["err_time"]})
            if measured["spread"] <= args.noise_limit and measured["cpu_share"] >= args.min_cpu_share:
                best = rec
                break
            if best is None or measured["spread"] < best["measured"]["spread"]:
                best = rec
        best["tries"] = tries
        print(_line(best), flush=True)
        out.append(best)
    return out


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from the rounds of one configuration: the first round's record with the median of the
    rounds' predicted epochs against the median of their measured ones (memory and bytes: every round's
    worst), each round's own numbers kept under ``rounds``."""
    rounds = sorted(rounds, key=lambda r: r.get("round", 0))
    if len(rounds) == 1:
        return rounds[0]
    rec = dict(rounds[0])
    rec["predicted"] = {**rec["predicted"], "epoch_s": statistics.median(r["predicted"]["epoch_s"] for r in rounds)}
    rec["measured"] = {**rec["measured"],
                       "median_epoch_s": statistics.median(r["measured"]["median_epoch_s"] for r in rounds)}
    rec["rounds"] = [{"round": r.get("round", 0), "predicted_epoch_s": r["predicted"]["epoch_s"],
                      "measured_epoch_s": r["measured"]["median_epoch_s"], "err_time": r["err_time"],
                      "err_mem": r["err_mem"], "bytes_equal": r["bytes_equal"], "speed_ratio": speed_ratio(r),
                      "plan_seconds": r["plan_load"].get("plan_seconds")} for r in rounds]
    _errors(rec)
    rec["err_mem"] = [max(es, key=abs) for es in zip(*(r["err_mem"] for r in rounds))]
    if rec["bytes_equal"] is not None:
        rec["bytes_equal"] = all(r["bytes_equal"] for r in rounds)
    return rec


def _predicted(pred: dict[str, Any]) -> dict[str, Any]:
    """The record's ``predicted`` part from one prediction of ``plan --json``."""
    return {"peak_mb": [p / MB for p in pred["rank_peaks"]], "peak_where": pred["memory"]["where"],
            "components_mb": {k: v / MB for k, v in pred["memory"]["components"].items()},
            "epoch_s": pred["time"]["epoch_seconds"], "terms": pred["time"]["terms"],
            "halo_s": pred["time"]["halo"], "allreduce_s": pred["time"]["allreduce"],
            "bytes_sent": pred["rank_bytes_sent"], "rank_seconds": pred["rank_seconds"]}


def _floor(work: Path, model: str, args: argparse.Namespace) -> float:
    """The process floor of ``model`` in MiB (what ``plan`` measures), measured twice, the second kept: in a fresh
    checkout the first run compiles the kernels, and the compiler's memory shows in its peak (+56 MiB seen)."""
    sys.path.insert(0, str(ROOT))
    from hpc_graph.commands.plan import measure_floor
    from hpc_graph.train.config import load_config

    cfg = load_config(write_config(work, model, args.epochs))
    measure_floor(cfg)
    return measure_floor(cfg)[0] / MB


def replan(args: argparse.Namespace, work: Path, records: list[dict[str, Any]], save: Callable[[], None]) -> None:
    """``--replan``: make the plan of every finished run of the selected configurations again (after a change
    of the planner), on a quiet machine, and put it in place of the old one, which stays under
    ``predicted_first``; the measured run is kept as it is. ``--refloor``: measure the process floor again
    first (the record's old floor stays under ``floor_mb_first``)."""
    floors: dict[str, float] = {}
    for r in records:
        if (r["scale"] not in args.scales or r["model"] not in args.models or r["engine"] not in args.engines
                or r["ranks"] not in args.ranks):
            continue
        scale, model, engine, ranks = r["scale"], r["model"], r["engine"], r["ranks"]
        cfg = write_config(work, model, args.epochs)
        if args.refloor:
            if model not in floors:
                floors[model] = _floor(work, model, args)
            r.setdefault("floor_mb_first", r["floor_mb"])
            r["floor_mb"] = floors[model]
        data = _data(work, scale, ranks, engine)
        pj = work / f"replan-s{scale}-{model}-{engine}-{ranks}.json"
        planned, cmd, quiet = plan(cfg, data, ranks, [engine], r["floor_mb"], work, pj, args)
        r.setdefault("predicted_first", r["predicted"])
        r.update(predicted=_predicted(planned["predictions"][0]), plan_command=cmd, plan_load=quiet,
                 assumptions=planned["assumptions"], replanned=True)
        _errors(r)
        print(_line(r), flush=True)
        save()


def _errors(rec: dict[str, Any]) -> None:
    pm, mm = rec["predicted"]["peak_mb"], rec["measured"]["peak_rss_mb"]
    rec["err_mem"] = [(p - m) / m for p, m in zip(pm, mm)]
    rec["err_mem_max"] = (max(pm) - max(mm)) / max(mm)
    rec["err_time"] = ((rec["predicted"]["epoch_s"] - rec["measured"]["median_epoch_s"])
                       / rec["measured"]["median_epoch_s"])
    bs = rec["measured"]["bytes_sent"]
    rec["bytes_equal"] = all(b is not None and int(round(p)) == int(b)
                             for p, b in zip(rec["predicted"]["bytes_sent"], bs)) if rec["ranks"] > 1 else None


def speed_ratio(r: dict[str, Any]) -> float | None:
    """How much slower the machine ran the reference workload around the run than before the plan (the mean
    of the run's before and after over the plan's; > 1: slower during the run). None for records without it."""
    m, p = r["measured"], r.get("plan_load", {})
    if "speed_ms" not in p or "speed_ms" not in m:
        return None
    return 0.5 * (m["speed_ms"] + m.get("speed_after_ms", m["speed_ms"])) / max(p["speed_ms"], 1e-9)


def _line(r: dict[str, Any]) -> str:
    ratio = speed_ratio(r)
    return (f"s{r['scale']} {r['model']:4s} {r['engine']:11s} P={r['ranks']}: peak/rank predicted "
            f"{max(r['predicted']['peak_mb']):7.0f} MiB measured {max(r['measured']['peak_rss_mb']):7.0f} MiB "
            f"({r['err_mem_max']:+.1%}; worst rank {max(r['err_mem'], key=abs):+.1%}); epoch predicted "
            f"{r['predicted']['epoch_s']:.3f} s measured {r['measured']['median_epoch_s']:.3f} s "
            f"({r['err_time']:+.1%}); bytes {'equal' if r['bytes_equal'] else r['bytes_equal']}; "
            f"busy before {r['measured']['busy_before']}, "
            f"cpu share {r['measured']['cpu_share']}"
            + (f"; machine x{ratio:.2f} slower in the run than in the plan" if ratio is not None else ""))


# -- ogbn-papers100M -------------------------------------------------------------------------------
def papers100m(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    cfg = work / "bench_plan_papers100m.yaml"
    cfg.write_text("# SAR's ogbn-papers100M GraphSAGE (3 layers, hidden 256), written by benchmarks/bench_plan.py\n"
                   "engine: {name: sar, prefetch: true}\n"
                   "model: {name: sage, hidden: 256, num_layers: 3, dropout: 0.5}\n"
                   "optim: {name: adam, lr: 0.01}\ntrain: {dtype: float32}\n")
    out = []
    for edges, what in ((1_615_685_872, "1.6B edges (OGB's count, one direction)"),
                        (3_231_371_744, "3.2B edges (symmetrised, as SAR trains it)")):
        for cut in ("0.3", "0.5"):
            pj = work / f"plan-papers100m-{edges}-{cut}.json"
            cmd = _cli() + ["-q", "plan", "--config", cfg, "--engines", "all", "--nodes", PAPERS["nodes"], "--edges",
                            edges, "--features", PAPERS["features"], "--classes", PAPERS["classes"],
                            "--train-fraction", PAPERS["train_fraction"], "--cut-fraction", cut,
                            "--memory-per-rank", "192GB", "--ranks", "1-256", "--floor", f"{args.papers_floor_mb}MiB",
                            "--rates", "synthetic", "--cores-per-node", "72", "--ranks-per-node", "1",
                            "--link-bandwidth", "200Gb/s", "--link-latency", "2us", "--json", pj]
            proc = _run(cmd, _env(None))
            plan_json = json.loads(pj.read_text())
            print(proc.stdout)
            out.append({"edges": edges, "what": what, "cut": float(cut), "command": [str(c) for c in cmd],
                        "smallest_fitting": plan_json["smallest_fitting"], "stdout": proc.stdout,
                        "predictions": [{"engine": p["engine"], "ranks": p["ranks"],
                                         "peak_gb": p["memory"]["peak"] / 1e9,
                                         "components_gb": {k: v / 1e9 for k, v in p["memory"]["components"].items()},
                                         "epoch_s": (p.get("time") or {}).get("epoch_seconds"),
                                         "bottleneck": p["bottleneck"]} for p in plan_json["predictions"]]})
    return out


# -- reporting -------------------------------------------------------------------------------------
def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.8))
    marks = {"gcn": "o", "sage": "s", "gat": "^"}
    colours = {"dp": "tab:blue", "sar": "tab:orange", "single": "tab:green", "sylvie": "tab:red",
               "sylvie-pipe": "tab:purple", "flow": "tab:brown"}
    for r in records:
        for p, m in zip(r["predicted"]["peak_mb"], r["measured"]["peak_rss_mb"]):
            ax1.scatter(m, p, marker=marks[r["model"]], color=colours[r["engine"]], s=22, alpha=0.8)
        ax2.scatter(r["measured"]["median_epoch_s"], r["predicted"]["epoch_s"], marker=marks[r["model"]],
                    color=colours[r["engine"]], s=30, alpha=0.8)
    for ax, band, unit in ((ax1, 0.15, "peak RSS per rank (MiB)"), (ax2, 0.25, "epoch time (s)")):
        lo, hi = ax.get_xlim()
        lo2, hi2 = ax.get_ylim()
        a, b = min(lo, lo2), max(hi, hi2)
        xs = [a, b]
        ax.plot(xs, xs, "k-", lw=1)
        ax.plot(xs, [x * (1 + band) for x in xs], "k--", lw=0.7)
        ax.plot(xs, [x * (1 - band) for x in xs], "k--", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_title(f"{unit.split(' (')[0]} (dashed: +-{band:.0%})")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=m, ls="", color="grey", label=k) for k, m in marks.items()] + \
        [Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in colours.items()
         if any(r["engine"] == k for r in records)]
    ax1.legend(handles=handles, fontsize=8, loc="upper left")
    fig.suptitle("hpc-graph plan vs measured runs (R-MAT, 1/2/4 ranks, every rank's peak; slowest rank's epoch)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(records: list[dict[str, Any]]) -> str:
    rounds = any("rounds" in r for r in records)
    lines = ["| scale | model | engine | ranks | peak/rank predicted (MiB) | measured (MiB) | error (worst rank) "
             "| epoch predicted (s) | measured (s) | error | busy before | machine run / plan |"
             + (" rounds: predicted / measured (error) |" if rounds else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if rounds else "")]
    for r in sorted(records, key=lambda r: (r["scale"], r["model"], r["engine"], r["ranks"])):
        worst, ratio = max(r["err_mem"], key=abs), speed_ratio(r)
        lines.append(f"| {r['scale']} | {r['model']} | {r['engine']} | {r['ranks']} | "
                     f"{' / '.join(f'{p:.0f}' for p in r['predicted']['peak_mb'])} | "
                     f"{' / '.join(f'{m:.0f}' for m in r['measured']['peak_rss_mb'])} | {worst:+.1%} | "
                     f"{r['predicted']['epoch_s']:.2f} | {r['measured']['median_epoch_s']:.2f} | "
                     f"{r['err_time']:+.1%} | "
                     f"{r['measured']['busy_before']} | "
                     + (f"{ratio:.2f} |" if ratio is not None else "- |")
                     + (" " + ", ".join(f"{x['predicted_epoch_s']:.2f} / {x['measured_epoch_s']:.2f} "
                                        f"({x['err_time']:+.0%})"
                                        for x in r.get("rounds", [])) + " |" if rounds else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[16, 18])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--models", nargs="+", default=["gcn", "sage", "gat"], choices=sorted(HIDDEN))
    ap.add_argument("--engines", nargs="+", default=["dp", "sar"], choices=sorted(ENGINES))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--max-busy", type=float, default=0.15,
                    help="before a plan or a run, wait until other processes keep at most this many cores busy")
    ap.add_argument("--min-cpu-share", type=float, default=0.55,
                    help="a run whose job got less of its cores (CPU over wall seconds) was disturbed: repeat")
    ap.add_argument("--wait", type=float, default=900.0, help="longest wait for a quiet machine (s)")
    ap.add_argument("--noise-limit", type=float, default=1.5, help="epochs 2..E max/min above this: repeat")
    ap.add_argument("--repeat-noisy", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every configuration this many times, in rounds; compare the medians")
    ap.add_argument("--workdir", default=str(ROOT / "results" / "bench_plan_work"))
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_plan.json"))
    ap.add_argument("--plot", default=None, metavar="PNG")
    ap.add_argument("--skip-done", action="store_true", help="keep finished configurations of --out")
    ap.add_argument("--papers100m", action="store_true", help="also plan ogbn-papers100M at 192 GB per rank")
    ap.add_argument("--papers-floor-mb", type=float, default=480.0)
    ap.add_argument("--report-only", action="store_true", help="table and plot from --out, nothing run")
    ap.add_argument("--refloor", action="store_true", help="with --replan: measure the process floors again")
    ap.add_argument("--replan", action="store_true",
                    help="re-make the plans of the finished runs in --out (selected by --scales/--models/--engines/"
                         "--ranks) with the planner as it is now; the runs are not repeated")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out)
    doc = json.loads(out_path.read_text()) if out_path.exists() else {"records": [], "papers100m": None}
    records = doc["records"]
    if args.replan:
        def save() -> None:
            out_path.write_text(json.dumps(doc, indent=1))

        replan(args, work, records, save)
    elif not args.report_only:
        floors: dict[str, float] = {}
        raw = doc.setdefault("round_records", [])

        def key(r: dict[str, Any]) -> tuple:
            return r["scale"], r["model"], r["engine"], r["ranks"]

        finished = {key(r) for r in records}  # --skip-done: configurations of --out before this run, every round
        for scale in args.scales:
            parts = prepare(work, scale, args.ranks)
            for rnd in range(args.rounds):
                for model in args.models:
                    if model not in floors:
                        wait_for_quiet(args.max_busy, args.wait)
                        floors[model] = _floor(work, model, args)
                        print(f"floor {model}: {floors[model]:.0f} MiB", flush=True)
                    for P in args.ranks:
                        if P > 1 and not (work / f"links-{P}.json").exists():
                            cfg = write_config(work, model, args.epochs)
                            wait_for_quiet(args.max_busy, args.wait)
                            _run(["mpiexec", "-n", P] + _cli()
                                 + ["-q", "plan", "--config", cfg, "--data", parts[P], "--engines", "dp",
                                    "--ranks", P, "--rates", "synthetic", "--calibration", "none", "--floor", "1GiB",
                                    "--profile", work / f"links-{P}.json"],
                                 _env(None))
                        keys = {(scale, model, e, P) for e in args.engines}
                        if args.skip_done and keys <= finished:
                            continue
                        if args.rounds > 1:
                            print(f"round {rnd + 1}/{args.rounds}", flush=True)
                        new = one(args, work, scale, model, P, parts[P], floors[model], rnd)
                        done = {key(r) for r in new}
                        if rnd == 0:  # a configuration measured again replaces its earlier rounds
                            raw[:] = [r for r in raw if key(r) not in done]
                        raw.extend(new)
                        merged = [combine([r for r in raw if key(r) == k]) for k in sorted(done)]
                        records = [r for r in records if key(r) not in done] + merged
                        doc["records"] = records
                        out_path.write_text(json.dumps(doc, indent=1))
        if args.papers100m:
            doc["papers100m"] = papers100m(args, work)
            out_path.write_text(json.dumps(doc, indent=1))
    print(table(records))
    if records:
        mem = [abs(e) for r in records for e in r["err_mem"]]
        tim = [abs(r["err_time"]) for r in records]
        print(f"memory: {sum(e <= 0.15 for e in mem)}/{len(mem)} rank peaks within 15 % (worst {max(mem):.1%}); "
              f"time: {sum(e <= 0.25 for e in tim)}/{len(tim)} epochs within 25 % (worst {max(tim):.1%}); "
              f"bytes sent equal: {sum(1 for r in records if r['bytes_equal'])}/"
              f"{sum(1 for r in records if r['bytes_equal'] is not None)}")
        single = [abs(x["err_time"]) for r in records for x in r.get("rounds", [])]
        if single:
            print(f"rounds: medians of {len(single) / len(records):.3g} rounds per configuration above; single "
                  f"rounds: {sum(e <= 0.25 for e in single)}/{len(single)} epochs within 25 % "
                  f"(median {statistics.median(single):.1%}, worst {max(single):.1%})")
            # the error a perfect planner would show against single runs: one round's measured epoch taken as
            # the prediction of another round's, same configuration
            rerun = [abs(a["measured_epoch_s"] - b["measured_epoch_s"]) / b["measured_epoch_s"]
                     for r in records for a in r.get("rounds", []) for b in r.get("rounds", []) if a is not b]
            if rerun:
                print(f"the runs' own reproducibility (one round's measured epoch as the prediction of another's): "
                      f"{sum(e <= 0.25 for e in rerun)}/{len(rerun)} within 25 % "
                      f"(median {statistics.median(rerun):.1%}, worst {max(rerun):.1%})")
    if args.plot and records:
        plot(records, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
