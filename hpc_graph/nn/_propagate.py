"""Parameter-free pieces shared by the deep models (private): GCN propagation and a plain MLP.

``gcn_propagate(g, z)`` is one message-passing step ``P z`` with the GCN
matrix ``P = D^-1/2 (A + I) D^-1/2``, ``D = in_degree + 1`` (the whole graph's
in-degree, self loop added), as :class:`~hpc_graph.nn.gcn_conv.GCNConv`
computes it: rows are scaled by ``deg^-1/2`` *before* the aggregation, so a
halo copy of a row arrives already scaled by its owner and no halo degrees
are needed; the self loop is the node's own (``g.dst``) row.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._linear import input_linear


def gcn_propagate(g: GraphContext, z: torch.Tensor) -> torch.Tensor:
    """``P z`` on the layer context ``g``.

    Args:
        g: one message-passing layer's context (``graph.layer(l)``).
        z: float[input rows of ``g``, F], dense (already completed by ``g.layer_input``).
    Returns:
        float[output rows of ``g``, F]: ``out_i = d_i^-1/2 (sum_{j->i} d_j^-1/2 z_j + d_i^-1/2 z_i)``.
    """
    dinv = (g.in_degree().to(device=z.device, dtype=z.dtype) + 1.0).rsqrt().unsqueeze(1)
    scaled = z * dinv
    return (g.aggregate(scaled, "sum") + g.dst(scaled)) * g.dst(dinv)


class _GCNMix(torch.autograd.Function):
    """``out = c * (agg + self_rows) + alpha * h0 + bias`` with one new [N, F] tensor (the rest in place).

    ``c`` float[N, 1] (no gradient; None: 1); ``h0`` and ``bias`` [F] may be None. Backward:
    ``d agg = d self_rows = c * g`` (one tensor for both), ``d h0 = alpha * g``,
    ``d bias = sum_rows g``. Nothing of size N x F is saved.
    """

    @staticmethod
    def forward(ctx, agg, self_rows, h0, c, alpha, bias):
        out = torch.add(agg, self_rows)
        if c is not None:
            out.mul_(c)
        if h0 is not None:
            out.add_(h0, alpha=alpha)
        if bias is not None:
            out.add_(bias)
        ctx.alpha = alpha
        ctx.save_for_backward(c)
        return out

    @staticmethod
    def backward(ctx, grad):
        (c,) = ctx.saved_tensors
        t = grad * c if c is not None else grad
        grad_h0 = grad * ctx.alpha if ctx.needs_input_grad[2] else None
        grad_b = grad.sum(0) if ctx.needs_input_grad[5] else None
        return t, t, grad_h0, None, None, grad_b


def gcn_propagate_mix(g: GraphContext, z: torch.Tensor, h0: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(1 - alpha) P z + alpha h0`` on the layer context ``g`` (GCNII's and APPNP's step).

    Args:
        g: one message-passing layer's context (``graph.layer(l)``).
        z: float[input rows of ``g``, F], dense (already completed by ``g.layer_input``).
        h0: float[output rows of ``g``, F] (already cut by ``g.dst``).
        alpha: weight in [0, 1].
    Returns:
        float[output rows of ``g``, F]: ``(1 - alpha) d_i^-1/2 (sum_{j->i} d_j^-1/2 z_j + d_i^-1/2 z_i)
        + alpha h0_i``, the same value as ``torch.lerp(gcn_propagate(g, z), h0, alpha)`` with fewer
        N x F temporaries (the scaling, self loop and mixing after the aggregation are one autograd node).
    """
    dinv = (g.in_degree().to(device=z.device, dtype=z.dtype) + 1.0).rsqrt().unsqueeze(1)
    scaled = z * dinv
    c = g.dst(dinv) * (1.0 - alpha)
    return _GCNMix.apply(g.aggregate(scaled, "sum"), g.dst(scaled), h0, c, float(alpha), None)


def dropout_linear(x: torch.Tensor, p: float, training: bool, weight: torch.Tensor,
                   bias: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(dropout(x, p, training), weight, bias)``; x float[N, F_in] (dense or sparse CSR) -> float[N, F_out].

    :func:`~hpc_graph.nn._linear.input_linear` with one weight: in training with a dense float
    input the two run as one autograd node that keeps only ``x``, not the dropped copy. ``ids``: the rows'
    dataset ids keying the dropout mask (``GraphContext.row_ids``), or None.
    """
    return input_linear(x, (weight,), (bias,), None, p if training else 0.0, ids=ids)[0]


def as_dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a strided tensor (aggregation takes dense rows); sparse CSR features are densified."""
    return x if x.layout == torch.strided else x.to_dense()


class MLP(nn.Module):
    """``num_layers`` linear layers, ReLU between them, dropout before each (input features included).

    Widths ``in_dim -> hidden -> ... -> hidden -> out_dim`` (one layer: ``in_dim -> out_dim``);
    ``lins[i]`` are ``torch.nn.Linear`` (default init). ``forward(x, ids=None)``: float[N, in_dim]
    (dense or sparse CSR) -> float[N, out_dim]; ``ids`` the rows' dataset ids keying the dropout masks
    (``GraphContext.row_ids``). Row-wise: it never touches the graph.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int, p: float):
        super().__init__()
        widths = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.p = float(p)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        h = x
        last = len(self.lins) - 1
        for i, lin in enumerate(self.lins):
            h = dropout_linear(h, self.p, self.training, lin.weight, lin.bias, ids)
            if i != last:
                h = F.relu(h)
        return h
