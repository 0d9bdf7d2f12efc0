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
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear


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


def as_dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a strided tensor (aggregation takes dense rows); sparse CSR features are densified."""
    return x if x.layout == torch.strided else x.to_dense()


class MLP(nn.Module):
    """``num_layers`` linear layers, ReLU between them, dropout before each (input features included).

    Widths ``in_dim -> hidden -> ... -> hidden -> out_dim`` (one layer: ``in_dim -> out_dim``);
    ``lins[i]`` are ``torch.nn.Linear`` (default init). ``forward(x)``: float[N, in_dim]
    (dense or sparse CSR) -> float[N, out_dim]. Row-wise: it never touches the graph.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int, p: float):
        super().__init__()
        widths = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        last = len(self.lins) - 1
        for i, lin in enumerate(self.lins):
            h = linear(dropout(h, self.p, self.training), lin.weight, lin.bias)
            if i != last:
                h = F.relu(h)
        return h
