"""``pattern_attention``: sparse and dense-merged attention against torch's scaled_dot_product_attention."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hpc_graph.ops import CSR
from hpc_graph.ops.graph_attention import pattern_attention


def _random_pattern(seed: int, T: int, n: int, density: float = 0.3) -> CSR:
    """Random pattern over T tokens (self loops everywhere); tokens >= n are 'global': attend all, attended by all."""
    rng = np.random.default_rng(seed)
    m = rng.random((T, T)) < density
    np.fill_diagonal(m, True)
    m[n:, :] = True
    m[:, n:] = True
    d, s = np.nonzero(m)  # row-major: sorted by row then column
    indptr = np.zeros(T + 1, np.int64)
    np.cumsum(np.bincount(d, minlength=T), out=indptr[1:])
    return CSR(indptr, s.astype(np.int64), T)


def _sdpa(q, k, v, mask):
    """Reference: SDPA with an additive float mask [T, T] (-inf = not attended)."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask[None])
    return out[0].transpose(0, 1)


def _mask(g: CSR, bias, T, H, far=None, n=None):
    """[H, T, T] float mask: pattern entries get their bias, node pairs outside get ``far`` (dense) or -inf."""
    mask = torch.full((H, T, T), float("-inf"), dtype=torch.float64)
    if far is not None:
        mask[:, :n, :n] = far.view(-1, 1, 1)
    rows = torch.repeat_interleave(torch.arange(T), g.in_degree())
    mask[:, rows, g.indices] = 0.0 if bias is None else bias.t()
    return mask


def _qkv(seed, T, H, dk, dv):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, d, dtype=torch.float64, generator=gen, requires_grad=True) for d in (dk, dk, dv)]


def test_sparse_with_all_pairs_equals_sdpa():
    T, H = 11, 3
    g = _random_pattern(0, T, T, density=1.0)
    assert g.num_edges == T * T
    q, k, v = _qkv(1, T, H, 4, 5)
    out = pattern_attention(g, q, k, v)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(out, ref)
    gout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), gout), torch.autograd.grad(ref, (q, k, v), gout)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("with_bias", [False, True])
def test_sparse_pattern_and_bias_equal_sdpa_with_float_mask(with_bias):
    T, H = 17, 2
    g = _random_pattern(2, T, 15)
    q, k, v = _qkv(3, T, H, 3, 4)
    bias = (torch.randn(g.num_edges, H, dtype=torch.float64) if with_bias else None)
    if bias is not None:
        bias.requires_grad_()
    out = pattern_attention(g, q, k, v, bias=bias)
    ref = torch.stack([_sdpa(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], _mask(g, bias, T, H)[h])[:, 0]
                       for h in range(H)], 1)
    torch.testing.assert_close(out, ref)
    inputs = (q, k, v) + ((bias,) if with_bias else ())
    gout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, inputs, gout), torch.autograd.grad(ref, inputs, gout)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("tile", [None, 3, 5, 64])  # None: the fused CPU kernel; a tile: torch tiles
