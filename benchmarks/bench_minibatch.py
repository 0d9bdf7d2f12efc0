"""Benchmark: the ``minibatch`` engine against PyG and DGL, its accuracy, and its remote-neighbour modes.

    python benchmarks/bench_minibatch.py speed --out results/bench_minibatch_speed.json
    python benchmarks/bench_minibatch.py accuracy --out results/bench_minibatch_accuracy.json
    python benchmarks/bench_minibatch.py ranks --out results/bench_minibatch_ranks.json
    python benchmarks/bench_minibatch.py report results/bench_minibatch_*.json

``speed`` (one process, ``--threads`` threads, default 2): fan-outs 15, 10, 5
(seed hop first), batch 1024, 3-layer GraphSAGE (mean, hidden 256) and GAT
(4 heads x 64), on R-MAT scale 18 and 20 (``hpc-graph generate rmat``) and a
CSBM graph (``hpc-graph generate csbm``, power-law degrees). An "epoch" here is
one pass over a fixed random subset of ``--train-nodes`` (20480) training
nodes, written into a copy of each dataset's train mask, so all three
frameworks do the same 20 batches: the per-batch work is that of a full epoch,
without hours of waiting. ``minibatch`` runs as ``hpc-graph train``; PyG
(``NeighborLoader``, no pyg-lib: every layer runs on the whole sampled
subgraph) and DGL 2.1 (``NeighborSampler`` + blocks) run
``benchmarks/minibatch_baseline.py`` in their own virtual environments
(``benchmarks/setup_baselines.sh``). Recorded: median epoch (epochs 2..E),
sampling seconds per epoch, sampled edges per epoch and per second of
sampling, peak RSS.

``accuracy`` (5 seeds, test accuracy at the best validation epoch): Cora,
2-layer SAGE hidden 64, full-batch ``single`` vs ``minibatch`` on one rank
(fan-outs 10, 10, batch 32); a CSBM graph of 50 000 nodes on 4 ranks (METIS)
with ``hec``, ``drop`` and ``exact`` vs one rank, 2-layer SAGE hidden 128,
fan-outs 10, 5, batch 256: accuracy and the epochs each needs to reach 99 %
of the one-rank run's best validation accuracy.

``ranks`` (2 and 4 ranks, METIS parts of R-MAT scale 18 with the train subset,
the ``speed`` SAGE model, a modelled 1 Gb/s link with 50 us latency):
median epoch, bytes per epoch by operation, HEC hit rate per layer, for
``hec``, ``exact`` and ``drop``.
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
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "OMP_WAIT_POLICY", "HPC_GRAPH_EXPORTED_THREADS")
MODELS = {"sage": {"model.name": "sage", "model.hidden": 256, "model.num_layers": 3},
          "gat": {"model.name": "gat", "model.hidden": 64, "model.heads": 4, "model.out_heads": 1,
                  "model.num_layers": 3}}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _hpc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", *args], check=True, env=_env(),
                   stdout=subprocess.DEVNULL)


def _subset_train(src: Path, dst: Path, count: int, seed: int = 0) -> None:
    """Copy a dataset file keeping ``count`` random training nodes in its train mask."""
    import h5py

    tmp = dst.with_suffix(".tmp.h5")
    shutil.copyfile(src, tmp)
    with h5py.File(tmp, "r+") as f:
        mask = f["node/train_mask"][:]
        idx = np.flatnonzero(mask)
        keep = np.random.default_rng(seed).choice(idx, min(count, idx.size), replace=False)
        new = np.zeros_like(mask)
        new[keep] = True
        f["node/train_mask"][:] = new
    tmp.replace(dst)


def prepare_speed(work: Path, train_nodes: int, names: list[str]) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    specs = {"rmat18": ["generate", "rmat", "--scale", "18"], "rmat20": ["generate", "rmat", "--scale", "20"],
             "csbm": ["generate", "csbm", "--num-nodes", "500000", "--avg-degree", "20", "--power-law", "2.5",
                      "--feat-dim", "128", "--num-classes", "16"]}
    out = {}
    for name in names:
        full = work / f"{name}.h5"
        if not full.exists():
            _hpc(*specs[name], "-o", str(full))
        if train_nodes == 0:  # full epochs: every training node
            out[name] = full
            continue
        sub = work / f"{name}-t{train_nodes // 1000}k.h5"
        if not sub.exists():
            _subset_train(full, sub, train_nodes)
        out[name] = sub
    return out


def _ours(data: Path, model: str, epochs: int, threads: int, work: Path, extra: dict | None = None,
          ranks: int = 1, dropout: float = 0.5) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    sets = {**MODELS[model], "engine.name": "minibatch", "data.path": str(data), "sampler.fanouts": "[15,10,5]",
            "sampler.batch_size": 1024, "model.dropout": dropout, "optim.lr": 0.003, "train.epochs": epochs,
            "train.eval_every": 1000, "train.progress": False, **(extra or {})}
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", os.devnull, "--run-dir", str(run_dir)]
    if ranks == 1:
        cmd += ["--threads", str(threads)]
    else:
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks)] + cmd
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=7200)
    rec = {"framework": "hpc_graph", "command": " ".join(cmd), "wall_seconds": time.perf_counter() - t0}
    if proc.returncode:
        rec["error"] = proc.stderr[-3000:]
        return rec
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir, ignore_errors=True)
    r0 = sorted((r for r in rows if r["rank"] == 0), key=lambda r: r["epoch"])
    later = r0[1:] or r0
    es = [r["engine_stats"] for r in later]
    rec.update({"epoch_seconds": [r["epoch_seconds"] for r in r0],
                "median_epoch_seconds": summary["median_epoch_seconds"],
                "sample_seconds": statistics.median(e["sample_seconds"] for e in es),
                "fetch_seconds": statistics.median(e["fetch_seconds"] for e in es),
                "push_seconds": statistics.median(e["push_seconds"] for e in es),
                "sampled_edges_per_epoch": statistics.median(e["sampled_edges"] for e in es),
                "iterations": es[-1]["iterations"], "peak_rss_mb": max(summary["peak_rss_mb"]),
                "test_acc": summary["test_acc"]})
    rec["sampled_edges_per_second"] = rec["sampled_edges_per_epoch"] / max(rec["sample_seconds"], 1e-9)
    if ranks > 1:
        per_rank = {}
        for r in rows:
            if r["epoch"] > 1:
                per_rank.setdefault(r["rank"], []).append(r)
        rec["bytes_per_epoch"] = {op: statistics.median(sum(x["engine_stats"]["bytes_by_op"][op] for x in rs)
                                                        / len(rs) for rs in per_rank.values())
                                  for op in ("fetch", "sample", "push")}
        rec["bytes_sent_per_epoch"] = sum(statistics.median(x["bytes_sent"] for x in rs) for rs in per_rank.values())
        rec["hec_hit_rate"] = es[-1].get("hec_hit_rate")
        rec["modeled_comm_seconds"] = statistics.median(r["modeled_comm_seconds"] for r in later)
    return rec


def _baseline(framework: str, data: Path, model: str, epochs: int, threads: int, dropout: float = 0.5) -> dict:
    """``framework``: ``pyg`` or ``dgl`` through ``minibatch_baseline.py``, or ``dgl-example`` (SAGE only): DGL
    through ``dgl_sage_example.py``, a script in DGL's own example layout, dropout at the same places."""
    venv = "dgl" if framework == "dgl-example" else framework
    py = REPO / f".venv-{venv}" / "bin" / "python"
    if not py.exists():
        return {"framework": framework, "error": f"{py} missing: run benchmarks/setup_baselines.sh"}
    if framework == "dgl-example":
        if model != "sage":
            return {"framework": framework, "error": "dgl-example runs SAGE only"}
        cmd = [str(py), str(REPO / "benchmarks" / "dgl_sage_example.py"), str(data), "--epochs", str(epochs),
               "--threads", str(threads), "--fanouts", "15", "10", "5", "--batch-size", "1024", "--hidden", "256",
               "--dropout", str(dropout), "--dropout-at", "input"]
    else:
        cmd = [str(py), str(REPO / "benchmarks" / "minibatch_baseline.py"), "--framework", framework, str(data),
               "--model", model, "--epochs", str(epochs), "--threads", str(threads), "--fanouts", "15", "10", "5",
               "--batch-size", "1024", "--dropout", str(dropout)]
        cmd += ["--hidden", "256"] if model == "sage" else ["--hidden", "64", "--heads", "4"]
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=7200)
    rec = {"framework": framework, "command": " ".join(cmd), "wall_seconds": time.perf_counter() - t0}
    if proc.returncode:
        rec["error"] = proc.stderr[-3000:]
        return rec
    rec.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rec


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def _median_run(runs: list[dict]) -> dict:
    """The record of the run with the median epoch time, with every run's epoch time and their spread."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["median_epoch_seconds"])
    if not ok:
        return runs[-1]
    med = [r["median_epoch_seconds"] for r in ok]
    rec = dict(ok[(len(ok) - 1) // 2])
    rec.update({"median_epoch_seconds": statistics.median(med), "run_epoch_seconds": med,
                "spread": (med[-1] - med[0]) / statistics.median(med), "runs": len(ok)})
    return rec


def cmd_speed(args) -> int:
    work = Path(args.workdir).resolve()
    data = prepare_speed(work, args.train_nodes, args.datasets)
    out = Path(args.out)
    res = json.loads(out.read_text()) if out.exists() and args.skip_done else {"records": {}}
    res.update({"load_before": os.getloadavg(), "rounds": args.rounds, "dropout": args.dropout,
                "train_nodes": args.train_nodes or "all"})
    runs: dict[str, list[dict]] = {}
    for rnd in range(args.rounds):  # every cell once per round: the frameworks interleaved
        for ds in args.datasets:
            for model in args.models:
                for fw in (args.frameworks if rnd % 2 == 0 else list(reversed(args.frameworks))):
                    key = f"{ds}/{model}/{fw}"
                    if key in res["records"] and "error" not in res["records"][key] and key not in runs:
                        continue
                    rec = (_ours(data[ds], model, args.epochs, args.threads, work, dropout=args.dropout)
                           if fw == "hpc_graph"
                           else _baseline(fw, data[ds], model, args.epochs, args.threads, args.dropout))
                    rec.update({"dataset": ds, "model": model, "load": os.getloadavg()})
                    runs.setdefault(key, []).append(rec)
                    res["records"][key] = _median_run(runs[key])
                    _save(out, res)
                    samp = rec.get("sample_seconds", rec.get("median_sampling_seconds", float("nan")))
                    print(f"round {rnd + 1}/{args.rounds} {key:30} epoch "
                          f"{rec.get('median_epoch_seconds') or float('nan'):8.2f} s, sampling "
                          f"{samp if samp is not None else float('nan'):7.2f} s"
                          + (f" FAILED {rec['error'][-300:]}" if "error" in rec else ""), flush=True)
    res["load_after"] = os.getloadavg()
    _save(out, res)
    return 0


def cmd_accuracy(args) -> int:
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cora = work / "cora.h5"
    if not cora.exists():
        _hpc("convert", "npz", str(args.cora), "-o", str(cora))
    csbm = work / "csbm50k.h5"
    if not csbm.exists():
        _hpc("generate", "csbm", "-o", str(csbm), "--num-nodes", "50000", "--power-law", "2.5", "--avg-degree", "10",
             "--feat-dim", "128", "--seed", "1", "--homophily", "0.6", "--snr", "0.6")
    parts = work / "csbm50k-metis-4"
    if not parts.exists():
        _hpc("partition", str(csbm), "-o", str(parts), "-n", "4")
    out = Path(args.out)
    res = json.loads(out.read_text()) if out.exists() and args.skip_done else {"records": {}}
    cora_model = {"model.name": "sage", "model.hidden": 64, "model.num_layers": 2, "model.dropout": 0.5,
                  "optim.lr": 0.01, "optim.weight_decay": 5e-4, "data.feature_norm": "row", "train.epochs": 200}
    csbm_model = {"model.name": "sage", "model.hidden": 128, "model.num_layers": 2, "model.dropout": 0.5,
                  "optim.lr": 0.003, "optim.weight_decay": 0.0, "train.epochs": args.csbm_epochs}
    runs = {
        "cora/single": (cora, 1, {**cora_model, "engine.name": "single"}),
        "cora/minibatch": (cora, 1, {**cora_model, "engine.name": "minibatch", "sampler.fanouts": "[10,10]",
                                     "sampler.batch_size": 32}),
        "csbm/1rank": (csbm, 1, {**csbm_model, "engine.name": "minibatch", "sampler.fanouts": "[10,5]",
                                 "sampler.batch_size": 1024}),
    }
    for mode in ("hec", "drop", "exact"):
        runs[f"csbm/4ranks-{mode}"] = (parts, 4, {**csbm_model, "engine.name": "minibatch",
                                                  "sampler.fanouts": "[10,5]", "sampler.batch_size": 256,
                                                  "hec.mode": mode})
    for seed in range(args.seeds):
        for name, (path, ranks, sets) in runs.items():
            key = f"{name}/{seed}"
            if key in res["records"] and "error" not in res["records"][key]:
                continue
            run_dir = Path(tempfile.mkdtemp(prefix="acc-", dir=work))
            cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", os.devnull, "--run-dir",
                   str(run_dir), "--set", f"data.path={path}", "--set", f"train.seed={seed}",
                   "--set", "train.progress=false"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            if ranks > 1:
                cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks)] + cmd
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=7200)
            rec = {"run": name, "seed": seed, "command": " ".join(cmd)}
            if proc.returncode:
                rec["error"] = proc.stderr[-3000:]
            else:
                summary = json.loads((run_dir / "summary.json").read_text())
                rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
                r0 = sorted((r for r in rows if r["rank"] == 0), key=lambda r: r["epoch"])
                rec.update({"test_acc": summary["test_acc"], "best_val_acc": summary["best_val_acc"],
                            "best_epoch": summary["best_epoch"], "val_curve": [r["val_acc"] for r in r0],
                            "median_epoch_seconds": summary["median_epoch_seconds"],
                            "hec_hit_rate": r0[-1]["engine_stats"].get("hec_hit_rate")})
            shutil.rmtree(run_dir, ignore_errors=True)
            res["records"][key] = rec
            _save(out, res)
            print(f"{key:24} test {rec.get('test_acc', float('nan')):.4f} best epoch {rec.get('best_epoch')}"
                  + (f" FAILED {rec['error'][-300:]}" if "error" in rec else ""), flush=True)
    return 0


def cmd_ranks(args) -> int:
    work = Path(args.workdir).resolve()
    data = prepare_speed(work, args.train_nodes, ["rmat18"])["rmat18"]
    out = Path(args.out)
    res = json.loads(out.read_text()) if out.exists() and args.skip_done else {"records": {}}
    for ranks in args.ranks:
        parts = work / f"{data.stem}-metis-{ranks}"
        if not parts.exists():
            _hpc("partition", str(data), "-o", str(parts), "-n", str(ranks))
        for mode in ("hec", "drop", "exact"):
            key = f"{ranks}/{mode}"
            if key in res["records"] and "error" not in res["records"][key]:
                continue
            rec = _ours(parts, "sage", args.epochs, 1, work, ranks=ranks,
                        extra={"hec.mode": mode, "comm.link_bandwidth": args.bandwidth,
                               "comm.link_latency": args.latency})
            rec.update({"ranks": ranks, "mode": mode, "link": args.bandwidth})
            res["records"][key] = rec
            _save(out, res)
            print(f"{key:10} epoch {rec.get('median_epoch_seconds') or float('nan'):7.2f} s, bytes "
                  f"{rec.get('bytes_sent_per_epoch', 0) / 1e6:8.1f} MB, hit {rec.get('hec_hit_rate')}"
                  + (f" FAILED {rec['error'][-300:]}" if "error" in rec else ""), flush=True)
    return 0


def _epochs_to(curve, target):
    for e, v in enumerate(curve, 1):
        if v is not None and v >= target:
            return e
    return None


def cmd_report(args) -> int:
    for path in args.files:
        data = json.loads(Path(path).read_text())["records"]
        sample = next(iter(data.values()), {})
        if "framework" in sample and "ranks" not in sample:
            print(f"\n### {path}: one process\n")
            print("| dataset | model | framework | epoch (s), spread over runs | sampling (s) | sampling share | "
                  "sampled edges/s | peak RSS (MB) | vs faster baseline (epoch / sampling rate) |")
            print("|---|---|---|---|---|---|---|---|---|")
            for key, r in data.items():
                ds, model, fw = key.split("/")
                if "error" in r:
                    print(f"| {ds} | {model} | {fw} | failed | | | | | |")
                    continue
                samp = r.get("sample_seconds", r.get("median_sampling_seconds"))
                rate = r.get("sampled_edges_per_second")
                epoch = r["median_epoch_seconds"]
                spread = f" ({100 * r['spread']:.0f} %, {r['runs']} runs)" if "spread" in r else ""
                line = (f"| {ds} | {model} | {fw} | {epoch:.2f}{spread} | "
                        + (f"{samp:.2f} | {samp / epoch:.0%} | " if samp else "| | ")
                        + (f"{rate / 1e6:.1f} M | " if rate else "| ") + f"{r.get('peak_rss_mb', 0):.0f} |")
                if fw == "hpc_graph":
                    base = [data.get(f"{ds}/{model}/{b}") for b in ("pyg", "dgl", "dgl-example")]
                    base = [b for b in base if b and "error" not in b]
                    if base:
                        fastest = min(base, key=lambda b: b["median_epoch_seconds"])
                        rates = [b["sampled_edges_per_second"] for b in base if b.get("sampled_edges_per_second")]
                        line += (f" {fastest['median_epoch_seconds'] / epoch:.2f}x ({fastest['framework']}) / "
                                 + (f"{rate / max(rates):.2f}x |" if rates and rate else " |"))
                    else:
                        line += " |"
                else:
                    line += " |"
                print(line)
        elif "ranks" in sample:
            print(f"\n### {path}: ranks, modes, modelled link\n")
            print("| ranks | mode | epoch (s) | vs drop | vs exact | MB sent per epoch (all ranks) | fetch / sample / "
                  "push MB (rank median) | HEC hit rate per layer |")
            print("|---|---|---|---|---|---|---|---|")
            for key, r in data.items():
                if "error" in r:
                    print(f"| {r.get('ranks')} | {r.get('mode')} | failed | | | | | |")
                    continue
                drop, exact = data.get(f"{r['ranks']}/drop", {}), data.get(f"{r['ranks']}/exact", {})
                b = r.get("bytes_per_epoch", {})
                print(f"| {r['ranks']} | {r['mode']} | {r['median_epoch_seconds']:.2f} | "
                      f"{r['median_epoch_seconds'] / drop.get('median_epoch_seconds', float('nan')):.2f}x | "
                      f"{r['median_epoch_seconds'] / exact.get('median_epoch_seconds', float('nan')):.2f}x | "
                      f"{r.get('bytes_sent_per_epoch', 0) / 1e6:.1f} | "
                      f"{b.get('fetch', 0) / 1e6:.1f} / {b.get('sample', 0) / 1e6:.1f} / "
                      f"{b.get('push', 0) / 1e6:.1f} | "
                      f"{r.get('hec_hit_rate')} |")
        else:
            print(f"\n### {path}: accuracy (test at best validation epoch)\n")
            print("| run | test acc (mean ± sd) | epochs to 99 % of the 1-rank / full-batch best val | HEC hit rate |")
            print("|---|---|---|---|")
            by = {}
            for r in data.values():
                if "test_acc" in r:
                    by.setdefault(r["run"], []).append(r)
            for name, rs in by.items():
                accs = [100 * r["test_acc"] for r in rs]
                ref_name = "cora/single" if name.startswith("cora") else "csbm/1rank"
                refs = {r["seed"]: r for r in by.get(ref_name, [])}
                ratios = []
                for r in rs:
                    ref = refs.get(r["seed"])
                    if ref:
                        target = 0.99 * ref["best_val_acc"]
                        a, b = _epochs_to(r["val_curve"], target), _epochs_to(ref["val_curve"], target)
                        if a and b:
                            ratios.append(a / b)
                sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
                print(f"| {name} | {statistics.mean(accs):.2f} ± {sd:.2f} | "
                      f"{statistics.mean(ratios) if ratios else float('nan'):.2f}x | {rs[-1].get('hec_hit_rate')} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("speed", "accuracy", "ranks"):
        s = sub.add_parser(name)
        s.add_argument("--out", default=f"results/bench_minibatch_{name}.json")
        s.add_argument("--workdir", default="results/bench_minibatch_work")
        s.add_argument("--skip-done", action="store_true")
        s.add_argument("--train-nodes", type=int, default=20480, help="0: every training node (full epochs)")
        s.add_argument("--epochs", type=int, default=3)
    sp = sub.choices["speed"]
    sp.add_argument("--datasets", nargs="+", default=["rmat18", "rmat20", "csbm"])
    sp.add_argument("--models", nargs="+", default=["sage", "gat"])
    sp.add_argument("--frameworks", nargs="+", default=["hpc_graph", "dgl", "pyg"])
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--dropout", type=float, default=0.5, help="before every layer, on every side")
    sp.add_argument("--rounds", type=int, default=3, help="runs of every cell, interleaved (median, spread)")
    acc = sub.choices["accuracy"]
    acc.add_argument("--seeds", type=int, default=5)
    acc.add_argument("--csbm-epochs", type=int, default=30)
    acc.add_argument("--cora", default=str(REPO / "tests" / "data" / "cora.npz"))
    rk = sub.choices["ranks"]
    rk.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    rk.add_argument("--bandwidth", default="1Gb/s")
    rk.add_argument("--latency", default="50us")
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    return {"speed": cmd_speed, "accuracy": cmd_accuracy, "ranks": cmd_ranks, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
