"""PyG reference: full-batch training of a 3-layer GCN, GraphSAGE or GAT with torch_geometric on one process.

    python benchmarks/pyg_baseline.py DATA.h5 --model gcn --hidden 128 --epochs 5 --run-dir DIR
    python benchmarks/pyg_baseline.py DATA.h5 --model sage --hidden 128 --epochs 5 --run-dir DIR
    python benchmarks/pyg_baseline.py DATA.h5 --model gat --hidden 32 --heads 4 --epochs 5 --run-dir DIR
    python benchmarks/pyg_baseline.py DATA.h5 --model gin --hidden 128 --epochs 5 --run-dir DIR
    python benchmarks/pyg_baseline.py DATA.h5 --model gatv2 --hidden 32 --heads 4 --epochs 5 --run-dir DIR

The same model as ``hpc-graph train`` builds (``hpc_graph.nn.build_model``; ``gin`` and ``gatv2``: the
user-written models of examples/custom_layer.py and examples/message_passing.py):
``num_layers`` convolutions, dropout before every layer (input features too),
ReLU (GCN, SAGE, GIN) or ELU (GAT, GATv2) between layers; GAT and GATv2 hidden layers concatenate
``heads`` heads of ``hidden`` features and the output layer has one head; a GIN layer is ``GINConv`` with
a learnable epsilon over the MLP ``Linear(in, hidden), ReLU, Linear(hidden, out)``.
Adam, cross entropy over the training nodes, the whole graph every step.
torch_geometric's ``GCNConv`` (default normalisation: self loops added, symmetric
``deg^-1/2`` with the in-degree + 1, ``cached=False`` so every forward normalises
again), ``SAGEConv`` (mean) / ``GATConv`` / ``GATv2Conv`` (self loops added) / ``GINConv`` run on ``edge_index``
(int64 [2, E], PyG's default input) or, with ``--adj csr``, on a transposed
``torch.sparse_csr`` adjacency (SAGE only: PyG's fused sparse path).
The DGL twin of this script is ``benchmarks/dgl_baseline.py``.

Timing covers exactly what the trainer's ``epoch_seconds`` covers: zero_grad,
forward, loss, backward, optimizer step. Writes ``DIR/metrics.rank0.jsonl``
and ``DIR/summary.json`` in the trainer's layout (``engine: "pyg"``) so that
``hpc-graph report`` and ``hpc_graph.train.report.plot_compare`` read it, and
prints one JSON object on stdout: per-epoch seconds, median of epochs 2..E,
peak RSS (``ru_maxrss`` of this process, MiB) and the torch thread count.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # data_io, when run as a script from anywhere


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _load(path: str):
    """``(x float32[N,F], edge_index int64[2,E] (src, dst), indptr int64[N+1], y int64[N], train_idx int64[T], N)``
    of a dataset file (edges destination-major, as stored)."""
    import torch

    from data_io.dataset import open_dataset

    with open_dataset(path) as ds:
        n = ds.num_nodes
        indptr = torch.from_numpy(ds.indptr().astype(np.int64, copy=False))
        src = torch.from_numpy(ds.indices().astype(np.int64, copy=False))
        x = torch.from_numpy(ds.feat_rows(0, n)).float()
        y = torch.from_numpy(np.asarray(ds.label(), dtype=np.int64))
        train = torch.from_numpy(np.asarray(ds.mask("train_mask"), dtype=bool))
    dst = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), indptr.diff())
    edge_index = torch.stack([src, dst])
    del src, dst
    train_idx = (train & (y >= 0)).nonzero().squeeze(1)
    return x, edge_index, indptr, y, train_idx, n


class _Net:
    """Builds the torch.nn.Module lazily so that importing this file does not import torch_geometric."""

    @staticmethod
    def build(model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, heads: int,
              dropout: float):
        import torch
        from torch.nn import functional as F
        from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GINConv, SAGEConv

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList()
                width = in_dim
                for layer in range(num_layers):
                    last = layer == num_layers - 1
                    attention = {"gat": GATConv, "gatv2": GATv2Conv}.get(model)
                    if model in ("gcn", "sage"):
                        out = out_dim if last else hidden
                        self.convs.append(GCNConv(width, out, cached=False) if model == "gcn"
                                          else SAGEConv(width, out, aggr="mean"))
                        width = out
                    elif model == "gin":  # sum aggregation, a 2-layer MLP, a learnable epsilon
                        out = out_dim if last else hidden
                        mlp = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(),
                                                  torch.nn.Linear(hidden, out))
                        self.convs.append(GINConv(mlp, train_eps=True))
                        width = out
                    elif last:
                        self.convs.append(attention(width, out_dim, heads=1, concat=False))
                        width = out_dim
                    else:
                        self.convs.append(attention(width, hidden, heads=heads, concat=True))
                        width = hidden * heads
                self.act = F.elu if attention is not None else F.relu

            def forward(self, x, adj):
                h = x
                for layer, conv in enumerate(self.convs):
                    h = conv(F.dropout(h, dropout, self.training), adj)
                    if layer != len(self.convs) - 1:
                        h = self.act(h)
                return h

        return Net()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="dataset file (hpc-graph generate|convert)")
    ap.add_argument("--model", choices=("gcn", "sage", "gat", "gin", "gatv2"), required=True)
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (per head for GAT)")
    ap.add_argument("--heads", type=int, default=4, help="GAT heads in hidden layers")
    ap.add_argument("--num-layers", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adj", choices=("edge_index", "csr"), default="edge_index",
                    help="graph input of the PyG layers (csr: SAGE only)")
    ap.add_argument("--run-dir", type=Path, default=None, help="write metrics.rank0.jsonl + summary.json here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: train on the current GPU (epochs timed between synchronisations; peak_gpu_mb is "
                         "torch.cuda.max_memory_allocated)")
    args = ap.parse_args(argv)
    if args.adj == "csr" and args.model != "sage":
        ap.error("--adj csr: only with --model sage (GATConv needs edge_index to add self loops)")

    import warnings

    import torch
    from torch.nn import functional as F

    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    x, edge_index, indptr, y, train_idx, n = _load(args.data)
    num_classes = int(y.max()) + 1
    if args.adj == "csr":
        # adj_t: row i lists the sources of destination i, i.e. exactly the dataset's CSR
        adj = torch.sparse_csr_tensor(indptr, edge_index[0], torch.ones(edge_index.shape[1]), (n, n))
        del edge_index
    else:
        adj = edge_index
    dev = torch.device(args.device)
    x, adj, y, train_idx = x.to(dev), adj.to(dev), y.to(dev), train_idx.to(dev)
    gpu = dev.type == "cuda"

    def sync():
        if gpu:
            torch.cuda.synchronize()

    load_s = time.perf_counter() - t0
    model = _Net.build(args.model, x.shape[1], args.hidden, num_classes, args.num_layers, args.heads,
                       args.dropout).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rows, seconds = [], []
    for epoch in range(1, args.epochs + 1):
        sync()
        t = time.perf_counter()
        model.train()
        opt.zero_grad()
        out = model(x, adj)
        loss = F.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        sync()
        dt = time.perf_counter() - t
        loss = float(loss.detach())
        del out
        seconds.append(dt)
        rows.append({"rank": 0, "epoch": epoch, "loss": loss, "train_acc": None, "val_acc": None,
                     "test_acc": None, "lr": args.lr, "epoch_seconds": dt, "compute_seconds": dt,
                     "comm_seconds": 0.0, "bytes_sent": 0, "eval_seconds": 0.0, "eval_bytes_sent": 0,
                     "peak_rss_mb": _peak_rss_mb(), "engine_stats": {}})
        print(f"epoch {epoch}: {dt:.3f} s, loss {loss:.4f}", file=sys.stderr, flush=True)
    steady = seconds[1:] or seconds
    result = {"engine": "pyg", "model": args.model, "adj": args.adj, "num_nodes": n,
              "num_edges": int(adj._nnz() if args.adj == "csr" else adj.shape[1]),
              "epochs": args.epochs, "epoch_seconds": seconds,
              "median_epoch_seconds": statistics.median(steady), "load_seconds": load_s,
              "peak_rss_mb": _peak_rss_mb(), "torch_threads": torch.get_num_threads(),
              "num_parameters": sum(p.numel() for p in model.parameters()), "device": args.device}
    if gpu:
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["gpu"] = torch.cuda.get_device_name()
    if args.run_dir is not None:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        with open(args.run_dir / "metrics.rank0.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        summary = {"engine": "pyg", "world_size": 1, "epochs": args.epochs,
                   "median_epoch_seconds": statistics.median(seconds), "peak_rss_mb": [result["peak_rss_mb"]],
                   "num_parameters": result["num_parameters"], "run_dir": str(args.run_dir),
                   "best_val_acc": None, "test_acc": None, "best_epoch": None,
                   "final": {"loss": rows[-1]["loss"] if rows else None}}
        (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
