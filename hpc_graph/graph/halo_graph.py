"""``PartitionGraph`` and ``HaloGraph``: the ``GraphContext`` of a rank that holds one partition of the graph.

:class:`PartitionGraph` is what every partition-holding engine's context shares (sizes, ids, degrees, the
all-reduce, the argument checks); subclasses say how an aggregation reaches the remote rows: a
``HaloGraph`` fetches them, then runs one kernel (below), SAR's context walks the remote blocks one at a time.

Full-batch domain parallelism (``dp``) and its variants (``sylvie``, which
sends the halo rows quantised or one epoch stale) share everything but *how*
the halo rows arrive. A ``HaloGraph`` does the aggregation and the attention
over ``[owned | halo]`` columns; :meth:`HaloGraph.halo` fetches the halo rows
and is the one method such an engine overrides.
"""
from __future__ import annotations

from typing import Any

import torch

from hpc_graph.graph.base import GraphContext
from hpc_graph.graph.dist_graph import DistGraph
from hpc_graph.ops.all_reduce import all_reduce_sum
from hpc_graph.ops.halo_exchange import halo_exchange


class PartitionGraph(GraphContext):
    """GraphContext of one rank holding one partition of the graph.

    Args:
        dg: the rank's :class:`DistGraph`.
        comm: the job's communicator.
    """

    def __init__(self, dg: DistGraph, comm: Any):
        self.dg, self.comm = dg, comm
        self.num_nodes = dg.num_owned
        self.global_num_nodes = dg.global_num_nodes
        self.num_relations = dg.num_relations

    @staticmethod
    def check_reduce(what: str, reduce: str) -> None:
        """``ValueError`` unless ``reduce`` is a reduction the partition engines run (``sum``, ``mean``)."""
        if reduce not in ("sum", "mean"):
            raise ValueError(f"{what}: reduce must be 'sum' or 'mean', got {reduce!r}")

    def in_degree(self) -> torch.Tensor:
        return self.dg.in_degree

    def global_ids(self) -> torch.Tensor:
        return self.dg.gid

    def dataset_ids(self) -> torch.Tensor:
        return self.dg.orig_id

    def row_ids(self, output: bool = False) -> torch.Tensor:
        return self.dg.orig_id

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t, self.comm)


