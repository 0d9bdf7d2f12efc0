"""The layer-1 contexts of the ``apt`` engine's parallel strategies (APT: Ma, Liu, Yan et al., PPoPP'25).

A model runs unchanged on every strategy: only the input-most message-passing
layer (block 0, the largest) is laid out differently, and the rows it writes
are put back into the seed rank's order by the next block's
:meth:`~hpc_graph.graph.base.GraphContext.layer_input`. Blocks 1 and above are
ordinary data-parallel :class:`~hpc_graph.graph.block.Block` s.

* GDP: block 0 is the rank's own :class:`Block` (its sources' features loaded).
* NFP: block 0 is the union of every rank's block 0 (plus one *phantom*
  destination with no edges and zero features) and its input holds only this
  rank's slice of the feature columns. A layer affine in its input then gives
  ``f(x) = sum_r f(x_r) - (P - 1) f(0)``, and ``f(0)`` is the phantom's row:
  :class:`NFPReduce` (block 1's ``layer_input``) sums the partial rows of the
  seed rank's destinations and subtracts ``(P - 1)`` phantom rows. Only for
  layers affine in their input (GCN, SAGE; not GAT).
* SNP: :class:`SNPContext`: the input rows are ``[destinations | owned sources
  of every rank's edges]``; :meth:`SNPContext.aggregate` and
  :meth:`SNPContext.gat` compute each destination's partial aggregation at the
  owner of its sources and sum the partials at the seed rank (GAT through the
  online-softmax merge of ``(max, denominator, numerator)`` partials).
* DNP: block 0 holds the destinations this rank owns, asked for by any rank
  (each computed once); :class:`DNPReturn` (block 1's ``layer_input``) sends
  every row back to the ranks that asked for it.

Byte counters: every shuffle adds to a shared ``counter`` dict under
``shuffle`` (forward) and ``shuffle_bwd`` (backward).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.graph.block import Block
from hpc_graph.ops.all_reduce import all_reduce_sum
from hpc_graph.ops.csr import CSR
from hpc_graph.ops.shuffle import shuffle_rows


class NFPReduce:
    """``layer_input`` of block 1 under NFP: ``h`` [sum_q n_q + 1, d'] partial rows of every rank's
    destinations (rank order) and the phantom row -> the complete rows of this rank's destinations."""

    def __init__(self, dst_counts: np.ndarray, comm: Any, counter: dict):
        self.counts = np.asarray(dst_counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])
        self.comm, self.counter = comm, counter

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        r, P = int(self.comm.rank), int(self.comm.size)
        total = int(self.offsets[-1])
        if h.shape[0] != total + 1:
            raise RuntimeError(f"apt nfp: layer 1 produced {h.shape[0]} rows, expected {total + 1}")
        lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
        send_counts = self.counts.copy()
        send_counts[r] = 0
        n = hi - lo
        # one split, not four slices: the backward pass then builds h's gradient once (a slice's backward
        # makes a zero tensor of h's size, and autograd adds them up)
        before, own, after, phantom = torch.split(h, [lo, n, total - hi, 1], 0)
        got = shuffle_rows(torch.cat([before, after], 0), send_counts, self.comm, self.counter)
        if P == 1:
            return own
        # the partial rows summed, the phantom row's bias term taken off once per partial, in place
        return got.view(P - 1, n, *h.shape[1:]).sum(0).add_(own).sub_(phantom, alpha=P - 1)


