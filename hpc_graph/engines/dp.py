"""``dp`` engine: full-batch domain-parallel training with halo exchange.

Each rank holds one partition (``source`` = partition directory, part
``comm.rank``). Before every aggregation the rows of halo nodes are fetched
from their owners (only from peers that share a halo); the aggregation is then
one sparse product over ``[owned | halo]`` columns. The backward pass sends the
halo rows' gradients back to their owners, which sum them. This is the
baseline SAR and Sylvie are measured against: per-rank memory holds all halo
rows of every layer until the backward pass.

On a graph-level dataset file (``/graphs/ptr``: many small graphs, one label
each) ``dp`` is data parallel over batches of whole graphs instead
(:class:`GraphDPEngine`; :func:`hpc_graph.engines.create_engine` picks it).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from hpc_graph.engines.base import Batch, Engine
from hpc_graph.engines.graph_batches import GraphBatches, GraphBatchOptions, is_graph_level, share
from hpc_graph.graph.dist_graph import load_dist_graph, partition_tensors
from hpc_graph.graph.halo_graph import HaloGraph, partition_model_problem

log = logging.getLogger(__name__)


class DPEngine(Engine):
    """Domain-parallel engine (see module docstring). ``source``: a partition directory.

    Options: ``graph_batch_size``, used on a graph-level dataset file only (:class:`GraphDPEngine`).
    ``graph.dg`` is the rank's :class:`DistGraph`.
    """

    name = "dp"
    shared_rng = True
    summary = "full-batch domain parallel: halo rows exchanged forward, their gradients returned backward."
    graph_level = True
    exact = True
    Options = GraphBatchOptions

    @classmethod
    def for_source(cls, source: str | None) -> type[Engine]:
        return GraphDPEngine if is_graph_level(source) else cls

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        return partition_model_problem(model, mc)

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """The part file's int64 columns, alive while the partition makes its int32 copy."""
        return max(int(rank.edges) * 8, cls._read_as_float32_extra(graph, rank.owned, dtype))

    @classmethod
    def plan_graph(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                   options: dict[str, Any]) -> HaloGraph:
        return HaloGraph(cls._shape_partition(graph, rank, ranks, dtype), comm)

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        dg, part = load_dist_graph(self.source, comm, self.device, dtype)
        data = partition_tensors(part, self.device, dtype, self.source)
        del part
        self.graph = HaloGraph(dg, comm)
        self.feat, self.label, self.masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self.reset_stats()  # loading exchanged halo ids: count training traffic only

    def check_model(self, model: torch.nn.Module) -> None:
        self._check_attention_pattern(model)


class GraphDPEngine(Engine):
    """``dp`` on a graph-level dataset file: data parallel over batches of whole graphs.

    Every rank reads the whole file (graph-level datasets are many small graphs). Each optimiser step's
    batch of ``graph_batch_size`` graphs is the one ``single`` draws (same seed, same order); rank ``r``
    of ``P`` trains on the ``r``-th of ``P`` near-equal consecutive slices of it, and the trainer divides
    every rank's summed loss by the step's global count and all-reduces the gradients, so a step on
    ``P`` ranks is ``single``'s step on the whole batch (equal up to the order of floating-point sums).
    For evaluation rank ``r`` holds the ``r``-th of ``P`` near-equal consecutive blocks of all graphs:
    ``graph`` (a block-diagonal :class:`~hpc_graph.graph.whole_graph.WholeGraph` of them), ``feat``,
    ``label`` and ``masks`` are that block's (per graph), and the trainer adds up the ranks' counts.

    Options: ``graph_batch_size`` (graphs per step over all ranks), ``feature_norm`` (``row``: every node's
    features divided by their sum), ``seed``. Raises ``FormatError``
    for a file without ``/graphs/ptr`` and ``ValueError`` when there are fewer graphs than ranks.
    """

    name = "dp"
    kind = "sampled"
    data_source = "file"
    graph_level = True
    Options = GraphBatchOptions

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        rank, size = int(comm.rank), int(comm.size)
        with open_dataset(self.source) as ds:
            if not ds.has("graph_ptr"):
                raise FormatError(self.source, "/graphs/ptr", "missing: engine 'dp' on a dataset file trains on "
                                  "batches of graphs (partition a node-level dataset: hpc-graph partition)")
            if not ds.has("feat"):
                raise FormatError(self.source, "/node/feat", "missing (training needs node features)")
            n = ds.num_nodes
            indptr, indices = ds.indptr(), ds.indices()
            edge_type = ds.edge_type()
            lap_pe = ds.lap_pe() if ds.has("lap_pe") else None
            feat = ds.feat_rows(0, n)
            graph_ptr = ds.graph_ptr()
            label = ds.graph_label()
            masks = {name: ds.graph_mask(f"{name}_mask") for name in ("train", "val", "test")}
            self.num_classes = int(ds.num_classes) or int(label.max()) + 1
        num_graphs = int(graph_ptr.shape[0]) - 1
        if num_graphs < size:
            raise ValueError(f"{self.source}: {num_graphs} graph(s) cannot be shared by {size} ranks of engine 'dp' "
                             "(every rank evaluates a block of graphs): use fewer ranks")
        fields = {} if lap_pe is None else {"lap_pe": torch.from_numpy(lap_pe).to(device=self.device, dtype=dtype)}
        all_feat = torch.from_numpy(feat).to(device=self.device, dtype=dtype)
        all_label = torch.from_numpy(np.asarray(label, dtype=np.int64)).to(self.device)
        all_masks = {k: torch.from_numpy(np.asarray(v, dtype=bool)).to(self.device) for k, v in masks.items()}
        self.graphs = GraphBatches(indptr, indices.astype(np.int64, copy=False), graph_ptr, all_feat, all_label,
                                   all_masks["train"], self.options.get("graph_batch_size", 64),
                                   int(self.options.get("seed", 0)), fields, edge_type, rank=rank, size=size,
                                   feature_norm=str(self.options.get("feature_norm", "none")))
        block = torch.arange(*share(num_graphs, rank, size), dtype=torch.int64)
        own = self.graphs.subset(block)  # this rank's graphs for evaluation
        self.graph, self.feat, self.label = own.graph, own.feat, own.label
        self.masks = {k: m[block.to(m.device)] for k, m in all_masks.items()}
        self.num_features = int(self.feat.shape[1])
        log.info("dp engine (graph-level): %s, %d graphs, %d nodes, %d features, %d classes; rank %d evaluates "
                 "graphs %d..%d, trains on its share of every batch of %d", self.source, num_graphs, n,
                 self.num_features, self.num_classes, rank, int(block[0]), int(block[-1]),
                 self.graphs.batch_size)

    def iterations(self, epoch: int) -> int:
        """Steps of an epoch: ceil(training graphs / graph_batch_size), the same on every rank."""
        return self.graphs.iterations(epoch)

    def batch_sizes(self, epoch: int, iterations: int) -> tuple[list[int], list[float]]:
        """Per step: this rank's graphs and the step's graphs over all ranks."""
        return self.graphs.batch_sizes(epoch, iterations)

    def batch(self, epoch: int, iteration: int) -> Batch:
        """This rank's share of step ``iteration`` of ``epoch`` (possibly no graph: a step smaller than the
        number of ranks)."""
        return self.graphs.batch(epoch, iteration)
