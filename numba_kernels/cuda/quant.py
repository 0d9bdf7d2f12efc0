"""Low-bit quantisation of message rows (CUDA twin of :mod:`numba_kernels.cpu.quant`).

Same functions, arguments, message layout, hash and semantics as the CPU twin
(read its module docstring); arrays are numba device arrays or anything
exposing ``__cuda_array_interface__`` (torch CUDA tensors), outputs
preallocated by the caller. ``group_start``/``code_start`` are read inside
the kernels (device arrays avoid a copy per call); launch sizes come from
array shapes only, so no host synchronisation is needed. Kernels launch on
the stream set by :func:`numba_kernels.cuda._launch.on_stream`.

* ``row_range``: one thread block per message row (grid-stride), the block's
  threads stride over the features (coalesced) and reduce min/max/non-finite
  in shared memory.
* ``quantize_pack``: one thread per output byte (grid-stride), assembling its
  ``8 / b`` codes; consecutive threads read consecutive features. Codes are
  byte-identical to the CPU twin: the same 32-bit hash, and every
  floating-point step of the CPU docstring's formula is an explicitly rounded
  libdevice operation (``dadd_rn(h, -z)`` for ``h - z`` in float64, then ``cvt.rn``
  to float32; ``fdiv_rn`` for ``1 / s``; ``fmul_rn`` for ``d * inv`` and
  ``u``; ``fsub_rn`` for ``c - floor(c)``), which compile to ``.rn`` PTX
  instructions that are never contracted into an FMA. (For float32 ``x``,
  the float64 subtraction rounded to float32 equals the CPU's float32
  subtraction: double rounding is innocuous for 53 >= 2 * 24 + 2 bits.)
  The PTX check in the tests asserts that the pack kernel holds no FMA and
  no float32 arithmetic without ``.rn``. Under the CUDA simulator (where
  libdevice is not available) the same steps run as NumPy scalar operations.
* ``unpack_dequantize``: one thread per (message row, feature). The float32
  ``z + s * q`` may be fused into one FMA here (one rounding instead of two),
  so float32 outputs can differ from the CPU twin in the last bit; float64
  outputs are identical.

:func:`group_layout` and :func:`key_hash` are the CPU twin's (host functions).
"""
from __future__ import annotations

import math

import numpy as np
from numba import config, cuda, float32, float64, int32, uint32

from numba_kernels.cuda._launch import compiled, stream

from numba_kernels.cpu.quant import BITS, group_layout, key_hash  # noqa: F401  (same helpers in both twins)
from numba_kernels.cuda._hash import _mix

__all__ = ["group_layout", "key_hash", "row_range", "quantize_pack", "unpack_dequantize", "BITS"]

_THREADS = 128  # threads per block (also the shared-memory reduction width)
_MAX_BLOCKS = 65535 * 4
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

if config.ENABLE_CUDASIM:  # libdevice has no simulator implementation: NumPy scalars round the same way
    def _dadd_rn(a, b):
        return np.float64(a) + np.float64(b)

    def _fdiv_rn(a, b):
        return np.float32(a) / np.float32(b)

    def _fmul_rn(a, b):
        return np.float32(a) * np.float32(b)

    def _fsub_rn(a, b):
        return np.float32(a) - np.float32(b)
else:
    from numba.cuda.libdevice import dadd_rn as _dadd_rn  # libdevice has no dsub_rn: a + (-b)
    from numba.cuda.libdevice import fdiv_rn as _fdiv_rn
    from numba.cuda.libdevice import fmul_rn as _fmul_rn
    from numba.cuda.libdevice import fsub_rn as _fsub_rn