class DNPReturn:
    """``layer_input`` of block 1 under DNP: rows of this rank's DNP block destinations -> the rows of the
    rank's own block-0 destinations, in their order.

    Args:
        own_pos: int64[a] positions (in the rank's destination order) of the destinations it owns; their
            rows are ``h[own_row]``.
        own_row: int64[a] rows of ``h`` holding them.
        send_rows: int64[s] rows of ``h`` asked for by other ranks, grouped by asking rank.
        send_counts: int64[P] rows sent to each rank.
        remote_pos: int64[m] positions of the destinations other ranks computed, in the order they arrive
            (grouped by owner, in the order asked).
        num_dst: rows of the result.
    """

    def __init__(self, own_pos, own_row, send_rows, send_counts, remote_pos, num_dst: int, comm: Any,
                 counter: dict):
        own_pos, own_row = np.asarray(own_pos, np.int64), np.asarray(own_row, np.int64)
        send_rows, remote_pos = np.asarray(send_rows, np.int64), np.asarray(remote_pos, np.int64)
        self.send_counts, self.num_dst = np.asarray(send_counts, np.int64), int(num_dst)
        if own_pos.size + remote_pos.size != self.num_dst:
            raise ValueError(f"apt dnp: {own_pos.size} own and {remote_pos.size} remote destinations, "
                             f"expected {self.num_dst}")
        # one gather of the rows to send and the own rows; the result is [own | received] permuted into the
        # destinations' order (each pass then makes one gradient of h and one of the result, not one per op)
        self.n_send = int(send_rows.size)
        self.take = torch.from_numpy(np.concatenate([send_rows, own_row]))
        order = np.empty(self.num_dst, np.int64)
        order[own_pos] = np.arange(own_pos.size)
        order[remote_pos] = own_pos.size + np.arange(remote_pos.size)
        self.order = torch.from_numpy(order)
        self.comm, self.counter = comm, counter

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        send, own = h.index_select(0, self.take).split([self.n_send, self.take.numel() - self.n_send], 0)
        got = shuffle_rows(send, self.send_counts, self.comm, self.counter)
        return torch.cat([own, got], 0).index_select(0, self.order)


