"""A layer of your own on every engine: GIN (Xu et al., "How Powerful are Graph Neural Networks?", ICLR 2019),
sum aggregation and an MLP with a learnable epsilon, written against the graph interface only, trained with
``sar`` on 2 ranks and with ``single`` on one process: the same losses.

    hpc-graph convert npz tests/data/cora.npz -o data/cora.h5
    hpc-graph partition data/cora.h5 -o data/cora-2parts -n 2
    python examples/custom_layer.py data/cora.h5 --engine single
    mpiexec -n 2 python examples/custom_layer.py data/cora-2parts --engine sar

The layer asks ``graph.aggregate(x, "sum")`` for the sum over each node's in-neighbours; ``single`` computes it
from the whole graph, ``dp`` after a halo exchange, ``sar`` one remote partition at a time (rematerialising the
remote rows in the backward pass instead of keeping them), ``minibatch`` on a sampled block.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import hpc_graph as hg

REPO = Path(__file__).resolve().parents[1]


class GINConv(nn.Module):
    """``h_i = MLP((1 + eps) * x_i + sum_{j -> i} x_j)``: float[rows, in_dim] -> float[num_nodes, out_dim]."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int) -> None:
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(()))
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        return self.mlp((1 + self.eps) * graph.dst(x) + graph.aggregate(x, "sum"))


class GIN(nn.Module):
    """``mc.num_layers`` GIN layers (2 when the section has none), ReLU between them, dropout keyed on the nodes'
    dataset ids: built by the Trainer as ``GIN(in_dim, out_dim, mc)`` (``mc.hidden``, ``mc.dropout`` from the
    config)."""

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        self.p = float(mc.dropout)
        layers = int(getattr(mc, "num_layers", 2) or 2)
        widths = [in_dim] + [mc.hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(GINConv(a, b, mc.hidden) for a, b in zip(widths[:-1], widths[1:]))
        self.message_passing_layers = layers  # the blocks a sampled mini-batch needs

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            g = graph.layer(i)
            h = hg.nn.dropout(g.layer_input(x), self.p, self.training, g.row_ids())
            x = conv(g, h)
            if i < len(self.convs) - 1:
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
        "train.dtype=float64", "train.progress=false", "train.eval_every=5", "model.hidden=32", "model.dropout=0.5",
        f"train.run_dir=runs/custom_layer-{args.engine}"])
    trainer = hg.Trainer(config, comm, model=GIN)
    losses = [trainer.step() for _ in range(args.epochs)]
    accuracy = trainer.evaluate()
    if comm.rank == 0:
        for epoch, loss in enumerate(losses, start=1):
            print(f"epoch {epoch}: loss {loss:.12f}")
        print(f"test accuracy {accuracy['test_acc']:.4f}")


if __name__ == "__main__":
    main()
