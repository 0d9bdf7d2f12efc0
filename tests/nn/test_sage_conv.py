"""SAGEConv vs mean aggregation written densely, and vs PyG's SAGEConv."""
import pytest
import torch
from _graphs import DenseGraph, dense_adjacency, random_edges

from hpc_graph.nn import SAGEConv


def _reference(src, dst, n, x, conv):
    a = dense_adjacency(src, dst, n)
    mean = a @ x / a.sum(1).clamp_min(1)[:, None]  # isolated nodes aggregate to 0
    out = mean @ conv.lin_l.weight.t() + conv.lin_l.bias
    if conv.lin_r is not None:
        out = out + x @ conv.lin_r.weight.t()
    return out


@pytest.mark.parametrize("fin,fout", [(7, 5), (4, 9)])  # project-then-aggregate and aggregate-then-project
@pytest.mark.parametrize("root_weight", [True, False])
def test_forward_and_grads_match_dense_mean(fin, fout, root_weight):
    torch.manual_seed(0)
    n = 40
    src, dst = random_edges(n, 150, seed=3)
    conv = SAGEConv(fin, fout, root_weight=root_weight).double()
    x = torch.randn(n, fin, dtype=torch.float64, requires_grad=True)
    out = conv(DenseGraph(src, dst, n), x)
    ref_conv = SAGEConv(fin, fout, root_weight=root_weight).double()
    ref_conv.load_state_dict(conv.state_dict())
    xr = x.detach().clone().requires_grad_()
    ref = _reference(src, dst, n, xr, ref_conv)
    torch.testing.assert_close(out, ref)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    for (name, p), (_, q) in zip(conv.named_parameters(), ref_conv.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("fin,fout", [(6, 4), (3, 8)])
def test_matches_pyg_with_same_weights(fin, fout):
    from torch_geometric.nn import SAGEConv as PyGSAGEConv
    torch.manual_seed(1)
    n = 30
    src, dst = random_edges(n, 100, seed=4)
    conv = SAGEConv(fin, fout).double()
    pyg = PyGSAGEConv(fin, fout).double()
    pyg.load_state_dict(conv.state_dict())  # same parameter names: lin_l.*, lin_r.weight
    x = torch.randn(n, fin, dtype=torch.float64)
    edge_index = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)])
    torch.testing.assert_close(conv(DenseGraph(src, dst, n), x), pyg(x, edge_index))


class DenseBlock(DenseGraph):
    """A sampled block as plain torch: ``num_src`` input rows, the first ``num_dst`` of them the outputs."""

    def __init__(self, src, dst, num_src: int, num_dst: int):
        super().__init__(src, dst, num_src)
        self.num_dst = num_dst
        self.adj = self.adj[:num_dst]

    def dst(self, t):
        return t[:self.num_dst]


@pytest.mark.parametrize("fin,fout", [(8, 8), (7, 5), (4, 9)])
def test_on_a_block_matches_dense_mean_and_multiplies_destination_rows_at_equal_widths(fin, fout):
    """On a block (more input rows than outputs) every width order is exact, and with equal widths the
    projection ``lin_l`` runs on the aggregated destination rows, not on the sources (several times as many)."""
    torch.manual_seed(2)
    n_src, n_dst = 50, 9
    src, dst = random_edges(n_src, 160, seed=5, isolated=0)
    keep = dst < n_dst
    src, dst = src[keep], dst[keep]
    conv = SAGEConv(fin, fout).double()
    rows = []
    conv.lin_l.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
    x = torch.randn(n_src, fin, dtype=torch.float64, requires_grad=True)
    out = conv(DenseBlock(src, dst, n_src, n_dst), x)
    a = dense_adjacency(src, dst, n_src)[:n_dst]
    xr = x.detach().clone().requires_grad_()
    ref = (a @ xr / a.sum(1).clamp_min(1)[:, None]) @ conv.lin_l.weight.t() + conv.lin_l.bias \
        + xr[:n_dst] @ conv.lin_r.weight.t()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    assert rows == ([] if fout < fin else [n_dst])  # narrower outputs: projected first (fewer rows gathered)
