"""Benchmark: the accuracy recipes on Cora: Correct & Smooth on top of a linear model and MLPs, and GCN
with and without label augmentation (docs/recipes.md).

    python -m hpc_graph.cli convert npz tests/data/cora.npz -o /tmp/bench_recipes/cora.h5
    python benchmarks/bench_recipes.py run --data /tmp/bench_recipes/cora.h5 --out results/bench_recipes.json
    python benchmarks/bench_recipes.py report results/bench_recipes.json

Every run is ``python -m hpc_graph.cli -q train --threads 1 --config configs/single_mlp.yaml --set ...``
(one process, engine ``single``; the exact command is in each record), with
``recipes.correct_smooth: true`` so that each run reports the accuracy of its
best-validation model before and after C&S; the numbers come from its
``summary.json``. Seeds 0..``--seeds``-1 (``train.seed``).

Splits:

* ``public``: the Planetoid public split of ``cora.npz`` (140 / 500 / 1000
  train / validation / test nodes);
* ``random``: the C&S paper's setting for Cora, a random 60 / 20 / 20 split of
  all nodes, drawn per seed (``numpy.random.default_rng(seed)``), written as a
  copy of the dataset file with new masks.

Settings (features divided by their row sum; Adam, lr 0.01, weight decay 5e-4,
200 epochs, evaluation every epoch; C&S with the config defaults: 50 + 50
steps, alpha 0.5 / 0.8, autoscale):

* ``linear``: ``model.name: mlp``, one layer (logistic regression), dropout 0.2, lr 0.2, weight
  decay 5e-5 (with lr 0.01 and dropout 0.5 the row-normalised features leave it underfitted after
  200 epochs: 33 % test accuracy on a random split, seed 0);
* ``mlp2``, ``mlp3``: ``mlp`` with 2 and 3 layers, hidden 64, dropout 0.5;
* ``gcn``: 2 GCN layers, hidden 16, dropout 0.5;
* ``gcn-la``: the same with ``recipes.label_aug: 0.5``.

Target: C&S on top of an MLP or linear model >= 0.85 test accuracy on Cora.
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "single_mlp.yaml"
SETTINGS = {
    "linear": ["model.name=mlp", "model.num_layers=1", "model.hidden=64", "model.dropout=0.2", "optim.lr=0.2",
               "optim.weight_decay=5e-5"],
    "mlp2": ["model.name=mlp", "model.num_layers=2", "model.hidden=64", "model.dropout=0.5"],
    "mlp3": ["model.name=mlp", "model.num_layers=3", "model.hidden=64", "model.dropout=0.5"],
    "gcn": ["model.name=gcn", "model.num_layers=2", "model.hidden=16", "model.dropout=0.5"],
    "gcn-la": ["model.name=gcn", "model.num_layers=2", "model.hidden=16", "model.dropout=0.5",
               "recipes.label_aug=0.5"],
}
SPLITS = ("public", "random")


def random_split(src: Path, dst: Path, seed: int, fractions=(0.6, 0.2, 0.2)) -> Path:
    """A copy of the dataset file ``src`` whose train/val/test masks are a random split of all nodes."""
    import h5py

    if dst.exists():
        return dst
    tmp = dst.with_suffix(".tmp.h5")
    shutil.copyfile(src, tmp)
    with h5py.File(tmp, "r+") as f:
        n = int(f["node/label"].shape[0])
        perm = np.random.default_rng(seed).permutation(n)
        a = int(round(fractions[0] * n))
        b = a + int(round(fractions[1] * n))
        for name, idx in (("train_mask", perm[:a]), ("val_mask", perm[a:b]), ("test_mask", perm[b:])):
            mask = np.zeros(n, dtype=bool)
            mask[idx] = True
            del f[f"node/{name}"]
            f.create_dataset(f"node/{name}", data=mask)
    os.replace(tmp, dst)
    return dst


def run_one(data: Path, setting: str, seed: int, work: Path, extra: list[str]) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{setting}-{seed}-", dir=work))
    sets = [f"data.path={data}", f"train.seed={seed}", f"train.run_dir={run_dir}", "train.progress=false",
            "train.checkpoint_every=0"] + SETTINGS[setting] + list(extra)
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--threads", "1", "--config", str(CONFIG)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    cs = summary.get("correct_smooth") or {}
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"setting": setting, "seed": seed, "command": " ".join(cmd), "seconds": seconds,
            "best_val_acc": summary["best_val_acc"], "test_acc": summary["test_acc"],
            "cs_val_acc": (cs.get("after") or {}).get("val_acc"),
            "cs_test_acc": (cs.get("after") or {}).get("test_acc"),
            "median_epoch_seconds": summary["median_epoch_seconds"], "load_avg": os.getloadavg()[0]}


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for split in args.splits:
        for seed in range(args.seeds):
            data = Path(args.data) if split == "public" else random_split(Path(args.data), work / f"cora-r{seed}.h5",
                                                                          seed)
            for setting in args.settings:
                key = f"{split}/{setting}/{seed}"
                if args.skip_done and key in results["runs"]:
                    continue
                rec = run_one(data, setting, seed, work, args.set)
                rec["split"] = split
                results["runs"][key] = rec
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(results, indent=1) + "\n")
                os.replace(tmp, out)
                print(f"{key}: test {rec['test_acc']:.4f} -> C&S {rec['cs_test_acc']:.4f} "
                      f"({rec['seconds']:.1f} s)", flush=True)
    print(report(results))
    return 0


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * sd:.1f}"


def report(results: dict) -> str:
    """Markdown table: mean ± std (%) of test accuracy before and after C&S per split and setting."""
    runs = list(results["runs"].values())
    lines = ["| split | setting | seeds | val acc | test acc | val acc after C&S | test acc after C&S |",
             "|---|---|---|---|---|---|---|"]
    for split in SPLITS:
        for setting in SETTINGS:
            rs = [r for r in runs if r["split"] == split and r["setting"] == setting]
            if not rs:
                continue
            lines.append(f"| {split} | {setting} | {len(rs)} | {_ms([r['best_val_acc'] for r in rs])} | "
                         f"{_ms([r['test_acc'] for r in rs])} | {_ms([r['cs_val_acc'] for r in rs])} | "
                         f"{_ms([r['cs_test_acc'] for r in rs])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every setting and seed, merge the records into --out")
    run.add_argument("--data", required=True, help="Cora dataset file (hpc-graph convert npz tests/data/cora.npz)")
    run.add_argument("--out", default="results/bench_recipes.json")
    run.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "bench_recipes"),
                     help="scratch directory (split copies of the dataset, run directories)")
    run.add_argument("--seeds", type=int, default=5)
    run.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    run.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    run.add_argument("--set", action="append", default=[], help="extra SECTION.KEY=VALUE for every run")
    run.add_argument("--skip-done", action="store_true")
    rep = sub.add_parser("report", help="print the table of a results file")
    rep.add_argument("results")
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    print(report(json.loads(Path(args.results).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
