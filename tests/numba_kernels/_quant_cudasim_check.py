"""CUDA quant twin vs the CPU twin and the NumPy reference, under ``NUMBA_ENABLE_CUDASIM=1``.

Started by test_quant_cuda.py in a subprocess so the simulator setting never
reaches the CPU tests. Tiny inputs (the simulator runs every GPU thread as a
Python thread, and ``row_range``'s shared-memory reduction synchronises its
block at every step, so each of its cases runs once: every dtype, D = 0, one
feature, fewer features than threads, a 64-thread block, NaN/+-Inf rows,
rows sent twice). Exits non-zero on a mismatch; prints ``OK quant`` at the end.

``python _quant_cudasim_check.py ptx`` (without the simulator) instead compiles
every kernel to PTX for both dtypes with libNVVM, which needs no GPU: the
simulator runs the kernels as Python and would miss a numba-cuda typing error.
It also checks that the pack kernel's floating-point arithmetic cannot be
contracted (no ``fma``/``mad``, every float ``add``/``sub``/``mul``/``div``
with an explicit ``.rn``), which byte identity with the CPU twin on a real GPU
relies on and the simulator cannot see. Prints ``SKIP ptx`` when libNVVM is
missing, ``OK ptx`` on success.
"""
from __future__ import annotations

import os
import re
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

import _quant_ref as R  # noqa: E402
from numba_kernels import get_kernel  # noqa: E402
from numba_kernels.cpu import quant as C  # noqa: E402
from numba_kernels.cuda import quant as G  # noqa: E402

