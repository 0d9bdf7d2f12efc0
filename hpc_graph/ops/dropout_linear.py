"""``dropout_linear``: ``dropout(act(x)) W^T + b`` that keeps only ``x`` for the backward pass.

``linear(dropout(relu(x)))`` written with three autograd nodes keeps, until
the backward pass, the ReLU output (for the ReLU's gradient) and the dropped
copy (for the weight gradient), each float[N, F_in], on top of ``x``, which
usually stays alive anyway (input features, or a convolution's output). Here
the activation and the dropout mask (the counter-based hash of
:mod:`hpc_graph.ops.dropout`: same key, same elements dropped) are recomputed
from ``x`` in the backward pass, so nothing N x F_in is kept but ``x`` itself
(referenced, not copied)::

    a       = dropout(act(x))                          float[N, F_in] (transient)
    y_k     = a W_k^T + b_k                            float[N, F_out_k], one per weight
    dW_k    = g_k^T a                                  float[F_out_k, F_in]
    db_k    = sum_rows g_k                             float[F_out_k]
    dx      = mask * scale * act'(x) * sum_k g_k W_k   float[N, F_in]

``act`` is ``None``, ``"relu"`` (fused into the mask kernel) or ``"elu"`` (torch's vectorised ELU, then
the mask kernel in place; its derivative from ``x`` by torch's ``elu_backward``). Several weights share one input (e.g.
SAGE's neighbour and root projections): ``a`` is built once per pass. The
cost is one extra activation-dropout pass over ``x`` in the backward pass.
``ids`` (int64[N], optional) keys the mask on the rows' dataset ids, as for
:func:`hpc_graph.ops.dropout.dropout`.
"""
from __future__ import annotations

import torch

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import empty, kernel
from hpc_graph.ops.dropout import apply_mask, draw_key, row_ids

_LEVELS = 1 << 16
ACTS = {None: 0, "relu": 1, "elu": 2}
_ELU = 2


