"""GCNConv vs the dense formula D^-1/2 (A+I) D^-1/2 X W + b and vs PyG's GCNConv."""
import torch
from _graphs import DenseGraph, dense_adjacency, random_edges

from hpc_graph.nn import GCNConv


def _reference(src, dst, n, x, weight, bias):
    a_hat = dense_adjacency(src, dst, n) + torch.eye(n, dtype=torch.float64)
    dinv = a_hat.sum(1).rsqrt()
    return dinv[:, None] * a_hat * dinv[None, :] @ x @ weight.t() + bias


def test_forward_and_grads_match_dense_formula():
    torch.manual_seed(0)
    n = 40
    src, dst = random_edges(n, 160, seed=1)
    graph = DenseGraph(src, dst, n)
    conv = GCNConv(7, 5).double()
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(n, 7, dtype=torch.float64, requires_grad=True)
    out = conv(graph, x)
    w = conv.lin.weight.detach().clone().requires_grad_()
    b = conv.bias.detach().clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    ref = _reference(src, dst, n, xr, w, b)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(conv.lin.weight.grad, w.grad)
    torch.testing.assert_close(conv.bias.grad, b.grad)


def test_matches_pyg_with_same_weights():
    from torch_geometric.nn import GCNConv as PyGGCNConv
    torch.manual_seed(1)
    n = 35
    src, dst = random_edges(n, 140, seed=2)
    conv = GCNConv(6, 4).double()
    torch.nn.init.normal_(conv.bias)
    pyg = PyGGCNConv(6, 4).double()
    with torch.no_grad():
        pyg.lin.weight.copy_(conv.lin.weight)
        pyg.bias.copy_(conv.bias)
    x = torch.randn(n, 6, dtype=torch.float64)
    edge_index = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)])
    torch.testing.assert_close(conv(DenseGraph(src, dst, n), x), pyg(x, edge_index))


def test_no_bias():
    conv = GCNConv(3, 2, bias=False)
    assert conv.bias is None and [n for n, _ in conv.named_parameters()] == ["lin.weight"]


def test_evaluation_scales_the_projection_in_place():
    """Under no_grad the row scale goes into the projection itself: no third N x F tensor beside the input and
    the projection (the evaluation pass set the peak memory of a GCN run before); values as the formula."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hpc_graph.nn._linear import input_linear

    ops: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    s = torch.rand(50, 1, generator=gen, dtype=torch.float64)
    with torch.no_grad(), Record():
        (out,) = input_linear(x, (w,), (None,), "relu", 0.0, row_scale=s)
    torch.testing.assert_close(out, (x.clamp_min(0) @ w.t()) * s, rtol=1e-12, atol=1e-12)
    assert any(op.startswith("aten.mul_") for op in ops) and not any(op.startswith("aten.mul.") for op in ops)
    # with autograd recording (a CSR input takes this path) the scale is a new node, the gradient exact
    w1 = w.clone().requires_grad_(True)
    (y,) = input_linear(x.to_sparse_csr(), (w1,), (None,), None, 0.0, row_scale=s)
    y.sum().backward()
    torch.testing.assert_close(w1.grad, (s * torch.ones(50, 4, dtype=torch.float64)).t() @ x, rtol=1e-12,
                               atol=1e-12)
