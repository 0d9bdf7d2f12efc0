"""Peer mini-batch baselines: PyG ``NeighborLoader`` or DGL ``NeighborSampler`` node classification.

Runs with the python of either baseline environment (``benchmarks/setup_baselines.sh``),
never with the project's own; it needs only h5py + numpy besides the framework:

    .venv-pyg/bin/python benchmarks/minibatch_baseline.py DATA.h5 --framework pyg --model sage --epochs 5
    .venv-dgl/bin/python benchmarks/minibatch_baseline.py DATA.h5 --framework dgl --model gat --epochs 5

Data: an hpc_graph dataset file (``/graph/indptr`` + ``/graph/indices``: CSR over
destinations, row i lists the sources j of edges j->i; ``/node/feat``, ``/node/label``,
``/node/train_mask``). PyG gets ``Data(x, edge_index=[src; dst], y)``, DGL
``dgl.graph((src, dst))``. Training nodes: ``train_mask`` and a label >= 0.

Sampling: ``--fanouts`` in PyG's order, the first for the seeds' hop (default 15 10 5).
DGL's ``NeighborSampler`` takes the list from the input layer to the seeds, so it gets
the reversed list: both give the seeds the first fan-out. Mini-batches of
``--batch-size`` seeds, shuffled, the last one partial, no worker processes.

Model (as ``pyg_baseline.py`` and ``hpc_graph.nn.build_model``): ``--num-layers``
convolutions, dropout before every layer (input features too), ReLU (SAGE) or
ELU (GAT) between layers. SAGE: ``SAGEConv`` mean, ``--hidden`` features. GAT:
hidden layers concatenate ``--heads`` heads of ``--hidden`` features, the output layer
has one head; PyG's ``GATConv`` adds a self loop to every node of the sampled
subgraph, DGL's runs on blocks sampled from the graph with self loops added
(``dgl.add_self_loop``), so there the self loop is one of the sampled neighbours.
Adam (``--lr``), cross entropy over the batch's seeds.

PyG without pyg-lib (the environment here: torch-sparse samples) produces batches
without ``num_sampled_nodes``, so ``trim_to_layer`` cannot be used and every layer
runs on the whole sampled subgraph (``"trim": false`` in the output); DGL's layer l
runs on block l only.

Measured, per epoch:
  * ``epoch_seconds``: one pass over the training nodes: sampling, feature/label
    gather, zero_grad, forward, loss, backward, Adam step.
  * ``sampling_seconds``: separate passes (``--sampling-passes``, after training) that
    only iterate the loader over one epoch, materialising every batch (sampled
    structure + input features + seed labels) and counting it.
  * ``sampled_edges_per_epoch``: edges the sampler returned, summed over batches
    (PyG: edges of the sampled subgraph = all hops; DGL: edges of all blocks). DGL
    samples every block from all its destination nodes (seeds again in each hop),
    PyG each hop only from the nodes new at the previous hop, so DGL returns more
    edges for the same fan-outs. ``layer_edges_per_epoch``: edges the convolutions
    aggregate over (PyG untrimmed: num_layers x subgraph edges; DGL: block edges),
    self loops added inside PyG's GATConv not counted.
  * ``sampled_edges_per_second``: sampled edges / sampling seconds of the sampling
    passes (median over passes); ``epoch_sampled_edges_per_second``: the same over
    the median training epoch.
  * ``peak_rss_mb``: ``ru_maxrss`` of this process (MiB).

Prints one JSON object on stdout; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _load(path: str):
    """``(x float32[N,F], src int64[E], dst int64[E], y int64[N], train_idx int64[T], num_classes)``
    of a dataset file, edges destination-major as stored. h5py + numpy only."""
    import h5py

    with h5py.File(path, "r") as f:
        indptr = np.asarray(f["graph/indptr"][...], dtype=np.int64)
        src = np.asarray(f["graph/indices"][...]).astype(np.int64, copy=False)
        n = indptr.shape[0] - 1
        if "node/feat" not in f or "node/label" not in f or "node/train_mask" not in f:
            raise SystemExit(f"{path}: needs /node/feat, /node/label and /node/train_mask")
        x = np.asarray(f["node/feat"][...], dtype=np.float32)
        y = np.asarray(f["node/label"][...], dtype=np.int64)
        train = np.asarray(f["node/train_mask"][...], dtype=bool)
        num_classes = int(f.attrs["num_classes"]) if "num_classes" in f.attrs else int(y.max()) + 1
    if x.shape[0] != n or y.shape[0] != n or train.shape[0] != n or indptr[-1] != src.shape[0]:
        raise SystemExit(f"{path}: inconsistent shapes (N={n}, feat {x.shape}, label {y.shape}, "
                         f"train_mask {train.shape}, indptr[-1]={indptr[-1]}, E={src.shape[0]})")
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    train_idx = np.flatnonzero(train & (y >= 0)).astype(np.int64)
    return x, src, dst, y, train_idx, num_classes


def _versions(framework: str) -> dict:
    import h5py
    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
         "h5py": h5py.__version__}
    if framework == "pyg":
        import torch_geometric
        from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

        v["torch_geometric"] = torch_geometric.__version__
        v["pyg_lib"] = bool(WITH_PYG_LIB)
        v["torch_sparse"] = None
        if WITH_TORCH_SPARSE:
            import torch_sparse

            v["torch_sparse"] = torch_sparse.__version__
        try:
            import torch_scatter

            v["torch_scatter"] = torch_scatter.__version__
        except ImportError:
            v["torch_scatter"] = None
    else:
        import dgl

        v["dgl"] = dgl.__version__
    return v


# ------------------------------------------------------------------------------------- PyG
class _PyG:
    """Graph, loader, model and batch step of torch_geometric."""

    def __init__(self, args, x, src, dst, y, train_idx, num_classes):
        import torch
        from torch.nn import functional as F
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
        from torch_geometric.nn import GATConv, SAGEConv
        from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

        if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
            raise SystemExit("torch_geometric's NeighborLoader needs pyg-lib or torch-sparse: "
                             "run benchmarks/setup_baselines.sh --pyg and use .venv-pyg/bin/python")
        self.torch, self.F = torch, F
        self.data = Data(x=torch.from_numpy(x), edge_index=torch.stack([torch.from_numpy(src),
                                                                          torch.from_numpy(dst)]),
                         y=torch.from_numpy(y))
        self.loader = NeighborLoader(self.data, num_neighbors=list(args.fanouts), batch_size=args.batch_size,
                                     input_nodes=torch.from_numpy(train_idx), shuffle=True,
                                     num_workers=0)
        self.num_layers = args.num_layers
        dropout, model = args.dropout, args.model

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList()
                width = x.shape[1]
                for layer in range(args.num_layers):
                    last = layer == args.num_layers - 1
                    if model == "sage":
                        out = num_classes if last else args.hidden
                        self.convs.append(SAGEConv(width, out, aggr="mean"))
                        width = out
                    elif last:
                        self.convs.append(GATConv(width, num_classes, heads=1, concat=False))
                    else:
                        self.convs.append(GATConv(width, args.hidden, heads=args.heads, concat=True))
                        width = args.hidden * args.heads
                self.act = F.elu if model == "gat" else F.relu

            def forward(self, h, edge_index):
                for layer, conv in enumerate(self.convs):
                    h = conv(F.dropout(h, dropout, self.training), edge_index)
                    if layer != len(self.convs) - 1:
                        h = self.act(h)
                return h

        self.model = Net()
        self.info = {"trim": False, "self_loops": "GATConv adds one per subgraph node" if model == "gat" else None,
                     "sampler": "pyg-lib" if WITH_PYG_LIB else "torch_sparse.neighbor_sample"}

    def batches(self):
        """Yields ``(inputs, labels, graph, sampled_edges, layer_edges, input_nodes)`` per batch, materialised."""
        for batch in self.loader:
            e = int(batch.edge_index.size(1))
            yield (batch.x, batch.y[:batch.batch_size], (batch.edge_index, batch.batch_size), e,
                   e * self.num_layers, int(batch.num_nodes))

    def forward(self, x, graph):
        edge_index, num_seeds = graph
        return self.model(x, edge_index)[:num_seeds]  # untrimmed: every layer on the whole subgraph


# ------------------------------------------------------------------------------------- DGL
class _DGL:
    """Graph, dataloader, model and batch step of DGL (blocks)."""

    def __init__(self, args, x, src, dst, y, train_idx, num_classes):
        import dgl
        import torch
        from dgl.nn import GATConv, SAGEConv
        from torch.nn import functional as F

        self.torch, self.F = torch, F
        n = x.shape[0]
        g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
        if args.model == "gat":
            g = dgl.add_self_loop(dgl.remove_self_loop(g))
        g.create_formats_()  # CSC for sampling built here, not in the first epoch
        self.g = g
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        # DGL's list runs from the input layer to the seeds: reverse PyG's order
        self.dgl_fanouts = list(reversed(args.fanouts))
        sampler = dgl.dataloading.NeighborSampler(self.dgl_fanouts)
        self.loader = dgl.dataloading.DataLoader(g, torch.from_numpy(train_idx), sampler, device="cpu",
                                                 batch_size=args.batch_size, shuffle=True, drop_last=False,
                                                 num_workers=0)
        dropout, model = args.dropout, args.model

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList()
                width = x.shape[1]
                for layer in range(args.num_layers):
                    last = layer == args.num_layers - 1
                    if model == "sage":
                        out = num_classes if last else args.hidden
                        self.convs.append(SAGEConv(width, out, "mean"))
                        width = out
                    elif last:
                        self.convs.append(GATConv(width, num_classes, num_heads=1, allow_zero_in_degree=True))
                    else:
                        self.convs.append(GATConv(width, args.hidden, num_heads=args.heads,
                                                  allow_zero_in_degree=True))
                        width = args.hidden * args.heads
                self.act = F.elu if model == "gat" else F.relu

            def forward(self, blocks, h):
                for layer, (conv, block) in enumerate(zip(self.convs, blocks)):
                    h = conv(block, F.dropout(h, dropout, self.training))
                    if model == "gat":  # [dst, heads, width]
                        h = h.flatten(1) if layer != len(self.convs) - 1 else h.mean(1)
                    if layer != len(self.convs) - 1:
                        h = self.act(h)
                return h

        self.model = Net()
        self.info = {"trim": True, "dgl_fanouts": self.dgl_fanouts,
                     "self_loops": "added to the graph before sampling" if model == "gat" else None,
                     "sampler": "dgl.dataloading.NeighborSampler"}

    def batches(self):
        for input_nodes, output_nodes, blocks in self.loader:
            x = self.x.index_select(0, input_nodes)
            y = self.y.index_select(0, output_nodes)
            e = sum(int(b.num_edges()) for b in blocks)
            yield x, y, blocks, e, e, int(input_nodes.numel())

    def forward(self, x, graph):
        return self.model(graph, x)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="dataset file (hpc-graph generate|convert)")
    ap.add_argument("--framework", choices=("pyg", "dgl"), required=True)
    ap.add_argument("--model", choices=("sage", "gat"), default="sage")
    ap.add_argument("--fanouts", type=int, nargs="+", default=[15, 10, 5],
                    help="neighbours per hop, PyG's order: the first for the seeds (default 15 10 5)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256, help="hidden width (per head for GAT)")
    ap.add_argument("--heads", type=int, default=4, help="GAT heads in hidden layers")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--sampling-passes", type=int, default=None,
                    help="sampling-only passes over one epoch, after training (default: --epochs)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (and OMP_NUM_THREADS)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.num_layers = len(args.fanouts)
    if args.sampling_passes is None:
        args.sampling_passes = args.epochs
    if args.epochs < 1 or args.batch_size < 1 or args.threads < 1 or args.sampling_passes < 0:
        ap.error("--epochs, --batch-size, --threads must be >= 1, --sampling-passes >= 0")

    # before torch/dgl load their OpenMP runtimes (DGL's sampler uses OpenMP threads too)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["MKL_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    warnings.filterwarnings("ignore", message=".*CPU affinity.*")  # DGL: affinity pinning is off on purpose
    warnings.filterwarnings("ignore", message=".*without a .pyg-lib. installation.*")  # reported as "trim": false
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    t0 = time.perf_counter()
    x, src, dst, y, train_idx, num_classes = _load(args.data)
    n, num_edges = x.shape[0], int(src.shape[0])
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.framework == "dgl":
        import dgl

        dgl.seed(args.seed)
        fw = _DGL(args, x, src, dst, y, train_idx, num_classes)
    else:
        fw = _PyG(args, x, src, dst, y, train_idx, num_classes)
    del src, dst
    setup_s = time.perf_counter() - t0
    F = torch.nn.functional
    model = fw.model
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    print(f"{args.framework}/{args.model}: {n} nodes, {num_edges} edges, {len(train_idx)} training nodes, "
          f"load {load_s:.2f} s, setup {setup_s:.2f} s", file=sys.stderr, flush=True)

    epoch_s, losses, edges_ep, layer_edges_ep, inputs_ep, num_batches = [], [], [], [], [], 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        t = time.perf_counter()
        loss_sum, seeds, edges, layer_edges, inputs, nb = 0.0, 0, 0, 0, 0, 0
        for xb, yb, graph, e, le, ni in fw.batches():
            opt.zero_grad()
            out = fw.forward(xb, graph)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * yb.numel()
            seeds += yb.numel()
            edges, layer_edges, inputs, nb = edges + e, layer_edges + le, inputs + ni, nb + 1
        dt = time.perf_counter() - t
        epoch_s.append(dt)
        losses.append(loss_sum / max(seeds, 1))
        edges_ep.append(edges)
        layer_edges_ep.append(layer_edges)
        inputs_ep.append(inputs)
        num_batches = nb
        print(f"epoch {epoch}: {dt:.3f} s, loss {losses[-1]:.4f}, {nb} batches, {edges} sampled edges",
              file=sys.stderr, flush=True)

    sample_s, sample_edges = [], []
    for p in range(args.sampling_passes):
        t = time.perf_counter()
        edges = 0
        for _xb, _yb, _graph, e, _le, _ni in fw.batches():
            edges += e
        dt = time.perf_counter() - t
        sample_s.append(dt)
        sample_edges.append(edges)
        print(f"sampling pass {p + 1}: {dt:.3f} s, {edges} sampled edges", file=sys.stderr, flush=True)

    steady = epoch_s[1:] or epoch_s
    med_epoch = statistics.median(steady)
    mean_edges = statistics.fmean(edges_ep)
    rates = [e / s for e, s in zip(sample_edges, sample_s) if s > 0]
    result = {
        "framework": args.framework, "versions": _versions(args.framework), "data": os.path.abspath(args.data),
        "num_nodes": n, "num_edges": num_edges, "num_train_nodes": int(len(train_idx)),
        "num_classes": num_classes, "feat_dim": int(x.shape[1]),
        "model": args.model, "num_layers": args.num_layers, "hidden": args.hidden,
        "heads": args.heads if args.model == "gat" else None, "dropout": args.dropout, "lr": args.lr,
        "fanouts": list(args.fanouts), "fanout_order": "first = seeds' hop", "batch_size": args.batch_size,
        "shuffle": True, **fw.info,
        "threads": torch.get_num_threads(), "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "epochs": args.epochs, "num_batches": num_batches,
        "epoch_seconds": epoch_s, "median_epoch_seconds": med_epoch, "loss": losses,
        "sampling_seconds": sample_s,
        "median_sampling_seconds": statistics.median(sample_s) if sample_s else None,
        "sampled_edges_per_epoch": int(round(mean_edges)), "sampled_edges_each_epoch": edges_ep,
        "layer_edges_per_epoch": int(round(statistics.fmean(layer_edges_ep))),
        "input_nodes_per_epoch": int(round(statistics.fmean(inputs_ep))),
        "sampled_edges_per_second": statistics.median(rates) if rates else None,
        "epoch_sampled_edges_per_second": mean_edges / med_epoch if med_epoch > 0 else None,
        "load_seconds": load_s, "setup_seconds": setup_s,
        "peak_rss_mb": _peak_rss_mb(), "num_parameters": sum(p.numel() for p in model.parameters()),
        "loadavg": list(os.getloadavg()),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
