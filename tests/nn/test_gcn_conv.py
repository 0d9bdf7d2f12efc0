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
