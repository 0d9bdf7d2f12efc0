"""``shuffle_rows``: a differentiable personalised all-to-all of rows (the ``apt`` strategies' shuffles).

Forward: rows of ``x`` go to their ranks (``send_counts[q]`` rows to rank ``q``,
rank 0's first) and the rows from every rank come back in rank order. Backward:
the gradient of every received row returns to the rank that sent it. Every rank
must call it at the same point of its forward pass (it is collective), and the
backward passes then meet in the same order on every rank.

Byte counts (payload only, the rank's own rows excluded) are added to
``counter[op]`` in the forward pass and ``counter[op + "_bwd"]`` in the backward pass.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


class _Shuffle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, send_counts: np.ndarray, comm: Any, counter: dict | None, op: str):
        b0 = comm.bytes_sent
        recv, recv_counts = comm.alltoallv(x.contiguous(), send_counts)
        if counter is not None:
            counter[op] = counter.get(op, 0) + int(comm.bytes_sent - b0)
        ctx.comm, ctx.counter, ctx.op, ctx.recv_counts = comm, counter, op, recv_counts
        return recv

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm = ctx.comm
        b0 = comm.bytes_sent
        back, _ = comm.alltoallv(grad.contiguous(), ctx.recv_counts)
        if ctx.counter is not None:
            key = ctx.op + "_bwd"
            ctx.counter[key] = ctx.counter.get(key, 0) + int(comm.bytes_sent - b0)
        return back, None, None, None, None


def shuffle_rows(x: torch.Tensor, send_counts: np.ndarray, comm: Any, counter: dict | None = None,
                 op: str = "shuffle") -> torch.Tensor:
    """Rows ``x`` [sum(send_counts), ...] to their ranks; returns the rows received, rank 0's first.

    Differentiable in ``x`` (collective in both passes). ``counter``: a dict that gains the bytes sent.
    """
    counts = np.asarray(send_counts, dtype=np.int64)
    if comm.size == 1:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _Shuffle.apply(x, counts, comm, counter, op)
    with torch.no_grad():
        b0 = comm.bytes_sent
        recv, _ = comm.alltoallv(x.contiguous(), counts)
        if counter is not None:
            counter[op] = counter.get(op, 0) + int(comm.bytes_sent - b0)
        return recv
