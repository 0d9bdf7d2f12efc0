"""Edge-balanced work split shared by the CUDA kernels that walk CSR rows (SpMM sum, fused GAT).

The CSR positions ``0..E-1`` are cut into chunks of ``T`` positions. Chunk
``ch`` covers ``[ch T, min(ch T + T, E))`` and *owns* the rows that start in
it (the last chunk also owns the rows starting at ``E``: trailing empty
rows). Its positions before the first owned row's start (``lo .. lead``)
belong to the row that started in an earlier chunk (row ``r0 - 1``): the
chunk's *leading part* of that row. The last owned row may run past the
chunk's end: the chunk's *trailing part*. A kernel computes the rows that
start and end in a chunk in full, stores the leading and trailing parts in
per-chunk scratch rows (``ext[ch]`` = the trailing row or -1), and a second
kernel combines, for every trailing row, its owner's trailing part with the
leading parts of the chunks it covers, in chunk order (deterministic). No
row is ever walked by one group alone for more than ``T`` positions.
"""
from __future__ import annotations

from numba import cuda


@cuda.jit(device=True, inline=True)
def lower_bound(indptr, n, v):
    """First row ``r`` in ``[0, n]`` with ``indptr[r] >= v`` (``indptr`` non-decreasing, length ``n + 1``)."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if indptr[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def chunk_rows(ch, T, indptr, n, E, nchunks):
    """``(lo, hi, r0, r1, lead)`` of chunk ``ch``: its positions ``[lo, hi)``, its owned rows ``[r0, r1)``
    and the end of its leading part ``[lo, lead)`` (empty when ``lead == lo``; the row is ``r0 - 1``)."""
    lo = ch * T
    hi = min(lo + T, E)
    r0 = lower_bound(indptr, n, lo)
    r1 = n if ch == nchunks - 1 else lower_bound(indptr, n, hi)
    lead = hi
    if r0 < n and indptr[r0] < hi:
        lead = indptr[r0]
    return lo, hi, r0, r1, lead


def num_chunks(num_edges: int, T: int) -> int:
    """Chunks of ``T`` positions over ``num_edges`` (at least one, which owns every row of an edgeless CSR)."""
    return max(1, (int(num_edges) + T - 1) // T)
