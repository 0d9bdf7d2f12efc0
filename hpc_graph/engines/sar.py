"""``sar`` engine: sequential aggregation and rematerialisation (SAR, MLSys'22).

Same partitions and results as ``dp``, but each aggregation walks the remote
blocks G_{p,q} one at a time (a rotation over peers) with autograd off, so a
rank never holds all halo rows of a layer: at most two blocks resident, three with
``prefetch``. Sum/mean aggregations (GCN, SAGE) send the remote rows'
gradients straight back in the backward pass; GAT re-fetches each block and
recomputes its attention (see :mod:`hpc_graph.ops.sar_aggregate`); a GAT layer's
projection ``z = x W`` is recomputed too instead of kept (``gat_projected``).

Options: ``prefetch`` (bool, default True): overlap the next block's exchange
with the current block's compute.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from hpc_graph.engines.base import Engine
from hpc_graph.graph.base import GraphContext
from hpc_graph.graph.dist_graph import DistGraph, load_dist_graph, partition_tensors
from hpc_graph.graph.halo_graph import PartitionGraph, partition_model_problem
from hpc_graph.options import BOOL, option

log = logging.getLogger(__name__)


class _SARGraph(PartitionGraph):
    """GraphContext of one rank whose aggregations run block by block."""

    def __init__(self, dg: DistGraph, comm: Any, prefetch: bool):
        super().__init__(dg, comm)
        self.prefetch = prefetch

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        self.check_reduce("aggregate", reduce)
        from hpc_graph.ops.sar_aggregate import sar_aggregate
        return sar_aggregate(x, self.dg, self.comm, reduce, self.prefetch)

    def aggregate_relations(self, x: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        if self.num_relations == 1:
            return super().aggregate_relations(x, reduce)
        self.check_reduce("aggregate_relations", reduce)
        from hpc_graph.ops.sar_aggregate import sar_aggregate
        # the relation-expanded blocks have num_owned * R rows: one rotation serves all relations
        out = sar_aggregate(x, self.dg.relational(), self.comm, reduce, self.prefetch)
        return out.view(self.num_nodes, self.num_relations, *x.shape[1:])

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        from hpc_graph.ops.sar_aggregate import sar_gat
        return sar_gat(z, s_src, s_dst, self.dg, self.comm, negative_slope=negative_slope,
                       attn_dropout=attn_dropout, seed=seed, add_self_loops=add_self_loops,
                       prefetch=self.prefetch)

    def gat_projected(self, x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor,
                      att_dst: torch.Tensor, *, act: str | None = None, p: float = 0.0,
                      negative_slope: float = 0.2, attn_dropout: float = 0.0,
                      seed: int = 0, add_self_loops: bool = True) -> torch.Tensor:
        from hpc_graph.ops.sar_aggregate import sar_gat_projected
        return sar_gat_projected(x, weight, att_src, att_dst, self.dg, self.comm, act=act, p=p,
                                 negative_slope=negative_slope, attn_dropout=attn_dropout, seed=seed,
                                 add_self_loops=add_self_loops, prefetch=self.prefetch, ids=self.row_ids())

    def message_sources(self, src: dict, reduce: str, self_loops: bool):
        """The local block, then the remote partitions' rows one at a time (:class:`~hpc_graph.ops.sar_aggregate.
        SARSources`): the halo of all layers' messages is never resident at once."""
        from hpc_graph.ops.message import check_rows
        from hpc_graph.ops.sar_aggregate import SARSources

        check_rows(src, self.num_nodes, "one per owned node")
        return SARSources(self.dg, self.comm, self.prefetch, self_loops), src, self.dg.in_degree + int(self_loops)

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False, far_prior=True):
        """Sparse graph-transformer attention over self loops + in-edges, remote k/v blocks fetched one at a
        time (forward and again in backward); equals ``single`` with ``engine.attention_chain: false``."""
        from hpc_graph.graph.halo_graph import check_partial_attention
        from hpc_graph.ops.sar_aggregate import sar_dot_attention

        check_partial_attention(self, mode, bias, global_token, q)
        return sar_dot_attention(q, k, v, bias, self.dg, self.comm, self.prefetch)


@dataclasses.dataclass
class SAROptions:
    """``sar``'s options."""
    prefetch: bool = option(True, BOOL, "Fetch the next remote block while aggregating the current one (more "
                                        "memory, less waiting).", section="engine")


class SAREngine(Engine):
    """SAR engine (see module docstring). ``source``: a partition directory.

    ``graph.dg`` is the rank's :class:`DistGraph`.
    """

    name = "sar"
    summary = "sequential aggregation and rematerialisation: one remote partition in memory at a time."
    shared_rng = True
    exact = True
    Options = SAROptions

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        return partition_model_problem(model, mc)

    @classmethod
    def plan_assumptions(cls, options: dict[str, Any]) -> list[str]:
        on = bool(options.get("prefetch", True))
        return [f"sar prefetch: {'on (3 blocks resident)' if on else 'off (2 blocks resident)'}"]

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """While loading: the part file's int64 columns; then, splitting the CSR into blocks, the CSR, a running
        count, a mask and the blocks built so far beside each other: beyond the blocks the rank keeps, the CSR
        (int32 columns and its row pointers), the int64 count and the mask (13 bytes per edge)."""
        E, n = int(rank.edges), int(rank.owned)
        split = (n + 1) * 8 + E * 4 + (E + 1) * 8 + E
        return max(E * 8, split, cls._read_as_float32_extra(graph, n, dtype))

    @classmethod
    def plan_graph(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                   options: dict[str, Any]) -> GraphContext:
        dg = cls._shape_partition(graph, rank, ranks, dtype)
        dg.release_local()  # SAR works on the per-partition blocks only, as the engine does when it loads
        return _SARGraph(dg, comm, bool(options.get("prefetch", True)))

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        self.prefetch = bool(self.opts.prefetch)
        dg, part = load_dist_graph(self.source, comm, self.device, dtype)
        dg.release_local()  # SAR works on the per-partition blocks only (typed: their edge types kept)
        data = partition_tensors(part, self.device, dtype, self.source)
        del part
        self.graph = _SARGraph(dg, comm, self.prefetch)
        self.feat, self.label, self.masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self.reset_stats()  # loading exchanged halo ids: count training traffic only

    def check_model(self, model: torch.nn.Module) -> None:
        self._check_attention_pattern(model)
