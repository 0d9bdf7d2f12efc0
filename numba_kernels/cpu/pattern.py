"""The sparse attention pattern of a graph transformer as a CSR with hop codes (CPU only).

``attention_pattern(indptr, indices, order, global_token)`` builds, row by row in parallel,
each node's in-neighbours, itself, its neighbours in the sequence ``order`` and the global
token, with a code per entry: 0 self, 1 in-neighbour, 2 chain pair sharing a neighbour
(a merge of the two rows, O(d_a + d_b)), 3 other chain pair ("3 or more hops, or
unreachable"), 4 global token. Rows of the input must be ascending (``is_sorted_rows``).
Used by :mod:`hpc_graph.graph.attention_pattern`.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["attention_pattern", "graph_batch_pattern", "is_sorted_rows"]


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


@njit(cache=True, nogil=True)
def is_sorted_rows(indptr, indices) -> bool:
    """Whether every row of the CSR lists its columns in ascending order."""
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i] + 1, indptr[i + 1]):
            if indices[k - 1] > indices[k]:
                return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _extras(i, n, pos, order, chain, ex):
    """The self loop and (``chain``) the chain neighbours of node ``i``, ascending, deduplicated, into ``ex``;
    their count."""
    k = 0
    ex[k] = i
    k += 1
    t = pos[i]
    if chain and t > 0:
        ex[k] = order[t - 1]
        k += 1
    if chain and t + 1 < n:
        ex[k] = order[t + 1]
        k += 1
    for a in range(1, k):  # insertion sort of at most 3 values
        v = ex[a]
        b = a - 1
        while b >= 0 and ex[b] > v:
            ex[b + 1] = ex[b]
            b -= 1
        ex[b + 1] = v
    m = 0
    for a in range(k):
        if m == 0 or ex[m - 1] != ex[a]:
            ex[m] = ex[a]
            m += 1
    return m


@njit(cache=True, nogil=True, inline="always")
def _merge_row(indptr, indices, i, n, pos, order, glob, chain, ex, out_idx, out_code, start, write):
    """Merge row ``i``'s sorted neighbours with its extras; count (write False) or write entries and codes."""
    m = _extras(i, n, pos, order, chain, ex)
    a, b = indptr[i], indptr[i + 1]
    e = 0
    cnt = 0
    last = -1
    while a < b or e < m:
        from_row = e >= m or (a < b and indices[a] <= ex[e])
        v = indices[a] if from_row else ex[e]
        if from_row:
            a += 1
        else:
            e += 1
        if v == last:
            continue
        last = v
        if write:
            out_idx[start + cnt] = v
            if v == i:
                out_code[start + cnt] = 0
            elif _contains(indices, indptr[i], indptr[i + 1], v):
                out_code[start + cnt] = 1
            elif _share(indices, indptr[i], indptr[i + 1], indptr[v], indptr[v + 1]):
                out_code[start + cnt] = 2
            else:
                out_code[start + cnt] = 3
        cnt += 1
    if glob:
        if write:
            out_idx[start + cnt] = n
            out_code[start + cnt] = 4
        cnt += 1
    return cnt


@njit(parallel=True, cache=True, nogil=True)
def _pattern_counts(indptr, indices, pos, order, glob, chain, counts):
    n = indptr.shape[0] - 1
    dummy_i = np.empty(0, np.int64)
    dummy_c = np.empty(0, np.uint8)
    for i in prange(n):
        ex = np.empty(3, np.int64)
        counts[i] = _merge_row(indptr, indices, i, n, pos, order, glob, chain, ex, dummy_i, dummy_c, 0, False)
    if glob:
        counts[n] = n + 1


@njit(parallel=True, cache=True, nogil=True)
def _pattern_fill(indptr, indices, pos, order, glob, chain, rowptr, out_idx, out_code):
    n = indptr.shape[0] - 1
    for i in prange(n):
        ex = np.empty(3, np.int64)
        _merge_row(indptr, indices, i, n, pos, order, glob, chain, ex, out_idx, out_code, rowptr[i], True)
    if glob:
        s = rowptr[n]
        for j in range(n + 1):
            out_idx[s + j] = j
            out_code[s + j] = 4


