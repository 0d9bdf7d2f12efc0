"""Neighbour sampling for mini-batch training (CPU twin): ``sample_neighbors``, ``unique_relabel``.

Graph convention: a CSR over destinations; row ``i`` lists the in-neighbours
of node ``i`` in ``nbrs[indptr[i]:indptr[i+1]]``, sorted ascending by
neighbour id (the caller guarantees it), so the *position* ``p`` in
``[0, deg)`` of a neighbour in its row is canonical: it does not depend on how
the graph is stored or partitioned.

Sampling (row ``r`` of the frontier, node ``rows[r]``, counter id ``ids[r]``)
-----------------------------------------------------------------------------
``k = min(fanout, deg)`` (``deg`` for ``fanout == -1``) distinct positions are
drawn uniformly without replacement; the neighbours at those positions are
written in ascending position order (so each sample is sorted). The chosen
positions are a function of ``(key, ids[r], deg, fanout)`` only: never of the
thread count, the chunking, the place of ``r`` in ``rows``, the CSR row index,
the device or the rank. The CUDA twin picks the same positions.

Random stream of a row (the quant / attention-dropout hash)::

    splitmix64(x) = standard splitmix64 finaliser of x + 0x9E3779B97F4A7C15
                    (multipliers 0xBF58476D1CE4E5B9, 0x94D049BB133111EB; shifts 30, 27, 31)
    mix(state, v) = splitmix64(state ^ uint64(v))
    key_hash      = mix(0, key) = splitmix64(key mod 2**64)   (numba_kernels.cpu.quant.key_hash)
    h_t           = mix(mix(key_hash, id), t),   t = 0, 1, 2, ...  (all uint64)

Draw ``below(n)`` (uniform integer in ``[0, n)``), Lemire's multiply-shift
with rejection, *exactly* unbiased: take the next ``x = h_t``; form the
128-bit product ``x * n = hi * 2**64 + lo``; if ``lo < (2**64 - n) mod n``
reject ``x`` and take the next ``h_t``; otherwise return ``hi``. A rejection
has probability below ``n / 2**64`` (never in practice), so one hash per draw;
the modulo is only evaluated when ``lo < n``.

Selection, Floyd's algorithm (``s`` draws, ``O(s)`` hashes)::

    complement = 2 * k > deg;   s = deg - k if complement else k
    S = {}
    for j in deg - s, ..., deg - 1:
        v = below(j + 1)
        S.add(j if v in S else v)

``S`` is a uniform ``s``-subset of ``[0, deg)``. Without ``complement`` the
sample is ``S``; with it (more than half the row is kept) the sample is
``[0, deg) \\ S``. ``s == 0`` (``fanout == -1`` or ``fanout >= deg``) takes
the whole row and hashes nothing.

Cost per row: ``s`` hashes and draws; for ``s <=`` :data:`SCAN_MAX` (256)
membership by scanning the selection so far and the order by counting ranks
(``s**2`` branch-free, vectorised comparisons: faster than sorted insertion or
hashing at these sizes), beyond that an open-addressing hash set (expected
``O(1)`` per draw) and one sort, ``O(s log s)``; plus ``O(k)`` to write the
sample (``O(deg) < O(2k)`` in the complement case). Never ``O(deg)`` for a
hub row with a small ``k``. Scratch: ``O(max s)`` per chunk.

Threads: parallel over contiguous chunks of frontier rows balanced by
``k + 1`` (the work), not by degree. Calls with less than
:data:`~numba_kernels.cpu._attention_common.SMALL_WORK` total work run a serial
copy of the kernel (no thread pool wake-up); the thread count is never changed.

``unique_relabel`` builds a block's source list and column indices; it is
serial (one pass, ``O(nd + c)``, an open-addressing table sized by the call,
nothing proportional to the graph). On a GPU the caller uses
``torch.unique`` instead (no CUDA twin).
"""
from __future__ import annotations

import operator

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import SMALL_WORK
from numba_kernels.cpu._hash import _mix, _splitmix64
from numba_kernels.cpu.quant import key_hash

__all__ = ["sample_width", "sample_neighbors", "unique_relabel", "key_hash", "SCAN_MAX"]

