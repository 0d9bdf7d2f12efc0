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


def _one_row_message(bits, D=64, seed=None):
    """One float64 row of ``D`` values (float32-exact, so ``z`` = the row min exactly) at width ``bits``."""
    rng = np.random.default_rng(bits if seed is None else seed)
    x = rng.uniform(-2, 2, (1, D)).astype(np.float32).astype(np.float64)
    z = np.float32(x.min())
    s = np.float32((np.float32(x.max()) - z) / np.float32((1 << bits) - 1))
    g = bits.bit_length() - 1
    gs = np.array([0] * (g + 1) + [1] * (4 - g), np.int64)
    return dict(x=x, rows=np.zeros(1, np.int64), ids=np.array([12345], np.int64),
                zero=np.array([z]), scale=np.array([s]), group_start=gs)


def _rounding_stats(codes_of, msg, keys=2000):
    """Largest |mean - h| in standard errors over the features, and the mean squared row error.

    ``codes_of(msg, key)`` -> int64[1, D] codes; values dequantised in float64.
    Returns (z_max, mean squared error summed over the row, its expectation s^2 sum frac(1 - frac)).
    """
    x = msg["x"][0]
    z, s = np.float64(msg["zero"][0]), np.float64(msg["scale"][0])
    total = np.zeros(x.shape[0])
    sq = np.zeros(keys)
    for key in range(keys):
        out = z + s * codes_of(msg, key)[0].astype(np.float64)
        total += out
        sq[key] = ((out - x) ** 2).sum()
    t = (x - z) / s
    frac = t - np.floor(t)
    sigma = s * np.sqrt(frac * (1 - frac) / keys) + 1e-12
    return np.max(np.abs(total / keys - x) / sigma), sq.mean(), s ** 2 * (frac * (1 - frac)).sum()


def _kernel_codes(msg, key):
    codes, cs = _pack(msg, key)
    return R.unpack(codes, msg["group_start"], msg["x"].shape[1])


def _assert_unbiased(codes_of, msg):
    z_max, sq, expected = _rounding_stats(codes_of, msg)
    D, s = msg["x"].shape[1], np.float64(msg["scale"][0])
    assert z_max <= 4, z_max  # every feature's mean within 4 standard errors
    # per-row error variance: expected s^2 * sum frac(1-frac) <= D s^2 / 4
    assert sq <= D * s ** 2 / 4
    np.testing.assert_allclose(sq, expected, rtol=0.1)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_stochastic_rounding_is_unbiased(bits):
    _assert_unbiased(_kernel_codes, _one_row_message(bits))


def _biased_reference(kind):
    """Reference codes with a broken uniform (the check below must reject each)."""
    def codes_of(msg, key):
        u = R.uniform(key if kind != "key ignored" else 0, msg["ids"], msg["x"].shape[1])
        if kind == "nearest":
            u = np.full_like(u, 0.5)
        elif kind == "squared":
            u = u * u
        elif kind == "shrunk":
            u = u * np.float32(0.8)
        h = msg["x"][msg["rows"]].astype(np.float64)
        t = ((h - msg["zero"].astype(np.float64)[:, None]).astype(np.float32)
             * (np.float32(1) / msg["scale"])[:, None])
        f = np.floor(t)
        bits = 1 << int(np.argmax(np.diff(msg["group_start"])))
        return np.clip(f + (u < t - f), 0, (1 << bits) - 1).astype(np.int64)
    return codes_of


@pytest.mark.parametrize("kind", ["nearest", "squared", "shrunk", "key ignored"])
def test_unbiasedness_check_rejects_biased_rounding(kind):
    """The statistical check above has power: biased or key-independent noise fails it."""
    msg = _one_row_message(4)
    np.testing.assert_array_equal(_biased_reference("none")(msg, 3), _kernel_codes(msg, 3))  # the harness is right
    _assert_unbiased(_biased_reference("none"), msg)
    with pytest.raises(AssertionError):
        _assert_unbiased(_biased_reference(kind), msg)