def attention_pattern(indptr, indices, order, global_token: bool, chain: bool = True):
    """The sparse attention pattern as a CSR with one code per entry (see ``hpc_graph.graph.attention_pattern``).

    Row ``i < N``: its in-neighbours (``indices`` row ``i``, ascending), itself, its predecessor and
    successor in ``order`` (unless ``chain`` is False), and the global token ``N`` when ``global_token``;
    row ``N`` (global):
    every token. Entries ascending and unique. Codes: 0 self, 1 in-neighbour, 2 chain pair with a
    common neighbour, 3 other chain pair, 4 to or from the global token. Two passes (count,
    fill), nothing E-sized but the output.

    Returns:
        ``(rowptr int64[T+1], cols int64[E'], codes uint8[E'])`` with T = N (+1).
    """
    n = indptr.shape[0] - 1
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n, dtype=np.int64)
    t = n + int(bool(global_token))
    counts = np.zeros(t, np.int64)
    _pattern_counts(indptr, indices, pos, order, bool(global_token), bool(chain), counts)
    rowptr = np.zeros(t + 1, np.int64)
    np.cumsum(counts, out=rowptr[1:])
    cols = np.empty(int(rowptr[-1]), np.int64)
    codes = np.empty(int(rowptr[-1]), np.uint8)
    _pattern_fill(indptr, indices, pos, order, bool(global_token), bool(chain), rowptr, cols, codes)
    return rowptr, cols, codes


# ------------------------------------------------------------------------------------------------
# graph batches: many small graphs, exact shortest-path codes, one global token per graph
# ------------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _bfs(indptr, indices, i, p0, p1, dist, queue):
    """Hop distances ``dist[j - p0]`` from every node ``j`` of graph ``[p0, p1)`` to node ``i`` along the
    edges (BFS over in-neighbours); -1 where ``j`` cannot reach ``i``."""
    for j in range(p1 - p0):
        dist[j] = -1
    dist[i - p0] = 0
    queue[0] = i
    head, tail = 0, 1
    while head < tail:
        u = queue[head]
        head += 1
        du = dist[u - p0]
        for k in range(indptr[u], indptr[u + 1]):
            w = indices[k]
            if dist[w - p0] < 0:
                dist[w - p0] = du + 1
                queue[tail] = w
                tail += 1


@njit(cache=True, nogil=True, inline="always")
def _spd_code(d, max_dist):
    if d < 0:
        return max_dist + 3  # unreachable
    if d > max_dist:
        return max_dist + 1  # farther than max_dist
    return d


@njit(cache=True, nogil=True)
def _batch_row(indptr, indices, i, p0, p1, g, n, full, max_dist, dist, queue, out_idx, out_code, start, write):
    """Row of node ``i`` (graph ``g`` = nodes ``[p0, p1)``): every node of its graph (``full``) or its
    in-neighbours, itself and its chain neighbours ``i - 1``, ``i + 1`` inside the graph; then the
    graph's global token ``n + g``. Counts only unless ``write``."""
    if full:
        cnt = p1 - p0 + 1
        if write:
            _bfs(indptr, indices, i, p0, p1, dist, queue)
            for j in range(p0, p1):
                out_idx[start + j - p0] = j
                out_code[start + j - p0] = _spd_code(dist[j - p0], max_dist)
            out_idx[start + p1 - p0] = n + g
            out_code[start + p1 - p0] = max_dist + 2
        return cnt
    if write:
        _bfs(indptr, indices, i, p0, p1, dist, queue)
    # the extras (i - 1, i, i + 1 inside the graph) are ascending already
    lo_x = i - 1 if i - 1 >= p0 else i
    hi_x = i + 1 if i + 1 < p1 else i
    x = lo_x
    a, b = indptr[i], indptr[i + 1]
    cnt = 0
    last = -1
    while a < b or x <= hi_x:
        from_row = x > hi_x or (a < b and indices[a] <= x)
        v = indices[a] if from_row else x
        if from_row:
            a += 1
        else:
            x += 1
        if v == last:
            continue
        last = v
        if write:
            out_idx[start + cnt] = v
            out_code[start + cnt] = _spd_code(dist[v - p0], max_dist)
        cnt += 1
    if write:
        out_idx[start + cnt] = n + g
        out_code[start + cnt] = max_dist + 2
    return cnt + 1