class HaloGraph(PartitionGraph):
    """GraphContext of one rank: halo exchange, then one kernel call over ``[owned | halo]`` (the rank's
    :class:`DistGraph` ``local`` CSR)."""

    def halo(self, x: torch.Tensor, extra: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The halo rows of ``x`` (and of ``extra``), differentiable.

        Args:
            x: float[n, F] rows of owned nodes (the features a layer aggregates).
            extra: optional float[n, E] rows that travel with ``x`` (GAT's source scores).
        Returns:
            ``(float[h, F], float[h, E] or None)`` in halo order. This default sends
            both at full precision in one message per peer.
        """
        if extra is None:
            return halo_exchange(x, self.dg.send_lid, self.dg.recv_count, self.comm), None
        width = x.shape[1]
        packed = halo_exchange(torch.cat([x, extra], 1), self.dg.send_lid, self.dg.recv_count, self.comm)
        return packed[:, :width], packed[:, width:]

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        self.check_reduce("aggregate", reduce)
        from hpc_graph.ops.spmm import spmm

        shape = x.shape
        flat = x.reshape(shape[0], -1)
        halo, _ = self.halo(flat)
        out = spmm(self.dg.local, torch.cat([flat, halo], 0), reduce)
        return out.reshape(out.shape[0], *shape[1:])

    def aggregate_combine(self, x: torch.Tensor, reduce: str = "sum", **kw) -> torch.Tensor:
        from hpc_graph.ops.spmm import spmm_fused

        halo, _ = self.halo(x.reshape(x.shape[0], -1))
        # owned rows come first in the local source order, so x's rows are the self rows
        return spmm_fused(self.dg.local, torch.cat([x, halo.view(-1, *x.shape[1:])], 0), reduce, **kw)

    def aggregate_relations(self, x: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        if self.num_relations == 1:
            return super().aggregate_relations(x, reduce)
        self.check_reduce("aggregate_relations", reduce)
        from hpc_graph.ops.spmm import spmm

        halo, _ = self.halo(x)  # one exchange for all relations
        out = spmm(self.dg.relational().local, torch.cat([x, halo], 0), reduce)
        return out.view(self.num_nodes, self.num_relations, *x.shape[1:])

    def message_sources(self, src: dict, reduce: str, self_loops: bool):
        """The halo rows of every ``src`` tensor in one exchange (:meth:`halo`, differentiable), then one local
        block over ``[owned | halo]`` columns."""
        from hpc_graph.ops.message import LocalSources, check_rows, edge_types, pack_rows, unpack_rows

        check_rows(src, self.num_nodes, "one per owned node")
        halo, _ = self.halo(pack_rows(src))
        rows = {k: torch.cat([v, h], 0) for (k, v), h in zip(src.items(), unpack_rows(halo, src).values())}
        g = self.dg.local
        sources = LocalSources(g, g.edge_weight, edge_types(g, self.dg.edge_type), self_loops)
        return sources, rows, self.dg.in_degree + int(self_loops)

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        from hpc_graph.ops.gat_attention import gat_attention

        n, heads, dim = z.shape
        halo_z, halo_s = self.halo(z.reshape(n, heads * dim), s_src)
        z_all = torch.cat([z, halo_z.reshape(-1, heads, dim)], 0)
        s_all = torch.cat([s_src, halo_s], 0)
        dg = self.dg
        g = dg.local_self_loops() if add_self_loops else dg.local
        return gat_attention(g, z_all, s_all, s_dst, negative_slope=negative_slope,
                             attn_dropout=attn_dropout, seed=seed,
                             src_gid=dg.local_orig_id, dst_gid=dg.orig_id)

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False, far_prior=True):
        """Sparse graph-transformer attention over self loops + in-edges: one K/V halo exchange (k and v of the
        rows the peers need, in one message), then the fused kernels over ``[owned | halo]``. Equals ``single``
        with ``engine.attention_chain: false``; dense mode and the global token need the whole sequence."""
        from hpc_graph.ops.dot_attention import dot_attention

        check_partial_attention(self, mode, bias, global_token, q)
        n, H, dk = q.shape
        halo, _ = self.halo(torch.cat([k.reshape(n, -1), v.reshape(n, -1)], 1))
        k_all = torch.cat([k, halo[:, :H * dk].reshape(-1, H, dk)], 0)
        v_all = torch.cat([v, halo[:, H * dk:].reshape(-1, H, v.shape[2])], 0)
        g = self.dg.local_self_loops()
        return dot_attention(g, q, k_all, v_all, bias, codes=None if bias is None else self_loop_codes(g))


def self_loop_codes(g) -> torch.Tensor:
    """uint8[E] bias codes of a CSR whose every row ends with its self loop (``local_self_loops``): 0 (self)
    for the loops, 1 (one hop) for the edges; built once per CSR."""
    if "attention_codes" not in g._cache:
        codes = torch.ones(g.num_edges, dtype=torch.uint8, device=g.device)
        codes[g.indptr[1:] - 1] = 0
        g._cache["attention_codes"] = codes
    return g._cache["attention_codes"]


SELF_LOOP_ADVICE = ("the attention pattern adds every node's self loop itself: drop them from the dataset (hpc-graph "
                    "convert edgelist --remove-self-loops) or run on engine single or seqpar")
REPEAT_ADVICE = ("the attention pattern holds each edge once: drop the copies from the dataset (hpc-graph convert "
                 "edgelist --dedup) or run on engine single or seqpar")


def self_loop_edges(graph) -> int:
    """Self-loop edges among this rank's owned rows (``dp``/``sylvie``: the local CSR; ``sar``: its owned
    block), counted once per graph."""
    dg = graph.dg
    local = dg.local if dg.local is not None else dg.blocks[dg.part_id]  # sar keeps the owned block only
    if "self_edges" not in local._cache:
        rows = torch.repeat_interleave(torch.arange(local.num_dst, device=local.device), local.in_degree())
        local._cache["self_edges"] = int((local.indices == rows).sum())  # owned columns come first
    return local._cache["self_edges"]


def repeated_edges(graph) -> int:
    """In-edges of this rank's owned rows that repeat an earlier (destination, source) pair, over the local CSR
    (``dp``/``sylvie``) or every block (``sar``), counted once per graph."""
    dg = graph.dg
    csrs = [dg.local] if dg.local is not None else list(dg.blocks.values())
    total = 0
    for c in csrs:
        if "repeated_edges" not in c._cache:
            rows = torch.repeat_interleave(torch.arange(c.num_dst, device=c.device), c.in_degree())
            key = rows * max(1, c.num_src) + c.indices.to(torch.int64)
            c._cache["repeated_edges"] = int(key.numel() - torch.unique(key).numel())
        total += c._cache["repeated_edges"]
    return total


def pattern_problem(loops: int, repeats: int) -> str | None:
    """Why a graph with ``loops`` self-loop and ``repeats`` repeated edges cannot take the partial engines'
    sparse attention (which adds every self loop itself and holds each edge once), or None."""
    if loops:
        return f"the graph has {loops} self-loop edge(s); {SELF_LOOP_ADVICE}"
    if repeats:
        return f"the graph has {repeats} repeated edge(s); {REPEAT_ADVICE}"
    return None


def check_partial_attention(graph, mode: str, bias, global_token: bool, q: torch.Tensor) -> None:
    """The checks of an engine that holds part of the graph (``dp``, ``sar``, ``sylvie``): sparse mode, no
    global token, ``q`` of the owned rows, a valid bias table, no self-loop or repeated edge in this rank's part
    (:func:`pattern_problem`; ``ValueError`` naming what to change)."""
    from hpc_graph.graph.attention_pattern import check_attention_args

    problem = pattern_problem(self_loop_edges(graph), repeated_edges(graph))
    if problem:
        raise ValueError(f"attention: in this rank's part {problem}")

    check_attention_args(mode, bias, q.shape[1])
    if mode != "sparse" or global_token:
        raise ValueError("attention: dense attention and the global token need the whole sequence (engine.name: "
                         "single or seqpar); on this engine use model.attention: sparse, global_token: false")
    if q.shape[0] != graph.num_nodes:
        raise ValueError(f"attention: q has {q.shape[0]} rows, this rank owns {graph.num_nodes} nodes")


def partition_model_problem(model, mc) -> str | None:
    """For the engines holding a partition of the graph (``dp``, ``sar``, ``sylvie``): a graph transformer runs
    there only as its registry entry allows (``partition_problem``)."""
    if not getattr(model, "sequence", False):
        return None
    check = getattr(model, "partition_problem", None)
    return check(mc) if check is not None else f"{mc.name!r} needs the whole token sequence"
