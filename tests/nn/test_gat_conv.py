"""GATConv vs attention materialised densely (with self loops), and vs PyG's GATConv."""
import pytest
import torch
from _graphs import DenseGraph, dense_adjacency, random_edges

from hpc_graph.nn import GATConv


def _reference(src, dst, n, x, conv):
    """Materialised GATv1: alpha[i, j, h] = softmax_j LeakyReLU(a_dst.z_i + a_src.z_j) over in-edges + self."""
    h, d = conv.heads, conv.out_channels
    a = dense_adjacency(src, dst, n) + torch.eye(n, dtype=torch.float64)
    if conv.projection == "relu":  # DistGNN-MB: z = ReLU(x W + b), no bias after the aggregation
        z = torch.relu(x @ conv.lin.weight.t() + conv.lin.bias).view(n, h, d)
    else:
        z = (x @ conv.lin.weight.t()).view(n, h, d)
    e = (z * conv.att_dst).sum(-1)[:, None, :] + (z * conv.att_src).sum(-1)[None, :, :]
    e = torch.where(e > 0, e, conv.negative_slope * e)
    e = e.masked_fill((a == 0)[:, :, None], float("-inf"))
    alpha = torch.softmax(e, dim=1)
    out = torch.einsum("ijh,jhd->ihd", alpha, z)
    out = out.reshape(n, h * d) if conv.concat else out.mean(1)
    return out if conv.bias is None else out + conv.bias


@pytest.mark.parametrize("projection", ["linear", "relu"])
@pytest.mark.parametrize("heads,concat", [(3, True), (2, False), (1, True)])
def test_forward_and_grads_match_materialised_attention(heads, concat, projection):
    torch.manual_seed(0)
    n = 30
    src, dst = random_edges(n, 120, seed=5)
    conv = GATConv(6, 4, heads=heads, concat=concat, projection=projection).double()
    torch.nn.init.normal_(conv.bias if projection == "linear" else conv.lin.bias)
    assert (conv.bias is None) == (conv.lin.bias is not None) == (projection == "relu")
    x = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
    out = conv(DenseGraph(src, dst, n), x)
    ref_conv = GATConv(6, 4, heads=heads, concat=concat, projection=projection).double()
    ref_conv.load_state_dict(conv.state_dict())
    xr = x.detach().clone().requires_grad_()
    ref = _reference(src, dst, n, xr, ref_conv)
    assert out.shape == (n, heads * 4 if concat else 4)
    torch.testing.assert_close(out, ref)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    for (name, p), (_, q) in zip(conv.named_parameters(), ref_conv.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("heads,concat", [(4, True), (3, False)])
def test_matches_pyg_with_same_weights(heads, concat):
    from torch_geometric.nn import GATConv as PyGGATConv
    torch.manual_seed(1)
    n = 30
    src, dst = random_edges(n, 110, seed=6)
    conv = GATConv(5, 3, heads=heads, concat=concat).double()
    torch.nn.init.normal_(conv.bias)
    pyg = PyGGATConv(5, 3, heads=heads, concat=concat).double()
    pyg.load_state_dict(conv.state_dict())  # same names: lin.weight, att_src, att_dst, bias
    x = torch.randn(n, 5, dtype=torch.float64)
    edge_index = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)])
    torch.testing.assert_close(conv(DenseGraph(src, dst, n), x), pyg(x, edge_index))


class _RecordingGraph(DenseGraph):
    def gat(self, z, s_src, s_dst, **kw):
        self.calls.append(kw)
        return torch.zeros_like(z)


def test_attention_dropout_seed_changes_per_training_call_and_is_off_in_eval():
    torch.manual_seed(2)
    src, dst = random_edges(10, 20, seed=7)
    g = _RecordingGraph(src, dst, 10)
    g.calls = []
    conv = GATConv(3, 2, heads=2, attn_dropout=0.4)
    x = torch.randn(10, 3)
    conv(g, x)
    conv(g, x)
    conv.eval()
    conv(g, x)
    assert [c["attn_dropout"] for c in g.calls] == [0.4, 0.4, 0.0]
    assert g.calls[0]["seed"] != g.calls[1]["seed"]
    torch.manual_seed(2)
    twin = GATConv(3, 2, heads=2, attn_dropout=0.4)  # same global seed -> same per-call seeds (all ranks agree)
    g.calls = []
    twin(g, x)
    assert twin.seed == conv.seed and g.calls[0]["seed"] != 0


def test_unknown_projection_names_the_option():
    with pytest.raises(ValueError, match="model.gat_projection"):
        GATConv(3, 2, projection="tanh")
