"""Low-bit quantisation of message rows (CPU twin): row ranges, stochastic-rounding pack, unpack.

Used for quantised halo messages: a message carries ``m`` rows of width ``D``
as 1-, 2-, 4- or 8-bit codes plus one float32 zero point and one float32
scale per row (sent separately by the caller). No header is ever sent: both
sides compute the layout from the per-width row counts.

Message layout
--------------
* Rows are grouped by bit width in the order ``b = 1, 2, 4, 8`` (group
  ``g = 0..3`` has ``b = 1 << g``); within a group rows keep their order. The
  caller passes the rows already in group order with ``group_start``
  int64[5]: message rows ``[group_start[g], group_start[g+1])`` have width
  ``1 << g``; ``group_start[0] == 0`` and ``group_start[4] == m``.
* Group ``g`` holds ``n_g * D`` codes row-major (row ``i`` of the group,
  feature ``j`` -> code ``k = i * D + j``). Code ``k`` occupies bits
  ``[(k*b) % 8, (k*b) % 8 + b)`` of byte ``(k*b) // 8`` of the group's byte
  section, least significant bits first. A group takes
  ``ceil(n_g * D * b / 8)`` bytes; padding (zero bits) only at the end of a
  group, never per row.
* Groups are concatenated in the order 1, 2, 4, 8; ``code_start`` int64[5]
  (:func:`group_layout`) holds each group's byte offset into ``codes`` and
  ``code_start[4]`` = total code bytes.

Quantisation (row ``r``, zero point ``z = zero[r]``, scale ``s = scale[r]``)
-----------------------------------------------------------------------------
``q = clamp(floor((h - z) / s + u), 0, 2**b - 1)`` with ``u`` in ``[0, 1)`` a
counter-based uniform (stochastic rounding, unbiased inside the range)::

    splitmix64(x) = standard splitmix64 finaliser of x + 0x9E3779B97F4A7C15
                    (multipliers 0xBF58476D1CE4E5B9, 0x94D049BB133111EB; shifts 30, 27, 31)
    mix(state, v) = splitmix64(state ^ uint64(v))
    key_hash      = mix(0, key)                  (:func:`key_hash`)
    u(key, id, j) = (mix(mix(key_hash, id), j) >> 11) * 2**-53      (53-bit fraction)

with ``id = ids[r]`` (global node id, >= 0) and ``j`` the feature index, the
attention-dropout hash of :mod:`numba_kernels.cpu._attention_common`. The
argument ``(h - z) / s + u`` is evaluated in float64 for float32 and float64
inputs alike (``h``, ``z``, ``s`` widened exactly): a subtraction, an IEEE
division and an addition. The only product, ``bits * 2**-53`` in ``u``, is
exact, so the CUDA twin (which fuses it into an FMA with the addition) rounds
identically and produces the same bytes. ``s == 0`` (constant row) or ``s``
NaN (the caller's mark for a non-finite row) or ``s < 0`` give all-zero
codes without hashing. A non-finite ``h`` in a row with a finite scale gives
code 0 (NaN, -Inf) or ``2**b - 1`` (+Inf).

Dequantisation: ``h~ = z + s * q`` evaluated in the output dtype (float32
arithmetic for float32 output: ``float32(z) + float32(s) * float32(q)``, two
roundings; exact products in float64). ``s == 0`` gives exactly ``z``, ``s``
NaN gives NaN. The CUDA twin may fuse the float32 multiply-add into one FMA
(one rounding), so float32 outputs of the twins can differ in the last bit;
float64 outputs are identical (``s * q`` is exact there).

Threads: ``quantize_pack`` is parallel over output bytes (each byte assembled
by one thread from its ``8 / b`` codes; rows straddle bytes), the others over
rows. Calls with fewer than :data:`SMALL_WORK` codes run a serial copy of the
kernel (no thread pool wake-up); the thread count is never changed. Results
do not depend on the thread count.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import SMALL_WORK, _mix

__all__ = ["group_layout", "key_hash", "row_range", "quantize_pack", "unpack_dequantize", "BITS"]

#: bit width of group ``g`` (``BITS[g] == 1 << g``)
BITS = (1, 2, 4, 8)

_PAR = dict(parallel=True, cache=True, nogil=True)
_SER = dict(cache=True, nogil=True)
_INV_2_53 = 1.0 / 9007199254740992.0
_MASK64 = (1 << 64) - 1
#: parallel chunks per thread (static scheduling still balances)
_CHUNKS_PER_THREAD = 8


def group_layout(group_start, D: int) -> np.ndarray:
    """Byte offsets of the four code groups: int64[5] ``code_start``.

    Args:
        group_start: int64[5] (any integer sequence of 5 non-decreasing values):
            message rows ``[group_start[g], group_start[g+1])`` have ``1 << g`` bits.
        D: features per row (>= 0).
    Returns:
        ``code_start`` int64[5]: ``code_start[0] == 0``,
        ``code_start[g+1] = code_start[g] + ceil(n_g * D * (1 << g) / 8)``
        with ``n_g = group_start[g+1] - group_start[g]``; ``code_start[4]`` is the
        message's total code bytes. Pure Python/NumPy (no device arrays).
    """
    gs = [int(v) for v in np.asarray(group_start).reshape(-1)]
    if len(gs) != 5:
        raise ValueError(f"group_start needs 5 entries, got {len(gs)}")
    D = int(D)
    if D < 0 or any(b < a for a, b in zip(gs, gs[1:])):
        raise ValueError(f"group_start must be non-decreasing and D >= 0, got {gs}, D={D}")
    cs = np.zeros(5, dtype=np.int64)
    for g in range(4):
        bits = (gs[g + 1] - gs[g]) * D * (1 << g)
        cs[g + 1] = cs[g] + (bits + 7) // 8
    return cs


def _splitmix64_py(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def key_hash(key) -> np.uint64:
    """``mix(0, key) = splitmix64(key)`` as np.uint64 (``key`` taken modulo 2**64); pure Python."""
    return np.uint64(_splitmix64_py(int(key) & _MASK64))


def _chunks(n: int) -> int:
    return max(1, min(n, _CHUNKS_PER_THREAD * numba.get_num_threads()))


# ---------------------------------------------------------------------------
# row_range


@njit(**_SER)
def _range_rows(x, rows, lo, hi, r0, r1):
    D = x.shape[1]
    for r in range(r0, r1):
        src = rows[r]
        if D == 0:
            lo[r] = 0.0
            hi[r] = 0.0
            continue
        mn = x[src, 0]
        mx = mn
        bad = False
        for j in range(D):
            v = x[src, j]
            if not np.isfinite(v):
                bad = True
                break
            if v < mn:
                mn = v
            if v > mx:
                mx = v
        if bad:
            lo[r] = np.nan
            hi[r] = np.nan
        else:
            lo[r] = mn
            hi[r] = mx


@njit(**_PAR)
def _row_range_par(x, rows, lo, hi, nchunks):
    m = rows.shape[0]
    for c in prange(nchunks):
        _range_rows(x, rows, lo, hi, m * c // nchunks, m * (c + 1) // nchunks)


def row_range(x, rows, lo, hi) -> None:
    """Per message row min and max: ``lo[r] = min(x[rows[r], :])``, ``hi[r] = max(x[rows[r], :])``.

    Args:
        x: float32 or float64 [N, D] source rows.
        rows: int64[m] row of ``x`` for each message row (trusted, may repeat).
        lo, hi: float32[m] outputs, written in full. A row holding any NaN or
            +-Inf gets ``lo = hi = NaN``; ``D == 0`` gives ``lo = hi = 0``.
            float64 extremes are rounded to the nearest float32.
    """
    m = rows.shape[0]
    if m == 0:
        return
    if m * x.shape[1] < SMALL_WORK:
        _range_rows(x, rows, lo, hi, 0, m)
    else:
        _row_range_par(x, rows, lo, hi, _chunks(m))


# ---------------------------------------------------------------------------
# quantize_pack


@njit(**_SER)
def _pack_bytes(x, rows, zero, scale, ids, khash, group_start, code_start, codes, g, t0, t1):
    """Write bytes ``[t0, t1)`` (offsets inside group ``g``'s section) of ``codes``."""
    D = x.shape[1]
    b = 1 << g
    per_byte = 8 >> g
    mask = (1 << b) - 1
    maxq = float(mask)
    row0 = group_start[g]
    n_codes = (group_start[g + 1] - row0) * D
    base = code_start[g]
    k = t0 * per_byte
    i = k // D
    j = k - i * D
    cur = -1
    src = 0
    z = 0.0
    s = 0.0
    active = False
    rhash = np.uint64(0)
    for t in range(t0, t1):
        acc = 0
        for c in range(per_byte):
            if k >= n_codes:
                break
            if i != cur:  # entering a new message row
                cur = i
                r = row0 + i
                src = rows[r]
                z = np.float64(zero[r])
                s = np.float64(scale[r])
                active = s > 0.0  # False for 0, negative and NaN scales: all codes 0
                if active:
                    rhash = _mix(khash, ids[r])
            if active:
                u = np.float64(_mix(rhash, j) >> np.uint64(11)) * _INV_2_53
                y = (np.float64(x[src, j]) - z) / s + u
                if y >= maxq:
                    q = mask
                elif y >= 1.0:
                    q = int(y)  # truncation == floor for y >= 1
                else:
                    q = 0  # also NaN
                acc |= q << (c * b)
            k += 1
            j += 1
            if j == D:
                j = 0
                i += 1
        codes[base + t] = acc


@njit(**_SER)
def _pack_ser(x, rows, zero, scale, ids, khash, group_start, code_start, codes):
    for g in range(4):
        _pack_bytes(x, rows, zero, scale, ids, khash, group_start, code_start, codes,
                    g, 0, code_start[g + 1] - code_start[g])


@njit(**_PAR)
def _pack_par(x, rows, zero, scale, ids, khash, group_start, code_start, codes, chunk):
    first = np.zeros(5, np.int64)  # first chunk of each group
    for g in range(4):
        nb = code_start[g + 1] - code_start[g]
        first[g + 1] = first[g] + (nb + chunk - 1) // chunk
    for c in prange(first[4]):
        g = 0
        while c >= first[g + 1]:
            g += 1
        t0 = (c - first[g]) * chunk
        t1 = min(t0 + chunk, code_start[g + 1] - code_start[g])
        _pack_bytes(x, rows, zero, scale, ids, khash, group_start, code_start, codes, g, t0, t1)


def quantize_pack(x, rows, zero, scale, ids, key, group_start, code_start, codes) -> None:
    """Quantise message rows ``x[rows]`` with stochastic rounding and pack the codes.

    Args:
        x: float32 or float64 [N, D] source rows.
        rows: int64[m] row of ``x`` for message row ``r`` (rows in group order).
        zero, scale: float32[m] zero point and step of each message row
            (``scale`` >= 0; NaN marks a non-finite row, 0 a constant row).
        ids: int64[m] counter id (global node id, >= 0) of each message row.
        key: uint64 (np.uint64 or int, taken modulo 2**64) stream key.
        group_start: int64[5] message rows of each bit width (see module docstring).
        code_start: int64[5] from :func:`group_layout` ``(group_start, D)``.
        codes: uint8[code_start[4]] output, every byte written (padding bits 0).

    Code of feature ``j`` of message row ``r`` (width ``b``):
    ``clamp(floor((x[rows[r], j] - zero[r]) / scale[r] + u(key, ids[r], j)), 0, 2**b - 1)``,
    0 for a row with scale 0 or NaN. Parallel over output bytes.
    """
    if codes.shape[0] != code_start[4]:
        raise ValueError(f"codes has {codes.shape[0]} bytes, layout needs {int(code_start[4])}")
    n = codes.shape[0]
    if n == 0:
        return
    kh = key_hash(key)
    if rows.shape[0] * x.shape[1] < SMALL_WORK:
        _pack_ser(x, rows, zero, scale, ids, kh, group_start, code_start, codes)
    else:
        chunk = max(64, -(-n // (_CHUNKS_PER_THREAD * numba.get_num_threads())))
        _pack_par(x, rows, zero, scale, ids, kh, group_start, code_start, codes, chunk)


# ---------------------------------------------------------------------------
# unpack_dequantize


@njit(**_SER)
def _unpack_rows(codes, zt, st, levels, group_start, code_start, out_rows, out, r0, r1):
    D = out.shape[1]
    g = 0
    for r in range(r0, r1):
        while r >= group_start[g + 1]:  # rows come in group order
            g += 1
        b = 1 << g
        mask = (1 << b) - 1
        base = code_start[g]
        k0 = (r - group_start[g]) * D
        o = out_rows[r]
        z = zt[r]
        s = st[r]
        for j in range(D):
            bit = (k0 + j) * b
            q = (np.int64(codes[base + (bit >> 3)]) >> (bit & 7)) & mask
            out[o, j] = z + s * levels[q]


@njit(**_SER)
def _unpack_ser(codes, zero, scale, group_start, code_start, out_rows, out):
    zt = zero.astype(out.dtype)
    st = scale.astype(out.dtype)
    levels = np.arange(256).astype(out.dtype)
    _unpack_rows(codes, zt, st, levels, group_start, code_start, out_rows, out, 0, out_rows.shape[0])


@njit(**_PAR)
def _unpack_par(codes, zero, scale, group_start, code_start, out_rows, out, nchunks):
    zt = zero.astype(out.dtype)
    st = scale.astype(out.dtype)
    levels = np.arange(256).astype(out.dtype)
    m = out_rows.shape[0]
    for c in prange(nchunks):
        _unpack_rows(codes, zt, st, levels, group_start, code_start, out_rows, out,
                     m * c // nchunks, m * (c + 1) // nchunks)


def unpack_dequantize(codes, zero, scale, group_start, code_start, out_rows, out) -> None:
    """Unpack a message and write ``out[out_rows[r], j] = zero[r] + scale[r] * q[r, j]``.

    Args:
        codes: uint8[code_start[4]] packed codes (layout in the module docstring).
        zero, scale: float32[m] per message row (scale NaN -> the row becomes NaN).
        group_start, code_start: int64[5] as for :func:`quantize_pack`.
        out_rows: int64[m] output row of each message row (trusted; distinct
            rows unless the caller accepts an arbitrary winner).
        out: float32 or float64 [N_out, D]; rows ``out_rows`` are overwritten,
            the others are left untouched. Arithmetic in ``out``'s dtype.
    Parallel over message rows.
    """
    m = out_rows.shape[0]
    if m == 0:
        return
    if codes.shape[0] != code_start[4]:
        raise ValueError(f"codes has {codes.shape[0]} bytes, layout needs {int(code_start[4])}")
    if m * out.shape[1] < SMALL_WORK:
        _unpack_ser(codes, zero, scale, group_start, code_start, out_rows, out)
    else:
        _unpack_par(codes, zero, scale, group_start, code_start, out_rows, out, _chunks(m))
