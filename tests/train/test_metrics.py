"""``SavedBytes``: the bytes autograd keeps for the backward pass, against what the operations must save."""
import torch

from hpc_graph.train.metrics import SavedBytes


def test_counts_saved_tensors_once_and_skips_parameters():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(7, 5, dtype=torch.float64))
    x = torch.randn(11, 7, dtype=torch.float64, requires_grad=True)
    with SavedBytes([w]) as saved:
        y = x @ w          # saves x and w (w excluded)
        z = y.sigmoid()    # saves its output z
        loss = (z * z).sum()  # saves z (same storage: counted once)
    assert saved.bytes == x.numel() * 8 + z.numel() * 8
    loss.backward()  # the hooks hand the tensors back unchanged
    want = torch.autograd.grad((torch.sigmoid(x.detach().requires_grad_() @ w) ** 2).sum(), w)[0]
    torch.testing.assert_close(w.grad, want)


def test_nothing_is_counted_without_autograd():
    x = torch.randn(4, 4, requires_grad=True)
    with torch.no_grad(), SavedBytes() as saved:
        (x @ x).relu()
    assert saved.bytes == 0
