"""Build the dataset's CSR over destinations from edge arrays (shared by every converter)."""
from __future__ import annotations

import numpy as np

_KEY_LIMIT = 3_037_000_499  # largest N with N*N < 2**63: (dst, src) fits one int64 key


def index_dtype(num_nodes: int) -> type:
    """int32 for ``/graph/indices`` when every id fits, else int64."""
    return np.int32 if num_nodes < 2**31 else np.int64


def unique_ids(*arrays: np.ndarray) -> np.ndarray:
    """Sorted distinct values of integer arrays (a sort, not NumPy's hash-based ``unique``: faster here)."""
    parts = [_sorted_unique(a) for a in arrays]
    return parts[0] if len(parts) == 1 else _sorted_unique(np.concatenate(parts))


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    a = np.sort(a)
    if len(a) < 2:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _compact(a: np.ndarray, keep: np.ndarray, block: int = 1 << 22) -> np.ndarray:
    """``a[keep]`` computed in place, block by block (no second full-size array); returns a view of ``a``."""
    w = 0
    for lo in range(0, len(a), block):
        sel = a[lo:lo + block][keep[lo:lo + block]]
        a[w:w + len(sel)] = sel  # w <= lo: never overwrites what is still to be read
        w += len(sel)
    return a[:w]


def build_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, weight: np.ndarray | None = None, *,
              symmetrize: bool = False, remove_self_loops: bool = False, dedup: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """CSR over destinations of the edges ``src[k] -> dst[k]``.

    Rows are sorted by source id; edges with equal ``(dst, src)`` keep their
    input order (the sort is stable), so ``dedup`` keeps the first occurrence
    (and its weight). With ``symmetrize`` every edge ``u -> v`` also gets
    ``v -> u``; the mirrored copies come after all given edges, so a given edge
    wins over a mirrored one on ``dedup``.

    Args:
        src, dst: integer ``[E]`` node ids in ``[0, num_nodes)`` (checked by the caller).
        num_nodes: N.
        weight: optional float ``[E]`` edge weights.

    Returns:
        ``indptr`` int64[N+1], ``indices`` int32/int64[E'] and ``weight`` float32[E'] or None.
    """
    n = int(num_nodes)
    if remove_self_loops:
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
            weight = None if weight is None else weight[keep]
    if symmetrize and weight is not None:
        weight = np.concatenate([weight, weight])
    if n <= _KEY_LIMIT:
        # one int64 key dst * n + src per edge, written in place (no concatenated id copies)
        m = len(src)
        key = np.empty(2 * m if symmetrize else m, dtype=np.int64)
        key[:m] = dst
        key[:m] *= n
        key[:m] += src
        if symmetrize:
            key[m:] = src
            key[m:] *= n
            key[m:] += dst
        del src, dst
        if weight is None:
            key.sort()  # equal keys are identical: stability does not matter
        else:
            order = np.argsort(key, kind="stable")
            key, weight = key[order], weight[order]
            del order
        if dedup and len(key):
            first = np.empty(len(key), dtype=bool)
            first[0] = True
            np.not_equal(key[1:], key[:-1], out=first[1:])
            key = _compact(key, first)
            weight = None if weight is None else _compact(weight, first)
            del first
        indptr = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
        np.remainder(key, n, out=key)
        indices = key.astype(index_dtype(n))
    else:  # too many nodes for a single int64 key
        if symmetrize:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        order = np.lexsort((src, dst))
        src, dst = src[order], dst[order]
        weight = None if weight is None else weight[order]
        if dedup and len(src):
            first = np.ones(len(src), dtype=bool)
            first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
            src, dst = src[first], dst[first]
            weight = None if weight is None else weight[first]
        indptr = np.searchsorted(dst, np.arange(n + 1, dtype=np.int64)).astype(np.int64)
        indices = src.astype(np.int64)
    return indptr, indices, None if weight is None else weight.astype(np.float32, copy=False)


def is_symmetric(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether the edge multiset equals its reverse (every ``j -> i`` has an ``i -> j``).

    Costs two int64 ``[E]`` arrays and one sort.
    """
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    if n > _KEY_LIMIT:
        src = indices.astype(np.int64)
        a = np.lexsort((src, dst))
        b = np.lexsort((dst, src))
        return bool(np.array_equal(src[a], dst[b]) and np.array_equal(dst[a], src[b]))
    rev = indices.astype(np.int64)
    rev *= n
    rev += dst  # key of the reversed edge
    fwd = dst
    fwd *= n
    fwd += indices  # key of the edge itself: sorted when every row is sorted by source
    if len(fwd) > 1 and not (fwd[1:] >= fwd[:-1]).all():
        fwd.sort()
    rev.sort()
    return bool(np.array_equal(fwd, rev))
