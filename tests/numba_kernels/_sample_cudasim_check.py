"""CUDA sample twin vs the CPU twin and the Python reference, under ``NUMBA_ENABLE_CUDASIM=1``.

Started by test_sample_cuda.py in a subprocess so the simulator setting never
reaches the CPU tests. Tiny inputs (the simulator runs every GPU thread as a
Python thread, and the block kernel's bitonic sort synchronises its block at
every step, so it gets few rows: each kind once per launch). Exits non-zero on
a mismatch; prints ``OK sample`` at the end.

``python _sample_cudasim_check.py ptx`` (without the simulator) instead compiles
both kernels to PTX with libNVVM, which needs no GPU. Prints ``SKIP ptx`` when
libNVVM is missing, ``OK ptx`` on success.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root, for numba_kernels
sys.path.insert(0, str(HERE))

PTX = sys.argv[1:] == ["ptx"]
assert PTX or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("HPC_GRAPH_REAL_GPU") == "1", \
    "run with NUMBA_ENABLE_CUDASIM=1 (or HPC_GRAPH_REAL_GPU=1 on a machine with a GPU: tests/gpu)"
assert not PTX or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "0", "ptx mode runs without the simulator"
from numba import cuda  # noqa: E402

import _sample_ref as R  # noqa: E402
from numba_kernels import get_kernel  # noqa: E402
from numba_kernels.cpu import sample as C  # noqa: E402
from numba_kernels.cuda import sample as G  # noqa: E402

warnings.simplefilter("ignore", RuntimeWarning)  # uint64 hash arithmetic wraps on purpose
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # simulated threads hand the GIL over at every syncthreads
    sys.setswitchinterval(5e-4)

FILL = -7


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def run_both(indptr, nbrs, rows, ids, fanout, key, grid=None, block_grid=None):
    """Sample on both twins (and the reference); ``grid``/``block_grid`` force grid-stride loops."""
    m = rows.shape[0]
    F = C.sample_width(indptr, rows, fanout)
    cnt_c = np.full(m, FILL, np.int64)
    out_c = np.full(m * F, FILL, np.int64)
    C.sample_neighbors(indptr, nbrs, rows, ids, fanout, key, cnt_c, out_c)
    cnt_g = dev(np.full(m, FILL, np.int64))
    out_g = dev(np.full(m * F, FILL, np.int64))
    args = (dev(indptr), dev(nbrs), dev(rows), dev(ids))
    if grid is None:
        get_kernel("sample.sample_neighbors", "cuda")(*args, fanout, key, cnt_g, out_g)
    else:
        kh = G.key_hash(key)
        G._sample_kernel[grid](*args, fanout, F, kh, cnt_g, out_g)
        if block_grid is not None:
            G._sample_block_kernel[block_grid](*args, fanout, F, kh, out_g)
    tag = f"fanout={fanout} key={key} m={m}"
    cnt_ref, out_ref = R.sample(indptr, nbrs, rows, ids, fanout, key, fill=FILL)
    np.testing.assert_array_equal(cnt_c, cnt_ref, err_msg=f"CPU counts {tag}")
    np.testing.assert_array_equal(out_c, out_ref, err_msg=f"CPU samples {tag}")
    np.testing.assert_array_equal(cnt_g.copy_to_host(), cnt_c, err_msg=f"CUDA counts {tag}")
    np.testing.assert_array_equal(out_g.copy_to_host(), out_c, err_msg=f"CUDA samples {tag}")
    return out_c


def check_small_graph():
    rng = np.random.default_rng(4)
    indptr, nbrs = R.powerlaw_graph(rng, 40, avg=6.0, id_offset=2**40)
    rows = rng.integers(0, 40, 30).astype(np.int64)
    rows[:3] = np.argsort(np.diff(indptr))[-3:]  # the largest rows, and an empty one below
    rows[3] = int(np.flatnonzero(np.diff(indptr) == 0)[0])
    ids = rows + 1000
    a = None
    for fanout in (1, 3, 5, 10, -1):
        out = run_both(indptr, nbrs, rows, ids, fanout, key=2024)
        if fanout == 5:
            a = out
    b = run_both(indptr, nbrs, rows, ids, 5, key=2025)
    assert (a != b).any(), "different keys must give different samples"
    run_both(indptr, nbrs, rows, ids, 4, key=np.uint64(2**64 - 3), grid=(2, 4))  # grid-stride loop


def check_block_kernel():
    """Rows whose selection exceeds LOCAL_MAX: block kernel, plain and complement."""
    degs = [300, 150, 0, 90, 1000, 170, 200]  # fanout 100: s = 100, 50 (compl.), 0, 0 (k = deg), 100, 70 (compl.), 100
    indptr = np.zeros(len(degs) + 1, np.int64)
    np.cumsum(degs, out=indptr[1:])
    nbrs = np.concatenate([np.arange(d, dtype=np.int64) * 3 + 5 for d in degs])
    assert G.LOCAL_MAX < 100
    # the production launch (a block per row): a plain and a complement selection in the block kernel, rows it
    # skips (s <= LOCAL_MAX in the thread kernel: complement s = 50, empty, k = deg)
    rows = np.array([0, 1, 2, 3, 5], np.int64)
    run_both(indptr, nbrs, rows, rows + 11, 100, key=9)
    # one 32-thread block for all rows (each thread sorts 4 of the 128 slots; the shared table reused by the next
    # row, a skipped row in between): the largest row (plain), then a complement selection
    rows = np.array([4, 1, 5], np.int64)
    run_both(indptr, nbrs, rows, rows + 11, 100, key=10, grid=(1, 4), block_grid=(1, 32))


def check_errors():
    z = dev(np.zeros(2, np.int64))
    for bad in (0, -2, G.SHARED_MAX + 1):
        try:
            G.sample_neighbors(z, z, z, z, bad, 1, z, z)
        except ValueError as e:
            assert "fanout" in str(e), e
        else:
            raise AssertionError(f"fanout={bad} accepted")


def compile_ptx() -> int:
    from numba import types as T
    from numba.cuda.cudadrv import nvvm

    if not nvvm.is_available():
        print("SKIP ptx: libNVVM not available")
        return 0
    if not cuda.is_available():  # device functions ask the current device for its compute capability
        import types

        import numba.cuda.dispatcher as dispatcher

        dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    i64 = T.int64[::1]
    sigs = [(G._sample_kernel, (i64, i64, i64, i64, T.int64, T.int64, T.uint64, i64, i64)),
            (G._sample_block_kernel, (i64, i64, i64, i64, T.int64, T.int64, T.uint64, i64))]
    for kernel, sig in sigs:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".entry" in ptx
    print("OK ptx")
    return 0


def main() -> int:
    if PTX:
        return compile_ptx()
    check_errors()
    check_small_graph()
    check_block_kernel()
    print("OK sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
