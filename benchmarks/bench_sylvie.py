"""Benchmark: the ``sylvie`` engine against ``dp`` (accuracy, halo bytes, epoch time over a modelled link).

    python benchmarks/bench_sylvie.py accuracy --out results/bench_sylvie_accuracy.json
    python benchmarks/bench_sylvie.py link --out results/bench_sylvie_link.json
    python benchmarks/bench_sylvie.py report results/bench_sylvie_accuracy.json results/bench_sylvie_link.json

``accuracy``: Cora (``../shared/datasets/cora.npz``, row-normalised features)
and a CSBM graph with power-law degrees (``hpc-graph generate csbm
--num-nodes 50000 --power-law 2.5``), each METIS-partitioned into 4 parts;
a 2-layer GCN, hidden 64, dropout 0.5, Adam (lr 0.01, weight decay 5e-4),
``--epochs`` epochs, evaluated every epoch; seeds 0..``--seeds``-1. Runs:
``dp``; ``sylvie`` with static 8, 4, 2, 1 bits (2 bits also with float16
scales); ``bits: auto`` with pipeline off, on and adaptive. Recorded per run:
test accuracy at the best validation epoch, halo bytes per epoch against what
``dp`` sends (``halo_full_bytes`` of the same messages at full precision),
the bit widths used, and the first epoch whose validation accuracy reaches
95 % of ``dp``'s best (same seed).

``link``: a CSBM graph of ``--link-nodes`` (100 000) nodes with power-law
degrees, 4 random parts (most of the graph is halo), the same GCN, 30 epochs,
over a modelled link (``comm.link_bandwidth``, ``comm.link_latency``):
``dp`` and ``sylvie`` ``bits: auto`` with pipeline off / on / adaptive.
Recorded: median epoch time (slowest rank), and per rank per epoch the
modelled exchange time, the part of it not hidden (slept in ``wait()``),
the encode/decode time and the compute time.

Every run is ``mpiexec -n 4 python -m hpc_graph.cli -q train ...`` with no
thread variables (each rank decides its threads). Results are merged into
``--out`` after every run (``--skip-done`` keeps finished ones).
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
RANKS = 4

ACCURACY_RUNS = {
    "dp": {"engine.name": "dp"},
    "s8": {"engine.name": "sylvie", "engine.bits": 8},
    "s4": {"engine.name": "sylvie", "engine.bits": 4},
    "s2": {"engine.name": "sylvie", "engine.bits": 2},
    "s2-f16": {"engine.name": "sylvie", "engine.bits": 2, "engine.scale_dtype": "float16"},
    "s1": {"engine.name": "sylvie", "engine.bits": 1},
    "auto": {"engine.name": "sylvie", "engine.bits": "auto"},
    "auto-on": {"engine.name": "sylvie", "engine.bits": "auto", "engine.pipeline": "on"},
    "auto-adaptive": {"engine.name": "sylvie", "engine.bits": "auto", "engine.pipeline": "adaptive"},
}
LINK_RUNS = {k: ACCURACY_RUNS[k] for k in ("dp", "auto", "auto-on", "auto-adaptive")}
MODEL = {"model.name": "gcn", "model.hidden": 64, "model.num_layers": 2, "model.dropout": 0.5,
         "optim.lr": 0.01, "optim.weight_decay": 5e-4}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _hpc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", *args], check=True, env=_env(),
                   stdout=subprocess.DEVNULL)


def prepare(work: Path, cora: Path, link_nodes: int) -> dict[str, Path]:
    """Dataset files and partitions, generated once into ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    out = {}
    if not (work / "cora.h5").exists():
        _hpc("convert", "npz", str(cora), "-o", str(work / "cora.h5"))
    if not (work / "csbm50k.h5").exists():
        _hpc("generate", "csbm", "-o", str(work / "csbm50k.h5"), "--num-nodes", "50000", "--power-law", "2.5",
             "--avg-degree", "10", "--feat-dim", "128", "--seed", "1")
    link = work / f"csbm{link_nodes // 1000}k.h5"
    if not link.exists():
        _hpc("generate", "csbm", "-o", str(link), "--num-nodes", str(link_nodes), "--power-law", "2.5",
             "--avg-degree", "10", "--feat-dim", "128", "--seed", "2")
    for name, method in (("cora", "metis"), ("csbm50k", "metis"), (link.stem, "random")):
        parts = work / f"{name}-{method}-{RANKS}"
        if not parts.exists():
            _hpc("partition", str(work / f"{name}.h5"), "-o", str(parts), "-n", str(RANKS), "--method", method)
        out[name] = parts
    return out


