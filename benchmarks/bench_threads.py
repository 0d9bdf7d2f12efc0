"""Benchmark: what a plain ``mpiexec -n R hpc-graph train`` costs, with no thread variables set.

    python benchmarks/bench_threads.py --out results/bench_threads.json
    python benchmarks/bench_threads.py --before 0de50a9 --out results/bench_threads_before.json

Every run is a fresh job started the way a new user starts one::

    mpiexec -n R python -m hpc_graph.cli -q train --config configs/<engine>_<model>.yaml \\
        --set data.path=... --set train.epochs=E --run-dir ...

from an environment with ``NUMBA_NUM_THREADS``, ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``OMP_WAIT_POLICY`` removed,
so each rank decides its own threads (``hpc_graph.comm.threads``). The grid:
Cora (``../shared/datasets/cora.npz``, or ``--cora``) and R-MAT scale 16
(``hpc-graph generate rmat --scale 16``), engines ``dp`` and ``sar``, models
GCN and GAT (the example configs' sizes), 1, 2 and 4 ranks (METIS parts), and
the ``single`` engine on the dataset file as the reference. The median epoch
time (``summary.json``: slowest rank per epoch, median over epochs) and the
threads every rank decided are recorded; the ratio to ``single`` is the
issue's target (2 ranks within 2x on Cora, 4 ranks within 5x).

``--before REV`` runs the same grid with the code of git revision ``REV`` (a
temporary ``git worktree`` put first on ``PYTHONPATH``), for the numbers
before a change.

``--oversubscribe`` adds runs that ask for more threads than the machine has
(2 ranks x ``--threads`` = cores), comparing the decided passive OpenMP wait
with ``OMP_WAIT_POLICY=ACTIVE`` and with numba's ``workqueue`` threading layer.
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
               "OMP_WAIT_POLICY", "HPC_GRAPH_EXPORTED_THREADS", "NUMBA_THREADING_LAYER")


def _env(code: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _hpc(code: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", *args], check=True, env=_env(code),
                   stdout=subprocess.DEVNULL)


def prepare(work: Path, cora: Path, code: Path) -> dict[str, Path]:
    """Dataset files and their METIS parts (1, 2, 4), generated once into ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    files = {"cora": work / "cora.h5", "rmat16": work / "rmat16.h5"}
    if not files["cora"].exists():
        _hpc(code, "convert", "npz", str(cora), "-o", str(files["cora"]))
    if not files["rmat16"].exists():
        _hpc(code, "generate", "rmat", "--scale", "16", "-o", str(files["rmat16"]))
    for name, path in files.items():
        for n in (1, 2, 4):
            parts = work / f"{name}-{n}"
            if not parts.exists():
                _hpc(code, "partition", str(path), "-o", str(parts), "-n", str(n))
    return files


def run_one(code: Path, work: Path, data: str, engine: str, model: str, ranks: int, epochs: int,
            extra_env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    path = work / f"{data}.h5" if engine == "single" else work / f"{data}-{ranks}"
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config",
           str(REPO / "configs" / f"{'dp' if engine == 'single' else engine}_{model}.yaml"),
           "--set", f"data.path={path}", "--set", f"engine.name={engine}", "--set", f"train.epochs={epochs}",
           "--set", f"train.eval_every={epochs}", "--set", "train.progress=false", "--run-dir", str(run_dir),
           *extra_args]
    if engine != "single":
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), *cmd]
    t0 = time.perf_counter()
    # cwd: ``python -m`` puts it first on sys.path, so it picks the code that runs
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(code, extra_env), timeout=1800, cwd=code)
    wall = time.perf_counter() - t0
    rec = {"data": data, "engine": engine, "model": model, "ranks": ranks, "epochs": epochs,
           "env": extra_env or {}, "args": list(extra_args), "wall_seconds": wall, "returncode": proc.returncode}
    if proc.returncode != 0:
        rec["error"] = proc.stderr[-2000:]
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
        rec["median_epoch_ms"] = 1000 * summary["median_epoch_seconds"]
        rec["threads"] = [t.get("threads") for t in summary.get("threads_per_rank", [])] or None
        rec["test_acc"] = summary["test_acc"]
    shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/bench_threads.json")
    p.add_argument("--workdir", default="results/bench_threads_work")
    p.add_argument("--cora", default=str(REPO.parent / "shared" / "datasets" / "cora.npz"))
    p.add_argument("--before", metavar="REV", help="run the grid with the code of this git revision")
    p.add_argument("--datasets", nargs="+", default=["cora", "rmat16"])
    p.add_argument("--engines", nargs="+", default=["dp", "sar"])
    p.add_argument("--models", nargs="+", default=["gcn", "gat"])
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--epochs", type=int, default=0, help="epochs per run (default: 60 Cora, 12 R-MAT)")
    p.add_argument("--oversubscribe", action="store_true", help="also the oversubscription comparison")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                   help="--oversubscribe: threads per rank asked for (default: CPU count)")
    args = p.parse_args(argv)

    work = Path(args.workdir).resolve()
    code, worktree = REPO, None
    if args.before:
        worktree = Path(tempfile.mkdtemp(prefix="before-"))
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), args.before],
                       check=True, capture_output=True)
        code = worktree
    try:
        prepare(work, Path(args.cora), REPO)
        records = []
        load0 = os.getloadavg()
        for data in args.datasets:
            epochs = args.epochs or (60 if data == "cora" else 12)
            for model in args.models:
                ref = run_one(code, work, data, "single", model, 1, epochs)
                records.append(ref)
                print(f"{data:7} {model:4} single  1 rank : {ref.get('median_epoch_ms', float('nan')):8.2f} ms",
                      flush=True)
                for engine in args.engines:
                    for ranks in args.ranks:
                        rec = run_one(code, work, data, engine, model, ranks, epochs)
                        if "median_epoch_ms" in rec and "median_epoch_ms" in ref:
                            rec["vs_single"] = rec["median_epoch_ms"] / ref["median_epoch_ms"]
                        records.append(rec)
                        print(f"{data:7} {model:4} {engine:6} {ranks} ranks: "
                              f"{rec.get('median_epoch_ms', float('nan')):8.2f} ms "
                              f"({rec.get('vs_single', float('nan')):.2f}x single), threads {rec.get('threads')}"
                              + (f" FAILED: {rec['error'][-300:]}" if "error" in rec else ""), flush=True)
        if args.oversubscribe:
            for label, env in (("passive (decided)", {}), ("OMP_WAIT_POLICY=ACTIVE", {"OMP_WAIT_POLICY": "ACTIVE"}),
                               ("numba workqueue", {"NUMBA_THREADING_LAYER": "workqueue"})):
                for data, model, engine in (("rmat16", "gcn", "dp"), ("cora", "gat", "sar")):
                    epochs = args.epochs or (60 if data == "cora" else 12)
                    rec = run_one(code, work, data, engine, model, 2, epochs, env, ("--threads", str(args.threads)))
                    rec["label"] = f"oversubscribed: {label}"
                    records.append(rec)
                    print(f"oversubscribed {label:24} {data:7} {model:4} {engine}: "
                          f"{rec.get('median_epoch_ms', float('nan')):8.2f} ms", flush=True)
        out = {"before": args.before, "cpus": os.cpu_count(), "load_before": load0, "load_after": os.getloadavg(),
               "records": records}
        ratios = [r["vs_single"] for r in records if "vs_single" in r]
        if ratios:
            out["median_vs_single"] = statistics.median(ratios)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out} (load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f})")
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
