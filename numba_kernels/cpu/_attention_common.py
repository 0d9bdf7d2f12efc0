"""Private helpers shared by the CPU attention kernels (``gat_attention``, ``dot_attention``).

* ``_row_chunks``: split CSR rows into contiguous chunks of about equal cost
  (edges + rows), so a ``prange`` over chunks balances power-law degrees.
* ``_gid``: the global id of a local row, which keys the attention-dropout hash
  (``_mix`` / ``_keep``, :mod:`numba_kernels.cpu._hash`).
* ``init_state`` / ``finalize``: the online-softmax state ``(m, l, acc)``.
* ``_leaky``, ``_edge_hash``, ``_scalars``, ``_head_dot``: the pieces of an edge score that the forward and
  both backward passes of a kernel compute alike, inlined into each.
* ``global_ids``: ``None`` global ids as :data:`LOCAL_IDS`.
* ``plain_array``: an input made C-contiguous and writable, so that a kernel compiles one signature for it.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._hash import _mix

#: fastmath flags that allow vectorising reductions but keep inf/nan semantics
#: (the running max starts at -inf).
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

#: stands for "global id = local id" where a kernel takes ``src_gid``/``dst_gid`` (passed for ``None``)
LOCAL_IDS = np.full(1, -1, dtype=np.int64)


@njit(cache=True, inline="always")
def _gid(ids, k):
    """Global id of local row ``k``: ``ids[k]``, or ``k`` itself when ``ids`` is :data:`LOCAL_IDS`."""
    return ids[k] if ids[0] >= 0 else k


def global_ids(src_gid, dst_gid):
    """``(src_gid, dst_gid)`` with ``None`` (global id = local id) given as :data:`LOCAL_IDS`."""
    return (LOCAL_IDS if src_gid is None else src_gid), (LOCAL_IDS if dst_gid is None else dst_gid)


@njit(inline="always")
def _leaky(pre, slope):
    """LeakyReLU of a score."""
    return pre if pre >= 0 else pre * slope


@njit(inline="always")
def _edge_hash(dst_hash, src_gid, j, use_drop):
    """The dropout hash of edge ``(i, j)`` from its destination's hash (0 when dropout is off)."""
    return _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)


@njit(inline="always")
def _scalars(like, a, b):
    """``(a, b, 0, 1)`` as scalars of ``like``'s dtype: float32 math then stays float32 (and vectorises)."""
    c = np.zeros(4, dtype=like.dtype)
    c[0] = a
    c[1] = b
    c[3] = 1.0
    return c[0], c[1], c[2], c[3]


@njit(inline="always")
def _head_dot(a, i, b, j, h, zero):
    """``a[i, h, :] . b[j, h, :]``."""
    s = zero
    for d in range(a.shape[2]):
        s += a[i, h, d] * b[j, h, d]
    return s


@njit(cache=True)
def _row_chunks(indptr, nchunks):
    """int64[nchunks+1] row boundaries splitting ``indptr`` rows by cost ``edges + rows``."""
    n = indptr.shape[0] - 1
    total = indptr[n] + n
    bounds = np.empty(nchunks + 1, dtype=np.int64)
    bounds[0] = 0
    bounds[nchunks] = n
    for c in range(1, nchunks):
        target = total * c // nchunks
        lo = bounds[c - 1]
        hi = n
        while lo < hi:  # first row i with cost(i) >= target, cost(i) = indptr[i] + i
            mid = (lo + hi) // 2
            if indptr[mid] + mid < target:
                lo = mid + 1
            else:
                hi = mid
        bounds[c] = lo
    return bounds


#: below this many multiply-adds a kernel runs on one thread: waking the
#: thread pool costs more than the work (milliseconds on a loaded machine).
SMALL_WORK = 1 << 16


def plain_array(a, dtype=None) -> np.ndarray:
    """``a`` C-contiguous, writable and of ``dtype`` (a copy only where it is not). numba types a transposed or a
    read-only array apart from a plain one and compiles a kernel again for it (tens of seconds for the largest)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a if a.flags.writeable else a.copy()


def run_parallel(kernel, indptr, work: int, *args) -> None:
    """Call ``kernel(bounds, indptr, *args)`` with nnz-balanced row chunks ``bounds``.

    ``work`` estimates the multiply-adds; small calls run on one thread.
    """
    chunks = 1 if work < SMALL_WORK else max(1, min(indptr.shape[0] - 1, 8 * numba.get_num_threads()))
    _small(kernel, work, _row_chunks(indptr, chunks), indptr, *args)


def _small(kernel, work: int, *args) -> None:
    """Call ``kernel(*args)``, on one thread when ``work`` is below :data:`SMALL_WORK`."""
    threads = numba.get_num_threads()
    if work < SMALL_WORK and threads > 1:
        numba.set_num_threads(1)
        try:
            kernel(*args)
        finally:
            numba.set_num_threads(threads)
    else:
        kernel(*args)


def init_state(num_dst: int, heads: int, dim: int, dtype=np.float32):
    """Empty online-softmax state: ``m`` float[num_dst, heads] = -inf (running max),
    ``l`` float[num_dst, heads] = 0 (running sum), ``acc`` float[num_dst, heads, dim] = 0."""
    m = np.full((num_dst, heads), -np.inf, dtype=dtype)
    l = np.zeros((num_dst, heads), dtype=dtype)
    acc = np.zeros((num_dst, heads, dim), dtype=dtype)
    return m, l, acc


@njit(parallel=True, cache=True)
def _finalize(l, acc):
    n = acc.shape[0]
    H = acc.shape[1]
    D = acc.shape[2]
    for i in prange(n):
        for h in range(H):
            s = l[i, h]
            if s > 0:
                inv = 1.0 / s
                for d in range(D):
                    acc[i, h, d] *= inv
            else:
                for d in range(D):
                    acc[i, h, d] = 0.0


def finalize(m, l, acc) -> None:
    """Normalise in place: ``acc[i,h,:] /= l[i,h]`` (rows without edges become 0).

    ``acc`` then holds the attention output; ``m`` and ``l`` are left unchanged
    (the backward pass needs them).
    """
    if acc.shape[0]:
        _small(_finalize, acc.size, l, acc)


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _output_delta(grad_out, out, delta):
    n = out.shape[0]
    H = out.shape[1]
    D = out.shape[2]
    for i in prange(n):
        for h in range(H):
            s = 0.0
            for d in range(D):
                s += grad_out[i, h, d] * out[i, h, d]
            delta[i, h] = s


def output_delta(grad_out, out, delta) -> None:
    """``delta[i,h] = grad_out[i,h,:] . out[i,h,:]`` (the softmax-backward correction term)."""
    if out.shape[0]:
        _small(_output_delta, out.size, grad_out, out, delta)
