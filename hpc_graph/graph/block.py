"""Sampled blocks as ``GraphContext``s: what a model runs on in mini-batch training.

A :class:`Block` is one message-passing layer of a sampled computation
graph: ``num_dst`` destination nodes whose in-edges were sampled from
``num_src`` source nodes, the destinations being the first ``num_dst``
sources (so a node's own row is ``dst(x)[i]`` and self loops are free). A
:class:`BlockStack` holds one block per model layer, input layer first:
``stack.layer(l)`` is block ``l``, and block ``l``'s destinations are the
sources of block ``l + 1`` that the previous layer computes.

Aggregation semantics on a block (row ``i``, sampled in-edges ``S_i`` of its
``deg_i`` in the whole graph; with ``S_i`` all of them it is exactly the
full-graph operation):

* ``mean``: the mean over ``S_i`` (an unbiased estimate of the full mean);
* ``sum``: ``deg_i / |S_i|`` times the sum over ``S_i`` (an unbiased estimate
  of the full sum; GCN stays normalised by full-graph degrees);
* attention: softmax over ``S_i`` (plus the self loop).

Neighbours dropped from ``S_i`` (a remote node the cache could not serve)
simply shrink ``S_i``: the mean is then over the neighbours that remain, and
the sum is rescaled by ``deg_i`` over their number.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from hpc_graph.graph.base import GraphContext
from hpc_graph.ops.all_reduce import all_reduce_sum
from hpc_graph.ops.csr import CSR, first_rows


class Block(GraphContext):
    """One sampled layer.

    Args:
        csr: ``num_dst`` rows over ``num_src`` columns (sampled in-edges of each destination).
        src_gid: int64[num_src] global ids of the sources (destinations first).
        src_orig_id: int64[num_src] source-dataset ids (the attention-dropout hash uses them).
        src_degree: int64[num_src] in-degree of each source in the whole graph.
        comm: communicator for :meth:`all_reduce_sum` (batch statistics over all ranks).
        complete: optional ``f(h) -> h'`` for :meth:`layer_input` (cached remote rows).
        edge_fields: ``{"weight": float[E], "type": int64[E]}`` of the sampled edges in ``csr``'s order, the
            fields the sampler was asked to carry (:meth:`message_passing` reads them); ``missing`` says, per
            field, why one is absent.
    """

    def __init__(self, csr: CSR, src_gid: torch.Tensor, src_orig_id: torch.Tensor, src_degree: torch.Tensor,
                 comm: Any, complete: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 edge_fields: dict[str, torch.Tensor] | None = None, missing: dict[str, str] | None = None):
        self.csr = csr
        self.edge_fields = dict(edge_fields or {})
        self.missing = dict(missing or {})
        self.num_nodes = int(csr.num_dst)
        self.num_src = int(csr.num_src)
        if src_gid.shape[0] != self.num_src or src_degree.shape[0] != self.num_src:
            raise ValueError(f"Block: {self.num_src} sources but {src_gid.shape[0]} ids and "
                             f"{src_degree.shape[0]} degrees")
        self.src_gid, self.src_orig_id, self.src_degree = src_gid, src_orig_id, src_degree
        self.global_num_nodes = -1
        self.comm = comm
        self._complete = complete
        sampled = csr.in_degree().to(torch.float64)
        full = src_degree[:self.num_nodes].to(torch.float64)
        self._scale64 = torch.where(sampled > 0, full / sampled.clamp(min=1), torch.zeros_like(sampled))
        self._scale: dict[torch.dtype, torch.Tensor] = {}

    def to(self, device: torch.device | str) -> "Block":
        """A copy of this block with its structure, ids and degrees on ``device``. The ``complete`` callable is
        kept: it must return rows on the device of the rows it gets."""
        import copy

        out = copy.copy(self)
        out.csr = self.csr.to(device)
        out.src_gid, out.src_orig_id, out.src_degree, out._scale64 = (
            t.to(device) for t in (self.src_gid, self.src_orig_id, self.src_degree, self._scale64))
        out._scale = {}
        out.edge_fields = {k: v.to(device) for k, v in self.edge_fields.items()}
        return out

    def _sum_scale(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._scale:
            self._scale[dtype] = self._scale64.to(dtype).unsqueeze(1)
        return self._scale[dtype]

    def layer_input(self, h: torch.Tensor) -> torch.Tensor:
        return h if self._complete is None else self._complete(h)

    def dst(self, t: torch.Tensor) -> torch.Tensor:
        return first_rows(t, self.num_nodes)

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate: reduce must be 'sum' or 'mean', got {reduce!r}")
        from hpc_graph.ops.spmm import spmm

        if x.shape[0] != self.num_src:
            raise ValueError(f"Block.aggregate: x has {x.shape[0]} rows, the block has {self.num_src} sources")
        out = spmm(self.csr, x, reduce)
        if reduce == "sum":
            scale = self._sum_scale(x.dtype)
            out = out * (scale if out.dim() == 2 else scale.unsqueeze(2))
        return out

    def message_sources(self, src: dict, reduce: str, self_loops: bool):
        """The sampled edges (``sum`` scaled by ``degree / sampled`` per row; ``mean`` over the sampled edges and
        the self loop), the self loops over the first ``num_nodes`` sources."""
        from hpc_graph.ops.message import LocalSources, check_rows

        check_rows(src, self.num_src, "one per source of the block, graph.layer_input(h)")
        scale = self._scale64 if reduce == "sum" else None
        sources = LocalSources(self.csr, self.edge_fields.get("weight"), self.edge_fields.get("type"), self_loops,
                               scale=scale, missing=self.missing)
        return sources, src, self.csr.in_degree() + int(self_loops)

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        from hpc_graph.ops.gat_attention import gat_attention

        g = self.csr.with_self_loops() if add_self_loops else self.csr
        return gat_attention(g, z, s_src, s_dst, negative_slope=negative_slope, attn_dropout=attn_dropout,
                             seed=seed, src_gid=self.src_orig_id, dst_gid=self.src_orig_id[:self.num_nodes])

    def in_degree(self) -> torch.Tensor:
        return self.src_degree

    def global_ids(self) -> torch.Tensor:
        return self.src_gid[:self.num_nodes]

    def row_ids(self, output: bool = False) -> torch.Tensor:
        return self.src_orig_id[:self.num_nodes] if output else self.src_orig_id

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t, self.comm)


class BlockStack(GraphContext):
    """The blocks of one mini-batch, input layer first; ``layer(l)`` is block ``l``.

    The stack itself stands for the last block's output: ``num_nodes`` is the number of seeds.
    """

    def __init__(self, blocks: list[Block]):
        if not blocks:
            raise ValueError("BlockStack: no blocks")
        self.blocks = blocks
        self.num_nodes = blocks[-1].num_nodes
        self.global_num_nodes = -1

    def to(self, device: torch.device | str) -> "BlockStack":
        """The stack with every block on ``device`` (:meth:`Block.to`)."""
        return BlockStack([b.to(device) for b in self.blocks])

    def layer(self, index: int) -> GraphContext:
        if not 0 <= index < len(self.blocks):
            raise ValueError(f"the model asked for layer {index}, but the sampler made {len(self.blocks)} blocks "
                             "(sampler.fanouts needs one fan-out per model layer)")
        return self.blocks[index]

    def _whole(self, what: str):
        raise RuntimeError(f"BlockStack.{what}: a sampled mini-batch has one graph per layer; the model must "
                           "call graph.layer(l) for each layer (see hpc_graph.graph.base)")

    def aggregate(self, x, reduce="sum"):
        self._whole("aggregate")

    def message_sources(self, src, reduce, self_loops):
        self._whole("message_passing")

    def gat(self, z, s_src, s_dst, **kw):
        self._whole("gat")

    def in_degree(self):
        self._whole("in_degree")

    def global_ids(self) -> torch.Tensor:
        return self.blocks[-1].global_ids()

    def row_ids(self, output: bool = False) -> torch.Tensor:
        """Input rows: the first block's sources; output rows: the last block's destinations (the seeds)."""
        return self.blocks[-1].row_ids(True) if output else self.blocks[0].row_ids()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.blocks[-1].all_reduce_sum(t)