def mask_params(p: float, act: str | None, ids: torch.Tensor | None = None
                ) -> tuple[int, int, float, int, torch.Tensor | None] | None:
    """``(key, cut, scale, act code, ids)`` of ``dropout(act(x), p)`` (the key drawn from torch's default
    generator, as :func:`hpc_graph.ops.dropout.dropout` draws it, only when something is dropped; ``ids`` the
    rows' ids keying the mask, or None), or None for the identity (no activation, ``p`` 0): the arguments of
    :func:`act_mask` and :func:`act_mask_grad` after the tensors."""
    if act not in ACTS:
        raise ValueError(f"act: must be one of {', '.join(map(repr, ACTS))}, got {act!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    cut = int(round(p * _LEVELS))
    if cut == 0 and act is None:
        return None
    key = draw_key() if cut else 0
    return key, cut, 1.0 / (1.0 - cut / _LEVELS), ACTS[act], ids


def act_mask(t: torch.Tensor, key: int, cut: int, scale: float, act: int,
             ids: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(act(t))`` with the mask of ``key`` and ``ids`` (``act(t) * scale`` where kept, else 0), as a
    new tensor."""
    t = t.contiguous()
    if act == _ELU:
        out = torch.nn.functional.elu(t)
        return apply_mask(out, key, cut, scale, out, ids) if cut else out
    out = empty(tuple(t.shape), t.dtype, t.device)
    if act == 0:
        return apply_mask(t, key, cut, scale, out, ids)
    kernel("dropout.act_dropout_apply", t)(as_array(t.view(-1)), key, cut, scale, act, as_array(out.view(-1)),
                                           ids=as_array(ids))
    return out


def act_mask_grad(x: torch.Tensor, g: torch.Tensor, key: int, cut: int, scale: float, act: int,
                  ids: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient through ``dropout(act(x))`` of the gradient ``g`` of its output (written over ``g``; ELU: a
    new tensor)."""
    g = g.contiguous()
    if act == _ELU:
        if cut:
            apply_mask(g, key, cut, scale, g, ids)
        return torch.ops.aten.elu_backward(g, 1.0, 1, 1, False, x.contiguous())
    if act == 0:
        return apply_mask(g, key, cut, scale, g, ids)
    kernel("dropout.act_dropout_grad", g)(as_array(x.contiguous().view(-1)), as_array(g.view(-1)), key, cut,
                                          scale, act, as_array(g.view(-1)), ids=as_array(ids))
    return g


class _DropoutLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key, cut, scale, act, n, row_scale, ids, *params):
        weights, biases = params[:n], params[n:]
        a = act_mask(x, key, cut, scale, act, ids)
        outs = tuple(torch.addmm(b, a, w.t()) if b is not None else a @ w.t() for w, b in zip(weights, biases))
        del a
        if row_scale is not None:
            for o in outs:
                o.mul_(row_scale)
        ctx.row_scale = row_scale
        ctx.key, ctx.cut, ctx.scale, ctx.act, ctx.n, ctx.ids = key, cut, scale, act, n, ids
        ctx.has_bias = tuple(b is not None for b in biases)
        ctx.save_for_backward(x, *weights)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        # Ordered for the smallest peak: the recomputed ``a`` lives (and dies) before ``grad_x`` exists, and
        # the row scale is folded into ``a`` and into ``grad_x`` in place, never into a copy of a gradient
        # (``(g * s) @ W = s * (g @ W)`` and ``(g * s)^T a = g^T (s * a)`` for a row scale ``s``).
        x, *weights = ctx.saved_tensors
        n = ctx.n
        rs = ctx.row_scale
        need_w = [ctx.needs_input_grad[8 + k] and grads[k] is not None for k in range(n)]
        need_b = [ctx.has_bias[k] and ctx.needs_input_grad[8 + n + k] and grads[k] is not None for k in range(n)]
        grad_ws, grad_bs = [None] * n, [None] * n
        if any(need_w):
            a = act_mask(x, ctx.key, ctx.cut, ctx.scale, ctx.act, ctx.ids)
            if rs is not None:
                a.mul_(rs)
            for k in range(n):
                if need_w[k]:
                    grad_ws[k] = grads[k].t() @ a
            del a
        for k in range(n):
            if need_b[k]:
                grad_bs[k] = grads[k].sum(0) if rs is None else grads[k].t() @ rs.view(-1)
        grad_x = None
        if ctx.needs_input_grad[0]:
            for g, w in zip(grads, weights):
                if g is None:
                    continue
                grad_x = g @ w if grad_x is None else grad_x.addmm_(g, w)
            if grad_x is not None:
                if rs is not None:
                    grad_x.mul_(rs)
                grad_x = act_mask_grad(x, grad_x, ctx.key, ctx.cut, ctx.scale, ctx.act, ctx.ids)
        return (grad_x, None, None, None, None, None, None, None, *grad_ws, *grad_bs)


def _check(x: torch.Tensor, p: float, act: str | None) -> None:
    if x.layout != torch.strided or x.dim() != 2:
        raise ValueError(f"dropout_linear: x must be a dense [N, F_in] tensor, got {x.layout} of shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dropout_linear: x dtype must be float32 or float64, got {x.dtype}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_linear: p must be in [0, 1), got {p}")
    if act not in ACTS:
        raise ValueError(f"dropout_linear: act must be one of {', '.join(map(repr, ACTS))}, got {act!r}")


def dropout_linear_multi(x: torch.Tensor, weights, biases, p: float, act: str | None = None,
                         row_scale: torch.Tensor | None = None,
                         ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``a = dropout(act(x), p)``; ``((a @ weights[k].T + biases[k]) * row_scale for k)``, saving only ``x``.

    Args:
        x: float32/float64 [N, F_in], dense.
        weights: sequence of [F_out_k, F_in], same dtype and device.
        biases: sequence (same length) of [F_out_k] or None.
        p: drop probability in [0, 1); elements are dropped with probability
            ``round(p * 65536) / 65536`` and kept ones scaled by the inverse keep
            probability, exactly as :func:`hpc_graph.ops.dropout.dropout` (whose key
            is drawn the same way, from torch's default generator).
        act: ``None``, ``"relu"`` or ``"elu"``, applied before the dropout.
        row_scale: optional float[N, 1] constant (no gradient) multiplying every output row
            (GCN's ``deg^-1/2``), applied in place inside the node.
        ids: int64[N] row ids keying the mask (:func:`hpc_graph.ops.dropout.dropout`), or None.
    Returns:
        tuple of float[N, F_out_k], differentiable in ``x``, the weights and the biases.
    """
    _check(x, p, act)
    weights, biases = tuple(weights), tuple(biases)
    if len(weights) != len(biases) or not weights:
        raise ValueError(f"dropout_linear: {len(weights)} weights and {len(biases)} biases")
    ids = row_ids(ids, x, "dropout_linear")
    key, cut, scale, code, _ = mask_params(p, act) or (0, 0, 1.0, 0, None)  # p = 0 draws nothing, as dropout does
    if row_scale is not None and (row_scale.requires_grad or row_scale.shape != (x.shape[0], 1)):
        raise ValueError(f"dropout_linear: row_scale must be a constant [N, 1] = [{x.shape[0]}, 1], got "
                         f"{tuple(row_scale.shape)}{' requiring grad' if row_scale.requires_grad else ''}")
    return _DropoutLinear.apply(x, key, cut, scale, code, len(weights), row_scale, ids, *weights, *biases)


def dropout_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, p: float,
                   act: str | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(act(x), p) @ weight.T + bias`` in training mode, saving only ``x`` (see :func:`dropout_linear_multi`).

    Returns float[N, F_out].
    """
    return dropout_linear_multi(x, (weight,), (bias,), p, act, ids=ids)[0]
