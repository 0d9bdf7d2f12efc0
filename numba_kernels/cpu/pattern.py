"""Hop-distance codes of node pairs on a CSR (CPU only): the structural bias buckets of graph transformers.

``pair_hops(indptr, indices, a, b, out)``: for each pair ``(a[p], b[p])`` of node
ids, ``out[p]`` is 0 when ``a == b``, 1 when ``b`` is a neighbour of ``a`` (listed in
row ``a``), 2 when the two rows share a neighbour, else 3 ("3 or more hops, or
unreachable"). Rows must be ascending (``is_sorted_rows``); the test of a pair
is a binary search (1 hop) and a merge of the two rows (2 hops), O(d_a + d_b).
Used by :mod:`hpc_graph.graph.attention_pattern` for the pairs that a sparse
attention pattern adds beyond the graph's own edges (the sequence chain).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["pair_hops", "is_sorted_rows"]


@njit(cache=True, nogil=True, inline="always")
def _contains(indices, lo, hi, v) -> bool:
    a, b = lo, hi
    while a < b:
        m = (a + b) >> 1
        if indices[m] < v:
            a = m + 1
        else:
            b = m
    return a < hi and indices[a] == v


@njit(cache=True, nogil=True, inline="always")
def _share(indices, a0, a1, b0, b1) -> bool:
    while a0 < a1 and b0 < b1:
        x, y = indices[a0], indices[b0]
        if x == y:
            return True
        if x < y:
            a0 += 1
        else:
            b0 += 1
    return False


@njit(parallel=True, cache=True, nogil=True)
def _pair_hops(indptr, indices, a, b, out):
    for p in prange(a.shape[0]):
        i, j = a[p], b[p]
        if i == j:
            out[p] = 0
        elif _contains(indices, indptr[i], indptr[i + 1], j):
            out[p] = 1
        elif _share(indices, indptr[i], indptr[i + 1], indptr[j], indptr[j + 1]):
            out[p] = 2
        else:
            out[p] = 3


def pair_hops(indptr, indices, a, b, out) -> None:
    """Write the hop code (0, 1, 2 or 3 for "3+ / unreachable") of every pair ``(a[p], b[p])`` into ``out``.

    Args:
        indptr: int64[N+1]; indices: int[E] with ascending rows.
        a, b: int64[P] node ids in ``[0, N)``.
        out: uint8/int array [P], written in full.
    """
    if a.shape != b.shape or a.shape[0] != out.shape[0]:
        raise ValueError(f"pair_hops: a {a.shape}, b {b.shape} and out {out.shape} must have one length")
    if a.shape[0]:
        _pair_hops(indptr, indices, a, b, out)


@njit(cache=True, nogil=True)
def is_sorted_rows(indptr, indices) -> bool:
    """Whether every row of the CSR lists its columns in ascending order."""
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i] + 1, indptr[i + 1]):
            if indices[k - 1] > indices[k]:
                return False
    return True
