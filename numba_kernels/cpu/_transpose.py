"""CSR -> CSC transpose by counting sort (CPU only; O(E + N), stable).

Used by :mod:`hpc_graph.ops` to build the cached transposed copy of a
:class:`~hpc_graph.ops.csr.CSR` for backward passes. The result equals a stable
argsort of ``indices`` (within a source, edges keep CSR order), at a fraction
of the cost. On CUDA the ops layer uses torch's sort instead.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def csr_transpose(indptr, indices, num_src, with_perm=True):
    """Transpose a CSR with ``num_src`` columns.

    Args:
        indptr: int64[Nd+1]; indices: int64[E] in ``[0, num_src)``.
        with_perm: also return the edge permutation (else an empty int64[0]).
    Returns:
        ``(indptr_t int64[num_src+1], indices_t int64[E], perm int64[E] or int64[0])``:
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
    indices_t = np.empty(E, np.int64)
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
