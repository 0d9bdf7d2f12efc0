"""``build_model``: the node-classification GNNs (GCN, GraphSAGE, GAT) as one configurable stack."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear
from hpc_graph.nn.dist_batch_norm import DistBatchNorm
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.sage_conv import SAGEConv

MODELS = ("gcn", "sage", "gat")


class GNN(nn.Module):
    """A stack of graph convolutions for node classification.

    Per layer ``l``: ``h = dropout(h)``; ``y = conv_l(graph, h)``; with ``residual``
    ``y = y + res_l(h)`` (identity, or a bias-free linear projection when the
    widths differ); on hidden layers ``y = act(bn_l(graph, y))`` (the
    DistBatchNorm only with ``batchnorm``); ``h = y``. ``act`` is ELU for GAT,
    ReLU otherwise. Dropout is applied to the input features too (as in the
    GCN and GAT papers); its mask comes from a fast CPU sampler (see
    :mod:`hpc_graph.nn._dropout`).

    GAT hidden layers have ``heads`` concatenated heads of ``hidden`` features
    (width ``heads * hidden``); the output layer averages ``out_heads`` heads.

    ``forward(graph, x)``: x float[num_nodes, in_dim], dense or sparse CSR (sparse input
    features make the first layer's dropout and projection cost O(nnz)) -> logits
    float[num_nodes, out_dim].
    """

    def __init__(self, name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.5, heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0,
                 residual: bool = False, batchnorm: bool = False):
        super().__init__()
        if name not in MODELS:
            raise ValueError(f"model.name: unknown model {name!r}; choose one of {list(MODELS)}")
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers), ("heads", heads), ("out_heads", out_heads)):
            if int(value) < 1:
                raise ValueError(f"model.{field}: must be a positive integer, got {value}")
        self.name = name
        self.dropout = float(dropout)
        self.activation = F.elu if name == "gat" else F.relu
        self.convs = nn.ModuleList()
        self.residuals = nn.ModuleList() if residual else None
        self.norms = nn.ModuleList() if batchnorm else None
        width = in_dim
        for layer in range(num_layers):
            last = layer == num_layers - 1
            if name == "gcn":
                conv, out_width = GCNConv(width, out_dim if last else hidden), out_dim if last else hidden
            elif name == "sage":
                conv, out_width = SAGEConv(width, out_dim if last else hidden), out_dim if last else hidden
            elif last:
                conv = GATConv(width, out_dim, heads=out_heads, concat=False, attn_dropout=attn_dropout)
                out_width = out_dim
            else:
                conv = GATConv(width, hidden, heads=heads, concat=True, attn_dropout=attn_dropout)
                out_width = hidden * heads
            self.convs.append(conv)
            if self.residuals is not None:
                self.residuals.append(nn.Identity() if width == out_width
                                      else nn.Linear(width, out_width, bias=False))
            if self.norms is not None and not last:
                self.norms.append(DistBatchNorm(out_width))
            width = out_width

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = x
        last = len(self.convs) - 1
        for layer, conv in enumerate(self.convs):
            g = graph.layer(layer)
            h_in = dropout(g.layer_input(h), self.dropout, self.training)
            y = conv(g, h_in)
            if self.residuals is not None:
                skip, own = self.residuals[layer], g.dst(h_in)
                y = y + (linear(own, skip.weight) if isinstance(skip, nn.Linear) else own.to_dense())
            if layer != last:
                if self.norms is not None:
                    y = self.norms[layer](g, y)
                y = self.activation(y)
            h = y
        return h


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                dropout: float = 0.5, heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0,
                residual: bool = False, batchnorm: bool = False) -> GNN:
    """Build a ``"gcn"``, ``"sage"`` or ``"gat"`` node classifier; see :class:`GNN` for the layout.

    Args:
        name: model family.
        in_dim: input features per node.
        hidden: hidden width (features per head for GAT).
        out_dim: classes (logits per node).
        num_layers: graph convolutions (>= 1).
        dropout: feature dropout before every layer.
        heads: GAT heads in hidden layers; out_heads: GAT heads (averaged) in the output layer.
        attn_dropout: GAT attention-coefficient dropout.
        residual: add (projected) skip connections.
        batchnorm: DistBatchNorm after every hidden convolution.
    Returns:
        a module with ``forward(graph, x) -> float[num_nodes, out_dim]``.
    """
    return GNN(name, in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout, heads=heads,
               out_heads=out_heads, attn_dropout=attn_dropout, residual=residual, batchnorm=batchnorm)
