"""Benchmark: graph-level accuracy on REG3-CC and PATH-SPD (graph transformers vs message passing), several seeds.

    python benchmarks/bench_graph_tasks.py --seeds 0 1 2 3 4 --out results/bench_graph_tasks.json

For every seed: generates the dataset with that seed (``hpc-graph generate reg3cc|pathspd``, 2000 graphs,
default sizes; Laplacian PE with k = 8 for REG3-CC), trains each configured run from its example
config (``configs/single_*_{reg3cc,pathspd}.yaml``, the training seed = the data seed) and reports the
test accuracy at the best validation epoch. Runs:

* ``graphormer-spd`` REG3-CC: Graphormer, dense attention inside each graph, SPD bias (max_spd 6), 60 epochs;
* ``gt-lappe`` REG3-CC: GT with 8 Laplacian eigenvectors, sparse attention (edges + chain + token), 150 epochs;
* ``gcn`` REG3-CC: GCN + mean readout, no positional encodings (the leak check: must stay at chance);
* ``graphormer-spd`` PATH-SPD: Graphormer, dense attention, SPD bias (max_spd 8), 60 epochs.

``--ranks 1 2 4``: every run also on 2 and 4 ranks, ``mpiexec -n R`` with ``engine.name=dp`` (data
parallel over the batches of graphs: each rank trains on its share of every batch of 64, the same
batches as ``single``), reporting the median epoch time beside the accuracy.

Prints a Markdown table (mean +- std over seeds) and writes every run to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [  # (task, label, config, extra --set)
    ("reg3cc", "graphormer-spd", "single_graphormer_reg3cc.yaml", []),
    ("reg3cc", "gt-lappe", "single_gt_reg3cc.yaml", []),
    ("reg3cc", "gcn", "single_gcn.yaml", ["data.feature_norm=none", "model.dropout=0.0", "optim.lr=0.01",
                                          "train.epochs=100", "train.eval_every=5"]),
    ("pathspd", "graphormer-spd", "single_graphormer_pathspd.yaml", []),
]


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", *args], check=True, cwd=ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=None, help="override every run's train.epochs")
    ap.add_argument("--only", nargs="*", default=None, help="run labels 'task/label' to run (default: all)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1],
                    help="rank counts: 1 runs engine single, more run engine dp under mpiexec")
    ap.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_graph_tasks_work")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_graph_tasks.json")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    recs = []
    for seed in args.seeds:
        data = {"reg3cc": args.workdir / f"reg3cc-{seed}.h5", "pathspd": args.workdir / f"pathspd-{seed}.h5"}
        if not data["reg3cc"].exists():
            _cli("generate", "reg3cc", "-o", str(data["reg3cc"]), "--seed", str(seed))
            _cli("preprocess", "lap-pe", str(data["reg3cc"]), "--k", "8")
        if not data["pathspd"].exists():
            _cli("generate", "pathspd", "-o", str(data["pathspd"]), "--seed", str(seed))
        for (task, label, config, extra), ranks in ((r, p) for r in RUNS for p in args.ranks):
            if args.only and f"{task}/{label}" not in args.only:
                continue
            run_dir = args.workdir / f"{task}-{label}-{seed}" if ranks == 1 else \
                args.workdir / f"{task}-{label}-{seed}-p{ranks}"
            sets = [f"data.path={data[task]}", f"train.seed={seed}", f"train.run_dir={run_dir}",
                    "train.progress=false", *extra, *([] if ranks == 1 else ["engine.name=dp"])]
            if args.epochs:
                sets.append(f"train.epochs={args.epochs}")
            cmd = ([] if ranks == 1 else ["mpiexec", "-n", str(ranks)]) + \
                [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(ROOT / "configs" / config)]
            for s in sets:
                cmd += ["--set", s]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], flush=True)
                recs.append({"task": task, "run": label, "seed": seed, "ranks": ranks, "status": "failed"})
                continue
            summ = json.loads((run_dir / "summary.json").read_text())
            rec = {"task": task, "run": label, "seed": seed, "ranks": ranks, "test_acc": summ["test_acc"],
                   "best_val_acc": summ["best_val_acc"], "best_epoch": summ.get("best_epoch"),
                   "epochs": summ["epochs"], "median_epoch_s": summ.get("median_epoch_seconds"),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            recs.append(rec)
            print(f"[bench_graph_tasks] {task} {label} seed {seed} ranks {ranks}: test {rec['test_acc']:.4f} "
                  f"(val {rec['best_val_acc']:.4f}, epoch {rec['best_epoch']}), median epoch "
                  f"{rec['median_epoch_s']:.3f} s, {rec['wall_s']} s", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(recs, indent=1))
    print("\n| task | run | ranks | seeds | test accuracy (mean +- std) | min | median epoch (s) |")
    print("|---|---|---|---|---|---|---|")
    for (task, label, _, _), ranks in ((r, p) for r in RUNS for p in args.ranks):
        mine = [r for r in recs if r["task"] == task and r["run"] == label and r["ranks"] == ranks and "test_acc" in r]
        if mine:
            accs = [r["test_acc"] for r in mine]
            std = statistics.stdev(accs) if len(accs) > 1 else 0.0
            epoch = statistics.median(r["median_epoch_s"] for r in mine)
            print(f"| {task} | {label} | {ranks} | {len(accs)} | {statistics.fmean(accs):.4f} +- {std:.4f} | "
                  f"{min(accs):.4f} | {epoch:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
