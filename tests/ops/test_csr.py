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
