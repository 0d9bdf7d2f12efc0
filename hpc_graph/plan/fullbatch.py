"""Predicted peak memory and epoch time per rank of the full-batch engines (``single``, ``dp``, ``sar``, ``sylvie``,
``flow``).

How it works: one training step (forward, loss, backward, gradient all-reduce, optimiser step) is
*walked* for one rank the way the engine runs it, tensor by tensor, from the sizes alone. Every
allocation and free is recorded on a :class:`_Tape`, which keeps the live bytes and their high-water
mark by component; every kernel call, GEMM, elementwise pass and message is recorded as work, which
the machine's measured rates turn into seconds. Nothing is allocated and nothing is timed here, so a
plan for ogbn-papers100M on 256 ranks costs milliseconds.

Inputs:

* :class:`GraphShape`: nodes, stored edges (CSR entries: an undirected graph counts both
  directions), features, classes, training nodes, directed or not;
* a :class:`Layout` per rank count: what each rank holds (:class:`RankShape`: owned nodes,
  in-edges, edges from owned sources, halo rows per peer, rows sent per peer), read from a partition
  directory (:func:`layout_from_partition`) or from the *cut model* (:func:`layout_from_cut_model`);
* :class:`ModelSpec`: model, widths, layers, heads, dropout, dtype, optimiser (GCN, SAGE, GAT and
  MLP; every other model is refused by name, see :data:`MODELS`);
* :class:`Rates`: kernel and link rates from :mod:`hpc_graph.plan.profile` (only for time).

What a rank holds (bytes; ``I = 8``: a row pointer or id, int64 in memory; ``C = 4``: a column index,
int32; ``d``: dtype bytes; ``n`` owned rows, ``h`` halo rows, ``E`` in-edges, ``E_p`` edges from owned
sources, ``S`` rows sent, ``r`` peers):

* graph: ``single`` the CSR (``(N+1) I + E C``), its transpose when the graph is not symmetric, node
  ids; GAT a self-loop copy of the CSR and its transpose; ``dp`` the ``[owned | halo]`` CSR and its
  transpose, node ids of owned and halo nodes (6 id vectors), send lists; ``sar`` one CSR block per
  source partition (``(r+1)(n+1) I + E C``) and their transposes (GCN/SAGE) or the remote blocks'
  transposes and an identity block (GAT); column-blocked copies of any CSR whose source rows outgrow
  the cache (``hpc_graph.ops.spmm.BLOCK_BYTES``; int32 indices);
* features ``n F d`` (twice with ``data.feature_norm: row``), labels, masks, training ids;
* parameters, their gradients and the optimiser state (Adam: 2x), and the best-validation copy;
* what autograd keeps for the backward pass, per layer, exactly as the layers save it (the counts
  of ``torch.autograd.graph.saved_tensors_hooks``);
* halo buffers (send, receive and concatenated rows) and other temporaries, live only around the
  operation that makes them;
* the process floor (Python, torch, numba and its compiled kernels, MPI), measured at plan time.

The peak is also taken over the loading phase (reading the part; ``sar`` splitting its CSR into
blocks keeps the CSR, a running count and the blocks at once, 17 bytes per edge).

Epoch time of a rank = compute (SpMM and attention kernels at edges x width, GEMM flops, memory
passes of elementwise ops, each at the measured rate) + halo exchange (``alpha`` per message +
bytes / ``beta``) + gradient all-reduce, at the threads the rank gets; the epoch is the slowest
rank's. See docs/plan.md for the assumptions and the accuracy measured against real runs.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

ENGINES = ("single", "dp", "sar", "sylvie", "flow")
#: models whose layer shapes this planner describes (GNN stacks without residuals or batch norm, MLP)
MODELS = ("gcn", "sage", "gat", "mlp")
DTYPE_BYTES = {"float32": 4, "float64": 8}
IDX = 8  # row pointers, ids, permutations: int64 in memory
COL = 4  # a CSR's column indices (and a transpose's row ids): int32 in memory (CSR keeps int32 where ids fit)
#: what the process floor is when it cannot be measured: Python, torch, numba with the compiled kernels
#: and MPI, measured by a 3-epoch training run on a 1024-node graph on the development machine
DEFAULT_FLOOR_BYTES = 480 << 20
#: resident memory the compiled kernels add to a process that imported torch and numba (measured:
#: ~290 MiB after the imports, ~450-480 MiB after a training epoch on a tiny graph)
KERNEL_ALLOWANCE_BYTES = 170 << 20
#: what MPI adds to a rank of a multi-rank job (measured: 2 and 4 ranks of a 1024-node graph, 14-20 MiB above
#: the same run on one process)
MPI_ALLOWANCE_BYTES = 16 << 20
COMPONENTS = ("floor", "graph", "features", "params", "activations", "halo", "workspace")


# -- inputs -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GraphShape:
    """The whole graph.

    Attributes:
        nodes: N. edges: E, stored in-edges (CSR entries; an undirected graph counts both directions).
        features: F, input feature width. classes: C. train_nodes: labelled training nodes.
        directed: the CSR is not its own transpose (an undirected graph stored with ascending rows is).
        disk_index_bytes: bytes per stored index in the dataset file (4: int32, kept; 8: converted to int32).
        name: for messages.
    """

    nodes: int
    edges: int
    features: int
    classes: int
    train_nodes: int = 0
    directed: bool = False
    disk_index_bytes: int = 4
    name: str = "graph"


@dataclasses.dataclass(frozen=True)
class RankShape:
    """What one rank of a partitioned graph holds (the sizes the engines allocate from).

    Attributes:
        rank: part id p. owned: n owned nodes. edges: E in-edges of owned nodes.
        local_edges: in-edges whose source is owned too (E minus the cut edges into p).
        halo: h distinct remote sources. send: S rows sent per halo exchange (sum over peers).
        train: training nodes owned.
        halo_from: rows of part q in this rank's halo, per q (len P; 0 for q == p).
        send_to: rows this rank sends to part q, per q (len P).
        boundary: distinct owned rows sent to any peer (-1: unknown, then ``min(send, owned)``).
    """

    rank: int
    owned: int
    edges: int
    local_edges: int
    halo: int
    send: int
    train: int
    halo_from: tuple[int, ...]
    send_to: tuple[int, ...]
    boundary: int = -1
    edges_from: tuple[int, ...] = ()  # in-edges whose source part q owns, per q (empty: unknown)

    @property
    def boundary_rows(self) -> int:
        return self.boundary if self.boundary >= 0 else min(self.send, self.owned)

    @property
    def peers(self) -> int:
        """Parts this rank receives halo rows from (SAR: remote blocks)."""
        return sum(1 for c in self.halo_from if c > 0)

    @property
    def send_peers(self) -> int:
        return sum(1 for c in self.send_to if c > 0)


@dataclasses.dataclass
class Layout:
    """The ranks of one rank count: ``parts`` (every rank of a partition, or the bottleneck rank of
    the cut model standing for all ``ranks``) and where the numbers come from (``source``)."""

    ranks: int
    parts: list[RankShape]
    source: str
    cut_fraction: float
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model as the trainer builds it (``hpc_graph.nn.build_model``) and trains it.

    Attributes:
        name: one of :data:`MODELS`. in_dim: input width (features, plus classes with label
        augmentation). hidden: hidden width (per head for GAT). classes: output width. layers: layers.
        heads, out_heads: GAT heads of hidden / output layers. dropout: feature dropout.
        dtype: ``float32`` or ``float64``. optimizer: ``adam`` or ``sgd`` (momentum: SGD buffers).
        feature_copies: 2 with ``data.feature_norm: row`` (the engine's and the normalised copy).
    """

    name: str
    in_dim: int
    hidden: int
    classes: int
    layers: int = 2
    heads: int = 1
    out_heads: int = 1
    dropout: float = 0.5
    dtype: str = "float32"
    optimizer: str = "adam"
    momentum: float = 0.0
    feature_copies: int = 1

    @property
    def dbytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def layer_dims(self) -> list[tuple[int, int, int, int]]:
        """``(fin, fout, heads, dim)`` per layer; ``fout = heads * dim`` (GAT output layer: heads
        averaged, ``fout = dim``)."""
        out, width = [], self.in_dim
        for layer in range(self.layers):
            last = layer == self.layers - 1
            if self.name == "gat":
                heads = self.out_heads if last else self.heads
                dim = self.classes if last else self.hidden
                fout = dim if last else heads * dim
            else:
                heads, dim = 1, (self.classes if last else self.hidden)
                fout = dim
            out.append((width, fout, heads, dim))
            width = fout
        return out

    def num_params(self, start: int = 0, stop: int | None = None) -> int:
        """Parameters of layers ``start .. stop - 1`` (default: the whole model)."""
        total = 0
        for fin, fout, heads, dim in self.layer_dims()[start:stop]:
            if self.name == "gcn":
                total += fin * fout + fout
            elif self.name == "sage":
                total += 2 * fin * fout + fout
            elif self.name == "gat":
                total += fin * heads * dim + 2 * heads * dim + fout
            else:  # mlp
                total += fin * fout + fout
        return total


def model_spec(model: Any, num_features: int, num_classes: int, *, dtype: str = "float32",
               optimizer: str = "adam", momentum: float = 0.0, feature_norm: str = "none",
               label_aug: float = 0.0) -> ModelSpec:
    """A :class:`ModelSpec` from a config's ``model`` section (any object with its fields).

    Raises:
        ValueError naming ``model.<field>`` for a model or option the planner does not describe.
    """
    name = str(model.name)
    if name not in MODELS:
        raise ValueError(f"model.name: the planner describes models {', '.join(MODELS)}, not {name!r} "
                         "(its layer shapes are not modelled)")
    for flag in ("residual", "batchnorm"):
        if getattr(model, flag, False):
            raise ValueError(f"model.{flag}: not modelled by the planner (GNN stacks without residuals and "
                             "batch norm)")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"train.dtype: must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    in_dim = int(num_features) + (int(num_classes) if label_aug and label_aug > 0 else 0)
    return ModelSpec(name=name, in_dim=in_dim, hidden=int(model.hidden), classes=int(num_classes),
                     layers=int(model.num_layers), heads=int(getattr(model, "heads", 1)),
                     out_heads=int(getattr(model, "out_heads", 1)), dropout=float(model.dropout), dtype=dtype,
                     optimizer=str(optimizer), momentum=float(momentum),
                     feature_copies=2 if feature_norm == "row" else 1)


