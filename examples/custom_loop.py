"""A training loop of your own on hpc_graph's full-graph engines, giving the numbers of hpc_graph's Trainer.

    hpc-graph convert npz tests/data/cora.npz -o data/cora.h5
    hpc-graph partition data/cora.h5 -o data/cora-2parts -n 2
    mpiexec -n 2 python examples/custom_loop.py data/cora-2parts --engine sar --epochs 50
    python examples/custom_loop.py data/cora.h5 --engine single --epochs 50

Any engine of kind "full" runs it (single, dp, sar, sylvie): the model never learns which one holds its graph. The
four numbered steps are what make N ranks compute what one process computes; each is one call of
``hpc_graph.train.steps`` (docs/python-api.md, "A training loop of your own").
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

import hpc_graph as hg
from hpc_graph.nn import optim
from hpc_graph.train.steps import broadcast_parameters, global_count, seed_stream, sync_gradients


class TwoLayerGCN(nn.Module):
    """GCN (Kipf & Welling) from the library's layer: ``forward(graph, x)``: float[rows, in_dim] ->
    float[num_nodes, out_dim]. ``mc`` is a config's ``model`` section (``hidden``, ``dropout``), so the Trainer can
    build it too: ``hg.Trainer(config, model=TwoLayerGCN)``."""

    def __init__(self, in_dim: int, out_dim: int, mc) -> None:
        super().__init__()
        self.p = float(mc.dropout)
        self.conv1, self.conv2 = hg.nn.GCNConv(in_dim, mc.hidden), hg.nn.GCNConv(mc.hidden, out_dim)

    def forward(self, graph: hg.GraphContext, x: torch.Tensor) -> torch.Tensor:
        # dropout keyed on the rows' dataset ids: every rank drops what one process drops
        x = hg.nn.dropout(x, self.p, self.training, graph.row_ids())
        x = torch.relu(self.conv1(graph, x))
        x = hg.nn.dropout(x, self.p, self.training, graph.row_ids())
        return self.conv2(graph, x)


def train(data: str, engine_name: str, epochs: int, *, seed: int = 0, hidden: int = 16, dropout: float = 0.5,
          lr: float = 0.01, weight_decay: float = 5e-4, dtype: torch.dtype = torch.float64) -> list[float]:
    """Train :class:`TwoLayerGCN` for ``epochs`` full-graph steps; returns the global loss of every step."""
    comm = hg.init()
    engine = hg.create_engine(engine_name, data, comm, torch.device("cpu"), dtype, {"seed": seed})
    if engine.kind != "full":
        raise SystemExit(f"--engine: {engine_name!r} is a {engine.kind} engine; this loop is for full-graph ones")
    torch.manual_seed(seed)
    model = TwoLayerGCN(engine.num_features, engine.num_classes,
                        argparse.Namespace(hidden=hidden, dropout=dropout)).to(dtype=dtype)
    broadcast_parameters(model, comm)  # 1. every rank starts from rank 0's weights
    seed_stream(seed, comm, engine)    # 2. the random stream: the same on every rank where the engine shares it
    train_rows = (engine.masks["train"] & (engine.label >= 0)).nonzero().squeeze(1)
    count = global_count(train_rows.numel(), comm, engine)  # 3. the loss divides by the global training count
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optim.Adam(params, lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(epochs):
        model.train()
        opt.zero_grad(set_to_none=False)
        logits = model(engine.graph, engine.feat)
        loss = F.cross_entropy(logits[train_rows], engine.label[train_rows], reduction="sum") / count
        loss.backward()
        total = sync_gradients(params, comm, loss.detach().reshape(1))  # 4. one all-reduce: gradients and loss
        opt.step()
        losses.append(float(total[0]))
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a dataset file (engine single) or a partition directory (dp, sar, sylvie)")
    ap.add_argument("--engine", default="dp")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    losses = train(args.data, args.engine, args.epochs, seed=args.seed)
    if hg.init().rank == 0:
        for epoch, loss in enumerate(losses, start=1):
            print(f"epoch {epoch}: loss {loss!r}")


if __name__ == "__main__":
    main()
