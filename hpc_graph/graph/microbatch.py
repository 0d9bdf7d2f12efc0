"""Micro-batches of a whole graph, and the cut of a layer chain into stages, for layer-pipelined training
(the ``flow`` engine; :func:`split_stages` is shared with the planner).

A pipeline runs every layer of a stage on one micro-batch at a time. The
micro-batches are disjoint sets of nodes (METIS parts: few edges between
them), relabelled so that micro-batch ``m`` is the contiguous row range
``offsets[m]:offsets[m+1]`` of the graph. What a micro-batch does with the
edges that come from *other* micro-batches (the cut edges) is the choice
``cross_edges``:

* ``drop`` (UniTG's thesis): the cut edges do not exist; micro-batch ``m``
  is the subgraph its nodes induce, degrees included (exactly the ``single``
  engine on the graph without the cut edges).
* ``stale`` (GNNAutoScale's historical embeddings): a layer's input rows of
  the sources in other micro-batches come from a per-layer history that every
  micro-batch refreshes with its own rows as it passes (no gradient flows into
  them): rows of micro-batches processed earlier in the epoch are this
  epoch's, the others the previous epoch's (zeros before the first). The input
  layer's halo rows are the input features themselves, never stale. Degrees
  are those of the whole graph.
* ``exact``: not a micro-batch context at all; the stage runs the whole
  graph (:class:`~hpc_graph.graph.whole_graph.WholeGraph`) once all
  micro-batches of a layer are there.

:class:`MicroBatchGraph` is such a micro-batch as a
:class:`~hpc_graph.graph.base.GraphContext`: ``layer(l)`` returns layer
``l``'s :class:`~hpc_graph.graph.block.Block` (destinations: the micro-batch's
rows; sources: its rows, then the halo rows ``layer_input`` appends), so every
model written for sampled blocks runs on it unchanged. Blocks keep every
in-edge, so sums and means are the full-graph (``stale``) or cut-graph
(``drop``) ones, with no rescaling.
"""
from __future__ import annotations

import numpy as np
import torch

from hpc_graph.comm.local import LocalCommunicator
from hpc_graph.graph.base import GraphContext
from hpc_graph.graph.block import Block
from hpc_graph.ops.csr import CSR

CROSS_EDGES = ("exact", "stale", "drop")