_PAR = dict(parallel=True, cache=True, nogil=True)
_SER = dict(cache=True, nogil=True)
#: parallel chunks per thread (static scheduling still balances)
_CHUNKS_PER_THREAD = 8
#: Floyd selections up to this size scan a small array; larger ones use a hash set and a sort
SCAN_MAX = 256

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U32 = np.uint64(32)
_U64 = np.uint64(64)
_LO32 = np.uint64(0xFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# ---------------------------------------------------------------------------
# the draw


@njit(cache=True, inline="always")
def _mul128(x, n):
    """``(hi, lo)``: the 128-bit product ``x * n`` of two uint64 (schoolbook on 32-bit halves)."""
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


@njit(cache=True, inline="always")
def _below(rh, t, n):
    """Uniform int in ``[0, n)`` from the stream ``mix(rh, t), mix(rh, t+1), ...``: ``(value, next t)``."""
    un = np.uint64(n)
    hi, lo = _mul128(_mix(rh, t), un)
    t += 1
    if lo < un:  # maybe in the biased sliver: the exact threshold (2**64 - n) mod n
        thr = (_U0 - un) % un
        while lo < thr:
            hi, lo = _mul128(_mix(rh, t), un)
            t += 1
    return np.int64(hi), t


# ---------------------------------------------------------------------------
# Floyd's selection


@njit(cache=True, inline="always")
def _floyd_scan(rh, deg, s, sel, tmp):
    """Floyd's ``s``-subset of ``[0, deg)`` into ``sel[:s]``, sorted; ``tmp`` int64[>= s] scratch.

    Membership by a full scan of the elements so far and the final order by
    counting ranks: ``O(s**2)`` comparisons, but branch-free and vectorised,
    faster than sorted insertion or hashing up to :data:`SCAN_MAX`.
    """
    t = 0
    n = 0
    for j in range(deg - s, deg):
        v, t = _below(rh, t, j + 1)
        found = False
        for q in range(n):
            found |= tmp[q] == v
        tmp[n] = j if found else v  # j exceeds every element so far
        n += 1
    for i in range(s):
        x = tmp[i]
        rank = 0
        for q in range(s):
            rank += tmp[q] < x
        sel[rank] = x


@njit(cache=True, inline="always")
def _floyd_hashed(rh, deg, s, sel, table):
    """Floyd's ``s``-subset of ``[0, deg)`` into ``sel[:s]`` (sorted at the end) with a hash set.

    ``table`` int64 scratch of at least ``2 * s`` entries (a power of two is used).
    """
    size = 1
    bits = 0
    while size < 2 * s:
        size <<= 1
        bits += 1
    shift = np.uint64(64 - bits)
    mask = size - 1
    table[:size] = -1
    t = 0
    for i in range(s):
        j = deg - s + i
        v, t = _below(rh, t, j + 1)
        slot = np.int64((np.uint64(v) * _GOLDEN) >> shift) if bits else 0
        while table[slot] >= 0 and table[slot] != v:
            slot = (slot + 1) & mask
        if table[slot] == v:  # taken: insert j instead (never present, j exceeds every element)
            v = j
            slot = np.int64((np.uint64(v) * _GOLDEN) >> shift) if bits else 0
            while table[slot] >= 0:
                slot = (slot + 1) & mask
        table[slot] = v
        sel[i] = v
    sel[:s].sort()


@njit(**_SER)
def _sample_rows(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs, r0, r1, sel, tmp, table):
    for r in range(r0, r1):
        node = rows[r]
        start = indptr[node]
        deg = indptr[node + 1] - start
        k = deg if (fanout < 0 or fanout >= deg) else fanout
        base = r * F
        complement = 2 * k > deg
        s = deg - k if complement else k
        if s == 0:
            for p in range(deg):
                out_nbrs[base + p] = nbrs[start + p]
            continue
        rh = _mix(kh, ids[r])
        if s <= SCAN_MAX:
            _floyd_scan(rh, deg, s, sel, tmp)
        else:
            _floyd_hashed(rh, deg, s, sel, table)
        if complement:  # every position but the s excluded ones (deg < 2k)
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


@njit(**_SER)
def _prepare(indptr, rows, fanout, out_count, cost):
    """``out_count[r] = k``, ``cost`` int64[m+1] prefix sums of ``k + 1``; returns ``(max k, max s)``."""
    m = rows.shape[0]
    kmax = 0
    smax = 0
    cost[0] = 0
    for r in range(m):
        node = rows[r]
        deg = indptr[node + 1] - indptr[node]
        k = deg if (fanout < 0 or fanout >= deg) else fanout
        s = deg - k if 2 * k > deg else k
        out_count[r] = k
        cost[r + 1] = cost[r] + k + 1
        if k > kmax:
            kmax = k
        if s > smax:
            smax = s
    return kmax, smax


def _table_size(smax: int) -> int:
    """Hash-set scratch entries for selections of up to ``smax`` (1 when the sorted path covers them)."""
    tsize = 1
    if smax > SCAN_MAX:
        while tsize < 2 * smax:
            tsize <<= 1
    return tsize


@njit(**_SER)
def _sample_ser(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs, smax, tsize):
    sel = np.empty(max(smax, 1), np.int64)
    tmp = np.empty(max(smax, 1), np.int64)
    table = np.empty(tsize, np.int64)
    _sample_rows(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs, np.int64(0), rows.shape[0], sel, tmp, table)


@njit(**_PAR)
def _sample_par(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs, smax, tsize, cost, nchunks):
    m = rows.shape[0]
    total = cost[m]
    for c in prange(nchunks):
        # chunk c: rows whose work prefix starts in [total*c/nchunks, total*(c+1)/nchunks)
        lo_t = total * c // nchunks
        hi_t = total * (c + 1) // nchunks
        r0 = np.searchsorted(cost[:m], lo_t)
        r1 = np.searchsorted(cost[:m], hi_t) if c + 1 < nchunks else m
        if r1 > r0:
            sel = np.empty(max(smax, 1), np.int64)
            tmp = np.empty(max(smax, 1), np.int64)
            table = np.empty(tsize, np.int64)
            _sample_rows(indptr, nbrs, rows, ids, fanout, F, kh, out_nbrs, r0, r1, sel, tmp, table)


def _as_fanout(fanout) -> int:
    try:
        f = operator.index(fanout)
    except TypeError:
        raise ValueError(f"fanout must be an integer >= 1 or -1, got {fanout!r}") from None
    if f == 0 or f < -1:
        raise ValueError(f"fanout must be >= 1 or -1 (all neighbours), got {f}")
    return f


def sample_width(indptr, rows, fanout) -> int:
    """Slot width ``F`` of each frontier row in ``out_nbrs`` (pure Python/NumPy, host arrays).

    ``F = fanout`` for ``fanout >= 1``; for ``fanout == -1`` the largest degree
    among ``rows`` (0 when ``rows`` is empty or every row is empty).
    Allocate ``out_nbrs = np.empty(len(rows) * F, np.int64)``.
    """
    f = _as_fanout(fanout)
    if f > 0:
        return f
    indptr = np.asarray(indptr)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.shape[0] == 0:
        return 0
    return int((indptr[rows + 1] - indptr[rows]).max())


def _check_1d(name, a, n=None):
    if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != np.int64:
        raise ValueError(f"{name} must be a 1-D int64 NumPy array")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {n}")


def sample_neighbors(indptr, nbrs, rows, ids, fanout, key, out_count, out_nbrs) -> None:
    """Sample up to ``fanout`` in-neighbours of each frontier row, uniformly without replacement.

    Args:
        indptr: int64[N+1] CSR row pointers over destinations.
        nbrs: int64[E] in-neighbour ids, each row sorted ascending (trusted).
        rows: int64[m] CSR rows to sample (trusted in ``[0, N)``; may repeat).
        ids: int64[m] counter id of each frontier row (its global node id, >= 0).
        fanout: ``>= 1``, or ``-1`` for all neighbours.
        key: uint64 (np.uint64 or int, taken modulo 2**64) stream key; the
            caller derives it from (seed, epoch, layer).
        out_count: int64[m] output, ``out_count[r] = min(fanout, deg)`` (``deg`` for -1).
        out_nbrs: int64[m * F] output with ``F =`` :func:`sample_width` ``(indptr, rows, fanout)``
            (``fanout``, or the largest degree among ``rows`` for -1). Row ``r``'s
            sample is ``out_nbrs[r*F : r*F + out_count[r]]``, neighbour values in
            ascending position order; the rest of each slot is left untouched.

    The chosen positions depend only on ``(key, ids[r], deg, fanout)`` (module
    docstring: stream, unbiased draw, Floyd's selection). Parallel over chunks
    of rows balanced by ``k``; small calls run serially.

    Raises:
        ValueError: ``fanout`` is 0, below -1 or not an integer; an array is not
            1-D int64 or has the wrong length.
    """
    f = _as_fanout(fanout)
    for name, a in (("indptr", indptr), ("nbrs", nbrs), ("rows", rows)):
        _check_1d(name, a)
    m = rows.shape[0]
    if indptr.shape[0] < 1:
        raise ValueError("indptr needs at least one entry")
    _check_1d("ids", ids, m)
    _check_1d("out_count", out_count, m)
    _check_1d("out_nbrs", out_nbrs)
    cost = np.empty(m + 1, np.int64)
    kmax, smax = _prepare(indptr, rows, f, out_count, cost)
    F = f if f > 0 else int(kmax)
    if out_nbrs.shape[0] != m * F:
        raise ValueError(f"out_nbrs has {out_nbrs.shape[0]} entries, expected len(rows) * F = {m} * {F} "
                         f"(F = sample_width(indptr, rows, fanout={f}))")
    if m == 0:
        return
    kh = key_hash(key)
    tsize = _table_size(int(smax))
    total = int(cost[m])
    if total < SMALL_WORK:
        _sample_ser(indptr, nbrs, rows, ids, f, F, kh, out_nbrs, smax, tsize)
    else:
        nchunks = max(1, min(m, _CHUNKS_PER_THREAD * numba.get_num_threads()))
        _sample_par(indptr, nbrs, rows, ids, f, F, kh, out_nbrs, smax, tsize, cost, nchunks)


# ---------------------------------------------------------------------------
# unique_relabel


@njit(**_SER)
def _relabel(dst, cand, out_src, out_col):
    nd = dst.shape[0]
    c = cand.shape[0]
    size = 1
    bits = 0
    while size < 2 * (nd + c):
        size <<= 1
        bits += 1
    shift = np.uint64(64 - bits)
    mask = size - 1
    keys = np.full(size, -1, np.int64)
    vals = np.empty(size, np.int64)
    n = 0
    for i in range(nd):
        v = dst[i]
        if v < 0:
            return -2
        slot = np.int64(_splitmix64(np.uint64(v)) >> shift) if bits else 0
        while keys[slot] >= 0 and keys[slot] != v:
            slot = (slot + 1) & mask
        if keys[slot] == v:
            return -1  # dst not distinct
        keys[slot] = v
        vals[slot] = n
        out_src[n] = v
        n += 1
    for i in range(c):
        v = cand[i]
        if v < 0:
            return -2
        slot = np.int64(_splitmix64(np.uint64(v)) >> shift) if bits else 0
        while keys[slot] >= 0 and keys[slot] != v:
            slot = (slot + 1) & mask
        if keys[slot] < 0:
            keys[slot] = v
            vals[slot] = n
            out_src[n] = v
            n += 1
        out_col[i] = vals[slot]
    return n


def unique_relabel(dst, cand, out_src, out_col) -> int:
    """Source nodes of a sampled block and the column of every sampled edge.

    Args:
        dst: int64[nd] the block's destination node ids (distinct, >= 0).
        cand: int64[c] sampled neighbour ids (>= 0; duplicates allowed, may hold ``dst`` ids).
        out_src: int64[>= nd + c] output: ``out_src[:num_src]`` = ``dst`` in order,
            then each value of ``cand`` not seen before, in order of first appearance.
            Entries past ``num_src`` are left untouched.
        out_col: int64[c] output: ``out_src[out_col[i]] == cand[i]``.
    Returns:
        ``num_src``.

    Serial, ``O(nd + c)`` expected time with an open-addressing table of
    ``~2-4 (nd + c)`` slots (ids may be as large as int64 allows; nothing
    proportional to the graph is allocated). CPU only: on a GPU the caller
    uses ``torch.unique`` (there is no CUDA twin).

    Raises:
        ValueError: wrong dtype/length, ``dst`` not distinct, or a negative id.
    """
    _check_1d("dst", dst)
    _check_1d("cand", cand)
    _check_1d("out_col", out_col, cand.shape[0])
    _check_1d("out_src", out_src)
    if out_src.shape[0] < dst.shape[0] + cand.shape[0]:
        raise ValueError(f"out_src has {out_src.shape[0]} entries, needs len(dst) + len(cand) = "
                         f"{dst.shape[0] + cand.shape[0]}")
    n = int(_relabel(dst, cand, out_src, out_col))
    if n == -1:
        raise ValueError("dst ids must be distinct")
    if n == -2:
        raise ValueError("node ids must be >= 0")
    return n
