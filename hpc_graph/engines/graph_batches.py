"""Batches of whole graphs from a graph-level dataset (``/graphs/ptr``: many small graphs, one label each).

Shared by the engines that train on such data (not an engine itself): ``single`` (one process, every
batch) and ``dp`` on a graph-level dataset file (every rank holds the whole file and trains on its
share of every batch). An epoch shuffles the training graphs with a generator seeded by the training
seed and the epoch, so every rank draws the same order without communicating; step ``it`` takes the
next ``batch_size`` graphs of that order (ascending ids), and rank ``r`` of ``P`` takes the ``r``-th of
``P`` near-equal consecutive slices of them. With the trainer's loss (summed over a rank's graphs,
divided by the step's global count) and its gradient all-reduce, a step on ``P`` ranks is the step of
one process on the whole batch.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hpc_graph.engines.base import Batch
from hpc_graph.graph.dist_graph import row_normalize
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.ops.csr import CSR
from hpc_graph.options import int_spec, option


def is_graph_level(source) -> bool:
    """Whether ``source`` is a graph-level dataset file (``task = "graph"``: many graphs, one label each)."""
    import os

    if source is None or not os.path.isfile(source):
        return False
    from data_io.dataset import dataset_task

    return dataset_task(source) == "graph"


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """``[lo, hi)`` of rank ``rank``'s slice of ``n`` consecutive items split over ``size`` ranks (near-equal
    consecutive slices in rank order, the earlier ranks one larger where ``n`` does not divide)."""
    q, r = divmod(int(n), int(size))
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


class GraphBatches:
    """The graphs of a graph-level dataset, held whole, and the batches of every epoch.

    Args:
        indptr, indices: the dataset's CSR (NumPy, int64 row pointers; node ids over all graphs).
        graph_ptr: int64[G + 1] node offsets: graph ``g`` is nodes ``graph_ptr[g]:graph_ptr[g + 1]``.
        feat: float[N, F] node features (on the engine's device).
        label: int64[G] graph labels (-1: unlabelled).
        train: bool[G] training graphs (those with a label count).
        batch_size: graphs per optimiser step, over all ranks.
        seed: the training seed (the epoch order's generator).
        node_fields: per-node tensors ``{name: [N, ...]}`` carried into every batch (``lap_pe``).
        edge_type: int[E] edge types or None.
        rank, size: this rank and the number of ranks sharing every batch.
        feature_norm: ``row`` divides every node's features by their sum (rows summing to 0 kept), as the
            trainer does for evaluation (``data.feature_norm``): the batches get the same inputs.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, graph_ptr: np.ndarray, feat: torch.Tensor,
                 label: torch.Tensor, train: torch.Tensor, batch_size: int, seed: int,
                 node_fields: dict[str, torch.Tensor] | None = None, edge_type: np.ndarray | None = None,
                 rank: int = 0, size: int = 1, feature_norm: str = "none"):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"engine.graph_batch_size: must be a positive integer, got {batch_size!r}")
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices)
        self.graph_ptr = np.asarray(graph_ptr, dtype=np.int64)
        if feature_norm not in ("none", "row"):
            raise ValueError(f"data.feature_norm: must be 'none' or 'row', got {feature_norm!r}")
        self.feat, self.label = (row_normalize(feat) if feature_norm == "row" else feat), label
        self.node_fields = dict(node_fields or {})
        self.edge_type = None if edge_type is None else np.asarray(edge_type)
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.rank, self.size = int(rank), int(size)
        self.train_graphs = (train.cpu() & (label.cpu() >= 0)).nonzero().squeeze(1)
        self._order_epoch: int | None = None
        self._order = self.train_graphs

    def iterations(self, epoch: int) -> int:
        """Optimiser steps of an epoch: ceil(training graphs / batch_size) (the same on every rank)."""
        return -(-int(self.train_graphs.numel()) // self.batch_size)

    def batch_sizes(self, epoch: int, iterations: int) -> tuple[list[int], list[float]]:
        """Per step: this rank's graph count and the step's count over all ranks."""
        n, b = int(self.train_graphs.numel()), self.batch_size
        total = [max(0, min(b, n - it * b)) for it in range(iterations)]
        mine = [hi - lo for lo, hi in (share(t, self.rank, self.size) for t in total)]
        return mine, [float(t) for t in total]

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The training graphs in epoch ``epoch``'s order (int64[T]; the same on every rank)."""
        if self._order_epoch != epoch:
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + int(epoch)) & (2**63 - 1))
            self._order = self.train_graphs[torch.randperm(self.train_graphs.numel(), generator=gen)]
            self._order_epoch = epoch
        return self._order

    def step_graphs(self, epoch: int, iteration: int) -> torch.Tensor:
        """This rank's graphs of step ``iteration`` (int64, ascending; empty when the step has fewer graphs
        than ranks and this rank's slice is empty)."""
        b = self.batch_size
        graphs = torch.sort(self.epoch_order(epoch)[iteration * b:(iteration + 1) * b]).values
        lo, hi = share(int(graphs.numel()), self.rank, self.size)
        return graphs[lo:hi]

    def batch(self, epoch: int, iteration: int) -> Batch:
        """Step ``iteration`` of ``epoch``: this rank's graphs as one block-diagonal graph."""
        return self.subset(self.step_graphs(epoch, iteration))

    def subset(self, graphs: torch.Tensor) -> Batch:
        """The graphs ``graphs`` (int64[B] graph ids) as a :class:`Batch`: a ``WholeGraph`` of their nodes,
        renumbered in order, with its own ``graph_ptr``; their features, per-node fields and labels."""
        gp, indptr, indices = self.graph_ptr, self.indptr, self.indices
        g = graphs.cpu().numpy().astype(np.int64)
        sizes = gp[g + 1] - gp[g]
        new_ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        nodes = np.concatenate([np.arange(gp[x], gp[x + 1], dtype=np.int64) for x in g]) if g.size else \
            np.empty(0, np.int64)
        shift = np.repeat(new_ptr[:-1] - gp[g], sizes)  # old id + shift = new id, per node
        deg = indptr[nodes + 1] - indptr[nodes]
        sub_ptr = np.concatenate(([0], np.cumsum(deg))).astype(np.int64)
        take = np.repeat(indptr[nodes] - sub_ptr[:-1], deg) + np.arange(int(sub_ptr[-1]), dtype=np.int64)
        sub_idx = indices[take] + np.repeat(shift, deg)
        device = self.feat.device
        csr = CSR(torch.from_numpy(sub_ptr), torch.from_numpy(sub_idx), int(nodes.shape[0]), validate=False)
        et = self.edge_type
        sub = WholeGraph(csr.to(device), None if et is None else et[take], "id", new_ptr)
        idx = torch.from_numpy(nodes).to(device)
        for name, t in self.node_fields.items():
            sub.node_fields[name] = t[idx]
        seeds = torch.from_numpy(g).to(self.label.device)
        return Batch(sub, self.feat.index_select(0, idx), self.label[seeds], seeds)


@dataclasses.dataclass
class GraphBatchOptions:
    """The options of the engines that train on a graph-level dataset (many small graphs): ``single``, ``dp``."""
    graph_batch_size: int = option(64, int_spec(1),
                                   "Graph-level datasets (many small graphs, `/graphs/ptr`): graphs per optimiser "
                                   "step, over all ranks (shuffled every epoch; `dp` gives every rank a slice of "
                                   "each step); evaluation runs on all graphs at once (`dp`: a block per rank).",
                                   section="engine")
