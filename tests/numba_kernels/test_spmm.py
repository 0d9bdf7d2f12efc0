"""CPU SpMM kernels (sum / mean / max and backward) against plain NumPy references."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from numba_kernels import get_kernel
from numba_kernels.cpu import spmm as K
from numba_kernels.cpu._partition import row_chunks
from numba_kernels.cpu._transpose import csr_transpose

DTYPES = [np.float32, np.float64]


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


def _dst_of(indptr):
    return np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))


def _case(awkward_graph, seed, dtype, heads=1, dim=5, weighted=False, w_heads=1, num_src=None):
    indptr, indices = awkward_graph(seed, num_dst=23, num_src=num_src, num_edges=150)
    ns = 23 if num_src is None else num_src
    rng = np.random.default_rng(seed + 100)
    x = rng.standard_normal((ns, heads, dim)).astype(dtype)
    E = indices.shape[0]
    w = rng.uniform(0.1, 2.0, (E, w_heads)).astype(dtype) if weighted else np.empty((0, 1), dtype)
    return indptr, indices, x, w


def _ref_messages(indptr, indices, x, w):
    msg = x[indices].astype(np.float64)
    if w.shape[0]:
        msg = msg * w.astype(np.float64)[:, :, None]
    return msg


def _empty(dtype):
    return np.empty(0, np.int64), np.empty(0, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted,heads,w_heads", [(False, 1, 1), (True, 1, 1), (True, 3, 3), (True, 3, 1)])
@pytest.mark.parametrize("mean", [False, True])
def test_spmm_sum_matches_numpy(awkward_graph, dtype, weighted, heads, w_heads, mean):
    indptr, indices, x, w = _case(awkward_graph, 1, dtype, heads, 6, weighted, w_heads, num_src=31)
    no_e, no_s = _empty(dtype)
    out = np.full((23, heads, 6), np.nan, dtype)
    K.spmm_sum(indptr, indices, no_e, w, no_s, x, out, mean)
    dst = _dst_of(indptr)
    ref = np.zeros(out.shape)
    np.add.at(ref, dst, _ref_messages(indptr, indices, x, w))
    if mean:
        deg = np.diff(indptr).astype(np.float64)
        ref /= np.maximum(deg, 1)[:, None, None]
    assert np.diff(indptr).min() == 0  # the graph has empty rows: they must come out 0
    np.testing.assert_allclose(out, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_spmm_sum_eids_and_col_scale(awkward_graph, dtype):
    """The backward form: transposed graph, weights by edge id, a per-source-row scale."""
    indptr, indices, x, w = _case(awkward_graph, 2, dtype, 2, 4, True, 2)
    rng = np.random.default_rng(7)
    g = rng.standard_normal((23, 2, 4)).astype(dtype)  # gradient w.r.t. the forward output
    scale = rng.uniform(0.5, 1.5, 23).astype(dtype)
    indptr_t, indices_t, perm = csr_transpose(indptr, indices, 23, True)
    grad_x = np.empty((23, 2, 4), dtype)
    K.spmm_sum(indptr_t, indices_t, perm, w, scale, g, grad_x, False)
    dst = _dst_of(indptr)
    ref = np.zeros(grad_x.shape)
    np.add.at(ref, indices, (w[:, :, None] * scale[dst][:, None, None] * g[dst]).astype(np.float64))
    np.testing.assert_allclose(grad_x, ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted,heads,w_heads", [(False, 1, 1), (True, 2, 2), (True, 2, 1)])
def test_spmm_max_forward_backward(awkward_graph, dtype, weighted, heads, w_heads):
    indptr, indices, x, w = _case(awkward_graph, 3, dtype, heads, 7, weighted, w_heads, num_src=29)
    no_e, _ = _empty(dtype)
    out = np.full((23, heads, 7), np.nan, dtype)
    argmax = np.full(out.shape, -7, np.int64)
    K.spmm_max(indptr, indices, no_e, w, x, out, argmax)

    msg = _ref_messages(indptr, indices, x, w)
    dst = _dst_of(indptr)
    ref = np.full(out.shape, -np.inf)
    np.maximum.at(ref, dst, msg)
    empty = np.diff(indptr) == 0
    ref[empty] = 0
    np.testing.assert_allclose(out, ref, **_tol(dtype))
    assert (argmax[empty] == -1).all()
    # argmax: an edge of the row whose message equals the max, and the first such edge
    rows, hs, ds = np.nonzero(~empty[:, None, None] & np.ones(out.shape, bool))
    e = argmax[rows, hs, ds]
    assert (dst[e] == rows).all()
    np.testing.assert_allclose(msg[e, hs, ds], ref[rows, hs, ds], **_tol(dtype))

    # backward w.r.t. x through the transposed graph
    rng = np.random.default_rng(11)
    g = rng.standard_normal(out.shape).astype(dtype)
    indptr_t, indices_t, perm = csr_transpose(indptr, indices, 29, True)
    grad_x = np.full((29, heads, 7), np.nan, dtype)
    K.spmm_max_backward(indptr_t, indices_t, perm, w, argmax, g, grad_x)
    ref_gx = np.zeros(grad_x.shape)
    wv = w.astype(np.float64) if weighted else np.ones((indices.shape[0], 1))
    ok = argmax >= 0
    r, h_, d_ = np.nonzero(ok)
    ee = argmax[r, h_, d_]
    np.add.at(ref_gx, (indices[ee], h_, d_), wv[ee, h_ if wv.shape[1] > 1 else 0] * g[r, h_, d_])
    np.testing.assert_allclose(grad_x, ref_gx, **_tol(dtype))

    if weighted:  # gradient w.r.t. the edge weights
        grad_w = np.full(w.shape, np.nan, dtype)
        K.spmm_max_weight_grad(indptr, indices, argmax, x, g, grad_w)
        ref_gw = np.zeros(w.shape)
        np.add.at(ref_gw, (ee, h_ if w.shape[1] > 1 else 0), g[r, h_, d_] * x[indices[ee], h_, d_])
        np.testing.assert_allclose(grad_w, ref_gw, **_tol(dtype))


def test_spmm_max_ties_go_to_first_edge():
    indptr = np.array([0, 3], np.int64)
    indices = np.array([1, 0, 1], np.int64)  # duplicate edge 1->0 at positions 0 and 2
    x = np.array([[[1.0]], [[5.0]]], np.float32)
    out = np.empty((1, 1, 1), np.float32)
    argmax = np.empty((1, 1, 1), np.int64)
    K.spmm_max(indptr, indices, np.empty(0, np.int64), np.empty((0, 1), np.float32), x, out, argmax)
    assert out[0, 0, 0] == 5.0 and argmax[0, 0, 0] == 0


def test_results_do_not_depend_on_thread_count(awkward_graph):
    indptr, indices, x, w = _case(awkward_graph, 4, np.float32, 1, 9, True, 1)
    no_e, no_s = _empty(np.float32)
    outs = []
    before = numba.get_num_threads()
    try:
        for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(t)
            out = np.empty((23, 1, 9), np.float32)
            K.spmm_sum(indptr, indices, no_e, w, no_s, x, out, True)
            outs.append(out)
    finally:
        numba.set_num_threads(before)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])  # each row is summed by one thread, in row order


def test_row_chunks_balance_by_work():
    rng = np.random.default_rng(0)
    deg = rng.zipf(1.8, 5000).clip(max=4000)
    deg[:100] = 0
    indptr = np.zeros(deg.shape[0] + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    bounds = row_chunks(indptr, 16)
    assert bounds[0] == 0 and bounds[-1] == deg.shape[0]
    assert (np.diff(bounds) > 0).all()
    cost = np.array([indptr[b] - indptr[a] + (b - a) for a, b in zip(bounds[:-1], bounds[1:])])
    # every chunk stays within one target share plus the largest single row
    share = (indptr[-1] + deg.shape[0]) / 16
    assert cost.max() <= share + deg.max() + 1
    naive = np.array_split(np.arange(deg.shape[0]), 16)
    naive_cost = max(deg[p].sum() + p.shape[0] for p in naive)
    assert cost.max() < naive_cost
    # degenerate inputs
    assert row_chunks(np.zeros(1, np.int64), 8).tolist() == [0, 0]
    assert row_chunks(np.array([0, 5, 5, 5], np.int64), 8).tolist()[-1] == 3


def test_transpose_matches_stable_argsort(awkward_graph):
    indptr, indices = awkward_graph(5, num_dst=30, num_src=17, num_edges=200)
    indptr_t, indices_t, perm = csr_transpose(indptr, indices, 17, True)
    ref_perm = np.argsort(indices, kind="stable")
    np.testing.assert_array_equal(perm, ref_perm)
    np.testing.assert_array_equal(indices_t, _dst_of(indptr)[ref_perm])
    np.testing.assert_array_equal(indptr_t, np.concatenate([[0], np.cumsum(np.bincount(indices, minlength=17))]))


def test_get_kernel_dispatches_to_cpu_twin():
    assert get_kernel("spmm.spmm_sum", "cpu") is K.spmm_sum
    with pytest.raises(ValueError):
        get_kernel("spmm.no_such_kernel", "cpu")


def test_kernels_leave_the_callers_thread_count_alone(awkward_graph):
    """Kernels never change numba's thread count behind the caller's back (issue: threads per rank)."""
    pool = numba.config.NUMBA_NUM_THREADS
    before = numba.get_num_threads()
    rng = np.random.default_rng(3)
    indptr, indices = awkward_graph(4, num_dst=400, num_edges=20000)
    x = rng.standard_normal((400, 1, 64)).astype(np.float32)  # large enough for the parallel path
    no_e, no_s = _empty(np.float32)
    try:
        for threads in sorted({1, pool}):
            numba.set_num_threads(threads)
            out = np.zeros_like(x)
            K.spmm_sum(indptr, indices, no_e, np.empty((0, 1), np.float32), no_s, x, out, False)
            assert numba.get_num_threads() == threads
    finally:
        numba.set_num_threads(before)

@pytest.mark.parametrize("nb", [1, 2, 5, 40])
def test_column_blocks_and_blocked_sum_match_spmm_sum(nb):
    from numba_kernels.cpu.spmm import column_blocks, spmm_sum, spmm_sum_blocked

    rng = np.random.default_rng(nb)
    nd, ns, E = 37, 29, 300
    dst = np.sort(rng.integers(0, nd, E))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=nd))]).astype(np.int64)
    indices = rng.integers(0, ns, E).astype(np.int64)
    eids = rng.permutation(E).astype(np.int64)
    x = rng.standard_normal((ns, 2, 3))
    w = rng.random((E, 2)) + 0.5
    s = rng.random(ns) + 0.5
    bptr, bidx, beid = column_blocks(indptr, indices, eids, ns, nb)
    # every edge lands in its block, in order, with its id
    for b in range(nb):
        for i in range(nd):
            seg = slice(bptr[b * nd + i], bptr[b * nd + i + 1])
            row = slice(indptr[i], indptr[i + 1])
            keep = indices[row] * nb // ns == b
            np.testing.assert_array_equal(bidx[seg], indices[row][keep])
            np.testing.assert_array_equal(beid[seg], eids[row][keep])
    for mean in (False, True):
        ref = np.empty((nd, 2, 3))
        spmm_sum(indptr, indices, eids, w, s, x, ref, mean)
        out = np.full((nd, 2, 3), np.nan)
        spmm_sum_blocked(indptr, bptr, bidx, beid, nb, w, s, x, out, mean)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    _, _, none = column_blocks(indptr, indices, eids, ns, nb, with_eids=False)
    assert none.shape == (0,)
    with pytest.raises(ValueError, match="needs the edge ids"):
        spmm_sum_blocked(indptr, bptr, bidx, none, nb, w, s, x, np.empty((nd, 2, 3)), False)


def _epilogue_ref(agg, rs, sx, ss, bias):
    """NumPy reference of the fused epilogue: ``agg * rs + ss * sx (rows < len(sx)) + bias``."""
    ref = agg.astype(np.float64).copy()
    if rs is not None:
        ref *= rs[:, None, None]
    if sx is not None:
        k = sx.shape[0]
        ref[:k] += sx.astype(np.float64) * (1.0 if ss is None else ss[:, None, None])
    if bias is not None:
        ref += bias.reshape(ref.shape[1:])
    return ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("terms", ["all", "scale_only", "self_only", "bias_only", "self_rows_fewer"])
@pytest.mark.parametrize("nb", [0, 3])
def test_spmm_sum_epilogue_matches_numpy(awkward_graph, dtype, mean, terms, nb):
    """The fused epilogue (row scale, self rows with their scale, bias) on the plain and column-blocked kernels."""
    indptr, indices, x, w = _case(awkward_graph, 4, dtype, 2, 3, num_src=31)
    rng = np.random.default_rng(7)
    no_e, no_s = _empty(dtype)
    rs = rng.uniform(0.5, 2, 23).astype(dtype) if terms in ("all", "scale_only") else None
    rows = 17 if terms == "self_rows_fewer" else 23
    sx = rng.standard_normal((rows, 2, 3)).astype(dtype) if terms in ("all", "self_only", "self_rows_fewer") else None
    ss = rng.uniform(0.5, 2, rows).astype(dtype) if terms in ("all", "self_rows_fewer") else None
    bias = rng.standard_normal(6).astype(dtype) if terms in ("all", "bias_only") else None
    plain = np.full((23, 2, 3), np.nan, dtype)
    K.spmm_sum(indptr, indices, no_e, w, no_s, x, plain, mean)
    out = np.full((23, 2, 3), np.nan, dtype)
    if nb:
        bptr, bidx, beid = K.column_blocks(indptr, indices, no_e, 31, nb, with_eids=False)
        K.spmm_sum_blocked(indptr, bptr, bidx, beid, nb, w, no_s, x, out, mean, (rs, sx, ss, bias))
    else:
        K.spmm_sum(indptr, indices, no_e, w, no_s, x, out, mean, (rs, sx, ss, bias))
    np.testing.assert_allclose(out, _epilogue_ref(plain, rs, sx, ss, bias), **_tol(dtype))


def test_spmm_sum_refuses_a_non_contiguous_output(awkward_graph):
    """The sum kernels write through a flat [rows, H*D] view of ``out``: a strided ``out`` would be
    written to a copy and lost, so it is refused."""
    indptr, indices, x, w = _case(awkward_graph, 3, np.float32, heads=2, dim=4)
    out = np.zeros((23, 4, 2), np.float32).transpose(0, 2, 1)  # [23, 2, 4], not C-contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        K.spmm_sum(indptr, indices, np.empty(0, np.int64), w, np.empty(0, np.float32), x, out, False)
