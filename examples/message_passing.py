"""Layers of your own that need more than a sum over neighbours: a message function per edge, on every engine.

Two layers written with ``graph.message_passing`` only (hpc_graph's counterpart of DGL's ``update_all`` and PyG's
``MessagePassing``):

* ``GATv2Conv`` (Brody et al., "How Attentive are Graph Attention Networks?", ICLR 2022): a score computed from
  both ends of every edge, ``a . LeakyReLU(W_l x_j + W_r x_i)``, a softmax over each node's in-edges and its self
  loop, the weighted sum of ``W_l x_j``;
* ``WeightedRelConv``: a relational, edge-weighted message ``w_ij * (x_j W_{type(j->i)})``, averaged over the
  in-edges, plus a root term (R-GCN's message with the dataset's edge weights).

Train the GATv2 model on Cora with ``sar`` over 2 ranks and with ``single``: the same losses.

    hpc-graph convert npz tests/data/cora.npz -o data/cora.h5
    hpc-graph partition data/cora.h5 -o data/cora-2parts -n 2
    python examples/message_passing.py data/cora.h5 --engine single
    mpiexec -n 2 python examples/message_passing.py data/cora-2parts --engine sar

The graph walks its edges in chunks and calls the layer's ``message`` on each; the messages are not kept for the
backward pass but computed again there (on ``sar`` the remote partitions' rows are fetched again too), so a layer
holds its inputs and outputs, not one tensor per edge. ``message`` must therefore be deterministic, and its
trainable tensors are its module's parameters.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import hpc_graph as hg

REPO = Path(__file__).resolve().parents[1]


class GATv2Conv(nn.Module):
    """``out_i = sum_{j in N(i) + i} softmax_j(a . LeakyReLU(W_l x_j + W_r x_i)) W_l x_j`` per head, heads
    concatenated, plus a bias: float[rows, in_dim] -> float[num_nodes, heads * out_dim]."""

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, negative_slope: float = 0.2) -> None:
        super().__init__()
        self.heads, self.out_dim, self.negative_slope = heads, out_dim, negative_slope
        self.lin_l = nn.Linear(in_dim, heads * out_dim)
        self.lin_r = nn.Linear(in_dim, heads * out_dim)
        self.att = nn.Parameter(torch.empty(heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim))
        nn.init.xavier_uniform_(self.att)

    def message(self, edges) -> tuple[torch.Tensor, torch.Tensor]:
        """One score per edge and head, float[E, H], from both ends; the value is the source's ``W_l x_j``."""
        score = (F.leaky_relu(edges.src["l"] + edges.dst["r"], self.negative_slope) * self.att).sum(-1)
        return score, edges.src["l"]

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        h, d = self.heads, self.out_dim
        left = self.lin_l(x).view(-1, h, d)  # every input row (sources)
        right = self.lin_r(graph.dst(x)).view(-1, h, d)  # the output rows (destinations)
        out = graph.message_passing(self.message, {"l": left}, {"r": right}, reduce="softmax", self_loops=True)
        return out.reshape(-1, h * d) + self.bias


class WeightedRelConv(nn.Module):
    """``out_i = x_i W_root + b + mean_{j -> i} w_ij (x_j W_{r(j -> i)})``: float[rows, in_dim] ->
    float[num_nodes, out_dim]. The inputs are projected once for every relation, ``[rows, R, out_dim]``, and each
    edge picks its relation's row: no per-edge weight matrix."""

    def __init__(self, in_dim: int, out_dim: int, num_relations: int) -> None:
        super().__init__()
        self.out_dim, self.num_relations = out_dim, num_relations
        self.rel = nn.Linear(in_dim, num_relations * out_dim, bias=False)
        self.root = nn.Linear(in_dim, out_dim)

    def message(self, edges) -> torch.Tensor:
        h = edges.src["h"]  # float[E, R, out_dim]
        picked = h.gather(1, edges.type.view(-1, 1, 1).expand(-1, 1, self.out_dim)).squeeze(1)
        return edges.weight.unsqueeze(1) * picked

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = self.rel(x).view(-1, self.num_relations, self.out_dim)
        return self.root(graph.dst(x)) + graph.message_passing(self.message, {"h": h}, reduce="mean")


class GATv2(nn.Module):
    """``mc.num_layers`` GATv2 layers (2 when the section has none): ``mc.heads`` heads of ``mc.hidden // heads``
    features concatenated, then one head of the classes; ELU between them, dropout keyed on the nodes' dataset ids.
    Built by the Trainer as ``GATv2(in_dim, out_dim, mc)``."""

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        heads = int(getattr(mc, "heads", 1) or 1)
        width = max(1, mc.hidden // heads)
        layers = int(getattr(mc, "num_layers", 2) or 2)
        self.p = float(mc.dropout)
        self.convs = nn.ModuleList([GATv2Conv(in_dim if i == 0 else width * heads, width, heads)
                                    for i in range(layers - 1)] + [GATv2Conv(width * heads if layers > 1 else in_dim,
                                                                             out_dim, 1)])
        self.message_passing_layers = layers  # the blocks a sampled mini-batch needs

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            g = graph.layer(i)
            x = conv(g, hg.nn.dropout(g.layer_input(x), self.p, self.training, g.row_ids()))
            if i < len(self.convs) - 1:
                x = F.elu(x)
        return x


class WeightedRGCN(nn.Module):
    """Two :class:`WeightedRelConv` layers for a graph with edge types and weights; ``edge_fields`` tells a sampled
    engine to carry both with every sampled edge."""

    message_passing_layers = 2
    edge_fields = ("weight", "type")

    def __init__(self, in_dim: int, out_dim: int, mc, num_relations: int = 3) -> None:
        super().__init__()
        self.p = float(mc.dropout)
        self.convs = nn.ModuleList([WeightedRelConv(in_dim, mc.hidden, num_relations),
                                    WeightedRelConv(mc.hidden, out_dim, num_relations)])

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            g = graph.layer(i)
            x = conv(g, hg.nn.dropout(g.layer_input(x), self.p, self.training, g.row_ids()))
            if i == 0:
                x = torch.relu(x)
        return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a dataset file (engine single) or a partition directory (dp, sar, ...)")
    ap.add_argument("--engine", default="sar")
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    comm = hg.init()
    config = hg.load_config(REPO / "configs" / "single_gcn.yaml", [
        f"data.path={args.data}", f"engine.name={args.engine}", f"train.epochs={args.epochs}",
        "train.dtype=float64", "train.progress=false", "train.eval_every=5", "model.hidden=16", "model.heads=4",
        "model.dropout=0.5", f"train.run_dir=runs/message_passing-{args.engine}"])
    trainer = hg.Trainer(config, comm, model=GATv2)
    losses = [trainer.step() for _ in range(args.epochs)]
    accuracy = trainer.evaluate()
    if comm.rank == 0:
        for epoch, loss in enumerate(losses, start=1):
            print(f"epoch {epoch}: loss {loss:.12f}")
        print(f"test accuracy {accuracy['test_acc']:.4f}")


if __name__ == "__main__":
    main()
