"""``seqpar`` engine: sequence-parallel graph transformers (DeepSpeed-Ulysses style, as TorchGT).

The sequence is the graph's nodes in id order (plus the global token when the model has one).
Rank ``p`` of ``P`` holds the tokens ``[lo_p, hi_p)`` (``S / P`` each, the first ``S mod P`` ranks
one more) with their features, labels, masks and per-node fields; every layer outside attention
(projections, LayerNorm, FFN, the loss) is row-wise and runs on those rows alone. Attention
needs every token, so :meth:`_SeqParGraph.attention` turns the rank's ``[S/P, H, d]`` q/k/v into
``[S, H/P, d]`` with one all-to-all (rank ``r`` gets heads ``[r H/P, (r+1) H/P)`` of every
token), runs the same pattern attention as ``single`` on its heads, and sends the outputs back
with a second all-to-all; both are autograd functions whose backward is the opposite all-to-all.
The attention pattern (and its 1-byte-per-entry bias codes) is built by every rank from the
whole graph structure, so the structural bias is never communicated; only the parameters'
gradients are all-reduced (by the trainer).

The global token: the model appends one token row on every rank; only the last rank's copy
enters the sequence (its output comes back to that rank; the copies elsewhere get zeros and
no gradient), so the computation is exactly ``single``'s.

Requires ``heads % P == 0`` (checked with a clear error). Other models (message passing) do not
run here.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from hpc_graph.engines.base import Engine
from hpc_graph.graph.attention_pattern import (ClusterLayoutControl, SequenceOptions, engine_attention_options,
                                             sequence_clusters)
from hpc_graph.graph.base import GraphContext
from hpc_graph.ops.csr import CSR

log = logging.getLogger(__name__)


def token_ranges(num_nodes: int, size: int) -> np.ndarray:
    """int64[size + 1]: rank ``p`` holds node tokens ``[r[p], r[p + 1])`` (the first ``S mod P`` ranks one more)."""
    base, extra = divmod(int(num_nodes), int(size))
    counts = np.full(size, base, dtype=np.int64)
    counts[:extra] += 1
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


class _AllToAll(torch.autograd.Function):
    """Rows-to-heads (``forward=True``) or heads-to-rows all-to-all of one attention input/output."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, ctx_graph: "_SeqParGraph", to_heads: bool, with_token: bool):
        ctx.g, ctx.to_heads, ctx.with_token = ctx_graph, to_heads, with_token
        return ctx_graph._rows_to_heads(t, with_token) if to_heads else ctx_graph._heads_to_rows(t, with_token)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.g
        grad = grad.contiguous()
        out = g._heads_to_rows(grad, ctx.with_token) if ctx.to_heads else g._rows_to_heads(grad, ctx.with_token)
        return out, None, None, None


