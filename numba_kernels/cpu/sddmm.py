"""SDDMM over a destination-major CSR (CPU twin): per-edge, per-head dot products.

``out[k, h] = sum_d a[i, h, d] * b[j, h, d]`` for every edge ``k = (j -> i)``,
with ``i`` the CSR row of position ``k`` and ``j = indices[k]``.

Shapes: ``indptr`` int64[Nd+1], ``indices`` int64[E], ``a`` float[Nd, H, D]
(destination side), ``b`` float[Ns, H, D] (source side), ``out`` float[E, H]
written in full, in CSR edge order. One float dtype for all (float32 or
float64), C-contiguous; indices are trusted (validated by the ops layer).
Row-parallel over chunks of equal work; each edge is written by one thread.
Its gradients are SpMMs (:mod:`numba_kernels.cpu.spmm`).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from numba_kernels.cpu._partition import default_chunks
from numba_kernels.cpu._prefetch import PREFETCH_DISTANCE, prefetch_row, row_lines

_LANES = 8  # independent partial sums per dot product (SIMD-friendly without fastmath)


def sddmm(indptr, indices, a, b, out) -> None:
    """``out[k, h] = a[dst(k), h, :] . b[indices[k], h, :]`` for every edge position ``k``."""
    _sddmm(default_chunks(indptr), indptr, indices, a, b, out)


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _sddmm(bounds, indptr, indices, a, b, out):
    H = a.shape[1]
    D = a.shape[2]
    main = D - D % _LANES
    E = indices.shape[0]
    base = b.ctypes.data
    rb = b.strides[0]
    lines = row_lines(rb)
    for c in prange(bounds.shape[0] - 1):
        part = np.empty(_LANES, dtype=out.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            for k in range(indptr[i], indptr[i + 1]):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, indices[k + PREFETCH_DISTANCE])
                j = indices[k]
                for h in range(H):
                    part[:] = 0
                    for d0 in range(0, main, _LANES):
                        for t in range(_LANES):
                            part[t] += a[i, h, d0 + t] * b[j, h, d0 + t]
                    s = part[0]
                    for t in range(1, _LANES):
                        s += part[t]
                    for d in range(main, D):
                        s += a[i, h, d] * b[j, h, d]
                    out[k, h] = s
