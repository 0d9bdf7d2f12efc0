"""``dp`` engine: full-batch domain-parallel training with halo exchange.

Each rank holds one partition (``source`` = partition directory, part
``comm.rank``). Before every aggregation the rows of halo nodes are fetched
from their owners (only from peers that share a halo); the aggregation is then
one sparse product over ``[owned | halo]`` columns. The backward pass sends the
halo rows' gradients back to their owners, which sum them. This is the
baseline SAR and Sylvie are measured against: per-rank memory holds all halo
rows of every layer until the backward pass.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from hpc_graph.engines.base import Engine
from hpc_graph.graph.dist_graph import load_dist_graph, partition_tensors
from hpc_graph.graph.halo_graph import HaloGraph

log = logging.getLogger(__name__)


class DPEngine(Engine):
    """Domain-parallel engine (see module docstring). ``source``: a partition directory.

    Options: none. ``graph.dg`` is the rank's :class:`DistGraph`.
    """

    name = "dp"

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
