"""``DistGraph``: one partition of a graph in memory, as the distributed engines use it.

A rank ``p`` of ``N`` owns the nodes with new global ids
``[node_ranges[p], node_ranges[p+1])`` (local ids ``0 .. num_owned-1``) and
sees the *halo* nodes of other partitions that have an edge into one of its
owned nodes (local ids ``num_owned .. num_owned+num_halo-1``, sorted by global
id, hence grouped by owner). Every in-edge of an owned node is stored here, so
the global in-degree of an owned node is its local row length.

Built from a :class:`data_io.partition.Partition`:

* ``local``: CSR over owned destinations whose columns index ``[owned | halo]``
  (what the ``dp`` engine multiplies after a halo exchange);
* ``blocks[q]``: the SAR block G_{p,q}: the edges whose source is owned by
  ``q``; for ``q == p`` the columns are owned local ids, otherwise the halo
  columns of ``q`` re-based to 0 (``num_src = halo_count(q)``). Only blocks of
  partitions that share a halo are present (plus ``p`` itself);
* send/recv plans: ``send_lid[q]`` owned local ids whose rows rank ``q`` needs
  (in the order of q's halo block for ``p``), ``recv_count[q]`` halo rows owned
  by ``q`` (both only for peers with a non-empty list);
* ``book``: the partition book (global id -> owner / local id).
"""
from __future__ import annotations

import copy
import logging
import os
from typing import Any

import numpy as np
import torch

from data_io.errors import DataError
from data_io.partition import PartitionBook, read_partition, read_partition_meta
from hpc_graph.ops.csr import CSR, column_dtype, relational_csr

log = logging.getLogger(__name__)


class RankMismatchError(DataError, ValueError):
    """The job's rank count (or rank) does not fit the partition directory.

    A :class:`data_io.errors.DataError` (the CLI prints it as one line) and a ``ValueError``.
    """


def transpose_csr(g: CSR) -> CSR:
    """The transpose of ``g`` as a CSR (``num_dst`` and ``num_src`` swapped, weights permuted).

    On the CPU a counting sort builds it in O(E) and nothing is cached on ``g``
    (the edge permutation is dropped unless there are weights to permute: the
    transpose of an unweighted block costs 8 bytes per edge, not 16).
    """
    if g.is_shape_only:  # sizes only: what the CPU path below allocates
        perm = torch.empty(g.num_edges, dtype=torch.int64, device="meta") if g.edge_weight is not None else None
        out = CSR.of_shape(g.num_src, g.num_dst, g.num_edges, index_dtype=g.indices.dtype)
        out.edge_weight = None if perm is None else g.edge_weight.new_empty(g.num_edges)
        return out
    if g.device.type != "cpu":
        indptr_t, indices_t, perm = g.csc()
    else:
        from numba_kernels.cpu._transpose import csr_transpose

        arrays = csr_transpose(g.indptr.numpy(), g.indices.numpy(), g.num_src, g.edge_weight is not None)
        indptr_t, indices_t, perm = (torch.from_numpy(a) for a in arrays)
    w = None if g.edge_weight is None else g.edge_weight[perm]
    del perm
    return CSR(indptr_t, indices_t, g.num_dst, w, validate=False)


