"""``CSR`` construction helpers against brute force."""
import numpy as np

from hpc_graph.ops.csr import CSR


def test_permuted_renames_every_edge_and_sorts_rows():
    rng = np.random.default_rng(4)
    n = 30
    src, dst = rng.integers(0, n, 150), rng.integers(0, n, 150)
    g = CSR.from_edges(src, dst, n)
    order = rng.permutation(n)
    p = CSR.permuted(g.indptr.numpy(), g.indices.numpy(), order)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    got = sorted(zip(p.indices.tolist(), np.repeat(np.arange(n), np.diff(p.indptr.numpy())).tolist()))
    assert got == sorted(zip(pos[src].tolist(), pos[dst].tolist()))
    for r in range(n):
        row = p.indices[p.indptr[r]:p.indptr[r + 1]]
        assert bool((row[1:] >= row[:-1]).all())


def test_with_self_loops_appends_one_loop_per_row_and_is_cached():
    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 12, 40), rng.integers(0, 8, 40)
    g = CSR.from_edges(src, dst, 8, 12)  # a block: 8 destinations, the first 8 of 12 sources
    loops = g.with_self_loops()
    assert loops is g.with_self_loops() and loops.num_src == 12
    for r in range(8):
        row = loops.indices[loops.indptr[r]:loops.indptr[r + 1]].tolist()
        assert row[:-1] == g.indices[g.indptr[r]:g.indptr[r + 1]].tolist() and row[-1] == r
