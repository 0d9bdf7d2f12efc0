"""``dp`` engine: full-batch domain-parallel training with halo exchange.

Each rank holds one partition (``source`` = partition directory, part
``comm.rank``). Before every aggregation the rows of halo nodes are fetched
from their owners (only from peers that share a halo); the aggregation is then
one sparse product over ``[owned | halo]`` columns. The backward pass sends the
halo rows' gradients back to their owners, which sum them. This is the
baseline SAR and Sylvie are measured against: per-rank memory holds all halo
rows of every layer until the backward pass.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from hpc_graph.engines.base import Engine
from hpc_graph.graph.base import GraphContext
from hpc_graph.graph.dist_graph import DistGraph, load_dist_graph, partition_tensors
from hpc_graph.ops.all_reduce import all_reduce_sum
from hpc_graph.ops.halo_exchange import halo_exchange

log = logging.getLogger(__name__)


class _DPGraph(GraphContext):
    """GraphContext of one rank: halo exchange, then one kernel call over ``[owned | halo]``."""

    def __init__(self, dg: DistGraph, comm: Any):
        self.dg, self.comm = dg, comm
        self.num_nodes = dg.num_owned
        self.global_num_nodes = dg.global_num_nodes

    def _with_halo(self, x: torch.Tensor) -> torch.Tensor:
        halo = halo_exchange(x, self.dg.send_lid, self.dg.recv_count, self.comm)
        return torch.cat([x, halo], 0)

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate: reduce must be 'sum' or 'mean', got {reduce!r}")
        from hpc_graph.ops.spmm import spmm
        return spmm(self.dg.local, self._with_halo(x), reduce)

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        from hpc_graph.ops.gat_attention import gat_attention
        n, heads, dim = z.shape
        # one message per peer: z and s_src rows travel together
        packed = self._with_halo(torch.cat([z.reshape(n, heads * dim), s_src], 1))
        z_all = packed[:, :heads * dim].reshape(-1, heads, dim)
        s_all = packed[:, heads * dim:]
        dg = self.dg
        g = dg.local_self_loops() if add_self_loops else dg.local
        return gat_attention(g, z_all, s_all, s_dst, negative_slope=negative_slope,
                             attn_dropout=attn_dropout, seed=seed,
                             src_gid=dg.local_orig_id, dst_gid=dg.orig_id)

    def in_degree(self) -> torch.Tensor:
        return self.dg.in_degree

    def global_ids(self) -> torch.Tensor:
        return self.dg.gid

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t, self.comm)


class DPEngine(Engine):
    """Domain-parallel engine (see module docstring). ``source``: a partition directory.

    Options: none. ``graph.dg`` is the rank's :class:`DistGraph`.
    """

    name = "dp"

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        dg, part = load_dist_graph(self.source, comm, self.device, dtype)
        data = partition_tensors(part, self.device, dtype, self.source)
        del part
        self.graph = _DPGraph(dg, comm)
        self.feat, self.label, self.masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self.reset_stats()  # loading exchanged halo ids: count training traffic only