def _blocks(n: int, threads: int = _THREADS) -> int:
    return min(max((n + threads - 1) // threads, 1), _MAX_BLOCKS)


@cuda.jit
def _row_range_kernel(x, rows, lo, hi):
    smin = cuda.shared.array(_THREADS, float64)
    smax = cuda.shared.array(_THREADS, float64)
    sbad = cuda.shared.array(_THREADS, int32)
    D = x.shape[1]
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x  # a power of two <= _THREADS
    for r in range(cuda.blockIdx.x, rows.shape[0], cuda.gridDim.x):
        src = rows[r]
        mn = math.inf
        mx = -math.inf
        bad = 0
        for j in range(tid, D, nt):
            v = float64(x[src, j])
            if not math.isfinite(v):
                bad = 1
            else:
                if v < mn:
                    mn = v
                if v > mx:
                    mx = v
        smin[tid] = mn
        smax[tid] = mx
        sbad[tid] = bad
        cuda.syncthreads()
        half = nt // 2
        while half > 0:
            if tid < half:
                if smin[tid + half] < smin[tid]:
                    smin[tid] = smin[tid + half]
                if smax[tid + half] > smax[tid]:
                    smax[tid] = smax[tid + half]
                if sbad[tid + half] != 0:
                    sbad[tid] = 1
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            if sbad[0] != 0:
                lo[r] = math.nan
                hi[r] = math.nan
            elif D == 0:
                lo[r] = 0.0
                hi[r] = 0.0
            else:
                lo[r] = smin[0]  # rounds a float64 extreme to the nearest float32
                hi[r] = smax[0]
        cuda.syncthreads()  # shared memory is reused by the next row


@cuda.jit(device=True, inline=True)
def _hash32(v):
    """'lowbias32' (the CPU twin's ``_hash32``), arithmetic mod 2**32."""
    v = uint32(v ^ (v >> _S16))
    v = uint32(v * _LB1)
    v = uint32(v ^ (v >> _S15))
    v = uint32(v * _LB2)
    return uint32(v ^ (v >> _S16))


@cuda.jit
def _pack_kernel(x, rows, zero, scale, ids, khash, group_start, code_start, codes):
    D = x.shape[1]
    for t in range(cuda.grid(1), codes.shape[0], cuda.gridsize(1)):
        g = 0
        while g < 3 and t >= code_start[g + 1]:  # empty groups are skipped
            g += 1
        b = 1 << g
        per_byte = 8 >> g
        maxq = float32((1 << b) - 1)
        row0 = group_start[g]
        n_codes = (group_start[g + 1] - row0) * D
        k = (t - code_start[g]) * per_byte
        cur = -1
        active = False
        src = 0
        z = float64(0.0)
        inv = _F1
        rh = uint32(0)
        acc = 0
        i = k // D  # one division per byte; then step (i, j) along the row
        j = k - i * D
        for c in range(per_byte):
            if k >= n_codes:
                break
            if i != cur:
                cur = i
                r = row0 + i
                src = rows[r]
                z = float64(zero[r])
                s = scale[r]
                active = s > _F0  # False for 0, negative and NaN scales: all codes 0
                if active:
                    inv = _fdiv_rn(_F1, s)
                    rh = uint32(_mix(khash, ids[r]) & _MASK32)
            if active:
                d = float32(_dadd_rn(float64(x[src, j]), -z))  # h - z in float64, one rounding
                tq = _fmul_rn(d, inv)
                cq = tq if tq > _F0 else _F0  # NaN -> 0
                cq = cq if cq < maxq else maxq  # +Inf -> maxq
                fi = int32(cq)
                frac = _fsub_rn(cq, float32(fi))
                v = _hash32(uint32(rh ^ uint32(uint32(j) * _GOLD32)))
                u = _fmul_rn(float32(int32(v >> _S8)), _INV_2_24)
                q = fi + 1 if u < frac else fi
                acc |= q << (c * b)
            k += 1
            j += 1
            if j == D:
                j = 0
                i += 1
        codes[t] = acc


def _build(nbtype):
    @cuda.jit
    def unpack_kernel(codes, zero, scale, group_start, code_start, out_rows, out):
        D = out.shape[1]
        n = out_rows.shape[0] * D
        for e in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = e // D
            j = e - r * D
            g = 0
            while g < 3 and r >= group_start[g + 1]:
                g += 1
            b = 1 << g
            bit = ((r - group_start[g]) * D + j) * b
            q = (int(codes[code_start[g] + (bit >> 3)]) >> (bit & 7)) & ((1 << b) - 1)
            out[out_rows[r], j] = nbtype(zero[r]) + nbtype(scale[r]) * nbtype(q)

    return unpack_kernel


_unpack_kernel = compiled("quant", _build)


def row_range(x, rows, lo, hi) -> None:
    """See :func:`numba_kernels.cpu.quant.row_range`: float32 ``lo``/``hi`` [m], NaN for non-finite rows."""
    m = rows.shape[0]
    if m == 0:
        return
    D = x.shape[1]
    threads = 32
    while threads < _THREADS and threads < D:
        threads *= 2
    _row_range_kernel[min(m, _MAX_BLOCKS), threads, stream()](x, rows, lo, hi)


def quantize_pack(x, rows, zero, scale, ids, key, group_start, code_start, codes) -> None:
    """See :func:`numba_kernels.cpu.quant.quantize_pack`; ``codes`` uint8[code_start[4]] as on the CPU, byte for
    byte."""
    n = codes.shape[0]
    if n == 0:
        return
    _pack_kernel[_blocks(n), _THREADS, stream()](x, rows, zero, scale, ids, key_hash(key), group_start, code_start,
                                                 codes)


def unpack_dequantize(codes, zero, scale, group_start, code_start, out_rows, out) -> None:
    """See :func:`numba_kernels.cpu.quant.unpack_dequantize`: writes ``out[out_rows[r], :]`` (float32/float64)."""
    n = out_rows.shape[0] * out.shape[1]
    if n == 0:
        return
    _unpack_kernel(out.dtype)[_blocks(n), _THREADS, stream()](codes, zero, scale, group_start, code_start, out_rows,
                                                              out)
