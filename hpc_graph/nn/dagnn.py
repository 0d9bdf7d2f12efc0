"""``DAGNN``: deep adaptive graph neural network (Liu, Gao & Ji, KDD 2020)."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import MLP, gcn_propagate


class DAGNN(nn.Module):
    """An MLP's predictions propagated K times, the K + 1 receptive fields mixed by learned gates.

    With ``P = D^-1/2 (A + I) D^-1/2`` (``D = in_degree + 1``)::

        H_0 = MLP(x)                                   float[N, out_dim]
        H_k = P H_(k-1)                                k = 1 .. K
        s_k = sigmoid(H_k q + b)                       float[N]    (per node and hop)
        out = sum_k s_k H_k                            float[N, out_dim]

    ``q`` float[out_dim] and ``b`` are the parameters of ``gate`` (a Linear to one
    output, as the authors' ``proj``); the MLP has ``num_layers`` linear layers, ReLU
    between them and dropout before each. The propagation has no parameters,
    so depth costs no over-fitting; the gates let every node choose how far to look.

    Message passing: hop ``k`` is ``graph.layer(k - 1)`` with its input rows from
    ``layer_input``; ``H_0 .. H_(k-1)`` are cut to each hop's output rows with
    ``dst`` as they are carried along. ``message_passing_layers = K``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_layers: linear layers of the MLP.
        hops: propagation steps K (10).
        dropout: dropout probability before every linear layer.

    Parameters: ``mlp.lins``, ``gate`` (Linear out_dim -> 1).
    ``forward(graph, x)``: x float[input rows, in_dim] (dense or sparse CSR) -> float[output rows, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, hops: int = 10,
                 dropout: float = 0.5):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers)):
            positive_int(field, value)
        self.hops = positive_int("hops", hops)
        self.message_passing_layers = self.hops
        self.mlp = MLP(in_dim, hidden, out_dim, num_layers, number_in("dropout", dropout, 0.0, 1.0, hi_open=True))
        self.gate = nn.Linear(out_dim, 1)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        z = self.mlp(x, graph.row_ids())
        reps = [z]
        for k in range(self.hops):
            g = graph.layer(k)
            z = gcn_propagate(g, g.layer_input(z))
            reps = [g.dst(t) for t in reps]
            reps.append(z)
        stacked = torch.stack(reps, 1)                                             # [N, K + 1, out_dim]
        gates = torch.sigmoid(self.gate(stacked))                                  # [N, K + 1, 1]
        return (gates * stacked).sum(1)

    def extra_repr(self) -> str:
        return f"hops={self.hops}"