def test_unbiased_over_ids_in_one_message():
    """Many copies of one float32 row under distinct ids (one call, parallel path): unbiased per feature."""
    rng = np.random.default_rng(8)
    D, copies = 64, 4096
    x = rng.uniform(-3, 5, (1, D)).astype(np.float32)
    for g, bits in enumerate((1, 2, 4, 8)):
        z = np.float32(x.min())
        s = np.float32((np.float32(x.max()) - z) / np.float32((1 << bits) - 1))
        counts = [0, 0, 0, 0]
        counts[g] = copies
        msg = dict(x=x, rows=np.zeros(copies, np.int64), ids=rng.choice(1 << 40, copies, replace=False),
                   zero=np.full(copies, z), scale=np.full(copies, s),
                   group_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        codes, cs = _pack(msg, 99)
        q = R.unpack(codes, msg["group_start"], D).astype(np.float64)
        t = (x[0].astype(np.float64) - np.float64(z)) / np.float64(s)
        frac = t - np.floor(t)
        se = np.sqrt(frac * (1 - frac) / copies) + 1e-9
        assert (np.abs(q.mean(0) - t) <= 4 * se).all(), (bits, np.max(np.abs(q.mean(0) - t) / se))
        assert ((q == np.floor(t)) | (q == np.floor(t) + 1)).all()  # only the two neighbours


def test_exact_levels_are_never_moved():
    """Values on the quantisation grid come back exactly, for every key (no round-up at integer t)."""
    D = 64
    for bits in (1, 2, 4, 8):
        levels = (1 << bits) - 1
        k = np.arange(D) % (levels + 1)
        x = (np.float32(-1.5) + np.float32(0.125) * k).astype(np.float32)[None, :]  # z = -1.5, s = 1/8
        g = bits.bit_length() - 1
        gs = np.array([0] * (g + 1) + [1] * (4 - g), np.int64)
        msg = dict(x=x, rows=np.zeros(1, np.int64), ids=np.array([7], np.int64),
                   zero=np.array([-1.5], np.float32), scale=np.array([0.125], np.float32), group_start=gs)
        for key in range(200):
            np.testing.assert_array_equal(_kernel_codes(msg, key)[0], k)


def test_non_finite_values_in_a_finite_row():
    """NaN and -Inf give code 0, +Inf (and values past the range) the top code; a negative scale gives zeros."""
    for dtype in DTYPES:
        x = np.array([[0.0, np.nan, 2.0, np.inf, -np.inf, 0.5]], dtype)
        if dtype == np.float64:
            x = np.vstack([x, [[0.0, 1e300, -1e300, 2.0, 0.25, 0.75]]])  # d overflows float32
        n = x.shape[0]
        for bits in (1, 2, 4, 8):
            g = bits.bit_length() - 1
            gs = np.array([0] * (g + 1) + [2 * n] * (4 - g), np.int64)
            rows = np.repeat(np.arange(n), 2).astype(np.int64)
            scale = np.tile(np.array([1.0 / ((1 << bits) - 1), -1.0], np.float32), n)
            msg = dict(x=x, rows=rows, ids=np.arange(2 * n, dtype=np.int64), zero=np.zeros(2 * n, np.float32),
                       scale=scale, group_start=gs)
            q = _kernel_codes(msg, 5)
            top = (1 << bits) - 1
            assert q[0, [0, 1, 4]].tolist() == [0, 0, 0] and q[0, 3] == top and q[0, 2] == top
            assert (q[1] == 0).all()
            if n == 2:
                assert q[2, 1] == top and q[2, 2] == 0 and q[2, 3] == top
            ref = R.quantize(x, rows, msg["zero"], scale, msg["ids"], 5, gs)
            np.testing.assert_array_equal(q, ref)


def test_float64_input_of_float32_values_gives_the_same_codes():
    """``h - z`` in float64 rounded to float32 equals the float32 subtraction (innocuous double rounding)."""
    rng = np.random.default_rng(21)
    msg = R.make_message(rng, (40, 40, 40, 40), 37, np.float32)
    msg["x"] = (msg["x"] * np.float32(2.0) ** rng.integers(-30, 30, (msg["x"].shape[0], 1))).astype(np.float32)
    lo, hi = R.row_range(msg["x"], msg["rows"])
    bits = np.repeat([1, 2, 4, 8], 40)
    msg["zero"] = lo
    # scales from a slightly narrower range: some t leave [0, 2**b - 1] and clamp
    msg["scale"] = ((hi - lo) * np.float32(0.9) / ((1 << bits) - 1).astype(np.float32)).astype(np.float32)
    a, _ = _pack(msg, 1234)
    b, _ = _pack(dict(msg, x=msg["x"].astype(np.float64)), 1234)
    np.testing.assert_array_equal(a, b)
    q_ref = R.quantize(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 1234, msg["group_start"])
    np.testing.assert_array_equal(a, R.pack(q_ref, msg["group_start"]))


def test_uniform_definition_and_quality():
    """The reference uniform against plain Python integers, then its distribution."""
    mask32, mask64 = (1 << 32) - 1, (1 << 64) - 1

    def splitmix(v):
        v = (v + 0x9E3779B97F4A7C15) & mask64
        v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & mask64
        v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & mask64
        return v ^ (v >> 31)

    def lowbias(v):
        v ^= v >> 16
        v = (v * 0x7FEB352D) & mask32
        v ^= v >> 15
        v = (v * 0x846CA68B) & mask32
        return v ^ (v >> 16)

    ids = np.array([0, 1, 12345, (1 << 40) + 3], np.int64)
    for key in (0, 42, 2**64 - 1):
        u = R.uniform(key, ids, 9)
        for r, i in enumerate(ids.tolist()):
            rh = splitmix(splitmix(key) ^ i) & mask32
            want = [(lowbias(rh ^ ((j * 0x9E3779B9) & mask32)) >> 8) / 2**24 for j in range(9)]
            assert u[r].tolist() == want
    # distribution: 64 equal bins, serial correlation along j and across consecutive ids
    u = R.uniform(7, np.arange(4096), 64).astype(np.float64)
    hist = np.bincount((u * 64).astype(int).ravel(), minlength=64)
    expected = u.size / 64
    chi2 = ((hist - expected) ** 2 / expected).sum()
    assert chi2 < 63 + 6 * np.sqrt(2 * 63), chi2
    assert abs(u.mean() - 0.5) < 4 * np.sqrt(1 / 12 / u.size)
    for a, b in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 4 / np.sqrt(a.size)


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
    """Large enough for the parallel kernels; chunks of rows per thread give the same result."""
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
def test_pack_independent_of_chunking(dtype):
    """Every chunk size (multiples of 8 rows, blocks straddling groups' ends) gives the serial kernel's bytes."""
    rng = np.random.default_rng(4)
    D = 13  # 8 rows of 13 b-bit codes: whole bytes; a single row is not
    counts = (45, 17, 0, 30)
    msg = R.make_message(rng, counts, D, dtype, constant_rows=[3, 50], nan_rows=[70])
    gs = msg["group_start"]
    cs = Q.group_layout(gs, D)
    args = (msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], Q.key_hash(31), gs, cs)
    ser = np.full(int(cs[4]), 0xA5, np.uint8)
    Q._pack_ser(*args, ser)
    q_ref = R.quantize(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 31, gs)
    np.testing.assert_array_equal(ser, R.pack(q_ref, gs))
    for chunk_rows in (8, 16, 24, 40, 1000):
        par = np.full(int(cs[4]), 0x5A, np.uint8)
        Q._pack_par(*args, par, chunk_rows)
        np.testing.assert_array_equal(par, ser, err_msg=f"chunk_rows={chunk_rows}")


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


