"""``dropout``: feature dropout as one kernel pass, with nothing saved for the backward pass.

The mask is a counter-based hash of (key, element index)
(:mod:`numba_kernels.cpu.dropout`): the forward pass writes ``x * scale`` or 0
in one pass, and the backward pass redraws the same mask from the key to
compute ``grad * scale`` or 0. Nothing of size N x F is kept (``torch``'s
dropout keeps its mask; a bool mask is N x F bytes). The key is drawn from
torch's default generator, so ``torch.manual_seed`` makes runs reproducible.
"""
from __future__ import annotations

import torch

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import empty, kernel

_LEVELS = 1 << 16


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key, cut, scale):
        x = x.contiguous()
        out = empty(tuple(x.shape), x.dtype, x.device)
        kernel("dropout.dropout_apply", x)(as_array(x.view(-1)), key, cut, scale, as_array(out.view(-1)))
        ctx.key, ctx.cut, ctx.scale = key, cut, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = empty(tuple(grad.shape), grad.dtype, grad.device)
        kernel("dropout.dropout_apply", grad)(as_array(grad.view(-1)), ctx.key, ctx.cut, ctx.scale,
                                              as_array(out.view(-1)))
        return out, None, None, None


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Zero each element of ``x`` float[...] with probability ``round(p * 65536) / 65536`` and scale the
    rest by the inverse keep probability (so the expectation is exact); differentiable in ``x``."""
    cut = int(round(p * _LEVELS))
    keep = 1.0 - cut / _LEVELS
    key = int(torch.randint(0, 2**62, (1,)).item())
    return _Dropout.apply(x, key, cut, 1.0 / keep)


def activation(x: torch.Tensor, act: str | None) -> torch.Tensor:
    """``act(x)`` with autograd: ``act`` None (``x`` itself), ``"relu"`` or ``"elu"``."""
    from torch.nn import functional as F

    if act == "relu":
        return F.relu(x)
    if act == "elu":
        return F.elu(x)
    if act is not None:
        raise ValueError(f"act: must be None, 'relu' or 'elu', got {act!r}")
    return x


def act_dropout(x: torch.Tensor, act: str | None, p: float) -> torch.Tensor:
    """``dropout(act(x), p)`` step by step for a dense float ``x`` (``act`` None, ``"relu"`` or ``"elu"``): the
    masks and values the fused ops (:func:`hpc_graph.ops.dropout_linear.mask_params`) draw, with autograd."""
    x = activation(x, act)
    return dropout(x, p) if p > 0 else x