class DistGraph:
    """One rank's partition: owned + halo nodes, local CSR, SAR blocks, send/recv plans.

    Attributes:
        part_id, num_parts: this partition and the partition count.
        num_owned (n), num_halo (h), global_num_nodes.
        node_ranges: int64[P+1] NumPy; owned range of part q is ``[node_ranges[q], node_ranges[q+1])``.
        halo_offsets: int64[P+1] NumPy; halo rows of q are ``halo_gid[halo_offsets[q]:halo_offsets[q+1]]``.
        halo_gid: int64[h] tensor (on ``device``).
        local_gid: int64[n+h] tensor: global id of each column of ``local``.
        orig_id, halo_orig_id, local_orig_id: int64[n], int64[h], int64[n+h] tensors: ids of the
            same nodes in the source dataset (independent of the partitioning; the attention
            dropout hash uses them so that every engine and partitioning drops the same edges).
            ``halo_orig_id`` is fetched from the owners by :meth:`fetch_halo_orig_ids`; until
            then (and when no ``orig_id`` is given) the relabelled ids stand in.
        gid: int64[n] tensor: global id of each owned node.
        in_degree: int64[n] tensor: in-degree of each owned node in the whole graph.
        local: CSR [n x (n+h)] (None after :meth:`release_local`).
        blocks: {q: CSR} for q == part_id and every q with halo rows here.
        send_lid: {q: int64[s_q] tensor} owned rows to send to q (non-empty only).
        recv_count: {q: int} halo rows owned by q (non-zero only).
        book: partition book (``owner(gid)``, ``to_local(gid)``).
        edge_type: int16[E] NumPy (edge types of ``local``'s edges, in its order) or None (untyped).
        num_relations: edge types R of the whole graph (1 when untyped; :func:`load_dist_graph`
            agrees on it across ranks).
    """

    def __init__(self, *, part_id: int, num_parts: int, node_ranges: np.ndarray,
                 halo_gid: np.ndarray, halo_offsets: np.ndarray, indptr: np.ndarray,
                 indices: np.ndarray, send_offsets: np.ndarray, send_lid: np.ndarray,
                 edge_weight: np.ndarray | None = None, global_num_nodes: int | None = None,
                 orig_id: np.ndarray | None = None, edge_type: np.ndarray | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.part_id = int(part_id)
        self.num_parts = int(num_parts)
        self.node_ranges = np.asarray(node_ranges, dtype=np.int64)
        self.halo_offsets = np.asarray(halo_offsets, dtype=np.int64)
        self.device = torch.device(device)
        self.dtype = dtype
        p = self.part_id
        n = int(self.node_ranges[p + 1] - self.node_ranges[p])
        halo_gid = np.asarray(halo_gid, dtype=np.int64)
        h = int(len(halo_gid))
        self.num_owned, self.num_halo = n, h
        self.first_gid = int(self.node_ranges[p])
        self.global_num_nodes = int(self.node_ranges[-1] if global_num_nodes is None else global_num_nodes)
        self.book = PartitionBook(self.node_ranges)

        indptr = np.asarray(indptr, dtype=np.int64)
        indices = np.asarray(indices, dtype=column_dtype(n + h))
        w = None if edge_weight is None else torch.as_tensor(np.asarray(edge_weight)).to(dtype)
        self.local = CSR(indptr, indices, n + h, w).to(self.device)
        self.in_degree = self.local.in_degree()
        self.gid = torch.arange(self.first_gid, self.first_gid + n, dtype=torch.int64, device=self.device)
        self.halo_gid = torch.as_tensor(halo_gid).to(self.device)
        self.local_gid = torch.cat([self.gid, self.halo_gid])
        self.orig_id = self.gid if orig_id is None else torch.as_tensor(
            np.asarray(orig_id, dtype=np.int64)).to(self.device)
        self.halo_orig_id = self.halo_gid
        self.local_orig_id = self.local_gid if orig_id is None else torch.cat([self.orig_id, self.halo_gid])

        self.edge_type = None if edge_type is None else np.asarray(edge_type, dtype=np.int16)
        if self.edge_type is not None and self.edge_type.shape != (len(indices),):
            raise ValueError(f"edge_type: expected {len(indices)} values (one per edge), got {self.edge_type.shape}")
        self.num_relations = 1 if self.edge_type is None or not len(self.edge_type) else int(self.edge_type.max()) + 1
        self._block_types: dict[int, np.ndarray] = {}  # edge types of each SAR block (typed graphs)
        self._relational: "DistGraph | None" = None
        self._blocks: dict[int, CSR] | None = None  # built on first use (SAR), see ``blocks``
        self._blocks_t: dict[int, CSR] = {}
        counts = np.diff(self.halo_offsets)

        send_offsets = np.asarray(send_offsets, dtype=np.int64)
        send_lid = np.asarray(send_lid, dtype=np.int64)
        self.send_lid: dict[int, torch.Tensor] = {}
        self.recv_count: dict[int, int] = {}
        for q in range(self.num_parts):
            lo, hi = int(send_offsets[q]), int(send_offsets[q + 1])
            if hi > lo:
                self.send_lid[q] = torch.as_tensor(send_lid[lo:hi]).to(self.device)
            if counts[q] > 0:
                self.recv_count[q] = int(counts[q])
        self._identity: CSR | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_partition(cls, part: Any, comm: Any = None, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32, source: str | None = None) -> "DistGraph":
        """Build from a :class:`data_io.partition.Partition`.

        Args:
            part: the partition of this rank.
            comm: communicator; when given, its ``size`` must equal ``part.num_parts``
                and its ``rank`` must equal ``part.part_id`` (:class:`RankMismatchError` otherwise).
            device: where tensors and CSR structures live.
            dtype: floating dtype for edge weights.
            source: partition directory, named in errors.
        """
        if comm is not None:
            check_ranks(part.num_parts, comm, source)
            if int(comm.rank) != int(part.part_id):
                raise RankMismatchError(f"{source or 'partition'}: rank {comm.rank} was given part "
                                        f"{part.part_id}")
        return cls(part_id=part.part_id, num_parts=part.num_parts, node_ranges=part.node_ranges,
                   halo_gid=part.halo_gid, halo_offsets=part.halo_offsets, indptr=part.indptr,
                   indices=part.indices, send_offsets=part.send_offsets, send_lid=part.send_lid,
                   edge_weight=part.edge_weight, global_num_nodes=part.global_num_nodes or None,
                   orig_id=part.orig_id, edge_type=part.edge_type, device=device, dtype=dtype)

    @classmethod
    def of_shape(cls, *, part_id: int, num_parts: int, owned: int, edges: int, local_edges: int,
                 halo_from: tuple[int, ...], send_to: tuple[int, ...], global_num_nodes: int,
                 directed: bool = False, dtype: torch.dtype = torch.float32,
                 edges_from: tuple[int, ...] = ()) -> "DistGraph":
        """A partition with sizes and no data, on the ``meta`` device (what the planner runs the engines on):
        ``owned`` nodes with ``edges`` in-edges, ``local_edges`` of them from owned sources; ``halo_from[q]`` halo
        rows owned by part ``q``, ``send_to[q]`` rows sent to part ``q``; ``edges_from[q]``: the in-edges from part
        ``q``'s nodes (the SAR blocks' sizes; when not given, the remote edges are shared out in proportion to each
        peer's halo rows). ``directed``: the graph is not its own transpose."""
        dg = cls.__new__(cls)
        meta = torch.device("meta")
        P, p, n = int(num_parts), int(part_id), int(owned)
        halo_from = tuple(int(c) for c in halo_from) + (0,) * (P - len(halo_from))
        halo_from = tuple(0 if q == p else c for q, c in enumerate(halo_from[:P]))
        h = sum(halo_from)
        dg.part_id, dg.num_parts, dg.device, dg.dtype = p, P, meta, dtype
        share = -(-int(global_num_nodes) // max(P, 1))
        dg.node_ranges = np.minimum(np.arange(P + 1, dtype=np.int64) * share, int(global_num_nodes))
        dg.node_ranges[p + 1] = dg.node_ranges[p] + n
        dg.halo_offsets = np.concatenate(([0], np.cumsum(halo_from))).astype(np.int64)
        dg.num_owned, dg.num_halo = n, h
        dg.first_gid = int(dg.node_ranges[p])
        dg.global_num_nodes = int(global_num_nodes)
        dg.book = PartitionBook(dg.node_ranges)
        dg.local = CSR.of_shape(n, n + h, int(edges), symmetric=(not directed and h == 0 and P == 1))
        dg.in_degree = dg.local.in_degree()
        ids = lambda k: torch.empty(k, dtype=torch.int64, device=meta)  # noqa: E731
        dg.gid, dg.halo_gid = ids(n), ids(h)
        dg.local_gid = torch.cat([dg.gid, dg.halo_gid])
        dg.orig_id = ids(n)  # a partition file always carries the source ids
        dg.halo_orig_id = ids(h)
        dg.local_orig_id = torch.cat([dg.orig_id, dg.halo_orig_id])
        dg.edge_type, dg.num_relations = None, 1
        dg._directed = bool(directed)
        dg._block_types, dg._relational, dg._blocks, dg._blocks_t = {}, None, None, {}
        dg.send_lid = {q: ids(int(c)) for q, c in enumerate(tuple(send_to)[:P]) if int(c) > 0 and q != p}
        dg.recv_count = {q: c for q, c in enumerate(halo_from) if c > 0}
        dg._identity = None
        remote = max(int(edges) - int(local_edges), 0)
        if len(edges_from) == P:
            dg._shape_block_edges = {q: int(edges_from[q]) for q in range(P) if q == p or halo_from[q] > 0}
        else:
            dg._shape_block_edges = {q: (int(local_edges) if q == p else
                                         int(round(remote * halo_from[q] / h)) if h else 0)
                                     for q in range(P) if q == p or halo_from[q] > 0}
        return dg

    @property
    def is_shape_only(self) -> bool:
        """Sizes without data (:meth:`of_shape`)."""
        return self.device.type == "meta"

    def fetch_halo_orig_ids(self, comm: Any) -> None:
        """Fill ``halo_orig_id`` (and ``local_orig_id``) with the halo nodes' source-dataset ids.

        One halo exchange of int64 ids with every peer that shares a halo (collective:
        every rank must call it).
        """
        sends = {q: self.orig_id.index_select(0, lid).contiguous() for q, lid in self.send_lid.items()}
        got = comm.exchange(sends, {q: ((c,), torch.int64) for q, c in self.recv_count.items()},
                            device=self.device)
        parts = [got[q].to(self.device) for q in sorted(self.recv_count)]
        self.halo_orig_id = torch.cat(parts) if parts else self.halo_gid.new_zeros(0)
        self.local_orig_id = torch.cat([self.orig_id, self.halo_orig_id])

    # ------------------------------------------------------------------ queries
    @property
    def blocks(self) -> dict[int, CSR]:
        """``{q: CSR}``: the SAR blocks G_{p,q}, built from ``local`` on first use and cached.

        Each block has ``num_owned`` rows; block ``p`` has the owned columns, block
        ``q != p`` the halo columns of ``q`` re-based to 0. Within a row the edges keep
        their order in ``local``. Only partitions with halo rows here (and ``p``) appear.
        """
        if self._blocks is None:
            self._blocks = self._split_blocks()
        return self._blocks

    def _split_blocks(self) -> dict[int, CSR]:
        if self.is_shape_only:
            counts = np.diff(self.halo_offsets)
            n, p = self.num_owned, self.part_id
            # the block of the owned sources is square; on an undirected graph it is its own transpose
            return {q: CSR.of_shape(n, n if q == p else int(counts[q]), e, symmetric=q == p and not self._directed)
                    for q, e in self._shape_block_edges.items()}
        # One pass per block over the edges with a boolean mask: a block's row pointer is the
        # running count of its edges sampled at the row boundaries, so edges keep their order
        # in ``local`` and no E-sized sort or destination array is needed (transient ~10 B/edge).
        p, n = self.part_id, self.num_owned
        indptr, indices = self.local.indptr.cpu().numpy(), self.local.indices.cpu().numpy()
        w = self.local.edge_weight
        counts = np.diff(self.halo_offsets)
        running = np.zeros(len(indices) + 1, dtype=np.int64)
        blocks: dict[int, CSR] = {}
        for q in range(self.num_parts):
            if q != p and counts[q] == 0:
                continue
            lo, hi = (0, n) if q == p else (n + int(self.halo_offsets[q]), n + int(self.halo_offsets[q + 1]))
            mask = indices < hi
            if lo > 0:
                mask &= indices >= lo
            np.cumsum(mask, out=running[1:])
            bptr = running[indptr]
            cols = indices[mask]
            if lo:
                cols -= lo
            bw = None if w is None else w[torch.from_numpy(mask).to(w.device)]
            if self.edge_type is not None:
                self._block_types[q] = self.edge_type[mask]
            del mask
            blocks[q] = CSR(bptr, cols, n if q == p else int(counts[q]), bw, validate=False).to(self.device)
        return blocks

    def halo_range(self, q: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of the halo (0-based within the halo) owned by partition ``q``."""
        return int(self.halo_offsets[q]), int(self.halo_offsets[q + 1])

    def release_local(self) -> None:
        """Build ``blocks`` and drop ``local`` (SAR needs only the blocks; saves one copy of the structure)."""
        _ = self.blocks
        self.local = None
        self.edge_type = None  # kept per block from now on

    def relational(self) -> "DistGraph":
        """The relation-expanded view of this partition (R-GCN), built once and cached.

        A shallow copy with the same nodes, halo and send plans whose destination rows are
        ``i * R + r`` (the in-edges of owned node ``i`` of type ``r``, see
        :func:`~hpc_graph.ops.csr.relational_csr`): ``local`` (or, after :meth:`release_local`,
        the SAR ``blocks``) has ``num_owned * R`` rows and ``in_degree`` is per (node, type). So
        every aggregation that takes a DistGraph (the halo exchange + one SpMM of ``dp``, SAR's
        block rotation) computes all relations in one pass, ``[n * R, F]``, with one exchange.

        Raises:
            ValueError: the partition has no edge types.
        """
        if self._relational is None:
            if self.edge_type is None and not self._block_types:
                raise ValueError("relational aggregation needs edge types (/graph/edge_type) in the partition")
            r = self.num_relations
            rel = copy.copy(self)
            rel._relational, rel._identity, rel._blocks_t = None, None, {}
            rel._block_types, rel.edge_type = {}, None
            if self.local is not None:
                rel.local = relational_csr(self.local.indptr, self.local.indices, self.edge_type, r,
                                           self.local.num_src).to(self.device)
                rel.in_degree = rel.local.in_degree()
                rel._blocks = None
            else:
                rel.local = None
                rel._blocks = {q: relational_csr(b.indptr, b.indices, self._block_types[q], r,
                                                 b.num_src).to(self.device)
                               for q, b in self.blocks.items()}
                rel.in_degree = sum(b.in_degree() for b in rel._blocks.values())
            self._relational = rel
        return self._relational

    def block_gid(self, q: int) -> torch.Tensor:
        """int64[num_src of block q]: global ids of the source columns of block G_{p,q}."""
        if q == self.part_id:
            return self.gid
        lo, hi = self.halo_range(q)
        return self.halo_gid[lo:hi]

    def block_orig_id(self, q: int) -> torch.Tensor:
        """int64[num_src of block q]: source-dataset ids of the source columns of block G_{p,q}."""
        if q == self.part_id:
            return self.orig_id
        lo, hi = self.halo_range(q)
        return self.halo_orig_id[lo:hi]

    def block_t(self, q: int) -> CSR:
        """Transpose of ``blocks[q]`` (``[num_src x n]``), built once and cached."""
        if q not in self._blocks_t:
            self._blocks_t[q] = transpose_csr(self.blocks[q])
        return self._blocks_t[q]

    def identity(self) -> CSR:
        """The self-loop block: identity CSR over owned nodes (``[n x n]``)."""
        if self._identity is None:
            n = self.num_owned
            self._identity = CSR(torch.arange(n + 1, device=self.device),
                                 torch.arange(n, device=self.device), n, validate=False)
            if self.is_shape_only:
                self._identity._cache["symmetric"] = True  # what the data would tell
        return self._identity

    def local_self_loops(self) -> CSR:
        """``local`` with a self-loop edge ``i -> i`` appended to every owned row, built once.

        ``[n x (n+h)]``: the one-block form of attention with self loops (GAT in ``dp``). On the
        CPU its transpose (``csc()``) is built at once by counting sort, before any activation
        is alive, instead of by an E-sized argsort inside the first backward pass.
        """
        loops = self.local.with_self_loops()
        if loops.device.type == "cpu":  # the transpose GAT's backward walks, by counting sort (O(E)); cached
            loops.csc(perm=False)
        return loops

    def send_count(self, q: int) -> int:
        """Rows this rank sends to ``q`` per halo exchange (0 if none)."""
        t = self.send_lid.get(q)
        return 0 if t is None else int(t.shape[0])

    def orig_ids_of(self, gids: torch.Tensor) -> torch.Tensor:
        """Source-dataset ids of the nodes ``gids`` (they key the dropout hashes). A node neither owned nor in
        the halo has no known dataset id here: ``global_num_nodes + gid`` stands in, an id no dataset node has
        and the same on every rank, so two nodes of a batch never share a key."""
        dg = self
        if dg.orig_id is dg.gid:
            return gids
        out = gids + dg.global_num_nodes
        own = (gids >= dg.first_gid) & (gids < dg.first_gid + dg.num_owned)
        out[own] = dg.orig_id[gids[own] - dg.first_gid]
        halo = ~own
        if halo.any() and dg.halo_gid.numel():
            hg = dg.halo_gid
            pos = torch.searchsorted(hg, gids[halo]).clamp(max=hg.numel() - 1)
            found = hg[pos] == gids[halo]
            idx = halo.nonzero().squeeze(1)
            out[idx[found]] = dg.halo_orig_id[pos[found]]
        return out

    def __repr__(self) -> str:
        return (f"DistGraph(part {self.part_id}/{self.num_parts}, owned={self.num_owned}, "
                f"halo={self.num_halo}, edges={int(self.in_degree.sum())}, peers={sorted(self.recv_count)})")


def check_ranks(num_parts: int, comm: Any, source: str | None = None) -> None:
    """:class:`RankMismatchError` unless the job has exactly ``num_parts`` ranks (names the directory)."""
    if int(comm.size) != int(num_parts):
        raise RankMismatchError(f"{source or 'partition'}: partitioned into {int(num_parts)} parts but the job "
                         f"runs {int(comm.size)} ranks; launch with {int(num_parts)} ranks or re-partition")


def load_dist_graph(directory: str | os.PathLike, comm: Any, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple["DistGraph", Any]:
    """Read this rank's part of partition directory ``directory`` and build its DistGraph.

    Checks the rank count against ``partition.json`` before reading the part file.
    Returns ``(DistGraph, Partition)``; the Partition carries feat/label/masks as NumPy, its ``indices``
    released (None): the DistGraph holds the structure, with int32 columns, and the file's int64 copy
    is not kept beside it.
    """
    directory = str(directory)
    num_parts = int(read_partition_meta(directory)["num_parts"])
    check_ranks(num_parts, comm, directory)
    part = read_partition(directory, int(comm.rank))
    dg = DistGraph.from_partition(part, comm, device, dtype, source=directory)
    if dg.local.indices.dtype == torch.int32:
        part.indices = None  # converted to int32 by the DistGraph: drop the int64 copy now
    dg.fetch_halo_orig_ids(comm)
    # the same number of relations on every rank (a part may lack the highest types)
    counts = torch.tensor([float(dg.num_relations if dg.edge_type is not None else 0)], dtype=torch.float64)
    comm.allreduce_(counts, op="max")
    dg.num_relations = max(1, int(counts.item()))
    log.debug("rank %d: %r", comm.rank, dg)
    return dg, part


def partition_tensors(part: Any, device: torch.device | str, dtype: torch.dtype,
                      source: str = "partition") -> dict[str, Any]:
    """Node data of a Partition as tensors on ``device``.

    Returns ``{"feat": float[n, F] (dtype), "label": int64[n] (-1 where unlabelled),
    "masks": {"train"|"val"|"test": bool[n]} (all False when absent), "num_classes": int,
    "num_features": int}``. ``ValueError`` naming ``source`` when the part has no features.
    """
    n = part.num_owned
    if part.feat is None:
        raise ValueError(f"{source}: part {part.part_id} has no node features (/node/feat)")
    feat = torch.as_tensor(np.asarray(part.feat)).to(device=device, dtype=dtype)
    if part.label is None:
        label = torch.full((n,), -1, dtype=torch.int64, device=device)
    else:
        label = torch.as_tensor(np.asarray(part.label, dtype=np.int64)).to(device)
    masks = {}
    for name in ("train", "val", "test"):
        m = getattr(part, f"{name}_mask")
        masks[name] = (torch.zeros(n, dtype=torch.bool, device=device) if m is None
                       else torch.as_tensor(np.asarray(m, dtype=np.bool_)).to(device))
    return {"feat": feat, "label": label, "masks": masks, "num_classes": int(part.num_classes),
            "num_features": int(feat.shape[1])}


def dataset_as_partition(path: str, device: torch.device, dtype: torch.dtype) -> tuple[DistGraph, dict]:
    """``(DistGraph, data)``: a dataset file as the single partition of a one-rank job (sampled engines)."""
    from data_io.dataset import open_dataset
    from data_io.errors import FormatError

    with open_dataset(path) as ds:
        if not ds.has("feat"):
            raise FormatError(path, "/node/feat", "missing (training needs node features)")
        n = ds.num_nodes
        indptr, indices = ds.indptr(), ds.indices()
        feat = ds.feat_rows(0, n)
        label = ds.label() if ds.has("label") else np.full(n, -1, dtype=np.int64)
        masks = {k: (ds.mask(f"{k}_mask") if ds.has(f"{k}_mask") else np.zeros(n, dtype=bool))
                 for k in ("train", "val", "test")}
        num_classes = int(ds.num_classes) or int(label.max()) + 1
    dg = DistGraph(part_id=0, num_parts=1, node_ranges=np.array([0, n]), halo_gid=np.zeros(0, np.int64),
                   halo_offsets=np.zeros(2, np.int64), indptr=indptr, indices=indices,
                   send_offsets=np.zeros(2, np.int64), send_lid=np.zeros(0, np.int64), device=device, dtype=dtype)
    data = {"feat": torch.from_numpy(np.asarray(feat)).to(device=device, dtype=dtype),
            "label": torch.from_numpy(np.asarray(label, dtype=np.int64)).to(device),
            "masks": {k: torch.from_numpy(np.asarray(v, dtype=bool)).to(device) for k, v in masks.items()},
            "num_classes": num_classes, "num_features": int(feat.shape[1])}
    return dg, data


def row_normalize(x: torch.Tensor) -> torch.Tensor:
    """Divide every row by its sum (rows summing to 0 are left unchanged): float[N, F] -> float[N, F]
    (``data.feature_norm: row``; the trainer's evaluation input and the sampled and graph-level engines' batches)."""
    s = x.sum(1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


def load_sampled_data(source: str, comm: Any, device: torch.device, dtype: torch.dtype, engine: str,
                      feature_norm: str = "none") -> tuple[DistGraph, dict]:
    """``(DistGraph, data)`` for a sampled engine: a partition directory, or a dataset file on one process.

    ``data``: ``feat`` (divided by its row sums with ``feature_norm="row"``, so rows fetched by other
    ranks or cached are normalised too), ``label``, ``masks``, ``num_classes``, ``num_features``.
    """
    if os.path.isfile(source):
        if int(comm.size) != 1:
            raise ValueError(f"data.path: engine {engine!r} on {comm.size} ranks needs a partition directory, "
                             f"{source} is a dataset file")
        dg, data = dataset_as_partition(source, device, dtype)
    else:
        dg, part = load_dist_graph(source, comm, device, dtype)
        data = partition_tensors(part, device, dtype, source)
        del part
    if feature_norm == "row":
        data["feat"] = row_normalize(data["feat"])
    return dg, data


def load_sampled_engine_data(source: str, comm: Any, device: torch.device, dtype: torch.dtype, engine: str,
                             feature_norm: str = "none") -> tuple[DistGraph, dict, DistGraph, dict]:
    """``(dg, data, eval_dg, eval_data)`` for a sampling engine: the sampler, the feature store and the
    batches work on a host copy (``dg``, ``data``, as :func:`load_sampled_data` on the CPU); evaluation and
    the trainer's view (``eval_dg``, ``eval_data``) live on ``device``: the same objects on the CPU, a second
    load onto a GPU (its structure and features held there for the exact full-graph evaluation)."""
    dg, data = load_sampled_data(source, comm, torch.device("cpu"), dtype, engine, feature_norm)
    if torch.device(device).type == "cpu":
        return dg, data, dg, data
    edg, edata = load_sampled_data(source, comm, device, dtype, engine, feature_norm)
    return dg, data, edg, edata