def test_read_only_layouts_compile_nothing_new():
    """Read-only ``group_start`` / ``code_start`` (a received message's header) give the same bytes and rows as
    writable ones and reuse the kernels already compiled for them."""
    rng = np.random.default_rng(7)
    msg = R.make_message(rng, (3, 2, 4, 1), 5, np.float32)
    codes, cs = _pack(msg, 11)
    want = _unpack(msg, codes, cs, np.float32)
    kernels = (Q._pack_ser, Q._pack_rows, Q._unpack_ser, Q._unpack_rows)
    before = [len(k.signatures) for k in kernels]
    gs, cs_ro = msg["group_start"].copy(), cs.copy()
    gs.flags.writeable = False
    cs_ro.flags.writeable = False
    codes2 = np.zeros_like(codes)
    Q.quantize_pack(msg["x"], msg["rows"], msg["zero"], msg["scale"], msg["ids"], 11, gs, cs_ro, codes2)
    np.testing.assert_array_equal(codes2, codes)
    out = np.zeros_like(want)
    Q.unpack_dequantize(codes2, msg["zero"], msg["scale"], gs, cs_ro, np.arange(msg["rows"].shape[0]), out)
    np.testing.assert_array_equal(out, want)
    assert [len(k.signatures) for k in kernels] == before
