"""JKNet (concat / max / attention, GCN or SAGE layers) against dense formulas; layers asked for; options."""
import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies
from torch.nn import functional as F

from hpc_graph.nn import JKNet, build_model


def _dense(g, p_mat, x, w, jk, conv, layers):
    adj = g.adj
    mean = adj / adj.sum(1).clamp_min(1)[:, None]
    h, hs = x, []
    for layer in range(layers):
        if conv == "gcn":
            h = p_mat @ h @ w[f"convs.{layer}.lin.weight"].t() + w[f"convs.{layer}.bias"]
        else:
            h = (mean @ h @ w[f"convs.{layer}.lin_l.weight"].t() + w[f"convs.{layer}.lin_l.bias"]
                 + h @ w[f"convs.{layer}.lin_r.weight"].t())
        h = F.relu(h)
        hs.append(h)
    if jk == "concat":
        z = torch.cat(hs, 1)
    elif jk == "max":
        z = torch.stack(hs).max(0).values
    else:
        scores = torch.stack([hl @ w["att_q"] + w["att_c"][layer] for layer, hl in enumerate(hs)], 1)  # [N, L]
        a = torch.exp(scores - scores.max(1, keepdim=True).values)
        a = a / a.sum(1, keepdim=True)
        z = sum(a[:, layer:layer + 1] * hl for layer, hl in enumerate(hs))
    return z @ w["lin.weight"].t() + w["lin.bias"]


@pytest.mark.parametrize("jk", ["concat", "max", "attention"])
@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_forward_and_gradients_equal_dense_formula(jk, conv):
    torch.manual_seed(4)
    g, p_mat = graph_and_p()
    x = torch.randn(30, 6, dtype=torch.float64)
    model = JKNet(6, 5, 3, num_layers=3, jk=jk, conv=conv, dropout=0.5).double().eval()
    for m in model.convs:  # non-zero biases
        for name, p in m.named_parameters():
            if "bias" in name:
                torch.nn.init.normal_(p)
    if jk == "attention":
        torch.nn.init.normal_(model.att_c)
    w = leaf_copies(model)
    out = model(g, x)
    assert out.shape == (30, 3)
    assert model.lin.in_features == (15 if jk == "concat" else 5)
    check_grads(model, out, _dense(g, p_mat, x, w, jk, conv, 3), w)


def test_attention_weights_are_a_softmax_over_layers():
    torch.manual_seed(5)
    model = JKNet(4, 3, 2, num_layers=3, jk="attention").double()
    hs = [torch.full((2, 3), float(v), dtype=torch.float64) for v in (1.0, 1.0, 1.0)]
    torch.testing.assert_close(model.combine(hs), hs[0])  # equal layers: any convex weights give the same rows
    with torch.no_grad():
        model.att_q.zero_()
        model.att_c.copy_(torch.tensor([0.0, 0.0, 50.0]))
    hs = [torch.randn(4, 3, dtype=torch.float64) for _ in range(3)]
    torch.testing.assert_close(model.combine(hs), hs[2])  # a dominant layer score picks that layer


def test_layers_asked_for():
    g, _ = graph_and_p()
    model = build_model("jknet", 6, 5, 3, num_layers=3, jk="max", conv="gcn").double()
    assert model.message_passing_layers == 3
    logged = LayerLog(g)
    model(logged, torch.randn(30, 6, dtype=torch.float64))
    assert logged.log == [("layer", 0), ("aggregate", 5), ("layer", 1), ("aggregate", 5), ("layer", 2),
                          ("aggregate", 5)]


@pytest.mark.parametrize("kwargs, message", [
    ({"jk": "lstm"}, "model.jk: must be one of 'concat', 'max', 'attention', got 'lstm'"),
    ({"conv": "gat"}, "model.conv: must be one of 'gcn', 'sage', got 'gat'"),
    ({"num_layers": 0}, "model.num_layers: must be a positive integer, got 0"),
    ({"hidden": -1}, "model.hidden: must be a positive integer, got -1"),
])
def test_options_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JKNet(**{"in_dim": 5, "hidden": 4, "out_dim": 2, **kwargs})


def test_build_model_rejects_options_of_other_models():
    with pytest.raises(ValueError, match="model.alpha: only used by model 'gcn2' or 'appnp', but model.name is "
                                         "'jknet'"):
        build_model("jknet", 5, 4, 2, alpha=0.2)
    with pytest.raises(ValueError, match="model.conv: only used by model 'jknet', but model.name is 'sage'"):
        build_model("sage", 5, 4, 2, conv="sage")
