"""``WholeGraph``: a whole graph held by one process, as a :class:`~hpc_graph.graph.base.GraphContext`.

Aggregation is one call of :func:`hpc_graph.ops.spmm.spmm` over the whole CSR
(for the edge types of a typed graph, over its relation-expanded CSR); GAT
attention one call of :func:`hpc_graph.ops.gat_attention.gat_attention` over
the CSR with a self loop appended to every row; graph-transformer attention
over the graph's :mod:`~hpc_graph.graph.attention_pattern`. There is no
communication. The engines that hold the whole graph on a rank (``single``,
``flow``) share it.
"""
from __future__ import annotations

import numpy as np
import torch

from hpc_graph.graph.base import GraphContext
from hpc_graph.ops.csr import CSR, relational_csr
from hpc_graph.ops.gat_attention import gat_attention, gat_projected
from hpc_graph.ops.spmm import spmm, spmm_fused


class WholeGraph(GraphContext):
    """The whole graph in one process: global ids are local ids, all-reduce is the identity.

    Args:
        csr: the graph (destination-major; row i lists the sources of the edges into i).
        edge_type: int[E] edge types of a typed graph, or None.
        sequence_order: graph transformers: the order of the sequence (``id``, ``rcm``, ``metis``).
        graph_ptr: int64[G+1] node offsets of a batch of graphs (graph-level task), or None.
        global_ids: int64[N] the dataset id of each row when the rows are a permutation of the dataset's
            (attention dropout hashes them); default: the row numbers.
    """

    def __init__(self, csr: CSR, edge_type: np.ndarray | None = None, sequence_order: str = "id",
                 graph_ptr: np.ndarray | None = None, global_ids: torch.Tensor | None = None):
        self.csr = csr
        # a graph batch (graph-level task): graph g is nodes graph_ptr[g]:graph_ptr[g+1]
        self.graph_ptr = None if graph_ptr is None else torch.as_tensor(np.asarray(graph_ptr, dtype=np.int64))
        self.num_graphs = 0 if graph_ptr is None else int(len(graph_ptr) - 1)
        self.sequence_order = sequence_order  # graph transformers: the chain's order (attention_pattern.ORDERS)
        self.num_nodes = self.global_num_nodes = csr.num_dst
        self._gid = torch.arange(csr.num_dst, dtype=torch.int64, device=csr.device) if global_ids is None \
            else torch.as_tensor(global_ids, dtype=torch.int64).to(csr.device)
        self._permuted = global_ids is not None
        self.edge_type = edge_type
        if edge_type is not None and len(edge_type):
            self.num_relations = int(edge_type.max()) + 1
        self._relational: CSR | None = None
        self.node_fields: dict[str, torch.Tensor] = {}
        self.clusters = None  # a ClusterLayoutControl when engine.cluster_beta is set
        self.cluster_size = 256
        self.chain = True  # the attention pattern's chain through the sequence (engine.attention_chain)

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

    def sequence(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, cluster_ptr)`` of the sequence (``sequence_order``, clusters of ``cluster_size``), built once."""
        from hpc_graph.graph.attention_pattern import sequence_clusters

        key = ("sequence", self.sequence_order, self.cluster_size)
        if key not in self.csr._cache:
            g = self.csr
            self.csr._cache[key] = sequence_clusters(g.indptr.cpu().numpy(), g.indices.cpu().numpy(), self.num_nodes,
                                                     self.sequence_order, cluster_size=self.cluster_size)
        return self.csr._cache[key]

    def attention_pattern(self, global_token: bool):
        """The sparse attention pattern of the whole graph (chain in ``sequence_order``), built once per
        ``global_token``."""
        from hpc_graph.graph.attention_pattern import build_pattern

        key = ("attention_pattern", bool(global_token), self.sequence_order, self.cluster_size, self.chain)
        if key not in self.csr._cache:
            g = self.csr
            if g.is_shape_only:
                raise NotImplementedError("a graph transformer's attention pattern depends on the graph's structure, "
                                          "not only on its sizes: it is not planned on shapes")
            indptr, indices = g.indptr.cpu().numpy(), g.indices.cpu().numpy()
            self.csr._cache[key] = build_pattern(indptr, indices, self.num_nodes, global_token=global_token,
                                                 order=self.sequence()[0], chain=self.chain)
        return self.csr._cache[key]

    def graph_batch_pattern(self, full: bool, max_dist: int):
        """A graph batch's pattern (inside each graph, a global token per graph), built once per (full, max_dist)."""
        from hpc_graph.graph.attention_pattern import build_graph_batch_pattern

        key = ("graph_batch_pattern", bool(full), int(max_dist))
        if key not in self.csr._cache:
            g = self.csr
            self.csr._cache[key] = build_graph_batch_pattern(g.indptr.cpu().numpy(), g.indices.cpu().numpy(),
                                                             self.graph_ptr.numpy(), full=full, max_dist=max_dist)
        return self.csr._cache[key]

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False, far_prior=True):
        from hpc_graph.graph.attention_pattern import (GRAPH_MAX_DIST, attend, check_attention_args,
                                                       max_dist_of)

        if self.num_graphs:
            check_attention_args(mode, bias, q.shape[1])
            if not global_token:
                raise ValueError("attention: a graph batch needs its global tokens (one per graph, the readout)")
            pat = self.graph_batch_pattern(mode == "dense", GRAPH_MAX_DIST if bias is None else max_dist_of(bias))
            if q.shape[0] != pat.num_tokens:
                raise ValueError(f"attention: q has {q.shape[0]} rows, the batch has {pat.num_tokens} tokens "
                                 f"({self.num_nodes} nodes + {self.num_graphs} graph tokens)")
            return attend(pat, q, k, v, bias=bias, mode="sparse")
        pat = self.attention_pattern(global_token)
        if q.shape[0] != pat.num_tokens:
            raise ValueError(f"attention: q has {q.shape[0]} rows, the sequence has {pat.num_tokens} tokens "
                             f"({self.num_nodes} nodes{' + the global token' if global_token else ''})")
        layout = None if self.clusters is None else self.clusters.layout_in(pat, self.sequence()[1], mode)
        return attend(pat, q, k, v, bias=bias, mode=mode, layout=layout, far_prior=far_prior)

    def message_sources(self, src: dict, reduce: str, self_loops: bool):
        from hpc_graph.ops.message import LocalSources, check_rows, edge_types

        check_rows(src, self.num_nodes, "one per node")
        g = self.csr
        sources = LocalSources(g, g.edge_weight, edge_types(g, self.edge_type), self_loops)
        return sources, src, g.in_degree() + int(self_loops)

    def with_self_loops(self) -> CSR:
        """The CSR with an edge ``i -> i`` appended to every row (after its in-edges), built once."""
        return self.csr.with_self_loops()

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        g = self.with_self_loops() if add_self_loops else self.csr
        return gat_attention(g, z, s_src, s_dst, negative_slope=negative_slope, attn_dropout=attn_dropout,
                             seed=seed, src_gid=self._gid, dst_gid=self._gid, training=attn_dropout > 0)

    def gat_projected(self, x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor,
                      att_dst: torch.Tensor, *, act: str | None = None, p: float = 0.0,
                      negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
                      add_self_loops: bool = True) -> torch.Tensor:
        """One fused op keeping only ``x`` (:func:`hpc_graph.ops.gat_attention.gat_projected`): the dropped
        input and the projection are recomputed in the backward pass."""
        if x.dtype not in (torch.float32, torch.float64) or x.layout != torch.strided:
            return super().gat_projected(x, weight, att_src, att_dst, act=act, p=p, negative_slope=negative_slope,
                                         attn_dropout=attn_dropout, seed=seed, add_self_loops=add_self_loops)
        g = self.with_self_loops() if add_self_loops else self.csr
        return gat_projected(g, x, weight, att_src, att_dst, act=act, p=p, negative_slope=negative_slope,
                             attn_dropout=attn_dropout, seed=seed, src_gid=self._gid, dst_gid=self._gid,
                             training=attn_dropout > 0, ids=self.row_ids())

    def row_ids(self, output: bool = False) -> torch.Tensor | None:
        """The rows' dataset ids where they are a permutation of the dataset's (``global_ids``), else None."""
        return self._gid if self._permuted else None

    def in_degree(self) -> torch.Tensor:
        return self.csr.in_degree()

    def out_degree(self) -> torch.Tensor:
        return self.csr.out_degree()

    def global_ids(self) -> torch.Tensor:
        return self._gid

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t
