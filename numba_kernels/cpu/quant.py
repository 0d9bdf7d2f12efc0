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

Quantisation (row ``r``, zero point ``z = zero[r]``, scale ``s = scale[r]``, width ``b``)
------------------------------------------------------------------------------------------
Stochastic rounding of ``t = (h - z) / s`` to ``floor(t) + 1`` with
probability ``t - floor(t)``, else ``floor(t)`` (unbiased inside the range),
clamped to ``[0, 2**b - 1]``. Exactly, in IEEE float32 with
round-to-nearest-even, step by step (no step is fused with another)::

    d   = float32(h - z)    the subtraction in float64 (h, z widened exactly), rounded once
                            to float32; for float32 h this equals the float32 subtraction
                            (double rounding is innocuous: 53 >= 2 * 24 + 2 bits), which
                            is what this twin computes for float32 inputs
    inv = 1 / s             float32 division, once per row
    t   = d * inv           float32 product
    c   = min(max(t, 0), 2**b - 1)          t NaN -> 0, +Inf -> 2**b - 1
    f   = floor(c)          (c >= 0: truncation); c - f is exact
    q   = f + 1 if u < c - f else f         the code, in [0, 2**b - 1]

which equals ``clamp(floor(t) + [u < t - floor(t)], 0, 2**b - 1)`` (NaN -> 0).
``u`` is a counter-based uniform on the 24-bit grid (integer arithmetic
modulo 2**32 unless noted)::

    splitmix64(x) = standard splitmix64 finaliser of x + 0x9E3779B97F4A7C15 (mod 2**64)
                    (multipliers 0xBF58476D1CE4E5B9, 0x94D049BB133111EB; shifts 30, 27, 31)
    key_hash      = splitmix64(key)                                (:func:`key_hash`)
    rh(id)        = splitmix64(key_hash ^ uint64(id)) mod 2**32    (once per row)
    lowbias32(v)  : v ^= v >> 16; v *= 0x7FEB352D; v ^= v >> 15; v *= 0x846CA68B; v ^= v >> 16
    u(key, id, j) = (lowbias32(rh(id) ^ (j * 0x9E3779B9)) >> 8) * 2**-24     (exact in float32)

with ``id = ids[r]`` (global node id, >= 0) and ``j`` the feature index. The
code of ``(key, id, j)`` therefore depends on nothing else (not on the
thread count, the chunking, the message position or the device).

