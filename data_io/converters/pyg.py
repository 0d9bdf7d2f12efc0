"""Convert a PyTorch Geometric ``Data`` object to :class:`~data_io.dataset.GraphData`.

torch and torch_geometric are imported inside :func:`from_pyg` only, so that
``data_io`` works without them.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from data_io.converters._csr import build_csr, is_symmetric
from data_io.dataset import MASKS, GraphData
from data_io.errors import FormatError

log = logging.getLogger(__name__)

_SOURCE = "<torch_geometric Data>"


def _numpy(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def from_pyg(data: Any, name: str = "graph", num_classes: int | None = None) -> GraphData:
    """Convert a homogeneous ``torch_geometric.data.Data`` to a :class:`GraphData`.

    Reads ``edge_index`` long[2, E] (row 0 source, row 1 destination),
    ``x`` [N, F] (stored as float32), ``y`` int [N] (or [N, 1]),
    ``train_mask``/``val_mask``/``test_mask`` bool [N], and a per-edge weight
    from ``edge_weight`` [E] or a one-column ``edge_attr`` ([E] or [E, 1]).
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

    def bad(field: str, msg: str) -> FormatError:
        return FormatError(_SOURCE, field, msg)

    if data.edge_index is None:
        raise bad("edge_index", "missing")
    ei = _numpy(data.edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise bad("edge_index", f"expected an integer array of shape (2, E), got {ei.dtype} {ei.shape}")
    ei = ei.astype(np.int64, copy=False)
    e = int(ei.shape[1])
    n = int(data.num_nodes) if data.num_nodes is not None else 0
    if n <= 0:
        raise bad("num_nodes", "empty graph (0 nodes)")
    if e and (ei.min() < 0 or ei.max() >= n):
        raise bad("edge_index", f"node ids {ei.min()}..{ei.max()} outside [0, {n})")

    feat = None
    if data.x is not None:
        feat = _numpy(data.x)
        if feat.ndim != 2 or feat.shape[0] != n:
            raise bad("x", f"expected shape ({n}, F), got {feat.shape}")
        feat = feat.astype(np.float32, copy=False)
    label = None
    if data.y is not None:
        label = _numpy(data.y)
        if label.ndim == 2 and label.shape[1] == 1:
            label = label[:, 0]
        if label.shape != (n,) or not np.issubdtype(label.dtype, np.integer):
            raise bad("y", f"expected integer class ids of shape ({n},), got {label.dtype} {label.shape}")
        label = label.astype(np.int64, copy=False)
    masks = {}
    for m in MASKS:
        v = getattr(data, m, None)
        if v is None:
            continue
        v = _numpy(v)
        if v.shape != (n,) or v.dtype != np.bool_:
            raise bad(m, f"expected bool of shape ({n},), got {v.dtype} {v.shape}")
        masks[m] = v
    weight = None
    for field in ("edge_weight", "edge_attr"):
        v = getattr(data, field, None)
        if v is None:
            continue
        v = _numpy(v)
        if v.ndim == 2 and v.shape[1] == 1:
            v = v[:, 0]
        if v.shape != (e,):
            if field == "edge_attr":
                log.warning("from_pyg: edge_attr of shape %s is not a per-edge weight: ignored", v.shape)
                continue
            raise bad(field, f"expected shape ({e},), got {v.shape}")
        weight = v.astype(np.float32)
        break
    if num_classes is None:
        num_classes = int(label.max()) + 1 if label is not None and label.size and label.max() >= 0 else 0
    indptr, indices, weight = build_csr(ei[0], ei[1], n, weight)
    graph = GraphData(indptr=indptr, indices=indices, feat=feat, label=label, edge_weight=weight,
                      name=name, num_classes=int(num_classes), directed=not is_symmetric(indptr, indices),
                      **masks)
    graph.validate(_SOURCE)
    return graph


def to_pyg(graph: GraphData) -> Any:
    """A :class:`GraphData` (e.g. ``open_dataset(path).load()``) as a ``torch_geometric.data.Data``.

    ``edge_index`` long[2, E] (row 0 source, row 1 destination) in the CSR's order (grouped by destination),
    ``x`` float32[N, F], ``y`` long[N], the masks bool[N], ``edge_weight`` float32[E] when the graph has weights,
    ``num_nodes`` N. :func:`from_pyg` of the result gives ``graph`` back.

    Raises:
        ImportError: torch_geometric is not installed.
    """
    try:
        import torch
        from torch_geometric.data import Data
    except ImportError as exc:
        raise ImportError("data_io.converters.to_pyg needs torch_geometric (pip install torch_geometric)") from exc
    src, dst = graph.edge_sources_destinations()
    fields: dict[str, Any] = {"edge_index": torch.from_numpy(np.stack([src, dst])), "num_nodes": graph.num_nodes}
    if graph.feat is not None:
        fields["x"] = torch.from_numpy(np.asarray(graph.feat, dtype=np.float32))
    if graph.label is not None:
        fields["y"] = torch.from_numpy(np.asarray(graph.label, dtype=np.int64))
    for m in MASKS:
        v = getattr(graph, m)
        if v is not None:
            fields[m] = torch.from_numpy(np.asarray(v, dtype=bool))
    if graph.edge_weight is not None:
        fields["edge_weight"] = torch.from_numpy(np.asarray(graph.edge_weight, dtype=np.float32))
    return Data(**fields)
