"""build_model (layer stack, residuals, DistBatchNorm, activations) and the fast feature dropout."""
import warnings

import pytest
import torch
from _graphs import DenseGraph, random_edges
from torch.nn import functional as F

from hpc_graph.nn import DistBatchNorm, GATConv, GCNConv, SAGEConv, build_model
from hpc_graph.nn._dropout import dropout


def _graph(n=30):
    src, dst = random_edges(n, 100, seed=0)
    return DenseGraph(src, dst, n)


@pytest.mark.parametrize("p", [0.3, 0.5, 0.6])
def test_dropout_statistics_scaling_and_gradient(p):
    torch.manual_seed(0)
    x = torch.ones(400, 250, requires_grad=True)
    y = dropout(x, p, True)
    kept = y != 0
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) < 0.01  # 100k draws: std ~0.0016
    scale = y[kept].unique()
    assert scale.numel() == 1 and abs(scale.item() - 1 / (1 - p)) < 1e-3
    # the four 16-bit lanes of each 64-bit draw and neighbouring elements are independent
    lanes = kept.reshape(-1, 4).double().mean(0)
    assert (lanes - (1 - p)).abs().max() < 0.02
    a, b = kept.reshape(-1)[:-1].double(), kept.reshape(-1)[1:].double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.02
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * scale.item())


def test_dropout_identity_and_reproducibility():
    x = torch.randn(50, 7)
    assert dropout(x, 0.5, False) is x and dropout(x, 0.0, True) is x
    assert not dropout(x, 1.0, True).any()
    torch.manual_seed(3)
    a = dropout(x, 0.5, True)
    torch.manual_seed(3)
    b = dropout(x, 0.5, True)
    assert torch.equal(a, b) and not torch.equal(a, dropout(x, 0.5, True))


def test_structure():
    gcn = build_model("gcn", 10, 16, 3, num_layers=3)
    assert [type(c) for c in gcn.convs] == [GCNConv] * 3
    assert [(c.in_channels, c.out_channels) for c in gcn.convs] == [(10, 16), (16, 16), (16, 3)]
    gat = build_model("gat", 10, 8, 3, heads=4, out_heads=2)
    assert [type(c) for c in gat.convs] == [GATConv] * 2
    assert (gat.convs[0].heads, gat.convs[0].concat, gat.convs[1].in_channels) == (4, True, 32)
    assert (gat.convs[1].heads, gat.convs[1].concat, gat.convs[1].out_channels) == (2, False, 3)
    sage = build_model("sage", 10, 16, 3, num_layers=3, residual=True, batchnorm=True)
    assert [type(c) for c in sage.convs] == [SAGEConv] * 3
    assert [type(r).__name__ for r in sage.residuals] == ["Linear", "Identity", "Linear"]
    assert [type(b) for b in sage.norms] == [DistBatchNorm] * 2 and sage.norms[0].num_features == 16
    with pytest.raises(ValueError, match="model.name: unknown model 'gin'"):
        build_model("gin", 10, 16, 3)
    with pytest.raises(ValueError, match="model.num_layers: must be a positive integer, got 0"):
        build_model("gcn", 10, 16, 3, num_layers=0)


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_forward_equals_manual_composition(name):
    """Eval mode: conv -> (+residual) -> DistBatchNorm -> activation, last layer without the last two."""
    torch.manual_seed(1)
    g = _graph()
    x = torch.randn(30, 6, dtype=torch.float64)
    model = build_model(name, 6, 5, 3, num_layers=3, heads=2, residual=True, batchnorm=True).double()
    model.train()
    model(g, x)  # one training pass moves the running statistics away from (0, 1)
    model.eval()
    act = F.elu if name == "gat" else F.relu
    h = x
    for k, conv in enumerate(model.convs):
        y = conv(g, h) + model.residuals[k](h)
        h = act(model.norms[k](g, y)) if k < 2 else y
    out = model(g, x)
    assert out.shape == (30, 3)
    torch.testing.assert_close(out, h)


def test_training_mode_uses_dropout():
    torch.manual_seed(2)
    g = _graph()
    x = torch.randn(30, 6)
    model = build_model("gcn", 6, 8, 3, dropout=0.5)
    a, b = model(g, x), model(g, x)
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(model(g, x), model(g, x))


def _sparse_input(n=30, f=6, seed=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, dtype=torch.float64, generator=g)
    x[torch.rand(n, f, generator=g) < 0.7] = 0
    with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
        warnings.simplefilter("ignore", UserWarning)
        return x, x.to_sparse_csr()


@pytest.mark.parametrize("make", [lambda: GCNConv(6, 4), lambda: SAGEConv(6, 4), lambda: SAGEConv(6, 9),
                                  lambda: GATConv(6, 3, heads=2)])
def test_layers_accept_sparse_csr_input(make):
    torch.manual_seed(5)
    g = _graph()
    x, xs = _sparse_input()
    conv = make().double()
    dense = conv(g, x)
    r = torch.randn_like(dense)
    (dense * r).sum().backward()
    grads = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    sparse = conv(g, xs)
    (sparse * r).sum().backward()
    torch.testing.assert_close(sparse, dense)
    for p, q in zip(conv.parameters(), grads):
        torch.testing.assert_close(p.grad, q)


def test_model_with_sparse_input_and_identity_residual():
    torch.manual_seed(6)
    g = _graph()
    x, xs = _sparse_input()
    model = build_model("sage", 6, 6, 3, residual=True).double().eval()  # first skip is an Identity
    torch.testing.assert_close(model(g, xs), model(g, x))


def test_dropout_on_sparse_csr_drops_stored_values_only():
    torch.manual_seed(7)
    x, xs = _sparse_input(200, 50)
    y = dropout(xs, 0.4, True)
    assert y.layout == torch.sparse_csr and y.shape == xs.shape
    assert torch.equal(y.crow_indices(), xs.crow_indices()) and torch.equal(y.col_indices(), xs.col_indices())
    v, v0 = y.values(), xs.values()
    kept = v != 0
    assert abs(kept.double().mean().item() - 0.6) < 0.05
    torch.testing.assert_close(v[kept], v0[kept] / 0.6, rtol=1e-4, atol=0)


def test_sparse_transpose_plan_is_built_once_and_shared_by_dropout():
    from hpc_graph.nn._linear import linear, transpose_plan
    torch.manual_seed(8)
    x, xs = _sparse_input(40, 12)
    plan = transpose_plan(xs)
    assert transpose_plan(xs) is plan
    ccol, rows, perm = plan
    dense_t = torch.zeros(12, 40, dtype=torch.float64)
    for j in range(12):  # column j of x, as row j of x^T
        for k in range(int(ccol[j]), int(ccol[j + 1])):
            dense_t[j, rows[k]] = xs.values()[perm[k]]
    torch.testing.assert_close(dense_t, x.t())
    dropped = dropout(xs, 0.5, True)
    assert transpose_plan(dropped) is plan
    w = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    linear(dropped, w).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(5, 40, dtype=torch.float64) @ dropped.to_dense())