def split_stages(costs: list[float], stages: int) -> list[int]:
    """Cut ``costs`` (one per unit, in order) into ``stages`` contiguous non-empty runs minimising the largest
    run's sum; returns the ``stages + 1`` boundaries (first 0, last ``len(costs)``)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"split_stages: {stages} stages need 1 to {n} units")
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(costs, dtype=np.float64))))
    inf = float("inf")
    # best[k][i]: the smallest max-run over the first i units cut into k runs; cut[k][i] where the last run starts
    best = np.full((stages + 1, n + 1), inf)
    cut = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(int(cut[k][bounds[-1]]))
    return bounds[::-1]


class _Part:
    """Micro-batch structure: rows ``lo:hi``; ``inner`` (cut-graph CSR over its own rows), ``full`` (every in-edge,
    columns ``[own rows | halo]``), ``halo`` (int64 global ids of the sources in other micro-batches, ascending)."""

    def __init__(self, lo: int, hi: int, inner: CSR, full: CSR, halo: np.ndarray, inner_degree: np.ndarray):
        self.lo, self.hi = lo, hi
        self.inner, self.full, self.halo, self.inner_degree = inner, full, halo, inner_degree


class MicroBatchPlan:
    """The micro-batches of a graph whose nodes are already relabelled so that each is a contiguous range.

    Args:
        indptr: int64[N+1], indices: int[E] -- the relabelled graph (row i lists the sources of i's in-edges).
        offsets: int64[M+1] -- micro-batch m is rows ``offsets[m]:offsets[m+1]`` (non-empty).
        orig_id: int64[N] -- dataset id of each row (attention-dropout hashes use it, as on ``single``).
        device: where the blocks' tensors live.

    Attributes: ``num_microbatches``, ``num_nodes``, ``cut_edges`` (edges whose source lies in another
    micro-batch), ``num_edges``, ``sizes`` (rows per micro-batch).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, offsets: np.ndarray, orig_id: np.ndarray,
                 device: torch.device | str = "cpu"):
        indptr = np.asarray(indptr, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        n = int(indptr.shape[0] - 1)
        if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) <= 0):
            raise ValueError(f"MicroBatchPlan: offsets must rise strictly from 0 to {n}, got {offsets.tolist()}")
        self.num_nodes, self.num_edges = n, int(indices.shape[0])
        self.num_microbatches = int(offsets.shape[0] - 1)
        self.offsets = offsets
        self.sizes = np.diff(offsets)
        self.device = torch.device(device)
        self.degree = torch.from_numpy(np.diff(indptr)).to(self.device)
        self.orig_id = torch.from_numpy(np.asarray(orig_id, dtype=np.int64)).to(self.device)
        self.comm = LocalCommunicator()
        self.parts: list[_Part] = []
        self.cut_edges = 0
        for m in range(self.num_microbatches):
            lo, hi = int(offsets[m]), int(offsets[m + 1])
            rows = hi - lo
            ptr = indptr[lo:hi + 1] - indptr[lo]
            src = indices[indptr[lo]:indptr[hi]]
            inside = (src >= lo) & (src < hi)
            row_of = np.repeat(np.arange(rows), np.diff(ptr))
            inner_deg = np.bincount(row_of[inside], minlength=rows).astype(np.int64)
            inner_ptr = np.concatenate(([0], np.cumsum(inner_deg))).astype(np.int64)
            halo = np.unique(src[~inside])
            cols = np.where(inside, src - lo, rows + np.searchsorted(halo, src))
            self.cut_edges += int((~inside).sum())
            self.parts.append(_Part(lo, hi, CSR(inner_ptr, src[inside] - lo, rows, validate=False).to(self.device),
                                    CSR(ptr, cols, rows + int(halo.shape[0]), validate=False).to(self.device),
                                    halo, inner_deg))

    def context(self, m: int, mode: str, history: "History | None" = None) -> "MicroBatchGraph":
        """Micro-batch ``m`` as a GraphContext under ``mode`` (``drop`` or ``stale``; ``stale`` needs ``history``)."""
        return MicroBatchGraph(self, m, mode, history)


