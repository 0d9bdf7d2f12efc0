"""``GCNII``: deep GCN with initial residual and identity mapping (Chen et al., ICML 2020)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import gcn_propagate


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
        h = F.relu(linear(dropout(x, self.dropout, self.training), self.lin_in.weight, self.lin_in.bias))
        h0 = h
        for layer, (w, beta) in enumerate(zip(self.weights, self.betas())):
            g = graph.layer(layer)
            h_in = dropout(g.layer_input(h), self.dropout, self.training)
            h0 = g.dst(h0)
            s = torch.lerp(gcn_propagate(g, h_in), h0, self.alpha)  # (1 - alpha) P h + alpha h_0
            h = F.relu(torch.addmm(s, s, w, beta=1.0 - beta, alpha=beta))
        h = dropout(h, self.dropout, self.training)
        return linear(h, self.lin_out.weight, self.lin_out.bias)

    def extra_repr(self) -> str:
        return f"layers={len(self.weights)}, alpha={self.alpha:g}, theta={self.theta:g}, dropout={self.dropout:g}"