@dataclasses.dataclass(frozen=True)
class HaloCodec:
    """How ``sylvie`` sends halo rows and halo gradients (its ``engine`` options).

    Attributes:
        bits: bits per row (1, 2, 4, 8: quantised; 32: full precision). ``engine.bits: auto`` gives
            every row 1 to 8 bits by its degree and the epoch's base width; the planner counts 8 (the
            most the policy gives, so the memory is an upper bound) and says so (``auto`` True).
        pipeline: ``off`` (synchronous) or ``on``/``adaptive`` (halo rows and gradients one epoch
            stale, exchanged behind the next epoch's computation; every layer keeps two sets of halo
            rows and halo gradients between epochs).
        param_bytes: bytes of each quantised row's zero point and scale (float32: 4, float16: 2).
    """

    bits: int = 8
    pipeline: str = "off"
    param_bytes: int = 4
    auto: bool = False

    @classmethod
    def from_options(cls, bits: Any = "auto", pipeline: str = "off", scale_dtype: str = "float32") -> "HaloCodec":
        """From ``engine.bits``, ``engine.pipeline`` and ``engine.scale_dtype``; ValueError naming the option."""
        auto = bits == "auto"
        b = 8 if auto else (int(bits) if isinstance(bits, (int, str)) and str(bits).isdigit() else None)
        if isinstance(bits, bool) or b not in (1, 2, 4, 8, 32):
            raise ValueError(f"engine.bits: must be one of auto, 1, 2, 4, 8, 32, got {bits!r}")
        if pipeline not in ("off", "on", "adaptive"):
            raise ValueError(f"engine.pipeline: must be one of off, on, adaptive, got {pipeline!r}")
        if scale_dtype not in ("float32", "float16"):
            raise ValueError(f"engine.scale_dtype: must be float32 or float16, got {scale_dtype!r}")
        return cls(bits=b, pipeline=pipeline, param_bytes=4 if scale_dtype == "float32" else 2, auto=auto)

    @property
    def stale(self) -> bool:
        return self.pipeline != "off"

    def message_bytes(self, rows: float, width: float, extra: float, itemsize: int) -> int:
        """Bytes of one message of ``rows`` rows (``hpc_graph.ops.quant``'s layout): quantised rows carry a zero
        point, a scale and ``width * bits`` bits (padded to a byte per message); ``extra`` columns go unquantised."""
        rows, width, extra = int(rows), int(width), int(extra)
        if rows <= 0:
            return 0
        if self.bits == 32:
            return rows * (width + extra) * itemsize
        return rows * extra * itemsize + 2 * rows * self.param_bytes + -(-rows * width * self.bits // 8)

    def describe(self) -> str:
        bits = "auto (counted at 8 bits: an upper bound)" if self.auto else str(self.bits)
        pipe = {"off": "synchronous", "on": "one epoch stale, behind the computation",
                "adaptive": "one epoch stale (adaptive: counted as on)"}[self.pipeline]
        return f"sylvie: {bits} bits per halo row, scales {self.param_bytes * 8}-bit, exchange {pipe}"


def engine_codec(engine: str, section: Any) -> HaloCodec | None:
    """The :class:`HaloCodec` of ``engine`` from a config's ``engine`` section (None but for ``sylvie``)."""
    if engine != "sylvie":
        return None
    return HaloCodec.from_options(getattr(section, "bits", "auto"), getattr(section, "pipeline", "off"),
                                  getattr(section, "scale_dtype", "float32"))


@dataclasses.dataclass(frozen=True)
class FlowStage:
    """One rank of the ``flow`` engine: layers ``start .. stop - 1`` of a ``layers``-layer model, the graph in
    ``microbatches`` micro-batches (``exact``: every stage runs its layers on the whole graph, see
    ``hpc_graph.engines.flow``), stages split by ``split`` (``cost``: the first stage times every layer at
    start-up; ``count``: it only runs them forward once, for their output shapes)."""

    start: int
    stop: int
    layers: int
    microbatches: int = 1
    split: str = "cost"  # the engine's stage_split: what the first stage's start-up probe runs

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.stop == self.layers


def flow_bounds(layers: int, stages: int, costs: list[float] | None = None) -> list[int]:
    """The stage boundaries the flow engine cuts a ``layers``-layer chain into: by ``costs`` (one per layer,
    ``stage_split: cost``; the engine measures them, the plan predicts them) or by count (None)."""
    from hpc_graph.graph.microbatch import split_stages

    if not 1 <= stages <= layers:
        raise ValueError(f"engine.stages: {stages} stages (ranks) but the model has {layers} layers; the flow engine "
                         "needs at least one layer per stage")
    return split_stages(list(costs) if costs is not None else [1.0] * layers, stages)


def check_flow(section: Any) -> tuple[int, str]:
    """``(micro-batches, stage split)`` of a config's ``engine`` section for flow; ValueError
    naming the option the planner does not model (``cross_edges`` stale/drop with several micro-batches)."""
    m = int(getattr(section, "microbatches", 1) or 1)
    mode = str(getattr(section, "cross_edges", "exact"))
    if m > 1 and mode != "exact":
        raise ValueError(f"engine.cross_edges: the planner models flow's exact mode (or one micro-batch), not "
                         f"{mode!r} with {m} micro-batches")
    return m, str(getattr(section, "stage_split", "cost"))


# -- graph statistics -----------------------------------------------------------------------------------
def graph_from_dataset(path: str | os.PathLike) -> GraphShape:
    """The :class:`GraphShape` of a dataset file, from its header (nothing but the masks is read).

    Raises:
        data_io.errors.DataError naming the file.
    """
    import numpy as np

    from data_io.dataset import open_dataset

    with open_dataset(path, check_values=False) as ds:
        train = int(np.count_nonzero(ds.mask("train_mask"))) if ds.has("train_mask") else 0
        fields = getattr(ds, "_fields", {})
        disk = int(fields["indices"].dtype.itemsize) if "indices" in fields else 4
        return GraphShape(nodes=int(ds.num_nodes), edges=int(ds.num_edges), features=int(ds.feat_dim),
                          classes=int(ds.num_classes), train_nodes=train, directed=bool(ds.directed),
                          disk_index_bytes=disk, name=str(ds.name))


def graph_from_partition(directory: str | os.PathLike) -> GraphShape:
    """The :class:`GraphShape` of the graph a partition directory was made from (``partition.json``)."""
    from data_io.partition import read_partition_meta

    meta = read_partition_meta(directory)
    return GraphShape(nodes=int(meta["global_num_nodes"]), edges=int(meta["global_num_edges"]),
                      features=int(meta.get("feat_dim") or 0), classes=int(meta.get("num_classes") or 0),
                      train_nodes=int(meta.get("num_train") or 0), directed=bool(meta.get("directed", False)),
                      disk_index_bytes=8, name=str(meta.get("name", Path(directory).name)))


def _peer_counts(directory: Path, part: dict, num_parts: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """Halo rows per source part, rows sent per peer and the distinct rows sent of one part file
    (``/halo/offsets``, ``/send/offsets``: int64[P+1]; ``/send/lid``: see docs/file-format.md), or None
    when unreadable."""
    try:
        import h5py
        import numpy as np

        with h5py.File(directory / part["file"], "r") as f:
            halo = np.diff(np.asarray(f["halo/offsets"][...], dtype=np.int64))
            send = np.diff(np.asarray(f["send/offsets"][...], dtype=np.int64))
            boundary = int(np.unique(np.asarray(f["send/lid"][...])).shape[0]) if "send/lid" in f else -1
    except (OSError, KeyError, ValueError, TypeError):
        return None
    if halo.shape != (num_parts,) or send.shape != (num_parts,):
        return None
    return tuple(int(x) for x in halo), tuple(int(x) for x in send), boundary


def layout_from_partition(directory: str | os.PathLike) -> Layout:
    """Every rank's :class:`RankShape` from a partition directory: ``partition.json`` (owned nodes,
    in-edges, halo and send rows, cut edges per part) and each part file's halo/send offsets (per peer).

    Raises:
        data_io.errors.DataError naming the directory or file.
    """
    from data_io.partition import read_partition_meta

    directory = Path(directory)
    meta = read_partition_meta(directory)
    P = int(meta["num_parts"])
    parts, notes = [], []
    for info in meta["parts"]:
        p = int(info["part_id"])
        h, s = int(info["num_halo"]), int(info["num_send"])
        counts = _peer_counts(directory, info, P)
        if counts is None:
            if not notes:
                notes.append("per-peer halo counts unreadable: halo spread evenly over the other parts")
            halo_from, send_to, boundary = _even(h, p, P), _even(s, p, P), -1
        else:
            halo_from, send_to, boundary = counts
        e = int(info["num_edges"])
        parts.append(RankShape(rank=p, owned=int(info["num_nodes"]), edges=e,
                               local_edges=max(0, e - int(info.get("cut_edges", 0))), halo=h, send=s,
                               train=int(info.get("num_train", 0)), halo_from=halo_from, send_to=send_to,
                               boundary=boundary))
    cut = float(meta.get("edge_cut_fraction") or 0.0)
    return Layout(ranks=P, parts=parts, source=f"partition {directory} ({meta.get('method', '?')}, {P} parts)",
                  cut_fraction=cut, notes=notes)


def _even(total: int, p: int, P: int) -> tuple[int, ...]:
    if P <= 1:
        return (0,)
    base, extra = divmod(int(total), P - 1)
    out, k = [], 0
    for q in range(P):
        if q == p:
            out.append(0)
            continue
        out.append(base + (1 if k < extra else 0))
        k += 1
    return tuple(out)


def cut_fraction_at(ranks: int, cut: float, at: int | None) -> float:
    """The edge-cut fraction at ``ranks`` parts.

    ``at`` None: ``cut`` at every rank count above 1 (0 on one rank). ``at = P0``: ``cut`` was
    measured at P0 parts, and every doubling of the parts is assumed to cut the same fraction of the
    edges still inside a part (recursive bisection): ``1 - (1 - cut) ** (log2 ranks / log2 P0)``,
    which is exactly ``1 - 1/P`` for a random partition.
    """
    if ranks <= 1:
        return 0.0
    cut = min(max(float(cut), 0.0), 1.0)
    if at is None or at <= 1:
        return cut
    return 1.0 - (1.0 - cut) ** (math.log2(ranks) / math.log2(at))


def expected_halo(cut_edges: float, remote_nodes: int, out_degrees: Any = None, total_out: float = 0.0) -> float:
    """Expected distinct sources of ``cut_edges`` in-edges drawn from ``remote_nodes`` nodes.

    Without degrees: every remote node equally likely (Poisson), ``R (1 - exp(-X / R))``, an upper
    bound for skewed (power-law) graphs, whose cut edges concentrate on hubs. With ``out_degrees``
    (a NumPy array of the remote nodes' out-degrees, summing to ``total_out``): node ``v`` is a source
    with probability proportional to its out-degree, ``sum_v 1 - exp(-X d_v / sum d)``.
    """
    x = max(float(cut_edges), 0.0)
    if remote_nodes <= 0 or x <= 0:
        return 0.0
    if out_degrees is None or total_out <= 0:
        r = float(remote_nodes)
        return r * (1.0 - math.exp(-x / r))
    import numpy as np

    d = np.asarray(out_degrees, dtype=np.float64)
    return float(np.sum(-np.expm1(-x * d / float(total_out))))


def layout_from_cut_model(graph: GraphShape, ranks: int, cut: float, *, at: int | None = None,
                          edge_imbalance: float = 1.0, out_degrees: Any = None) -> Layout:
    """The bottleneck rank of ``ranks`` ranks from the cut model (no partition needed).

    Assumptions (printed by ``hpc-graph plan``): nodes split evenly (``n = ceil(N/P)``); the
    bottleneck rank holds ``edge_imbalance x E/P`` in-edges, of which a fraction ``c`` (the edge-cut
    fraction at P parts, :func:`cut_fraction_at`) comes from other parts; its halo is the expected
    number of distinct sources of those edges (:func:`expected_halo`, uniform sources unless the
    degree distribution is given); it sends as many rows as it receives (``S = h``: the sum over
    ranks is equal for an undirected graph); every other part is a peer with an equal share.
    """
    P = int(ranks)
    c = cut_fraction_at(P, cut, at)
    n = -(-graph.nodes // P)
    e = int(round(min(float(graph.edges), graph.edges / P * max(edge_imbalance, 1.0))))
    x = c * e
    remote = graph.nodes - n
    if out_degrees is not None:
        import numpy as np

        d = np.asarray(out_degrees, dtype=np.float64)
        # the remote nodes of an average part: every node is remote with probability (P-1)/P
        h = expected_halo(x, remote, d, float(d.sum())) * (P - 1) / P if P > 1 else 0.0
        how = "degree-weighted sources (the dataset's degrees)"
    else:
        h = expected_halo(x, remote)
        how = "uniform sources"
    h = int(round(min(h, remote, x)))
    part = RankShape(rank=0, owned=n, edges=e, local_edges=int(round(e - x)), halo=h, send=h,
                     train=-(-graph.train_nodes // P), halo_from=_even(h, 0, P), send_to=_even(h, 0, P))
    src = (f"cut model: c = {c:.3f}" + (f" (from {cut:.3f} at {at} parts, recursive bisection)" if at and P > 1
                                        and at != P else "")
           + f", halo = expected distinct sources of c x E_p cut edges, {how}; S = h; edges x {edge_imbalance:g}"
           + " on the bottleneck rank")
    return Layout(ranks=P, parts=[part], source=src, cut_fraction=c)


def single_layout(graph: GraphShape) -> Layout:
    """One rank holding the whole graph."""
    part = RankShape(rank=0, owned=graph.nodes, edges=graph.edges, local_edges=graph.edges, halo=0, send=0,
                     train=graph.train_nodes, halo_from=(0,), send_to=(0,))
    return Layout(ranks=1, parts=[part], source="the whole graph on one rank", cut_fraction=0.0)


def rank_csr(data: str, layout: Any, max_edges: int) -> tuple[Any, str]:
    """The CSR kernel rates are measured on, and what it is: the fullest rank's part of a partition directory
    ``data`` (by ``layout``'s edges), or the first rows (about ``max_edges`` edges) of a dataset file's graph."""
    import numpy as np
    import torch

    from hpc_graph.ops.csr import CSR, column_dtype

    if os.path.isdir(data):
        from data_io.partition import read_partition

        part_id = max(layout.parts, key=lambda r: r.edges).rank
        part = read_partition(data, part_id, features=False)
        n = int(part.num_owned)
        csr = CSR(torch.from_numpy(np.asarray(part.indptr, dtype=np.int64)),
                  torch.from_numpy(np.asarray(part.indices, dtype=column_dtype(n + int(part.num_halo)))),
                  n + int(part.num_halo), validate=False)
        return csr, f"part {part_id} of {data} (its [owned | halo] CSR)"
    from data_io.dataset import open_dataset

    with open_dataset(data, check_values=False) as ds:
        indptr = np.asarray(ds.indptr(), dtype=np.int64)
        stop = int(np.searchsorted(indptr, max_edges, side="right"))
        stop = max(1, min(stop, len(indptr) - 1))
        ptr, indices, _, _ = ds.graph_rows(0, stop)  # the first rows only
        n = int(ds.num_nodes)
    csr = CSR(torch.from_numpy(np.asarray(ptr, dtype=np.int64)),
              torch.from_numpy(np.asarray(indices, dtype=column_dtype(n))), n, validate=False)
    return csr, f"{data}"


# -- rates --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Rates:
    """Seconds per unit of work, and the links. All per rank at ``threads`` threads.

    ``spmm_fwd``/``spmm_bwd``: ``(a, b)``, an SpMM over E edges at width w takes ``E (a + b w)``
    seconds (forward over the CSR, backward over its transpose). ``gat_fwd``/``gat_bwd``: the same for
    the fused attention kernels with ``w = H D``. ``gemm_flops``: flop/s of a dense GEMM.
    ``stream``: bytes/s of an elementwise pass (reads + writes); ``mask``: elements/s of the counter-based
    dropout kernels; ``score``: elements/s of a GAT score with its backward; ``codec``: row elements/s
    through sylvie's low-bit encode or decode (8 bits). ``parallel``: fraction of the
    kernels' time that scales with threads (Amdahl), measured at 1 and ``threads`` threads.
    ``exchange``/``allreduce``: ``(alpha s, beta bytes/s)`` or None (no measured link: ``link`` used).
    ``link``: a :class:`~hpc_graph.comm.link.LinkModel` (a modelled network, or the default).
    ``sources``: where each number came from (printed). ``step_overhead``: seconds an epoch takes beyond
    what these rates predict for its kernels, added to every rank's compute: measured by ``hpc-graph plan`` as
    a real training run's epoch minus the prediction for it on a calibration graph (the probes time each kernel
    alone; a step also builds the autograd graph, allocates, runs Python and the optimizer between them: a
    few tenths of a second per epoch on the machines measured, about the same at 2^15 and 2^20 nodes, which
    is why it is added, not multiplied: a factor measured on a small graph over-predicted large ones).
    ``step_overhead_threads``: overheads measured at given thread counts (they also absorb the error of the
    parallel fraction, measured from a few speed-ups only); a rank uses the nearest (:meth:`step_overhead_for`).
    ``contention``: ``{over: factor}``, how much slower a rank runs when the ranks of a node run ``over``
    threads per core, measured (``hpc-graph plan``: copies of a real run at once against one alone); where none
    was measured for a rank's ``over``, ``over`` itself (a time slice of a core).
    """

    spmm_fwd: tuple[float, float]
    spmm_bwd: tuple[float, float]
    gat_fwd: tuple[float, float]
    gat_bwd: tuple[float, float]
    gemm_flops: float
    stream: float
    mask: float = 1e9
    score: float = 1e9
    codec: float = 1e9
    threads: int = 1
    parallel: float = 1.0
    exchange: tuple[float, float] | None = None
    allreduce: tuple[float, float] | None = None
    link: Any = None
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    step_overhead: float = 0.0
    step_overhead_threads: dict[int, float] = dataclasses.field(default_factory=dict)
    contention: dict[float, float] = dataclasses.field(default_factory=dict)

    def oversubscribed(self, over: float) -> float | None:
        """The factor measured for ranks running ``over`` threads per core (``contention``: ``{over: factor}``,
        copies of a real run at once against one alone), or None where none was measured."""
        for k, f in self.contention.items():
            if abs(float(k) - over) <= 1e-6 * max(1.0, over):
                return float(f)
        return None

    def step_overhead_for(self, threads: int) -> float:
        """The per-epoch overhead of a rank running ``threads`` threads: the one measured at the nearest thread
        count (in log scale; ``step_overhead_threads``), else ``step_overhead``."""
        if not self.step_overhead_threads:
            return self.step_overhead
        t = math.log2(max(1, threads))
        best = min(self.step_overhead_threads, key=lambda k: (abs(math.log2(max(1, k)) - t), -k))
        return self.step_overhead_threads[best]

    @classmethod
    def from_kernels(cls, kernels: Any, **links: Any) -> "Rates":
        """The rates of a measured :class:`~hpc_graph.plan.profile.KernelRates` (every field they share),
        plus the links' fields (``exchange``, ``allreduce``, ``link``, ``sources``) given by keyword."""
        own = {f.name for f in dataclasses.fields(cls)}
        shared = {f.name: getattr(kernels, f.name) for f in dataclasses.fields(kernels) if f.name in own}
        return cls(**shared, **links)

    def slowdown(self, threads: int, cores_share: float) -> float:
        """Factor on the measured kernel times for a rank running ``threads`` threads on
        ``cores_share`` cores (less than its threads when ranks oversubscribe a node)."""
        f = min(max(self.parallel, 0.0), 1.0)

        def t(k: float) -> float:
            return (1.0 - f) + f / max(k, 1e-9)

        t_here = t(self.threads)
        t_rank = t(max(1, threads))
        over = max(1.0, threads / cores_share) if cores_share > 0 else 1.0
        measured = self.oversubscribed(over) if over > 1.0 else None
        return t_rank / t_here * (over if measured is None else measured)

    def exchange_time(self, out_bytes: float, in_bytes: float, peers: int) -> float:
        if peers <= 0 or (out_bytes <= 0 and in_bytes <= 0):
            return 0.0
        if self.link is not None:
            t = self.link.cost(int(out_bytes), int(in_bytes), peers)
            if self.exchange is not None:  # a modelled link sleeps until its time has passed
                t = max(t, self.exchange[0] + max(out_bytes, in_bytes) / self.exchange[1])
            return t
        if self.exchange is None:
            return 0.0
        alpha, beta = self.exchange
        return alpha + max(out_bytes, in_bytes) / beta

    def allreduce_time(self, nbytes: float, size: int, calls: int) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        if self.link is not None:
            t = self.link.allreduce_cost(int(nbytes), size)
            if self.allreduce is not None:
                t = max(t, calls * self.allreduce[0] + nbytes / self.allreduce[1])
            return t
        if self.allreduce is None:
            return 0.0
        return calls * self.allreduce[0] + nbytes / self.allreduce[1]


# -- the walk of one step ------------------------------------------------------------------------------
class _Tape:
    """Live bytes of one rank over a training step and their high-water mark by component."""

    def __init__(self, base: dict[str, int]):
        self.base = dict(base)
        self.live: dict[str, tuple[int, str]] = {}
        self.where = "load"
        self.peak = -1
        self.peak_parts: dict[str, int] = {}
        self.peak_where = ""
        self.no_grad = False
        self.pinned: set[str] = set()  # held by something outside autograd (sylvie's pipeline slots)
        self._n = 0
        self._check()

    def _check(self) -> None:
        total = sum(self.base.values()) + sum(b for b, _ in self.live.values())
        if total > self.peak:
            self.peak = total
            parts = dict(self.base)
            for nbytes, comp in self.live.values():
                parts[comp] = parts.get(comp, 0) + nbytes
            self.peak_parts, self.peak_where = parts, self.where

    def new(self, nbytes: float, comp: str = "workspace", name: str | None = None) -> str:
        if self.no_grad and comp == "activations":
            comp = "workspace"
        if name is None:
            self._n += 1
            name = f"t{self._n}"
        self.live[name] = (int(max(nbytes, 0)), comp)
        self._check()
        return name

    def free(self, *names: str | None) -> None:
        for name in names:
            if name is not None and name not in self.pinned:
                self.live.pop(name, None)

    def pin(self, *names: str | None) -> None:
        """``names`` stay live when their users free them, until :meth:`unpin`."""
        self.pinned.update(n for n in names if n is not None)

    def unpin(self, *names: str | None) -> None:
        """Release pinned tensors (freed)."""
        for name in names:
            if name is not None:
                self.pinned.discard(name)
                self.live.pop(name, None)

    def keep(self, name: str | None) -> None:
        """``name`` is saved for the backward pass from now on (component ``activations``)."""
        if self.no_grad:
            return
        if name is not None and name in self.live:
            nbytes, _ = self.live[name]
            self.live[name] = (nbytes, "activations")

    def persist(self, comp: str, nbytes: float) -> None:
        """Something built now that stays for the rest of the run (a transpose, a cache)."""
        self.base[comp] = self.base.get(comp, 0) + int(nbytes)
        self._check()

    def total(self, comp: str) -> int:
        return self.base.get(comp, 0) + sum(b for b, c in self.live.values() if c == comp)


@dataclasses.dataclass
class _Work:
    spmm_fwd: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (edges, width)
    spmm_bwd: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    gat_fwd: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    gat_bwd: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    flops: float = 0.0
    stream: float = 0.0
    mask: float = 0.0  # elements through the counter-based dropout kernels
    score: float = 0.0  # elements of z through a GAT score (z * att).sum(-1), forward and backward
    exchanges: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)  # (out, in, peers)
    # exchanges running behind the computation (sylvie's pipeline): hidden up to the step's compute time
    background: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    codec: float = 0.0  # row elements encoded or decoded by the low-bit message codec (sylvie)


class _Walk:
    """One rank, one engine, one model: the training step as the engine runs it (see module docstring)."""

    def __init__(self, engine: str, spec: ModelSpec, graph: GraphShape, rs: RankShape, P: int, *,
                 prefetch: bool = True, block_bytes: int | None = None, max_blocks: int | None = None,
                 codec: HaloCodec | None = None, stage: FlowStage | None = None):
        # sylvie is dp with another halo exchange: walked as dp, with the codec at every exchange; a flow stage is
        # single on the whole graph for its own layers, its input from the previous stage, its output to the next
        self.name = engine
        self.codec = (codec or HaloCodec()) if engine == "sylvie" else None
        layers = spec.layers
        self.flow = (stage or FlowStage(0, layers, layers)) if engine == "flow" else None
        engine = {"sylvie": "dp", "flow": "single"}.get(engine, engine)
        self.engine, self.spec, self.graph, self.rs, self.P = engine, spec, graph, rs, P
        self.prefetch = prefetch and engine == "sar"
        self.d = spec.dbytes
        if block_bytes is None or max_blocks is None:
            from hpc_graph.ops.spmm import BLOCK_BYTES, MAX_BLOCKS

            block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
            max_blocks = MAX_BLOCKS if max_blocks is None else max_blocks
        self.block_bytes, self.max_blocks = int(block_bytes), int(max_blocks)
        self.work = _Work()
        self.saved_at_end_of_forward = 0
        self.halo_recv_max = 0
        self._built: set = set()
        n, h = (graph.nodes, 0) if engine == "single" else (rs.owned, rs.halo)
        self.n, self.h = n, h
        self.E = graph.edges if engine == "single" else rs.edges
        # symmetric CSR: the transpose is the CSR itself (undirected, square)
        self.symmetric = not graph.directed and (engine == "single" or (engine == "dp" and h == 0))
        self.tape = _Tape({})
        self.eval_mode = False
        self.step_index = -1  # training steps walked so far - 1 (sylvie's pipeline: the first is synchronous)
        self.slots: dict[int, dict[str, Any]] = {}  # sylvie: per halo call, what its pipeline slot holds
        self._calls: list[int] = []  # sylvie: this step's halo calls, popped by their backward passes
        self._ncalls = 0
        self.slot_bytes: list[int] = []  # sylvie: bytes the slots hold after each step

    @property
    def p(self) -> float:
        """Feature dropout of the pass being walked (0 in evaluation)."""
        return 0.0 if self.eval_mode else self.spec.dropout

    # -- sizes ----------------------------------------------------------------------------------------
    def rows(self, rows: float, width: float) -> float:
        return float(rows) * float(width) * self.d

    def _steps(self) -> list[tuple[int, int]]:
        """SAR rotation: per step k = 1..P-1, ``(rows received from p-k, rows sent to p+k)``."""
        p, P, rs = self.rs.rank, self.P, self.rs
        return [(rs.halo_from[(p - k) % P], rs.send_to[(p + k) % P]) for k in range(1, P)]

    def _nb(self, num_src: float, width: float) -> int:
        if self.block_bytes <= 0:
            return 0
        return min(int(round(num_src * width * self.d / self.block_bytes)), self.max_blocks)

    def _blocked(self, key: Any, num_dst: float, num_src: float, edges: float, width: float) -> None:
        """The column-blocked copy of a CSR (built once per graph, direction and block count)."""
        nb = self._nb(num_src, width)
        if nb < 2 or (key, nb) in self._built:
            return
        self._built.add((key, nb))
        counts = self.tape.new((nb * num_dst + 1) * IDX, "workspace")
        self.tape.persist("graph", (nb * num_dst + 1) * IDX + edges * 4)
        self.tape.free(counts)

    def _once(self, key: Any, persistent: float, transient: float = 0.0) -> None:
        """A structure built on first use (a transpose, a self-loop copy): ``transient`` while building."""
        if key in self._built:
            return
        self._built.add(key)
        t = self.tape.new(transient, "workspace") if transient > 0 else None
        self.tape.persist("graph", persistent)
        self.tape.free(t)

    # -- base memory ------------------------------------------------------------------------------------
    def base(self) -> dict[str, int]:
        """What the rank holds before the first step (graph as loaded, features, parameters + optimiser)."""
        spec, rs, n, h, E = self.spec, self.rs, self.n, self.h, self.E
        d = self.d
        feat = spec.feature_copies * n * self.graph.features * d
        train = self.graph.train_nodes if self.engine == "single" else rs.train
        features = feat + n * 8 + 6 * n + train * 8  # labels, 3 masks x 2 (engine's, trainer's), train ids
        if self.engine == "single":
            graph = (n + 1) * IDX + E * COL + n * IDX  # CSR + global ids
        else:
            # in-degree, global and source-dataset ids of owned, halo and [owned | halo] nodes, send lists,
            # the node ranges and halo offsets
            ids = (n * 3 + h * 2 + 2 * (n + h)) * IDX + rs.send * IDX + 2 * (self.P + 1) * IDX
            if self.engine == "dp":
                graph = (n + 1) * IDX + E * COL + ids
            else:
                blocks = 1 + rs.peers
                graph = blocks * (n + 1) * IDX + E * COL + ids
        p = (spec.num_params(self.flow.start, self.flow.stop) if self.flow else spec.num_params()) * d
        opt = 2 if spec.optimizer == "adam" else (1 if spec.momentum > 0 else 0)
        params = p * (1 + 1 + opt + 1)  # parameters, gradients, optimiser state, best-validation copy
        out = {"graph": int(graph), "features": int(features), "params": int(params)}
        if self.codec is not None:
            out["halo"] = self.codec_state()
        return out

    def codec_state(self) -> int:
        """sylvie's exchange plan: global ids of the rows sent, all send lists in one, the distinct rows sent
        and each send row's place among them (int64), importances of the rows sent and received (float64),
        bit tables (int8 per row sent and received; ``auto``: one per base width, up to four)."""
        rs = self.rs
        S, h, B = rs.send, self.h, rs.boundary_rows
        tables = 4 if self.codec.auto else 1
        return int(4 * S * IDX + B * IDX + h * 8 + tables * (S + h))

    def load_peak(self) -> tuple[int, dict[str, int]]:
        """The high-water mark while the engine loads (before training), by component."""
        b = self.base()
        graph, E, n = b["graph"], self.E, self.n
        extra = 0
        if self.engine == "single":
            if self.graph.disk_index_bytes != COL:  # int64 indices on disk, converted to int32
                extra = E * self.graph.disk_index_bytes
            if self.flow is not None and self.flow.microbatches > 1:
                # flow renames the nodes into micro-batch order: the file's columns, four int64 arrays per edge
                # (rows, sources, the sort order, the sorted columns) and a renamed copy of the features
                extra = E * self.graph.disk_index_bytes + 4 * E * IDX + n * self.graph.features * self.d
        else:
            # a part file's int64 columns, alive while the DistGraph makes its int32 copy
            extra = E * IDX
        if self.engine == "sar":
            # release_local: the [owned | halo] CSR, a running count, a mask and the blocks built so far
            graph = graph - (1 + self.rs.peers) * (n + 1) * IDX + (n + 1) * IDX  # the CSR, no blocks yet
            extra = max(extra, (E + 1) * IDX + E + E * COL + (1 + self.rs.peers) * (n + 1) * IDX)
        if self.spec.dtype == "float64":  # features read as float32, then converted
            extra = max(extra, n * self.graph.features * 4)
        parts = {"graph": graph, "features": b["features"], "workspace": extra}
        return sum(parts.values()), parts

    # -- halo exchange (dp) -----------------------------------------------------------------------------
    def _halo_forward(self, width: float) -> str | None:
        """HaloExchange forward of ``width``-wide rows: send copies, receive buffers, one concatenation."""
        rs, h = self.rs, self.h
        if self.codec is not None and not self.eval_mode:
            return self._quant_forward(width, 0)[0]
        if h == 0 and rs.send == 0:  # no peer (one rank): an empty halo, the concatenation still copies
            return self.tape.new(0, "halo")
        send = self.tape.new(self.rows(rs.send, width), "halo")
        recv = self.tape.new(self.rows(h, width), "halo")
        self.halo_recv_max = max(self.halo_recv_max, int(self.rows(h, width)))
        self.work.exchanges.append((self.rows(rs.send, width), self.rows(h, width), rs.peers + rs.send_peers))
        self.work.stream += 2 * self.rows(rs.send, width)
        self.tape.free(send)
        halo = self.tape.new(self.rows(h, width), "halo")
        self.work.stream += 2 * self.rows(h, width)
        self.tape.free(recv)
        return halo

    def _halo_backward(self, width: float) -> str | None:
        """HaloExchange backward: the halo rows' gradients go back; the owner sums what it receives."""
        rs = self.rs
        if self.codec is not None:
            return self._quant_backward(width, 0)[0]
        if self.h == 0 and rs.send == 0:  # no peer: the owned rows' share is a fresh zero tensor
            self.work.stream += self.rows(self.n, width)
            return self.tape.new(self.rows(self.n, width))
        recv = self.tape.new(self.rows(rs.send, width), "halo")
        self.halo_recv_max = max(self.halo_recv_max, int(self.rows(rs.send, width)))
        self.work.exchanges.append((self.rows(self.h, width), self.rows(rs.send, width), rs.peers + rs.send_peers))
        g = self.tape.new(self.rows(self.n, width))
        self.work.stream += self.rows(self.n, width) + 3 * self.rows(rs.send, width)
        self.tape.free(recv)
        return g

    # -- halo exchange (sylvie: hpc_graph.ops.quant_exchange) ---------------------------------------
    def _messages(self, rows_per_peer: Iterable[int], width: float, extra: float) -> int:
        return sum(self.codec.message_bytes(r, width, extra, self.d) for r in rows_per_peer if r > 0)

    def _stale(self) -> bool:
        """This step runs on last epoch's halo rows (the pipeline's steps after the first)."""
        return self.codec is not None and self.codec.stale and self.step_index >= 1

    def _slot_replace(self, slot: dict, key: str, names: list) -> None:
        self.tape.unpin(*slot.get(key, []))
        slot[key] = [x for x in names if x is not None]
        self.tape.pin(*slot[key])

    def _slot_finish(self, slot: dict, pending: str, key: str) -> None:
        """A stale exchange in flight since the last step completes: decoded into its buffers (allocated when it
        was posted, resident only now that they are written), which become the slot's data."""
        if pending in slot:
            sizes, msgs = slot.pop(pending)
            bufs = [self.tape.new(size, "halo") for size in sizes]
            self.tape.unpin(*msgs)
            self._slot_replace(slot, key, bufs)

    def _quant_forward(self, width: float, extra: float) -> tuple[str, str | None]:
        """QuantHaloExchange / StaleHaloExchange forward: ``(halo rows h x width, extra h x extra or None)``.

        Synchronous: decoded into fresh buffers from the peers' messages (encoded here from the rows sent);
        with a pipeline the slot keeps them for the next step. Stale: last epoch's rows (from the slot, or
        the exchange in flight since then, completed now), while this step's rows travel behind the
        computation in fresh buffers held by the slot."""
        t, rs, h = self.tape, self.rs, self.h
        k = self._ncalls
        self._ncalls += 1
        self._calls.append(k)
        slot = self.slots.setdefault(k, {}) if self.codec.stale else None
        out_b = self._messages(rs.send_to, width, extra)
        in_b = self._messages(rs.halo_from, width, extra)
        self.work.codec += (rs.send + h) * width  # encode the rows sent, decode the rows received
        self.work.stream += 2 * self.rows(rs.send + h, extra)
        self.halo_recv_max = max(self.halo_recv_max, in_b)
        peers = rs.peers + rs.send_peers
        ranges = t.new(2 * 4 * rs.boundary_rows) if rs.send_peers > 1 else None  # rows' min/max, float32
        if not self._stale():
            halo = t.new(self.rows(h, width), "halo")
            halo_e = t.new(self.rows(h, extra), "halo") if extra else None
            msgs = [t.new(out_b, "halo"), t.new(in_b, "halo")]
            self.work.exchanges.append((out_b, in_b, peers))
            t.free(*msgs, ranges)
            if slot is not None:
                self._slot_replace(slot, "halo", [halo, halo_e])
            return halo, halo_e
        self._slot_finish(slot, "pending_fwd", "halo")
        halo, halo_e = (slot["halo"] + [None])[:2] if extra else (slot["halo"][0], None)
        # the buffers the rows will be decoded into: allocated now, written (resident) when the exchange completes
        sizes = [self.rows(h, width)] + ([self.rows(h, extra)] if extra else [])
        msgs = [t.new(out_b, "halo"), t.new(in_b, "halo")]
        t.pin(*msgs)
        t.free(ranges)
        slot["pending_fwd"] = (sizes, msgs)
        self.work.background.append((out_b, in_b, peers))
        return halo, halo_e

    def _quant_backward(self, width: float, extra: float) -> tuple[str, str | None]:
        """QuantHaloExchange / StaleHaloExchange backward: the owned rows' gradients ``(n x width, n x extra
        or None)`` from the halo-row gradients their holders send back (this step's, or last epoch's when
        stale, while this step's travel behind the computation)."""
        t, rs, h, n = self.tape, self.rs, self.h, self.n
        k = self._calls.pop() if self._calls else 0
        slot = self.slots.setdefault(k, {}) if self.codec.stale else None
        out_b = self._messages(rs.halo_from, width, extra)
        in_b = self._messages(rs.send_to, width, extra)
        self.work.codec += (rs.send + h) * width
        self.work.stream += 2 * self.rows(rs.send + h, extra)
        self.halo_recv_max = max(self.halo_recv_max, in_b)
        peers = rs.peers + rs.send_peers
        if not self._stale():
            buf = [t.new(self.rows(rs.send, width), "halo"), t.new(self.rows(rs.send, extra), "halo") if extra else None]
            msgs = [t.new(out_b, "halo"), t.new(in_b, "halo")]
            self.work.exchanges.append((out_b, in_b, peers))
            t.free(*msgs)
            if slot is not None:
                self._slot_replace(slot, "grad", buf)
        else:
            self._slot_finish(slot, "pending_bwd", "grad")
            buf = (slot["grad"] + [None])[:2]
            sizes = [self.rows(rs.send, width)] + ([self.rows(rs.send, extra)] if extra else [])
            msgs = [t.new(out_b, "halo"), t.new(in_b, "halo")]
            t.pin(*msgs)
            slot["pending_bwd"] = (sizes, msgs)
            self.work.background.append((out_b, in_b, peers))
        gx = t.new(self.rows(n, width))  # zeros, then the received rows added at their owners' rows
        ge = t.new(self.rows(n, extra)) if extra else None
        self.work.stream += self.rows(n, width + extra) + 3 * self.rows(rs.send, width + extra)
        t.free(*buf)
        return gx, ge

    # -- aggregation: GraphContext.aggregate / aggregate_combine as each engine runs it ---------------
    def _spmm_structs(self, width: float, backward: bool) -> None:
        """Transposes and column-blocked copies the SpMM of this engine builds on first use."""
        n, h, E = self.n, self.h, self.E
        if self.engine in ("single", "dp"):
            src = n + h
            if not backward:
                self._blocked(("csr",), n, src, E, width)
                return
            if not self.symmetric:
                self._once(("csc",), (src + 1) * IDX + E * COL, src * IDX)
            self._blocked(("csr",) if self.symmetric else ("csc",), src, n, E, width)
            return
        # sar: blocks G_{p,q} forward; their transposes (always new CSRs, one per block) backward
        rs, p = self.rs, self.rs.rank
        if backward:
            self._once(("block_t",), (n + 1 + self.h + rs.peers) * IDX + E * COL, max(n, self.h) * IDX)
        cut = E - rs.local_edges
        blocks = [(p, n, float(rs.local_edges))] + [(q, c, cut * c / max(self.h, 1))
                                                    for q, c in enumerate(rs.halo_from) if c > 0]
        for q, src, e in blocks:
            if not backward:
                self._blocked(("block", q), n, src, e, width)
            else:
                self._blocked(("block_t", q), src, n, e, width)

    def agg_forward(self, x: str, width: float, combine: str, mean: bool = False) -> str:
        """Aggregate ``x`` (n x width) over the in-edges; ``combine``: ``gcn`` (scale, self loop, bias),
        ``sage`` (mean + the root rows + bias) or ``plain`` (aggregate only). Returns the output."""
        t, n, E = self.tape, self.n, self.E
        self._spmm_structs(width, backward=False)
        if (combine == "sage" or mean) and self.engine != "sar":
            self._once(("inv_degree",), n * self.d)  # 1 / in-degree, cached on the CSR
        if self.engine == "single":
            out = t.new(self.rows(n, width))
            self.work.spmm_fwd.append((E, width))
            return out
        if self.engine == "dp":
            halo = self._halo_forward(width)
            cat = t.new(self.rows(n + self.h, width), "halo")  # [owned | halo]: a copy even without a halo
            self.work.stream += 2 * self.rows(n + self.h, width)
            out = t.new(self.rows(n, width))
            self.work.spmm_fwd.append((E, width))
            t.free(cat, halo)
            return out
        # sar: local block, then one remote block per rotation step, autograd off
        out = t.new(self.rows(n, width))
        self.work.spmm_fwd.append((self.rs.local_edges, width))
        self._sar_rotation(width, lambda recv_rows: self._sar_block_spmm(recv_rows, width))
        if combine == "sage":
            self.work.stream += 2 * self.rows(n, width)  # mean: in place
        if combine == "plain":
            return out
        # GraphContext.aggregate_combine's default: elementwise, one new tensor per operation
        if combine == "gcn":
            a = t.new(self.rows(n, width))
            t.free(out)
            s = t.new(self.rows(n, width))
            b = t.new(self.rows(n, width))
            t.free(a, s)
            self.work.stream += 3 * 2 * self.rows(n, width) + self.rows(n, width)
        else:
            b = t.new(self.rows(n, width))
            t.free(out)
            self.work.stream += 3 * self.rows(n, width)
        c = t.new(self.rows(n, width))
        t.free(b)
        self.work.stream += 2 * self.rows(n, width)
        return c

    def _sar_block_spmm(self, recv_rows: float, width: float) -> None:
        tmp = self.tape.new(self.rows(self.n, width))
        cut = self.E - self.rs.local_edges
        self.work.spmm_fwd.append((cut * recv_rows / max(self.h, 1), width))
        self.work.stream += 3 * self.rows(self.n, width)
        self.tape.free(tmp)

    def _sar_rotation(self, width: float, compute: Callable[[float], None], send_width: float | None = None,
                      recv_width: float | None = None) -> None:
        """SAR's rotation: per step send rows to p+k, receive rows of p-k (prefetch: the next step's
        buffers are in flight while this one is computed)."""
        t = self.tape
        sw = width if send_width is None else send_width
        rw = width if recv_width is None else recv_width
        steps = self._steps()
        pending: list[str] = []
        for i, (recv_rows, send_rows) in enumerate(steps):
            if not self.prefetch or i == 0:
                cur = [t.new(self.rows(send_rows, sw), "halo"), t.new(self.rows(recv_rows, rw), "halo")]
            else:
                cur = pending
            self.halo_recv_max = max(self.halo_recv_max, int(self.rows(recv_rows, rw)))
            if recv_rows or send_rows:
                self.work.exchanges.append((self.rows(send_rows, sw), self.rows(recv_rows, rw),
                                            int(recv_rows > 0) + int(send_rows > 0)))
            self.work.stream += 2 * self.rows(send_rows, sw)
            t.free(cur[0])  # the sends are done when the receive completes
            if self.prefetch and i + 1 < len(steps):
                nr, ns = steps[i + 1]
                pending = [t.new(self.rows(ns, sw), "halo"), t.new(self.rows(nr, rw), "halo")]
            if recv_rows:
                compute(recv_rows)
            t.free(cur[1])
        t.free(*pending)

    def agg_backward(self, g: str, width: float, combine: str, mean: bool = False, release: bool = True) -> str:
        """Backward of :meth:`agg_forward`: the gradient (n x width) of the aggregated input ``x``.

        ``g`` (the output's gradient) is freed as soon as its last reader is done, unless ``release``
        is False (SAGE: ``g`` is also the root rows' gradient, read later by the projection)."""
        t, n, E = self.tape, self.n, self.E
        self._spmm_structs(width, backward=True)
        done = (lambda: t.free(g)) if release else (lambda: None)
        if self.engine == "single":
            gx = t.new(self.rows(n, width))
            self.work.spmm_bwd.append((E, width))
            done()
            return gx
        if self.engine == "dp":
            gx = t.new(self.rows(n + self.h, width))
            self.work.spmm_bwd.append((E, width))
            done()
            gh = self._halo_backward(width)
            s = t.new(self.rows(n, width))  # autograd sums the two paths into x's gradient
            self.work.stream += 3 * self.rows(n, width)
            t.free(gx, gh)
            return s
        # sar: the elementwise epilogue's backward, then the rotation in the other direction
        extra = []
        if combine == "gcn":
            extra = [t.new(self.rows(n, width)), t.new(self.rows(n, width))]  # g * scale, g * self_scale
            self.work.stream += 4 * self.rows(n, width)
            done()
        g1 = extra[0] if extra else g
        if combine == "sage" or mean:
            gm = t.new(self.rows(n, width))  # g / in-degree
            self.work.stream += 2 * self.rows(n, width)
            if extra:
                t.free(extra.pop(0))
            elif release:
                done()
            g1 = gm
            extra.insert(0, gm)
        gx = t.new(self.rows(n, width))
        self.work.spmm_bwd.append((self.rs.local_edges, width))
        cut = E - self.rs.local_edges
        pend: list[str] = []
        for recv_rows, send_rows in self._steps():
            rows = t.new(self.rows(recv_rows, width), "halo") if recv_rows else None
            if recv_rows:
                self.work.spmm_bwd.append((cut * recv_rows / max(self.h, 1), width))
            recv = t.new(self.rows(send_rows, width), "halo")
            self.halo_recv_max = max(self.halo_recv_max, int(self.rows(send_rows, width)))
            if recv_rows or send_rows:
                self.work.exchanges.append((self.rows(recv_rows, width), self.rows(send_rows, width),
                                            int(recv_rows > 0) + int(send_rows > 0)))
            self.work.stream += 3 * self.rows(send_rows, width)
            t.free(*pend)
            pend = [rows, recv] if self.prefetch else []
            if not self.prefetch:
                t.free(rows, recv)
        t.free(*pend)
        if g1 is not g:
            t.free(g1)
        if combine == "gcn":
            # x's gradient: the aggregation's plus the self loop's (g * self_scale), accumulated in place
            self.work.stream += 3 * self.rows(n, width)
            t.free(*extra)
        elif release and combine == "plain" and not mean:
            done()
        return gx

    # -- layers ---------------------------------------------------------------------------------------
    def _dropout_linear_forward(self, x: str, fin: float, fouts: list[float], fused: bool) -> list[str]:
        t, n = self.tape, self.n
        a = t.new(self.rows(n, fin)) if fused else None
        if fused:
            self.work.mask += n * fin
        outs = [t.new(self.rows(n, fo)) for fo in fouts]
        self.work.flops += sum(2.0 * n * fin * fo for fo in fouts)
        t.free(a)
        return outs

    def _dropout_linear_backward(self, fin: float, fouts: list[float], need_input: bool, fused: bool) -> str | None:
        t, n = self.tape, self.n
        a = t.new(self.rows(n, fin)) if fused else None
        if fused:
            self.work.mask += n * fin  # the mask redrawn for the weight gradients
        self.work.flops += sum(2.0 * n * fin * fo for fo in fouts)  # weight gradients
        t.free(a)
        if not need_input:
            return None
        gx = t.new(self.rows(n, fin))
        self.work.flops += sum(2.0 * n * fin * fo for fo in fouts)
        if fused:
            self.work.mask += n * fin  # and for the input gradient
        return gx

    def _stage(self) -> tuple[int, int]:
        """The layers this rank runs (a flow stage's; every layer otherwise)."""
        return (self.flow.start, self.flow.stop) if self.flow else (0, self.spec.layers)

    def _flow_recv(self, width: float, comp: str) -> str:
        """A flow stage receives the rows of every micro-batch (one exchange each) and concatenates them."""
        t, M, n = self.tape, self.flow.microbatches, self.n
        rows = -(-n // M)
        bufs = [t.new(self.rows(min(rows, n - i * rows), width), "halo") for i in range(M) if i * rows < n]
        self.halo_recv_max = max(self.halo_recv_max, int(self.rows(rows, width)))
        for _ in bufs:
            self.work.exchanges.append((0.0, self.rows(rows, width), 1))
        x = t.new(self.rows(n, width), comp)
        self.work.stream += 2 * self.rows(n, width)
        t.free(*bufs)
        return x

    def _flow_send(self, width: float) -> None:
        """A flow stage sends each micro-batch's rows of a tensor (views of it: nothing allocated)."""
        M, n = self.flow.microbatches, self.n
        rows = -(-n // M)
        for i in range(M):
            if i * rows < n:
                self.work.exchanges.append((self.rows(min(rows, n - i * rows), width), 0.0, 1))

    def forward_backward(self) -> None:
        """Walk one training step of the model (memory on the tape, work in ``self.work``)."""
        spec, t, n = self.spec, self.tape, self.n
        dims = spec.layer_dims()
        train = self.graph.train_nodes if self.engine == "single" else self.rs.train
        self.step_index += 1
        self._ncalls, self._calls = 0, []
        lo, hi = self._stage()
        x = "features"  # the input features: held by the engine, never freed
        if lo > 0:  # a later flow stage: the previous stage's output, kept (with its gradient) until the end
            t.where = "forward, receiving"
            x = self._flow_recv(dims[lo][0], "activations")
        h_in = x
        inputs: list[str] = []
        layer_state: list[dict] = []
        for layer in range(lo, hi):
            fin, fout, heads, dim = dims[layer]
            t.where = f"forward, layer {layer + 1}"
            st = {"x": x, "fin": fin, "fout": fout, "heads": heads, "dim": dim, "first": layer == 0,
                  "last": layer == len(dims) - 1}
            y = self._layer_forward(st)
            layer_state.append(st)
            inputs.append(x)
            x = y
        logits = x
        if hi == len(dims):
            t.where = "loss"
            c = dims[-1][1]
            picked = t.new(train * c * self.d)
            # log-softmax and the targets, kept (a flow stage picks the rows by a fresh index of the loss rows: kept too)
            lsm = t.new(train * c * self.d + train * 8 * (2 if self.flow else 1), "activations")
            self.work.stream += 4 * train * c * self.d
            t.free(picked)
            self.saved_at_end_of_forward = t.total("activations")
            t.where = "backward, loss"
            g = t.new(self.rows(n, c))  # the gradient of the logits (zeros, scattered)
            self.work.stream += self.rows(n, c) + 2 * train * c * self.d
            t.free(lsm)
        else:  # the output goes to the next stage, its gradient comes back
            self._flow_send(dims[hi - 1][1])
            self.saved_at_end_of_forward = t.total("activations")
            t.where = "backward, receiving"
            g = received = self._flow_recv(dims[hi - 1][1], "workspace")
            t.pin(g)  # the pipeline loop holds it until the stage's backward pass returns
        for i in range(len(layer_state) - 1, -1, -1):
            layer = lo + i
            t.where = f"backward, layer {layer + 1}"
            st = layer_state[i]
            g_in = self._layer_backward(st, g)
            t.free(g)
            if layer > lo and spec.name in ("gcn", "sage"):
                t.free(st["x"])  # the previous layer's output, kept until now
            g = g_in
        if hi < len(dims):
            t.unpin(received)
        if lo > 0:  # the input's gradient goes back to the previous stage (sent from it, freed at the step's end)
            self._flow_send(dims[lo][0])
        t.where = "optimizer step"
        p = (spec.num_params(lo, hi) if self.flow else spec.num_params()) * self.d
        self.work.stream += p * 8
        tmp = t.new(2 * p)
        t.free(tmp)
        t.free(g, logits, None if h_in == "features" else h_in)
        self.slot_bytes.append(self._slot_data())

    def probe_units(self) -> None:
        """The first flow stage's start-up probe (``FlowEngine._measure_units``): every layer once on the whole graph
        (``exact``; the first micro-batch otherwise, counted as the whole graph), its output let go, backward from a
        gradient of ones, then the layer again without autograd for the next one's input. What it builds
        (transposes, copies) stays with that rank; its transient memory is part of the rank's peak."""
        spec, t, n = self.spec, self.tape, self.n
        dims = spec.layer_dims()
        h = "features"
        timed = self.flow.split == "cost"  # by count: one forward pass without autograd, for the shapes
        for layer, (fin, fout, heads, dim) in enumerate(dims):
            t.where = f"stage split probe, layer {layer + 1}"
            st = {"x": h, "fin": fin, "fout": fout, "heads": heads, "dim": dim, "first": layer == 0,
                  "last": layer == len(dims) - 1}
            if timed:
                t.free(self._layer_forward(st))
                ones = t.new(self.rows(n, fout))  # made dense by the first kernel of the backward pass
                t.free(self._layer_backward(st, ones), ones)
            if timed and layer + 1 == len(dims):
                break
            before = set(t.live)
            self.eval_mode = t.no_grad = True
            try:
                y = self._conv_eval(st) if spec.name in ("gcn", "sage") else self._layer_forward(st)
            finally:
                self.eval_mode = t.no_grad = False
            t.free(*[x for x in t.live if x not in before and x != y])
            if layer > 0:
                t.free(h)
            h = y
        if h != "features":
            t.free(h)

    def _slot_data(self) -> int:
        """Bytes of the halo rows and gradients sylvie's slots hold (kept, and allocated for the exchanges in
        flight, resident or not), messages not counted."""
        names = [x for slot in self.slots.values() for key in ("halo", "grad") for x in slot.get(key, [])]
        kept = sum(self.tape.live[x][0] for x in names if x in self.tape.live)
        return int(kept + sum(size for slot in self.slots.values() for key in ("pending_fwd", "pending_bwd")
                              for size in slot.get(key, ([], []))[0]))

    def eval_forward(self) -> None:
        """Walk the evaluation forward pass (``torch.no_grad``, no dropout): nothing is kept for a backward
        pass, but the unfused layers make copies (GCN/SAGE: the ReLU output beside the projections)."""
        spec, t, n = self.spec, self.tape, self.n
        dims = spec.layer_dims()
        x = "features"
        lo, hi = self._stage()
        self.eval_mode = t.no_grad = True
        try:
            if lo > 0:
                t.where = "evaluation, receiving"
                x = self._flow_recv(dims[lo][0], "workspace")
            for layer in range(lo, hi):
                fin, fout, heads, dim = dims[layer]
                t.where = f"evaluation, layer {layer + 1}"
                before = set(t.live)
                st = {"x": x, "fin": fin, "fout": fout, "heads": heads, "dim": dim, "first": layer == 0,
                      "last": layer == len(dims) - 1}
                if spec.name in ("gcn", "sage"):
                    y = self._conv_eval(st)
                else:
                    y = self._layer_forward(st)
                for name in list(t.live):
                    if name not in before and name != y:
                        t.free(name)
                if layer > 0:
                    t.free(x)
                x = y
            t.free(x)
        finally:
            self.eval_mode = t.no_grad = False

    def _conv_eval(self, st: dict) -> str:
        spec, t, n = self.spec, self.tape, self.n
        fin, fout, x, first = st["fin"], st["fout"], st["x"], st["first"]
        r = None if first else t.new(self.rows(n, fin))  # ReLU output
        if spec.name == "gcn":
            h = t.new(self.rows(n, fout))  # scaled by deg^-1/2 in place
            t.free(r)
            out = self.agg_forward(h, fout, "gcn")
            t.free(h)
            return out
        if fout <= fin:
            tt, root = t.new(self.rows(n, fout)), t.new(self.rows(n, fout))
            t.free(r)
            out = self.agg_forward(tt, fout, "sage")
            t.free(tt, root)
            return out
        agg = self.agg_forward(r or x, fin, "plain", mean=True)
        o1, o2 = t.new(self.rows(n, fout)), t.new(self.rows(n, fout))
        out = t.new(self.rows(n, fout))
        t.free(o1, o2, agg, r)
        return out

    def _layer_forward(self, st: dict) -> str:
        name = self.spec.name
        if name in ("gcn", "sage"):
            return self._conv_forward(st)
        if name == "gat":
            return self._gat_forward(st)
        return self._mlp_forward(st)

    def _layer_backward(self, st: dict, g: str) -> str | None:
        name = self.spec.name
        if name in ("gcn", "sage"):
            return self._conv_backward(st, g)
        if name == "gat":
            return self._gat_backward(st, g)
        return self._mlp_backward(st, g)

    # GCN / SAGE (GNN's fused path: ReLU + dropout + projections as one node keeping only x)
    def _conv_forward(self, st: dict) -> str:
        spec, t, n = self.spec, self.tape, self.n
        fin, fout, x, first = st["fin"], st["fout"], st["x"], st["first"]
        fused = (not first) or spec.dropout > 0
        st["fused"] = fused
        if not first:
            t.keep(x)  # the layer's input, saved by the fused dropout-linear node
        if spec.name == "gcn":
            dinv = t.new(n * self.d, "activations")  # deg^-1/2, saved (scale, self_scale)
            st["dinv"] = dinv
            self.work.stream += 3 * n * self.d
            (h,) = self._dropout_linear_forward(x, fin, [fout], fused)
            self.work.stream += 2 * self.rows(n, fout)  # the row scale, in place
            out = self.agg_forward(h, fout, "gcn")
            t.free(h)
            return out
        st["project_first"] = pf = fout <= fin
        if pf:
            tt, root = self._dropout_linear_forward(x, fin, [fout, fout], fused)
            out = self.agg_forward(tt, fout, "sage")
            t.free(tt, root)
            return out
        # aggregate first (the layer widens): act + dropout step by step, aggregate at the input width
        r = None
        if not first:
            r = t.new(self.rows(n, fin), "activations")  # ReLU output, saved by the ReLU
            self.work.stream += 2 * self.rows(n, fin)
        xd = None
        if spec.dropout > 0:
            xd = t.new(self.rows(n, fin), "activations")
            self.work.mask += n * fin
        agg = self.agg_forward(xd or r or x, fin, "plain", mean=True)
        t.keep(agg)
        if self.engine == "sar":
            self.work.stream += 2 * self.rows(n, fin)  # mean: in place
        o1 = t.new(self.rows(n, fout))
        o2 = t.new(self.rows(n, fout))
        self.work.flops += 2 * 2.0 * n * fin * fout
        out = t.new(self.rows(n, fout))
        self.work.stream += 3 * self.rows(n, fout)
        t.free(o1, o2)
        st.update(r=r, xd=xd, agg=agg)
        return out

    def _conv_backward(self, st: dict, g: str) -> str | None:
        spec, t, n = self.spec, self.tape, self.n
        fin, fout, first = st["fin"], st["fout"], st["first"]
        if spec.name == "gcn":
            gh = self.agg_backward(g, fout, "gcn")
            self.work.stream += 2 * self.rows(n, fout)
            gx = self._dropout_linear_backward(fin, [fout], not first, st["fused"])
            t.free(gh, st["dinv"])
            return gx
        if st["project_first"]:
            # the root rows' gradient is g itself: it lives until the projections' backward
            gt = self.agg_backward(g, fout, "sage", release=False)
            gx = self._dropout_linear_backward(fin, [fout, fout], not first, st["fused"])
            t.free(gt, g)
            return gx
        # aggregate first: both projections' input gradients, then the aggregation's backward
        g2 = t.new(self.rows(n, fin))
        ga = t.new(self.rows(n, fin))
        self.work.flops += 2 * 2.0 * n * fin * fout + 2 * 2.0 * n * fin * fout
        t.free(g, st["agg"])
        g1 = self.agg_backward(ga, fin, "plain", mean=True)
        t.free(ga, g1)  # summed into g2 in place
        self.work.stream += 3 * self.rows(n, fin)
        if first:
            t.free(g2, st["xd"])
            return None
        if st["xd"] is not None:
            gd = t.new(self.rows(n, fin))  # dropout backward
            self.work.mask += n * fin
            t.free(g2, st["xd"])
            g2 = gd
        gr = t.new(self.rows(n, fin))  # ReLU backward
        t.free(g2, st["r"])
        self.work.stream += 6 * self.rows(n, fin)
        return gr

    # GAT (dropout, projection, scores, attention, bias, ELU on hidden layers)
    def _gat_forward(self, st: dict) -> str:
        spec, t, n, h = self.spec, self.tape, self.n, self.h
        fin, fout, H, D, x, first = st["fin"], st["fout"], st["heads"], st["dim"], st["x"], st["first"]
        hd = H * D
        E = self.E
        # single and sar run the layer as one op keeping only its input x (the previous layer's
        # pre-activation, or the features): ELU, dropout and z are recomputed in the backward pass.
        # dp runs the graph's default: ELU and dropout step by step, then projection and attention
        fused = st["fused"] = self.engine in ("single", "sar")
        if fused:
            st["masked"] = (not first) or self.p > 0
            if not first:
                t.keep(x)
            st["xd"] = None if first else x
            if self.engine == "single":
                # the self-loop copy of the CSR (built on the first call; transient repeat/arange/sum arrays)
                self._once(("self_loops",), (n + 1) * IDX + (E + n) * COL, 3 * E * IDX)
        else:
            xd = t.new(self.rows(n, fin)) if self.p > 0 else x
            if self.p > 0:
                self.work.mask += n * fin
                if not first:
                    t.free(x)  # the previous layer's ELU output: only its dropped copy is kept
            t.keep(xd)
            st["xd"] = xd if (self.p > 0 or not first) else None
        self.work.flops += 2.0 * n * fin * hd
        if self.engine == "sar":
            z, (s1, s2) = self._gat_project(st)
            self.work.score += n * hd  # both scores, forward only (no autograd)
            m, l_ = t.new(self.rows(n, H), "activations"), t.new(self.rows(n, H), "activations")
            out = t.new(self.rows(n, hd), "activations")
            self._once(("identity",), (n + 1) * IDX + n * IDX)
            self.work.gat_fwd.append((self.rs.local_edges + n, hd))
            cut = E - self.rs.local_edges

            def block(recv_rows: float) -> None:
                self.work.gat_fwd.append((cut * recv_rows / max(self.h, 1), hd))

            self._sar_rotation(hd + H, block)
            t.free(z, s1, s2)
            st.update(m=m, l=l_, out=out, saved=[m, l_, out])
        elif fused:  # single: GATProjected
            z, scores = self._gat_project(st)
            self.work.score += n * hd
            m, l_ = t.new(self.rows(n, H), "activations"), t.new(self.rows(n, H), "activations")
            out = t.new(self.rows(n, hd), "activations")
            self.work.gat_fwd.append((E + n, hd))
            t.free(z, *scores)
            st.update(saved=[m, l_, out])
        else:
            z = t.new(self.rows(n, hd), "activations")
            tmp = t.new(self.rows(n, hd))
            s1 = t.new(self.rows(n, H), "activations" if self.engine == "single" else "workspace")
            t.free(tmp)
            tmp = t.new(self.rows(n, hd))
            s2 = t.new(self.rows(n, H), "activations")
            t.free(tmp)
            self.work.score += 2 * n * hd  # both scores; the rate covers their backward too
            # the self-loop copy of the CSR (built on the first call; transient repeat/arange/sum arrays)
            loops = (n + 1) * IDX + (E + n) * COL
            self._once(("self_loops",), loops, 3 * E * IDX)
            saved = [z, s1, s2]
            if self.engine == "dp":
                if self.codec is not None and not self.eval_mode:  # z and the source scores, one message
                    packed = list(self._quant_forward(hd, H))
                else:
                    cat = t.new(self.rows(n, hd + H))
                    self.work.stream += 2 * self.rows(n, hd + H)
                    packed = [self._halo_forward(hd + H)]
                    t.free(cat)
                z_all = t.new(self.rows(n + h, hd), "activations")
                s_all = t.new(self.rows(n + h, H), "activations")
                self.work.stream += 2 * self.rows(n + h, hd + H)
                saved += [z_all, s_all]
                t.free(s1)
                saved.remove(s1)
            else:
                packed = []
            m, l_ = t.new(self.rows(n, H), "activations"), t.new(self.rows(n, H), "activations")
            out = t.new(self.rows(n, hd), "activations")
            self.work.gat_fwd.append((E + n, hd))
            t.free(*packed)
            saved += [m, l_, out]
            st.update(saved=saved, z=z)
        return self._gat_epilogue(st)

    def _gat_epilogue(self, st: dict) -> str:
        """Heads concatenated + bias + ELU (hidden layers; ELU keeps its output) or averaged + bias."""
        t, n = self.tape, self.n
        D, hd = st["dim"], st["heads"] * st["dim"]
        if not st["last"] and st["fused"]:
            y = t.new(self.rows(n, hd))  # out + bias: the next layer's input (it keeps it, and applies the ELU)
            self.work.stream += 3 * self.rows(n, hd)
            return y
        if not st["last"]:
            y = t.new(self.rows(n, hd), "activations")  # ELU keeps its input
            e = t.new(self.rows(n, hd))
            self.work.stream += 4 * self.rows(n, hd)
            st["elu"] = y
            return e
        m = t.new(self.rows(n, D))
        y = t.new(self.rows(n, D))
        t.free(m)
        self.work.stream += 2 * self.rows(n, hd) + 2 * self.rows(n, D)
        return y

    def _gat_backward(self, st: dict, g: str) -> str | None:
        spec, t, n, h = self.spec, self.tape, self.n, self.h
        fin, H, D, first = st["fin"], st["heads"], st["dim"], st["first"]
        hd = H * D
        E = self.E
        if st["fused"] and not st["last"]:
            go = g  # the bias add and the head view pass the gradient through (the ELU is the next layer's)
        else:
            go = t.new(self.rows(n, hd))  # ELU backward (hidden) or the head mean's backward (last)
            self.work.stream += 3 * self.rows(n, hd)
            t.free(g, st.get("elu"))
        if self.engine == "single":
            # GATProjected.backward with WholeAttend: the dropped input, z and the scores recomputed, then
            # the attention's backward over the self-loop CSR and its transpose
            z, scores = self._gat_project(st)
            self.work.flops += 2.0 * n * fin * hd
            self.work.score += 2 * n * hd  # recomputed scores and their gradients by hand
            delta = t.new(self.rows(n, H))
            self._once(("self_loops_t",), (n + 1) * IDX + (E + n) * COL, n * IDX)
            gz, gs, gd = t.new(self.rows(n, hd)), t.new(self.rows(n, H)), t.new(self.rows(n, H))
            self.work.gat_bwd.append((E + n, hd))
            t.free(delta, *scores)
            return self._gat_project_backward(st, z, gz, gs, gd, go)
        if self.engine == "sar":
            # GATProjected.backward with SARAttend: the dropped input, z and the scores recomputed, local
            # and self-loop blocks, then the remote blocks fetched again in the rotation, their rows'
            # gradients sent back
            z, (s1, s2) = self._gat_project(st)
            self.work.flops += 2.0 * n * fin * hd
            self.work.score += 2 * n * hd  # recomputed scores and their gradients by hand
            delta = t.new(self.rows(n, H))
            gz, gs, gd = t.new(self.rows(n, hd)), t.new(self.rows(n, H)), t.new(self.rows(n, H))
            self._sar_gat_structs()
            self.work.gat_bwd.append((self.rs.local_edges, hd))
            g2 = [t.new(self.rows(n, hd)), t.new(self.rows(n, H)), t.new(self.rows(n, H))]
            self.work.gat_bwd.append((n, hd))
            self.work.stream += 3 * self.rows(n, hd)
            t.free(*g2)
            cut = E - self.rs.local_edges
            pend: list[str] = []
            for recv_rows, send_rows in self._steps():
                fs = t.new(self.rows(send_rows, hd + H), "halo")
                fr = t.new(self.rows(recv_rows, hd + H), "halo")
                self.halo_recv_max = max(self.halo_recv_max, int(self.rows(recv_rows, hd + H)))
                if recv_rows or send_rows:
                    self.work.exchanges.append((self.rows(send_rows, hd + H), self.rows(recv_rows, hd + H),
                                                int(recv_rows > 0) + int(send_rows > 0)))
                    self.work.exchanges.append((self.rows(recv_rows, hd + H), self.rows(send_rows, hd + H),
                                                int(recv_rows > 0) + int(send_rows > 0)))
                self.work.stream += 2 * self.rows(send_rows, hd + H) + 2 * self.rows(recv_rows, hd + H)
                t.free(fs)
                packed = None
                if recv_rows:
                    self.work.gat_bwd.append((cut * recv_rows / max(h, 1), hd))
                    b = [t.new(self.rows(recv_rows, hd)), t.new(self.rows(recv_rows, H)), t.new(self.rows(n, H))]
                    packed = t.new(self.rows(recv_rows, hd + H), "halo")
                    t.free(*b)
                t.free(fr)
                rr = t.new(self.rows(send_rows, hd + H), "halo")
                self.halo_recv_max = max(self.halo_recv_max, int(self.rows(send_rows, hd + H)))
                self.work.stream += 3 * self.rows(send_rows, hd + H)
                t.free(*pend)
                pend = [packed, rr] if self.prefetch else []
                if not self.prefetch:
                    t.free(packed, rr)
            t.free(*pend)
            t.free(delta, s1, s2)
            return self._gat_project_backward(st, z, gz, gs, gd, go)
        else:
            delta = t.new(self.rows(n, H))
            src = n + (h if self.engine == "dp" else 0)
            self._once(("self_loops_t",), (src + 1) * IDX + (E + n) * COL, src * IDX)
            gz = t.new(self.rows(src, hd))
            gs = t.new(self.rows(src, H))
            gd = t.new(self.rows(n, H))
            self.work.gat_bwd.append((E + n, hd))
            t.free(delta, go)
            saved = list(st["saved"])
            keep_z = st["z"]
            t.free(*[x for x in saved if x != keep_z])
            if self.engine == "dp" and self.codec is not None:
                # the halo rows' gradients are slices of gz and gs: sent back as they are; z's and the source
                # scores' gradients: the owned rows' slices + what came back
                back, back_s = self._quant_backward(hd, H)
                zsum, ssum = t.new(self.rows(n, hd)), t.new(self.rows(n, H))
                t.free(gz, back, gs, back_s)
                self.work.stream += 3 * self.rows(n, hd + H)
                gz = zsum
                t.free(ssum)
            elif self.engine == "dp":
                # the halo rows' gradients: the two slices of the exchanged message, summed, sent back
                gp = t.new(self.rows(h, hd + H), "halo")
                gp2 = t.new(self.rows(h, hd + H), "halo")
                t.free(gp2)
                self.work.stream += 5 * self.rows(h, hd + H)
                back = self._halo_backward(hd + H)
                t.free(gp)
                zsum = t.new(self.rows(n, hd))  # z's gradient: the owned rows' slice + what came back
                t.free(gz, back, gs)
                self.work.stream += 3 * self.rows(n, hd)
                gz = zsum
            else:
                t.free(gs)
            # the two score paths into z (g * att, accumulated in place) and the att gradients (g * z, summed)
            for _ in range(2):
                tmp = [t.new(self.rows(n, hd)), t.new(self.rows(n, hd))]
                t.free(*tmp)
            self.work.stream += 4 * self.rows(n, hd)  # the score paths accumulated into z's gradient
            t.free(gd, keep_z)
            self.work.flops += 2.0 * n * fin * hd  # weight gradient
        xd = st["xd"]
        if first:
            t.free(gz, xd)
            return None
        gx = t.new(self.rows(n, fin))
        self.work.flops += 2.0 * n * fin * hd
        t.free(gz, xd)
        if spec.dropout > 0:
            gdrop = t.new(self.rows(n, fin))
            self.work.mask += n * fin
            t.free(gx)
            gx = gdrop
        return gx

    def _gat_project(self, st: dict) -> tuple[str, tuple[str, str]]:
        """:func:`hpc_graph.ops.gat_attention.project`: the dropped input (when there is a mask), ``z`` from it,
        the input dropped, then both scores (one matrix-vector product per head). Returns ``(z, scores)``."""
        t, n = self.tape, self.n
        a = self._gat_input(st["fin"], st["first"]) if st["masked"] else None
        z = t.new(self.rows(n, st["heads"] * st["dim"]))
        t.free(a)
        return z, (t.new(self.rows(n, st["heads"])), t.new(self.rows(n, st["heads"])))

    def _gat_input(self, fin: float, first: bool) -> str:
        """``a = dropout(act(x))`` recomputed by a fused GAT op (torch's ELU on hidden layers, then the mask)."""
        a = self.tape.new(self.rows(self.n, fin))
        if self.p > 0:
            self.work.mask += self.n * fin
        if not first:
            self.work.stream += 2 * self.rows(self.n, fin)
        return a

    def _gat_project_backward(self, st: dict, z: str, gz: str, gs: str, gd: str, go: str) -> str | None:
        """:func:`hpc_graph.ops.gat_attention.project_backward` and the end of the fused op's backward: the
        att gradients (matrix-vector products), the score paths into z's gradient (in place), the weight
        gradient from the dropped input recomputed once more, the input's gradient through the projection,
        the dropout and the ELU; then the op's saved tensors and ``go`` are released."""
        t, n = self.tape, self.n
        fin, hd, first = st["fin"], st["heads"] * st["dim"], st["first"]
        self.work.stream += 6 * self.rows(n, hd)  # two reads of z, the two in-place score paths
        t.free(z)
        a = self._gat_input(fin, first) if st["masked"] else None
        self.work.flops += 2.0 * n * fin * hd  # weight gradient
        t.free(a)
        gx = None
        if not first:
            gx = t.new(self.rows(n, fin))
            self.work.flops += 2.0 * n * fin * hd
            t.free(gz)
            if self.p > 0:
                self.work.mask += n * fin
            ge = t.new(self.rows(n, fin))  # the ELU's backward (a new tensor)
            self.work.stream += 3 * self.rows(n, fin)
            t.free(gx)
            gx = ge
        t.free(gz, gs, gd, go, *st["saved"], st["xd"])
        return gx

    def _sar_gat_structs(self) -> None:
        """The transposes SAR's attention backward walks (``csc`` of every block, built once)."""
        rs, n = self.rs, self.n
        if not self.graph.directed:
            own = 0.0  # the owned block of an undirected graph is symmetric: its own transpose
        else:
            own = (n + 1) * IDX + rs.local_edges * COL
        remote = (self.h + rs.peers) * IDX + (self.E - rs.local_edges) * COL
        self._once(("blocks_csc",), own + remote, max(n, self.h) * IDX)

    # MLP (no graph): dropout + linear as one node keeping x, ReLU keeping its output
    def _mlp_forward(self, st: dict) -> str:
        t, n = self.tape, self.n
        fin, fout, x, first = st["fin"], st["fout"], st["x"], st["first"]
        fused = self.p > 0
        (y,) = self._dropout_linear_forward(x, fin, [fout], fused)
        if not st["last"]:
            r = t.new(self.rows(n, fout), "activations")
            self.work.stream += 2 * self.rows(n, fout)
            t.free(y)
            y = st["r"] = r
        return y

    def _mlp_backward(self, st: dict, g: str) -> str | None:
        t, n = self.tape, self.n
        fin, fout, first = st["fin"], st["fout"], st["first"]
        gr = None
        if not st["last"]:
            gr = t.new(self.rows(n, fout))
            self.work.stream += 3 * self.rows(n, fout)
        t.free(st.get("r"))
        gx = self._dropout_linear_backward(fin, [fout], not first, self.spec.dropout > 0)
        t.free(gr)
        return gx


# -- predictions ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class MemoryEstimate:
    """One rank's predicted memory (bytes).

    ``peak``: the high-water mark over loading and the first training step (the floor included);
    ``components``: what is live at that moment, by :data:`COMPONENTS`; ``where``: the moment.
    ``saved``: what autograd keeps for the backward pass at the end of the forward pass (parameters
    and the input features not counted); ``graph``, ``features``, ``params``: those components after
    the first step (transposes and caches built); ``halo_recv_max``: the largest receive buffer of
    one exchange; ``load_peak``: the high-water mark while loading.
    """

    rank: int
    peak: int
    components: dict[str, int]
    where: str
    saved: int
    graph: int
    features: int
    params: int
    halo_recv_max: int
    load_peak: int


@dataclasses.dataclass
class TimeEstimate:
    """One rank's predicted training step (seconds): ``compute`` (``terms``: ``spmm``,
    ``attention``, ``gemm``, ``elementwise``, and sylvie's ``codec``), ``halo`` (exchanges the step waits
    for), ``allreduce`` (gradients)."""

    rank: int
    compute: float
    halo: float
    allreduce: float
    terms: dict[str, float]
    messages: int = 0
    halo_bytes: float = 0.0
    bytes_sent: float = 0.0
    hidden: float = 0.0  # exchange time behind the computation (sylvie's pipeline), not in ``halo``

    @property
    def total(self) -> float:
        return self.compute + self.halo + self.allreduce


def walk_step(engine: str, spec: ModelSpec, graph: GraphShape, rank: RankShape, ranks: int, *,
              prefetch: bool = True, block_bytes: int | None = None, max_blocks: int | None = None,
              codec: HaloCodec | None = None, stage: FlowStage | None = None) -> _Walk:
    """Walk one training step of ``engine`` for ``rank`` (memory on the tape, work recorded): the first step
    (which builds transposes and caches), a later one (its work is the one timed: with sylvie's pipeline
    the first step is synchronous, the later ones stale), and the evaluation pass. ``codec``: sylvie's
    options (default: :class:`HaloCodec`'s); ``stage``: a flow rank's layers (default: all, one stage)."""
    if engine not in ENGINES:
        raise ValueError(f"engine: the planner covers {', '.join(ENGINES)}, not {engine!r}")
    if spec.name not in MODELS:
        raise ValueError(f"model.name: the planner describes models {', '.join(MODELS)}, not {spec.name!r}")
    w = _Walk(engine, spec, graph, rank, ranks, prefetch=prefetch, block_bytes=block_bytes, max_blocks=max_blocks,
              codec=codec, stage=stage)
    w.tape = _Tape(w.base())
    if w.flow is not None and w.flow.first:
        w.probe_units()
        w.work = _Work()
    w.forward_backward()
    # a later step: the graph's transposes and caches exist, nothing is built (its high-water mark alone)
    first = (w.tape.peak, w.tape.peak_parts, w.tape.peak_where)
    w.tape.peak = -1
    w.work = _Work()
    w.forward_backward()
    w.steady_peak = w.tape.peak
    work, w.work = w.work, _Work()
    recv_max = w.halo_recv_max  # of the training step (evaluation sends full rows, also on sylvie)
    w.eval_forward()  # the trainer evaluates every train.eval_every epochs and after the last
    w.work, w.halo_recv_max = work, recv_max
    if first[0] >= w.tape.peak:
        w.tape.peak, w.tape.peak_parts, w.tape.peak_where = first
    return w


def memory_of(w: _Walk, floor: int) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of a walked step, with ``floor`` bytes of process floor."""
    load_total, load_parts = w.load_peak()
    t = w.tape
    if load_total > t.peak:
        peak, parts, where = load_total, dict(load_parts), "loading"
    else:
        peak, parts, where = t.peak, dict(t.peak_parts), t.peak_where
    parts = {c: int(parts.get(c, 0)) for c in COMPONENTS if c != "floor"}
    parts = {"floor": int(floor), **parts}
    return MemoryEstimate(rank=w.rs.rank, peak=int(peak + floor), components=parts, where=where,
                          saved=int(w.saved_at_end_of_forward), graph=int(t.base.get("graph", 0)),
                          features=int(t.base.get("features", 0)), params=int(t.base.get("params", 0)),
                          halo_recv_max=int(w.halo_recv_max), load_peak=int(load_total + floor))


def time_of(w: _Walk, rates: Rates, *, threads: int, cores_share: float, ranks: int,
            overlap: bool = True) -> TimeEstimate:
    """The :class:`TimeEstimate` of a walked step at ``rates`` for a rank of ``threads`` threads on
    ``cores_share`` cores. ``overlap``: exchanges started in the background (sylvie's pipeline) travel while
    the rank computes (a network link); False: they cost their full time (ranks of one node, whose
    transfers are copies by the same cores, as measured on this machine)."""
    k = rates.slowdown(threads, cores_share)
    wk = w.work

    def lin(items, ab):
        a, b = ab
        return sum(e * (a + b * width) for e, width in items)

    spmm = (lin(wk.spmm_fwd, rates.spmm_fwd) + lin(wk.spmm_bwd, rates.spmm_bwd)) * k
    att = (lin(wk.gat_fwd, rates.gat_fwd) + lin(wk.gat_bwd, rates.gat_bwd)) * k
    gemm = wk.flops / rates.gemm_flops * k
    elem = (wk.stream / rates.stream + wk.mask / rates.mask + wk.score / rates.score) * k
    codec = wk.codec / rates.codec * k
    compute = spmm + att + gemm + elem + codec
    # the step's overhead beyond its kernels (Rates.step_overhead): a flow stage carries its layers' share; a
    # rank with less than a core runs it slower; a measured overhead below zero takes at most half the kernels
    lo, hi = w._stage()
    extra = rates.step_overhead_for(threads) * (hi - lo) / max(1, w.spec.layers)
    measured = rates.oversubscribed(threads / cores_share) if cores_share > 0 and threads > cores_share else None
    if measured is not None:  # the copies measured the whole step, its overhead included
        extra *= measured
    elif cores_share > 0:
        extra *= max(1.0, 1.0 / cores_share)
    extra = max(extra, -0.5 * compute)
    compute += extra
    halo = sum(rates.exchange_time(o, i, p) for o, i, p in wk.exchanges)
    # sylvie's pipeline: an exchange has a whole epoch of computation to travel behind
    behind = sum(rates.exchange_time(o, i, p) for o, i, p in wk.background)
    hidden = min(behind, compute) if overlap else 0.0
    halo += behind - hidden
    every = wk.exchanges + wk.background
    # the gradients (a flow stage's are its own: only the loss and the flags travel)
    pbytes = 0 if w.flow is not None else w.spec.num_params() * w.d
    calls = max(1, -(-pbytes // (25 << 20)))
    ar = rates.allreduce_time(pbytes or (2 + 2 * ranks) * w.d, ranks, calls)
    # the gradient all-reduce also carries the loss and the ranks' stop/finite flags: 2 + 2P values
    sent = sum(o for o, _, _ in every) + ((pbytes + (2 + 2 * ranks) * w.d) if ranks > 1 else 0)
    if w.codec is not None and ranks > 1:
        sent += 16  # sylvie's bit policy: the epoch's loss and time, all-reduced (two float64)
    terms = {"spmm": spmm, "attention": att, "gemm": gemm, "elementwise": elem}
    if w.codec is not None:
        terms["codec"] = codec
    terms["overhead"] = extra
    return TimeEstimate(rank=w.rs.rank, compute=compute, halo=halo, allreduce=ar, terms=terms,
                        messages=len(every), halo_bytes=sum(max(o, i) for o, i, _ in every), bytes_sent=sent,
                        hidden=hidden)


@dataclasses.dataclass
class Prediction:
    """One engine on one rank count: the bottleneck rank's memory, the slowest rank's step, and why.

    ``bottleneck``: ``memory`` (``fits`` is False), else the largest of ``compute``, ``halo exchange``,
    ``all-reduce``. ``time`` is None without rates (memory only).
    """

    engine: str
    ranks: int
    memory: MemoryEstimate
    time: TimeEstimate | None
    fits: bool | None
    bottleneck: str
    layout: Layout
    threads: int
    cores_share: float
    rank_peaks: list[int] = dataclasses.field(default_factory=list)
    rank_seconds: list[float] = dataclasses.field(default_factory=list)
    rank_bytes_sent: list[float] = dataclasses.field(default_factory=list)
    stages: list[list[int]] = dataclasses.field(default_factory=list)  # flow: [first layer, stop] per rank

    def as_dict(self) -> dict[str, Any]:
        out = {"engine": self.engine, "ranks": self.ranks, "threads_per_rank": self.threads,
               "cores_per_rank": self.cores_share, "fits": self.fits, "bottleneck": self.bottleneck,
               "layout": self.layout.source, "cut_fraction": self.layout.cut_fraction,
               "memory": dataclasses.asdict(self.memory), "rank_peaks": self.rank_peaks}
        if self.rank_seconds:
            out.update(rank_seconds=self.rank_seconds, rank_bytes_sent=self.rank_bytes_sent)
        if self.stages:
            out["stages"] = self.stages
        if self.time is not None:
            out["time"] = {**dataclasses.asdict(self.time), "epoch_seconds": self.time.total}
        return out


def threads_for(ranks_per_node: int, cores_per_node: int) -> tuple[int, float]:
    """``(threads, cores)`` of a rank when ``ranks_per_node`` ranks share ``cores_per_node`` cores: the
    threads ``hpc_graph.comm.threads`` gives by default (the rank's share, at least 1) and the cores
    it really gets (less than one when the ranks oversubscribe the node)."""
    r, c = max(1, int(ranks_per_node)), max(1, int(cores_per_node))
    return max(1, c // r), c / r


def flow_layout(graph: GraphShape, ranks: int) -> Layout:
    """The flow engine's ranks: every one holds the whole graph (its stage's layers differ)."""
    whole = single_layout(graph).parts[0]
    return Layout(ranks=ranks, parts=[dataclasses.replace(whole, rank=p) for p in range(ranks)],
                  source="whole graph on every rank (flow)", cut_fraction=0.0)


def flow_costs(spec: ModelSpec, graph: GraphShape, rates: Rates, *, threads: int, cores_share: float) -> list[float]:
    """Predicted forward + backward seconds of each layer on the whole graph (what ``stage_split: cost`` weighs)."""
    whole = single_layout(graph).parts[0]
    costs = []
    for layer in range(spec.layers):
        w = walk_step("flow", spec, graph, whole, 1, stage=FlowStage(layer, layer + 1, spec.layers))
        costs.append(time_of(w, rates, threads=threads, cores_share=cores_share, ranks=1).compute)
    return costs


def predict(engine: str, spec: ModelSpec, graph: GraphShape, layout: Layout, *, floor: int,
            rates: Rates | None = None, prefetch: bool = True, memory_per_rank: int | None = None,
            cores_per_node: int | None = None, ranks_per_node: int | None = None,
            threads: int | None = None, codec: HaloCodec | None = None,
            flow: tuple[int, str] = (1, "cost")) -> Prediction:
    """Predict ``engine`` on ``layout.ranks`` ranks: walk every rank of the layout, keep the largest
    peak memory and the slowest step. ``single`` needs ``layout.ranks == 1`` (ValueError otherwise).

    ``flow``: (micro-batches, stage split) of the flow engine; its layout is :func:`flow_layout` (any other is
    replaced), its stages split by count, or by the layers' predicted costs when there are rates (else by
    count, noted in the layout), and its epoch is the stages' steps one after the other (``exact``: no stage
    overlaps another) with every activation transfer between them."""
    P = layout.ranks
    if engine == "single" and P != 1:
        raise ValueError(f"engine 'single' runs on one rank, not {P}")
    cores = int(cores_per_node or os.cpu_count() or 1)
    rpn = int(ranks_per_node or P)
    t_default, share = threads_for(rpn, cores)
    thr = int(threads or t_default)
    stages: list[FlowStage | None] = [None] * len(layout.parts)
    if engine == "flow":
        micro, split = flow
        layout = flow_layout(graph, P)
        costs = None
        if split == "cost" and rates is not None:
            costs = flow_costs(spec, graph, rates, threads=thr, cores_share=share)
        bounds = flow_bounds(spec.layers, P, costs)
        layout.notes.append(f"flow: {P} stage(s), layers {', '.join(f'{a + 1}-{b}' for a, b in zip(bounds, bounds[1:]))}"
                            f" ({'predicted layer costs' if costs else 'by count'}"
                            f"{'; stage_split cost without rates: by count' if split == 'cost' and not costs else ''})")
        stages = [FlowStage(bounds[p], bounds[p + 1], spec.layers, micro, split) for p in range(P)]
    best_mem: MemoryEstimate | None = None
    worst: TimeEstimate | None = None
    peaks, seconds, sent = [], [], []
    stage_times: list[TimeEstimate] = []
    for rs, stage in zip(layout.parts, stages):
        w = walk_step(engine, spec, graph, rs, P, prefetch=prefetch, codec=codec, stage=stage)
        mem = memory_of(w, floor)
        peaks.append(mem.peak)
        if best_mem is None or mem.peak > best_mem.peak:
            best_mem = mem
        if rates is not None:
            # background exchanges overlap the computation over a network (a modelled link, or peers on other
            # nodes), not between ranks of one node measured by the profile (their transfers are CPU copies)
            overlap = rates.link is not None or rpn < P
            tm = time_of(w, rates, threads=thr, cores_share=share, ranks=P, overlap=overlap)
            seconds.append(tm.total)
            sent.append(tm.bytes_sent)
            stage_times.append(tm)
            if worst is None or tm.total > worst.total:
                worst = tm
    assert best_mem is not None
    if engine == "flow" and stage_times:
        # exact GPipe: the stages compute one after the other, each transfer once (counted by both of its ends)
        worst = TimeEstimate(rank=worst.rank, compute=sum(x.compute for x in stage_times),
                             halo=sum(x.halo for x in stage_times) / 2,
                             allreduce=max(x.allreduce for x in stage_times),
                             terms={k: sum(x.terms.get(k, 0.0) for x in stage_times) for k in stage_times[0].terms},
                             messages=sum(x.messages for x in stage_times) // 2,
                             halo_bytes=sum(x.halo_bytes for x in stage_times) / 2, bytes_sent=max(sent))
    fits = None if memory_per_rank is None else best_mem.peak <= memory_per_rank
    if fits is False:
        bottleneck = "memory"
    elif worst is None:
        bottleneck = "-"
    else:
        terms = {"compute": worst.compute, "halo exchange": worst.halo, "all-reduce": worst.allreduce}
        bottleneck = max(terms, key=terms.get)
    return Prediction(engine=engine, ranks=P, memory=best_mem, time=worst, fits=fits, bottleneck=bottleneck,
                      layout=layout, threads=thr, cores_share=share, rank_peaks=peaks, rank_seconds=seconds,
                      rank_bytes_sent=sent, stages=[[x.start, x.stop] for x in stages if x is not None])


# -- the training refusal ------------------------------------------------------------------------------
def rank_from_partition(directory: str | os.PathLike, rank: int) -> tuple[Layout, RankShape]:
    """One rank's :class:`RankShape` of a partition directory (``partition.json`` and its own part file's
    offsets only: cheap on every rank of a large job)."""
    from data_io.partition import read_partition_meta

    directory = Path(directory)
    meta = read_partition_meta(directory)
    P = int(meta["num_parts"])
    info = next(p for p in meta["parts"] if int(p["part_id"]) == int(rank))
    h, s = int(info["num_halo"]), int(info["num_send"])
    counts = _peer_counts(directory, info, P)
    halo_from, send_to, boundary = counts if counts is not None else (_even(h, rank, P), _even(s, rank, P), -1)
    e = int(info["num_edges"])
    rs = RankShape(rank=int(rank), owned=int(info["num_nodes"]), edges=e,
                   local_edges=max(0, e - int(info.get("cut_edges", 0))), halo=h, send=s,
                   train=int(info.get("num_train", 0)), halo_from=halo_from, send_to=send_to, boundary=boundary)
    layout = Layout(ranks=P, parts=[rs], source=f"partition {directory}",
                    cut_fraction=float(meta.get("edge_cut_fraction") or 0.0))
    return layout, rs


def train_estimate(config: Any, engine: str, rank: int, size: int) -> tuple[int, str] | None:
    """What rank ``rank`` of a ``size``-rank ``hpc-graph train`` job of ``config`` (a training config:
    ``data``, ``model``, ``optim``, ``train``, ``engine``, ``recipes`` sections) will still allocate, in
    bytes: the predicted peak without the process floor, plus the kernels and thread pools a process
    that imported torch loads on its first step (:data:`KERNEL_ALLOWANCE_BYTES`). No timing, nothing
    collective: reads ``partition.json`` and this rank's part offsets, or the dataset's header.

    Returns ``(bytes, text describing the prediction)``, or None for an engine or model the planner does
    not describe, or a graph-level dataset (no check then).
    """
    if engine not in ENGINES or str(config.model.name) not in MODELS:
        return None
    path = str(config.data.path)
    if os.path.isfile(path):
        from data_io.dataset import dataset_task

        if dataset_task(path) == "graph":
            return None  # steps over batches of small graphs: not the full-batch step described here
    stage = None
    if engine in ("single", "flow"):
        graph = graph_from_dataset(path)
        layout = single_layout(graph)
        rs = layout.parts[0]
        P = 1
        if engine == "flow":
            try:
                micro, split = check_flow(config.engine)
                bounds = flow_bounds(int(config.model.num_layers), size)  # the engine may split by cost: by count here
            except ValueError:
                return None  # a configuration the planner does not model: no check
            P, rs = size, dataclasses.replace(rs, rank=rank)
            stage = FlowStage(bounds[rank], bounds[rank + 1], int(config.model.num_layers), micro, split)
    else:
        graph = graph_from_partition(path)
        layout, rs = rank_from_partition(path, rank)
        P = layout.ranks
    spec = model_spec(config.model, graph.features, graph.classes, dtype=config.train.dtype,
                      optimizer=config.optim.name, momentum=config.optim.momentum,
                      feature_norm=config.data.feature_norm, label_aug=getattr(config.recipes, "label_aug", 0.0))
    w = walk_step(engine, spec, graph, rs, P, prefetch=bool(getattr(config.engine, "prefetch", True)),
                  codec=engine_codec(engine, config.engine), stage=stage)
    mem = memory_of(w, 0)
    need = mem.peak + KERNEL_ALLOWANCE_BYTES
    from data_io.memory import format_bytes

    text = (f"{engine} {spec.name}, rank {rank}: peak {format_bytes(mem.peak)} at {mem.where} + "
            f"{format_bytes(KERNEL_ALLOWANCE_BYTES)} of kernels")
    return int(need), text
