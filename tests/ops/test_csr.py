"""``CSR`` construction helpers against brute force."""
import numpy as np
import pytest
import torch

from hpc_graph.ops.csr import CSR, column_slice_csr, dense_columns


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


@pytest.mark.parametrize("symmetric", [False, True])
def test_int32_indices_are_kept_and_the_derived_structures_follow(symmetric):
    """An int32 CSR (what the loaders build) keeps int32 columns; its transpose, self-loop copy and device copy
    hold the same structure as the int64 CSR's, in int32; other integer types become int64."""
    rng = np.random.default_rng(6)
    n = 25
    src, dst = rng.integers(0, n, 90), rng.integers(0, n, 90)
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        order = np.lexsort((src, dst))
        src, dst = src[order], dst[order]
    g64 = CSR.from_edges(src, dst, n)
    g32 = CSR(g64.indptr, g64.indices.to(torch.int32), n)
    assert g32.indices.dtype == torch.int32 and g32.is_symmetric() == symmetric
    assert CSR(g64.indptr, g64.indices.to(torch.int16), n).indices.dtype == torch.int64
    t64, t32 = g64.csc(), g32.csc()
    assert t32[1].dtype == torch.int32
    for a, b in zip(t64, t32):
        assert torch.equal(a, b.to(a.dtype))
    loops = g32.with_self_loops()
    assert loops.indices.dtype == torch.int32
    assert torch.equal(loops.indices.long(), g64.with_self_loops().indices)
    assert torch.equal(loops.indptr, g64.with_self_loops().indptr)
    moved = g32.to("cpu")
    assert moved.indices.dtype == torch.int32 and torch.equal(moved.csc()[1], t32[1])


def test_column_slices_are_right_whatever_order_they_are_made_in():
    """The slice structure is shared between calls (prefix views of the tallest slice so far): slices of
    growing and shrinking heights, of three column ranges (two of one width), each equal to the dense matrix
    it stands for."""
    gen = torch.Generator().manual_seed(3)
    made = []
    for rows, lo, w in [(5, 2, 3), (17, 2, 3), (4, 2, 3), (9, 0, 6), (8, 5, 3), (40, 2, 3), (1, 0, 6), (0, 2, 3)]:
        values = torch.randn(rows, w, generator=gen)
        x = column_slice_csr(values, lo, 10)
        made.append((x, values, lo, w))
    for x, values, lo, w in made:  # checked after all were made: a later, taller slice must not disturb them
        want = torch.zeros(values.shape[0], 10)
        want[:, lo:lo + w] = values
        torch.testing.assert_close(x.to_dense(), want, rtol=0, atol=0)
        assert dense_columns(x)[0] == lo and dense_columns(x)[1] is values
        assert x.col_indices().numel() == values.numel()
