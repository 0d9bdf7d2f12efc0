"""Model fields of the config: the deep models' options, who may set them, fan-outs per message-passing layer."""
import pytest

from hpc_graph.nn import MODELS, build_model, message_passing_layers
from hpc_graph.train.config import MODEL_NAMES, ConfigError, config_from_dict


def _cfg(model, engine=None, sampler=None):
    raw = {"data": {"path": "g.h5"}, "model": model}
    if engine:
        raw["engine"] = {"name": engine}
    if sampler:
        raw["sampler"] = sampler
    return config_from_dict(raw)


def test_model_names_are_those_of_build_model():
    assert MODEL_NAMES == MODELS


def test_defaults_and_accepted_values():
    m = _cfg({"name": "gcn2", "num_layers": 64, "alpha": 0.1, "theta": 0.5}).model
    assert (m.alpha, m.theta, m.hops, m.jk, m.conv) == (0.1, 0.5, None, "concat", "gcn")
    assert _cfg({"name": "appnp", "hops": 3, "alpha": 1}).model.alpha == 1.0
    assert _cfg({"name": "jknet", "jk": "attention", "conv": "sage"}).model.jk == "attention"
    assert _cfg({"name": "sgc", "hops": 3}).model.hops == 3
    assert _cfg({"name": "dagnn", "hops": None}).model.hops is None


@pytest.mark.parametrize("model, message", [
    ({"name": "gcn2", "alpha": 1.5}, "model.alpha: must be a number in [0, 1], got 1.5"),
    ({"name": "gcn2", "theta": 0}, "model.theta: must be a positive number, got 0"),
    ({"name": "appnp", "hops": 0}, "model.hops: must be a positive integer, got 0"),
    ({"name": "sgc", "hops": 1.5}, "model.hops: must be a positive integer, got 1.5"),
    ({"name": "jknet", "jk": "lstm"}, "model.jk: must be one of 'concat', 'max', 'attention', got 'lstm'"),
    ({"name": "jknet", "conv": "gat"}, "model.conv: must be one of 'gcn', 'sage', got 'gat'"),
])
def test_bad_values_are_named(model, message):
    with pytest.raises(ConfigError) as err:
        _cfg(model)
    assert str(err.value) == message


@pytest.mark.parametrize("model, message", [
    ({"name": "gcn", "alpha": 0.2}, "model.alpha: only used by model 'gcn2' or 'appnp', but model.name is 'gcn'"),
    ({"name": "dagnn", "alpha": 0.2}, "model.alpha: only used by model 'gcn2' or 'appnp', but model.name is "
                                      "'dagnn'"),
    ({"name": "appnp", "theta": 1.0}, "model.theta: only used by model 'gcn2', but model.name is 'appnp'"),
    ({"name": "gcn2", "hops": 4}, "model.hops: only used by model 'appnp' or 'sgc' or 'dagnn', but model.name "
                                  "is 'gcn2'"),
    ({"name": "sage", "jk": "max"}, "model.jk: only used by model 'jknet', but model.name is 'sage'"),
    ({"name": "gcn2", "conv": "sage"}, "model.conv: only used by model 'jknet', but model.name is 'gcn2'"),
    ({"name": "sgc", "residual": True}, "model.residual: only used by model 'gcn' or 'sage' or 'gat', but "
                                        "model.name is 'sgc'"),
    ({"name": "jknet", "batchnorm": True}, "model.batchnorm: only used by model 'gcn' or 'sage' or 'gat', but "
                                           "model.name is 'jknet'"),
    ({"name": "appnp", "heads": 2}, "model.heads: only used by model 'gcn' or 'sage' or 'gat' or 'revgat' or 'gt' "
                                    "or 'graphormer', but model.name is 'appnp'"),
])
def test_a_field_set_for_a_model_that_does_not_use_it_is_named(model, message):
    with pytest.raises(ConfigError) as err:
        _cfg(model)
    assert str(err.value) == message


def test_stack_fields_still_accepted_for_the_stacks():
    assert _cfg({"name": "sage", "heads": 4, "residual": True, "batchnorm": True}).model.heads == 4


@pytest.mark.parametrize("model, layers", [
    ({"name": "gcn", "num_layers": 3}, 3), ({"name": "gcn2", "num_layers": 4}, 4),
    ({"name": "jknet", "num_layers": 5}, 5), ({"name": "appnp", "num_layers": 3}, 10),
    ({"name": "appnp", "hops": 3}, 3), ({"name": "sgc"}, 2), ({"name": "dagnn", "hops": 1}, 1),
])
def test_minibatch_fanouts_one_per_message_passing_layer(model, layers):
    cfg = _cfg(model, "minibatch", {"fanouts": [-1] * layers})
    assert message_passing_layers(cfg.model.name, cfg.model.num_layers, cfg.model.hops) == layers
    mc = cfg.model
    built = build_model(mc.name, 4, 3, 2, num_layers=mc.num_layers, alpha=mc.alpha, theta=mc.theta,
                        hops=mc.hops, jk=mc.jk, conv=mc.conv)
    assert built.message_passing_layers == layers
    with pytest.raises(ConfigError, match=rf"sampler.fanouts: one fan-out per model layer is needed \({layers} "
                                          r"for model\.(num_layers|hops)"):
        _cfg(model, "minibatch", {"fanouts": [-1] * (layers + 1)})


def test_default_hops_named_in_the_fanout_error():
    with pytest.raises(ConfigError) as err:
        _cfg({"name": "appnp"}, "minibatch", {"fanouts": [5, 5]})
    assert str(err.value) == ("sampler.fanouts: one fan-out per model layer is needed (10 for model.hops, the "
                              "default of 'appnp'), got [5, 5]")
