"""CSR -> CSC transpose by counting sort (CPU only; O(E + N), stable).

Used by :mod:`hpc_graph.ops` to build the cached transposed copy of a
:class:`~hpc_graph.ops.csr.CSR` for backward passes. The result equals a stable
argsort of ``indices`` (within a source, edges keep CSR order), at a fraction
of the cost. On CUDA the ops layer uses torch's sort instead.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def csr_transpose(indptr, indices, num_src, with_perm):
    """Transpose a CSR with ``num_src`` columns.

    Args:
        indptr: int64[Nd+1]; indices: int32 or int64[E] in ``[0, num_src)`` (int32 only when Nd < 2**31:
            the transpose's row ids take the same type).
        with_perm: also return the edge permutation (else an empty int64[0]). No default: numba compiles a
            call that omits an argument apart from one that passes it (one more signature per index type).
    Returns:
        ``(indptr_t int64[num_src+1], indices_t int[E] (``indices``' type), perm int64[E] or int64[0])``:
        source ``j`` lists destination rows ``indices_t[indptr_t[j]:indptr_t[j+1]]``
        (ascending), and ``perm[p]`` is the CSR position of CSC edge ``p``.
    """
    n = indptr.shape[0] - 1
    E = indices.shape[0]
    indptr_t = np.zeros(num_src + 1, np.int64)
    for k in range(E):
        indptr_t[indices[k] + 1] += 1
    for j in range(num_src):
        indptr_t[j + 1] += indptr_t[j]
    cursor = indptr_t[:-1].copy()
    indices_t = np.empty(E, indices.dtype)  # int32 stays int32 (a CSR's row ids fit its own index type)
    perm = np.empty(E if with_perm else 0, np.int64)
    for i in range(n):
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            p = cursor[j]
            cursor[j] = p + 1
            indices_t[p] = i
            if with_perm:
                perm[p] = k
    return indptr_t, indices_t, perm


@njit(cache=True, nogil=True, inline="always")
def _count_in_row(indices, lo, hi, v):
    """Occurrences of ``v`` in the ascending slice ``indices[lo:hi]`` (two binary searches)."""
    a, b = lo, hi
    while a < b:
        m = (a + b) >> 1
        if indices[m] < v:
            a = m + 1
        else:
            b = m
    first = a
    b = hi
    while a < b:
        m = (a + b) >> 1
        if indices[m] <= v:
            a = m + 1
        else:
            b = m
    return a - first


@njit(parallel=True, cache=True, nogil=True)
def _symmetric_rows(indptr, indices, bad):
    n = indptr.shape[0] - 1
    for i in prange(n):
        lo, hi = indptr[i], indptr[i + 1]
        for k in range(lo, hi):
            j = indices[k]
            if k > lo and indices[k - 1] > j:  # rows must be ascending for the transpose to equal the CSR
                bad[i] = 1
                break
            if k > lo and indices[k - 1] == j:  # multiplicity counted at the first occurrence
                continue
            if j < 0 or j >= n or _count_in_row(indices, lo, hi, j) != \
                    _count_in_row(indices, indptr[j], indptr[j + 1], i):
                bad[i] = 1
                break


def is_symmetric(indptr, indices) -> bool:
    """Whether a square CSR equals its own transpose (:func:`csr_transpose` of it gives the same arrays).

    True when every row is ascending and edge ``i -> j`` occurs as often as
    ``j -> i``; O(E log d), no E-sized temporary (the check that lets a symmetric
    graph's backward passes walk the CSR itself instead of a second copy).
    """
    n = indptr.shape[0] - 1
    bad = np.zeros(max(n, 0), np.uint8)
    if n == 0:
        return True
    _symmetric_rows(indptr, indices, bad)
    return not bad.any()
