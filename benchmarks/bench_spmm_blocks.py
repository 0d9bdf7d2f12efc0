"""Benchmark: the CPU sum SpMM kernel unblocked and over column ranges, to see which suits this machine.

    python benchmarks/bench_spmm_blocks.py results/rmat20-directed.h5 --feat 128 --ranges 0 2 8 16 32

``hpc_graph.ops.spmm`` cuts the sources of a large ``x`` into ``min(round(|x| / BLOCK_BYTES),
MAX_BLOCKS)`` column ranges (docs/benchmarks.md, history §8.1: on one machine 8 ranges were 1.5x faster
than none, on another 11 % slower). Calls alternate between the variants (one warm-up each, then
``--repeat`` rounds), into one preallocated output, so every variant sees the same machine state;
prints the median and the fastest call of each. ``--from-commit-dir DIR`` also times the kernel module of
another checkout (e.g. a ``git worktree`` of an older commit) unblocked, for a before/after A/B.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # numba's cache pickles the module by name
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graph", type=Path, help="dataset file (hpc-graph generate rmat ...)")
    ap.add_argument("--feat", type=int, default=128)
    ap.add_argument("--ranges", type=int, nargs="+", default=[0, 2, 8, 16])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--from-commit-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    import numba

    from data_io.dataset import open_dataset
    from numba_kernels.cpu import spmm as K

    numba.set_num_threads(args.threads)
    with open_dataset(args.graph) as ds:
        g = ds.load()
    ip = np.asarray(g.indptr, dtype=np.int64)
    n = len(ip) - 1
    ix = np.asarray(g.indices, dtype=np.int32 if n < 2**31 else np.int64)
    x = np.random.default_rng(0).standard_normal((n, 1, args.feat), dtype=np.float32)
    out = np.empty_like(x)
    e0, w0, s0 = np.empty(0, np.int64), np.empty((0, 1), np.float32), np.empty(0, np.float32)
    calls = {}
    for nb in args.ranges:
        if nb <= 1:
            calls["unblocked"] = lambda: K.spmm_sum(ip, ix, e0, w0, s0, x, out, False)
        else:
            bp, bi, be = K.column_blocks(ip, ix, e0, n, nb, with_eids=False)
            calls[f"{nb} ranges"] = (lambda bp=bp, bi=bi, be=be, nb=nb:
                                     K.spmm_sum_blocked(ip, bp, bi, be, nb, w0, s0, x, out, False))
    if args.from_commit_dir is not None:
        other = _module(args.from_commit_dir / "numba_kernels" / "cpu" / "spmm.py", "spmm_other")
        calls[f"unblocked ({args.from_commit_dir})"] = lambda: other.spmm_sum(ip, ix, e0, w0, s0, x, out, False)
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(args.repeat):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"{args.graph.name}: {n} rows, {len(ix)} edges, F = {args.feat}, {args.threads} threads")
    print("| variant | median s | fastest s |\n|---|---|---|")
    for name, v in times.items():
        print(f"| {name} | {np.median(v):.4f} | {min(v):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
