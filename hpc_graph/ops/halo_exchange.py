"""Differentiable halo exchange: fetch the rows of remote nodes that have edges into owned nodes.

Forward: every rank sends ``x[send_lid[q]]`` to each peer ``q`` that needs
rows from it and receives its halo rows from each owner, concatenated in halo
order (ascending owner, ascending global id). Backward: the gradient of each
halo row goes back to its owner, which sums what it receives into the rows it
sent (a node can be in the halo of several peers).

Only peers that share a halo take part; message sizes are known on both sides
from the partition's send/recv plans, so nothing but payload is sent.
"""
from __future__ import annotations

from typing import Any

import torch


def _exchange(comm: Any, sends: dict[int, torch.Tensor], recv_shapes: dict[int, tuple[int, ...]],
              dtype: torch.dtype, device: torch.device) -> dict[int, torch.Tensor]:
    specs = {q: (shape, dtype) for q, shape in recv_shapes.items()}
    return comm.exchange(sends, specs, device=device)


class HaloExchange(torch.autograd.Function):
    """``halo = HaloExchange.apply(x, send_lid, recv_count, comm)``.

    Args:
        x: float[n, *feat] rows of owned nodes.
        send_lid: {peer: int64[s_q]} owned local ids each peer needs (non-empty lists only).
        recv_count: {peer: int} halo rows owned by each peer (non-zero only), ordered by peer.
        comm: communicator with ``exchange(sends, recv_specs)``.
    Returns:
        float[h, *feat] halo rows, grouped by owner in ascending peer order.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, send_lid: dict, recv_count: dict, comm: Any) -> torch.Tensor:
        feat = tuple(x.shape[1:])
        sends = {q: x.index_select(0, lid).contiguous() for q, lid in send_lid.items()}
        got = _exchange(comm, sends, {q: (c, *feat) for q, c in recv_count.items()}, x.dtype, x.device)
        del sends
        ctx.send_lid, ctx.recv_count, ctx.comm = send_lid, recv_count, comm
        ctx.num_rows = x.shape[0]
        peers = sorted(recv_count)
        if not peers:
            return x.new_zeros((0, *feat))
        return torch.cat([got[q] for q in peers], 0)

    @staticmethod
    def backward(ctx, grad_halo: torch.Tensor):
        feat = tuple(grad_halo.shape[1:])
        sends, lo = {}, 0
        for q in sorted(ctx.recv_count):
            c = ctx.recv_count[q]
            sends[q] = grad_halo[lo:lo + c].contiguous()
            lo += c
        got = _exchange(ctx.comm, sends, {q: (lid.shape[0], *feat) for q, lid in ctx.send_lid.items()},
                        grad_halo.dtype, grad_halo.device)
        del sends
        grad_x = grad_halo.new_zeros((ctx.num_rows, *feat))
        for q in sorted(got):
            grad_x.index_add_(0, ctx.send_lid[q], got[q])
        return grad_x, None, None, None


def halo_exchange(x: torch.Tensor, send_lid: dict[int, torch.Tensor], recv_count: dict[int, int],
                  comm: Any) -> torch.Tensor:
    """Halo rows float[h, *feat] of ``x`` float[n, *feat]; differentiable (see :class:`HaloExchange`)."""
    return HaloExchange.apply(x, send_lid, recv_count, comm)