class _SeqParGraph(GraphContext):
    """This rank's token rows of the sequence; attention over the whole sequence through all-to-alls."""

    def __init__(self, csr: CSR, ranges: np.ndarray, comm: Any, ids: np.ndarray | None = None,
                 clusters: ClusterLayoutControl | None = None, cluster_ptr: np.ndarray | None = None,
                 device: torch.device | str = "cpu"):
        self.csr = csr  # the whole graph in sequence positions (every rank, host), for the pattern and the degrees
        self.device = torch.device(device)
        self.ranges = ranges
        self.comm = comm
        self.rank, self.size = int(comm.rank), int(comm.size)
        self.lo, self.hi = int(ranges[self.rank]), int(ranges[self.rank + 1])
        self.num_nodes = self.hi - self.lo
        self.global_num_nodes = csr.num_dst
        self.node_fields: dict[str, torch.Tensor] = {}
        self._gid = (torch.arange(self.lo, self.hi, dtype=torch.int64) if ids is None
                     else torch.from_numpy(np.asarray(ids, dtype=np.int64))).to(self.device)  # this rank's node ids
        self._degrees: dict[str, torch.Tensor] = {}
        self._patterns: dict[bool, Any] = {}
        self.clusters, self.cluster_ptr = clusters, cluster_ptr  # the cluster-sparse layout (sequence positions)
        self.chain = True  # engine.attention_chain

    # -- the all-to-alls -----------------------------------------------------------------------
    def _counts(self, with_token: bool) -> np.ndarray:
        """Rows each rank contributes to the sequence (the last one adds the global token)."""
        counts = np.diff(self.ranges).astype(np.int64)
        if with_token:
            counts[-1] += 1
        return counts

    def _rows_to_heads(self, t: torch.Tensor, with_token: bool) -> torch.Tensor:
        """[local rows (+1 token copy), H, d] -> [S (+1), H/P, d]: every token, this rank's heads."""
        P, hp = self.size, t.shape[1] // self.size
        mine = int(self._counts(with_token)[self.rank])
        rows = t[:mine]  # a non-last rank's token copy stays home
        send = rows.view(mine, P, hp, t.shape[2]).transpose(0, 1).reshape(P * mine, hp, t.shape[2])
        recv, _ = self.comm.alltoallv(send.contiguous(), np.full(P, mine, dtype=np.int64)) if P > 1 else (send, None)
        return recv  # rows from rank 0 first: the sequence order

    def _heads_to_rows(self, t: torch.Tensor, with_token: bool) -> torch.Tensor:
        """[S (+1), H/P, d] -> [local rows (+1 token row), H, d] (a non-last rank's token row is 0)."""
        P, hp, d = self.size, t.shape[1], t.shape[2]
        counts = self._counts(with_token)
        if P > 1:
            recv, _ = self.comm.alltoallv(t.contiguous(), counts)
        else:
            recv = t
        mine = int(counts[self.rank])
        out = recv.view(P, mine, hp, d).transpose(0, 1).reshape(mine, P * hp, d)
        if with_token and self.rank != self.size - 1:
            out = torch.cat([out, out.new_zeros(1, P * hp, d)], 0)
        return out

    # -- GraphContext -----------------------------------------------------------------------------
    def attention_pattern(self, global_token: bool):
        from hpc_graph.graph.attention_pattern import build_pattern

        if global_token not in self._patterns:
            g = self.csr
            self._patterns[global_token] = build_pattern(g.indptr.numpy(), g.indices.numpy(), g.num_dst,
                                                         global_token=global_token, chain=self.chain)
        return self._patterns[global_token]

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False, far_prior=True):
        from hpc_graph.graph.attention_pattern import attend, check_attention_args

        H = q.shape[1]
        if H % self.size:
            raise ValueError(f"model.heads: {H} heads cannot be split over {self.size} ranks of engine 'seqpar' "
                             f"(heads must be a multiple of the number of ranks)")
        want = self.num_nodes + int(global_token)
        if q.shape[0] != want:
            raise ValueError(f"attention: q has {q.shape[0]} rows, this rank holds {want} tokens "
                             f"({self.num_nodes} nodes{' + the global token' if global_token else ''})")
        check_attention_args(mode, bias, H)
        pat = self.attention_pattern(global_token)
        hp = H // self.size
        if q.shape == v.shape:  # one all-to-all for q, k and v: [rows, H, 3 d] keeps each head's three together
            x = _AllToAll.apply(torch.stack([q, k, v], 2).reshape(want, H, 3 * q.shape[2]), self, True,
                                global_token)
            qh, kh, vh = x.view(x.shape[0], hp, 3, q.shape[2]).unbind(2)
        else:
            qh, kh, vh = (_AllToAll.apply(t.contiguous(), self, True, global_token) for t in (q, k, v))
        b = None if bias is None else bias[:, self.rank * hp:(self.rank + 1) * hp]  # this rank's heads
        layout = None if self.clusters is None else self.clusters.layout_in(pat, self.cluster_ptr, mode)
        out = attend(pat, qh.contiguous(), kh.contiguous(), vh.contiguous(), bias=b, mode=mode, layout=layout,
                     far_prior=far_prior)
        return _AllToAll.apply(out, self, False, global_token)

    def aggregate(self, x, reduce="sum"):
        raise ValueError("engine 'seqpar' runs the graph transformers (model.name: gt or graphormer) only")

    def gat(self, *args, **kwargs):
        raise ValueError("engine 'seqpar' runs the graph transformers (model.name: gt or graphormer) only")

    def in_degree(self) -> torch.Tensor:
        if "in" not in self._degrees:
            self._degrees["in"] = self.csr.in_degree()[self.lo:self.hi].to(self.device)
        return self._degrees["in"]

    def out_degree(self) -> torch.Tensor:
        if "out" not in self._degrees:
            self._degrees["out"] = self.csr.out_degree()[self.lo:self.hi].to(self.device)
        return self._degrees["out"]

    def global_ids(self) -> torch.Tensor:
        return self._gid

    def row_ids(self, output: bool = False) -> torch.Tensor:
        return self._gid

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.comm.allreduce_(t)
        return t


