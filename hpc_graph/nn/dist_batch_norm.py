"""``DistBatchNorm``: batch normalisation over the rows of ALL ranks (SAR's distributed BatchNorm)."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext


class DistBatchNorm(nn.Module):
    """BatchNorm over node rows spread across ranks; equals ``torch.nn.BatchNorm1d`` on one process.

    Training: each rank sums ``x - K`` and ``(x - K)^2`` over its rows, with the
    shift ``K = running_mean`` (identical on all ranks; it keeps the one-pass
    variance accurate once the running mean has settled), sums accumulated in
    float64 for float32/16 inputs (so ``E[x^2] - mean^2`` does not cancel
    catastrophically before that), and ONE differentiable all-reduce
    (``graph.all_reduce_sum``) of ``[sum, sum of squares, row count]`` gives the
    global mean and biased variance. The backward pass of that all-reduce sums
    the gradients of the statistics over ranks, so each rank's rows receive
    exactly the gradient they would get on one process: only ``3F`` numbers
    (plus the count) cross the network, in each direction.

    Running statistics (unbiased variance, as BatchNorm1d) are updated from the
    global statistics, so they stay identical on every rank; evaluation uses them.

    Args:
        num_features: F.
        eps: added to the variance.
        momentum: running-average factor; ``None`` for a cumulative average.
        affine: learnable ``weight``/``bias`` float[F].

    ``forward(graph, x)``: x float[num_nodes, F] -> float[num_nodes, F].
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def reset_running_stats(self) -> None:
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.num_batches_tracked.zero_()

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        f = self.num_features
        if x.dim() != 2 or x.shape[1] != f:
            raise ValueError(f"DistBatchNorm: expected input [num_nodes, {f}], got {tuple(x.shape)}")
        if self.training:
            shift = self.running_mean.detach().to(x.dtype).clone()
            xc = x - shift
            acc = torch.float64 if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x.dtype
            count = torch.full((1,), float(x.shape[0]), dtype=acc, device=x.device)
            stats = graph.all_reduce_sum(torch.cat([xc.sum(0, dtype=acc), (xc * xc).sum(0, dtype=acc), count]))
            # a shape-only (meta) step has no count to read: its own rows stand in, nothing depends on the value
            n = float(x.shape[0]) if stats.is_meta else float(stats[2 * f].detach())
            if n <= 1:
                raise ValueError(f"DistBatchNorm: need more than 1 row over all ranks when training, got {n:g}")
            m = stats[:f] / n
            var = (stats[f:2 * f] / n - m * m).clamp_min(0.0).to(x.dtype)
            mean = shift + m.to(x.dtype)
            with torch.no_grad():
                self.num_batches_tracked += 1
                factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                          else float(self.momentum))
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_((var.detach() * (n / (n - 1))).to(self.running_var.dtype),
                                                       alpha=factor)
        else:
            mean = self.running_mean.to(x.dtype)
            var = self.running_var.to(x.dtype)
        out = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            out = out * self.weight + self.bias
        return out

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.weight is not None}"
