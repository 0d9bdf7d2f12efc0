"""Benchmark: where a full-batch training epoch goes, ours (``single``) against DGL 2.1, per model.

    python benchmarks/bench_breakdown.py run --scale 18 --models gcn sage gat --threads 2 \\
           --out results/bench_breakdown.json
    python benchmarks/bench_breakdown.py report results/bench_breakdown.json

One process per framework and model, ``--threads`` threads, on ``hpc-graph generate rmat
--scale S --feat-dim 128 --num-classes 16`` (the graph of ``bench_training.py``); models as
``bench_training.py`` builds them (3 layers; GCN and SAGE hidden 128, GAT 4 heads x 32,
dropout 0.5, Adam). ``--warmup`` epochs, then one epoch under ``torch.profiler`` whose self
CPU time is split into categories by ``benchmarks/_breakdown.py`` (sparse aggregation
forward/backward, attention, GEMM, elementwise, allocation, optimizer, other). The
profiled epoch is slower than an unprofiled one (the profiler's own overhead is in
``other``); the shares, not the absolute seconds, are the point. DGL runs through
``benchmarks/dgl_baseline.py --profile`` in ``.venv-dgl`` (``setup_baselines.sh --dgl``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = {"gcn": {"name": "gcn", "hidden": 128, "num_layers": 3, "dropout": 0.5},
          "sage": {"name": "sage", "hidden": 128, "num_layers": 3, "dropout": 0.5},
          "gat": {"name": "gat", "hidden": 32, "heads": 4, "num_layers": 3, "dropout": 0.5}}


def _ours(args: argparse.Namespace) -> int:
    """In this process: profile one epoch of the ``single`` engine (called through ``_ours`` by ``run``)."""
    from _breakdown import profile_step

    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer

    cfg = config_from_dict({"data": {"path": args.data}, "engine": {"name": "single"}, "model": MODELS[args.model],
                            "optim": {"lr": 0.01, "weight_decay": 0.0},
                            "train": {"epochs": args.warmup + 1, "progress": False, "threads": args.threads,
                                      "eval_every": 10**6}})
    trainer = Trainer(cfg)
    for _ in range(args.warmup):
        trainer.step()
    res = profile_step(trainer.step)
    print(json.dumps({"framework": "ours", "model": args.model, **res}))
    return 0


def _run(args: argparse.Namespace) -> int:
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = args.workdir / f"rmat-s{args.scale}-f128.h5"
    if not data.exists():
        subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "rmat", "--scale", str(args.scale),
                        "--feat-dim", "128", "--num-classes", "16", "-o", str(data)], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), NUMBA_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    for model in args.models:
        for fw in args.frameworks:
            print(f"[bench_breakdown] scale {args.scale} {model} {fw}", flush=True)
            if fw == "ours":
                cmd = [sys.executable, __file__, "_ours", str(data), model, "--threads", str(args.threads),
                       "--warmup", str(args.warmup)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                rec = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": proc.stderr[-2000:]}
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    prof = Path(tmp) / "profile.json"
                    cmd = [str(args.dgl_python), str(ROOT / "benchmarks" / "dgl_baseline.py"), str(data), "--model",
                           model, "--epochs", str(args.warmup), "--threads", str(args.threads), "--profile", str(prof)]
                    if model == "gat":
                        cmd += ["--hidden", "32", "--heads", "4"]
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
                    rec = json.loads(prof.read_text()) if proc.returncode == 0 and prof.exists() \
                        else {"error": proc.stderr[-2000:]}
            rec.update(framework=fw, model=model, scale=args.scale, threads=args.threads,
                       load_avg=os.getloadavg()[0])
            records = [r for r in records if not (r.get("framework") == fw and r.get("model") == model
                                                  and r.get("scale") == args.scale)] + [rec]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(records, indent=1) + "\n")
    return _report(argparse.Namespace(results=args.out))


def _report(args: argparse.Namespace) -> int:
    from _breakdown import CATEGORIES

    records = json.loads(Path(args.results).read_text())
    cols = ("wall",) + CATEGORIES
    print("| scale | model | framework | " + " | ".join(cols) + " |")
    print("|" + "---|" * (3 + len(cols)))
    for r in sorted(records, key=lambda r: (r.get("scale", 0), r.get("model", ""), r.get("framework", ""))):
        if "error" in r:
            print(f"| {r.get('scale')} | {r.get('model')} | {r.get('framework')} | error: "
                  f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'} |")
            continue
        print(f"| {r['scale']} | {r['model']} | {r['framework']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--scale", type=int, default=18)
    r.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    r.add_argument("--frameworks", nargs="+", choices=("ours", "dgl"), default=["ours", "dgl"])
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--timeout", type=float, default=1800.0)
    r.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_breakdown_work")
    r.add_argument("--dgl-python", type=Path, default=ROOT / ".venv-dgl" / "bin" / "python")
    r.add_argument("--out", type=Path, default=ROOT / "results" / "bench_breakdown.json")
    o = sub.add_parser("_ours")
    o.add_argument("data")
    o.add_argument("model", choices=list(MODELS))
    o.add_argument("--threads", type=int, default=2)
    o.add_argument("--warmup", type=int, default=2)
    p = sub.add_parser("report")
    p.add_argument("results", type=Path)
    args = ap.parse_args(argv)
    return {"run": _run, "_ours": _ours, "report": _report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
