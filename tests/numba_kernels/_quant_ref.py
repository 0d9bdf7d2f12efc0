"""Plain NumPy reference for the ``quant`` kernels (numba_kernels/{cpu,cuda}/quant.py).

Written independently of the kernels: vectorised uint64 splitmix64 and
uint32 'lowbias32' on whole arrays, the rounding written as
``clamp(floor(t) + [u < t - floor(t)])`` (the kernels clamp first and
truncate), ``h - z`` always in float64 then rounded to float32 (the CPU kernel
subtracts float32 inputs in float32), codes placed into bytes with explicit
bit arithmetic (no np.packbits), one group at a time. Also builds test messages (rows in group order, zero points and
scales from the row ranges).
"""
from __future__ import annotations

import numpy as np

U64 = np.uint64
U32 = np.uint32
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


def lowbias32(v):
    """The 'lowbias32' finaliser on a uint32 array (products wrap modulo 2**32)."""
    v = np.asarray(v, dtype=np.uint32)
    with np.errstate(over="ignore"):
        v = v ^ (v >> U32(16))
        v = v * U32(0x7FEB352D)
        v = v ^ (v >> U32(15))
        v = v * U32(0x846CA68B)
        return v ^ (v >> U32(16))


def uniform(key, ids, D):
    """float32[m, D]: ``u(key, ids[r], j)`` = lowbias32(rh ^ (j * 0x9E3779B9 mod 2**32)) >> 8, over 2**24.

    ``rh`` = low 32 bits of splitmix64(splitmix64(key) ^ id).
    """
    kh = splitmix64(U64(int(key) % (1 << 64)))
    rh = (splitmix64(kh ^ np.asarray(ids, dtype=np.int64).astype(np.uint64)) & U64(0xFFFFFFFF)).astype(np.uint32)
    jg = ((np.arange(D, dtype=np.uint64) * U64(0x9E3779B9)) % U64(1 << 32)).astype(np.uint32)
    bits24 = lowbias32(rh[:, None] ^ jg[None, :]) >> U32(8)
    u = bits24.astype(np.float32) * np.float32(2.0 ** -24)
    assert u.dtype == np.float32 and (u < 1).all()
    return u


def layout(group_start, D):
    """int64[5] byte offsets of the four groups."""
    gs = np.asarray(group_start, dtype=np.int64)
    sizes = [-(-int(gs[g + 1] - gs[g]) * D * (1 << g) // 8) for g in range(4)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def quantize(x, rows, zero, scale, ids, key, group_start):
    """int64[m, D] codes (before packing).

    ``t = float32(h - z) * float32(1 / s)`` in float32 (``h - z`` computed in float64),
    ``q = clip(floor(t) + (u < t - floor(t)), 0, 2**b - 1)``, NaN -> 0;
    rows with ``s`` 0, negative or NaN -> 0.
    """
    D = x.shape[1]
    m = rows.shape[0]
    bits = np.repeat([1, 2, 4, 8], np.diff(group_start))
    h = x[rows].astype(np.float64)
    z = zero.astype(np.float64)[:, None]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = (h - z).astype(np.float32)
        inv = (np.float32(1) / scale.astype(np.float32))[:, None]
        t = d * inv
        assert t.dtype == np.float32
        f = np.floor(t)
        up = uniform(key, ids, D) < (t - f)  # False for NaN and +-Inf
        y = f + up.astype(np.float32)
        y = np.where(np.isnan(y), np.float32(0), y)
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
