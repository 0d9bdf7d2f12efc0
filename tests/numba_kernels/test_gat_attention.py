"""CPU GATv1 attention kernels vs a materialised torch reference (forward, backward, dropout)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attention_ref import awkward_graph, gat_reference, keep_mask, split_blocks  # noqa: E402

import numba_kernels.cpu._attention_common as common  # noqa: E402
from numba_kernels.cpu import gat_attention as K  # noqa: E402

TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _inputs(rng, g, heads, dim, dtype):
    z = rng.standard_normal((g.num_src, heads, dim)).astype(dtype)
    # source scores grow with the column id: later blocks raise the running max (rescale path)
    s_src = (rng.standard_normal((g.num_src, heads)) + np.linspace(0, 6, g.num_src)[:, None]).astype(dtype)
    s_dst = rng.standard_normal((g.num_dst, heads)).astype(dtype)
    return z, s_src, s_dst


def _forward(blocks, num_dst, z, s_src, s_dst, slope, p, seed):
    m, l, acc = K.init_state(num_dst, z.shape[1], z.shape[2], z.dtype)
    for blk, lo, hi, _ in blocks:
        ids = np.arange(lo, hi, dtype=np.int64) if p > 0 else None
        dst_ids = np.arange(num_dst, dtype=np.int64) if p > 0 else None
        K.accumulate(blk.indptr.numpy(), blk.indices.numpy(), z[lo:hi], s_src[lo:hi], s_dst, ids, dst_ids,
                     slope, p, seed, m, l, acc)
    K.finalize(m, l, acc)
    return m, l, acc


@pytest.fixture(params=["serial", "chunked"])
def chunking(request, monkeypatch):
    """Run small inputs both on one thread (default) and split into many parallel chunks."""
    if request.param == "chunked":
        monkeypatch.setattr(common, "SMALL_WORK", 0)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("num_blocks", [1, 3])
def test_forward_matches_reference(dtype, p, num_blocks, chunking):
    rng = np.random.default_rng(1)
    g = awkward_graph(rng, 40, 33, 300)
    z, s_src, s_dst = _inputs(rng, g, 3, 5, dtype)
    _, _, out = _forward(split_blocks(g, num_blocks), g.num_dst, z, s_src, s_dst, 0.15, p, 11)
    ref = gat_reference(g, *(torch.from_numpy(a).double() for a in (z, s_src, s_dst)), 0.15, p, 11)
    np.testing.assert_allclose(out, ref.numpy(), **TOL[dtype])
    assert not out[::5].any()  # empty rows give 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_backward_matches_autograd(dtype, p, chunking):
    rng = np.random.default_rng(2)
    g = awkward_graph(rng, 30, 26, 250)
    heads, dim, slope, seed = 2, 4, 0.2, 5
    z, s_src, s_dst = _inputs(rng, g, heads, dim, dtype)
    grad_out = rng.standard_normal((g.num_dst, heads, dim)).astype(dtype)
    m, l, out = _forward(split_blocks(g, 1), g.num_dst, z, s_src, s_dst, slope, p, seed)
    delta = np.empty_like(m)
    K.output_delta(grad_out, out, delta)
    ids_s = np.arange(g.num_src, dtype=np.int64) if p > 0 else None
    ids_d = np.arange(g.num_dst, dtype=np.int64) if p > 0 else None
    gz, gss, gsd = np.zeros_like(z), np.zeros_like(s_src), np.zeros_like(s_dst)
    args = (z, s_src, s_dst, ids_s, ids_d, slope, p, seed, m, l, grad_out, delta)
    K.backward_dst(g.indptr.numpy(), g.indices.numpy(), *args, gsd)
    indptr_t, indices_t, _ = g.csc()
    K.backward_src(indptr_t.numpy(), indices_t.numpy(), *args, gz, gss)

    tz, ts, td = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (z, s_src, s_dst))
    ref = gat_reference(g, tz, ts, td, slope, p, seed)
    ref.backward(torch.from_numpy(grad_out).double())
    for got, want in ((gz, tz), (gss, ts), (gsd, td)):
        np.testing.assert_allclose(got, want.grad.numpy(), **TOL[dtype])


def test_dropout_mask_matches_hash_and_keep_rate():
    rng = np.random.default_rng(3)
    n, heads, p, seed = 6000, 4, 0.3, 1234
    src = rng.integers(0, n, n)
    src_gid = rng.permutation(10 * n)[:n].astype(np.int64)
    dst_gid = rng.permutation(10 * n)[:n].astype(np.int64)
    indptr = np.arange(n + 1, dtype=np.int64)  # one in-edge per destination: alpha = 1
    z = np.ones((n, heads, 1))
    s = np.zeros((n, heads))
    m, l, acc = K.init_state(n, heads, 1, np.float64)
    K.accumulate(indptr, src, z, s, s, src_gid, dst_gid, 0.2, p, seed, m, l, acc)
    K.finalize(m, l, acc)
    kept = acc[:, :, 0] > 0
    np.testing.assert_allclose(acc[:, :, 0][kept], 1.0 / (1.0 - p))
    np.testing.assert_array_equal(kept, keep_mask(seed, dst_gid, src_gid[src], heads, p))
    rate, sigma = kept.mean(), np.sqrt(p * (1 - p) / kept.size)
    assert abs(rate - (1 - p)) < 5 * sigma
    # another seed drops other coefficients
    m, l, acc2 = K.init_state(n, heads, 1, np.float64)
    K.accumulate(indptr, src, z, s, s, src_gid, dst_gid, 0.2, p, seed + 1, m, l, acc2)
    assert (acc2[:, :, 0] > 0).mean() == pytest.approx(1 - p, abs=0.03)
    assert ((acc2[:, :, 0] > 0) != kept).mean() > 0.2


def test_row_chunks_balance_and_cover():
    rng = np.random.default_rng(4)
    deg = rng.zipf(1.8, 5000).clip(max=20000)
    indptr = np.zeros(deg.size + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    for chunks in (1, 3, 16, 64):
        b = common._row_chunks(indptr, chunks)
        assert b[0] == 0 and b[-1] == deg.size and (np.diff(b) >= 0).all()
        cost = (indptr[b[1:]] + b[1:]) - (indptr[b[:-1]] + b[:-1])
        assert cost.max() <= (indptr[-1] + deg.size) / chunks + deg.max() + 1


def test_empty_block_is_a_no_op():
    m, l, acc = K.init_state(4, 2, 3, np.float64)
    indptr = np.zeros(5, dtype=np.int64)
    K.accumulate(indptr, np.zeros(0, dtype=np.int64), np.zeros((0, 2, 3)), np.zeros((0, 2)), np.zeros((4, 2)),
                 None, None, 0.2, 0.3, 0, m, l, acc)
    K.finalize(m, l, acc)
    assert np.isneginf(m).all() and not l.any() and not acc.any()
