"""SGC against the dense formula (Wu et al. 2019) and PyG's SGConv; the S^K X cache; block stacks; options."""
import copy
import pickle
import warnings

import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn import SGC, build_model


class _Stack(GraphContext):
    """Stands for a mini-batch block stack: its layers are other contexts (here the same full graph)."""

    def __init__(self, inner):
        self.inner, self.num_nodes, self.global_num_nodes = inner, inner.num_nodes, -1

    def layer(self, index):
        return self.inner.layer(index)

    def aggregate(self, x, reduce="sum"):
        raise AssertionError("a block stack is never aggregated over as a whole")

    gat = in_degree = global_ids = aggregate

    def all_reduce_sum(self, t):
        return t


@pytest.mark.parametrize("hops", [1, 2, 5])
def test_forward_and_gradients_equal_dense_formula(hops):
    torch.manual_seed(hops)
    g, p_mat = graph_and_p()
    x = torch.randn(30, 6, dtype=torch.float64)
    model = SGC(6, 3, hops=hops, dropout=0.5).double().eval()
    w = leaf_copies(model)
    ref = torch.linalg.matrix_power(p_mat, hops) @ x @ w["lin.weight"].t() + w["lin.bias"]
    out = model(g, x)
    assert out.shape == (30, 3) and model.message_passing_layers == hops
    check_grads(model, out, ref, w)


def test_propagation_is_computed_once_per_graph_and_features():
    torch.manual_seed(1)
    g, p_mat = graph_and_p()
    logged = LayerLog(g)
    x = torch.randn(30, 6, dtype=torch.float64)
    model = SGC(6, 3, hops=2).double()
    first = model(logged, x)
    assert logged.log == [("layer", 0), ("layer", 0), ("aggregate", 6), ("layer", 1), ("aggregate", 6)]
    del logged.log[:]
    torch.testing.assert_close(model(logged, x), first)
    assert ("aggregate", 6) not in logged.log  # cached
    x2 = x.clone()  # other features (same values): recomputed
    model(logged, x2)
    assert logged.log.count(("aggregate", 6)) == 2
    del logged.log[:]
    other = LayerLog(g)  # another graph: recomputed there
    model(other, x2)
    assert other.log.count(("aggregate", 6)) == 2
    model.clear_cache()
    model(other, x2)
    assert other.log.count(("aggregate", 6)) == 4
    # copies and pickles drop the cache (weak references), the state dict never holds it
    assert copy.deepcopy(model)._cache is None and pickle.loads(pickle.dumps(model))._cache is None
    assert list(model.state_dict()) == ["lin.weight", "lin.bias"]


def test_block_stack_propagates_every_batch_and_input_is_a_constant():
    torch.manual_seed(2)
    g, p_mat = graph_and_p()
    logged = LayerLog(g)
    stack = _Stack(logged)
    x = torch.randn(30, 6, dtype=torch.float64, requires_grad=True)
    model = SGC(6, 3, hops=3).double()
    for _ in range(2):
        out = model(stack, x)
    assert logged.log.count(("aggregate", 6)) == 6 and model._cache is None
    torch.testing.assert_close(out, model.lin(torch.linalg.matrix_power(p_mat, 3) @ x.detach()))
    out.sum().backward()
    assert x.grad is None and model.lin.weight.grad is not None


def test_sparse_features_and_pyg_sgconv():
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(3)
    g, _ = graph_and_p()
    x = torch.randn(30, 6, dtype=torch.float64)
    x[torch.rand(30, 6) < 0.7] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        xs = x.to_sparse_csr()
    model = SGC(6, 3, hops=2).double()
    ref = pyg.SGConv(6, 3, K=2).double()
    ref.lin.load_state_dict(model.lin.state_dict())
    dst, src = g.adj.nonzero(as_tuple=True)
    torch.testing.assert_close(model(g, xs), ref(x, torch.stack([src, dst])))


@pytest.mark.parametrize("kwargs, message", [
    ({"hops": 0}, "model.hops: must be a positive integer, got 0"),
    ({"dropout": 2}, r"model.dropout: must be a number in \[0, 1\), got 2"),
    ({"in_dim": 0}, "model.in_dim: must be a positive integer, got 0"),
])
def test_options_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SGC(**{"in_dim": 5, "out_dim": 2, **kwargs})


def test_build_model_defaults_and_rejects_options_of_other_models():
    model = build_model("sgc", 5, 16, 2, dropout=0.0)
    assert model.hops == 2 and model.message_passing_layers == 2
    with pytest.raises(ValueError, match="model.theta: only used by model 'gcn2', but model.name is 'sgc'"):
        build_model("sgc", 5, 4, 2, theta=2.0)
