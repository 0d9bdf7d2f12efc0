"""``build_graph_batch_pattern`` (graph-level tasks) and the bias-code layouts, against scipy shortest paths."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from hpc_graph.graph.attention_pattern import (FAR, GLOBAL, build_graph_batch_pattern, build_pattern, far_code,
                                               global_code, num_codes, unreachable_code)


def _batch(seed: int, sizes=(5, 1, 9, 7), directed=False, p=0.25):
    """Random small graphs (some disconnected, one of a single node) as one block-diagonal CSR."""
    rng = np.random.default_rng(seed)
    ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    src, dst = [], []
    for g, n in enumerate(sizes):
        a = rng.random((n, n)) < p
        np.fill_diagonal(a, False)
        if not directed:
            a = a | a.T
        s, d = np.nonzero(a)
        src.append(s + ptr[g])
        dst.append(d + ptr[g])
    src, dst = np.concatenate(src), np.concatenate(dst)
    order = rng.permutation(src.shape[0])  # rows not sorted: the builder sorts them
    src, dst = src[order], dst[order]
    order = np.argsort(dst, kind="stable")
    n = int(ptr[-1])
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int64), ptr


def _reference(indptr, indices, ptr, full, max_dist):
    """Dense (T x T) expected pattern and codes (-1 outside)."""
    n, G = int(ptr[-1]), ptr.shape[0] - 1
    T = n + G
    adj = csr_matrix((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))
    spd = shortest_path(adj, unweighted=True, directed=True)  # adj[i, j] is edge j -> i: spd[i, j] = hops j -> i
    codes = np.full((T, T), -1)
    graph_of = np.repeat(np.arange(G), np.diff(ptr))
    for i in range(n):
        g = graph_of[i]
        lo, hi = ptr[g], ptr[g + 1]
        if full:
            cols = set(range(lo, hi))
        else:
            cols = {i} | set(indices[indptr[i]:indptr[i + 1]].tolist())
            cols |= {j for j in (i - 1, i + 1) if lo <= j < hi}
        for j in cols:
            d = spd[i, j]
            codes[i, j] = (unreachable_code(max_dist) if np.isinf(d) else far_code(max_dist) if d > max_dist
                           else int(d))
        codes[i, n + g] = codes[n + g, i] = global_code(max_dist)
    for g in range(G):
        codes[n + g, n + g] = global_code(max_dist)
    return codes


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("max_dist", [1, 3])
def test_graph_batch_pattern_matches_shortest_paths(full, directed, max_dist):
    indptr, indices, ptr = _batch(7 + max_dist, directed=directed)
    pat = build_graph_batch_pattern(indptr, indices, ptr, full=full, max_dist=max_dist)
    n, G = int(ptr[-1]), ptr.shape[0] - 1
    T = n + G
    assert pat.num_tokens == T and pat.num_graphs == G and pat.max_dist == max_dist
    got = np.full((T, T), -1)
    rows = np.repeat(np.arange(T), np.diff(pat.csr.indptr.numpy()))
    cols = pat.csr.indices.numpy()
    for i in range(T):
        assert np.all(np.diff(cols[int(pat.csr.indptr[i]):int(pat.csr.indptr[i + 1])]) > 0)  # ascending, unique
    got[rows, cols] = pat.codes.numpy()
    np.testing.assert_array_equal(got, _reference(indptr, indices, ptr, full, max_dist))
    assert sum(pat.entries_per_code()) == pat.csr.num_edges and len(pat.entries_per_code()) == num_codes(max_dist)


def test_unreachable_bucket_separates_two_components():
    # two triangles in one graph vs one 6-cycle: only the first has unreachable pairs
    tri = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)]
    cyc = [(6 + a, 6 + (a + 1) % 6) for a in range(6)]
    e = np.array(tri + cyc)
    src, dst = np.concatenate([e[:, 0], e[:, 1]]), np.concatenate([e[:, 1], e[:, 0]])
    order = np.lexsort((src, dst))
    indptr = np.zeros(13, np.int64)
    np.cumsum(np.bincount(dst, minlength=12), out=indptr[1:])
    pat = build_graph_batch_pattern(indptr, src[order], np.array([0, 6, 12]), full=True, max_dist=4)
    rows = np.repeat(np.arange(14), np.diff(pat.csr.indptr.numpy()))
    unreachable = pat.codes.numpy() == unreachable_code(4)
    assert set(rows[unreachable].tolist()) == set(range(6))  # only graph 0's nodes, 3 each
    assert unreachable.sum() == 18


def test_codes_for_remaps_a_graph_pattern_to_another_table():
    indptr, indices, ptr = _batch(3, sizes=(30,), p=0.08)
    pat = build_pattern(indptr, indices, 30, global_token=True)
    base = pat.codes.numpy()
    for m in (1, 2, 5):
        got = pat.codes_for(m).numpy()
        want = base.copy()
        want[base == FAR] = far_code(m)
        want[base == GLOBAL] = global_code(m)
        if m < 2:
            want[base == 2] = far_code(m)
        np.testing.assert_array_equal(got, want)
    assert pat.codes_for(2) is pat.codes


def test_bad_graph_batches():
    indptr, indices, ptr = _batch(0)
    with pytest.raises(ValueError, match="joins two graphs"):
        build_graph_batch_pattern(indptr, indices, np.array([0, 3, ptr[-1]]), full=True, max_dist=2)
    with pytest.raises(ValueError, match="empty"):
        build_graph_batch_pattern(indptr, indices, np.array([0, 5, 5, ptr[-1]]), full=True, max_dist=2)
    with pytest.raises(ValueError, match="offsets"):
        build_graph_batch_pattern(indptr, indices, np.array([0, 5]), full=True, max_dist=2)
    with pytest.raises(ValueError, match="max_dist"):
        build_graph_batch_pattern(indptr, indices, ptr, full=True, max_dist=251)
