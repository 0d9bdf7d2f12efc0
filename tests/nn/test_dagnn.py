"""DAGNN against the dense formula (Liu et al. 2020); layers asked for; options."""
import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies
from torch.nn import functional as F

from hpc_graph.nn import DAGNN, build_model


@pytest.mark.parametrize("layers, hops", [(2, 10), (1, 1), (3, 4)])
def test_forward_and_gradients_equal_dense_formula(layers, hops):
    torch.manual_seed(hops)
    g, p_mat = graph_and_p()
    x = torch.randn(30, 6, dtype=torch.float64)
    model = DAGNN(6, 8, 3, num_layers=layers, hops=hops, dropout=0.8).double().eval()
    w = leaf_copies(model)
    h = x
    for i in range(layers):
        h = h @ w[f"mlp.lins.{i}.weight"].t() + w[f"mlp.lins.{i}.bias"]
        if i < layers - 1:
            h = F.relu(h)
    reps = [h]
    for _ in range(hops):
        reps.append(p_mat @ reps[-1])
    q, b = w["gate.weight"][0], w["gate.bias"][0]
    ref = sum(torch.sigmoid(r @ q + b)[:, None] * r for r in reps)
    out = model(g, x)
    assert out.shape == (30, 3)
    check_grads(model, out, ref, w)


def test_saturated_gates_sum_or_drop_the_hops():
    """Gates saturated at 1 give the plain sum of the K + 1 hops, gates at 0 give nothing."""
    torch.manual_seed(1)
    g, p_mat = graph_and_p()
    model = DAGNN(4, 5, 3, hops=2).double().eval()
    x = torch.randn(30, 4, dtype=torch.float64)
    with torch.no_grad():
        model.gate.weight.zero_()
        model.gate.bias.fill_(60.0)
    h = model.mlp(x)
    torch.testing.assert_close(model(g, x), h + p_mat @ h + p_mat @ p_mat @ h)
    with torch.no_grad():
        model.gate.bias.fill_(-60.0)
    torch.testing.assert_close(model(g, x), torch.zeros(30, 3, dtype=torch.float64), rtol=0, atol=1e-20)


def test_layers_asked_for():
    g, _ = graph_and_p()
    assert build_model("dagnn", 6, 5, 3).message_passing_layers == 10
    model = build_model("dagnn", 6, 5, 3, hops=2).double()
    logged = LayerLog(g)
    model(logged, torch.randn(30, 6, dtype=torch.float64))
    assert logged.log == [("layer", 0), ("aggregate", 3), ("layer", 1), ("aggregate", 3)]


@pytest.mark.parametrize("kwargs, message", [
    ({"hops": 0}, "model.hops: must be a positive integer, got 0"),
    ({"num_layers": -2}, "model.num_layers: must be a positive integer, got -2"),
    ({"dropout": -0.5}, r"model.dropout: must be a number in \[0, 1\), got -0.5"),
])
def test_options_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DAGNN(5, 4, 2, **kwargs)


def test_build_model_rejects_options_of_other_models():
    with pytest.raises(ValueError, match="model.alpha: only used by model 'gcn2' or 'appnp', but model.name is "
                                         "'dagnn'"):
        build_model("dagnn", 5, 4, 2, alpha=0.3)
