"""Differentiable all-reduce (sum over ranks), for global statistics such as DistBatchNorm's mean.

``y = sum_r t_r`` on every rank, so ``dL/dt_r = sum_s dL_s/dy_s``: the backward
pass all-reduces the incoming gradient as well.
"""
from __future__ import annotations

from typing import Any

import torch


class AllReduceSum(torch.autograd.Function):
    """``AllReduceSum.apply(t, comm)``: float tensor of any shape, summed over all ranks."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, comm: Any) -> torch.Tensor:
        ctx.comm = comm
        out = t.detach().clone().contiguous()
        comm.allreduce_(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        g = grad.detach().clone().contiguous()
        ctx.comm.allreduce_(g)
        return g, None


def all_reduce_sum(t: torch.Tensor, comm: Any) -> torch.Tensor:
    """Sum of ``t`` over all ranks of ``comm`` (differentiable; identity when ``comm.size == 1``)."""
    if comm is None or int(comm.size) == 1:
        return t
    return AllReduceSum.apply(t, comm)
