"""Benchmark: the ``seqpar`` engine's per-rank memory and epoch time against one process (graph transformers).

    python benchmarks/bench_seqpar.py --data results/bench_training_work/rmat-s18-f128.h5 --ranks 1 2 4 \\
           --model graphormer --epochs 3 --out results/bench_seqpar.json

Runs ``hpc-graph train`` (``mpiexec -n R``; ``single`` for R = 1, ``seqpar`` otherwise) with the model at
TorchGT's sizes (``graphormer``: GPH_slim, 4 layers x 64 x 8 heads; ``gt``: 4 x 128 x 8), sparse
attention, no dropout, ``--cores`` CPU threads shared by the ranks, and reports from each run's
``summary.json`` the median epoch time and every rank's peak RSS (the largest one is compared
with the one-process run).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"graphormer": (64, 4, 8), "gt": (128, 4, 8)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="dataset file (hpc-graph generate ...)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--model", choices=sorted(SIZES), default="graphormer")
    ap.add_argument("--attention", default="sparse")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_seqpar_work")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_seqpar.json")
    args = ap.parse_args(argv)
    hidden, layers, heads = SIZES[args.model]
    recs = []
    for r in args.ranks:
        run_dir = args.workdir / f"{args.model}-n{r}"
        threads = max(1, args.cores // r)
        sets = [f"data.path={args.data}", f"engine.name={'single' if r == 1 else 'seqpar'}",
                f"model.name={args.model}", f"model.hidden={hidden}", f"model.num_layers={layers}",
                f"model.heads={heads}", "model.dropout=0.0", f"model.attention={args.attention}",
                f"train.epochs={args.epochs}", "train.progress=false", "train.eval_every=1000000",
                f"train.run_dir={run_dir}", f"train.threads={threads}", "optim.weight_decay=0.0"]
        if args.model == "gt":
            sets.append("model.pe_dim=0")
        cmd = ["mpiexec", "-n", str(r), sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config",
               str(ROOT / "configs" / "single_graphormer.yaml")]
        for s in sets:
            cmd += ["--set", s]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
        print(f"[bench_seqpar] {r} rank(s): {' '.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], flush=True)
            recs.append({"ranks": r, "status": "failed", "stderr": proc.stderr[-2000:]})
            continue
        summ = json.loads((run_dir / "summary.json").read_text())
        peaks = summ["peak_rss_mb"]
        rec = {"ranks": r, "status": "ok", "model": args.model, "median_epoch_s": summ["median_epoch_seconds"],
               "peak_rss_mb_per_rank": peaks, "max_peak_rss_mb": max(peaks),
               "bytes_per_epoch_per_rank": summ.get("bytes_per_epoch_per_rank")}
        recs.append(rec)
        print(f"  epoch {rec['median_epoch_s']:.2f} s, peak RSS per rank {[round(p) for p in peaks]} MiB", flush=True)
    one = next((x for x in recs if x.get("ranks") == 1 and x["status"] == "ok"), None)
    for x in recs:
        if one and x["status"] == "ok":
            x["peak_ratio_vs_one"] = x["max_peak_rss_mb"] / one["max_peak_rss_mb"]
            print(f"{x['ranks']} ranks: max per-rank peak {x['peak_ratio_vs_one']:.2f}x one process's")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
