"""``single`` engine: one process holds the whole graph; the reference every other engine must match.

``source`` is a dataset file (``hpc-graph generate|convert``). Aggregation is
one call of :func:`hpc_graph.ops.spmm.spmm` over the whole CSR (:class:`~hpc_graph.graph.whole_graph.WholeGraph`; for
the edge types of a typed graph, over its relation-expanded CSR); GAT attention
one call of :func:`hpc_graph.ops.gat_attention.gat_attention` over the CSR with
a self loop appended to every row. There is no communication.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from hpc_graph.engines.base import Batch, Engine
from hpc_graph.engines.graph_batches import GraphBatches, GraphBatchOptions, is_graph_level
from hpc_graph.graph.attention_pattern import SequenceOptions
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.ops.csr import CSR, column_dtype

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SingleOptions(SequenceOptions, GraphBatchOptions):
    """``single``: the graph transformers' sequence options and the graph-level batch size."""


class SingleEngine(Engine):
    """The whole dataset in one process (see module docstring). ``source``: a dataset file.

    ``label`` holds -1 for unlabelled nodes; a missing mask is all False. A graph-level dataset
    (``/graphs/ptr``): ``label`` and ``masks`` are per graph and ``graph.num_graphs`` > 0; the engine
    is then a :class:`GraphLevelSingleEngine`, of ``kind = "sampled"``: every epoch shuffles the training graphs
    (seeded by ``seed`` and the epoch) and each step trains on ``graph_batch_size`` of them (:meth:`batch`, a
    block-diagonal graph of its own); evaluation runs on ``graph``, all graphs at once.
    Options: ``sequence_order`` (graph transformers: ``id``, ``rcm`` or ``metis``, see
    :func:`~hpc_graph.graph.attention_pattern.sequence_order`); ``cluster_beta``, ``cluster_size``,
    ``tuner_window`` (the cluster-sparse layout of sparse attention and its tuner,
    :class:`~hpc_graph.graph.attention_pattern.ClusterLayoutControl`); ``attention_chain`` (the pattern's
    chain through the sequence; off, the pattern is the one ``dp``/``sar`` attend over);
    ``graph_batch_size`` and ``feature_norm`` (graph-level data: the batches' features, normalised as the trainer
    normalises ``feat``; on one graph the trainer does it); any other option is an error.
    Raises ``ValueError`` when ``comm`` has more than one rank.
    """

    name = "single"
    summary = "one process, whole graph; the reference every other engine matches."
    kind = "full"
    data_source = "file"
    max_ranks = 1
    exact = True
    graph_level = True
    cotraining = True
    Options = SingleOptions

    @classmethod
    def for_source(cls, source: str | None) -> type[Engine]:
        return GraphLevelSingleEngine if cls is SingleEngine and is_graph_level(source) else cls

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """int64 column indices in the file are read, then made int32 (both alive for a moment)."""
        disk = int(getattr(graph, "disk_index_bytes", 4))
        return max(int(graph.edges) * disk if disk != 4 else 0, cls._read_as_float32_extra(graph, graph.nodes, dtype))

    @classmethod
    def plan_graph(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                   options: dict[str, Any]) -> WholeGraph:
        from hpc_graph.graph.attention_pattern import engine_attention_options

        opts = cls.parse_options({k: v for k, v in options.items() if k not in ("seed", "feature_norm")})
        g = WholeGraph(CSR.of_shape(graph.nodes, graph.nodes, graph.edges, symmetric=not graph.directed),
                       None, opts.sequence_order)
        g.clusters, g.chain = engine_attention_options(dataclasses.asdict(opts))
        if getattr(graph, "lap_pe", 0):  # the dataset's positional encodings, loaded beside the graph
            g.node_fields["lap_pe"] = torch.empty((graph.nodes, graph.lap_pe), dtype=dtype, device="meta")
        return g

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
            csr = CSR(ds.indptr(), ds.indices().astype(column_dtype(n), copy=False), n, ds.edge_weight(),
                      validate=False)
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
            self.kind = "sampled"  # constructed directly as SingleEngine (the registry gives GraphLevelSingleEngine)
            self.graphs = GraphBatches(csr.indptr.cpu().numpy(), csr.indices.cpu().numpy(), graph_ptr, self.feat,
                                       self.label, self.masks["train"], self.options.get("graph_batch_size", 64),
                                       int(self.options.get("seed", 0)), self.graph.node_fields, edge_type,
                                       feature_norm=str(self.options.get("feature_norm", "none")))
        log.info("single engine: %s, %d nodes, %d edges, %d features, %d classes%s", self.source, n,
                 csr.num_edges, self.num_features, self.num_classes,
                 f", {self.graph.num_graphs} graphs (graph-level task)" if graph_ptr is not None else "")

    # -- graph-level datasets: one step per batch of graphs (hpc_graph.engines.graph_batches) ---------
    def iterations(self, epoch: int) -> int:
        """Steps of an epoch on a graph-level dataset: ceil(training graphs / graph_batch_size)."""
        return self.graphs.iterations(epoch)

    def batch_sizes(self, epoch: int, iterations: int) -> tuple[list[int], list[float]]:
        """Training graphs of every step (this process's and the global count, the same here)."""
        return self.graphs.batch_sizes(epoch, iterations)

    def batch(self, epoch: int, iteration: int) -> Batch:
        """Step ``iteration`` of ``epoch``: its graphs (ascending ids) as one block-diagonal graph."""
        return self.graphs.batch(epoch, iteration)

    def graph_subset(self, graphs: torch.Tensor) -> Batch:
        """The graphs ``graphs`` (int64[B] graph ids) as a :class:`Batch` (see :meth:`GraphBatches.subset`)."""
        return self.graphs.subset(graphs)

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


class GraphLevelSingleEngine(SingleEngine):
    """``single`` on a graph-level dataset (``/graphs/ptr``): every epoch is a sequence of steps, one per batch of
    ``graph_batch_size`` training graphs (the sampled loop's protocol: :meth:`iterations`, :meth:`batch_sizes`,
    :meth:`batch`)."""

    kind = "sampled"
