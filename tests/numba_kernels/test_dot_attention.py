"""CPU dot-product edge-attention kernels vs a materialised torch reference (forward, backward)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attention_ref import awkward_graph, dot_reference, split_blocks  # noqa: E402

import numba_kernels.cpu._attention_common as common  # noqa: E402
from numba_kernels.cpu import dot_attention as K  # noqa: E402

TOL = {np.float32: dict(rtol=3e-4, atol=3e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _inputs(rng, g, heads, dk, dv, dtype, with_bias):
    q = rng.standard_normal((g.num_dst, heads, dk)).astype(dtype)
    k = (rng.standard_normal((g.num_src, heads, dk)) * np.linspace(0.5, 3, g.num_src)[:, None, None]).astype(dtype)
    v = rng.standard_normal((g.num_src, heads, dv)).astype(dtype)
    bias = rng.standard_normal((g.num_edges, heads)).astype(dtype) if with_bias else None
    return q, k, v, bias


@pytest.fixture(params=["serial", "chunked"])
def chunking(request, monkeypatch):
    """Run small inputs both on one thread (default) and split into many parallel chunks."""
    if request.param == "chunked":
        monkeypatch.setattr(common, "SMALL_WORK", 0)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("num_blocks", [1, 3])
def test_forward_matches_reference(dtype, with_bias, num_blocks, chunking):
    rng = np.random.default_rng(1)
    g = awkward_graph(rng, 40, 33, 300)
    q, k, v, bias = _inputs(rng, g, 3, 4, 5, dtype, with_bias)
    m, l, acc = K.init_state(g.num_dst, 3, 5, dtype)
    for blk, lo, hi, mask in split_blocks(g, num_blocks):
        b = bias[mask.numpy()] if with_bias else None
        K.accumulate(blk.indptr.numpy(), blk.indices.numpy(), q, k[lo:hi], v[lo:hi], b, 0.7, m, l, acc)
    K.finalize(m, l, acc)
    t = [torch.from_numpy(a).double() for a in (q, k, v)]
    ref = dot_reference(g, *t, torch.from_numpy(bias).double() if with_bias else None, 0.7)
    np.testing.assert_allclose(acc, ref.numpy(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_backward_matches_autograd(dtype, with_bias, chunking):
    rng = np.random.default_rng(2)
    g = awkward_graph(rng, 30, 26, 250)
    heads, dk, dv, scale = 2, 3, 4, 0.6
    q, k, v, bias = _inputs(rng, g, heads, dk, dv, dtype, with_bias)
    grad_out = rng.standard_normal((g.num_dst, heads, dv)).astype(dtype)
    m, l, out = K.init_state(g.num_dst, heads, dv, dtype)
    K.accumulate(g.indptr.numpy(), g.indices.numpy(), q, k, v, bias, scale, m, l, out)
    K.finalize(m, l, out)
    delta = np.empty_like(m)
    K.output_delta(grad_out, out, delta)
    gq, gk, gv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    gb = np.zeros_like(bias) if with_bias else None
    args = (q, k, v, bias, scale, m, l, grad_out, delta)
    K.backward_dst(g.indptr.numpy(), g.indices.numpy(), *args, gq, gb)
    indptr_t, indices_t, perm = g.csc()
    K.backward_src(indptr_t.numpy(), indices_t.numpy(), perm.numpy(), *args, gk, gv)

    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    tb = torch.tensor(bias, dtype=torch.float64, requires_grad=True) if with_bias else None
    ref = dot_reference(g, tq, tk, tv, tb, scale)
    ref.backward(torch.from_numpy(grad_out).double())
    pairs = [(gq, tq), (gk, tk), (gv, tv)] + ([(gb, tb)] if with_bias else [])
    for got, want in pairs:
        np.testing.assert_allclose(got, want.grad.numpy(), **TOL[dtype])


def test_large_scores_stay_finite():
    """Scores far beyond exp's range: the running max keeps the softmax finite."""
    rng = np.random.default_rng(3)
    g = awkward_graph(rng, 20, 20, 120)
    q, k, v, _ = _inputs(rng, g, 2, 3, 3, np.float32, False)
    q *= 300.0
    m, l, acc = K.init_state(g.num_dst, 2, 3, np.float32)
    for blk, lo, hi, _ in split_blocks(g, 4):
        K.accumulate(blk.indptr.numpy(), blk.indices.numpy(), q, k[lo:hi], v[lo:hi], None, 1.0, m, l, acc)
    K.finalize(m, l, acc)
    ref = dot_reference(g, *(torch.from_numpy(a).double() for a in (q, k, v)), None, 1.0)
    assert np.isfinite(acc).all()
    np.testing.assert_allclose(acc, ref.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_code_indexed_bias_equals_the_gathered_bias(dtype, chunking):
    """``codes`` uint8[E] into a [C, H] table: the same scores as the gathered [E, H] bias, and the table's
    gradient is the sum of the entries' gradients per code (partial sums per row chunk)."""
    rng = np.random.default_rng(4)
    g = awkward_graph(rng, 35, 30, 280)
    heads, dk, dv, scale, C = 3, 4, 2, 0.5, 5
    q, k, v, _ = _inputs(rng, g, heads, dk, dv, dtype, False)
    table = rng.standard_normal((C, heads)).astype(dtype)
    codes = rng.integers(0, C, g.num_edges).astype(np.uint8)
    grad_out = rng.standard_normal((g.num_dst, heads, dv)).astype(dtype)
    results = []
    for mode in ("codes", "gathered"):
        bias, cd = (table, codes) if mode == "codes" else (table[codes], None)
        m, l, out = K.init_state(g.num_dst, heads, dv, dtype)
        K.accumulate(g.indptr.numpy(), g.indices.numpy(), q, k, v, bias, scale, m, l, out, codes=cd)
        K.finalize(m, l, out)
        delta = np.empty_like(m)
        K.output_delta(grad_out, out, delta)
        gq, gk, gv, gb = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros_like(bias)
        args = (q, k, v, bias, scale, m, l, grad_out, delta)
        K.backward_dst(g.indptr.numpy(), g.indices.numpy(), *args, gq, gb, codes=cd)
        indptr_t, indices_t, perm = g.csc()
        K.backward_src(indptr_t.numpy(), indices_t.numpy(), perm.numpy(), *args, gk, gv, codes=cd)
        if mode == "gathered":  # sum the per-entry gradients per code: the table's gradient
            gb = np.stack([gb[codes == c].sum(0) for c in range(C)])
        results.append((out, gq, gk, gv, gb))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, **TOL[dtype])
