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

def sddmm(indptr, indices, a, b, out) -> None:
    """``out[k, h] = a[dst(k), h, :] . b[indices[k], h, :]`` for every edge position ``k``."""
    H, D = a.shape[1], a.shape[2]
    kern = _sddmm_pow2 if D >= 8 and D & (D - 1) == 0 else _sddmm
    kern(default_chunks(indptr), indptr, indices, a.reshape(a.shape[0], H * D), b.reshape(b.shape[0], H * D), out, D)


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _sddmm_pow2(bounds, indptr, indices, a, b, out, D):
    # _sddmm for D a power of two >= 8: halving down to 8 with no remainder, then a tree of 8 (no branch per
    # head: 0.63 s against the general kernel's 0.77 s at R-MAT scale 20, 4 x 32)
    F = a.shape[1]
    H = F // D
    E = indices.shape[0]
    base = b.ctypes.data
    rb = b.strides[0]
    lines = row_lines(rb)
    for c in prange(bounds.shape[0] - 1):
        t = np.empty(F, dtype=out.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            for k in range(indptr[i], indptr[i + 1]):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, indices[k + PREFETCH_DISTANCE])
                j = indices[k]
                for f in range(F):
                    t[f] = a[i, f] * b[j, f]
                w = D
                while w > 8:
                    w //= 2
                    for h in range(H):
                        o = h * D
                        for f in range(w):
                            t[o + f] += t[o + w + f]
                for h in range(H):
                    o = h * D
                    out[k, h] = (((t[o] + t[o + 1]) + (t[o + 2] + t[o + 3]))
                                 + ((t[o + 4] + t[o + 5]) + (t[o + 6] + t[o + 7])))


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _sddmm(bounds, indptr, indices, a, b, out, D):
    # a [Nd, F], b [Ns, F] flat rows (F = H * D). Per edge: the F products in one vectorised pass into a
    # thread-local row, then each head's D products folded in halves (vectorised adds) while D is even and above 8,
    # then summed (a tree for 8). With _sddmm_pow2, 1.7x faster than one dot product per head with 8 running
    # partial sums (R-MAT scale 20, 4 x 32: 0.63 s vs 1.07 s on 2 cores; the bare row gathers take 0.35 s).
    F = a.shape[1]
    H = F // D
    E = indices.shape[0]
    base = b.ctypes.data
    rb = b.strides[0]
    lines = row_lines(rb)
    for c in prange(bounds.shape[0] - 1):
        t = np.empty(F, dtype=out.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            for k in range(indptr[i], indptr[i + 1]):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, indices[k + PREFETCH_DISTANCE])
                j = indices[k]
                for f in range(F):
                    t[f] = a[i, f] * b[j, f]
                w = D
                while w > 8 and w % 2 == 0:  # every head's products folded in halves, head by head
                    w //= 2
                    for h in range(H):
                        o = h * D
                        for f in range(w):
                            t[o + f] += t[o + w + f]
                for h in range(H):
                    o = h * D
                    if w == 8:  # a tree: three dependent adds, not seven
                        s = (((t[o] + t[o + 1]) + (t[o + 2] + t[o + 3]))
                             + ((t[o + 4] + t[o + 5]) + (t[o + 6] + t[o + 7])))
                    else:
                        s = t[o]
                        for u in range(1, w):
                            s += t[o + u]
                    out[k, h] = s
