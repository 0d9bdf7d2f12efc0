"""``hpc_graph.ops.sddmm``: forward/backward vs torch, gradcheck on awkward graphs, input checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hpc_graph.ops._kernel_args as kargs
from hpc_graph.ops import CSR, sddmm


def _graph(awkward_graph, seed, num_dst=15, num_src=None, num_edges=70, index_dtype=np.int64) -> CSR:
    indptr, indices = awkward_graph(seed, num_dst=num_dst, num_src=num_src, num_edges=num_edges)
    return CSR(indptr, indices.astype(index_dtype), num_src=num_src)


def _reference(g: CSR, a, b):
    dst = torch.repeat_interleave(torch.arange(g.num_dst), g.in_degree())
    return (a[dst] * b[g.indices]).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4,), (3, 8)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_sddmm_matches_torch(awkward_graph, dtype, shape, index_dtype):
    g = _graph(awkward_graph, 1, num_dst=17, num_src=11, index_dtype=index_dtype)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn((17,) + shape, dtype=dtype, generator=gen, requires_grad=True)
    b = torch.randn((11,) + shape, dtype=dtype, generator=gen, requires_grad=True)
    out = sddmm(g, a, b)
    ar, br = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = _reference(g, ar, br)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    gout = torch.randn(out.shape, dtype=dtype, generator=gen)
    out.backward(gout)
    ref.backward(gout)
    torch.testing.assert_close(a.grad, ar.grad, **tol)
    torch.testing.assert_close(b.grad, br.grad, **tol)


@pytest.mark.parametrize("num_src", [None, 9])
def test_sddmm_gradcheck_awkward_graph(awkward_graph, num_src):
    g = _graph(awkward_graph, 2, num_dst=12, num_src=num_src, num_edges=45)
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(12, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(g.num_src, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: sddmm(g, a, b), (a, b), eps=1e-6, atol=1e-6)


def test_sddmm_only_one_side_requires_grad(awkward_graph):
    g = _graph(awkward_graph, 3)
    a = torch.randn(15, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(15, 2, 3, dtype=torch.float64)
    sddmm(g, a, b).sum().backward()
    torch.testing.assert_close(a.grad, torch.autograd.grad(_reference(g, a, b).sum(), a)[0])


def test_sddmm_bad_inputs_raise_before_kernels(awkward_graph, monkeypatch):
    monkeypatch.setattr(kargs, "get_kernel", lambda *a, **k: (_ for _ in ()).throw(AssertionError("kernel ran")))
    g = _graph(awkward_graph, 4)
    a = torch.randn(15, 2, 3)
    with pytest.raises(ValueError, match="b has 14 rows"):
        sddmm(g, a, torch.randn(14, 2, 3))
    with pytest.raises(ValueError, match="agree"):
        sddmm(g, a, torch.randn(15, 2, 4))
    with pytest.raises(ValueError, match="dtype"):
        sddmm(g, a, torch.randn(15, 2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="dimensions"):
        sddmm(g, torch.randn(15), torch.randn(15))
    bad = CSR(g.indptr, g.indices.clone(), validate=False)
    bad.indices[0] = -1
    with pytest.raises(ValueError, match="out of range"):
        sddmm(bad, a, a)
