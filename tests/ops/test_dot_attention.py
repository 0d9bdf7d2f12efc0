"""hpc_graph.ops.dot_attention: autograd op and block-wise API vs a materialised torch reference."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "numba_kernels"))
from _attention_ref import awkward_graph, dot_reference, split_blocks  # noqa: E402

from hpc_graph.ops.csr import CSR  # noqa: E402

# the module, not the function of the same name that hpc_graph.ops re-exports
A = importlib.import_module("hpc_graph.ops.dot_attention")

TOL = {torch.float32: dict(rtol=3e-4, atol=3e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def _inputs(seed, g, heads, dk, dv, dtype, with_bias, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(g.num_dst, heads, dk, generator=gen, dtype=dtype)
    k = torch.randn(g.num_src, heads, dk, generator=gen, dtype=dtype) * torch.linspace(
        0.5, 3, g.num_src, dtype=dtype)[:, None, None]
    v = torch.randn(g.num_src, heads, dv, generator=gen, dtype=dtype)
    bias = torch.randn(g.num_edges, heads, generator=gen, dtype=dtype) if with_bias else None
    return [None if t is None else t.requires_grad_(requires_grad) for t in (q, k, v, bias)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_op_matches_reference_forward_and_grads(dtype, with_bias):
    g = awkward_graph(np.random.default_rng(0), 37, 31, 280)
    inputs = _inputs(0, g, 4, 3, 5, dtype, with_bias)
    out = A.dot_attention(g, *inputs)
    grad_out = torch.randn_like(out)
    leaves = [t for t in inputs if t is not None]
    grads = torch.autograd.grad(out, leaves, grad_out)
    ref_in = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    ref = dot_reference(g, *ref_in)
    ref_grads = torch.autograd.grad(ref, [t for t in ref_in if t is not None], grad_out.double())
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("with_bias", [False, True])
def test_gradcheck_float64(with_bias):
    g = awkward_graph(np.random.default_rng(1), 8, 7, 20)
    inputs = [t for t in _inputs(1, g, 2, 3, 2, torch.float64, with_bias) if t is not None]
    fn = lambda *t: A.dot_attention(g, *t, scale=0.8)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-7)


def test_blockwise_equals_one_shot():
    g = awkward_graph(np.random.default_rng(2), 45, 40, 400)
    q, k, v, bias = _inputs(2, g, 3, 4, 2, torch.float64, True)
    out = A.dot_attention(g, q, k, v, bias)
    grad_out = torch.randn_like(out)
    want = (out.detach(), *torch.autograd.grad(out, (q, k, v, bias), grad_out))
    q, k, v, bias = (t.detach() for t in (q, k, v, bias))
    for num_blocks in (1, 2, 3, 7):
        blocks = split_blocks(g, num_blocks)
        state = A.init_state(g.num_dst, 3, 2, torch.float64)
        for blk, lo, hi, mask in blocks:
            A.accumulate(state, blk, q, k[lo:hi].contiguous(), v[lo:hi].contiguous(), bias[mask].contiguous())
        got_out = A.finalize(state).clone()
        delta = A.output_delta(state, grad_out)
        gq, gk, gv, gb = (torch.zeros_like(t) for t in (q, k, v, bias))
        for blk, lo, hi, mask in blocks:
            a, b, c, d = A.backward_block(state, grad_out, delta, blk, q, k[lo:hi].contiguous(),
                                          v[lo:hi].contiguous(), bias[mask].contiguous())
            gq += a
            gk[lo:hi] += b
            gv[lo:hi] += c
            gb[mask] = d
        for a, b in zip((got_out, gq, gk, gv, gb), want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bad_inputs_raise_value_error():
    g = awkward_graph(np.random.default_rng(4), 10, 9, 40)
    q, k, v, bias = _inputs(4, g, 2, 3, 4, torch.float64, True, requires_grad=False)
    bad = CSR(g.indptr, g.indices.clone(), g.num_src, validate=False)
    bad.indices[0] = -1
    with pytest.raises(ValueError, match="indices"):
        A.dot_attention(bad, q, k, v)
    cases = [
        ((q[:-1], k, v), "q"),
        ((q, k[:, :, :2], v), "k_block"),
        ((q, k, v[:-1]), "v_block"),
        ((q, k, v[:, :1]), "q"),
        ((q, k.float(), v), "k"),
        ((q, k, v, bias[:-1]), "bias"),
        ((q, k, v[0]), "v"),
    ]
    for args, name in cases:
        with pytest.raises(ValueError, match=name):
            A.dot_attention(g, *args)


def test_code_indexed_bias_equals_gathered_bias_and_checks_codes():
    from hpc_graph.ops.graph_attention import code_bias

    rng = np.random.default_rng(11)
    n, e, heads = 150, 1200, 4
    dst = np.sort(rng.integers(0, n, e))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    g = CSR(torch.from_numpy(indptr), torch.from_numpy(rng.integers(0, n, e)), n)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, heads, 6, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    table = torch.randn(5, heads, dtype=torch.float64, generator=gen, requires_grad=True)
    codes = torch.from_numpy(rng.integers(0, 5, e).astype(np.uint8))
    dot_attention = A.dot_attention
    a = dot_attention(g, q, k, v, table, codes=codes)
    b = dot_attention(g, q, k, v, code_bias(table, codes))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(a)
    for x, y in zip(torch.autograd.grad((a * w).sum(), (q, k, v, table)),
                    torch.autograd.grad((b * w).sum(), (q, k, v, table))):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="no row in the 3-row bias table"):
        dot_attention(g, q, k, v, table[:3], codes=codes)
    with pytest.raises(ValueError, match="uint8"):
        dot_attention(g, q, k, v, table, codes=codes.long())
    with pytest.raises(ValueError, match="without a bias table"):
        dot_attention(g, q, k, v, None, codes=codes)