warnings.simplefilter("ignore", RuntimeWarning)  # uint64 hash arithmetic wraps on purpose
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # simulated threads hand the GIL over at every syncthreads
    sys.setswitchinterval(5e-4)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def check_message(counts, D, dtype, key, grid=None, ranges=True, unpack=True):
    """Pack/unpack one message on both twins; ``grid=(blocks, threads)`` forces grid-stride loops.

    ``ranges``/``unpack``: also the message's row ranges / the unpack (each ``row_range`` block
    synchronises at every reduction step: the costliest kernel under the simulator)."""
    rng = np.random.default_rng(sum(counts) * 100 + D)
    m = sum(counts)
    msg = R.make_message(rng, counts, D, dtype, constant_rows=[m // 2] if m > 2 else [],
                         nan_rows=[m - 1] if m > 2 else [])
    x, rows, ids, gs = msg["x"], msg["rows"], msg["ids"], msg["group_start"]
    cs = G.group_layout(gs, D)
    tag = f"counts={counts} D={D} {np.dtype(dtype).name}"

    # row ranges (the message's own zero/scale come from the reference)
    if ranges:
        lo_c, hi_c = np.empty(m, np.float32), np.empty(m, np.float32)
        C.row_range(x, rows, lo_c, hi_c)
        lo_g, hi_g = dev(np.full(m, 7, np.float32)), dev(np.full(m, 7, np.float32))
        G.row_range(dev(x), dev(rows), lo_g, hi_g)
        np.testing.assert_array_equal(lo_g.copy_to_host(), lo_c, err_msg=f"row_range lo {tag}")
        np.testing.assert_array_equal(hi_g.copy_to_host(), hi_c, err_msg=f"row_range hi {tag}")

    # pack
    codes_c = np.full(int(cs[4]), 0xA5, np.uint8)
    C.quantize_pack(x, rows, msg["zero"], msg["scale"], ids, key, gs, cs, codes_c)
    codes_g = dev(np.full(int(cs[4]), 0xA5, np.uint8))
    args = (dev(x), dev(rows), dev(msg["zero"]), dev(msg["scale"]), dev(ids))
    if grid is None:
        get_kernel("quant.quantize_pack", "cuda")(*args, key, dev(gs), dev(cs), codes_g)
    else:
        G._pack_kernel[grid](*args, G.key_hash(key), dev(gs), dev(cs), codes_g)
    codes_g = codes_g.copy_to_host()
    q_ref = R.quantize(x, rows, msg["zero"], msg["scale"], ids, key, gs)
    np.testing.assert_array_equal(codes_c, R.pack(q_ref, gs), err_msg=f"CPU codes {tag}")
    np.testing.assert_array_equal(codes_g, codes_c, err_msg=f"CUDA codes {tag}")
    if not unpack:
        return codes_g

    # unpack into scattered output rows; other rows stay untouched
    out_rows = rng.permutation(m + 4)[:m].astype(np.int64)
    out_c = np.full((m + 4, D), -123.0, dtype)
    C.unpack_dequantize(codes_c, msg["zero"], msg["scale"], gs, cs, out_rows, out_c)
    out_g = dev(np.full((m + 4, D), -123.0, dtype))
    uargs = (dev(codes_g), dev(msg["zero"]), dev(msg["scale"]), dev(gs), dev(cs), dev(out_rows), out_g)
    if grid is None:
        G.unpack_dequantize(*uargs)
    else:
        G._unpack_kernel(dtype)[grid](*uargs)
    out_g = out_g.copy_to_host()
    np.testing.assert_array_equal(np.isnan(out_g), np.isnan(out_c), err_msg=f"NaN rows {tag}")
    np.testing.assert_allclose(out_g, out_c, rtol=1e-6, atol=1e-6, err_msg=f"dequantised {tag}")
    np.testing.assert_array_equal(out_c[out_rows], R.dequantize(q_ref, msg["zero"], msg["scale"], dtype))
    return codes_g


def check_row_range_nonfinite():
    # both dtypes: D = 0 (two rows), more features than 32 (a 64-thread block, idle threads, one more reduction
    # step); one dtype each: a single feature, a few (check_message adds both dtypes' messages of 3-13 features,
    # rows sent twice). Rows: finite, NaN (last feature), +Inf (first), -Inf (middle)
    for dtype, D in ((np.float32, 0), (np.float64, 0), (np.float32, 1), (np.float64, 5), (np.float32, 40),
                     (np.float64, 40)):
        rng = np.random.default_rng(D)
        x = rng.standard_normal((6, D)).astype(dtype)
        if D:
            x[1, D - 1] = np.nan
            x[3, 0] = np.inf
            x[4, D // 2] = -np.inf
        rows = np.array([5, 1, 3, 4] if D else [0, 1], np.int64)
        lo, hi = dev(np.full(len(rows), 7, np.float32)), dev(np.full(len(rows), 7, np.float32))
        G.row_range(dev(x), dev(rows), lo, hi)
        want_lo, want_hi = R.row_range(x, rows)
        np.testing.assert_array_equal(lo.copy_to_host(), want_lo, err_msg=f"row_range D={D}")
        np.testing.assert_array_equal(hi.copy_to_host(), want_hi, err_msg=f"row_range D={D}")
    # several rows per block (grid-stride over rows: three each)
    x = np.arange(30, dtype=np.float32).reshape(6, 5)
    rows = np.arange(6, dtype=np.int64)[::-1].copy()
    lo, hi = dev(np.zeros(6, np.float32)), dev(np.zeros(6, np.float32))
    G._row_range_kernel[2, 32](dev(x), dev(rows), lo, hi)
    np.testing.assert_array_equal(lo.copy_to_host(), x[rows].min(1))
    np.testing.assert_array_equal(hi.copy_to_host(), x[rows].max(1))


def check_no_contraction(ptx: str, tag: str) -> None:
    """Float arithmetic in ``ptx`` is explicitly rounded (``.rn``) and never fused."""
    ops = re.findall(r"^\s*((?:add|sub|mul|div|fma|mad|rcp)(?:\.[a-z0-9]+)*\.f(?:32|64))\b", ptx, re.M)
    assert ops, f"no float arithmetic found in the pack kernel ({tag})"
    fused = [op for op in ops if op.startswith(("fma", "mad"))]
    loose = [op for op in ops if ".rn" not in op]
    assert not fused and not loose, f"pack kernel ({tag}): fused {fused}, without .rn {loose}"
    for need in ("div.rn.f32", "mul.rn.f32", "sub.rn.f32", "add.rn.f64"):
        assert need in ops, f"pack kernel ({tag}) lacks {need}: {sorted(set(ops))}"


def check_special_values():
    """Rows with a finite scale holding NaN/+-Inf/out-of-range values, negative scales, exact grid values."""
    for dtype in (np.float32, np.float64):
        D = 11
        x = np.linspace(-1.0, 1.0, 4 * D).reshape(4, D).astype(dtype)
        x[0, 1], x[0, 4], x[0, 7] = np.nan, np.inf, -np.inf
        x[1] = (np.arange(D) % 4 * 0.25 - 0.5)  # exact multiples of s = 0.25 from z = -0.5
        rows = np.array([0, 1, 2, 3, 0, 1, 2, 3], np.int64)
        gs = np.array([0, 2, 4, 6, 8], np.int64)
        zero = np.array([-0.5, -0.5, -0.2, 0, -0.5, -0.5, -1.0, 0], np.float32)
        scale = np.array([0.5, 0.25, 0.1, -1.0, 0.05, 0.25, 1 / 255, 0.001], np.float32)
        ids = np.arange(8, dtype=np.int64) * 1000
        cs = G.group_layout(gs, D)
        codes_c = np.zeros(int(cs[4]), np.uint8)
        C.quantize_pack(x, rows, zero, scale, ids, 77, gs, cs, codes_c)
        codes_g = dev(np.full(int(cs[4]), 0xA5, np.uint8))
        G.quantize_pack(dev(x), dev(rows), dev(zero), dev(scale), dev(ids), 77, dev(gs), dev(cs), codes_g)
        np.testing.assert_array_equal(codes_g.copy_to_host(), codes_c, err_msg=f"special values {dtype}")
        q = R.unpack(codes_c, gs, D)
        np.testing.assert_array_equal(q, R.quantize(x, rows, zero, scale, ids, 77, gs))
        assert (q[3] == 0).all() and q[0, 4] == 1 and q[0, 1] == 0 and q[0, 7] == 0
        np.testing.assert_array_equal(q[5], np.arange(D) % 4)  # grid values never move


def compile_ptx() -> int:
    """Compile the three kernels for float32 and float64 inputs (compute capability 9.0)."""
    from numba import types as T
    from numba.cuda.cudadrv import nvvm

    if not nvvm.is_available():
        print("SKIP ptx: libNVVM not available")
        return 0
    if not cuda.is_available():  # device functions ask the current device for its compute capability
        import types

        import numba.cuda.dispatcher as dispatcher

        dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    i64, f32, u8 = T.int64[::1], T.float32[::1], T.uint8[::1]
    for ft in (T.float32, T.float64):
        x = ft[:, ::1]
        sigs = [(G._row_range_kernel, (x, i64, f32, f32)),
                (G._pack_kernel, (x, i64, f32, f32, i64, T.uint64, i64, i64, u8)),
                (G._unpack_kernel(np.dtype(str(ft))), (u8, f32, f32, i64, i64, i64, x))]
        for kernel, sig in sigs:
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
            assert ".entry" in ptx
            if kernel is G._pack_kernel:
                check_no_contraction(ptx, str(ft))
    print("OK ptx")
    return 0


def main() -> int:
    if PTX:
        return compile_ptx()
    check_row_range_nonfinite()
    check_special_values()
    a = check_message((2, 1, 3, 2), 13, np.float32, key=2024)
    b = check_message((2, 1, 3, 2), 13, np.float32, key=2025, ranges=False, unpack=False)  # same x
    assert (a != b).any(), "different keys must give different codes"
    check_message((0, 3, 0, 1), 3, np.float64, key=np.uint64(2**63 + 5))
    check_message((1, 0, 0, 0), 7, np.float64, key=1)
    check_message((3, 2, 2, 3), 5, np.float32, key=7, grid=(2, 8), ranges=False)  # grid-stride loops
    check_message((1, 1, 0, 2), 0, np.float32, key=3, ranges=False)  # D == 0: no codes (its ranges: above)
    print("OK quant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
