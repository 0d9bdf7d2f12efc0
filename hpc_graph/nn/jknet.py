"""``JKNet``: jumping knowledge networks (Xu et al., ICML 2018)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import choice, number_in, positive_int
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.sage_conv import SAGEConv

JK_MODES = ("concat", "max", "attention")
JK_CONVS = ("gcn", "sage")


class JKNet(nn.Module):
    """L graph convolutions whose outputs are all combined ("jump") before the classifier.

    ::

        h_0 = x;   h_l = relu(conv_l(dropout(h_(l-1))))       l = 1 .. L,  h_l float[N, hidden]
        concat:    z = [h_1 | h_2 | ... | h_L]                          float[N, L * hidden]
        max:       z = max_l h_l  (element-wise)                        float[N, hidden]
        attention: a_(l,i) = softmax_l(h_(l,i) . q + c_l),  z_i = sum_l a_(l,i) h_(l,i)   float[N, hidden]
        out = dropout(z) W + b                                          float[N, out_dim]

    ``conv_l`` is :class:`GCNConv` or :class:`SAGEConv` (``conv``). The attention
    mode replaces the paper's bi-LSTM scorer by one learned score per layer
    and node (``q`` float[hidden], a per-layer offset ``c`` float[L]),
    normalised by a softmax over the layers of each node: still node-adaptive,
    with two parameter vectors instead of an LSTM.

    Message passing: conv ``l`` runs on ``graph.layer(l - 1)`` with its input
    rows from ``layer_input``; the earlier layers' outputs are cut to each
    layer's output rows with ``dst`` as they are carried along.
    ``message_passing_layers = num_layers``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_layers: graph convolutions L.
        jk: ``"concat"``, ``"max"`` or ``"attention"``.
        conv: ``"gcn"`` or ``"sage"``.
        dropout: dropout probability before every convolution and before the classifier.

    Parameters: ``convs`` (L convolutions), ``lin`` (the classifier), in attention mode
    ``att_q`` float[hidden] and ``att_c`` float[L].
    ``forward(graph, x)``: x float[input rows, in_dim] (dense or sparse CSR) -> float[output rows, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 4, jk: str = "concat",
                 conv: str = "gcn", dropout: float = 0.5):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers)):
            positive_int(field, value)
        self.jk = choice("jk", jk, JK_MODES)
        self.conv = choice("conv", conv, JK_CONVS)
        self.dropout = number_in("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.message_passing_layers = int(num_layers)
        make = GCNConv if conv == "gcn" else SAGEConv
        self.convs = nn.ModuleList(make(in_dim if i == 0 else hidden, hidden) for i in range(num_layers))
        if jk == "attention":
            self.att_q = nn.Parameter(torch.empty(hidden))
            self.att_c = nn.Parameter(torch.zeros(num_layers))
            bound = hidden ** -0.5
            nn.init.uniform_(self.att_q, -bound, bound)
        self.lin = nn.Linear(num_layers * hidden if jk == "concat" else hidden, out_dim)

    def combine(self, hs: list[torch.Tensor]) -> torch.Tensor:
        """The jumping-knowledge combination of the layer outputs ``hs`` (each float[N, hidden])."""
        if self.jk == "concat":
            return torch.cat(hs, 1)
        stacked = torch.stack(hs, 1)                                   # [N, L, hidden]
        if self.jk == "max":
            return stacked.amax(1)
        scores = torch.softmax(stacked @ self.att_q + self.att_c, 1)  # [N, L]
        return (scores.unsqueeze(2) * stacked).sum(1)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = x
        hs: list[torch.Tensor] = []
        for layer, conv in enumerate(self.convs):
            g = graph.layer(layer)
            h = F.relu(conv(g, dropout(g.layer_input(h), self.dropout, self.training, g.row_ids())))
            hs = [g.dst(t) for t in hs]
            hs.append(h)
        z = dropout(self.combine(hs), self.dropout, self.training, graph.row_ids(output=True))
        return linear(z, self.lin.weight, self.lin.bias)

    def extra_repr(self) -> str:
        return f"jk={self.jk!r}, conv={self.conv!r}, dropout={self.dropout:g}"
