"""Mini-batch GraphSAGE written the way DGL's own examples are, as a second, independent DGL baseline.

    .venv-dgl/bin/python benchmarks/dgl_sage_example.py DATA.h5 --epochs 3 --threads 2 --dropout-at input

``minibatch_baseline.py`` drives DGL and PyG through one harness; this script instead follows the layout
a DGL user writes from the framework's node-classification example: the graph as a ``DGLGraph`` with its
features and labels in ``ndata``, a ``SAGE`` module of ``dgl.nn.SAGEConv`` layers (mean) that walks the
blocks, ``dgl.dataloading.NeighborSampler`` (fan-outs from the input layer to the seeds, so
``--fanouts 15 10 5`` in the seeds-first order of hpc_graph and PyG is passed reversed) and
``dgl.dataloading.DataLoader`` (shuffled, the last batch partial, no worker processes), Adam, cross entropy
over each batch's seeds. Every epoch visits every training node.

``--dropout-at``: ``none``; ``hidden`` (after each hidden layer's ReLU: DGL's example); ``input`` (before
every layer, input features included: where hpc_graph's models put it). The epoch time covers sampling,
the feature and label gather, forward, backward and the optimiser step. Prints one JSON object on
stdout: per-epoch seconds, their median over epochs 2 and later, peak RSS (MiB), versions.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np


def load_graph(path: str):
    """A DGLGraph with ``feat``, ``label`` and ``train_mask`` in ``ndata``, and the number of classes."""
    import dgl
    import h5py
    import torch

    with h5py.File(path, "r") as f:
        indptr = np.asarray(f["graph/indptr"][...], dtype=np.int64)
        src = np.asarray(f["graph/indices"][...]).astype(np.int64, copy=False)
        n = indptr.shape[0] - 1
        feat = np.asarray(f["node/feat"][...], dtype=np.float32)
        label = np.asarray(f["node/label"][...], dtype=np.int64)
        train = np.asarray(f["node/train_mask"][...], dtype=bool)
        classes = int(f.attrs["num_classes"]) if "num_classes" in f.attrs else int(label.max()) + 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # row i of the CSR lists the sources of i
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(feat)
    g.ndata["label"] = torch.from_numpy(label)
    g.ndata["train_mask"] = torch.from_numpy(train & (label >= 0))
    return g, classes


def make_model(in_size: int, hidden: int, out_size: int, layers: int, dropout: float, dropout_at: str):
    import dgl.nn as dglnn
    import torch
    from torch import nn
    from torch.nn import functional as F

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            sizes = [in_size] + [hidden] * (layers - 1) + [out_size]
            self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(sizes[:-1], sizes[1:]))
            self.dropout = nn.Dropout(dropout)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                if dropout_at == "input":
                    h = self.dropout(h)
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = F.relu(h)
                    if dropout_at == "hidden":
                        h = self.dropout(h)
            return h

    torch.manual_seed(0)
    return SAGE()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="hpc_graph dataset file (.h5)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--num-layers", type=int, default=3)
    ap.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5], help="seed hop first (PyG's order)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--dropout-at", choices=("none", "hidden", "input"), default="input")
    ap.add_argument("--lr", type=float, default=0.003)
    args = ap.parse_args(argv)
    if len(args.fanouts) != args.num_layers:
        raise SystemExit(f"--fanouts: one per layer ({args.num_layers}), got {args.fanouts}")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import dgl
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(args.threads)
    g, classes = load_graph(args.data)
    train_idx = torch.nonzero(g.ndata["train_mask"], as_tuple=True)[0]
    model = make_model(g.ndata["feat"].shape[1], args.hidden, classes, args.num_layers, args.dropout,
                       args.dropout_at if args.dropout > 0 else "none")
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = dgl.dataloading.NeighborSampler(list(reversed(args.fanouts)))
    loader = dgl.dataloading.DataLoader(g, train_idx, sampler, batch_size=args.batch_size, shuffle=True,
                                        drop_last=False, num_workers=0)
    epochs = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        total = 0.0
        for it, (_input_nodes, _output_nodes, blocks) in enumerate(loader):
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
        epochs.append(time.perf_counter() - t0)
        print(f"epoch {epoch + 1}: {epochs[-1]:.2f} s, mean loss {total / (it + 1):.4f}", file=sys.stderr,
              flush=True)
    later = epochs[1:] or epochs
    print(json.dumps({"framework": "dgl-example", "epoch_seconds": epochs,
                      "median_epoch_seconds": statistics.median(later),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "dropout": args.dropout, "dropout_at": args.dropout_at, "threads": args.threads,
                      "versions": {"dgl": dgl.__version__, "torch": torch.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