def run(parts: Path, settings: dict, epochs: int, seed: int, work: Path, eval_every: int = 1,
        extra: dict | None = None) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    sets = {**MODEL, **settings, "data.path": str(parts), "train.epochs": epochs, "train.seed": seed,
            "train.eval_every": eval_every, "train.progress": False, **(extra or {})}
    if "cora" in parts.name:
        sets["data.feature_norm"] = "row"
    cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(RANKS), sys.executable, "-m", "hpc_graph.cli", "-q",
           "train", "--config", os.devnull, "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=3600)
    rec = {"settings": settings, "epochs": epochs, "seed": seed, "wall_seconds": time.perf_counter() - t0,
           "command": " ".join(cmd), "returncode": proc.returncode}
    if proc.returncode != 0:
        rec["error"] = proc.stderr[-3000:]
        shutil.rmtree(run_dir, ignore_errors=True)
        return rec
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir, ignore_errors=True)
    rank0 = sorted((r for r in rows if r["rank"] == 0), key=lambda r: r["epoch"])
    rec.update({"test_acc": summary["test_acc"], "best_val_acc": summary["best_val_acc"],
                "best_epoch": summary["best_epoch"], "median_epoch_seconds": summary["median_epoch_seconds"],
                "val_curve": [r["val_acc"] for r in rank0]})
    per_rank = {}
    for r in rows:
        per_rank.setdefault(r["rank"], []).append(r)
    halo, full, rows_bits, codec, compute, mod_x, mod_x_wait, modes = 0, 0, {}, [], [], [], [], {}
    for rank, mine in per_rank.items():
        mine = sorted(mine, key=lambda r: r["epoch"])[1:]  # epoch 1 compiles kernels
        for r in mine:
            es = r["engine_stats"]
            halo += es.get("halo_bytes_fwd", 0) + es.get("halo_bytes_bwd", 0)
            full += es.get("halo_full_bytes", 0)
            for b, c in es.get("bits_rows", {}).items():
                rows_bits[b] = rows_bits.get(b, 0) + c
            codec.append(es.get("codec_seconds", 0.0))
            compute.append(r["compute_seconds"])
            mod_x.append(es.get("modeled_exchange_seconds", 0.0))
            mod_x_wait.append(es.get("modeled_exchange_wait_seconds", 0.0))
            if rank == 0:
                modes[es.get("mode", "sync")] = modes.get(es.get("mode", "sync"), 0) + 1
    rec.update({"halo_bytes_per_epoch": halo / max(1, len(codec)) * len(per_rank),
                "halo_full_bytes_per_epoch": full / max(1, len(codec)) * len(per_rank),
                "bits_rows": rows_bits, "modes": modes,
                "codec_seconds": statistics.median(codec) if codec else 0.0,
                "compute_seconds": statistics.median(compute) if compute else 0.0,
                "modeled_exchange_seconds": statistics.median(mod_x) if mod_x else 0.0,
                "modeled_exchange_wait_seconds": statistics.median(mod_x_wait) if mod_x_wait else 0.0})
    return rec


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def cmd_accuracy(args) -> int:
    work = Path(args.workdir).resolve()
    parts = prepare(work, Path(args.cora), args.link_nodes)
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() and args.skip_done else {"records": {}}
    data["load_before"] = os.getloadavg()
    for ds in args.datasets:
        for seed in range(args.seeds):
            for name in args.runs:
                key = f"{ds}/{name}/{seed}"
                if key in data["records"] and "error" not in data["records"][key]:
                    continue
                rec = run(parts[ds], ACCURACY_RUNS[name], args.epochs, seed, work)
                rec.update({"dataset": ds, "run": name})
                data["records"][key] = rec
                _save(out, data)
                print(f"{key:24} test {rec.get('test_acc', float('nan')):.4f} "
                      f"bytes "
                      f"{rec.get('halo_bytes_per_epoch', 0) / max(rec.get('halo_full_bytes_per_epoch', 1), 1):.3f}"
                      f"x  {rec.get('median_epoch_seconds') or 0:.3f} s/epoch"
                      + (f" FAILED {rec['error'][-400:]}" if "error" in rec else ""), flush=True)
    data["load_after"] = os.getloadavg()
    _save(out, data)
    return 0


def cmd_link(args) -> int:
    work = Path(args.workdir).resolve()
    parts = prepare(work, Path(args.cora), args.link_nodes)[f"csbm{args.link_nodes // 1000}k"]
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() and args.skip_done else {"records": {}}
    data["load_before"] = os.getloadavg()
    for bw, lat in zip(args.bandwidths, args.latencies):
        for name in args.runs:
            key = f"{bw}/{name}"
            if key in data["records"] and "error" not in data["records"][key]:
                continue
            rec = run(parts, LINK_RUNS[name], args.link_epochs, 0, work, eval_every=args.link_epochs,
                      extra={"comm.link_bandwidth": bw, "comm.link_latency": lat})
            rec.update({"bandwidth": bw, "latency": lat, "run": name})
            data["records"][key] = rec
            _save(out, data)
            print(f"{key:24} {rec.get('median_epoch_seconds') or float('nan'):.3f} s/epoch, exchange modelled "
                  f"{rec.get('modeled_exchange_seconds', 0):.3f} s, "
                  f"exposed {rec.get('modeled_exchange_wait_seconds', 0):.3f}"
                  f" s, codec {rec.get('codec_seconds', 0):.3f} s, compute {rec.get('compute_seconds', 0):.3f} s"
                  + (f" FAILED {rec['error'][-400:]}" if "error" in rec else ""), flush=True)
    data["load_after"] = os.getloadavg()
    _save(out, data)
    return 0


