"""``single`` engine: one process holds the whole graph; the reference every other engine must match.

``source`` is a dataset file (``hpc-graph generate|convert``). Aggregation is
one call of :func:`hpc_graph.ops.spmm.spmm` over the whole CSR (for the edge types
of a typed graph, over its relation-expanded CSR); GAT attention
one call of :func:`hpc_graph.ops.gat_attention.gat_attention` over the CSR with
a self loop appended to every row. There is no communication.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from hpc_graph.engines.base import Engine
from hpc_graph.graph.base import GraphContext
from hpc_graph.ops.csr import CSR, relational_csr
from hpc_graph.ops.gat_attention import gat_attention
from hpc_graph.ops.spmm import spmm, spmm_fused

log = logging.getLogger(__name__)

class _SingleGraph(GraphContext):
    """The whole graph: global ids are local ids, all-reduce is the identity."""

    def __init__(self, csr: CSR, edge_type: np.ndarray | None = None, sequence_order: str = "id"):
        self.csr = csr
        self.sequence_order = sequence_order  # graph transformers: the chain's order (attention_pattern.ORDERS)
        self.num_nodes = self.global_num_nodes = csr.num_dst
        self._gid = torch.arange(csr.num_dst, dtype=torch.int64, device=csr.device)
        self._self_loops: CSR | None = None
        self.edge_type = edge_type
        if edge_type is not None and len(edge_type):
            self.num_relations = int(edge_type.max()) + 1
        self._relational: CSR | None = None
        self.node_fields: dict[str, torch.Tensor] = {}

    def aggregate_relations(self, x: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        if self.num_relations == 1:
            return super().aggregate_relations(x, reduce)
        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate_relations: reduce must be 'sum' or 'mean', got {reduce!r}")
        if self._relational is None:
            g = self.csr
            self._relational = relational_csr(g.indptr, g.indices, self.edge_type, self.num_relations).to(g.device)
        return spmm(self._relational, x, reduce).view(self.num_nodes, self.num_relations, *x.shape[1:])

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate: reduce must be 'sum' or 'mean', got {reduce!r}")
        return spmm(self.csr, x, reduce)

    def aggregate_combine(self, x: torch.Tensor, reduce: str = "sum", **kw) -> torch.Tensor:
        return spmm_fused(self.csr, x, reduce, **kw)

    def attention_pattern(self, global_token: bool):
        """The sparse attention pattern of the whole graph (chain in ``sequence_order``), built once per ``global_token``."""
        from hpc_graph.graph.attention_pattern import build_pattern, sequence_order

        key = ("attention_pattern", bool(global_token), self.sequence_order)
        if key not in self.csr._cache:
            g = self.csr
            indptr, indices = g.indptr.cpu().numpy(), g.indices.cpu().numpy()
            order = sequence_order(indptr, indices, self.num_nodes, self.sequence_order)
            self.csr._cache[key] = build_pattern(indptr, indices, self.num_nodes, global_token=global_token,
                                                 order=order)
        return self.csr._cache[key]

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False):
        from hpc_graph.graph.attention_pattern import attend

        pat = self.attention_pattern(global_token)
        if q.shape[0] != pat.num_tokens:
            raise ValueError(f"attention: q has {q.shape[0]} rows, the sequence has {pat.num_tokens} tokens "
                             f"({self.num_nodes} nodes{' + the global token' if global_token else ''})")
        return attend(pat, q, k, v, bias=bias, mode=mode)

    def with_self_loops(self) -> CSR:
        """The CSR with an edge ``i -> i`` appended to every row (after its in-edges), built once."""
        if self._self_loops is None:
            g, n = self.csr, self.num_nodes
            ar = torch.arange(n + 1, device=g.device)
            indptr = g.indptr + ar
            indices = torch.empty(g.num_edges + n, dtype=torch.int64, device=g.device)
            rows = torch.repeat_interleave(ar[:-1], g.in_degree())
            indices[torch.arange(g.num_edges, device=g.device) + rows] = g.indices
            indices[indptr[1:] - 1] = ar[:-1]
            self._self_loops = CSR(indptr, indices, n, validate=False)
        return self._self_loops

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        g = self.with_self_loops() if add_self_loops else self.csr
        return gat_attention(g, z, s_src, s_dst, negative_slope=negative_slope, attn_dropout=attn_dropout,
                             seed=seed, src_gid=self._gid, dst_gid=self._gid, training=attn_dropout > 0)

    def in_degree(self) -> torch.Tensor:
        return self.csr.in_degree()

    def out_degree(self) -> torch.Tensor:
        return self.csr.out_degree()

    def global_ids(self) -> torch.Tensor:
        return self._gid

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t


class SingleEngine(Engine):
    """The whole dataset in one process (see module docstring). ``source``: a dataset file.

    ``label`` holds -1 for unlabelled nodes; a missing mask is all False.
    Options: ``sequence_order`` (graph transformers: ``id``, ``rcm`` or ``metis``, see
    :func:`~hpc_graph.graph.attention_pattern.sequence_order`); ``prefetch`` is accepted and ignored;
    any other option is an error.
    Raises ``ValueError`` when ``comm`` has more than one rank.
    """

    name = "single"
    OPTIONS = Engine.OPTIONS | frozenset({"sequence_order"})

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        size = int(getattr(comm, "size", 1)) if comm is not None else 1
        if size > 1:
            raise ValueError(f"engine: 'single' runs on one process but this job has {size} ranks; "
                             "use engine 'dp' or 'sar' with a partitioned dataset")
        with open_dataset(self.source) as ds:
            if not ds.has("feat"):
                raise FormatError(self.source, "/node/feat", "missing (training needs node features)")
            n = ds.num_nodes
            csr = CSR(ds.indptr(), ds.indices().astype(np.int64, copy=False), n, validate=False)
            edge_type = ds.edge_type()
            lap_pe = ds.lap_pe() if ds.has("lap_pe") else None
            feat = ds.feat_rows(0, n)
            label = ds.label() if ds.has("label") else np.full(n, -1, dtype=np.int64)
            masks = {name: (ds.mask(f"{name}_mask") if ds.has(f"{name}_mask") else np.zeros(n, dtype=bool))
                     for name in ("train", "val", "test")}
            self.num_classes = int(ds.num_classes) or int(label.max()) + 1
        self.graph = _SingleGraph(csr.to(self.device), edge_type, str(self.options.get("sequence_order", "id")))
        if lap_pe is not None:
            self.graph.node_fields["lap_pe"] = torch.from_numpy(lap_pe).to(device=self.device, dtype=dtype)
        self.feat = torch.from_numpy(feat).to(device=self.device, dtype=dtype)
        self.label = torch.from_numpy(np.asarray(label, dtype=np.int64)).to(self.device)
        self.masks = {k: torch.from_numpy(np.asarray(v, dtype=bool)).to(self.device) for k, v in masks.items()}
        self.num_features = int(self.feat.shape[1])
        log.info("single engine: %s, %d nodes, %d edges, %d features, %d classes", self.source, n,
                 csr.num_edges, self.num_features, self.num_classes)

