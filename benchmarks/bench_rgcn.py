"""Benchmark: R-GCN on a typed R-MAT graph: the typed SpMM against one SpMM per relation, and the
per-rank memory of ``sar`` against ``dp`` on 2 and 4 ranks.

    python benchmarks/bench_rgcn.py kernels --scale 18 --relations 4 8 --width 64 128 --out results/bench_rgcn.json
    python benchmarks/bench_rgcn.py memory --scale 18 --relations 4 --ranks 2 4 --out results/bench_rgcn.json
    python benchmarks/bench_rgcn.py report results/bench_rgcn.json

``kernels`` (one process, all cores): on ``hpc-graph generate rmat --scale S --edge-types R``
(edge factor 16, symmetrised, uniform hashed types), the relation-wise mean aggregation
``out[i, r] = mean_{j -r-> i} x_j`` of float32 ``x[N, F]`` two ways, forward and backward (the
backward of a mean walks the transposed graph):

* ``typed``: one SpMM over the relation-expanded CSR (``N * R`` rows, built once;
  :func:`hpc_graph.ops.csr.relational_csr`), what ``GraphContext.aggregate_relations`` runs;
* ``per-relation``: R SpMMs, one per relation's own CSR (``N`` rows each), stacked.

Both give the same numbers (checked in the run). Median of 7 repetitions after 2 warm-ups.

``memory``: ``mpiexec -n P hpc-graph train`` of a 2-layer R-GCN (hidden 64, 2 bases, dropout 0.5,
Adam, 5 epochs) on the METIS partitions of the same typed graph, engines ``dp`` and ``sar``; the
per-rank peak RSS (``summary.json``), the median epoch (epochs 2..5, slowest rank) and the bytes
sent per epoch. The job runner and environment (threads per rank, OMP_WAIT_POLICY=PASSIVE,
MALLOC_MMAP_THRESHOLD_=1 MiB) are those of ``benchmarks/bench_training.py``; the floor of a rank
(Python, torch, numba, MPI) is measured at scale 10 and reported too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_training as bt  # noqa: E402  (job runner, environment, collection)


def _data(workdir: Path, scale: int, relations: int, timeout: float) -> Path:
    path = workdir / f"rmat-s{scale}-ef16-f128-t{relations}.h5"
    if not path.exists():
        bt._check_call(bt._hpc_graph() + ["generate", "rmat", "-o", str(path), "--scale", str(scale),
                                          "--edge-factor", "16", "--feat-dim", "128", "--num-classes", "16",
                                          "--edge-types", str(relations)], f"generate scale {scale}", timeout)
    return path


def _parts(workdir: Path, src: Path, parts: int, timeout: float) -> Path:
    out = workdir / f"{src.stem}-metis-{parts}"
    if not (out / "partition.json").exists():
        bt._check_call(bt._hpc_graph() + ["partition", str(src), "-o", str(out), "-n", str(parts), "--method",
                                          "metis", "--force"], f"partition {src.name} into {parts}", timeout)
    return out


def _merge(out: Path, key: str, rec: dict[str, Any]) -> None:
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault(key, []).append(rec)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))


def _median_time(fn, reps: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_kernels(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from data_io.dataset import open_dataset
    from hpc_graph.ops.csr import CSR, relational_csr
    from hpc_graph.ops.spmm import spmm

    for r in args.relations:
        src = _data(args.workdir, args.scale, r, args.timeout)
        with open_dataset(src) as ds:
            indptr, indices, etype = ds.indptr(), ds.indices().astype(np.int64), ds.edge_type()
        n = len(indptr) - 1
        t0 = time.perf_counter()
        typed = relational_csr(indptr, indices, etype, r)
        typed.csc(perm=False)
        build_typed = time.perf_counter() - t0
        t0 = time.perf_counter()
        per = []
        for t in range(r):
            sel = torch.arange(t, n * r, r)  # rows (i, t) of the expanded CSR are relation t's rows
            lo, hi = typed.indptr[sel], typed.indptr[sel + 1]
            counts = hi - lo
            ptr = torch.zeros(n + 1, dtype=torch.int64)
            torch.cumsum(counts, 0, out=ptr[1:])
            idx = typed.indices[torch.repeat_interleave(lo - ptr[:-1], counts) + torch.arange(int(ptr[-1]))]
            g = CSR(ptr, idx, n, validate=False)
            g.csc(perm=False)
            per.append(g)
        build_per = time.perf_counter() - t0
        for f in args.width:
            x = torch.randn(n, f, requires_grad=True)
            grad = torch.randn(n, r, f)

            def typed_fwd():
                return spmm(typed, x, "mean").view(n, r, f)

            def per_fwd():
                return torch.stack([spmm(g, x, "mean") for g in per], 1)

            a, b = typed_fwd(), per_fwd()
            torch.testing.assert_close(a, b)
            rec = {"scale": args.scale, "relations": r, "width": f, "num_nodes": n, "num_edges": int(len(indices)),
                   "threads": torch.get_num_threads(), "load_before": bt._load(),
                   "build_s": {"typed": round(build_typed, 3), "per_relation": round(build_per, 3)}}
            for name, fwd in (("typed", typed_fwd), ("per_relation", per_fwd)):
                rec[f"{name}_forward_s"] = round(_median_time(lambda: fwd()), 4)
                rec[f"{name}_fwd_bwd_s"] = round(_median_time(lambda: fwd().backward(grad)), 4)
            rec["load_after"] = bt._load()
            rec["speedup_fwd_bwd"] = round(rec["per_relation_fwd_bwd_s"] / rec["typed_fwd_bwd_s"], 2)
            print(json.dumps(rec), flush=True)
            _merge(args.out, "kernels", rec)


def _config(workdir: Path, epochs: int) -> Path:
    path = workdir / "bench_rgcn.yaml"
    path.write_text("# written by benchmarks/bench_rgcn.py\n"
                    "data: {path: PLACEHOLDER, feature_norm: none}\n"
                    "engine: {name: dp}\n"
                    "model: {name: rgcn, hidden: 64, num_layers: 2, num_bases: 2, dropout: 0.5}\n"
                    "optim: {name: adam, lr: 0.01, weight_decay: 0.0}\n"
                    f"train: {{epochs: {epochs}, seed: 0, eval_every: {epochs}, progress: false}}\n")
    return path


def run_memory(args: argparse.Namespace) -> None:
    cfg = _config(args.workdir, args.epochs)
    for scale in [args.floor_scale, args.scale]:
        for r in args.relations:
            src = _data(args.workdir, scale, r, args.timeout)
            for p in args.ranks:
                pdir = _parts(args.workdir, src, p, args.timeout)
                for engine in args.engines:
                    threads = max(1, args.cores // p)
                    run_dir = args.workdir / "runs" / f"s{scale}-t{r}-{engine}-{p}"
                    cmd = ["mpiexec", "-n", str(p)] + bt._hpc_graph() + [
                        "train", "--config", str(cfg), "--set", f"data.path={pdir}", "--set", f"engine.name={engine}",
                        "--run-dir", str(run_dir)]
                    env = bt._env(threads, "passive", 1 << 20)
                    load = bt._load()
                    job = bt._run_job(cmd, env, args.workdir / "logs" / f"{run_dir.name}.log", args.timeout, 1e12)
                    rec = {"scale": scale, "relations": r, "ranks": p, "engine": engine, "threads_per_rank": threads,
                           "command": " ".join(cmd), "env": bt._env_text(threads, "passive", 1 << 20),
                           "load_before": load, "rc": job["rc"], "wall_s": job["wall_s"],
                           "tree_peak_rss_mb": job["tree_peak_rss_mb"]}
                    if job["rc"] == 0:
                        rec.update(bt.collect({}, run_dir))
                    else:
                        rec["error"] = job["stdout_tail"][-800:]
                    print(json.dumps({k: rec.get(k) for k in ("scale", "relations", "ranks", "engine",
                                                               "max_peak_rss_mb", "median_epoch_s", "rc")}),
                          flush=True)
                    _merge(args.out, "memory", rec)


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    lines = []
    if data.get("kernels"):
        lines += ["| scale | R | F | typed fwd (s) | per-relation fwd (s) | typed fwd+bwd (s) "
                  "| per-relation fwd+bwd (s) | per-relation / typed |", "|---|---|---|---|---|---|---|---|"]
        for k in data["kernels"]:
            lines.append(f"| {k['scale']} | {k['relations']} | {k['width']} | {k['typed_forward_s']} | "
                         f"{k['per_relation_forward_s']} | {k['typed_fwd_bwd_s']} | {k['per_relation_fwd_bwd_s']} | "
                         f"{k['speedup_fwd_bwd']}x |")
        lines.append("")
    if data.get("memory"):
        latest = {}
        for m in data["memory"]:
            latest[(m["scale"], m["relations"], m["ranks"], m["engine"])] = m
        lines += ["| scale | R | ranks | engine | peak RSS per rank (MiB) | max | median epoch (s) | MB sent / epoch |",
                  "|---|---|---|---|---|---|---|---|"]
        for (s, r, p, e), m in sorted(latest.items()):
            if m.get("rc") != 0:
                lines.append(f"| {s} | {r} | {p} | {e} | failed | | | |")
                continue
            lines.append(f"| {s} | {r} | {p} | {e} | {', '.join(f'{v:.0f}' for v in m['peak_rss_mb_per_rank'])} | "
                         f"{m['max_peak_rss_mb']:.0f} | {m['median_epoch_s']:.3f} | "
                         f"{(m['bytes_per_epoch'] or 0) / 1e6:.0f} |")
        for (s, r, p, e), m in sorted(latest.items()):
            if e == "sar" and (s, r, p, "dp") in latest and m.get("rc") == 0 and latest[(s, r, p, "dp")].get("rc") == 0:
                lines.append(f"\nscale {s}, R {r}, {p} ranks: sar / dp max peak RSS = "
                             f"{m['max_peak_rss_mb'] / latest[(s, r, p, 'dp')]['max_peak_rss_mb']:.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("kernels", "memory"):
        p = sub.add_parser(name)
        p.add_argument("--scale", type=int, default=18)
        p.add_argument("--relations", type=int, nargs="+", default=[4])
        p.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_rgcn_work")
        p.add_argument("--out", type=Path, default=ROOT / "results" / "bench_rgcn.json")
        p.add_argument("--timeout", type=float, default=1800.0)
    sub.choices["kernels"].add_argument("--width", type=int, nargs="+", default=[64, 128])
    m = sub.choices["memory"]
    m.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    m.add_argument("--engines", nargs="+", choices=("dp", "sar"), default=["dp", "sar"])
    m.add_argument("--epochs", type=int, default=5)
    m.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    m.add_argument("--floor-scale", type=int, default=10)
    r = sub.add_parser("report")
    r.add_argument("path", type=Path)
    args = ap.parse_args()
    if args.cmd == "report":
        print(report(args.path))
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    (run_kernels if args.cmd == "kernels" else run_memory)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
