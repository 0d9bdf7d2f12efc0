"""GPU benchmark: full-batch training epochs of ``single`` on the GPU against PyG on the GPU.

    python benchmarks/bench_gpu.py --scales 18 20 --models gcn sage gat --epochs 6 \\
        --workdir DIR --out results/bench_gpu.jsonl

For every R-MAT scale a dataset is generated once (``hpc-graph generate rmat
--scale S --edge-factor 16 --feat-dim 128 --num-classes 16``); then per model
one ``hpc-graph train`` run (engine ``single``, ``train.device=cuda``) and one
``benchmarks/pyg_baseline.py --device cuda`` run, the same models as
``benchmarks/bench_training.py`` (3 layers; GCN and SAGE hidden 128, GAT 4
heads x 32 with one output head; dropout 0.5; Adam), each in a fresh process.
Recorded per run: the median epoch time over epochs 2..E (epoch 1 compiles
the kernels), the peak of torch's GPU allocator (``peak_gpu_mb``), and the
GPU's name. A run that fails (out of memory included) is recorded with its
error instead of a time.

``--memory-gb 80`` then estimates the largest R-MAT scale each implementation
could train in that much GPU memory: peak memory is affine in the graph size at
a fixed edge factor, so the peaks at the two largest scales measured give
``peak(S) = a + b * 2**S``, solved for the largest S under the budget (an
extrapolation, printed as such, not a run).

The kernel measurements (SpMM vs ``torch.sparse.mm``, SAGE/GAT layers vs PyG,
attention vs SDPA) are ``hpc-graph bench kernels --device cuda``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = {"gcn": 128, "sage": 128, "gat": 32}
HEADS, LAYERS = 4, 3


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _dataset(workdir: Path, scale: int, timeout: float) -> Path:
    path = workdir / f"rmat{scale}.h5"
    if not path.exists():
        proc = _run([sys.executable, "-m", "hpc_graph.cli", "generate", "rmat", "--scale", str(scale),
                     "--edge-factor", "16", "--feat-dim", "128", "--num-classes", "16", "-o", str(path)], timeout)
        if proc.returncode != 0:
            raise SystemExit(f"generate scale {scale} failed:\n{proc.stderr[-3000:]}")
    return path


def _config(workdir: Path, model: str, epochs: int) -> Path:
    path = workdir / f"gpu_{model}.yaml"
    path.write_text(f"# written by benchmarks/bench_gpu.py\n"
                    f"data: {{path: PLACEHOLDER, feature_norm: none}}\n"
                    f"engine: {{name: single}}\n"
                    f"model: {{name: {model}, hidden: {HIDDEN[model]}, num_layers: {LAYERS}, heads: {HEADS}, "
                    f"out_heads: 1, dropout: 0.5, attn_dropout: 0.0}}\n"
                    f"optim: {{name: adam, lr: 0.01, weight_decay: 0.0}}\n"
                    f"train: {{epochs: {epochs}, seed: 0, eval_every: {epochs}, progress: false, device: cuda}}\n")
    return path


def run_ours(workdir: Path, data: Path, model: str, epochs: int, timeout: float) -> dict:
    run_dir = workdir / "runs" / f"{data.stem}-{model}-hpc"
    proc = _run([sys.executable, "-m", "hpc_graph.cli", "train", "--config", str(_config(workdir, model, epochs)),
                 "--set", f"data.path={data}", "--set", f"train.run_dir={run_dir}"], timeout)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    s = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines() if line.strip()]
    secs = [r["epoch_seconds"] for r in rows]
    steady = secs[1:] or secs
    return {"epoch_seconds": secs, "median_epoch_seconds": sorted(steady)[len(steady) // 2],
            "peak_gpu_mb": max(s.get("peak_gpu_mb") or [0.0])}


def run_pyg(workdir: Path, data: Path, model: str, epochs: int, timeout: float) -> dict:
    proc = _run([sys.executable, str(ROOT / "benchmarks" / "pyg_baseline.py"), str(data), "--model", model,
                 "--hidden", str(HIDDEN[model]), "--heads", str(HEADS), "--num-layers", str(LAYERS),
                 "--epochs", str(epochs), "--device", "cuda"], timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        return {"error": "out of memory" if "OutOfMemoryError" in tail or "out of memory" in tail else tail}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"epoch_seconds": r["epoch_seconds"], "median_epoch_seconds": r["median_epoch_seconds"],
            "peak_gpu_mb": r["peak_gpu_mb"]}


def largest_scale(points: list[tuple[int, float]], budget_mb: float) -> float | None:
    """Largest (real-valued) scale with ``a + b * 2**S <= budget`` from the two largest measured (scale, MiB)."""
    pts = sorted(points)[-2:]
    if len(pts) < 2:
        return None
    (s1, m1), (s2, m2) = pts
    b = (m2 - m1) / (2.0 ** s2 - 2.0 ** s1)
    if b <= 0:
        return None
    a = m1 - b * 2.0 ** s1
    return math.log2((budget_mb - a) / b) if budget_mb > a else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[18, 20])
    ap.add_argument("--models", nargs="+", choices=sorted(HIDDEN), default=["gcn", "sage", "gat"])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--workdir", type=Path, default=Path("results/bench_gpu"))
    ap.add_argument("--out", type=Path, default=None, help="JSON Lines, one record per run")
    ap.add_argument("--memory-gb", type=float, default=80.0, help="GPU memory budget of the largest-graph estimate")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs: at least 2 (the first epoch compiles and is not counted)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    records = []
    for scale in args.scales:
        t0 = time.perf_counter()
        data = _dataset(args.workdir, scale, args.timeout)
        print(f"scale {scale}: dataset ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        for model in args.models:
            for impl, fn in (("hpc_graph", run_ours), ("pyg", run_pyg)):
                rec = {"scale": scale, "model": model, "impl": impl, **fn(args.workdir, data, model, args.epochs,
                                                                          args.timeout)}
                records.append(rec)
                print(json.dumps(rec), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    # summary table
    by = {(r["scale"], r["model"], r["impl"]): r for r in records}
    print(f"\n{'scale':>5} {'model':>5} {'hpc_graph s':>11} {'PyG s':>9} {'speed-up':>8} "
          f"{'hpc MiB':>9} {'PyG MiB':>9} {'memory':>7}")
    for scale in args.scales:
        for model in args.models:
            o, p = by.get((scale, model, "hpc_graph"), {}), by.get((scale, model, "pyg"), {})
            ot, pt = o.get("median_epoch_seconds"), p.get("median_epoch_seconds")
            om, pm = o.get("peak_gpu_mb"), p.get("peak_gpu_mb")
            print(f"{scale:>5} {model:>5} {ot if ot is None else f'{ot:.4f}':>11} "
                  f"{pt if pt is None else f'{pt:.4f}':>9} "
                  f"{'-' if not (ot and pt) else f'{pt / ot:.2f}x':>8} {om if om is None else f'{om:.0f}':>9} "
                  f"{pm if pm is None else f'{pm:.0f}':>9} {'-' if not (om and pm) else f'{om / pm:.2f}x':>7}")
    budget = args.memory_gb * 1024
    for model in args.models:
        for impl in ("hpc_graph", "pyg"):
            pts = [(r["scale"], r["peak_gpu_mb"]) for r in records
                   if r["model"] == model and r["impl"] == impl and r.get("peak_gpu_mb")]
            s = largest_scale(pts, budget)
            print(f"largest R-MAT scale in {args.memory_gb:g} GB ({model}, {impl}, extrapolated from scales "
                  f"{[p[0] for p in sorted(pts)[-2:]]}): {'-' if s is None else f'{s:.2f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