@pytest.mark.parametrize("n_global", [0, 1])
def test_dense_merged_equals_sdpa_over_all_pairs(tile, n_global):
    """Dense mode: pattern entries with their bias, every other node pair with the far bias, exactly."""
    T, H = 19, 2
    n = T - n_global
    g = _random_pattern(4, T, n, density=0.2)
    q, k, v = _qkv(5, T, H, 4, 3)
    bias = torch.randn(g.num_edges, H, dtype=torch.float64, requires_grad=True)
    far = torch.randn(H, dtype=torch.float64, requires_grad=True)
    out = pattern_attention(g, q, k, v, bias=bias, dense=True, num_nodes=n, far_bias=far, tile=tile,
                            fused=tile is None)
    mask = _mask(g, bias, T, H, far=far, n=n)
    ref = torch.stack([_sdpa(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], mask[h])[:, 0] for h in range(H)], 1)
    torch.testing.assert_close(out, ref)
    gout = torch.randn_like(out)
    inputs = (q, k, v, bias, far)
    for a, b in zip(torch.autograd.grad(out, inputs, gout), torch.autograd.grad(ref, inputs, gout)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dense,fused", [(False, None), (True, False), (True, True)])
def test_gradcheck_small(dense, fused):
    T, H = 6, 2
    g = _random_pattern(6, T, 5, density=0.4)
    q, k, v = _qkv(7, T, H, 2, 2)
    bias = torch.randn(g.num_edges, H, dtype=torch.float64, requires_grad=True)
    far = torch.randn(H, dtype=torch.float64, requires_grad=True) if dense else None

    def fn(q, k, v, bias, *far_):
        return pattern_attention(g, q, k, v, bias=bias, dense=dense, num_nodes=5, far_bias=far_[0] if far_ else None,
                                 tile=2, fused=fused)
    assert torch.autograd.gradcheck(fn, (q, k, v, bias) + ((far,) if dense else ()))


def test_dense_float32_fused_kernel_matches_the_torch_tiles_across_blocks():
    """float32, more node tokens than one column block and not a multiple of the row block, head width 11
    (one unrolled chunk of 8 and a remainder), large scores: the fused kernel (its own exp) against tiles."""
    T, H, n = 300, 2, 299
    g = _random_pattern(8, T, n, density=0.05)
    gen = torch.Generator().manual_seed(9)
    q, k = (4 * torch.randn(T, H, 11, generator=gen) for _ in range(2))
    v = torch.randn(T, H, 5, generator=gen)
    bias = torch.randn(g.num_edges, H, generator=gen)
    far = torch.randn(H, generator=gen)
    leaves = [t.requires_grad_() for t in (q, k, v, bias, far)]
    gout = torch.randn(T, H, 5, generator=gen)
    got = [pattern_attention(g, q, k, v, bias=bias, dense=True, num_nodes=n, far_bias=far, fused=f)
           for f in (True, False)]
    torch.testing.assert_close(got[0], got[1], rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(o, leaves, gout) for o in got]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_fused_is_the_cpu_default_and_refused_on_cuda():
    g = _random_pattern(0, 5, 5)
    q, k, v = (t.detach() for t in _qkv(0, 5, 2, 3, 3))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="fused"):
            pattern_attention(g, q.cuda(), k.cuda(), v.cuda(), dense=True, fused=True)
    else:  # off CUDA the fused path is the default and must equal the tiles
        torch.testing.assert_close(pattern_attention(g, q, k, v, dense=True),
                                   pattern_attention(g, q, k, v, dense=True, fused=False))


def test_bad_inputs_are_refused():
    g = _random_pattern(0, 5, 5)
    q, k, v = (t.detach() for t in _qkv(0, 5, 2, 3, 3))
    with pytest.raises(ValueError, match="q"):
        pattern_attention(g, q[:4], k, v)
    with pytest.raises(ValueError, match="k"):
        pattern_attention(g, q, k[:, :1], v)
    with pytest.raises(ValueError, match="bias"):
        pattern_attention(g, q, k, v, bias=torch.zeros(3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="far_bias"):
        pattern_attention(g, q, k, v, far_bias=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_nodes"):
        pattern_attention(g, q, k, v, dense=True, num_nodes=9)
    with pytest.raises(ValueError, match="square"):
        pattern_attention(CSR(g.indptr, g.indices, 7), q, k, v)


def test_code_bias_gathers_and_sums_per_code():
    from hpc_graph.ops.graph_attention import code_bias

    gen = torch.Generator().manual_seed(0)
    table = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    codes = torch.randint(0, 5, (40,), generator=gen).to(torch.uint8)
    out = code_bias(table, codes)
    ref = table[codes.long()]
    torch.testing.assert_close(out, ref)
    g = torch.randn(40, 3, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(torch.autograd.grad(out, table, g)[0], torch.autograd.grad(ref, table, g)[0])
    with pytest.raises(ValueError, match="code_bias"):
        code_bias(table[0], codes)
