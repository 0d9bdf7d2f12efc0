"""Neighbour sampling (CUDA twin of :mod:`numba_kernels.cpu.sample`).

``sample_neighbors`` has the CPU twin's arguments, stream, unbiased draw and
Floyd selection (read its module docstring), so it picks the same positions
and writes the same ``out_count`` / ``out_nbrs``. Arrays are numba device
arrays or anything exposing ``__cuda_array_interface__`` (torch CUDA
tensors); launch sizes come from array shapes only (no host synchronisation);
kernels launch on the stream set by :func:`numba_kernels.cuda._launch.on_stream`.

* ``_sample_kernel``: one thread per frontier row (grid-stride). It writes
  ``out_count`` for every row and samples each row whose Floyd selection has
  ``s = min(k, deg - k) <= LOCAL_MAX`` elements in a per-thread local array
  (sorted insertion). Every row with ``fanout <= LOCAL_MAX`` (typical
  fan-outs 5-25) and every ``fanout == -1`` row is done here.
* ``_sample_block_kernel`` (launched only when ``fanout > LOCAL_MAX``): one
  thread block per row with ``s > LOCAL_MAX`` (grid-stride over rows; other
  rows are skipped): thread 0 runs Floyd with an open-addressing hash set in
  shared memory, the block sorts the selection (bitonic) and writes the
  sample in parallel. The shared table holds ``2 * SHARED_MAX`` positions,
  hence the limit ``fanout <= SHARED_MAX`` (2048; ``s <= k <= fanout``).

``fanout == -1``: the slot width ``F`` is taken from ``out_nbrs`` as
``len(out_nbrs) // len(rows)`` (the caller computes the largest degree among
``rows``, :func:`~numba_kernels.cpu.sample.sample_width` on the host or a
torch reduction on the GPU); a row longer than ``F`` gets ``out_count = deg``
but only its first ``F`` neighbours (nothing is written past its slot).

``unique_relabel`` has no CUDA twin: on a GPU the caller uses ``torch.unique``.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, int64

from numba_kernels.cuda._launch import stream

from numba_kernels.cpu.sample import _as_fanout, key_hash, sample_width  # noqa: F401  (host helpers shared)
from numba_kernels.cuda._hash import _mix

__all__ = ["sample_width", "sample_neighbors", "key_hash", "LOCAL_MAX", "SHARED_MAX"]

#: largest Floyd selection done in a thread's local array
LOCAL_MAX = 64
#: largest fan-out (selections of up to this many positions use one block and shared memory)
SHARED_MAX = 2048
_TABLE = 2 * SHARED_MAX  # shared int64 entries per block (32 KiB)
_THREADS = 128
_MAX_BLOCKS = 65535 * 4

_U0 = np.uint64(0)
_U32 = np.uint64(32)
_LO32 = np.uint64(0xFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_PAD = np.int64(0x7FFFFFFFFFFFFFFF)


def _blocks(n: int, threads: int = _THREADS) -> int:
    return min(max((n + threads - 1) // threads, 1), _MAX_BLOCKS)


@cuda.jit(device=True, inline=True)
def _mul128(x, n):
    lo = x * n
    x0 = x & _LO32
    x1 = x >> _U32
    n0 = n & _LO32
    n1 = n >> _U32
    p00 = x0 * n0
    p01 = x0 * n1
    p10 = x1 * n0
    mid = (p00 >> _U32) + (p01 & _LO32) + (p10 & _LO32)
    hi = x1 * n1 + (p01 >> _U32) + (p10 >> _U32) + (mid >> _U32)
    return hi, lo


@cuda.jit(device=True, inline=True)
def _below(rh, t, n):
    un = np.uint64(n)
    hi, lo = _mul128(_mix(rh, t), un)
    t += 1
    if lo < un:
        thr = (_U0 - un) % un
        while lo < thr:
            hi, lo = _mul128(_mix(rh, t), un)
            t += 1
    return np.int64(hi), t


@cuda.jit(device=True, inline=True)
def _row_shape(indptr, rows, fanout, r):
    """``(start, deg, k, complement, s)`` of frontier row ``r``."""
    node = rows[r]
    start = indptr[node]
    deg = indptr[node + 1] - start
    k = deg if (fanout < 0 or fanout >= deg) else fanout
    complement = 2 * k > deg
    s = deg - k if complement else k
    return start, deg, k, complement, s


@cuda.jit
def _sample_kernel(indptr, nbrs, rows, ids, fanout, F, kh, out_count, out_nbrs):
    sel = cuda.local.array(LOCAL_MAX, int64)
    for r in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
        start, deg, k, complement, s = _row_shape(indptr, rows, fanout, r)
        out_count[r] = k
        base = r * F
        if s == 0:  # (no min(): numba-cuda fails to type its vararg form when compiling to PTX)
            for p in range(deg if deg < F else F):
                out_nbrs[base + p] = nbrs[start + p]
            continue
        if s > LOCAL_MAX:
            continue  # _sample_block_kernel
        rh = _mix(kh, ids[r])
        n = 0
        t = 0
        for j in range(deg - s, deg):
            v, t = _below(rh, t, j + 1)
            lo = 0
            hi = n
            while lo < hi:
                mid = (lo + hi) >> 1
                if sel[mid] < v:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < n and sel[lo] == v:
                sel[n] = j
            else:
                for q in range(n, lo, -1):
                    sel[q] = sel[q - 1]
                sel[lo] = v
            n += 1
        if complement:
            o = base
            i = 0
            for p in range(deg):
                if i < s and sel[i] == p:
                    i += 1
                else:
                    out_nbrs[o] = nbrs[start + p]
                    o += 1
        else:
            for i in range(s):
                out_nbrs[base + i] = nbrs[start + sel[i]]


@cuda.jit
def _sample_block_kernel(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs):
    buf = cuda.shared.array(_TABLE, int64)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for r in range(cuda.blockIdx.x, rows.shape[0], cuda.gridDim.x):
        start, deg, k, complement, s = _row_shape(indptr, rows, fanout, r)
        if s <= LOCAL_MAX or s > SHARED_MAX:  # the same for every thread of the block
            continue
        size = 1
        bits = 0
        while size < 2 * s:
            size <<= 1
            bits += 1
        for i in range(tid, size, nt):
            buf[i] = -1
        cuda.syncthreads()
        if tid == 0:  # Floyd's selection into the hash set, then compacted to buf[:s]
            shift = np.uint64(64 - bits)
            mask = size - 1
            rh = _mix(kh, ids[r])
            t = 0
            for j in range(deg - s, deg):
                v, t = _below(rh, t, j + 1)
                slot = np.int64((np.uint64(v) * _GOLDEN) >> shift)
                while buf[slot] >= 0 and buf[slot] != v:
                    slot = (slot + 1) & mask
                if buf[slot] == v:
                    v = j
                    slot = np.int64((np.uint64(v) * _GOLDEN) >> shift)
                    while buf[slot] >= 0:
                        slot = (slot + 1) & mask
                buf[slot] = v
            w = 0
            for i in range(size):
                if buf[i] >= 0:
                    buf[w] = buf[i]
                    w += 1
        cuda.syncthreads()
        P = 1
        while P < s:
            P <<= 1
        for i in range(s + tid, P, nt):
            buf[i] = _PAD
        cuda.syncthreads()
        width = 2  # bitonic sort of buf[:P], ascending
        while width <= P:
            stride = width >> 1
            while stride > 0:
                for i in range(tid, P, nt):
                    partner = i ^ stride
                    if partner > i:
                        a = buf[i]
                        b = buf[partner]
                        up = (i & width) == 0
                        if (a > b) == up:
                            buf[i] = b
                            buf[partner] = a
                cuda.syncthreads()
                stride >>= 1
            width <<= 1
        base = r * F
        if complement:  # position p keeps output index p - #{excluded < p}
            for p in range(tid, deg, nt):
                lo = 0
                hi = s
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if buf[mid] < p:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo == s or buf[lo] != p:
                    out_nbrs[base + p - lo] = nbrs[start + p]
        else:
            for i in range(tid, s, nt):
                out_nbrs[base + i] = nbrs[start + buf[i]]
        cuda.syncthreads()  # buf is reused by the block's next row


def sample_neighbors(indptr, nbrs, rows, ids, fanout, key, out_count, out_nbrs) -> None:
    """See :func:`numba_kernels.cpu.sample.sample_neighbors`: the same ``out_count`` and ``out_nbrs``.

    ``out_nbrs`` has ``len(rows) * F`` entries (``F = fanout``, or for -1 the
    largest degree among ``rows``, read here as ``len(out_nbrs) // len(rows)``).

    Raises:
        ValueError: ``fanout`` is 0, below -1, not an integer or above
            :data:`SHARED_MAX`; ``ids``/``out_count``/``out_nbrs`` have the wrong length.
    """
    f = _as_fanout(fanout)
    if f > SHARED_MAX:
        raise ValueError(f"the CUDA sample_neighbors supports fanout <= {SHARED_MAX} or -1, got fanout={f}")
    m = rows.shape[0]
    for name, a in (("ids", ids), ("out_count", out_count)):
        if a.shape[0] != m:
            raise ValueError(f"{name} has {a.shape[0]} entries, expected len(rows) = {m}")
    if f > 0:
        F = f
        if out_nbrs.shape[0] != m * F:
            raise ValueError(f"out_nbrs has {out_nbrs.shape[0]} entries, expected len(rows) * fanout = {m} * {F}")
    else:
        F = out_nbrs.shape[0] // m if m else 0
        if out_nbrs.shape[0] != m * F:
            raise ValueError(f"out_nbrs has {out_nbrs.shape[0]} entries, not a multiple of len(rows) = {m}")
    if m == 0:
        return
    kh = key_hash(key)
    _sample_kernel[_blocks(m), _THREADS, stream()](indptr, nbrs, rows, ids, f, F, kh, out_count, out_nbrs)
    if f > LOCAL_MAX:
        _sample_block_kernel[min(m, _MAX_BLOCKS), _THREADS, stream()](indptr, nbrs, rows, ids, f, F, kh, out_nbrs)
