"""Every kernel-backed op on a real GPU against the same op on the CPU (float32 and float64).

The graphs are the suite's awkward graphs at a size that fills several
thread blocks (a hub row of 0.4 E in-edges, empty rows, isolated nodes, self
loops, duplicates). Each case draws fresh random inputs, runs the op forward
and backward on both devices with the same upstream gradient, and compares
outputs and every input gradient. Feature widths cover each CUDA layout: the
8-lane row groups (F <= 8), one warp with one or several slots per lane, and
rows too wide for the register slots (the block fallbacks).

Also: kernels launch on torch's current stream (a non-default stream whose
pending work writes the inputs must be waited for by the kernels, with no
synchronisation in between), and the CUDA twins take torch tensors without
copies.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.ops import CSR, dot_attention, edge_softmax, gat_attention, sddmm, spmm, spmm_fused

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _graph(awkward_graph, seed, nd=1500, ns=None, edges=40000):
    indptr, indices = awkward_graph(seed, num_dst=nd, num_src=ns, num_edges=edges)
    return CSR(torch.from_numpy(indptr), torch.from_numpy(indices), nd if ns is None else ns)


def _pair(t):
    """``(cpu leaf, cuda leaf)`` copies of ``t`` that require grad."""
    return t.clone().requires_grad_(True), t.cuda().requires_grad_(True)


def _check(fn_cpu, fn_gpu, inputs, dtype, seed=0):
    """Run both, backward with one random upstream gradient, compare outputs and input gradients."""
    pairs = [_pair(t) for t in inputs]
    out_c = fn_cpu(*[c for c, _ in pairs])
    out_g = fn_gpu(*[g for _, g in pairs])
    gen = torch.Generator().manual_seed(seed)
    go = torch.randn(out_c.shape, generator=gen, dtype=dtype)
    out_c.backward(go)
    out_g.backward(go.cuda())
    torch.testing.assert_close(out_g.detach().cpu(), out_c.detach(), **TOL[dtype])
    for k, (c, g) in enumerate(pairs):
        assert g.grad is not None and torch.isfinite(g.grad).all(), f"input {k}: no/nonfinite gradient"
        torch.testing.assert_close(g.grad.cpu(), c.grad, **TOL[dtype], msg=lambda m: f"input {k}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5), (1, 40), (4, 32), (2, 150), (1, 300)])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_spmm_matches_cpu(awkward_graph, dtype, shape, reduce):
    H, D = shape
    g = _graph(awkward_graph, 1, nd=1200, ns=900)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(H * 1000 + D)
    x = torch.randn(g.num_src, H, D, generator=gen, dtype=dtype)
    w = torch.rand(g.num_edges, H, generator=gen, dtype=dtype) + 0.5
    _check(lambda x, w: spmm(g, x, reduce, w), lambda x, w: spmm(gg, x, reduce, w), [x, w], dtype)
    _check(lambda x: spmm(g, x.view(g.num_src, -1), reduce), lambda x: spmm(gg, x.view(g.num_src, -1), reduce),
           [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_spmm_fused_matches_cpu(awkward_graph, dtype):
    g = _graph(awkward_graph, 2)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(2)
    n, F = g.num_dst, 48
    x = torch.randn(n, F, generator=gen, dtype=dtype)
    scale = torch.rand(n, generator=gen, dtype=dtype) + 0.5
    bias = torch.randn(F, generator=gen, dtype=dtype)
    _check(lambda x, b: spmm_fused(g, x, "sum", scale=scale, self_loop=True, self_scale=scale, bias=b),
           lambda x, b: spmm_fused(gg, x, "sum", scale=scale.cuda(), self_loop=True, self_scale=scale.cuda(), bias=b),
           [x, bias], dtype)
    rows = torch.randn(n, F, generator=gen, dtype=dtype)
    _check(lambda x, r: spmm_fused(g, x, "mean", self_rows=r), lambda x, r: spmm_fused(gg, x, "mean", self_rows=r),
           [x, rows], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sddmm_and_edge_softmax_match_cpu(awkward_graph, dtype):
    g = _graph(awkward_graph, 3, nd=1000, ns=800)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(g.num_dst, 3, 16, generator=gen, dtype=dtype)
    b = torch.randn(g.num_src, 3, 16, generator=gen, dtype=dtype)
    _check(lambda a, b: sddmm(g, a, b), lambda a, b: sddmm(gg, a, b), [a, b], dtype)
    s = torch.randn(g.num_edges, 3, generator=gen, dtype=dtype) * 4
    _check(lambda s: edge_softmax(g, s), lambda s: edge_softmax(gg, s), [s], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 8), (4, 32), (3, 20), (1, 7), (2, 200)])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_gat_attention_matches_cpu(awkward_graph, dtype, shape, p):
    H, D = shape
    g = _graph(awkward_graph, 4, nd=1300, ns=1100)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(H * 100 + D)
    z = torch.randn(g.num_src, H, D, generator=gen, dtype=dtype)
    ss = torch.randn(g.num_src, H, generator=gen, dtype=dtype) * 2
    sd = torch.randn(g.num_dst, H, generator=gen, dtype=dtype)
    _check(lambda z, a, b: gat_attention(g, z, a, b, 0.2, p, seed=11),
           lambda z, a, b: gat_attention(gg, z, a, b, 0.2, p, seed=11), [z, ss, sd], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dot_attention_matches_cpu(awkward_graph, dtype, with_bias):
    g = _graph(awkward_graph, 5, nd=900, ns=700, edges=20000)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(g.num_dst, 2, 16, generator=gen, dtype=dtype)
    k = torch.randn(g.num_src, 2, 16, generator=gen, dtype=dtype)
    v = torch.randn(g.num_src, 2, 24, generator=gen, dtype=dtype)
    inputs = [q, k, v] + ([torch.randn(g.num_edges, 2, generator=gen, dtype=dtype)] if with_bias else [])
    _check(lambda *t: dot_attention(g, *t[:3], bias=t[3] if with_bias else None),
           lambda *t: dot_attention(gg, *t[:3], bias=t[3] if with_bias else None), inputs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_masks_are_the_cpu_masks(dtype):
    from hpc_graph.ops.dropout import dropout

    x = torch.randn(1000, 37, dtype=dtype)
    torch.manual_seed(7)
    c = dropout(x, 0.3)
    torch.manual_seed(7)
    g = dropout(x.cuda(), 0.3)
    torch.testing.assert_close(g.cpu(), c, **TOL[dtype])
    assert 0.25 < float((c == 0).double().mean()) < 0.35


def test_kernels_wait_for_work_queued_on_a_non_default_stream(awkward_graph):
    """Inputs written by pending work on a side stream: the kernels must run after it (same stream)."""
    g = _graph(awkward_graph, 6, nd=4000, edges=200000)
    gg = g.to("cuda")
    gen = torch.Generator().manual_seed(6)
    host = torch.randn(g.num_src, 64, generator=gen)
    ref = spmm(g, host, "sum")
    src = host.cuda()
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    for trial in range(3):
        with torch.cuda.stream(side):
            x = torch.zeros_like(src)
            for _ in range(20):  # keep the stream busy for a while before x gets its values
                big = big @ big
                big = big / big.norm()
            x.copy_(src)
            out = spmm(gg, x, "sum")
            w = torch.rand(g.num_edges, device="cuda") * 0 + 1
            out_w = spmm(gg, x, "mean", w)
        side.synchronize()
        torch.testing.assert_close(out.cpu(), ref, rtol=2e-4, atol=2e-4, msg=lambda m: f"trial {trial}: {m}")
        torch.testing.assert_close(out_w.cpu(), spmm(g, host, "mean"), rtol=2e-4, atol=2e-4)


def test_cuda_twins_take_torch_tensors_without_copies():
    from hpc_graph.ops._bridge import as_array

    t = torch.arange(12.0, device="cuda").view(3, 4)
    a = as_array(t)
    assert a.__cuda_array_interface__["data"][0] == t.data_ptr()
    assert a.shape == (3, 4)
    assert np.array_equal(a.copy_to_host(), t.cpu().numpy())
