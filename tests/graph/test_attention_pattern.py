"""``build_pattern``: the sparse attention pattern's entries and codes against a shortest-path reference."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from hpc_graph.graph.attention_pattern import FAR, GLOBAL, HOP1, HOP2, NUM_CODES, SELF, build_pattern


def _graph(seed: int, n: int = 30, m: int = 40):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])  # undirected
    keep = src != dst
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")  # rows not necessarily ascending within a row
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int64), n


@pytest.mark.parametrize("global_token", [True, False])
@pytest.mark.parametrize("shuffled", [False, True])
def test_pattern_has_self_loops_edges_chain_and_global_token(global_token, shuffled):
    indptr, indices, n = _graph(1)
    order = np.random.default_rng(2).permutation(n) if shuffled else None
    pat = build_pattern(indptr, indices, n, global_token=global_token, order=order)
    T = n + int(global_token)
    assert pat.num_tokens == T and pat.csr.num_dst == T == pat.csr.num_src
    dense = np.zeros((T, T), bool)
    rows = np.repeat(np.arange(T), np.diff(pat.csr.indptr.numpy()))
    dense[rows, pat.csr.indices.numpy()] = True
    assert pat.csr.num_edges == dense.sum()  # no duplicate entries
    for i in range(T):  # rows ascending
        row = pat.csr.indices[pat.csr.indptr[i]:pat.csr.indptr[i + 1]].numpy()
        assert np.all(np.diff(row) > 0)
    assert dense.diagonal().all()  # C1
    want = np.zeros((T, T), bool)
    want[np.arange(T), np.arange(T)] = True
    want[np.repeat(np.arange(n), np.diff(indptr)), indices] = True  # graph edges j -> i: row i lists j
    seq = np.arange(n) if order is None else order
    want[seq[1:], seq[:-1]] = want[seq[:-1], seq[1:]] = True  # C2: the chain, both directions
    if global_token:
        want[n, :] = want[:, n] = True
    np.testing.assert_array_equal(dense, want)


def test_codes_match_shortest_paths():
    indptr, indices, n = _graph(3, n=40, m=35)
    pat = build_pattern(indptr, indices, n, global_token=True, order=np.random.default_rng(4).permutation(n))
    adj = csr_matrix((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))
    spd = shortest_path(adj, unweighted=True, directed=True)  # adj[i, j] is edge j -> i: spd[i, j] = hops j -> i
    rows = np.repeat(np.arange(n + 1), np.diff(pat.csr.indptr.numpy()))
    cols = pat.csr.indices.numpy()
    codes = pat.codes.numpy()
    for r, c, code in zip(rows, cols, codes):
        if r == n or c == n:
            assert code == GLOBAL
        else:
            d = spd[r, c]
            assert code == (SELF if d == 0 else HOP1 if d == 1 else HOP2 if d == 2 else FAR), (r, c, d, code)
    assert len(pat.entries_per_code()) == NUM_CODES and sum(pat.entries_per_code()) == pat.csr.num_edges


def test_bad_inputs():
    indptr, indices, n = _graph(0)
    with pytest.raises(ValueError, match="permutation"):
        build_pattern(indptr, indices, n, order=np.zeros(n, np.int64))
    with pytest.raises(ValueError, match="indptr"):
        build_pattern(indptr[:-1], indices, n)
    bad = indices.copy()
    bad[0] = n
    with pytest.raises(ValueError, match="range"):
        build_pattern(indptr, bad, n)


@pytest.mark.parametrize("method", ["id", "rcm", "metis"])
def test_sequence_orders_are_permutations_that_keep_neighbours_close(method):
    from hpc_graph.graph.attention_pattern import sequence_order

    # two rings of 40 nodes, their ids interleaved: id order puts non-neighbours next to each other
    n = 80
    ring = np.arange(40)
    a, b = 2 * ring, 2 * ((ring + 1) % 40)
    src = np.concatenate([a, b, a + 1, b + 1])
    dst = np.concatenate([b, a, b + 1, a + 1])
    order_e = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    indices = src[order_e].astype(np.int64)
    order = sequence_order(indptr, indices, n, method, cluster_size=10)
    assert np.array_equal(np.sort(order), np.arange(n))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    gap = np.abs(pos[src] - pos[dst]).mean()  # mean sequence distance between neighbours
    if method == "id":
        assert gap >= 2
    else:
        assert gap < 0.25 * n / 2  # far below the interleaved ids' spread of the rings
    if method == "metis":  # clusters come one after the other: the ring each position belongs to changes rarely
        assert (np.diff(order % 2) != 0).sum() <= 3
    with pytest.raises(ValueError, match="sequence_order"):
        sequence_order(indptr, indices, n, "bfs")


def test_device_copies_of_a_pattern_are_the_pattern_where_it_lives():
    """``csr_on``/``codes_on`` (what the attention uses on a GPU, copied once there) hand back the pattern's own
    tensors on the device it was built on, and the codes of every distance cap."""
    import torch

    indptr = np.array([0, 1, 3, 3, 4], dtype=np.int64)
    indices = np.array([1, 0, 3, 2], dtype=np.int64)
    pat = build_pattern(indptr, indices, 4, global_token=True)
    assert pat.csr_on(torch.device("cpu")) is pat.csr
    for m in (1, 2, pat.max_dist):
        assert torch.equal(pat.codes_on(m, torch.device("cpu")), pat.codes_for(m))
