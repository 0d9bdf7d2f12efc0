"""``MLPNet``: a graph-free baseline (linear layers only), e.g. the base predictor of Correct & Smooth."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.ops.csr import first_rows
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import MLP


class MLPNet(nn.Module):
    """``num_layers`` linear layers with ReLU between them and dropout before each; ignores the edges.

    ``out = lin_L(dropout(relu(... lin_1(dropout(x)) ...)))``; one layer is a linear (logistic
    regression) model. Used alone it measures what the features give without the graph; it is
    the base predictor that :mod:`hpc_graph.train.recipes`' Correct & Smooth post-processes.

    Message passing: none (``message_passing_layers = 0``; a sampled mini-batch has no blocks).

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_layers: linear layers (>= 1).
        dropout: dropout probability before every linear layer.

    Parameters: ``mlp.lins`` (``torch.nn.Linear`` layers).
    ``forward(graph, x)``: x float[rows, in_dim] (dense or sparse CSR) -> float[graph.num_nodes, out_dim]: the
    rows of the graph's output nodes (all rows on a full graph; a sampled batch's seeds, its first rows).
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers)):
            positive_int(field, value)
        self.message_passing_layers = 0
        self.mlp = MLP(in_dim, hidden, out_dim, num_layers, number_in("dropout", dropout, 0.0, 1.0, hi_open=True))

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        n = int(graph.num_nodes)
        if x.shape[0] != n:  # a sampled batch: its seeds are the first rows of every block's sources
            ids = graph.row_ids(output=True)
            return self.mlp(first_rows(x, n), ids)
        return self.mlp(x, graph.row_ids())
