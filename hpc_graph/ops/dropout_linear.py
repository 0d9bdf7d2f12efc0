"""``dropout_linear``: ``dropout(x) W^T + b`` that keeps only ``x`` (no dropped copy) for the backward pass.

``linear(dropout(x))`` written with two autograd nodes keeps the dropped
input ``dropout(x)`` float[N, F_in] alive until the backward pass (the weight
gradient needs it), on top of ``x`` itself, which usually stays alive anyway
(input features, or a ReLU output that the ReLU node already keeps). Here the
dropout mask is the counter-based hash of :mod:`hpc_graph.ops.dropout` (same
key, same elements dropped): the backward pass redraws ``dropout(x)`` from
``x`` and the key, so the only extra memory between forward and backward is
nothing at all (``x`` is referenced, not copied)::

    y       = dropout(x) W^T + b                      float[N, F_out]
    dW      = g^T dropout(x)                          float[F_out, F_in]
    db      = sum_rows g                              float[F_out]
    dx      = dropout_mask(g W)  (same mask, same scale)

The cost is one extra dropout pass over ``x`` in the backward pass.
"""
from __future__ import annotations

import torch

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import empty, kernel

_LEVELS = 1 << 16


def _apply_mask(t: torch.Tensor, key: int, cut: int, scale: float) -> torch.Tensor:
    """The dropout of ``t`` with the mask of ``key`` (``t * scale`` where kept, else 0), as a new tensor."""
    t = t.contiguous()
    out = empty(tuple(t.shape), t.dtype, t.device)
    kernel("dropout.dropout_apply", t)(as_array(t.view(-1)), key, cut, scale, as_array(out.view(-1)))
    return out


class _DropoutLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, key, cut, scale):
        xd = _apply_mask(x, key, cut, scale)
        out = torch.addmm(bias, xd, weight.t()) if bias is not None else xd @ weight.t()
        ctx.key, ctx.cut, ctx.scale = key, cut, scale
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _apply_mask(grad @ weight, ctx.key, ctx.cut, ctx.scale)
        if ctx.needs_input_grad[1]:
            grad_w = grad.t() @ _apply_mask(x, ctx.key, ctx.cut, ctx.scale)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b, None, None, None


def dropout_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, p: float) -> torch.Tensor:
    """``dropout(x, p) @ weight.T + bias`` in training mode, saving only ``x`` for the backward pass.

    Args:
        x: float32/float64 [N, F_in], dense.
        weight: [F_out, F_in], same dtype and device.
        bias: [F_out] or None.
        p: drop probability in [0, 1); elements are dropped with probability
            ``round(p * 65536) / 65536`` and kept ones scaled by the inverse keep
            probability, exactly as :func:`hpc_graph.ops.dropout.dropout` (whose key
            is drawn the same way, from torch's default generator).
    Returns:
        float[N, F_out], differentiable in ``x``, ``weight`` and ``bias``.
    """
    if x.layout != torch.strided or x.dim() != 2:
        raise ValueError(f"dropout_linear: x must be a dense [N, F_in] tensor, got {x.layout} of shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dropout_linear: x dtype must be float32 or float64, got {x.dtype}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_linear: p must be in [0, 1), got {p}")
    cut = int(round(p * _LEVELS))
    keep = 1.0 - cut / _LEVELS
    key = int(torch.randint(0, 2**62, (1,)).item())
    return _DropoutLinear.apply(x, weight, bias, key, cut, 1.0 / keep)