class History:
    """Per-layer input rows of every node for ``stale`` micro-batches (float[N, ...] per layer, made on first use).

    ``inputs`` (float[N, F]) is the input layer's: the features of the epoch, set by the engine.
    """

    def __init__(self, num_nodes: int):
        self.num_nodes = int(num_nodes)
        self.layers: dict[int, torch.Tensor] = {}
        self.inputs: torch.Tensor | None = None

    def push_and_read(self, layer: int, lo: int, h: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """Store ``h`` (the rows ``lo:lo+len(h)`` of layer ``layer``'s input, detached) and return the rows ``halo``."""
        if layer == 0:
            if self.inputs is None:
                raise RuntimeError("History: the input features of the epoch were not set")
            x = self.inputs
            return x.index_select(0, halo).to(h.dtype)
        buf = self.layers.get(layer)
        if buf is None or buf.shape[1:] != h.shape[1:] or buf.dtype != h.dtype:
            buf = self.layers[layer] = h.new_zeros((self.num_nodes,) + tuple(h.shape[1:]))
        buf[lo:lo + h.shape[0]] = h.detach()
        return buf.index_select(0, halo)

    def nbytes(self) -> int:
        """Bytes held by the per-layer histories."""
        return sum(t.numel() * t.element_size() for t in self.layers.values())

    def state_dict(self) -> dict[int, torch.Tensor]:
        """The per-layer histories (CPU copies), for a checkpoint; the inputs are the epoch's, not saved."""
        return {int(layer): t.detach().cpu().clone() for layer, t in self.layers.items()}

    def load_state_dict(self, state: dict[int, torch.Tensor], device: torch.device | str = "cpu") -> None:
        """Restore :meth:`state_dict`'s histories (``ValueError`` when a layer's rows are not ``num_nodes``)."""
        layers = {}
        for layer, t in state.items():
            if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != self.num_nodes:
                raise ValueError(f"History: layer {layer}'s saved rows do not match the {self.num_nodes} nodes")
            layers[int(layer)] = t.to(device)
        self.layers = layers


class MicroBatchGraph(GraphContext):
    """Micro-batch ``m`` of a :class:`MicroBatchPlan` (module docstring): ``num_nodes`` = its rows.

    ``layer(l)`` is layer ``l``'s block; ``drop`` gives the same block for every layer. The model must call
    ``graph.layer(l)`` (as every model written for sampled blocks does); under ``stale`` the whole-context
    operations refuse, under ``drop`` they are layer 0's.
    """

    def __init__(self, plan: MicroBatchPlan, m: int, mode: str, history: History | None = None):
        if mode not in ("drop", "stale"):
            raise ValueError(f"MicroBatchGraph: mode must be 'drop' or 'stale', got {mode!r}")
        if mode == "stale" and history is None:
            raise ValueError("MicroBatchGraph: mode 'stale' needs a History")
        self.plan, self.m, self.mode, self.history = plan, int(m), mode, history
        part = plan.parts[self.m]
        self.part = part
        self.num_nodes = part.hi - part.lo
        self.global_num_nodes = plan.num_nodes
        dev = plan.device
        own = torch.arange(part.lo, part.hi, dtype=torch.int64, device=dev)
        if mode == "drop":
            self._gid = own
            self._degree = torch.from_numpy(part.inner_degree).to(dev)
        else:
            halo = torch.from_numpy(part.halo).to(dev)
            self._gid = torch.cat([own, halo])
            self._halo = halo
            self._degree = plan.degree.index_select(0, self._gid)
        self._orig = plan.orig_id.index_select(0, self._gid)
        self._blocks: dict[int, Block] = {}

    def layer(self, index: int) -> GraphContext:
        key = 0 if self.mode == "drop" else int(index)
        blk = self._blocks.get(key)
        if blk is None:
            if self.mode == "drop":
                blk = Block(self.part.inner, self._gid, self._orig, self._degree, self.plan.comm)
            else:
                # the blocks of all layers share the micro-batch's CSR (and the self loops it caches for GAT)
                blk = Block(self.part.full, self._gid, self._orig, self._degree, self.plan.comm,
                            complete=self._completer(key))
            self._blocks[key] = blk
        return blk

    def _completer(self, layer: int):
        lo, n, halo, hist = self.part.lo, self.num_nodes, self._halo, self.history

        def complete(h: torch.Tensor) -> torch.Tensor:
            if h.shape[0] != n:
                raise ValueError(f"micro-batch {self.m}, layer {layer}: the input has {h.shape[0]} rows, the "
                                 f"micro-batch {n}")
            if h.layout != torch.strided:
                h = h.to_dense()
            return torch.cat([h, hist.push_and_read(layer, lo, h, halo)], 0)

        return complete

    def _whole(self, what: str) -> GraphContext:
        if self.mode == "stale":
            raise RuntimeError(f"MicroBatchGraph.{what}: a 'stale' micro-batch has one graph per layer; the model "
                               "must call graph.layer(l) for each layer (see hpc_graph.graph.base)")
        return self.layer(0)

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        return self._whole("aggregate").aggregate(x, reduce)

    def gat(self, z, s_src, s_dst, **kw):
        return self._whole("gat").gat(z, s_src, s_dst, **kw)

    def in_degree(self) -> torch.Tensor:
        return self._whole("in_degree").in_degree()

    def global_ids(self) -> torch.Tensor:
        return self._gid[:self.num_nodes]

    def row_ids(self, output: bool = False) -> torch.Tensor:
        """The micro-batch's own rows (a model reads more only through ``layer(l)``, a :class:`Block`)."""
        return self._orig[:self.num_nodes]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t