@njit(parallel=True, cache=True, nogil=True)
def _batch_pass(indptr, indices, graph_ptr, node_graph, full, max_dist, rowptr, out_idx, out_code, counts, write):
    n = indptr.shape[0] - 1
    num_graphs = graph_ptr.shape[0] - 1
    for ii in prange(n):
        i = np.int64(ii)  # a signed index: i - 1 must stay an integer
        g = node_graph[i]
        p0, p1 = graph_ptr[g], graph_ptr[g + 1]
        dist = np.empty(p1 - p0, np.int64)
        queue = np.empty(p1 - p0, np.int64)
        start = rowptr[i] if write else 0
        counts[i] = _batch_row(indptr, indices, i, p0, p1, g, n, full, max_dist, dist, queue,
                               out_idx, out_code, start, write)
    for g in prange(num_graphs):  # global token rows: the graph's nodes and the token itself
        p0, p1 = graph_ptr[g], graph_ptr[g + 1]
        counts[n + g] = p1 - p0 + 1
        if write:
            s = rowptr[n + g]
            for j in range(p0, p1):
                out_idx[s + j - p0] = j
                out_code[s + j - p0] = max_dist + 2
            out_idx[s + p1 - p0] = n + g
            out_code[s + p1 - p0] = max_dist + 2


def graph_batch_pattern(indptr, indices, graph_ptr, full: bool, max_dist: int):
    """The attention pattern of a batch of graphs (node ids of graph ``g``: ``graph_ptr[g]:graph_ptr[g+1]``,
    no edge between two graphs), with one global token per graph (token ``N + g``).

    ``full``: every node attends to every node of its graph (dense attention inside each graph);
    otherwise to its in-neighbours, itself and its neighbours ``i - 1``, ``i + 1`` in the graph (the
    chain). Every node attends to its graph's token, the token to its graph's nodes and itself.
    Codes are exact shortest-path distances (BFS inside the graph along the edges): ``d`` for
    ``d <= max_dist``, ``max_dist + 1`` farther, ``max_dist + 2`` to or from a global token,
    ``max_dist + 3`` unreachable. Rows of the input must be ascending; entries come out ascending.

    Returns:
        ``(rowptr int64[N+G+1], cols int64[E'], codes uint8[E'])``.
    """
    if not 0 <= int(max_dist) <= 250:
        raise ValueError(f"graph_batch_pattern: max_dist must be in [0, 250], got {max_dist}")
    n = indptr.shape[0] - 1
    num_graphs = graph_ptr.shape[0] - 1
    node_graph = np.repeat(np.arange(num_graphs, dtype=np.int64), np.diff(graph_ptr))
    t = n + num_graphs
    counts = np.zeros(t, np.int64)
    rowptr = np.zeros(t + 1, np.int64)
    dummy_i, dummy_c = np.empty(0, np.int64), np.empty(0, np.uint8)
    _batch_pass(indptr, indices, graph_ptr, node_graph, bool(full), int(max_dist), rowptr, dummy_i, dummy_c,
                counts, False)
    np.cumsum(counts, out=rowptr[1:])
    cols = np.empty(int(rowptr[-1]), np.int64)
    codes = np.empty(int(rowptr[-1]), np.uint8)
    _batch_pass(indptr, indices, graph_ptr, node_graph, bool(full), int(max_dist), rowptr, cols, codes,
                counts, True)
    return rowptr, cols, codes
