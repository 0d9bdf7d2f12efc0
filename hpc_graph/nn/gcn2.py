"""``GCNII``: deep GCN with initial residual and identity mapping (Chen et al., ICML 2020)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import dropout_linear, gcn_propagate_mix


class _IdentityMapReLU(torch.autograd.Function):
    """``h = relu(s ((1 - beta) I + beta W))`` keeping only ``s``, ``W`` and the ReLU mask for the backward pass.

    Written as ``relu(addmm(s, s, W))`` autograd keeps both ``s`` (for ``dW``) and
    the ReLU output ``h`` (for its mask): two float[N, F] tensors per layer, the bulk
    of a deep GCNII's training memory. Here the mask is kept as bool[N, F] (a quarter
    of a float32 tensor)::

        G   = g * (h > 0),   M = (1 - beta) I + beta W
        ds  = G M^T = (1 - beta) G + beta G W^T
        dW  = beta s^T G
    """

    @staticmethod
    def forward(ctx, s, w, beta):
        ctx.beta = beta
        out = torch.addmm(s, s, w, beta=1.0 - beta, alpha=beta).clamp_(min=0.0)
        ctx.save_for_backward(s, w, out > 0)
        return out

    @staticmethod
    def backward(ctx, grad):
        s, w, mask = ctx.saved_tensors
        beta = ctx.beta
        g = grad * mask
        grad_s = torch.addmm(g, g, w.t(), beta=1.0 - beta, alpha=beta) if ctx.needs_input_grad[0] else None
        grad_w = torch.mm(s.t(), g).mul_(beta) if ctx.needs_input_grad[1] else None
        return grad_s, grad_w, None


class GCNII(nn.Module):
    """GCNII node classifier.

    With ``P = D^-1/2 (A + I) D^-1/2`` (``D = in_degree + 1``, see
    :func:`~hpc_graph.nn._propagate.gcn_propagate`)::

        h_0     = relu(dropout(x) W_in + b_in)                                  [N, hidden]
        s_l     = (1 - alpha) P dropout(h_(l-1)) + alpha h_0                    [N, hidden]
        h_l     = relu(s_l ((1 - beta_l) I + beta_l W_l)),  beta_l = log(lambda / l + 1)
        out     = dropout(h_L) W_out + b_out                                    [N, out_dim]

    for ``l = 1 .. L`` (``L = num_layers``); ``W_l`` float[hidden, hidden] without bias
    (Glorot init, as PyG's ``GCN2Conv`` with shared weights). ``beta_l`` shrinks as
    the layers deepen, so a deep stack stays close to the identity map; the
    initial residual ``alpha h_0`` keeps every layer in touch with the input.
    Dropout (probability ``dropout``) falls on the features and on every
    layer's input, never on ``h_0`` inside ``s_l`` (the reference implementation).

    Memory: between forward and backward a layer keeps one float[N, hidden] tensor,
    ``s_l``, and its ReLU mask as bool[N, hidden] (see ``_IdentityMapReLU``); dropout
    keeps no mask, the propagation and the initial-residual mix keep nothing of size
    N x F, and the input and output linear layers keep no dropped copy of their input.

    Message passing: layer ``l`` is ``graph.layer(l - 1)``; its input rows come
    from ``layer_input``, ``h_0`` for its output rows from ``dst`` applied layer
    after layer (the output rows of a block are the first rows of its input,
    and a block appends its extra rows at the end, so ``dst`` of the rows
    carried so far are the rows needed). ``message_passing_layers = num_layers``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_layers: GCNII layers L (the paper uses 64 on Cora).
        alpha: initial-residual weight in [0, 1] (0.1).
        theta: the paper's lambda > 0 (PyG calls it ``theta``; 0.5).
        dropout: feature dropout probability.

    Parameters: ``lin_in`` (Linear in_dim -> hidden), ``weights`` (ParameterList of L
    float[hidden, hidden]), ``lin_out`` (Linear hidden -> out_dim).
    ``forward(graph, x)``: x float[input rows, in_dim] (dense or sparse CSR) -> float[output rows, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 64, alpha: float = 0.1,
                 theta: float = 0.5, dropout: float = 0.6):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers)):
            positive_int(field, value)
        self.alpha = number_in("alpha", alpha, 0.0, 1.0)
        self.theta = number_in("theta", theta, 0.0, None, lo_open=True)
        self.dropout = number_in("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.message_passing_layers = int(num_layers)
        self.lin_in = nn.Linear(in_dim, hidden)
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(hidden, hidden)) for _ in range(num_layers))
        self.lin_out = nn.Linear(hidden, out_dim)
        for w in self.weights:
            glorot_(w)

    def betas(self) -> list[float]:
        """``beta_l = log(lambda / l + 1)`` for ``l = 1 .. L``."""
        return [math.log(self.theta / (layer + 1) + 1.0) for layer in range(len(self.weights))]

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(dropout_linear(x, self.dropout, self.training, self.lin_in.weight, self.lin_in.bias,
                                  graph.row_ids()))
        h0 = h
        for layer, (w, beta) in enumerate(zip(self.weights, self.betas())):
            g = graph.layer(layer)
            h_in = dropout(g.layer_input(h), self.dropout, self.training, g.row_ids())
            h0 = g.dst(h0)
            s = gcn_propagate_mix(g, h_in, h0, self.alpha)  # (1 - alpha) P h + alpha h_0
            h = _IdentityMapReLU.apply(s, w, beta)
        return dropout_linear(h, self.dropout, self.training, self.lin_out.weight, self.lin_out.bias,
                              graph.row_ids(output=True))

    def extra_repr(self) -> str:
        return f"layers={len(self.weights)}, alpha={self.alpha:g}, theta={self.theta:g}, dropout={self.dropout:g}"
