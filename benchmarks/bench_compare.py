"""Benchmark guard: the current tree against an older commit on fixed training configs, interleaved.

    python benchmarks/bench_compare.py --baseline 468238b --out results/bench_compare.json
    python benchmarks/bench_compare.py --baseline 468238b --cases minibatch single sar --rounds 5
    python benchmarks/bench_compare.py --baseline . --set-baseline train.malloc_mmap_threshold=1048576 \\
           --cases minibatch apt                 # the same tree twice, one setting changed on one side

For reviewers of performance-sensitive changes: run it before merging and read the ratio beside the
spread. ``--baseline REV`` is checked out once into a git worktree under ``--workdir`` (``.``: this tree
again). Each round runs every case once on each side, the two sides in alternating order (a slow spell of
the machine hits both), and a side's number is the median over its rounds of one run's median epoch time
(epochs 2 and later, the slowest rank of each epoch; epoch 1 compiles kernels and warms caches).

Cases (``--cases``; default ``minibatch single``: one sampled and one full-graph run):

* ``minibatch``: 1 process, R-MAT (``--scale``, default 18), 3-layer SAGE hidden 256, fan-outs 15/10/5
  (seed hop first), batch 1024, every training node each epoch, 3 epochs;
* ``single``: 1 process, the same graph and model, full graph, 6 epochs;
* ``apt``: 2 ranks (METIS parts), the ``minibatch`` model and sampling, strategy GDP, batch 512 per rank;
* ``dp``, ``sar``: 2 ranks (METIS parts), the ``single`` model, 6 epochs;
* ``flow``: 2 ranks (2 stages), R-MAT ``--scale`` - 2, residual GCN of 8 layers hidden 128 with batch norm,
  4 micro-batches, cross edges exact, 4 epochs;
* ``seqpar``: 2 ranks, R-MAT ``--scale`` - 4, Graphormer 4 layers x 64 x 8 heads, sparse attention, 3 epochs.

Every case runs without dropout (``--set model.dropout=0.5`` turns it on for both sides), with the machine's
CPUs shared by the ranks (``--cores``). The data are generated once by the current tree under ``--workdir``.
Printed and written (``--out``, JSON): per case each side's median epoch, the ratio baseline / current
(> 1: the current tree is faster), each side's spread over its rounds ((max - min) / median), and the
largest peak RSS of a rank. A ratio inside the spreads is no difference.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "OMP_WAIT_POLICY", "HPC_GRAPH_EXPORTED_THREADS")

_SAGE = {"model.name": "sage", "model.hidden": 256, "model.num_layers": 3, "model.dropout": 0.0,
         "optim.lr": 0.003}
_SAMPLED = {**_SAGE, "sampler.fanouts": "[15,10,5]"}
# name: (ranks, data (scale offset, partitioned), epochs, settings)
CASES = {
    "minibatch": (1, (0, False), 3, {**_SAMPLED, "engine.name": "minibatch", "sampler.batch_size": 1024}),
    "single": (1, (0, False), 6, {**_SAGE, "engine.name": "single"}),
    "apt": (2, (0, True), 3, {**_SAMPLED, "engine.name": "apt", "engine.strategy": "gdp",
                              "sampler.batch_size": 512}),
    "dp": (2, (0, True), 6, {**_SAGE, "engine.name": "dp"}),
    "sar": (2, (0, True), 6, {**_SAGE, "engine.name": "sar"}),
    "flow": (2, (-2, False), 4, {"engine.name": "flow", "engine.microbatches": 4, "engine.cross_edges": "exact",
                                 "model.name": "gcn", "model.hidden": 128, "model.num_layers": 8,
                                 "model.residual": "true", "model.batchnorm": "true", "model.dropout": 0.0}),
    "seqpar": (2, (-4, False), 3, {"engine.name": "seqpar", "model.name": "graphormer", "model.hidden": 64,
                                   "model.num_layers": 4, "model.heads": 8, "model.attention": "sparse",
                                   "model.dropout": 0.0, "optim.weight_decay": 0.0}),
}


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = str(tree)
    return env


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def checkout(rev: str, work: Path) -> tuple[Path, str]:
    """The tree of ``rev`` (a worktree under ``work``; ``.``: this repository) and its commit id."""
    if rev == ".":
        sha = _run(["git", "rev-parse", "HEAD"], cwd=REPO).stdout.strip()
        dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO).stdout.strip())
        return REPO, sha + ("+changes" if dirty else "")
    proc = _run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"--baseline: {rev!r} is not a commit of {REPO} ({proc.stderr.strip()})")
    sha = proc.stdout.strip()
    tree = work / f"tree-{sha[:12]}"
    if not (tree / "hpc_graph").is_dir():
        shutil.rmtree(tree, ignore_errors=True)
        _run(["git", "worktree", "prune"], cwd=REPO)
        proc = _run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO)
        if proc.returncode:
            raise SystemExit(f"--baseline: git worktree add {tree} {sha} failed: {proc.stderr.strip()}")
    return tree, sha


def prepare(work: Path, scale: int, ranks: int, partitioned: bool) -> Path:
    """R-MAT of ``scale`` (generated once by this tree), or its METIS parts for ``ranks`` ranks."""
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"rmat-s{scale}.h5"
    hpc = [sys.executable, "-m", "hpc_graph.cli", "-q"]
    if not data.exists():
        print(f"[bench_compare] generating {data}", flush=True)
        subprocess.run(hpc + ["generate", "rmat", "--scale", str(scale), "-o", str(data)], check=True,
                       env=_env(REPO), stdout=subprocess.DEVNULL)
    if not partitioned:
        return data
    parts = work / f"rmat-s{scale}-metis{ranks}"
    if not (parts / "partition.json").exists():
        print(f"[bench_compare] partitioning {data} into {ranks}", flush=True)
        subprocess.run(hpc + ["partition", str(data), "-o", str(parts), "-n", str(ranks), "--method", "metis"],
                       check=True, env=_env(REPO), stdout=subprocess.DEVNULL)
    return parts


def run_case(tree: Path, case: str, data: Path, cores: int, sets: dict[str, str], work: Path) -> dict:
    """One training run of ``case`` with the code of ``tree``: its epoch times and peak RSS."""
    ranks, _, epochs, base = CASES[case]
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{case}-", dir=work))
    settings = {**base, "data.path": str(data), "train.epochs": epochs, "train.eval_every": 1000,
                "train.progress": "false", **sets}
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", os.devnull, "--run-dir", str(run_dir),
           "--threads", str(max(1, cores // ranks))]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    if ranks > 1:
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks)] + cmd
    t0 = time.perf_counter()
    proc = _run(cmd, env=_env(tree), cwd=tree, timeout=3600)
    rec = {"command": " ".join(cmd), "wall_seconds": time.perf_counter() - t0}
    if proc.returncode:
        rec["error"] = proc.stderr[-3000:]
        shutil.rmtree(run_dir, ignore_errors=True)
        return rec
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    by_epoch: dict[int, float] = {}
    for r in rows:
        by_epoch[r["epoch"]] = max(by_epoch.get(r["epoch"], 0.0), r["epoch_seconds"])
    later = [by_epoch[e] for e in sorted(by_epoch) if e >= 2] or list(by_epoch.values())
    rec.update({"epoch_seconds": [by_epoch[e] for e in sorted(by_epoch)], "median_epoch_seconds":
                statistics.median(later), "peak_rss_mb": max(summary["peak_rss_mb"]),
                "malloc": summary.get("malloc_per_rank")})
    return rec


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def summarise(records: dict) -> dict:
    out = {}
    for case, sides in records.items():
        row = {}
        for side in ("current", "baseline"):
            ok = [r for r in sides[side] if "error" not in r]
            if ok:
                med = [r["median_epoch_seconds"] for r in ok]
                row[side] = {"median_epoch_seconds": statistics.median(med), "spread": _spread(med),
                             "runs": len(ok), "peak_rss_mb": max(r["peak_rss_mb"] for r in ok)}
        if "current" in row and "baseline" in row:
            row["ratio"] = row["baseline"]["median_epoch_seconds"] / row["current"]["median_epoch_seconds"]
        out[case] = row
    return out


def report(summary: dict) -> str:
    lines = ["| case | current s/epoch (spread) | baseline s/epoch (spread) | baseline / current | peak RSS MB: "
             "current / baseline |", "|---|---|---|---|---|"]

    def cell(s):
        return f"{s['median_epoch_seconds']:.2f} ({100 * s['spread']:.0f} %, {s['runs']} runs)" if s else "failed"

    for case, row in summary.items():
        c, b = row.get("current"), row.get("baseline")
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        rss = f"{c['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f}" if c and b else ""
        lines.append(f"| {case} | {cell(c)} | {cell(b)} | {ratio} | {rss} |")
    return "\n".join(lines)


def _settings(pairs: list[str], option: str) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise SystemExit(f"{option}: expected KEY=VALUE, got {p!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="commit to compare with (any git revision; '.': this tree)")
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["minibatch", "single"])
    ap.add_argument("--rounds", type=int, default=3, help="runs per case and side (default 3)")
    ap.add_argument("--scale", type=int, default=18, help="R-MAT scale of the minibatch/single/apt/dp/sar graph")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="CPU threads shared by a run's ranks")
    ap.add_argument("--set", dest="both", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for both sides")
    ap.add_argument("--set-current", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--set-baseline", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--workdir", type=Path, default=REPO / "results" / "bench_compare_work")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_compare.json")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds: must be >= 1")
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    both = _settings(args.both, "--set")
    sides = {"current": (*checkout(".", work), {**both, **_settings(args.set_current, "--set-current")}),
             "baseline": (*checkout(args.baseline, work), {**both, **_settings(args.set_baseline, "--set-baseline")})}
    data = {}
    for case in args.cases:
        ranks, (offset, partitioned), _, _ = CASES[case]
        data[case] = prepare(work, args.scale + offset, ranks, partitioned)
    res = {"baseline": sides["baseline"][1], "current": sides["current"][1], "cases": args.cases,
           "rounds": args.rounds, "scale": args.scale, "cores": args.cores,
           "settings": {s: v[2] for s, v in sides.items()}, "load_before": os.getloadavg(),
           "records": {c: {"current": [], "baseline": []} for c in args.cases}}
    for rnd in range(args.rounds):
        order = ("current", "baseline") if rnd % 2 == 0 else ("baseline", "current")
        for case in args.cases:
            for side in order:
                tree, _, sets = sides[side]
                rec = run_case(tree, case, data[case], args.cores, sets, work)
                rec["load"] = os.getloadavg()
                res["records"][case][side].append(rec)
                print(f"[bench_compare] round {rnd + 1}/{args.rounds} {case:9} {side:8} "
                      + (f"FAILED: {rec['error'][-400:]}" if "error" in rec else
                         f"{rec['median_epoch_seconds']:.2f} s/epoch, peak {rec['peak_rss_mb']:.0f} MB"),
                      flush=True)
                res["summary"] = summarise(res["records"])
                args.out.parent.mkdir(parents=True, exist_ok=True)
                tmp = args.out.with_suffix(".tmp")
                tmp.write_text(json.dumps(res, indent=1) + "\n")
                tmp.replace(args.out)
    res["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"baseline {res['baseline'][:12]} {sides['baseline'][2] or ''} against current {res['current'][:12]} "
          f"{sides['current'][2] or ''}")
    print(report(res["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
