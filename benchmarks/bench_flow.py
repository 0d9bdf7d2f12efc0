"""Benchmark: the ``flow`` engine (layer pipeline over micro-batches) on deep residual GCNs.

    python benchmarks/bench_flow.py --nodes 20000 --out results/bench_flow.json

One CSBM graph (``hpc-graph generate csbm --num-nodes NODES --avg-degree 10 --feat-dim 128 --num-classes 8
--homophily 0.7 --snr 0.6``). Three studies, every run a real ``mpiexec -n P hpc-graph train`` (float32,
``train.threads`` = cores / P):

1. **split** -- 32- and 64-layer residual GCN (batch norm after every hidden layer: without it a 32-layer
   residual stack diverges), hidden 256, no dropout, ``engine.name: flow``, ``cross_edges: stale``,
   ``microbatches`` 4, on 1 (the reference: the same saved-activation counter on the whole model, which is
   ``single``'s arithmetic), 2 and 4 ranks: parameters per rank against total / P, saved activations per
   rank (``engine_stats.saved_bytes``: what autograd keeps between the forward and backward halves)
   against the one-rank run / P, peak RSS per rank, and the bytes each rank sent per epoch against
   ``2 N d itemsize`` per stage boundary (``d`` = 256).
2. **idle** -- the 32-layer model on 2 ranks with ``microbatches`` 1, 2, 4, 8 (``stale``, pipelined): the
   measured idle fraction against GPipe's ``(P - 1) / (M + P - 1)``: per rank, one minus its busy time
   (pass time less the time blocked in receives and sends) over the pipeline's span (the longest rank's
   pass of that epoch), median of epochs 2..E, mean over the ranks; epoch times.
3. **accuracy** -- a 4-layer GCN, hidden 64, dropout 0.5, Adam lr 0.01, ``--acc-epochs`` epochs on 2
   ranks (the deep residual stacks are not used here: in float32 their training is chaotic -- two runs
   differing only in summation order end tens of points apart -- so they cannot show a mode's effect):
   ``single`` on one process, and ``flow`` with ``cross_edges`` exact / stale / drop at M = 1, 2,
   4, 8 (exact at M > 1 equals ``single`` by construction and is run at M = 4 to show it), best-validation
   test accuracy and the fraction of edges cut by the micro-batches.

Results: one JSON record per run in ``--out`` and the tables on stdout.
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
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MB = 2.0 ** 20


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _run(cmd: list[Any], env: dict[str, str], timeout: float) -> float:
    print("$ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {proc.stderr.strip()[-3000:]}")
    return time.perf_counter() - t0


def _train(work: Path, name: str, data: Path, ranks: int, model: dict, engine: dict, epochs: int, eval_every: int,
           cores: int, timeout: float, lr: float = 0.005, extra: dict | None = None, seed: int = 0) -> dict[str, Any]:
    """One training run (``extra``: more config sections); returns the summary, the per-rank epoch metrics and
    the wall time."""
    run = work / "runs" / name
    cfg = work / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**(extra or {}),
        "data": {"path": str(data), "feature_layout": "dense"},
        "engine": engine,
        "model": {"dropout": 0.0, **model},  # the accuracy study sets its own dropout
        "optim": {"name": "adam", "lr": lr},
        "train": {"epochs": epochs, "eval_every": eval_every, "seed": seed, "progress": False, "run_dir": str(run),
                  "threads": max(1, cores // ranks)}}))
    launch = ["mpiexec", "-n", ranks] if ranks > 1 else []
    wall = _run(launch + [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", cfg, "--force"],
                _env(max(1, cores // ranks)), timeout)
    summary = json.loads((run / "summary.json").read_text())
    per_rank: dict[int, list[dict]] = {}
    for path in sorted(run.glob("metrics.rank*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        per_rank[int(rows[0]["rank"])] = rows
    return {"summary": summary, "metrics": per_rank, "wall_s": wall}


def _median_stat(res: dict, key: str, rank: int) -> float | None:
    rows = res["metrics"][rank][1:] or res["metrics"][rank]
    vals = [r["engine_stats"].get(key) for r in rows if r.get("engine_stats", {}).get(key) is not None]
    return statistics.median(vals) if vals else None


def _span_idle(res: dict, ranks: int) -> list[float]:
    """Idle fraction of every rank over the pipeline's span (the longest rank's pass of the same epoch): GPipe's
    bubble counts a stage idle from the pass's start to its end, also before its first and after its last
    micro-batch; median over epochs 2..E."""
    epochs = len(res["metrics"][0])
    out = []
    for r in range(ranks):
        vals = []
        for e in range(1 if epochs > 1 else 0, epochs):
            span = max(res["metrics"][q][e]["engine_stats"]["pipeline_seconds"] for q in range(ranks))
            st = res["metrics"][r][e]["engine_stats"]
            vals.append(1.0 - (st["pipeline_seconds"] - st["idle_seconds"]) / span)
        out.append(statistics.median(vals))
    return out


def study_split(work, data, nodes, layers_list, ranks_list, m, epochs, cores, timeout, records):
    print("\n== split: parameters, saved activations, memory and bytes per rank ==", flush=True)
    for layers in layers_list:
        model = {"name": "gcn", "hidden": 256, "num_layers": layers, "residual": True, "batchnorm": True}
        base = None
        for ranks in [1] + [r for r in ranks_list if r > 1]:
            engine = {"name": "flow", "microbatches": m, "cross_edges": "stale"}
            res = _train(work, f"split-L{layers}-P{ranks}", data, ranks, model, engine, epochs, epochs, cores,
                         timeout)
            s = res["summary"]
            saved = [_median_stat(res, "saved_bytes", r) for r in range(ranks)]
            rec = {"study": "split", "layers": layers, "ranks": ranks, "microbatches": m,
                   "num_parameters": s["num_parameters"], "parameters_per_rank": s["parameters_per_rank"],
                   "saved_mb_per_rank": [round(b / MB, 1) for b in saved],
                   "peak_rss_mb": s["peak_rss_mb"], "bytes_per_epoch_per_rank": s["bytes_per_epoch_per_rank"],
                   "median_epoch_seconds": s["median_epoch_seconds"],
                   "boundary_bytes_predicted": 2 * nodes * 256 * 4}
            if ranks == 1:
                base = dict(rec, saved_bytes=saved[0])
            else:
                total = s["num_parameters"]
                rec["max_params_over_share"] = max(s["parameters_per_rank"]) / (total / ranks)
                rec["max_saved_over_share"] = max(saved) / (base["saved_bytes"] / ranks)
                sent = [_median_stat(res, "p2p_bytes", r) for r in range(ranks)]
                rec["p2p_bytes_per_rank"] = sent
                rec["bytes_match"] = all(
                    sent[r] == (nodes * 256 * 4 if r < ranks - 1 else 0) + (nodes * 256 * 4 if r > 0 else 0)
                    for r in range(ranks))
            records.append(rec)
            print(json.dumps(rec), flush=True)


def study_idle(work, data, layers, ranks, ms, epochs, cores, timeout, records):
    print("\n== idle: measured idle fraction vs GPipe's (P-1)/(M+P-1) ==", flush=True)
    model = {"name": "gcn", "hidden": 256, "num_layers": layers, "residual": True, "batchnorm": True}
    for m in ms:
        engine = {"name": "flow", "microbatches": m, "cross_edges": "stale"}
        res = _train(work, f"idle-L{layers}-P{ranks}-M{m}", data, ranks, model, engine, epochs, epochs, cores,
                     timeout)
        span_idle = _span_idle(res, ranks)
        rec = {"study": "idle", "layers": layers, "ranks": ranks, "microbatches": m,
               "idle_fraction": round(statistics.fmean(span_idle), 3),
               "gpipe_idle": round((ranks - 1) / (m + ranks - 1), 3),
               "per_rank_idle": [round(v, 3) for v in span_idle],
               "per_rank_wait_fraction": [round(_median_stat(res, "idle_fraction", r), 3) for r in range(ranks)],
               "median_epoch_seconds": res["summary"]["median_epoch_seconds"]}
        records.append(rec)
        print(json.dumps(rec), flush=True)


def study_accuracy(work, data, layers, ranks, ms, epochs, cores, timeout, records):
    print("\n== accuracy: exact / stale / drop vs single ==", flush=True)
    model = {"name": "gcn", "hidden": 64, "num_layers": layers, "dropout": 0.5}
    every = max(1, epochs // 20)
    res = _train(work, f"acc-single-L{layers}", data, 1, model, {"name": "single"}, epochs, every, cores, timeout,
                 lr=0.01)
    records.append({"study": "accuracy", "engine": "single", "cross_edges": None, "microbatches": 1,
                    "test_acc": res["summary"]["test_acc"], "best_val_acc": res["summary"]["best_val_acc"]})
    print(json.dumps(records[-1]), flush=True)
    runs = [("exact", 1), ("exact", 4)] + [(mode, m) for mode in ("stale", "drop") for m in ms if m > 1]
    for mode, m in runs:
        engine = {"name": "flow", "microbatches": m, "cross_edges": mode}
        res = _train(work, f"acc-{mode}-M{m}-L{layers}", data, ranks, model, engine, epochs, every, cores, timeout,
                     lr=0.01)
        cut = _median_stat(res, "cut_fraction", 0)
        rec = {"study": "accuracy", "engine": "flow", "cross_edges": mode, "microbatches": m, "ranks": ranks,
               "test_acc": res["summary"]["test_acc"], "best_val_acc": res["summary"]["best_val_acc"],
               "cut_fraction": cut, "median_epoch_seconds": res["summary"]["median_epoch_seconds"]}
        records.append(rec)
        print(json.dumps(rec), flush=True)


class _Records(list):
    """The records, written to ``path`` (with ``kept`` before them) after every one: an interrupted run keeps
    what it measured."""

    def __init__(self, path: Path, kept: list[dict]):
        super().__init__()
        self.path, self.kept = path, kept
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, rec: dict) -> None:
        super().append(rec)
        self.path.write_text(json.dumps(self.kept + list(self), indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--layers", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--acc-epochs", type=int, default=60)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--studies", nargs="+", default=["split", "idle", "accuracy"],
                    choices=["split", "idle", "accuracy"])
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--workdir", default=str(ROOT / "results" / "bench_flow_work"))
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_flow.json"))
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"csbm-{args.nodes}.h5"
    if not data.exists():
        _run([sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "csbm", "-o", data, "--num-nodes", args.nodes,
              "--avg-degree", 10, "--feat-dim", 128, "--num-classes", 8, "--homophily", 0.7, "--snr", 0.6,
              "--seed", 1], _env(args.cores), args.timeout)
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else []
    records = _Records(out, [r for r in old if r.get("study") not in args.studies])
    if "split" in args.studies:
        study_split(work, data, args.nodes, args.layers, args.ranks, 4, args.epochs, args.cores, args.timeout, records)
    if "idle" in args.studies:
        study_idle(work, data, args.layers[0], 2, args.microbatches, args.epochs, args.cores, args.timeout, records)
    if "accuracy" in args.studies:
        study_accuracy(work, data, 4, 2, args.microbatches, args.acc_epochs, args.cores, args.timeout, records)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
