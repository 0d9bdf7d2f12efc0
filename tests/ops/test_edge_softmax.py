"""``hpc_graph.ops.edge_softmax``: vs a torch per-row softmax, gradcheck on awkward graphs, input checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hpc_graph.ops._kernel_args as kargs
from hpc_graph.ops import CSR, edge_softmax


def _graph(awkward_graph, seed, num_dst=16, num_edges=80, index_dtype=np.int64) -> CSR:
    indptr, indices = awkward_graph(seed, num_dst=num_dst, num_edges=num_edges)
    return CSR(indptr, indices.astype(index_dtype))


def _reference(g: CSR, s):
    rows = [torch.softmax(s[a:b], dim=0) for a, b in zip(g.indptr[:-1].tolist(), g.indptr[1:].tolist())]
    return torch.cat(rows) if rows else s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("heads", [None, 4])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_edge_softmax_matches_torch(awkward_graph, dtype, heads, index_dtype):
    g = _graph(awkward_graph, heads or 1, index_dtype=index_dtype)
    gen = torch.Generator().manual_seed(0)
    shape = (g.num_edges,) if heads is None else (g.num_edges, heads)
    s = (torch.randn(shape, dtype=dtype, generator=gen) * 10 + 200).requires_grad_()
    out = edge_softmax(g, s)
    sr = s.detach().clone().requires_grad_()
    ref = _reference(g, sr)
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(out, ref, **tol)
    gout = torch.randn(shape, dtype=dtype, generator=gen)
    out.backward(gout)
    ref.backward(gout)
    torch.testing.assert_close(s.grad, sr.grad, **tol)


def test_edge_softmax_gradcheck_awkward_graph(awkward_graph):
    g = _graph(awkward_graph, 7, num_dst=12, num_edges=40)
    s = torch.randn(g.num_edges, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7),
                    requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: edge_softmax(g, s), (s,), eps=1e-6, atol=1e-6)


def test_edge_softmax_bad_inputs_raise_before_kernels(awkward_graph, monkeypatch):
    monkeypatch.setattr(kargs, "get_kernel", lambda *a, **k: (_ for _ in ()).throw(AssertionError("kernel ran")))
    g = _graph(awkward_graph, 8)
    with pytest.raises(ValueError, match=f"scores has {g.num_edges - 1} rows"):
        edge_softmax(g, torch.randn(g.num_edges - 1, 2))
    with pytest.raises(ValueError, match="dimensions"):
        edge_softmax(g, torch.randn(g.num_edges, 2, 2))
    with pytest.raises(ValueError, match="float32 or float64"):
        edge_softmax(g, torch.ones(g.num_edges, dtype=torch.float16))
    bad = CSR(g.indptr.clone(), g.indices, validate=False)
    bad.indptr[-1] += 1
    with pytest.raises(ValueError, match="indptr"):
        edge_softmax(bad, torch.randn(g.num_edges))
