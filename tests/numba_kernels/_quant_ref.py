"""Plain NumPy reference for the ``quant`` kernels (numba_kernels/{cpu,cuda}/quant.py).

Written independently of the kernels: vectorised uint64 splitmix64, codes
placed into bytes with explicit bit arithmetic (no np.packbits), one group
at a time. Also builds test messages (rows in group order, zero points and
scales from the row ranges).
"""
from __future__ import annotations

import numpy as np

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
M1 = U64(0xBF58476D1CE4E5B9)
M2 = U64(0x94D049BB133111EB)


def splitmix64(x):
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + GOLDEN
        z = (z ^ (z >> U64(30))) * M1
        z = (z ^ (z >> U64(27))) * M2
    return z ^ (z >> U64(31))


def uniform(key, ids, D):
    """float64[m, D]: ``u(key, ids[r], j)`` = (mix(mix(mix(0, key), id), j) >> 11) / 2**53."""
    kh = splitmix64(U64(int(key) % (1 << 64)))
    row = splitmix64(kh ^ np.asarray(ids, dtype=np.int64).astype(np.uint64))
    h = splitmix64(row[:, None] ^ np.arange(D, dtype=np.uint64)[None, :])
    return (h >> U64(11)).astype(np.float64) / 2.0 ** 53


def layout(group_start, D):
    """int64[5] byte offsets of the four groups."""
    gs = np.asarray(group_start, dtype=np.int64)
    sizes = [-(-int(gs[g + 1] - gs[g]) * D * (1 << g) // 8) for g in range(4)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def quantize(x, rows, zero, scale, ids, key, group_start):
    """int64[m, D] codes (before packing)."""
    D = x.shape[1]
    m = rows.shape[0]
    bits = np.repeat([1, 2, 4, 8], np.diff(group_start))
    h = x[rows].astype(np.float64)
    z = zero.astype(np.float64)[:, None]
    s = scale.astype(np.float64)[:, None]
    u = uniform(key, ids, D)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.floor((h - z) / s + u)
        y = np.where(np.isnan(y), 0.0, y)
        q = np.clip(y, 0, ((1 << bits) - 1)[:, None]).astype(np.int64)
    q[~(scale > 0)] = 0
    assert q.shape == (m, D)
    return q


def pack(q, group_start):
    """uint8 message bytes of codes ``q`` int64[m, D] (bit arithmetic, one group at a time)."""
    D = q.shape[1]
    cs = layout(group_start, D)
    out = np.zeros(int(cs[4]), dtype=np.int64)
    for g in range(4):
        b = 1 << g
        flat = q[group_start[g]:group_start[g + 1]].reshape(-1)
        assert flat.size == 0 or flat.max() < (1 << b)
        k = np.arange(flat.size)
        byte = cs[g] + (k * b) // 8
        shift = (k * b) % 8
        np.add.at(out, byte, flat << shift)  # bit fields are disjoint: add == or
    assert out.max(initial=0) < 256
    return out.astype(np.uint8)


def unpack(codes, group_start, D):
    """int64[m, D] codes read back from message bytes."""
    cs = layout(group_start, D)
    m = int(group_start[4])
    q = np.zeros((m, D), dtype=np.int64)
    c = codes.astype(np.int64)
    for g in range(4):
        b = 1 << g
        n = int(group_start[g + 1] - group_start[g])
        k = np.arange(n * D)
        vals = (c[cs[g] + (k * b) // 8] >> ((k * b) % 8)) & ((1 << b) - 1)
        q[group_start[g]:group_start[g + 1]] = vals.reshape(n, D)
    return q


def dequantize(q, zero, scale, dtype):
    """``z + s * q`` evaluated in ``dtype`` (two roundings in float32)."""
    dt = np.dtype(dtype).type
    with np.errstate(invalid="ignore"):
        return zero.astype(dt)[:, None] + scale.astype(dt)[:, None] * q.astype(dt)


def row_range(x, rows):
    """(lo, hi) float32[m]; NaN for rows with a non-finite value, 0 for D == 0."""
    sub = x[rows]
    if sub.shape[1] == 0:
        return np.zeros(rows.shape[0], np.float32), np.zeros(rows.shape[0], np.float32)
    bad = ~np.isfinite(sub).all(axis=1)
    with np.errstate(invalid="ignore"):
        lo = np.where(bad, np.nan, np.nan_to_num(sub, posinf=0, neginf=0).min(axis=1) if sub.size else 0)
        hi = np.where(bad, np.nan, np.nan_to_num(sub, posinf=0, neginf=0).max(axis=1) if sub.size else 0)
    return lo.astype(np.float32), hi.astype(np.float32)


def make_message(rng, counts, D, dtype, N=None, constant_rows=(), nan_rows=()):
    """A test message: ``counts`` rows of width 1, 2, 4, 8.

    Returns dict with x float[N, D], rows, ids int64[m], zero, scale float32[m]
    (zero = row min, scale = (max - min) / (2**b - 1) in float32), group_start
    int64[5]. ``constant_rows`` (message rows) get one float32-exact value,
    ``nan_rows`` a NaN feature and scale NaN.
    """
    m = int(sum(counts))
    N = N or m + 3
    x = (rng.standard_normal((N, D)) * rng.uniform(0.5, 3, (N, 1))).astype(dtype)
    rows = rng.permutation(N)[:m].astype(np.int64)
    if m > 2:
        rows[-1] = rows[0]  # a source row sent twice
    group_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    bits = np.repeat([1, 2, 4, 8], counts)
    for r in constant_rows:
        x[rows[r]] = dtype(0.75 * (r + 1) - 2.0)
    for r in nan_rows:
        if D:
            x[rows[r], D // 2] = np.nan
    lo, hi = row_range(x, rows)
    zero = np.where(np.isnan(lo), np.float32(0), lo).astype(np.float32)
    scale = ((hi - lo) / ((1 << bits) - 1).astype(np.float32)).astype(np.float32)
    ids = rng.choice(1 << 40, m, replace=False).astype(np.int64)
    return dict(x=x, rows=rows, ids=ids, zero=zero, scale=scale, group_start=group_start)