class SNPContext(GraphContext):
    """Block 0 under SNP (source-node parallelism).

    Input rows: ``[the rank's n destinations | U]``, ``U`` the owned nodes that are sources of some
    rank's sampled edges. ``csr`` has ``n + sum_q v_q`` rows over those input rows: first the rank's
    own destinations with their edges from owned sources, then, for every other rank ``q`` in rank
    order, the ``v_q`` *virtual nodes* ``q`` created here (its destinations with sources owned here).
    The rank's own virtual nodes on rank ``q`` are its destinations ``virtual_pos`` (grouped by ``q``,
    ``virtual_counts[q]`` each).

    Args:
        csr: the combined partial-aggregation CSR (columns index the input rows).
        sampled: int64[n] sampled in-edges of each destination (all owners together).
        degree: int64[n + |U|] in-degree in the whole graph of every input row.
        gids: int64[n + |U|] global ids of the input rows.
        recv_counts: int64[P] virtual nodes other ranks created here (rows of ``csr`` after the first n).
        virtual_pos, virtual_counts: as above.
    """

    def __init__(self, csr: CSR, num_dst: int, sampled: np.ndarray, degree: torch.Tensor, gids: torch.Tensor,
                 recv_counts: np.ndarray, virtual_pos: np.ndarray, virtual_counts: np.ndarray, comm: Any,
                 counter: dict):
        self.csr, self.num_nodes, self.global_num_nodes = csr, int(num_dst), -1
        self.degree, self.gids = degree, gids
        self.recv_counts = np.asarray(recv_counts, np.int64)
        self.virtual_pos = torch.as_tensor(np.asarray(virtual_pos, np.int64))
        self.virtual_counts = np.asarray(virtual_counts, np.int64)
        self.comm, self.counter = comm, counter
        s = torch.as_tensor(np.asarray(sampled, np.int64)).to(torch.float64)
        full = degree[:self.num_nodes].to(torch.float64)
        self._mean64 = torch.where(s > 0, 1.0 / s.clamp(min=1), torch.zeros_like(s))
        self._sum64 = torch.where(s > 0, full / s.clamp(min=1), torch.zeros_like(s))

    def _gather_partials(self, partial: torch.Tensor) -> torch.Tensor:
        """Own rows of ``partial`` [n + sum_q v_q, ...] plus the partials other ranks computed for this rank's
        virtual nodes -> float[n, ...]."""
        n = self.num_nodes
        got = shuffle_rows(partial[n:], self.recv_counts, self.comm, self.counter)
        return partial[:n].index_add(0, self.virtual_pos, got)

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        from hpc_graph.ops.spmm import spmm

        if reduce not in ("sum", "mean"):
            raise ValueError(f"aggregate: reduce must be 'sum' or 'mean', got {reduce!r}")
        if x.shape[0] != self.csr.num_src:
            raise ValueError(f"SNPContext.aggregate: x has {x.shape[0]} rows, the context has {self.csr.num_src}")
        out = self._gather_partials(spmm(self.csr, x, "sum"))
        scale = (self._mean64 if reduce == "mean" else self._sum64).to(out.dtype)
        return out * scale.view((-1,) + (1,) * (out.dim() - 1))

    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *, negative_slope: float = 0.2,
            attn_dropout: float = 0.0, seed: int = 0, add_self_loops: bool = True) -> torch.Tensor:
        if attn_dropout > 0.0:
            raise ValueError("engine.strategy snp: GAT attention dropout (model.attn_dropout) is not supported "
                             "across source owners; set it to 0 or use strategy gdp or dnp")
        n = self.num_nodes
        heads, dim = int(z.shape[1]), int(z.shape[2])
        # the destination scores travel to the owners of the sources (virtual nodes, rank order)
        s_virtual = shuffle_rows(s_dst.index_select(0, self.virtual_pos), self.virtual_counts, self.comm,
                                 self.counter)
        s_rows = torch.cat([s_dst, s_virtual], 0)
        g = self.csr
        rows = torch.repeat_interleave(torch.arange(g.num_dst), g.indptr[1:] - g.indptr[:-1])
        cols = g.indices
        e = F.leaky_relu(s_src.index_select(0, cols) + s_rows.index_select(0, rows), negative_slope)
        m = torch.full((g.num_dst, heads), float("-inf"), dtype=e.dtype)
        m = m.scatter_reduce(0, rows.unsqueeze(1).expand(-1, heads), e.detach(), "amax", include_self=True)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w = torch.exp(e - m_safe.index_select(0, rows))
        den = e.new_zeros((g.num_dst, heads)).index_add(0, rows, w)
        num = e.new_zeros((g.num_dst, heads, dim)).index_add(0, rows, w.unsqueeze(2) * z.index_select(0, cols))
        packed = torch.cat([m_safe.masked_fill(torch.isinf(m), -1e300 if e.dtype == torch.float64 else -1e30)
                            .unsqueeze(2), den.unsqueeze(2), num], 2)
        got = shuffle_rows(packed[n:], self.recv_counts, self.comm, self.counter)
        pieces = [packed[:n], got]
        index = [torch.arange(n), self.virtual_pos]
        if add_self_loops:
            e_self = F.leaky_relu(s_src[:n] + s_dst, negative_slope)
            pieces.append(torch.cat([e_self.detach().unsqueeze(2), torch.exp(e_self - e_self.detach()).unsqueeze(2),
                                     torch.exp(e_self - e_self.detach()).unsqueeze(2) * z[:n]], 2))
            index.append(torch.arange(n))
        allp, idx = torch.cat(pieces, 0), torch.cat(index)
        pm = allp[:, :, 0].detach()
        big = torch.full((n, heads), float("-inf"), dtype=pm.dtype).scatter_reduce(
            0, idx.unsqueeze(1).expand(-1, heads), pm, "amax", include_self=True)
        big = torch.where(torch.isinf(big), torch.zeros_like(big), big)
        f = torch.exp(pm - big.index_select(0, idx))
        den_t = allp.new_zeros((n, heads)).index_add(0, idx, f * allp[:, :, 1])
        num_t = allp.new_zeros((n, heads, dim)).index_add(0, idx, f.unsqueeze(2) * allp[:, :, 2:])
        return num_t / torch.where(den_t > 0, den_t, torch.ones_like(den_t)).unsqueeze(2)

    def dst(self, t: torch.Tensor) -> torch.Tensor:
        return t.narrow(0, 0, self.num_nodes) if t.layout == torch.strided else t[:self.num_nodes]

    def in_degree(self) -> torch.Tensor:
        return self.degree

    def global_ids(self) -> torch.Tensor:
        return self.gids[:self.num_nodes]

    def row_ids(self, output: bool = False) -> torch.Tensor:
        """Global ids (the keys every strategy's blocks use): the destinations', with ``output``, else every
        input row's."""
        return self.gids[:self.num_nodes] if output else self.gids

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(t, self.comm)


class NFPBlock(Block):
    """Block 0 under NFP: the union of every rank's block 0 and the phantom row (see the module docstring)."""

    MESSAGE = ("engine.strategy nfp splits the input features by columns, so layer 1 must be affine in its "
               "input (gcn, sage); attention models (gat) need whole rows: use strategy gdp, snp or dnp")

    def gat(self, *args, **kwargs):
        raise ValueError(self.MESSAGE)

    def gat_projected(self, *args, **kwargs):
        raise ValueError(self.MESSAGE)

    def attention(self, *args, **kwargs):
        raise ValueError(self.MESSAGE)
