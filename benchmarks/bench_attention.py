"""Benchmark: one graph-transformer attention op, sparse pattern vs dense SDPA, forward + backward.

    python benchmarks/bench_attention.py --sizes 16384 32768 65536 131072 262144 \\
           --dense-sizes 2048 4096 8192 --threads 2 --out results/bench_attention.json

For each sequence length S: a random graph of average in-degree ``--degree`` (uniform random
edges made undirected), its :func:`~hpc_graph.graph.attention_pattern.build_pattern` pattern
(self loops, edges, the chain, a global token), random q, k, v float32[S + 1, H, d_h], and
``pattern_attention`` forward + backward (median of ``--repeat`` calls after one warm-up), with the
extra peak RSS of the call. The dense reference is torch's ``scaled_dot_product_attention`` (its
CPU flash kernel, no mask) forward + backward on the same q, k, v, run up to the largest of
``--dense-sizes`` that fits in 60 % of the free memory (its CPU backward keeps S x S matrices per
head: ~6 GB at S = 8K, 8 heads); beyond, its time is extrapolated with the exponent fitted to the
measured sizes (log-log least squares, ~2 expected). ``--ours-dense-sizes`` also times our own
exact dense mode (``pattern_attention(..., dense=True)``: the pattern's entries with their bias plus
every other node pair) with the fused CPU kernel, and ``--tiles-sizes`` the same through torch tiles.
Records are JSON (one list) in ``--out``; the table is printed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _graph(n: int, degree: int, seed: int):
    rng = np.random.default_rng(seed)
    m = n * degree // 2
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])
    keep = src != dst
    key = np.unique(dst[keep] * n + src[keep])
    dst, src = key // n, key % n
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(np.int64)


def _time(fn, repeat: int):
    from hpc_graph.bench.memory import PeakRSS

    fn()
    runs, peak = [], 0.0
    for _ in range(repeat):
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        peak = max(peak, mem.extra_mb)
    return statistics.median(runs), peak


def _qkv(T: int, H: int, d: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, d, generator=gen).requires_grad_() for _ in range(3)]


def sparse_step(S: int, H: int, d: int, degree: int, repeat: int, seed: int = 0) -> dict:
    from hpc_graph.graph.attention_pattern import build_pattern
    from hpc_graph.ops.graph_attention import code_bias, pattern_attention

    indptr, indices = _graph(S, degree, seed)
    t0 = time.perf_counter()
    pat = build_pattern(indptr, indices, S, global_token=True)
    build_s = time.perf_counter() - t0
    q, k, v = _qkv(S + 1, H, d, seed)
    bias_table = torch.randn(5, H, requires_grad=True)
    gout = torch.randn(S + 1, H, d)

    def step():
        out = pattern_attention(pat.csr, q, k, v, bias=code_bias(bias_table, pat.codes))
        out.backward(gout)
        q.grad = k.grad = v.grad = bias_table.grad = None

    secs, peak = _time(step, repeat)
    return {"impl": "sparse", "S": S, "heads": H, "dim": d, "pattern_edges": pat.csr.num_edges,
            "graph_edges": int(indices.shape[0]), "seconds": secs, "peak_mb": peak, "build_s": build_s}


def dense_step(S: int, H: int, d: int, repeat: int, seed: int = 0) -> dict:
    q, k, v = (t.detach().transpose(0, 1).contiguous().requires_grad_() for t in _qkv(S + 1, H, d, seed))
    gout = torch.randn(H, S + 1, d)

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out.backward(gout)
        q.grad = k.grad = v.grad = None

    secs, peak = _time(step, repeat)
    return {"impl": "dense_sdpa", "S": S, "heads": H, "dim": d, "seconds": secs, "peak_mb": peak}


def ours_dense_step(S: int, H: int, d: int, degree: int, repeat: int, fused: bool, seed: int = 0) -> dict:
    from hpc_graph.graph.attention_pattern import build_pattern
    from hpc_graph.ops.graph_attention import code_bias, pattern_attention

    indptr, indices = _graph(S, degree, seed)
    pat = build_pattern(indptr, indices, S, global_token=True)
    q, k, v = _qkv(S + 1, H, d, seed)
    bias_table = torch.randn(5, H, requires_grad=True)
    far = torch.randn(H, requires_grad=True)
    gout = torch.randn(S + 1, H, d)

    def step():
        out = pattern_attention(pat.csr, q, k, v, bias=code_bias(bias_table, pat.codes), dense=True, num_nodes=S,
                                far_bias=far, fused=fused)
        out.backward(gout)
        q.grad = k.grad = v.grad = bias_table.grad = far.grad = None

    secs, peak = _time(step, repeat)
    return {"impl": "dense_ours_fused" if fused else "dense_ours_tiles", "S": S, "heads": H, "dim": d,
            "seconds": secs, "peak_mb": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768, 65536, 131072, 262144])
    ap.add_argument("--dense-sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--ours-dense-sizes", type=int, nargs="*", default=[],
                    help="also time our exact dense mode with the fused CPU kernel at these S")
    ap.add_argument("--tiles-sizes", type=int, nargs="*", default=[],
                    help="also time our exact dense mode through torch tiles at these S")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=8, help="features per head d_h (default: 8)")
    ap.add_argument("--degree", type=int, default=16, help="average in-degree of the random graph (default: 16)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_attention.json")
    args = ap.parse_args(argv)
    from hpc_graph.comm.threads import configure_threads

    configure_threads(args.threads)
    recs = []
    import psutil

    for S in args.dense_sizes:
        need = 3 * args.heads * (S + 1) ** 2 * 4  # torch's CPU backward keeps S x S score/grad matrices per head
        if need > 0.6 * psutil.virtual_memory().available:
            print(f"dense  S={S:>8}: skipped, needs ~{need / 2**30:.0f} GiB", flush=True)
            continue
        recs.append(dense_step(S, args.heads, args.dim, args.repeat))
        print(f"dense  S={S:>8}: {recs[-1]['seconds']:.3f} s, +{recs[-1]['peak_mb']:.0f} MB", flush=True)
    for sizes, fused in ((args.ours_dense_sizes, True), (args.tiles_sizes, False)):
        for S in sizes:
            recs.append(ours_dense_step(S, args.heads, args.dim, args.degree, args.repeat, fused))
            print(f"{recs[-1]['impl']} S={S:>8}: {recs[-1]['seconds']:.3f} s, +{recs[-1]['peak_mb']:.0f} MB",
                  flush=True)
    dense = [(r["S"], r["seconds"]) for r in recs if r["impl"] == "dense_sdpa"]
    xs, ys = np.log([s for s, _ in dense]), np.log([t for _, t in dense])
    slope, icpt = np.polyfit(xs, ys, 1) if len(dense) >= 2 else (2.0, math.log(dense[0][1]) - 2 * xs[0])
    print(f"dense SDPA time ~ S^{slope:.2f}", flush=True)
    for S in args.sizes:
        r = sparse_step(S, args.heads, args.dim, args.degree, args.repeat)
        measured = {s: t for s, t in dense}
        r["dense_seconds"] = measured.get(S, float(math.exp(icpt + slope * math.log(S))))
        r["dense_measured"] = S in measured
        r["speedup"] = r["dense_seconds"] / r["seconds"]
        r["dense_exponent"] = float(slope)
        recs.append(r)
        print(f"sparse S={S:>8}: {r['seconds']:.3f} s, +{r['peak_mb']:.0f} MB, pattern {r['pattern_edges']} entries; "
              f"dense {'measured' if r['dense_measured'] else 'extrapolated'} {r['dense_seconds']:.2f} s -> "
              f"{r['speedup']:.1f}x", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
