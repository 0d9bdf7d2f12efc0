"""``APPNP``: predict, then propagate with personalised PageRank (Klicpera et al., ICLR 2019)."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import MLP, gcn_propagate_mix


class APPNP(nn.Module):
    """An MLP's predictions smoothed by K steps of approximate personalised PageRank.

    With ``P = D^-1/2 (A + I) D^-1/2`` (``D = in_degree + 1``)::

        h   = MLP(x)                                    float[N, out_dim]
        z_0 = h
        z_k = (1 - alpha) P z_(k-1) + alpha h           k = 1 .. K
        out = z_K                                       float[N, out_dim]

    The MLP (:class:`~hpc_graph.nn._propagate.MLP`) has ``num_layers`` linear
    layers, ReLU between them and dropout before each; the propagation has no
    parameters (and, unlike the paper, no dropout on the adjacency matrix).

    Memory: the propagation keeps nothing of size N x F between forward and backward
    (:func:`~hpc_graph.nn._propagate.gcn_propagate_mix`); the MLP keeps only its
    layers' inputs (the features and the ReLU outputs), no dropped copies.

    Message passing: step ``k`` is one message-passing layer, ``graph.layer(k - 1)``:
    ``z_(k-1)`` gets its input rows from ``layer_input``, and ``h`` is cut to the
    step's output rows with ``dst`` as it is carried along (the output rows of a
    block are the first rows of its input). ``message_passing_layers = K``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_layers: linear layers of the MLP.
        hops: propagation steps K (10).
        alpha: teleport (restart) probability in [0, 1] (0.1).
        dropout: dropout probability before every linear layer.

    Parameters: ``mlp.lins`` (``torch.nn.Linear`` layers).
    ``forward(graph, x)``: x float[input rows, in_dim] (dense or sparse CSR) -> float[output rows, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, hops: int = 10,
                 alpha: float = 0.1, dropout: float = 0.5):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers)):
            positive_int(field, value)
        self.hops = positive_int("hops", hops)
        self.alpha = number_in("alpha", alpha, 0.0, 1.0)
        self.message_passing_layers = self.hops
        self.mlp = MLP(in_dim, hidden, out_dim, num_layers, number_in("dropout", dropout, 0.0, 1.0, hi_open=True))

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp(x, graph.row_ids())
        z = h
        for k in range(self.hops):
            g = graph.layer(k)
            z_in = g.layer_input(z)
            h = g.dst(h)
            z = gcn_propagate_mix(g, z_in, h, self.alpha)  # (1 - alpha) P z + alpha h
        return z

    def extra_repr(self) -> str:
        return f"hops={self.hops}, alpha={self.alpha:g}"
