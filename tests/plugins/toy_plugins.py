"""A toy engine and a toy model defined outside the package, as a third-party package would define them.

``ToyEngine`` ("toy"): one process, the whole graph, aggregation by ``index_add`` over the edge list (no kernel of
the suite), one option of its own, and a plan of its own (``plan_graph``: its graph context from sizes alone, on
which ``hpc-graph plan`` runs the training step). ``TOY_MODEL`` ("toymean"): two mean-aggregation layers with
a ReLU between them, built from the config's ``model.hidden``. They reach the suite through its registries only:
:func:`hpc_graph.engines.register_engine` / :func:`hpc_graph.nn.models.register_model` in-process, or the
``hpc_graph.engines`` / ``hpc_graph.models`` entry-point groups (tests/train/test_plugins.py installs a
dist-info for them).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from data_io.dataset import open_dataset
from hpc_graph.engines.base import Engine
from hpc_graph.graph.base import GraphContext
from hpc_graph.nn.models import ModelSpec
from hpc_graph.options import int_spec, option

log = logging.getLogger(__name__)


class ToyGraph(GraphContext):
    """The whole graph as an edge list (``row``, ``col``: int64[E], destination and source of each in-edge):
    ``aggregate`` is one ``index_add`` of the gathered source rows."""

    def __init__(self, row: torch.Tensor, col: torch.Tensor, deg: torch.Tensor, log_every: int = 0):
        self.num_nodes = self.global_num_nodes = int(deg.shape[0])
        self.log_every, self.calls = log_every, 0
        self.row, self.col, self._deg = row, col, deg

    @classmethod
    def from_csr(cls, indptr: np.ndarray, indices: np.ndarray, log_every: int = 0) -> "ToyGraph":
        deg = np.diff(indptr).astype(np.int64)
        row = np.repeat(np.arange(len(deg), dtype=np.int64), deg)
        return cls(torch.from_numpy(row), torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(deg),
                   log_every)

    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        out = x.new_zeros((self.num_nodes, x.shape[1])).index_add_(0, self.row, x.index_select(0, self.col))
        if reduce == "mean":
            out = out / self._deg.clamp(min=1).to(x.dtype)[:, None]
        self.calls += 1
        if self.log_every and self.calls % self.log_every == 0:
            if not out.is_meta:
                log.info("toy: aggregation %d, norm %.4g", self.calls, float(out.detach().norm()))
        return out

    def gat(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise NotImplementedError("the toy engine has no attention")

    def in_degree(self) -> torch.Tensor:
        return self._deg

    def global_ids(self) -> torch.Tensor:
        return torch.arange(self.num_nodes)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t


@dataclasses.dataclass
class ToyOptions:
    """The toy engine's one option."""
    toy_log_every: int = option(0, int_spec(0), "Log the aggregated rows' norm every this many aggregations "
                                "(0: never).", section="engine")


class ToyEngine(Engine):
    """One process, whole graph, aggregation through torch's sparse matrix product."""

    name = "toy"
    summary = "a toy engine defined outside the package (tests/plugins)."
    kind = "full"
    data_source = "file"
    max_ranks = 1
    Options = ToyOptions

    @classmethod
    def plan_graph(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                   options: dict[str, Any]) -> ToyGraph:
        """What :meth:`__init__` builds, from the sizes alone (``graph.nodes``, ``graph.edges``) on ``meta``."""
        def ids(k: int) -> torch.Tensor:
            return torch.empty(k, dtype=torch.int64, device="meta")

        return ToyGraph(ids(graph.edges), ids(graph.edges), ids(graph.nodes))

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        with open_dataset(self.source) as ds:
            n = ds.num_nodes
            indptr, indices = ds.indptr(), ds.indices()
            feat = ds.feat_rows(0, n)
            label, masks = ds.node_labels(), ds.split_masks()
            self.num_classes = int(ds.num_classes) or int(label.max()) + 1
        self.graph = ToyGraph.from_csr(indptr, indices, self.opts.toy_log_every)
        self.feat = torch.from_numpy(feat).to(dtype)
        self.label = torch.from_numpy(np.asarray(label, dtype=np.int64))
        self.masks = {k: torch.from_numpy(np.asarray(v, dtype=bool)) for k, v in masks.items()}
        self.num_features = int(self.feat.shape[1])


class ToyMean(nn.Module):
    """``out = W2 mean(relu(W1 mean(x)))``: two mean aggregations, each followed by a linear map."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.lin1 = nn.Linear(in_dim, hidden)
        self.lin2 = nn.Linear(hidden, out_dim)
        self.message_passing_layers = 2

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        if x.layout != torch.strided:  # the trainer hands sparse features over as CSR (data.feature_layout)
            x = x.to_dense()
        h = torch.relu(self.lin1(graph.aggregate(x, "mean")))
        return self.lin2(graph.aggregate(h, "mean"))


def _build(in_dim: int, out_dim: int, mc: Any) -> nn.Module:
    return ToyMean(in_dim, mc.hidden, out_dim)


TOY_MODEL = ModelSpec("toymean", sampled=False, build=_build, layers=lambda mc: 2)
