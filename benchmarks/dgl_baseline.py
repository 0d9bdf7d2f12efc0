"""DGL reference: full-batch training of a 3-layer GCN, GraphSAGE or GAT with DGL 2.1 on one process,
and a timing of DGL's sparse kernels.

    .venv-dgl/bin/python benchmarks/dgl_baseline.py DATA.h5 --model gcn --hidden 128 --epochs 5 --run-dir DIR
    .venv-dgl/bin/python benchmarks/dgl_baseline.py DATA.h5 --model sage --hidden 128 --epochs 5 --run-dir DIR
    .venv-dgl/bin/python benchmarks/dgl_baseline.py DATA.h5 --model gat --hidden 32 --heads 4 --epochs 5 --run-dir DIR
    .venv-dgl/bin/python benchmarks/dgl_baseline.py kernels GRAPH.h5 --feat 128 --heads 4 --json OUT.jsonl

Training (the same command line, model, timing window and outputs as
``benchmarks/pyg_baseline.py``): ``num_layers`` convolutions, dropout before
every layer (input features too), ReLU (GCN, SAGE) or ELU (GAT) between layers;
GAT hidden layers concatenate ``heads`` heads of ``hidden`` features and the
output layer has one head. Adam, cross entropy over the training nodes
(``train_mask`` and label >= 0), the whole graph every step.

* ``gcn``: ``dgl.nn.GraphConv(norm="both")`` on the graph with one self loop
  per node added. DGL scales sources by ``out_degree^-1/2`` and destinations by
  ``in_degree^-1/2``; hpc_graph's ``GCNConv`` (and PyG's) use the in-degree + 1
  on both sides. The two agree on a symmetric graph (``hpc-graph generate rmat``
  symmetrises by default) without self loops of its own (removed by default).
* ``sage``: ``dgl.nn.SAGEConv(aggregator_type="mean")`` on the graph as stored.
* ``gat``: ``dgl.nn.GATConv`` on the graph with one self loop per node added.

Initial weights are drawn as hpc_graph's and PyG's layers draw them (``--init
ours``, the default: DGL's Xavier with the ReLU gain for SAGEConv/GATConv starts
raw-feature runs at several times the loss); ``--init dgl`` keeps DGL's. The
timing does not depend on it.

The graph is built straight from the file's CSR over destinations, which is
DGL's ``("csc", (indptr, indices, eids))`` input (sources as column indices,
edge ids ``0..E-1`` in storage order, given explicitly: with implicit ids DGL
2.1's libxsmm SpMM aborts in GATConv's backward); self loops are inserted at the
end of every row in NumPy. The sparse formats the model's step uses are created
before the first epoch (``create_formats_``), so no epoch pays for a format
conversion: the ones DGL would create by itself on the first step (CSC + CSR for
GCN and SAGE, COO + CSR + CSC for GAT), and no other (``FORMATS``). Node ids are int32 by default
(``--idtype``; DGL's own default is int64) when the graph fits.

Timing covers exactly what the trainer's ``epoch_seconds`` covers: zero_grad,
forward, loss, backward, optimizer step. Writes ``DIR/metrics.rank0.jsonl``
and ``DIR/summary.json`` in the trainer's layout (``engine: "dgl"``) so that
``hpc-graph report`` and ``hpc_graph.train.report.plot_compare`` read it, and
prints one JSON object on stdout: per-epoch seconds, median of epochs 2..E,
peak RSS (``ru_maxrss`` of this process, MiB) and the thread counts.

Threads: ``--threads N`` (default: ``OMP_NUM_THREADS``, else torch's default)
goes to ``OMP_NUM_THREADS`` before torch and DGL load, to
``torch.set_num_threads`` and to ``dgl.utils.set_num_threads``: DGL's kernels
run on the system libgomp, torch on its own bundled copy, so both pools are set.

``kernels`` mode times single DGL calls on an hpc_graph dataset file (usually
``hpc-graph generate rmat --scale S --no-symmetrize --feat-dim 0``, the graph of
``hpc-graph bench kernels --scale S``), forward and forward + backward, one
untimed warm-up call then the median of ``--repeat`` timed calls, and prints one
JSON record per measurement with the fields of ``hpc-graph bench kernels``
(``op, impl="dgl", scale, feat, heads, seconds, peak_mb, threads,
requires_grad``, plus ``api``, ``num_nodes``, ``num_edges``, ``runs``):

* ``spmm``: ``dgl.ops.gspmm(g, "copy_lhs", "sum", X, None)``, X ``[N, feat]``.
* ``sddmm_dot``: ``dgl.ops.gsddmm(g, "dot", A, B, "u", "v")``, A, B ``[N, heads, feat/heads]``.
* ``sddmm_add``: ``dgl.ops.gsddmm(g, "add", a, b, "u", "v")`` (``u_add_v``), a, b ``[N, heads]``:
  GAT's per-edge score.
* ``edge_softmax``: ``dgl.ops.edge_softmax(g, S)``, S ``[E, heads]``, normalised over
  the in-edges of every destination.
* ``sage``, ``gat``: one ``SAGEConv`` (mean, feat -> feat) / ``GATConv`` (heads x
  feat/heads, self loops added) layer, as ``hpc-graph bench kernels`` times ours.

Backward: the inputs require grad and ``out.backward(G)`` runs with a fixed
random ``G``; ``requires_grad=False`` runs time the forward alone (``sage``/``gat``
always run their backward, as ours do, with the input features' grad off or on).
``peak_mb`` is the process's peak RSS during the timed call above its RSS at the
call's start (the kernel's peak high-water mark, reset through
``/proc/self/clear_refs`` before each call; a 1 ms RSS sampler where that is
not allowed), the largest over the timed calls.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # data_io (needs only h5py and numpy)

KERNEL_OPS = ("spmm", "sddmm_dot", "sddmm_add", "edge_softmax", "sage", "gat")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _set_threads(threads: int | None) -> int | None:
    """Export ``threads`` as OMP_NUM_THREADS before torch/DGL load their OpenMP runtimes."""
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("DGLBACKEND", "pytorch")
    return threads


def _import_dgl(threads: int | None):
    """``(torch, dgl)`` with both OpenMP pools (torch's bundled libgomp, DGL's system one) at ``threads``."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*CPU affinity.*")
    import dgl
    import dgl.utils

    if threads is not None:
        torch.set_num_threads(threads)
        dgl.utils.set_num_threads(threads)
    return torch, dgl