Accuracy: ``P(q = f + 1) = ceil((c - f) * 2**24) / 2**24``, so the rounding
itself is biased by less than ``2**-24`` steps; ``t`` carries float32
rounding errors (``d``, ``inv``, the product: relative error below
``3 * 2**-24``, under ``2**-14`` steps for ``t <= 255``). An integer ``t``
(the row's minimum and maximum included) is never moved: comparing ``u``
with the exact fraction (instead of rounding ``t + u`` in float32) cannot
round it up. ``s == 0`` (constant row) or ``s`` NaN (the caller's mark for a
non-finite row) or ``s < 0`` give all-zero codes without hashing. A
non-finite ``h`` in a row with a finite scale gives code 0 (NaN, -Inf) or
``2**b - 1`` (+Inf); so does a finite float64 ``h`` whose ``d`` overflows
float32. A subnormal ``s <= 2**-128`` makes ``inv`` +Inf: codes
are then 0 where ``h <= z`` and ``2**b - 1`` where ``h > z``.

Dequantisation: ``h~ = z + s * q`` evaluated in the output dtype (float32
arithmetic for float32 output: ``float32(z) + float32(s) * float32(q)``, two
roundings; exact products in float64). ``s == 0`` gives exactly ``z``, ``s``
NaN gives NaN. The CUDA twin may fuse the float32 multiply-add into one FMA
(one rounding), so float32 outputs of the twins can differ in the last bit;
float64 outputs are identical (``s * q`` is exact there).

Threads: ``quantize_pack`` is parallel over chunks of whole rows of one group,
each starting at a multiple of 8 rows within its group (8 rows of ``D``
``b``-bit codes fill whole bytes, so a chunk starts on a byte boundary and
rows straddle bytes only inside a chunk). A chunk works in blocks of 8 rows:
each row's codes are computed one byte per code into a scratch buffer by a
loop that numba vectorises (32-bit integer lanes for the hash, float32
lanes for the rounding), then the scratch is gathered into packed bytes
(shifts on 16/32/64-bit words, also vectorised); 8-bit codes are written in
place. The source row a few message rows ahead is prefetched. The other
kernels are parallel over rows. Calls with fewer than :data:`SMALL_WORK`
codes run a serial copy of the kernel (no thread pool wake-up); the thread
count is never changed. Results do not depend on the thread count.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from numba_kernels.cpu._attention_common import SMALL_WORK, plain_array
from numba_kernels.cpu._hash import _mix

__all__ = ["group_layout", "key_hash", "row_range", "quantize_pack", "unpack_dequantize", "BITS"]

#: bit width of group ``g`` (``BITS[g] == 1 << g``)
BITS = (1, 2, 4, 8)

_PAR = dict(parallel=True, cache=True, nogil=True)
_SER = dict(cache=True, nogil=True)
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

_MASK32 = np.uint64(0xFFFFFFFF)
_GOLD32 = np.uint32(0x9E3779B9)
_LB1 = np.uint32(0x7FEB352D)
_LB2 = np.uint32(0x846CA68B)
_S8 = np.uint32(8)
_S15 = np.uint32(15)
_S16 = np.uint32(16)
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_INV_2_24 = np.float32(1.0 / 16777216.0)
_U4 = np.uint16(4)
_U6 = np.uint32(6)
_U12 = np.uint32(12)
_U7 = np.uint64(7)
_U14 = np.uint64(14)
_U28 = np.uint64(28)
_U3 = np.uint64(3)
#: message rows per block: 8 rows of ``D`` codes fill whole bytes at every width
_BLOCK = 8
#: prefetch distance in message rows
_AHEAD = 4


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Hint the cache line holding ``arr[i, j]`` into the caches (``llvm.prefetch``: read, high locality)."""
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=fnty)
        rw, locality, cache = (ir.Constant(i32, v) for v in (0, 3, 1))  # read, keep, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), rw, locality, cache])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _hash32(v):
    """'lowbias32' integer finaliser (bijective on uint32), all arithmetic mod 2**32."""
    v = np.uint32(v ^ (v >> _S16))
    v = np.uint32(v * _LB1)
    v = np.uint32(v ^ (v >> _S15))
    v = np.uint32(v * _LB2)
    return np.uint32(v ^ (v >> _S16))


@njit(**_SER)
def _row_codes(x, src, z, inv, rh, maxq, out):
    """Codes of one active row (scale > 0) into ``out[:D]`` (one uint8 per code); a vectorised loop."""
    D = x.shape[1]
    jg = np.uint32(0)  # j * 0x9E3779B9 mod 2**32, as an induction variable (no multiply)
    for j in range(D):
        d = np.float32(x[src, j] - z)  # float32 - float32, or float64 - float64 (z widened) rounded once
        t = d * inv
        c = t if t > _F0 else _F0  # NaN -> 0
        c = c if c < maxq else maxq  # +Inf -> maxq
        fi = np.int32(c)  # floor (c >= 0)
        frac = c - np.float32(fi)  # exact
        v = _hash32(np.uint32(rh ^ jg))
        jg = np.uint32(jg + _GOLD32)
        u = np.float32(np.int32(v >> _S8)) * _INV_2_24  # 24-bit uniform in [0, 1), exact
        out[j] = np.uint8(fi + np.int32(u < frac))


@njit(**_SER)
def _pack_rows(x, rows, zero, scale, ids, khash, group_start, code_start, codes, g, i0, i1, buf64):
    """Rows ``[i0, i1)`` of group ``g`` (``i0`` a multiple of 8): their codes start on a byte boundary.

    Blocks of up to 8 rows: codes into ``buf64`` (uint64[D + 1] scratch seen as bytes),
    then gathered into bytes. 8-bit codes are written straight into ``codes``.
    """
    D = x.shape[1]
    b = 1 << g
    maxq = np.float32((1 << b) - 1)
    row0 = group_start[g]
    out = code_start[g] + (i0 * D * b) // 8  # exact: i0 % 8 == 0
    buf = buf64.view(np.uint8)
    buf32 = buf64.view(np.uint32)
    buf16 = buf64.view(np.uint16)
    m = rows.shape[0]
    step = max(1, 64 // x.itemsize)  # elements per cache line
    for blk in range(i0, i1, _BLOCK):
        nr = min(_BLOCK, i1 - blk)
        n = nr * D
        nbytes = (n * b + 7) >> 3
        for k in range(nr):
            r = row0 + blk + k
            if r + _AHEAD < m:  # source row _AHEAD message rows ahead (random rows miss the caches)
                nxt = rows[r + _AHEAD]
                for j in range(0, D, step):
                    _prefetch(x, nxt, j)
            s = scale[r]
            if g == 3:
                dst = codes[out + k * D:out + (k + 1) * D]
            else:
                dst = buf[k * D:(k + 1) * D]
            if s > _F0:
                inv = _F1 / s
                rh = np.uint32(_mix(khash, ids[r]) & _MASK32)
                _row_codes(x, rows[r], zero[r], inv, rh, maxq, dst)
            else:  # scale 0, negative or NaN: all codes 0
                dst[:] = 0
        if g == 3:
            out += n
            continue
        buf[n:nbytes << (3 - g)] = 0  # zero codes padding the group's last byte
        # gather the codes of a little-endian word (one code per byte) into its low byte
        dst = codes[out:out + nbytes]  # a slice indexed from 0 keeps the loops vectorised
        if g == 0:  # 8 one-bit codes per uint64
            for t in range(nbytes):
                w = buf64[t]
                w |= w >> _U7
                w |= w >> _U14
                w |= w >> _U28
                dst[t] = np.uint8(w)
        elif g == 1:  # 4 two-bit codes per uint32
            for t in range(nbytes):
                w = buf32[t]
                w = np.uint32(w | (w >> _U6))
                w = np.uint32(w | (w >> _U12))
                dst[t] = np.uint8(w)
        else:  # 2 four-bit codes per uint16
            for t in range(nbytes):
                w = buf16[t]
                dst[t] = np.uint8(w | (w >> _U4))
        out += nbytes


@njit(**_SER)
def _pack_ser(x, rows, zero, scale, ids, khash, group_start, code_start, codes):
    buf64 = np.empty(x.shape[1] + 1, np.uint64)
    for g in range(4):
        # np.int64(0), not a literal 0: the same compiled signature as _pack_par's calls (a literal compiles anew)
        _pack_rows(x, rows, zero, scale, ids, khash, group_start, code_start, codes,
                   g, np.int64(0), group_start[g + 1] - group_start[g], buf64)


@njit(**_PAR)
def _pack_par(x, rows, zero, scale, ids, khash, group_start, code_start, codes, chunk_rows):
    first = np.zeros(5, np.int64)  # first chunk of each group
    for g in range(4):
        n = group_start[g + 1] - group_start[g]
        first[g + 1] = first[g] + (n + chunk_rows - 1) // chunk_rows
    for c in prange(first[4]):
        g = 0
        while c >= first[g + 1]:
            g += 1
        i0 = (c - first[g]) * chunk_rows
        i1 = min(i0 + chunk_rows, group_start[g + 1] - group_start[g])
        buf64 = np.empty(x.shape[1] + 1, np.uint64)
        _pack_rows(x, rows, zero, scale, ids, khash, group_start, code_start, codes, g, i0, i1, buf64)


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

    Code of feature ``j`` of message row ``r`` (width ``b``): ``t = (x[rows[r], j] - zero[r]) * (1 / scale[r])``
    in float32, ``q = clamp(floor(t) + [u(key, ids[r], j) < t - floor(t)], 0, 2**b - 1)``
    (exact rounding steps in the module docstring), 0 for a row with scale 0, < 0 or NaN.
    Parallel over chunks of whole rows (a multiple of 8 rows of one group each).
    """
    group_start, code_start = plain_array(group_start, np.int64), plain_array(code_start, np.int64)
    if codes.shape[0] != code_start[4]:
        raise ValueError(f"codes has {codes.shape[0]} bytes, layout needs {int(code_start[4])}")
    if codes.shape[0] == 0:
        return
    kh = key_hash(key)
    m = rows.shape[0]
    if m * x.shape[1] < SMALL_WORK:
        _pack_ser(x, rows, zero, scale, ids, kh, group_start, code_start, codes)
    else:
        per = -(-m // (_CHUNKS_PER_THREAD * numba.get_num_threads()))
        chunk_rows = max(_BLOCK, -(-per // _BLOCK) * _BLOCK)
        _pack_par(x, rows, zero, scale, ids, kh, group_start, code_start, codes, chunk_rows)


# ---------------------------------------------------------------------------
# unpack_dequantize


@njit(**_SER)
def _unpack_rows(codes, zt, st, levels, group_start, code_start, out_rows, out, r0, r1):
    D = out.shape[1]
    g = 0
    for r in range(r0, r1):
        while r >= group_start[g + 1]:  # rows come in group order
            g += 1
        b = np.uint64(1 << g)
        mask = np.uint32((1 << (1 << g)) - 1)
        sec = codes[code_start[g]:code_start[g + 1]]
        k0 = np.uint64((r - group_start[g]) * D)
        row = out[out_rows[r]]
        z = zt[r]
        s = st[r]
        for j in range(D):  # unsigned indices: no wraparound checks, so the loop vectorises
            bit = (k0 + np.uint64(j)) * b
            q = (np.uint32(sec[bit >> _U3]) >> np.uint32(bit & _U7)) & mask
            row[j] = z + s * levels[q]


@njit(**_SER)
def _unpack_ser(codes, zero, scale, group_start, code_start, out_rows, out):
    zt = zero.astype(out.dtype)
    st = scale.astype(out.dtype)
    levels = np.arange(256).astype(out.dtype)
    _unpack_rows(codes, zt, st, levels, group_start, code_start, out_rows, out, np.int64(0), out_rows.shape[0])


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
    group_start, code_start = plain_array(group_start, np.int64), plain_array(code_start, np.int64)
    if codes.shape[0] != code_start[4]:
        raise ValueError(f"codes has {codes.shape[0]} bytes, layout needs {int(code_start[4])}")
    if m * out.shape[1] < SMALL_WORK:
        _unpack_ser(codes, zero, scale, group_start, code_start, out_rows, out)
    else:
        _unpack_par(codes, zero, scale, group_start, code_start, out_rows, out, _chunks(m))
