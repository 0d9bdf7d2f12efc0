"""hpc_graph.ops.gat_attention: autograd op and block-wise API vs a materialised torch reference."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "numba_kernels"))
from _attention_ref import awkward_graph, gat_reference, split_blocks  # noqa: E402

from hpc_graph.ops.csr import CSR  # noqa: E402

# the module, not the function of the same name that hpc_graph.ops re-exports
G = importlib.import_module("hpc_graph.ops.gat_attention")

TOL = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _inputs(seed, g, heads, dim, dtype, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(g.num_src, heads, dim, generator=gen, dtype=dtype)
    s_src = torch.randn(g.num_src, heads, generator=gen, dtype=dtype) + torch.linspace(0, 5, g.num_src,
                                                                                          dtype=dtype)[:, None]
    s_dst = torch.randn(g.num_dst, heads, generator=gen, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (z, s_src, s_dst)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_op_matches_reference_forward_and_grads(dtype, p, index_dtype):
    g = awkward_graph(np.random.default_rng(0), 37, 31, 280)
    g = CSR(g.indptr, g.indices.to(index_dtype), g.num_src)  # int32 columns are kept (half the bytes)
    z, s_src, s_dst = _inputs(0, g, 4, 3, dtype)
    out = G.gat_attention(g, z, s_src, s_dst, negative_slope=0.1, attn_dropout=p, seed=9)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (z, s_src, s_dst), grad_out)
    z64, s64, d64 = (t.detach().double().requires_grad_() for t in (z, s_src, s_dst))
    ref = gat_reference(g, z64, s64, d64, 0.1, p, 9)
    ref_grads = torch.autograd.grad(ref, (z64, s64, d64), grad_out.double())
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_gradcheck_float64(p):
    g = awkward_graph(np.random.default_rng(1), 8, 7, 20)
    z, s_src, s_dst = _inputs(1, g, 2, 3, torch.float64)
    fn = lambda z, a, b: G.gat_attention(g, z, a, b, negative_slope=0.2, attn_dropout=p, seed=3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (z, s_src, s_dst), eps=1e-6, atol=1e-7)


def _blockwise(g, num_blocks, z, s_src, s_dst, grad_out, **kw):
    """Forward and backward through the block-wise API with contiguous source blocks."""
    blocks = split_blocks(g, num_blocks)
    state = G.init_state(g.num_dst, z.shape[1], z.shape[2], z.dtype)
    for blk, lo, hi, _ in blocks:
        G.accumulate(state, blk, z[lo:hi].contiguous(), s_src[lo:hi].contiguous(), s_dst,
                     src_gid=torch.arange(lo, hi), **kw)
    out = G.finalize(state).clone()
    delta = G.output_delta(state, grad_out)
    gz, gs, gd = torch.zeros_like(z), torch.zeros_like(s_src), torch.zeros_like(s_dst)
    for blk, lo, hi, _ in blocks:
        a, b, c = G.backward_block(state, grad_out, delta, blk, z[lo:hi].contiguous(),
                                   s_src[lo:hi].contiguous(), s_dst, src_gid=torch.arange(lo, hi), **kw)
        gz[lo:hi] += a
        gs[lo:hi] += b
        gd += c
    return out, gz, gs, gd


@pytest.mark.parametrize("p", [0.0, 0.35])
def test_blockwise_equals_one_shot(p):
    g = awkward_graph(np.random.default_rng(2), 45, 40, 400)
    z, s_src, s_dst = _inputs(2, g, 3, 4, torch.float64)
    kw = dict(negative_slope=0.2, attn_dropout=p, seed=77)
    out = G.gat_attention(g, z, s_src, s_dst, **kw)
    grad_out = torch.randn_like(out)
    want = (out.detach(), *torch.autograd.grad(out, (z, s_src, s_dst), grad_out))
    z, s_src, s_dst = z.detach(), s_src.detach(), s_dst.detach()
    for num_blocks in (1, 2, 3, 7):
        got = _blockwise(g, num_blocks, z, s_src, s_dst, grad_out, **kw)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_dropout_deterministic_and_global_ids():
    g = awkward_graph(np.random.default_rng(3), 30, 30, 300)
    z, s_src, s_dst = _inputs(3, g, 2, 3, torch.float64, requires_grad=False)
    kw = dict(attn_dropout=0.5)
    a = G.gat_attention(g, z, s_src, s_dst, seed=1, **kw)
    torch.testing.assert_close(G.gat_attention(g, z, s_src, s_dst, seed=1, **kw), a, rtol=0, atol=0)
    assert not torch.allclose(G.gat_attention(g, z, s_src, s_dst, seed=2, **kw), a)
    # explicit ids equal to the local ones change nothing; other ids change the mask
    ids = torch.arange(30)
    torch.testing.assert_close(G.gat_attention(g, z, s_src, s_dst, seed=1, src_gid=ids, dst_gid=ids, **kw), a)
    assert not torch.allclose(G.gat_attention(g, z, s_src, s_dst, seed=1, src_gid=ids + 1000, **kw), a)
    # eval mode and p = 0 agree
    torch.testing.assert_close(G.gat_attention(g, z, s_src, s_dst, seed=1, training=False, **kw),
                               G.gat_attention(g, z, s_src, s_dst))


def test_bad_inputs_raise_value_error():
    g = awkward_graph(np.random.default_rng(4), 10, 9, 40)
    z, s_src, s_dst = _inputs(4, g, 2, 3, torch.float64, requires_grad=False)
    bad = CSR(g.indptr, g.indices.clone(), g.num_src, validate=False)
    bad.indices[3] = g.num_src
    with pytest.raises(ValueError, match="indices"):
        G.gat_attention(bad, z, s_src, s_dst)
    cases = [
        ((z[:-1], s_src, s_dst), "z_block"),
        ((z, s_src[:, :1], s_dst), "s_src"),
        ((z, s_src, s_dst[:-1]), "s_dst"),
        ((z.float(), s_src, s_dst), "s_src"),
        ((z, s_src, s_dst.float()), "s_dst"),
        ((z[0], s_src, s_dst), "z_src"),
    ]
    for args, name in cases:
        with pytest.raises(ValueError, match=name):
            G.gat_attention(g, *args)
    with pytest.raises(ValueError, match="attn_dropout"):
        G.gat_attention(g, z, s_src, s_dst, attn_dropout=1.0)
    with pytest.raises(ValueError, match="src_gid"):
        G.gat_attention(g, z, s_src, s_dst, attn_dropout=0.1, src_gid=torch.arange(3))
    with pytest.raises(ValueError, match="dst_gid"):
        G.gat_attention(g, z, s_src, s_dst, attn_dropout=0.1, dst_gid=torch.arange(g.num_dst) - 1)
    state = G.init_state(g.num_dst + 1, 2, 3, torch.float64)
    with pytest.raises(ValueError, match="block"):
        G.accumulate(state, g, z, s_src, s_dst)
    state = G.init_state(g.num_dst, 2, 3, torch.float64)
    G.finalize(state)
    with pytest.raises(ValueError, match="finalized"):
        G.accumulate(state, g, z, s_src, s_dst)


@pytest.mark.parametrize("act, p", [(None, 0.0), ("elu", 0.0), ("elu", 0.4), ("relu", 0.3), (None, 0.5)])
@pytest.mark.parametrize("attn_p", [0.0, 0.3])
def test_projected_op_equals_the_composed_layer(act, p, attn_p):
    """gat_projected (keeps x, recomputes dropout(act(x)) and z) equals act_dropout -> linear -> scores ->
    gat_attention with autograd: output and the gradients of x, W, att_src, att_dst (float64)."""
    from hpc_graph.ops.dropout import act_dropout

    rng = np.random.default_rng(3)
    g = awkward_graph(rng, 33, 33, 200)
    gen = torch.Generator().manual_seed(2)
    H, D, F_in = 3, 4, 7
    leaves = [torch.randn(33, F_in, generator=gen, dtype=torch.float64),
              torch.randn(H * D, F_in, generator=gen, dtype=torch.float64) * 0.5,
              torch.randn(1, H, D, generator=gen, dtype=torch.float64),
              torch.randn(1, H, D, generator=gen, dtype=torch.float64)]
    gid = torch.arange(33) * 5 + 1
    grad_out = torch.randn(33, H, D, generator=gen, dtype=torch.float64)

    ref = [t.clone().requires_grad_() for t in leaves]
    torch.manual_seed(11)
    a = act_dropout(ref[0], act, p)
    z = torch.nn.functional.linear(a, ref[1]).view(-1, H, D)
    out_ref = G.gat_attention(g, z, (z * ref[2]).sum(-1), (z * ref[3]).sum(-1), 0.2, attn_p, 7, gid, gid)
    (out_ref * grad_out).sum().backward()

    ours = [t.clone().requires_grad_() for t in leaves]
    torch.manual_seed(11)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = G.gat_projected(g, ours[0], ours[1], ours[2], ours[3], act=act, p=p, negative_slope=0.2,
                              attn_dropout=attn_p, seed=7, src_gid=gid, dst_gid=gid)
    # nothing the size of x or z is kept but x itself and the output
    big = [t for t in saved if t.numel() >= 33 * min(F_in, H * D)]
    assert {t.data_ptr() for t in big} == {ours[0].data_ptr(), out.data_ptr()}
    torch.testing.assert_close(out, out_ref.detach(), rtol=1e-12, atol=1e-12)
    (out * grad_out).sum().backward()
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-10, atol=1e-12)


def test_projected_op_bad_inputs():
    g = awkward_graph(np.random.default_rng(0), 12, 12, 40)
    x, w = torch.randn(12, 5), torch.randn(6, 5)
    att = torch.randn(1, 2, 3)
    with pytest.raises(ValueError, match="act"):
        G.gat_projected(g, x, w, att, att, act="tanh")
    with pytest.raises(ValueError, match="square"):
        G.gat_projected(g, x[:10], w, att, att)
    with pytest.raises(ValueError, match="weight"):
        G.gat_projected(g, x, torch.randn(5, 5), att, att)
    with pytest.raises(ValueError, match="p must be"):
        G.gat_projected(g, x, w, att, att, p=1.0)