def _versions(torch, dgl) -> dict:
    import h5py

    return {"python": sys.version.split()[0], "torch": torch.__version__, "dgl": dgl.__version__,
            "numpy": np.__version__, "h5py": h5py.__version__}


def _read_graph(path: str, features: bool = True):
    """``(indptr int64[N+1], indices int64[E], x float32[N,F] | None, y int64[N] | None, train bool[N] | None)``
    of a dataset file: CSR over destinations, ``indices`` are the sources."""
    from data_io.dataset import open_dataset

    with open_dataset(path) as ds:
        n = ds.num_nodes
        indptr = np.asarray(ds.indptr(), dtype=np.int64)
        indices = np.asarray(ds.indices())
        if not features:
            return indptr, indices, None, None, None
        x = np.ascontiguousarray(ds.feat_rows(0, n), dtype=np.float32)
        y = np.asarray(ds.label(), dtype=np.int64)
        train = np.asarray(ds.mask("train_mask"), dtype=bool)
    return indptr, indices, x, y, train


def _with_self_loops(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR with node ``i`` appended to row ``i`` (one self loop per node), in O(N + E)."""
    n = indptr.shape[0] - 1
    new_indptr = indptr + np.arange(n + 1, dtype=indptr.dtype)
    loop_pos = new_indptr[1:] - 1
    new_indices = np.empty(indices.shape[0] + n, dtype=indices.dtype)
    keep = np.ones(new_indices.shape[0], dtype=bool)
    keep[loop_pos] = False
    new_indices[keep] = indices
    new_indices[loop_pos] = np.arange(n, dtype=indices.dtype)
    return new_indptr, new_indices


def _pick_idtype(idtype: str, num_nodes: int, num_edges: int) -> str:
    if idtype == "auto":
        return "int32" if max(num_nodes, num_edges) < 2**31 - 1 else "int64"
    return idtype


# The sparse formats DGL 2.1 creates on its own during a training step from a CSC-built graph
# (checked with g.formats() after one forward + backward): GraphConv and SAGEConv aggregate over
# CSC and need CSR for the backward (GraphConv's out-degrees too); GATConv's SDDMM adds COO.
FORMATS = {"gcn": ("csc", "csr"), "sage": ("csc", "csr"), "gat": ("coo", "csr", "csc")}


def _build_graph(torch, dgl, indptr: np.ndarray, indices: np.ndarray, self_loops: bool, idtype: str,
                 formats: tuple[str, ...] = ("coo", "csr", "csc")):
    """DGLGraph from a CSR over destinations (DGL's CSC input), ``formats`` allowed and materialised."""
    if self_loops:
        indptr, indices = _with_self_loops(indptr, indices)
    n = indptr.shape[0] - 1
    np_t = np.int32 if _pick_idtype(idtype, n, indices.shape[0]) == "int32" else np.int64
    ip = torch.from_numpy(indptr.astype(np_t, copy=False))
    ix = torch.from_numpy(indices.astype(np_t, copy=False))
    # explicit edge ids: with implicit ones (an empty tensor) DGL 2.1's libxsmm SpMM aborts ("Check notnull:
    # edges") in GATConv's backward; a graph built from (src, dst) carries such an array as well
    eids = torch.arange(ix.shape[0], dtype=ip.dtype)
    g = dgl.graph(("csc", (ip, ix, eids)), num_nodes=n)
    g = g.formats(list(formats))
    g.create_formats_()
    return g


def _reinit_like_ours(net) -> None:
    """Re-draw DGL's initial weights from the distributions hpc_graph's (and PyG's) layers use.

    DGL initialises SAGEConv and GATConv with Xavier and the ReLU gain (sqrt 2), which
    on raw N(0, 1) features gives epoch-1 losses several times those of hpc_graph and
    PyG; the computation (and so the timing) does not depend on it. GraphConv's
    Xavier uniform (gain 1) with a zero bias is already hpc_graph's GCN init.
    SAGE: both projections and the bias ~ U(+-1/sqrt(F_in)) (``torch.nn.Linear``'s default).
    GAT: projection and attention vectors Glorot uniform, fans from the last two dims; bias 0.
    """
    import torch
    from dgl.nn import GATConv, SAGEConv

    def glorot(t):
        bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
        torch.nn.init.uniform_(t, -bound, bound)

    with torch.no_grad():
        for conv in net.convs:
            if isinstance(conv, SAGEConv):
                fan_in = conv.fc_neigh.weight.shape[1]
                bound = 1.0 / math.sqrt(fan_in)
                for t in conv.parameters():  # fc_neigh.weight, fc_self.weight and the bias (fc_self.bias)
                    torch.nn.init.uniform_(t, -bound, bound)
            elif isinstance(conv, GATConv):
                glorot(conv.fc.weight)
                glorot(conv.attn_l)
                glorot(conv.attn_r)
                if conv.bias is not None:
                    torch.nn.init.zeros_(conv.bias)


class _Net:
    """Builds the torch.nn.Module lazily so that importing this file does not import DGL."""

    @staticmethod
    def build(model: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, heads: int,
              dropout: float):
        import torch
        from dgl.nn import GATConv, GraphConv, SAGEConv
        from torch.nn import functional as F

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList()
                width = in_dim
                for layer in range(num_layers):
                    last = layer == num_layers - 1
                    if model in ("gcn", "sage"):
                        out = out_dim if last else hidden
                        self.convs.append(GraphConv(width, out, norm="both") if model == "gcn"
                                          else SAGEConv(width, out, aggregator_type="mean"))
                        width = out
                    elif last:
                        self.convs.append(GATConv(width, out_dim, num_heads=1))
                        width = out_dim
                    else:
                        self.convs.append(GATConv(width, hidden, num_heads=heads))
                        width = hidden * heads
                self.act = F.elu if model == "gat" else F.relu

            def forward(self, g, x):
                h = x
                last = len(self.convs) - 1
                for layer, conv in enumerate(self.convs):
                    h = conv(g, F.dropout(h, dropout, self.training))
                    if model == "gat":  # [N, heads, D]: concatenate hidden heads, average the output head(s)
                        h = h.mean(1) if layer == last else h.flatten(1)
                    if layer != last:
                        h = self.act(h)
                return h

        return Net()


# ------------------------------------------------------------------------------------- training
def train_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="dataset file (hpc-graph generate|convert)")
    ap.add_argument("--model", choices=("gcn", "sage", "gat"), required=True)
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (per head for GAT)")
    ap.add_argument("--heads", type=int, default=4, help="GAT heads in hidden layers")
    ap.add_argument("--num-layers", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idtype", choices=("auto", "int32", "int64"), default="auto",
                    help="DGL node/edge id type (auto: int32 when the graph fits; DGL's default is int64)")
    ap.add_argument("--init", choices=("ours", "dgl"), default="ours",
                    help="initial weights: drawn as hpc_graph/PyG draw them (default; comparable losses) or "
                         "DGL's own (Xavier with the ReLU gain for SAGE/GAT); no effect on the timing")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and DGL OpenMP threads (default: OMP_NUM_THREADS, else torch's default)")
    ap.add_argument("--run-dir", type=Path, default=None, help="write metrics.rank0.jsonl + summary.json here")
    ap.add_argument("--profile", type=Path, default=None,
                    help="after the timed epochs, profile one more and write its breakdown (benchmarks/_breakdown.py) "
                         "here as JSON")
    args = ap.parse_args(argv)

    threads = _set_threads(args.threads)
    torch, dgl = _import_dgl(threads)
    from torch.nn import functional as F

    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    t0 = time.perf_counter()
    indptr, indices, x_np, y_np, train_np = _read_graph(args.data)
    n = indptr.shape[0] - 1
    num_edges = int(indices.shape[0])
    x = torch.from_numpy(x_np)
    y = torch.from_numpy(y_np)
    train_idx = torch.from_numpy(np.flatnonzero(train_np & (y_np >= 0)).astype(np.int64))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = _build_graph(torch, dgl, indptr, indices, self_loops=args.model in ("gcn", "gat"), idtype=args.idtype,
                     formats=FORMATS[args.model])
    del indptr, indices
    graph_s = time.perf_counter() - t0
    num_classes = int(y.max()) + 1
    model = _Net.build(args.model, x.shape[1], args.hidden, num_classes, args.num_layers, args.heads,
                       args.dropout)
    if args.init == "ours":
        _reinit_like_ours(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rows, seconds = [], []
    for epoch in range(1, args.epochs + 1):
        t = time.perf_counter()
        model.train()
        opt.zero_grad()
        out = model(g, x)
        loss = F.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t
        loss = float(loss.detach())
        del out
        seconds.append(dt)
        rows.append({"rank": 0, "epoch": epoch, "loss": loss, "train_acc": None, "val_acc": None,
                     "test_acc": None, "lr": args.lr, "epoch_seconds": dt, "compute_seconds": dt,
                     "comm_seconds": 0.0, "bytes_sent": 0, "eval_seconds": 0.0, "eval_bytes_sent": 0,
                     "peak_rss_mb": _peak_rss_mb(), "engine_stats": {}})
        print(f"epoch {epoch}: {dt:.3f} s, loss {loss:.4f}", file=sys.stderr, flush=True)
    if args.profile is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _breakdown import profile_step

        def _step():
            model.train()
            opt.zero_grad()
            loss = F.cross_entropy(model(g, x)[train_idx], y[train_idx])
            loss.backward()
            opt.step()

        args.profile.write_text(json.dumps({"framework": "dgl", "model": args.model, **profile_step(_step)}) + "\n",
                                encoding="utf-8")
    steady = seconds[1:] or seconds
    result = {"engine": "dgl", "model": args.model, "idtype": str(g.idtype).replace("torch.", ""),
              "init": args.init, "formats": g.formats()["created"],
              "num_nodes": n, "num_edges": num_edges, "graph_edges": int(g.num_edges()),
              "self_loops": args.model in ("gcn", "gat"), "epochs": args.epochs, "epoch_seconds": seconds,
              "median_epoch_seconds": statistics.median(steady), "load_seconds": load_s,
              "graph_seconds": graph_s, "peak_rss_mb": _peak_rss_mb(), "torch_threads": torch.get_num_threads(),
              "dgl_threads": dgl.utils.get_num_threads(), "losses": [r["loss"] for r in rows],
              "num_parameters": sum(p.numel() for p in model.parameters()), "versions": _versions(torch, dgl)}
    if args.run_dir is not None:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        with open(args.run_dir / "metrics.rank0.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        summary = {"engine": "dgl", "world_size": 1, "epochs": args.epochs,
                   "median_epoch_seconds": statistics.median(seconds), "peak_rss_mb": [result["peak_rss_mb"]],
                   "num_parameters": result["num_parameters"], "run_dir": str(args.run_dir),
                   "best_val_acc": None, "test_acc": None, "best_epoch": None,
                   "final": {"loss": rows[-1]["loss"] if rows else None}}
        (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------------- kernels
class _PeakRSS:
    """Peak RSS (MiB) of a block above the RSS at its start.

    Resets the kernel's high-water mark (``VmHWM``) by writing 5 to
    ``/proc/self/clear_refs`` and reads it back on exit, which also sees peaks
    inside C++ calls that hold the GIL; where that file is not writable, a
    background thread samples the RSS every millisecond instead (a lower bound).
    """

    def __init__(self):
        self.extra_mb = 0.0
        self.method = None

    @staticmethod
    def _status_kib(field: str) -> int:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise OSError(f"{field} not in /proc/self/status")

    def __enter__(self):
        import gc
        import threading

        gc.collect()
        self._base = self._status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            self.method = "vmhwm"
        except OSError:
            self.method = "sampler"
            self._peak = self._base
            self._stop = threading.Event()

            def poll():
                while not self._stop.is_set():
                    self._peak = max(self._peak, self._status_kib("VmRSS"))
                    time.sleep(0.001)

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.method == "vmhwm":
            peak = self._status_kib("VmHWM")
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, self._status_kib("VmRSS"))
        self.extra_mb = max(0.0, (peak - self._base) / 1024.0)


def _time_calls(fn, repeat: int) -> dict:
    """One untimed warm-up call, then ``repeat`` timed ones: median seconds and the largest extra peak RSS."""
    fn()
    runs, peaks, method = [], [], None
    for _ in range(repeat):
        with _PeakRSS() as mem:
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        peaks.append(mem.extra_mb)
        method = mem.method
    return {"seconds": statistics.median(runs), "seconds_min": min(runs), "runs": runs, "peak_mb": max(peaks),
            "peak_method": method}


def kernels_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dgl_baseline.py kernels",
                                 description="Time DGL's gspmm / gsddmm / edge_softmax (and one SAGEConv / "
                                             "GATConv layer) on the graph of a dataset file; one JSON record "
                                             "per measurement, fields as in `hpc-graph bench kernels`.")
    ap.add_argument("graph", help="dataset file, e.g. hpc-graph generate rmat --scale 20 --no-symmetrize "
                                  "--feat-dim 0 -o rmat20-directed.h5")
    ap.add_argument("--feat", type=int, default=128, help="feature width F (default: %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="heads H of the SDDMM / softmax / GAT inputs; F/H "
                                                         "features each (default: %(default)s)")
    ap.add_argument("--ops", nargs="+", choices=KERNEL_OPS, default=list(KERNEL_OPS))
    ap.add_argument("--grad", choices=("both", "off", "on"), default="both",
                    help="off: forward only; on: forward + backward; both (default)")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per measurement, median (default: 3)")
    ap.add_argument("--idtype", choices=("auto", "int32", "int64"), default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and DGL OpenMP threads (default: OMP_NUM_THREADS, else torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the records here (JSON Lines)")
    args = ap.parse_args(argv)
    if args.heads < 1 or args.feat % args.heads:
        ap.error(f"--heads: must be >= 1 and divide --feat={args.feat}")
    if args.repeat < 1:
        ap.error("--repeat: at least 1")

    threads = _set_threads(args.threads)
    torch, dgl = _import_dgl(threads)
    import dgl.ops as ops
    from dgl.nn import GATConv, SAGEConv

    indptr, indices, _, _, _ = _read_graph(args.graph, features=False)
    n, e = indptr.shape[0] - 1, int(indices.shape[0])
    F_, H = args.feat, args.heads
    D = F_ // H
    g = _build_graph(torch, dgl, indptr, indices, self_loops=False, idtype=args.idtype)
    g_loops = None
    base = {"impl": "dgl", "scale": int(round(math.log2(n))) if n > 0 else 0, "feat": F_, "heads": H,
            "threads": dgl.utils.get_num_threads(), "torch_threads": torch.get_num_threads(),
            "num_nodes": n, "num_edges": e, "idtype": str(g.idtype).replace("torch.", ""),
            "dgl": dgl.__version__, "torch": torch.__version__}
    gen = torch.Generator().manual_seed(args.seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x_nf = randn(n, F_)
    grads = {"both": (False, True), "off": (False,), "on": (True,)}[args.grad]
    records = []

    def emit(op, rg, api, res, **extra):
        rec = {"op": op, **base, "requires_grad": rg, "api": api, **res, **extra}
        records.append(rec)
        print(json.dumps(rec), flush=True)
        print(f"{op:13s} grad={str(rg):5s} {rec['seconds']:8.4f} s  peak +{rec['peak_mb']:.1f} MiB",
              file=sys.stderr, flush=True)

    def step(fn, inputs, gout, params=()):
        """Forward ``fn(*inputs)``; with ``gout``, backward too; gradients dropped afterwards."""
        def call():
            out = fn(*inputs)
            if gout is not None:
                out.backward(gout)
                for t in list(inputs) + list(params):
                    t.grad = None
            del out
        return call

    for op in args.ops:
        for rg in grads:
            if op == "spmm":
                xin = x_nf.detach().requires_grad_(rg)
                res = _time_calls(step(lambda a: ops.gspmm(g, "copy_lhs", "sum", a, None), [xin],
                                       randn(n, F_) if rg else None), args.repeat)
                emit(op, rg, 'dgl.ops.gspmm(g, "copy_lhs", "sum", X[N,F], None)', res)
            elif op == "sddmm_dot":
                a = randn(n, H, D).requires_grad_(rg)
                b = randn(n, H, D).requires_grad_(rg)
                res = _time_calls(step(lambda u, v: ops.gsddmm(g, "dot", u, v, "u", "v"), [a, b],
                                       randn(e, H, 1) if rg else None), args.repeat)
                emit(op, rg, 'dgl.ops.gsddmm(g, "dot", A[N,H,F/H], B[N,H,F/H], "u", "v")', res)
            elif op == "sddmm_add":
                a = randn(n, H).requires_grad_(rg)
                b = randn(n, H).requires_grad_(rg)
                res = _time_calls(step(lambda u, v: ops.gsddmm(g, "add", u, v, "u", "v"), [a, b],
                                       randn(e, H) if rg else None), args.repeat)
                emit(op, rg, 'dgl.ops.gsddmm(g, "add", a[N,H], b[N,H], "u", "v")  (u_add_v)', res)
            elif op == "edge_softmax":
                s = randn(e, H).requires_grad_(rg)
                res = _time_calls(step(lambda t: ops.edge_softmax(g, t), [s], randn(e, H) if rg else None),
                                  args.repeat)
                emit(op, rg, "dgl.ops.edge_softmax(g, S[E,H])  (over in-edges)", res)
            elif op == "sage":
                torch.manual_seed(args.seed)
                layer = SAGEConv(F_, F_, aggregator_type="mean")
                xin = x_nf.detach().requires_grad_(rg)
                res = _time_calls(step(lambda t: layer(g, t), [xin], randn(n, F_), list(layer.parameters())),
                                  args.repeat)
                emit(op, rg, 'dgl.nn.SAGEConv(F, F, "mean"), forward + backward', res)
            elif op == "gat":
                if g_loops is None:
                    g_loops = _build_graph(torch, dgl, indptr, indices, self_loops=True, idtype=args.idtype)
                torch.manual_seed(args.seed)
                layer = GATConv(F_, D, num_heads=H)
                xin = x_nf.detach().requires_grad_(rg)
                res = _time_calls(step(lambda t: layer(g_loops, t).flatten(1), [xin], randn(n, H * D),
                                       list(layer.parameters())), args.repeat)
                emit(op, rg, "dgl.nn.GATConv(F, F/H, num_heads=H) with self loops, forward + backward", res,
                     num_edges_with_loops=int(g_loops.num_edges()))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "kernels":
        return kernels_main(argv[1:])
    return train_main(argv)


if __name__ == "__main__":
    sys.exit(main())
