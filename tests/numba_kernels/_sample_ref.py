"""Plain Python/NumPy reference for the ``sample`` kernels (numba_kernels/{cpu,cuda}/sample.py).

Written independently of the kernels: Python integers for the hash and the
128-bit product, a Python ``set`` for Floyd's algorithm, ``np.unique`` for the
relabelling. Also builds test graphs (rows sorted ascending, strictly, so
sampled values are distinct exactly when positions are).
"""
from __future__ import annotations

import numpy as np

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class Stream:
    """The hashes ``h_t = mix(rh, t)``, t = 0, 1, ... of a row with ``rh = mix(mix(0, key), id)``."""

    def __init__(self, rh: int):
        self.rh = rh
        self.t = 0  # hashes consumed so far

    def __next__(self) -> int:
        h = splitmix64(self.rh ^ self.t)
        self.t += 1
        return h


def stream(key, node_id) -> Stream:
    return stream_from(splitmix64(splitmix64(int(key) & MASK) ^ int(node_id)))


def stream_from(rh: int) -> Stream:
    return Stream(int(rh))


def consumed(hashes: Stream) -> int:
    return hashes.t


def below(hashes: Stream, n: int) -> int:
    """Lemire's unbiased draw in ``[0, n)`` with exact Python integers."""
    thr = (2**64 - n) % n
    while True:
        prod = next(hashes) * n
        if prod & MASK >= thr:
            return prod >> 64


def positions(key, node_id, deg: int, fanout: int) -> list[int]:
    """Sorted sampled positions of a row of degree ``deg``."""
    k = deg if fanout < 0 or fanout >= deg else fanout
    complement = 2 * k > deg
    s = deg - k if complement else k
    hashes = stream(key, node_id)
    chosen: set[int] = set()
    for j in range(deg - s, deg):
        v = below(hashes, j + 1)
        chosen.add(j if v in chosen else v)
    if complement:
        return [p for p in range(deg) if p not in chosen]
    return sorted(chosen)


def width(indptr, rows, fanout) -> int:
    if fanout > 0:
        return fanout
    return int(max((indptr[r + 1] - indptr[r] for r in rows), default=0))


def sample(indptr, nbrs, rows, ids, fanout, key, fill=-7):
    """``(count int64[m], out int64[m*F])`` with untouched slot tails set to ``fill``."""
    m = len(rows)
    F = width(indptr, rows, fanout)
    count = np.zeros(m, np.int64)
    out = np.full(m * F, fill, np.int64)
    for r in range(m):
        lo, hi = int(indptr[rows[r]]), int(indptr[rows[r] + 1])
        pos = positions(key, ids[r], hi - lo, fanout)
        count[r] = len(pos)
        out[r * F:r * F + len(pos)] = nbrs[lo + np.asarray(pos, dtype=np.int64)]
    return count, out


def relabel(dst, cand):
    """``(src, col)``: dst, then new cand values by first appearance; ``src[col] == cand``."""
    dst = np.asarray(dst, np.int64)
    cand = np.asarray(cand, np.int64)
    new = cand[~np.isin(cand, dst)]
    uniq, first = np.unique(new, return_index=True)
    src = np.concatenate([dst, new[np.sort(first)]])
    order = np.argsort(src, kind="stable")
    col = order[np.searchsorted(src[order], cand)]
    return src, col.astype(np.int64)


def powerlaw_graph(rng, n: int, avg: float = 8.0, alpha: float = 2.1, empty: float = 0.1,
                   id_offset: int = 0):
    """CSR ``(indptr, nbrs)`` with Pareto degrees (some 0), strictly ascending rows of ids ``< n + id_offset``."""
    deg = np.minimum(np.floor(rng.pareto(alpha - 1, n) * avg * (alpha - 2) / (alpha - 1) + 1), n).astype(np.int64)
    deg[rng.random(n) < empty] = 0
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    nbrs = np.empty(indptr[-1], np.int64)
    for i in range(n):
        d = deg[i]
        if d:
            nbrs[indptr[i]:indptr[i + 1]] = np.sort(rng.choice(n, d, replace=False)) + id_offset
    return indptr, nbrs
