"""GCNII against the dense formula (Chen et al. 2020) and PyG's GCN2Conv; layers asked for; options."""
import math

import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies
from torch.nn import functional as F

from hpc_graph.nn import GCNII, build_model


def _dense(p_mat, x, w, alpha, theta):
    h0 = F.relu(x @ w["lin_in.weight"].t() + w["lin_in.bias"])
    h = h0
    layers = sum(k.startswith("weights.") for k in w)
    for layer in range(1, layers + 1):
        beta = math.log(theta / layer + 1)
        s = (1 - alpha) * p_mat @ h + alpha * h0
        h = F.relu(s @ ((1 - beta) * torch.eye(h.shape[1], dtype=h.dtype) + beta * w[f"weights.{layer - 1}"]))
    return h @ w["lin_out.weight"].t() + w["lin_out.bias"]


@pytest.mark.parametrize("layers, alpha, theta", [(1, 0.1, 0.5), (6, 0.2, 1.5), (3, 0.0, 0.5), (2, 1.0, 0.5)])
def test_forward_and_gradients_equal_dense_formula(layers, alpha, theta):
    torch.manual_seed(layers)
    g, p_mat = graph_and_p()
    x = torch.randn(30, 7, dtype=torch.float64)
    model = GCNII(7, 8, 3, num_layers=layers, alpha=alpha, theta=theta, dropout=0.6).double().eval()
    w = leaf_copies(model)
    out = model(g, x)
    assert out.shape == (30, 3)
    check_grads(model, out, _dense(p_mat, x, w, alpha, theta), w)


def test_betas_and_layers_asked_for():
    g, _ = graph_and_p()
    model = build_model("gcn2", 5, 4, 2, num_layers=4, theta=0.5).double()
    assert model.message_passing_layers == 4
    assert model.betas() == pytest.approx([math.log(0.5 / k + 1) for k in (1, 2, 3, 4)])
    logged = LayerLog(g)
    model(logged, torch.randn(30, 5, dtype=torch.float64))
    assert logged.log == [e for k in range(4) for e in (("layer", k), ("aggregate", 4))]


def test_matches_pyg_gcn2conv_stack():
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(2)
    g, _ = graph_and_p()
    src, dst = g.adj.nonzero(as_tuple=True)[1], g.adj.nonzero(as_tuple=True)[0]
    edge_index = torch.stack([src, dst])
    model = GCNII(6, 5, 3, num_layers=3, alpha=0.1, theta=0.5).double().eval()
    convs = [pyg.GCN2Conv(5, 0.1, 0.5, layer=k + 1).double() for k in range(3)]
    for conv, w in zip(convs, model.weights):
        conv.weight1.data.copy_(w.data)
    x = torch.randn(30, 6, dtype=torch.float64)
    h0 = h = F.relu(model.lin_in(x))
    for conv in convs:
        h = F.relu(conv(h, h0, edge_index))
    torch.testing.assert_close(model(g, x), model.lin_out(h))


def test_dropout_only_in_training():
    torch.manual_seed(3)
    g, _ = graph_and_p()
    x = torch.randn(30, 5, dtype=torch.float64)
    model = GCNII(5, 6, 2, num_layers=2, dropout=0.5).double()
    assert not torch.allclose(model(g, x), model(g, x))
    model.eval()
    torch.testing.assert_close(model(g, x), model(g, x))


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 1.5}, r"model.alpha: must be a number in \[0, 1\], got 1.5"),
    ({"theta": 0.0}, "model.theta: must be a number > 0, got 0.0"),
    ({"num_layers": 0}, "model.num_layers: must be a positive integer, got 0"),
    ({"dropout": 1.0}, r"model.dropout: must be a number in \[0, 1\), got 1.0"),
])
def test_options_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GCNII(5, 4, 2, **kwargs)


def test_build_model_rejects_options_of_other_models():
    with pytest.raises(ValueError, match="model.jk: only used by model 'jknet', but model.name is 'gcn2'"):
        build_model("gcn2", 5, 4, 2, jk="max")
    with pytest.raises(ValueError, match="model.residual: only used by model 'gcn' or 'sage' or 'gat'"):
        build_model("gcn2", 5, 4, 2, residual=True)
    with pytest.raises(ValueError, match="model.theta: only used by model 'gcn2', but model.name is 'gcn'"):
        build_model("gcn", 5, 4, 2, theta=1.0)
