"""RevGCN / RevGAT: reversible backward equals plain autograd, dense formulas, inverse, O(1) saved bytes, options."""
import copy

import numba
import numpy as np
import pytest
import torch
from _deep import LayerLog, check_grads, graph_and_p, leaf_copies
from _graphs import DenseGraph, random_edges
from torch.nn import functional as F

from hpc_graph.comm import get_communicator
from hpc_graph.graph.whole_graph import WholeGraph as _SingleGraph
from hpc_graph.graph.block import Block, BlockStack
from hpc_graph.nn.revgnn import RevGAT, RevGCN
from hpc_graph.ops.csr import CSR

N = 30


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: intra-op threads only add barrier waits (seconds on a loaded 2-core machine)."""
    before, before_nb = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    numba.set_num_threads(before_nb)


def _single(n=N, e=110, seed=0):
    src, dst = random_edges(n, e, seed=seed)
    return _SingleGraph(CSR.from_edges(src, dst, n))


def _model(kind, layers, groups, reversible=True, **kw):
    if kind == "gcn":
        return RevGCN(5, 12, 3, num_layers=layers, groups=groups, reversible=reversible, **kw).double()
    heads = 2 if (12 // groups) % 2 == 0 else 3
    return RevGAT(5, 12, 3, num_layers=layers, groups=groups, heads=heads, reversible=reversible, **kw).double()


def _step(model, g, x, r, seed):
    """One training forward/backward with the global generator at ``seed``; (out, x.grad, {name: grad})."""
    torch.manual_seed(seed)
    xr = x.detach().clone().requires_grad_()
    model.zero_grad()
    out = model(g, xr)
    (out * r).sum().backward()
    return out.detach(), xr.grad, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("kind, graph", [("gcn", "dense"), ("gcn", "single"), ("gat", "dense"), ("gat", "single")])
@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("layers", [1, 3, 6])
def test_reversible_backward_equals_plain_autograd(kind, graph, groups, layers):
    torch.manual_seed(layers * 10 + groups)
    if graph == "dense":
        src, dst = random_edges(N, 110, seed=layers)
        g = DenseGraph(src, dst, N)
        attn = 0.0
    else:
        g = _single(seed=layers)
        attn = 0.3 if kind == "gat" else 0.0  # the engine's attention dropout (the dense reference has none)
    kw = {"attn_dropout": attn} if kind == "gat" else {}
    model = _model(kind, layers, groups, dropout=0.4, **kw)
    ref = copy.deepcopy(model)  # same parameters, GAT seeds and call counters
    ref.reversible = False
    x = torch.randn(N, 5, dtype=torch.float64)
    r = torch.randn(N, 3, dtype=torch.float64)
    for step in range(2):  # the second step checks that the recomputation left the GAT call counters in step
        out, gx, grads = _step(model, g, x, r, 100 + step)
        out_ref, gx_ref, grads_ref = _step(ref, g, x, r, 100 + step)
        torch.testing.assert_close(out, out_ref, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(gx, gx_ref, rtol=1e-6, atol=1e-9)
        assert grads.keys() == grads_ref.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-6, atol=1e-9, msg=name)
    # dropout is on: two training passes differ, eval passes agree
    assert not torch.allclose(model(g, x), model(g, x))
    model.eval()
    torch.testing.assert_close(model(g, x), model(g, x))


def _layer_norm(z, norm):
    mu = z.mean(1, keepdim=True)
    var = ((z - mu) ** 2).mean(1, keepdim=True)
    return (z - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _gat_dense(adj, z, conv):
    """Materialised GATv1 with self loops, heads concatenated."""
    n, heads, d = z.shape[0], conv.heads, conv.out_channels
    a = adj + torch.eye(n, dtype=z.dtype)
    h = (z @ conv.lin.weight.t()).view(n, heads, d)
    e = (h * conv.att_dst).sum(-1)[:, None, :] + (h * conv.att_src).sum(-1)[None, :, :]
    e = torch.where(e > 0, e, conv.negative_slope * e).masked_fill((a == 0)[:, :, None], float("-inf"))
    return torch.einsum("ijh,jhd->ihd", torch.softmax(e, dim=1), h).reshape(n, heads * d) + conv.bias


def _dense_forward(model, adj, p_mat, x):
    """The model's formula in plain torch (eval mode): lin_in, grouped blocks, relu(LayerNorm), lin_out."""
    h = x @ model.lin_in.weight.t() + model.lin_in.bias
    for block in model.blocks:
        xs = list(h.chunk(model.groups, 1))
        prev = sum(xs[1:])
        ys = []
        for xi, norm, conv in zip(xs, block.norms, block.convs):
            z = F.relu(_layer_norm(prev, norm))
            if isinstance(model, RevGCN):
                fz = p_mat @ (z @ conv.lin.weight.t()) + conv.bias
            else:
                fz = _gat_dense(adj, z, conv)
            prev = xi + fz
            ys.append(prev)
        h = torch.cat(ys, 1)
    h = F.relu(_layer_norm(h, model.norm))
    return h @ model.lin_out.weight.t() + model.lin_out.bias