class SeqParEngine(Engine):
    """Sequence-parallel engine for graph transformers (see module docstring). ``source``: a dataset file."""

    name = "seqpar"
    summary = "sequence-parallel graph transformers (`gt`, `graphormer`; docs/transformers.md)."
    kind = "sequence"
    data_source = "file"
    shared_rng = True
    Options = SequenceOptions
    extra_context = ("heads",)

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        if not model.sequence:
            return f"engine.name: 'seqpar' runs the graph transformers (a token sequence), not {mc.name!r}"
        return None

    @classmethod
    def options_from_config(cls, config: Any) -> dict[str, Any]:
        """The engine's options, plus the model's attention heads (split over the ranks: checked before loading)."""
        return {**super().options_from_config(config), "heads": int(config.model.heads)}

    @classmethod
    def check_options(cls, options: dict[str, Any], size: int) -> None:
        heads = options.get("heads")
        if heads is not None and size > 1 and int(heads) % size:
            raise ValueError(f"model.heads: {heads} heads cannot be split over {size} ranks of engine 'seqpar' "
                             f"(heads must be a multiple of the number of ranks)")

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        size = int(getattr(comm, "size", 1)) if comm is not None else 1
        rank = int(getattr(comm, "rank", 0)) if comm is not None else 0
        with open_dataset(self.source) as ds:
            if not ds.has("feat"):
                raise FormatError(self.source, "/node/feat", "missing (training needs node features)")
            n = ds.num_nodes
            if n < size:
                raise ValueError(f"engine 'seqpar': {n} nodes cannot be split over {size} ranks")
            ranges = token_ranges(n, size)
            lo, hi = int(ranges[rank]), int(ranges[rank + 1])
            indptr, indices = ds.indptr(), ds.indices().astype(np.int64, copy=False)
            o = self.options
            clusters, chain = engine_attention_options(o)
            order, cluster_ptr = sequence_clusters(indptr, indices, n, str(o.get("sequence_order", "id")),
                                                   cluster_size=clusters.cluster_size, seed=int(o.get("seed", 0)))
            ids = order[lo:hi]  # this rank's nodes: a contiguous piece of the sequence
            csr = CSR.permuted(indptr, indices, order)  # node order[t] becomes token t
            feat = ds.feat_take(ids)
            label = ds.node_labels()[ids]
            masks = {name: m[ids] for name, m in ds.split_masks().items()}
            lap_pe = ds.lap_pe()[ids] if ds.has("lap_pe") else None
            self.num_classes = int(ds.num_classes) or int(ds.label().max()) + 1
        # the whole graph and its attention patterns stay on the host (built there, copied to the device once
        # by the attention); this rank's rows live on the model's device
        self.graph = _SeqParGraph(csr, ranges, comm, ids, clusters, cluster_ptr, self.device)
        self.graph.chain = chain
        if lap_pe is not None:
            self.graph.node_fields["lap_pe"] = torch.from_numpy(np.ascontiguousarray(lap_pe)).to(self.device,
                                                                                                  dtype=dtype)
        self.feat = torch.from_numpy(np.ascontiguousarray(feat)).to(self.device, dtype=dtype)
        self.label = torch.from_numpy(np.asarray(label, dtype=np.int64)).to(self.device)
        self.masks = {k: torch.from_numpy(np.asarray(v, dtype=bool)).to(self.device) for k, v in masks.items()}
        self.num_features = int(self.feat.shape[1])
        log.info("seqpar engine: rank %d of %d holds tokens [%d, %d) of %d", rank, size, lo, hi, n)
        self.reset_stats()

    # -- the cluster-sparse layout's tuner: the same decisions on every rank -----------------------
    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        c = self.graph.clusters
        if c.tuner is not None:
            t = torch.tensor([float(seconds)], dtype=torch.float64)
            if self.comm.size > 1:
                self.comm.allreduce_(t, "max")  # the slowest rank's time: every rank feeds the same numbers
            c.end_epoch(epoch, loss, float(t.item()))

    def stats(self) -> dict:
        out = super().stats()
        if self.graph.clusters.enabled:
            out.update(self.graph.clusters.stats())
        return out

    def state_dict(self) -> dict:
        return {"clusters": self.graph.clusters.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.graph.clusters.load_state_dict(state.get("clusters") or {})
