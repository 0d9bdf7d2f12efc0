"""CPU quantiser kernels (numba_kernels/cpu/quant.py) against the NumPy reference in _quant_ref.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numba
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _quant_ref as R  # noqa: E402

from numba_kernels import get_kernel  # noqa: E402
from numba_kernels.cpu import quant as Q  # noqa: E402
from numba_kernels.cpu._attention_common import SMALL_WORK  # noqa: E402

DTYPES = [np.float32, np.float64]
DIMS = [1, 3, 7, 8, 13, 64]
# rows of width 1, 2, 4, 8: single widths, then mixed messages with empty groups
COUNTS = [(5, 0, 0, 0), (0, 4, 0, 0), (0, 0, 6, 0), (0, 0, 0, 3), (3, 0, 4, 2), (2, 3, 1, 4), (0, 2, 0, 0)]


def _pack(msg, key, garbage=0xA5):
    D = msg["x"].shape[1]
    cs = Q.group_layout(msg["group_start"], D)
    codes = np.full(int(cs[4]), garbage, np.uint8)  # every byte must be overwritten
    Q.quantize_pack(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], key,
                    msg["group_start"], cs, codes)
    return codes, cs


def _unpack(msg, codes, cs, dtype, out_rows=None, n_out=None):
    m = msg["rows"].shape[0]
    D = msg["x"].shape[1]
    out_rows = np.arange(m, dtype=np.int64) if out_rows is None else out_rows
    out = np.full((n_out or m, D), -123.0, dtype)
    Q.unpack_dequantize(codes, msg["zero"], msg["scale"], msg["group_start"], cs, out_rows, out)
    return out


def _step_slack(h, dtype):
    """One rounding of the dequantised value in ``dtype`` (on top of the step bound)."""
    return 2 * np.spacing(np.abs(h).astype(dtype)).astype(np.float64)


def test_group_layout_sizes():
    cs = Q.group_layout(np.array([0, 3, 3, 8, 10]), 13)
    # 3*13*1 = 39 bits -> 5 bytes; no 2-bit rows; 5*13*4 = 260 bits -> 33 bytes; 2*13 bytes
    assert cs.tolist() == [0, 5, 5, 38, 64]
    assert cs.dtype == np.int64
    np.testing.assert_array_equal(cs, R.layout([0, 3, 3, 8, 10], 13))
    assert Q.group_layout([0, 0, 0, 0, 0], 7).tolist() == [0] * 5
    with pytest.raises(ValueError):
        Q.group_layout([0, 2, 1, 3, 4], 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("counts", COUNTS)
def test_pack_unpack_matches_reference(counts, D, dtype):
    rng = np.random.default_rng(hash((counts, D)) % 2**32)
    m = sum(counts)
    msg = R.make_message(rng, counts, D, dtype, constant_rows=[m // 2], nan_rows=[m - 1] if m > 2 else [])
    key = 0xDEADBEEF + D
    codes, cs = _pack(msg, key)
    np.testing.assert_array_equal(cs, R.layout(msg["group_start"], D))
    q_ref = R.quantize(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], key, msg["group_start"])
    ref_codes = R.pack(q_ref, msg["group_start"])
    np.testing.assert_array_equal(codes, ref_codes)  # byte-identical layout, padding bits zero
    np.testing.assert_array_equal(R.unpack(codes, msg["group_start"], D), q_ref)

    out = _unpack(msg, codes, cs, dtype)
    want = R.dequantize(q_ref, msg["zero"], msg["scale"], dtype)
    np.testing.assert_array_equal(out, want)  # NaN rows compare equal as NaN

    # error bound: within one step of the original, exact for constant rows, NaN for NaN scales
    h = msg["x"][msg["rows"]].astype(np.float64)
    s = msg["scale"].astype(np.float64)[:, None]
    err = np.abs(out.astype(np.float64) - h)
    finite = np.isfinite(s[:, 0])
    const = finite & (s[:, 0] == 0)
    vary = finite & (s[:, 0] > 0)
    assert (err[vary] <= (s * np.ones_like(h))[vary] + _step_slack(h, dtype)[vary]).all()
    np.testing.assert_array_equal(out[const], np.broadcast_to(msg["zero"][const, None], out[const].shape))
    if dtype == np.float32:  # float64 constant rows are exact when their value is a float32
        np.testing.assert_array_equal(out[const], h[const])
    assert np.isnan(out[~finite]).all()
    if m > 2:
        assert not finite[m - 1] and const[m // 2]
        np.testing.assert_array_equal(out[m // 2], h[m // 2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpack_scatters_to_out_rows_only(dtype):
    rng = np.random.default_rng(5)
    msg = R.make_message(rng, (2, 3, 0, 4), 7, dtype)
    codes, cs = _pack(msg, 9)
    out_rows = rng.permutation(20)[:9].astype(np.int64)
    out = _unpack(msg, codes, cs, dtype, out_rows=out_rows, n_out=20)
    q_ref = R.quantize(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 9, msg["group_start"])
    np.testing.assert_array_equal(out[out_rows], R.dequantize(q_ref, msg["zero"], msg["scale"], dtype))
    untouched = np.setdiff1d(np.arange(20), out_rows)
    assert (out[untouched] == -123.0).all()


def test_codes_use_the_full_range_and_clamp():
    """Row min maps to code 0, row max to 2**b - 1 (u < 1 cannot push the max past the top)."""
    x = np.array([[0.0, 1.0, 2.0, 3.0, 1.5]], np.float32)
    rows = np.zeros(4, np.int64)
    gs = np.array([0, 1, 2, 3, 4], np.int64)
    zero = np.zeros(4, np.float32)
    scale = np.array([3.0, 1.0, 0.1875, 3 / 256], np.float32)
    msg = dict(x=x, rows=rows, ids=np.arange(4, dtype=np.int64), zero=zero, scale=scale, group_start=gs)
    codes, cs = _pack(msg, 1)
    q = R.unpack(codes, gs, 5)
    assert q[:, 0].tolist() == [0, 0, 0, 0]
    assert q[:, 3].tolist() == [1, 3, 15, 255]  # 3 / 0.1875 = 16 and 3 / (3/256) = 256 clamp
    assert q[1, 1:3].tolist() == [1, 2]  # integer positions never round up


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_stochastic_rounding_is_unbiased(bits):
    rng = np.random.default_rng(bits)
    D, keys = 64, 2000
    x = rng.uniform(-2, 2, (1, D)).astype(np.float32).astype(np.float64)  # z = min exactly
    lo, hi = x.min(), x.max()
    z = np.float32(lo)
    s = np.float32((np.float32(hi) - z) / np.float32((1 << bits) - 1))
    g = bits.bit_length() - 1
    gs = np.array([0, 0, 0, 0, 1], np.int64)
    gs[:g + 1] = 0
    gs[g + 1:] = 1
    msg = dict(x=x, rows=np.zeros(1, np.int64), ids=np.array([12345], np.int64),
               zero=np.array([z]), scale=np.array([s]), group_start=gs)
    total = np.zeros(D)
    sq = np.zeros(keys)
    for key in range(keys):
        codes, cs = _pack(msg, key)
        out = _unpack(msg, codes, cs, np.float64)[0]
        total += out
        sq[key] = ((out - x[0]) ** 2).sum()
    mean = total / keys
    t = (x[0] - np.float64(z)) / np.float64(s)
    frac = t - np.floor(t)
    sigma = np.float64(s) * np.sqrt(frac * (1 - frac) / keys) + 1e-12
    assert (np.abs(mean - x[0]) <= 4 * sigma).all(), np.max(np.abs(mean - x[0]) / sigma)
    # per-row error variance: expected s^2 * sum frac(1-frac) <= D s^2 / 4
    assert sq.mean() <= D * np.float64(s) ** 2 / 4
    np.testing.assert_allclose(sq.mean(), np.float64(s) ** 2 * (frac * (1 - frac)).sum(), rtol=0.1)


def test_keys_reproducible_and_distinct():
    rng = np.random.default_rng(11)
    msg = R.make_message(rng, (2, 2, 2, 2), 13, np.float32)
    a, _ = _pack(msg, 42)
    b, _ = _pack(msg, np.uint64(42))
    c, _ = _pack(msg, 43)
    np.testing.assert_array_equal(a, b)
    assert (a != c).sum() > a.size // 4
    # the uniform depends on the id, not on the message position
    perm = dict(msg, ids=msg["ids"].copy())
    perm["ids"][[0, 1]] = perm["ids"][[1, 0]]
    d, _ = _pack(perm, 42)
    assert (a != d).any()
    # keys beyond int64 and negative ints (taken modulo 2**64) are accepted
    e, _ = _pack(msg, np.uint64(2**64 - 1))
    f, _ = _pack(msg, -1)
    np.testing.assert_array_equal(e, f)


def test_key_hash_is_splitmix64():
    # reference value of splitmix64 seeded with 0 (first output of the standard generator)
    assert int(Q.key_hash(0)) == 0xE220A8397B1DCDAF
    assert int(Q.key_hash(7)) == int(R.splitmix64(np.uint64(7)))


def test_parallel_path_independent_of_thread_count():
    """Large enough for the parallel kernels; bytes assembled per thread give the same result."""
    rng = np.random.default_rng(3)
    D = 61  # rows straddle bytes in every group
    counts = (300, 301, 299, 303)
    assert sum(counts) * D >= SMALL_WORK
    msg = R.make_message(rng, counts, D, np.float32, constant_rows=[5, 700], nan_rows=[400])
    q_ref = R.quantize(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 77, msg["group_start"])
    ref_codes = R.pack(q_ref, msg["group_start"])
    before = numba.get_num_threads()
    results = []
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            lo = np.empty(sum(counts), np.float32)
            hi = np.empty(sum(counts), np.float32)
            Q.row_range(msg["x"], msg["rows"], lo, hi)
            codes, cs = _pack(msg, 77)
            out = _unpack(msg, codes, cs, np.float32)
            assert numba.get_num_threads() == threads  # kernels leave the thread count alone
            results.append((lo, hi, codes, out))
    finally:
        numba.set_num_threads(before)
    want_lo, want_hi = R.row_range(msg["x"], msg["rows"])
    for lo, hi, codes, out in results:
        np.testing.assert_array_equal(lo, want_lo)
        np.testing.assert_array_equal(hi, want_hi)
        np.testing.assert_array_equal(codes, ref_codes)
        np.testing.assert_array_equal(out, R.dequantize(q_ref, msg["zero"], msg["scale"], np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [0, 1, 5, 64])
def test_row_range_matches_numpy(dtype, D):
    rng = np.random.default_rng(D)
    x = rng.standard_normal((12, D)).astype(dtype) * 10
    if D:
        x[2, D - 1] = np.nan
        x[4, 0] = np.inf
        x[7, D // 2] = -np.inf
        x[9] = 1e30 if dtype == np.float64 else 3.0  # huge float64 values round to float32
    rows = np.array([0, 2, 4, 7, 9, 11, 2, 1, 0], np.int64)
    lo = np.full(rows.shape[0], 5.0, np.float32)
    hi = np.full(rows.shape[0], 5.0, np.float32)
    Q.row_range(x, rows, lo, hi)
    want_lo, want_hi = R.row_range(x, rows)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)
    if D:
        assert np.isnan(lo[[1, 2, 3, 6]]).all() and np.isnan(hi[[1, 2, 3, 6]]).all()
        assert np.isfinite(lo[[0, 4, 5, 7, 8]]).all()
    else:
        assert (lo == 0).all() and (hi == 0).all()


def test_empty_message_and_zero_width():
    msg = R.make_message(np.random.default_rng(0), (0, 0, 0, 0), 5, np.float32)
    codes, cs = _pack(msg, 1)
    assert codes.size == 0 and cs.tolist() == [0] * 5
    msg = R.make_message(np.random.default_rng(0), (1, 2, 0, 1), 0, np.float32)
    codes, cs = _pack(msg, 1)
    assert codes.size == 0
    assert _unpack(msg, codes, cs, np.float32).shape == (4, 0)


def test_wrong_code_buffer_size_is_rejected():
    msg = R.make_message(np.random.default_rng(0), (1, 1, 1, 1), 5, np.float32)
    cs = Q.group_layout(msg["group_start"], 5)
    with pytest.raises(ValueError):
        Q.quantize_pack(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 1,
                        msg["group_start"], cs, np.zeros(int(cs[4]) - 1, np.uint8))


def test_get_kernel_dispatches_to_cpu_twin():
    assert get_kernel("quant.quantize_pack", "cpu") is Q.quantize_pack
    assert get_kernel("quant.unpack_dequantize", "cpu") is Q.unpack_dequantize
    assert get_kernel("quant.row_range", "cpu") is Q.row_range