def _mirror(model, leaves):
    """A copy of ``model`` whose parameters are the tensors ``leaves[name]`` (for a second, independent graph)."""
    twin = copy.deepcopy(model)
    for name, _ in model.named_parameters():
        *path, last = name.split(".")
        mod = twin
        for part in path:
            mod = getattr(mod, part) if not part.isdigit() else mod[int(part)]
        delattr(mod, last)
        setattr(mod, last, leaves[name])
    return twin


@pytest.mark.parametrize("kind", ["gcn", "gat"])
@pytest.mark.parametrize("groups, layers", [(2, 3), (3, 2), (4, 1)])
def test_forward_and_gradients_equal_dense_formula(kind, groups, layers):
    torch.manual_seed(groups + 7 * layers)
    g, p_mat = graph_and_p()
    model = _model(kind, layers, groups)
    for name, p in model.named_parameters():  # non-trivial LayerNorm affine and biases
        if name.endswith("bias") or ".norms." in name or name.startswith("norm."):
            torch.nn.init.normal_(p, mean=1.0 if name.endswith("weight") else 0.0, std=0.3)
    model.eval()
    leaves = leaf_copies(model)
    twin = _mirror(model, leaves)
    x = torch.randn(N, 5, dtype=torch.float64)
    out = model(g, x)  # eval mode with gradients: the reversible chain still runs
    assert out.shape == (N, 3)
    check_grads(model, out, _dense_forward(twin, g.adj, p_mat, x), leaves, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind", ["gcn", "gat"])
@pytest.mark.parametrize("groups", [2, 3, 4])
def test_inverse_recovers_the_block_input(kind, groups):
    torch.manual_seed(groups)
    g = _single(seed=groups)
    model = _model(kind, 1, groups, dropout=0.5, **({"attn_dropout": 0.3} if kind == "gat" else {}))
    block = model.blocks[0]
    x = torch.randn(N, 12, dtype=torch.float64)
    with torch.no_grad():
        key = block.draw_key()
        assert key.seed is not None
        y = block(g, x, key)
        assert not torch.allclose(y, x)
        torch.testing.assert_close(block.inverse(g, y, key), x, rtol=1e-10, atol=1e-12)
        # a different key (other dropout masks, other attention seed) does not invert it
        other = block.draw_key()
        if kind == "gat":
            other = other._replace(calls=tuple(c + 5 for c in other.calls))
        assert not torch.allclose(block.inverse(g, y, other), x)


def _saved_bytes(model, g, x) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(g, x)
    out.sum().backward()
    return total


def test_saved_bytes_do_not_grow_with_depth_but_the_reference_does():
    torch.manual_seed(5)
    n = 200
    g = _single(n, 1000, seed=5)
    x = torch.randn(n, 8, dtype=torch.float64)
    sizes = {}
    for reversible in (True, False):
        for layers in (4, 64):
            model = RevGCN(8, 16, 3, num_layers=layers, groups=2, dropout=0.3, reversible=reversible).double()
            sizes[reversible, layers] = _saved_bytes(model, g, x)
    assert sizes[True, 64] <= 1.2 * sizes[True, 4], sizes
    assert sizes[False, 64] >= 4 * sizes[False, 4], sizes
    assert sizes[True, 64] * 10 < sizes[False, 64], sizes


def test_layers_asked_for_and_message_passing_layers():
    g, _ = graph_and_p()
    model = RevGCN(5, 6, 2, num_layers=4, groups=3).double()
    assert model.message_passing_layers == 4
    logged = LayerLog(g)
    model(logged, torch.randn(N, 5, dtype=torch.float64)).sum().backward()
    assert sorted({i for what, i in logged.log if what == "layer"}) == [0, 1, 2, 3]
    # forward 4 x 3 aggregations; backward: inverse + re-run of every f_i
    assert [e for e in logged.log if e[0] == "aggregate"] == [("aggregate", 2)] * (4 * 3 * 3)


@pytest.mark.parametrize("cls, kwargs, message", [
    (RevGCN, {"groups": 1}, "model.groups: must be an integer >= 2"),
    (RevGCN, {"groups": 0}, "model.groups: must be a positive integer, got 0"),
    (RevGCN, {"hidden": 10, "groups": 3}, "model.hidden: must be divisible by model.groups=3, got 10"),
    (RevGCN, {"num_layers": 0}, "model.num_layers: must be a positive integer, got 0"),
    (RevGCN, {"dropout": 1.0}, r"model.dropout: must be a number in \[0, 1\), got 1.0"),
    (RevGCN, {"reversible": "yes"}, "model.reversible: must be true or false, got 'yes'"),
    (RevGAT, {"heads": 4}, "model.heads: must divide the 6 channels of a group"),
    (RevGAT, {"heads": 0}, "model.heads: must be a positive integer, got 0"),
    (RevGAT, {"attn_dropout": -0.1}, r"model.attn_dropout: must be a number in \[0, 1\)"),
    (RevGAT, {"hidden": 7}, "model.hidden: must be divisible by model.groups=2, got 7"),
])
def test_options_validated(cls, kwargs, message):
    args = {"hidden": 12, **kwargs}
    hidden = args.pop("hidden")
    with pytest.raises(ValueError, match=message):
        cls(5, hidden, 2, **args)


class _Shrinking(DenseGraph):
    """A fake sampled context: every layer drops the last row (``dst`` is a prefix)."""

    def dst(self, t):
        return t[:-1]


def _sampled_stack(num_dst=7, num_src=15):
    rng = np.random.default_rng(0)
    indptr, cols = [0], []
    for _ in range(num_dst):
        cols += rng.choice(num_src, 3, replace=False).tolist()
        indptr.append(len(cols))
    gid = torch.arange(num_src)
    block = Block(CSR(torch.tensor(indptr), torch.tensor(cols), num_src), gid, gid,
                  torch.full((num_src,), 4, dtype=torch.int64), get_communicator("local"))
    return BlockStack([block]), num_src


@pytest.mark.parametrize("cls", [RevGCN, RevGAT])
def test_sampled_blocks_are_refused(cls):
    src, dst = random_edges(10, 20, seed=1)
    model = cls(4, 6, 2, num_layers=2).double()
    with pytest.raises(ValueError,
                       match=rf"{cls.__name__}: layer 0 .*full-graph engine \(single, dp, sar, sylvie, flow"):
        model(_Shrinking(src, dst, 10), torch.randn(10, 4, dtype=torch.float64))
    stack, rows = _sampled_stack()
    model = cls(4, 6, 2, num_layers=1).double()
    with pytest.raises(ValueError, match="sampled block"):
        model(stack, torch.randn(rows, 4, dtype=torch.float64))


def test_no_grad_and_eval_run_without_the_chain():
    torch.manual_seed(9)
    g, _ = graph_and_p()
    model = RevGCN(5, 8, 2, num_layers=3).double().eval()
    x = torch.randn(N, 5, dtype=torch.float64)
    with torch.no_grad():
        a = model(g, x)
    model.reversible = False
    torch.testing.assert_close(a, model(g, x).detach())


def test_recomputation_leaves_the_attention_seeds_where_the_forward_passes_left_them():
    torch.manual_seed(11)
    g = _single()
    model = _model("gat", 2, 2, attn_dropout=0.3)
    x = torch.randn(N, 5, dtype=torch.float64)
    first = model(g, x)
    model(g, x)  # a second forward pass before the first one's backward
    first.sum().backward()
    assert [conv._calls for block in model.blocks for conv in block.convs] == [2] * 4
