"""What a job's data look like to the planner: the whole graph (:class:`GraphShape`) and what each rank of a
rank count holds (:class:`RankShape`, a :class:`Layout` of them), from a dataset file's header, a partition
directory's ``partition.json`` and part files, or the *cut model* (no partition needed).

These are sizes only: :mod:`hpc_graph.plan.rank` builds a rank's engine from them (``Engine.plan_instance``) and
runs its step on shapes.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class GraphShape:
    """The whole graph.

    Attributes:
        nodes: N. edges: E, stored in-edges (CSR entries; an undirected graph counts both directions).
        features: F, input feature width. classes: C. train_nodes: labelled training nodes.
        directed: the CSR is not its own transpose (an undirected graph stored with ascending rows is).
        disk_index_bytes: bytes per stored index in the dataset file (4: int32, kept; 8: converted to int32).
        name: for messages. lap_pe: k, the width of the dataset's Laplacian positional encodings (0: none).
    """

    nodes: int
    edges: int
    features: int
    classes: int
    train_nodes: int = 0
    directed: bool = False
    disk_index_bytes: int = 4
    name: str = "graph"
    lap_pe: int = 0


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
        pe = int(fields["lap_pe"].shape[1]) if "lap_pe" in fields and len(fields["lap_pe"].shape) == 2 else 0
        return GraphShape(nodes=int(ds.num_nodes), edges=int(ds.num_edges), features=int(ds.feat_dim),
                          classes=int(ds.num_classes), train_nodes=train, directed=bool(ds.directed),
                          disk_index_bytes=disk, name=str(ds.name), lap_pe=pe)


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


def replicated_layout(graph: GraphShape, ranks: int) -> Layout:
    """Ranks that each hold the whole graph (an engine that replicates it, e.g. a pipeline's stages)."""
    whole = single_layout(graph).parts[0]
    return Layout(ranks=ranks, parts=[dataclasses.replace(whole, rank=p) for p in range(ranks)],
                  source="whole graph on every rank", cut_fraction=0.0)


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
