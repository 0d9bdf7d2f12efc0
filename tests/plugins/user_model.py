"""A model of one's own, written as a user would in their own file: two mean-aggregation layers with a root
projection (GraphSAGE's mean form), dropout on every layer's input, from the public API only
(``hpc_graph.nn.dropout`` and the ``GraphContext`` a model receives). It reaches the suite as
``Trainer(config, model=MeanSAGE)``, ``hpc-graph train --model user_model:MeanSAGE`` (this folder importable),
or ``Trainer(config, model=MeanSAGE(in_dim, out_dim, config.model))``.
"""
from __future__ import annotations

import torch
from torch import nn

import hpc_graph as hg


class MeanSAGE(nn.Module):
    """``forward(graph, x)``: x float[rows, in_dim] -> logits float[num_nodes, out_dim]; ``mc``: the config's
    ``model`` section (``hidden``, ``dropout``)."""

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        self.p = float(mc.dropout)
        self.self1, self.neigh1 = nn.Linear(in_dim, mc.hidden), nn.Linear(in_dim, mc.hidden, bias=False)
        self.self2, self.neigh2 = nn.Linear(mc.hidden, out_dim), nn.Linear(mc.hidden, out_dim, bias=False)
        self.message_passing_layers = 2  # the blocks a sampled mini-batch needs

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        for index, (root, neigh) in enumerate(((self.self1, self.neigh1), (self.self2, self.neigh2))):
            g = graph.layer(index)  # a sampled engine's block l; the whole graph itself otherwise
            h = g.layer_input(x)
            # the mask keyed on the rows' dataset ids: every engine and rank count drops the same elements
            h = hg.nn.dropout(h, self.p, self.training, g.row_ids())
            x = root(g.dst(h)) + neigh(g.aggregate(h, "mean"))
            if index == 0:
                x = torch.relu(x)
        return x


class NoGraph(nn.Module):
    """A model whose forward does not take the graph: refused in one line."""

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


NOT_A_FACTORY = 3


class OutDegreeScaled(nn.Module):
    """A model using a primitive the sampled engines do not provide (``graph.out_degree()``): refused in one line
    on ``minibatch``, naming the engine, the model and the primitive."""

    message_passing_layers = 1

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        g = graph.layer(0)
        h = g.aggregate(g.layer_input(x), "mean") / g.out_degree().clamp(min=1).unsqueeze(1)
        return self.lin(h)
