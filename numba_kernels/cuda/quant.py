"""Low-bit quantisation of message rows (CUDA twin of :mod:`numba_kernels.cpu.quant`).

Same functions, arguments, message layout, hash and semantics as the CPU twin
(read its module docstring); arrays are numba device arrays or anything
exposing ``__cuda_array_interface__`` (torch CUDA tensors), outputs
preallocated by the caller. ``group_start``/``code_start`` are read inside
the kernels (device arrays avoid a copy per call); launch sizes come from
array shapes only, so no host synchronisation is needed. Kernels run on the
default stream.

* ``row_range``: one thread block per message row (grid-stride), the block's
  threads stride over the features (coalesced) and reduce min/max/non-finite
  in shared memory.
* ``quantize_pack``: one thread per output byte (grid-stride); consecutive
  threads read consecutive features. Codes are bit-identical to the CPU twin:
  ``(h - z) / s + u`` is a float64 subtraction, IEEE division (``div.rn``) and
  addition; the only fusable product, ``bits * 2**-53`` in ``u``, is exact, so
  an FMA there rounds exactly like the CPU's separate add.
* ``unpack_dequantize``: one thread per (message row, feature). The float32
  ``z + s * q`` may be fused into one FMA here (one rounding instead of two),
  so float32 outputs can differ from the CPU twin in the last bit; float64
  outputs are identical.

:func:`group_layout` and :func:`key_hash` are the CPU twin's (host functions).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32

from numba_kernels.cpu.quant import BITS, group_layout, key_hash  # noqa: F401  (same helpers in both twins)
from numba_kernels.cuda._attention_common import _mix

__all__ = ["group_layout", "key_hash", "row_range", "quantize_pack", "unpack_dequantize", "BITS"]

_THREADS = 128  # threads per block (also the shared-memory reduction width)
_MAX_BLOCKS = 65535 * 4
_INV_2_53 = 1.0 / 9007199254740992.0


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


@cuda.jit
def _pack_kernel(x, rows, zero, scale, ids, khash, group_start, code_start, codes):
    D = x.shape[1]
    for t in range(cuda.grid(1), codes.shape[0], cuda.gridsize(1)):
        g = 0
        while g < 3 and t >= code_start[g + 1]:  # empty groups are skipped
            g += 1
        b = 1 << g
        per_byte = 8 >> g
        mask = (1 << b) - 1
        maxq = float64(mask)
        row0 = group_start[g]
        n_codes = (group_start[g + 1] - row0) * D
        k = (t - code_start[g]) * per_byte
        cur = -1
        active = False
        src = 0
        z = 0.0
        s = 0.0
        rhash = np.uint64(0)
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
                s = float64(scale[r])
                active = s > 0.0
                if active:
                    rhash = _mix(khash, ids[r])
            if active:
                u = float64(_mix(rhash, j) >> np.uint64(11)) * _INV_2_53
                y = (float64(x[src, j]) - z) / s + u
                q = 0
                if y >= maxq:
                    q = mask
                elif y >= 1.0:
                    q = int(y)
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


_UNPACK: dict = {}


def _unpack_kernel(dtype):
    key = np.dtype(dtype).name
    if key not in _UNPACK:
        if key not in ("float32", "float64"):
            raise ValueError(f"quant CUDA kernels support float32/float64 output, got {key}")
        _UNPACK[key] = _build(float32 if key == "float32" else float64)
    return _UNPACK[key]


def row_range(x, rows, lo, hi) -> None:
    """See :func:`numba_kernels.cpu.quant.row_range`: float32 ``lo``/``hi`` [m], NaN for non-finite rows."""
    m = rows.shape[0]
    if m == 0:
        return
    D = x.shape[1]
    threads = 32
    while threads < _THREADS and threads < D:
        threads *= 2
    _row_range_kernel[min(m, _MAX_BLOCKS), threads](x, rows, lo, hi)


def quantize_pack(x, rows, zero, scale, ids, key, group_start, code_start, codes) -> None:
    """See :func:`numba_kernels.cpu.quant.quantize_pack`; ``codes`` uint8[code_start[4]] as on the CPU, byte for byte."""
    n = codes.shape[0]
    if n == 0:
        return
    _pack_kernel[_blocks(n), _THREADS](x, rows, zero, scale, ids, key_hash(key), group_start, code_start, codes)


def unpack_dequantize(codes, zero, scale, group_start, code_start, out_rows, out) -> None:
    """See :func:`numba_kernels.cpu.quant.unpack_dequantize`: writes ``out[out_rows[r], :]`` (float32/float64)."""
    n = out_rows.shape[0] * out.shape[1]
    if n == 0:
        return
    _unpack_kernel(out.dtype)[_blocks(n), _THREADS](codes, zero, scale, group_start, code_start, out_rows, out)
