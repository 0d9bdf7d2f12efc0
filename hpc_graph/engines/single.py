"""``single`` engine: one process holds the whole graph; the reference every other engine must match.

``source`` is a dataset file (``hpc-graph generate|convert``). Aggregation is
one call of :func:`hpc_graph.ops.spmm.spmm` over the whole CSR (:class:`~hpc_graph.graph.whole_graph.WholeGraph`; for the edge types
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
from hpc_graph.engines.base import Batch, Engine
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.ops.csr import CSR, column_dtype

log = logging.getLogger(__name__)


class SingleEngine(Engine):
    """The whole dataset in one process (see module docstring). ``source``: a dataset file.

    ``label`` holds -1 for unlabelled nodes; a missing mask is all False. A graph-level dataset
    (``/graphs/ptr``): ``label`` and ``masks`` are per graph and ``graph.num_graphs`` > 0; the engine
    is then of ``kind = "minibatch"``: every epoch shuffles the training graphs (seeded by ``seed`` and
    the epoch) and each step trains on ``graph_batch_size`` of them (:meth:`batch`, a block-diagonal
    graph of its own); evaluation runs on ``graph``, all graphs at once.
    Options: ``sequence_order`` (graph transformers: ``id``, ``rcm`` or ``metis``, see
    :func:`~hpc_graph.graph.attention_pattern.sequence_order`); ``cluster_beta``, ``cluster_size``,
    ``tuner_window`` (the cluster-sparse layout of sparse attention and its tuner,
    :class:`~hpc_graph.graph.attention_pattern.ClusterLayoutControl`); ``attention_chain`` (the pattern's
    chain through the sequence; off, the pattern is the one ``dp``/``sar`` attend over);
    ``graph_batch_size`` (graph-level data); ``prefetch`` is accepted and ignored; any other option is an error.
    Raises ``ValueError`` when ``comm`` has more than one rank.
    """

    name = "single"
    OPTIONS = Engine.OPTIONS | frozenset({"sequence_order", "graph_batch_size", "cluster_beta", "cluster_size",
                                          "tuner_window", "attention_chain"})

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
            csr = CSR(ds.indptr(), ds.indices().astype(column_dtype(n), copy=False), n, validate=False)
            edge_type = ds.edge_type()
            lap_pe = ds.lap_pe() if ds.has("lap_pe") else None
            feat = ds.feat_rows(0, n)
            graph_ptr = ds.graph_ptr() if ds.has("graph_ptr") else None
            if graph_ptr is not None:  # graph-level task: labels and masks per graph
                label = ds.graph_label()
                masks = {name: ds.graph_mask(f"{name}_mask") for name in ("train", "val", "test")}
            else:
                label, masks = ds.node_labels(), ds.split_masks()
            self.num_classes = int(ds.num_classes) or int(label.max()) + 1
        self.graph = WholeGraph(csr.to(self.device), edge_type, str(self.options.get("sequence_order", "id")),
                                graph_ptr)
        if lap_pe is not None:
            self.graph.node_fields["lap_pe"] = torch.from_numpy(lap_pe).to(device=self.device, dtype=dtype)
        self._set_clusters()
        self.feat = torch.from_numpy(feat).to(device=self.device, dtype=dtype)
        self.label = torch.from_numpy(np.asarray(label, dtype=np.int64)).to(self.device)
        self.masks = {k: torch.from_numpy(np.asarray(v, dtype=bool)).to(self.device) for k, v in masks.items()}
        self.num_features = int(self.feat.shape[1])
        if graph_ptr is not None:
            self.kind = "minibatch"
            bs = self.options.get("graph_batch_size", 64)
            if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
                raise ValueError(f"engine.graph_batch_size: must be a positive integer, got {bs!r}")
            self.graph_batch_size = int(bs)
            self.seed = int(self.options.get("seed", 0))
            self._np_csr = (np.asarray(csr.indptr.cpu().numpy()), np.asarray(csr.indices.cpu().numpy()))
            self._graph_ptr = np.asarray(graph_ptr, dtype=np.int64)
            self._train_graphs = (self.masks["train"] & (self.label >= 0)).nonzero().squeeze(1).cpu()
        log.info("single engine: %s, %d nodes, %d edges, %d features, %d classes%s", self.source, n,
                 csr.num_edges, self.num_features, self.num_classes,
                 f", {self.graph.num_graphs} graphs (graph-level task)" if graph_ptr is not None else "")

    # -- graph-level datasets: one step per batch of graphs ---------------------------------------
    def iterations(self, epoch: int) -> int:
        """Steps of an epoch on a graph-level dataset: ceil(training graphs / graph_batch_size)."""
        return -(-int(self._train_graphs.numel()) // self.graph_batch_size)

    def batch_sizes(self, epoch: int, iterations: int) -> tuple[list[int], list[float]]:
        """Training graphs of every step (this process's and the global count, the same here)."""
        n, b = int(self._train_graphs.numel()), self.graph_batch_size
        mine = [max(0, min(b, n - it * b)) for it in range(iterations)]
        return mine, [float(m) for m in mine]

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if getattr(self, "_order_epoch", None) != epoch:
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + int(epoch)) & (2**63 - 1))
            self._order = self._train_graphs[torch.randperm(self._train_graphs.numel(), generator=gen)]
            self._order_epoch = epoch
        return self._order

    def batch(self, epoch: int, iteration: int) -> Batch:
        """Step ``iteration`` of ``epoch``: its graphs (ascending ids) as one block-diagonal graph."""
        b = self.graph_batch_size
        graphs = torch.sort(self._epoch_order(epoch)[iteration * b:(iteration + 1) * b]).values
        return self.graph_subset(graphs)

    def graph_subset(self, graphs: torch.Tensor) -> Batch:
        """The graphs ``graphs`` (int64[B] graph ids) as a :class:`Batch`: a ``WholeGraph`` of their nodes,
        renumbered in order, with its own ``graph_ptr``; their features, per-node fields and labels."""
        gp, (indptr, indices) = self._graph_ptr, self._np_csr
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
        csr = CSR(torch.from_numpy(sub_ptr), torch.from_numpy(sub_idx), int(nodes.shape[0]), validate=False)
        et = self.graph.edge_type
        sub = WholeGraph(csr.to(self.device), None if et is None else np.asarray(et)[take], "id", new_ptr)
        idx = torch.from_numpy(nodes).to(self.device)
        for name, t in self.graph.node_fields.items():
            sub.node_fields[name] = t[idx]
        seeds = torch.from_numpy(g).to(self.device)
        return Batch(sub, self.feat.index_select(0, idx), self.label[seeds], seeds)

    # -- the cluster-sparse layout of the graph transformers' sparse attention --------------------
    def _set_clusters(self) -> None:
        from hpc_graph.graph.attention_pattern import engine_attention_options

        self.graph.clusters, self.graph.chain = engine_attention_options(self.options)
        self.graph.cluster_size = self.graph.clusters.cluster_size

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        self.graph.clusters.end_epoch(epoch, loss, seconds)

    def stats(self) -> dict:
        out = super().stats()
        if self.graph.clusters.enabled:
            out.update(self.graph.clusters.stats())
        return out

    def state_dict(self) -> dict:
        return {"clusters": self.graph.clusters.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.graph.clusters.load_state_dict(state.get("clusters") or {})