def _epochs_to(curve: list, target: float) -> int | None:
    for e, v in enumerate(curve, 1):
        if v is not None and v >= target:
            return e
    return None


def cmd_report(args) -> int:
    for path in args.files:
        data = json.loads(Path(path).read_text())
        recs = data["records"]
        if any("bandwidth" in r for r in recs.values()):
            print(f"\n### {path}: modelled link (4 random parts)\n")
            print("| link | run | epoch (s) | vs dp | exchange modelled (s) | not hidden (s) | hidden | "
                  "encode+decode (s) | compute (s) | codec/compute |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for key, r in recs.items():
                dp = recs.get(f"{r['bandwidth']}/dp", {})
                mod, wait = r.get("modeled_exchange_seconds", 0), r.get("modeled_exchange_wait_seconds", 0)
                speed = (dp.get("median_epoch_seconds") or 0) / (r.get("median_epoch_seconds") or 1)
                print(f"| {r['bandwidth']} | {r['run']} | {r.get('median_epoch_seconds', 0):.3f} | {speed:.2f}x | "
                      f"{mod:.3f} | {wait:.3f} | {1 - wait / mod if mod else 0:.0%} | "
                      f"{r.get('codec_seconds', 0):.3f} | {r.get('compute_seconds', 0):.3f} | "
                      f"{r.get('codec_seconds', 0) / max(r.get('compute_seconds', 1e-9), 1e-9):.0%} |")
            continue
        print(f"\n### {path}: accuracy, halo bytes, epochs to 95 % of dp's best validation accuracy\n")
        print("| dataset | run | test acc (mean ± sd) | vs dp (pt) | halo bytes vs dp | epochs to 95 % "
              "(vs dp) | widths used (rows) |")
        print("|---|---|---|---|---|---|---|")
        by = {}
        for r in recs.values():
            if "test_acc" in r:
                by.setdefault((r["dataset"], r["run"]), []).append(r)
        for (ds, name), rs in sorted(by.items(), key=lambda kv: (kv[0][0], list(ACCURACY_RUNS).index(kv[0][1]))):
            accs = [100 * r["test_acc"] for r in rs]
            dps = {r["seed"]: r for r in by.get((ds, "dp"), [])}
            dp_mean = statistics.mean(100 * r["test_acc"] for r in dps.values()) if dps else float("nan")
            ratio = statistics.mean(r["halo_bytes_per_epoch"] / r["halo_full_bytes_per_epoch"]
                                    for r in rs if r["halo_full_bytes_per_epoch"]) if name != "dp" else 1.0
            ep = []
            for r in rs:
                d = dps.get(r["seed"])
                if d:
                    target = 0.95 * d["best_val_acc"]
                    a, b = _epochs_to(r["val_curve"], target), _epochs_to(d["val_curve"], target)
                    if a and b:
                        ep.append(a / b)
            bits = {}
            for r in rs:
                for b, c in r.get("bits_rows", {}).items():
                    bits[b] = bits.get(b, 0) + c
            tot = sum(bits.values()) or 1
            bits_text = ", ".join(f"{b}b {c / tot:.0%}" for b, c in sorted(bits.items(), key=lambda kv: int(kv[0])))
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            print(f"| {ds} | {name} | {statistics.mean(accs):.2f} ± {sd:.2f} | "
                  f"{statistics.mean(accs) - dp_mean:+.2f} | {ratio:.3f} | "
                  f"{statistics.mean(ep) if ep else float('nan'):.2f}x | {bits_text or '-'} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("accuracy", "link"):
        s = sub.add_parser(name)
        s.add_argument("--out", default=f"results/bench_sylvie_{name}.json")
        s.add_argument("--workdir", default="results/bench_sylvie_work")
        s.add_argument("--cora", default=str(REPO.parent / "shared" / "datasets" / "cora.npz"))
        s.add_argument("--link-nodes", type=int, default=100_000)
        s.add_argument("--skip-done", action="store_true", help="keep finished records of an earlier run")
    acc = sub.choices["accuracy"]
    acc.add_argument("--datasets", nargs="+", default=["cora", "csbm50k"])
    acc.add_argument("--runs", nargs="+", default=list(ACCURACY_RUNS), choices=list(ACCURACY_RUNS))
    acc.add_argument("--seeds", type=int, default=5)
    acc.add_argument("--epochs", type=int, default=200)
    link = sub.choices["link"]
    link.add_argument("--runs", nargs="+", default=list(LINK_RUNS), choices=list(LINK_RUNS))
    link.add_argument("--bandwidths", nargs="+", default=["1Gb/s", "100Gb/s"])
    link.add_argument("--latencies", nargs="+", default=["50us", "2us"])
    link.add_argument("--link-epochs", type=int, default=30)
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    return {"accuracy": cmd_accuracy, "link": cmd_link, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
