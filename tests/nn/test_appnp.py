"""APPNP against the dense formula (Klicpera et al. 2019) and PyG's APPNP propagation; layers; options."""
import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies
from torch.nn import functional as F

from hpc_graph.nn import APPNP, build_model


def _mlp(x, w, layers):
    h = x
    for i in range(layers):
        h = h @ w[f"mlp.lins.{i}.weight"].t() + w[f"mlp.lins.{i}.bias"]
        if i < layers - 1:
            h = F.relu(h)
    return h


@pytest.mark.parametrize("layers, hops, alpha", [(2, 10, 0.1), (1, 3, 0.5), (3, 1, 0.0), (2, 2, 1.0)])
def test_forward_and_gradients_equal_dense_formula(layers, hops, alpha):
    torch.manual_seed(hops)
    g, p_mat = graph_and_p()
    x = torch.randn(30, 6, dtype=torch.float64)
    model = APPNP(6, 8, 3, num_layers=layers, hops=hops, alpha=alpha, dropout=0.5).double().eval()
    w = leaf_copies(model)
    h = _mlp(x, w, layers)
    z = h
    for _ in range(hops):
        z = (1 - alpha) * p_mat @ z + alpha * h
    out = model(g, x)
    assert out.shape == (30, 3)
    check_grads(model, out, z, w)


def test_many_hops_approach_the_personalised_pagerank_fixed_point():
    torch.manual_seed(1)
    g, p_mat = graph_and_p()
    model = APPNP(4, 5, 3, hops=200, alpha=0.2).double().eval()
    x = torch.randn(30, 4, dtype=torch.float64)
    ppr = 0.2 * torch.linalg.inv(torch.eye(30, dtype=torch.float64) - 0.8 * p_mat)
    torch.testing.assert_close(model(g, x), ppr @ model.mlp(x), rtol=1e-9, atol=1e-9)


def test_matches_pyg_appnp_propagation():
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(2)
    g, _ = graph_and_p()
    dst, src = g.adj.nonzero(as_tuple=True)
    model = APPNP(6, 5, 3, hops=4, alpha=0.15).double().eval()
    x = torch.randn(30, 6, dtype=torch.float64)
    torch.testing.assert_close(model(g, x), pyg.APPNP(4, 0.15)(model.mlp(x), torch.stack([src, dst])))


def test_layers_asked_for_and_default_hops():
    g, _ = graph_and_p()
    assert build_model("appnp", 6, 5, 3).message_passing_layers == 10
    model = build_model("appnp", 6, 5, 3, hops=3).double()
    assert model.message_passing_layers == 3
    logged = LayerLog(g)
    model(logged, torch.randn(30, 6, dtype=torch.float64))
    assert logged.log == [e for k in range(3) for e in (("layer", k), ("aggregate", 3))]


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": -0.1}, r"model.alpha: must be a number in \[0, 1\], got -0.1"),
    ({"hops": 0}, "model.hops: must be a positive integer, got 0"),
    ({"hops": 2.5}, "model.hops: must be a positive integer, got 2.5"),
    ({"num_layers": 0}, "model.num_layers: must be a positive integer, got 0"),
])
def test_options_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        APPNP(5, 4, 2, **kwargs)
    if "hops" in kwargs:
        with pytest.raises(ValueError, match=message):
            build_model("appnp", 5, 4, 2, **kwargs)


def test_build_model_rejects_options_of_other_models():
    with pytest.raises(ValueError, match="model.hops: only used by model 'appnp' or 'sgc' or 'dagnn', but "
                                         "model.name is 'gcn2'"):
        build_model("gcn2", 5, 4, 2, hops=3)
    with pytest.raises(ValueError, match="model.heads: only used by model 'gcn' or 'sage' or 'gat'"):
        build_model("appnp", 5, 4, 2, heads=2)
