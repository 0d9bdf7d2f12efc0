"""Convert a PyTorch Geometric ``Data`` object to :class:`~data_io.dataset.GraphData`.

torch and torch_geometric are imported inside :func:`from_pyg` only, so that
``data_io`` works without them.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from data_io.converters._arrays import as_numpy, graph_fields, graph_from_arrays
from data_io.dataset import MASKS, GraphData
from data_io.errors import FormatError

log = logging.getLogger(__name__)

_SOURCE = "<torch_geometric Data>"


def from_pyg(data: Any, name: str = "graph", num_classes: int | None = None) -> GraphData:
    """Convert a homogeneous ``torch_geometric.data.Data`` to a :class:`GraphData`.

    Reads ``edge_index`` long[2, E] (row 0 source, row 1 destination),
    ``x`` [N, F] (stored as float32), ``y`` int [N] (or [N, 1]),
    ``train_mask``/``val_mask``/``test_mask`` bool [N], a per-edge weight
    from ``edge_weight`` [E] or a one-column ``edge_attr`` ([E] or [E, 1]) and
    relation types from ``edge_type`` int [E] (R-GCN's datasets).
    Edges are kept as given (no symmetrisation or de-duplication).

    Args:
        data: the ``Data`` object (tensors on any device).
        name: dataset name.
        num_classes: number of classes; default ``max(y) + 1``.

    Raises:
        ImportError: torch_geometric is not installed.
        TypeError: ``data`` is not a ``torch_geometric.data.Data``.
        FormatError: a field has the wrong shape or dtype (names the field).
    """
    try:
        from torch_geometric.data import Data
    except ImportError as exc:
        raise ImportError("data_io.converters.from_pyg needs torch_geometric "
                          "(pip install torch_geometric)") from exc
    if not isinstance(data, Data):
        raise TypeError(f"from_pyg expects a torch_geometric.data.Data, got {type(data).__name__}")
    if data.edge_index is None:
        raise FormatError(_SOURCE, "edge_index", "missing")
    ei = as_numpy(data.edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise FormatError(_SOURCE, "edge_index", f"expected an integer array of shape (2, E), got {ei.dtype} "
                                                 f"{ei.shape}")
    weight = None
    for field in ("edge_weight", "edge_attr"):
        v = getattr(data, field, None)
        if v is None:
            continue
        v = as_numpy(v)
        if field == "edge_attr" and v.shape not in ((ei.shape[1],), (ei.shape[1], 1)):
            log.warning("from_pyg: edge_attr of shape %s is not a per-edge weight: ignored", v.shape)
            continue
        weight = v
        break
    return graph_from_arrays(
        _SOURCE, int(data.num_nodes) if data.num_nodes is not None else 0, ei[0], ei[1], feat=data.x, label=data.y,
        masks={m: getattr(data, m) for m in MASKS if getattr(data, m, None) is not None}, edge_weight=weight,
        edge_type=getattr(data, "edge_type", None), name=name, num_classes=num_classes,
        names={"src": "edge_index", "dst": "edge_index", "feat": "x", "label": "y",
               "edge_weight": "edge_weight" if getattr(data, "edge_weight", None) is not None else "edge_attr"})


def to_pyg(graph: GraphData) -> Any:
    """A :class:`GraphData` (e.g. ``open_dataset(path).load()``) as a ``torch_geometric.data.Data``.

    ``edge_index`` long[2, E] (row 0 source, row 1 destination) in the CSR's order (grouped by destination),
    ``x`` float32[N, F], ``y`` long[N], the masks bool[N], ``edge_weight`` float32[E] and ``edge_type`` long[E]
    when the graph has them, ``num_nodes`` N. :func:`from_pyg` of the result gives ``graph`` back.

    Raises:
        ImportError: torch_geometric is not installed.
    """
    try:
        import torch
        from torch_geometric.data import Data
    except ImportError as exc:
        raise ImportError("data_io.converters.to_pyg needs torch_geometric (pip install torch_geometric)") from exc
    a = graph_fields(graph)
    rename = {"feat": "x", "label": "y"}
    fields: dict[str, Any] = {"edge_index": torch.from_numpy(np.stack([a.pop("src"), a.pop("dst")])),
                              "num_nodes": graph.num_nodes}
    fields.update({rename.get(k, k): torch.from_numpy(v) for k, v in a.items()})
    return Data(**fields)
