"""Work split for row-parallel CPU kernels: chunks of rows with equal work.

A row ``i`` of a CSR costs about ``1 + deg(i)`` units (one output row written,
``deg(i)`` source rows read). On power-law graphs an equal split by *rows*
leaves one thread with the hub rows while the others idle, so the CPU kernels
split the rows into ``CHUNKS_PER_THREAD * threads`` contiguous chunks of equal
*cost* (a binary search on the strictly increasing prefix cost
``indptr[i] + i``) and ``prange`` over the chunks.

A single row is never split: a row that alone holds more than one chunk's share
of edges gets a chunk of its own (its cost bounds the parallel time).

Thread count: whatever ``numba.get_num_threads()`` says on the calling
thread. The kernels never change it; ``hpc_graph.comm.threads`` decides the
threads of a rank once at start-up (explicit setting, ``NUMBA_NUM_THREADS`` /
``OMP_NUM_THREADS``, else the rank's share of its CPUs).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit

#: chunks per thread: enough that static scheduling still balances well.
CHUNKS_PER_THREAD = 8


@njit(cache=True, nogil=True)
def row_chunks(indptr: np.ndarray, num_chunks: int) -> np.ndarray:
    """Split rows ``[0, len(indptr)-1)`` into at most ``num_chunks`` contiguous chunks of equal cost.

    Args:
        indptr: int64[N+1] CSR row pointer (non-decreasing, starts at 0).
        num_chunks: requested number of chunks (>= 1).
    Returns:
        int64[C+1] chunk boundaries, ``C <= num_chunks``: chunk ``c`` holds rows
        ``bounds[c]:bounds[c+1]``; ``bounds[0] == 0`` and ``bounds[C] == N``.
        Chunks are non-empty unless ``N == 0`` (then ``C == 1``, one empty chunk).
    """
    n = indptr.shape[0] - 1
    c_req = max(1, min(num_chunks, n))
    total = indptr[n] + n  # cost of all rows
    bounds = np.empty(c_req + 1, np.int64)
    bounds[0] = 0
    m = 1
    for c in range(1, c_req):
        target = (total * c) // c_req
        # smallest r with indptr[r] + r >= target (prefix cost is strictly increasing)
        lo = bounds[m - 1]
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if indptr[mid] + mid < target:
                lo = mid + 1
            else:
                hi = mid
        if lo > bounds[m - 1] and lo < n:
            bounds[m] = lo
            m += 1
    bounds[m] = n
    return bounds[:m + 1]


def default_chunks(indptr: np.ndarray) -> np.ndarray:
    """:func:`row_chunks` with ``CHUNKS_PER_THREAD * numba.get_num_threads()`` chunks.

    Called from Python (not from jitted code): reading the thread count inside
    a kernel would stop numba from caching it on disk.
    """
    return row_chunks(indptr, CHUNKS_PER_THREAD * numba.get_num_threads())
