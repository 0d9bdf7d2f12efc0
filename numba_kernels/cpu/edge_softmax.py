"""Edge softmax over each destination's in-edges (CPU twin), multi-head, max-subtracted.

``out[k, h] = exp(s[k, h] - m[i, h]) / sum_{k' in row i} exp(s[k', h] - m[i, h])``
with ``m[i, h]`` the row maximum, for every edge position ``k`` of row ``i``.
A row whose scores are all ``-inf`` gets 0 (not NaN).

Shapes: ``indptr`` int64[Nd+1]; ``scores``, ``out``, ``grad_out``,
``grad_scores`` float[E, H] in CSR edge order (one dtype, float32 or float64,
C-contiguous). Row-parallel over chunks of equal work; no atomics.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from numba_kernels.cpu._partition import default_chunks


def edge_softmax(indptr, scores, out) -> None:
    """Softmax of ``scores`` float[E, H] over each row's edges, into ``out`` float[E, H]."""
    _edge_softmax(default_chunks(indptr), indptr, scores, out)


def edge_softmax_backward(indptr, out, grad_out, grad_scores) -> None:
    """``grad_scores[k,h] = out[k,h] * (grad_out[k,h] - sum_{k' in row} out[k',h] * grad_out[k',h])``."""
    _edge_softmax_backward(default_chunks(indptr), indptr, out, grad_out, grad_scores)


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _edge_softmax(bounds, indptr, scores, out):
    H = scores.shape[1]
    for c in prange(bounds.shape[0] - 1):
        m = np.empty(H, dtype=out.dtype)
        tot = np.empty(H, dtype=out.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            start = indptr[i]
            end = indptr[i + 1]
            if end == start:
                continue
            for h in range(H):
                m[h] = -np.inf
                tot[h] = 0
            for k in range(start, end):
                for h in range(H):
                    v = scores[k, h]
                    m[h] = v if v > m[h] else m[h]
            for h in range(H):
                if m[h] == -np.inf:  # all -inf: exp(s - 0) = 0 everywhere, total 0
                    m[h] = 0
            for k in range(start, end):
                for h in range(H):
                    ev = np.exp(scores[k, h] - m[h])
                    out[k, h] = ev
                    tot[h] += ev
            for h in range(H):
                if tot[h] > 0:
                    tot[h] = 1 / tot[h]
            for k in range(start, end):
                for h in range(H):
                    out[k, h] *= tot[h]


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _edge_softmax_backward(bounds, indptr, out, grad_out, grad_scores):
    H = out.shape[1]
    for c in prange(bounds.shape[0] - 1):
        dot = np.empty(H, dtype=out.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            start = indptr[i]
            end = indptr[i + 1]
            for h in range(H):
                dot[h] = 0
            for k in range(start, end):
                for h in range(H):
                    dot[h] += out[k, h] * grad_out[k, h]
            for k in range(start, end):
                for h in range(H):
                    grad_scores[k, h] = out[k, h] * (grad_out[k, h] - dot[h])
