"""DistBatchNorm on one process equals torch.nn.BatchNorm1d (forward, gradients, running statistics)."""
import pytest
import torch
from _graphs import DenseGraph

from hpc_graph.nn import DistBatchNorm


class _SplitSumGraph(DenseGraph):
    """Counts the all-reduce calls (one per training forward is the contract)."""

    def __init__(self):
        self.calls = 0

    def all_reduce_sum(self, t):
        self.calls += 1
        return t


@pytest.mark.parametrize("momentum", [0.1, None])
def test_matches_batchnorm1d(momentum):
    torch.manual_seed(0)
    f = 6
    ours = DistBatchNorm(f, eps=1e-5, momentum=momentum).double()
    ref = torch.nn.BatchNorm1d(f, eps=1e-5, momentum=momentum).double()
    with torch.no_grad():
        for m in (ours, ref):
            m.weight.copy_(torch.linspace(0.5, 2.0, f))
            m.bias.copy_(torch.linspace(-1.0, 1.0, f))
    g = _SplitSumGraph()
    for step in range(4):  # several steps: the shift (running mean) is non-zero after the first
        x = (torch.randn(50, f, dtype=torch.float64) * 3 + 10).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        out, exp = ours(g, x), ref(xr)
        torch.testing.assert_close(out, exp)
        r = torch.randn_like(out)
        (out * r).sum().backward()
        (exp * r).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad)
        torch.testing.assert_close(ours.running_mean, ref.running_mean)
        torch.testing.assert_close(ours.running_var, ref.running_var)
    assert g.calls == 4
    ours.eval()
    ref.eval()
    x = torch.randn(20, f, dtype=torch.float64)
    torch.testing.assert_close(ours(g, x), ref(x))
    assert g.calls == 4  # eval uses running statistics, no communication


def test_float32_with_large_mean_stays_accurate():
    """Mean 300, std 0.5: a float32 one-pass variance would cancel catastrophically on the first step."""
    torch.manual_seed(3)
    x = torch.randn(1000, 16, dtype=torch.float64) * 0.5 + 300
    ref = torch.nn.BatchNorm1d(16).double()
    ours = DistBatchNorm(16)
    g = _SplitSumGraph()
    for _ in range(2):
        out = ours(g, x.float())
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), ref(x), rtol=0, atol=2e-3)
    torch.testing.assert_close(ours.running_var.double(), ref.running_var, rtol=1e-3, atol=0)


def test_single_row_rejected_when_training():
    with pytest.raises(ValueError, match="more than 1 row"):
        DistBatchNorm(3)(_SplitSumGraph(), torch.randn(1, 3))


def test_two_rank_split_equals_whole_batch():
    """Two simulated ranks (threads) each normalise their rows with statistics summed over both.

    Rank r's all-reduce returns ``S_r = t_0 + t_1``; with one backward over both ranks' losses,
    ``t_r`` receives the gradients of ``S_0`` and ``S_1`` summed: exactly an all-reduce's backward.
    Outputs, input gradients, parameter gradients (summed over ranks) and running statistics
    must equal BatchNorm1d on the whole batch.
    """
    import threading
    torch.manual_seed(1)
    f, split = 4, 11
    ref = torch.nn.BatchNorm1d(f).double()
    bns = [DistBatchNorm(f).double() for _ in range(2)]
    barrier = threading.Barrier(2)
    for step in range(3):
        x = torch.randn(30, f, dtype=torch.float64) * 2 + 5
        r = torch.randn(30, f, dtype=torch.float64)
        xr = x.clone().requires_grad_()
        exp = ref(xr)
        (exp * r).sum().backward()
        parts = [x[:split].clone().requires_grad_(), x[split:].clone().requires_grad_()]
        sent, outs = [None, None], [None, None]

        class _Rank(DenseGraph):
            def __init__(self, rank):
                self.rank = rank

            def all_reduce_sum(self, t):
                sent[self.rank] = t
                barrier.wait()
                return sent[0] + sent[1]

        def run(rank):
            outs[rank] = bns[rank](_Rank(rank), parts[rank])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loss = (outs[0] * r[:split]).sum() + (outs[1] * r[split:]).sum()
        loss.backward()
        torch.testing.assert_close(torch.cat(outs), exp)
        torch.testing.assert_close(torch.cat([p.grad for p in parts]), xr.grad)
        torch.testing.assert_close(bns[0].weight.grad + bns[1].weight.grad, ref.weight.grad)
        torch.testing.assert_close(bns[0].bias.grad + bns[1].bias.grad, ref.bias.grad)
        for bn in bns:
            torch.testing.assert_close(bn.running_mean, ref.running_mean)
            torch.testing.assert_close(bn.running_var, ref.running_var)
            bn.zero_grad()
        ref.zero_grad()
