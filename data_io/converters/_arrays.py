"""A :class:`~data_io.dataset.GraphData` from in-memory arrays: what the converters of in-memory graph objects
(PyTorch Geometric's ``Data``, DGL's ``DGLGraph``) share once they have read their object's fields."""
from __future__ import annotations

from typing import Any

import numpy as np

from data_io.converters._csr import build_csr, index_dtype, is_symmetric
from data_io.dataset import MASKS, GraphData
from data_io.errors import FormatError


def as_numpy(t: Any) -> np.ndarray:
    """A NumPy array of a tensor (any device) or array-like."""
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def graph_from_arrays(source: str, num_nodes: int, src: Any, dst: Any, *, feat: Any = None, label: Any = None,
                      masks: dict[str, Any] | None = None, edge_weight: Any = None, edge_type: Any = None,
                      name: str = "graph", num_classes: int | None = None,
                      names: dict[str, str] | None = None) -> GraphData:
    """Check and assemble the fields of a graph held in memory; edges kept as given (no symmetrisation or
    de-duplication), grouped by destination in a stable order.

    Args:
        source: what the arrays came from, for the error messages (``"<torch_geometric Data>"``).
        num_nodes: N; src, dst: integer [E] node ids of each edge ``src -> dst``.
        feat: [N, F] (stored float32); label: integer [N] or [N, 1]; masks: ``{train_mask: bool [N], ...}``;
        edge_weight: float [E] or [E, 1]; edge_type: integer [E] in ``[0, 32767]``.
        names: the object's own name of each field, for the messages (``{"src": "edge_index", ...}``).
    Raises:
        FormatError: naming the field (by the object's name for it) whose shape, dtype or values are wrong.
    """
    names = names or {}

    def bad(field: str, msg: str) -> FormatError:
        return FormatError(source, names.get(field, field), msg)

    n = int(num_nodes)
    if n <= 0:
        raise bad("num_nodes", "empty graph (0 nodes)")
    src, dst = as_numpy(src), as_numpy(dst)
    for field, a in (("src", src), ("dst", dst)):
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise bad(field, f"expected an integer array of shape (E,), got {a.dtype} {a.shape}")
    if src.shape != dst.shape:
        raise bad("dst", f"expected {src.shape[0]} destinations (one per source), got {dst.shape[0]}")
    src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
    e = int(src.shape[0])
    for field, a in (("src", src), ("dst", dst)):
        if e and (a.min() < 0 or a.max() >= n):
            raise bad(field, f"node ids {a.min()}..{a.max()} outside [0, {n})")
    if feat is not None:
        feat = as_numpy(feat)
        if feat.ndim != 2 or feat.shape[0] != n:
            raise bad("feat", f"expected shape ({n}, F), got {feat.shape}")
        feat = feat.astype(np.float32, copy=False)
    if label is not None:
        label = as_numpy(label)
        if label.ndim == 2 and label.shape[1] == 1:
            label = label[:, 0]
        if label.shape != (n,) or not np.issubdtype(label.dtype, np.integer):
            raise bad("label", f"expected integer class ids of shape ({n},), got {label.dtype} {label.shape}")
        label = label.astype(np.int64, copy=False)
    checked = {}
    for m, v in (masks or {}).items():
        v = as_numpy(v)
        if v.shape != (n,) or v.dtype != np.bool_:
            raise bad(m, f"expected bool of shape ({n},), got {v.dtype} {v.shape}")
        checked[m] = v
    if edge_weight is not None:
        edge_weight = as_numpy(edge_weight)
        if edge_weight.ndim == 2 and edge_weight.shape[1] == 1:
            edge_weight = edge_weight[:, 0]
        if edge_weight.shape != (e,) or not np.issubdtype(edge_weight.dtype, np.number):
            raise bad("edge_weight", f"expected numbers of shape ({e},), got {edge_weight.dtype} {edge_weight.shape}")
        edge_weight = edge_weight.astype(np.float32)
    if edge_type is not None:
        edge_type = as_numpy(edge_type)
        if edge_type.shape != (e,) or not np.issubdtype(edge_type.dtype, np.integer):
            raise bad("edge_type", f"expected integer types of shape ({e},), got {edge_type.dtype} {edge_type.shape}")
        if e and (edge_type.min() < 0 or edge_type.max() > np.iinfo(np.int16).max):
            raise bad("edge_type", f"types {edge_type.min()}..{edge_type.max()} outside [0, 32767]")
    if num_classes is None:
        num_classes = int(label.max()) + 1 if label is not None and label.size and label.max() >= 0 else 0
    if edge_type is None:
        indptr, indices, edge_weight = build_csr(src, dst, n, edge_weight)
    else:  # the types follow the edges: one stable sort by (destination, source) for every per-edge array
        order = np.lexsort((src, dst))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
        indices = src[order].astype(index_dtype(n))
        edge_weight = None if edge_weight is None else edge_weight[order]
        edge_type = edge_type[order].astype(np.int16)
    graph = GraphData(indptr=indptr, indices=indices, feat=feat, label=label, edge_weight=edge_weight,
                      edge_type=edge_type, name=name, num_classes=int(num_classes),
                      directed=not is_symmetric(indptr, indices), **checked)
    graph.validate(source)
    return graph


def graph_fields(graph: GraphData) -> dict[str, np.ndarray]:
    """The per-node and per-edge arrays a graph has, under the dataset's names (``feat`` float32, ``label``
    int64, the masks, ``edge_weight`` float32, ``edge_type`` int64), plus ``src``/``dst`` int64[E] in the CSR's
    order: what the converters to in-memory graph objects write into their object."""
    src, dst = graph.edge_sources_destinations()
    out = {"src": src, "dst": dst}
    if graph.feat is not None:
        out["feat"] = np.asarray(graph.feat, dtype=np.float32)
    if graph.label is not None:
        out["label"] = np.asarray(graph.label, dtype=np.int64)
    for m in MASKS:
        if getattr(graph, m) is not None:
            out[m] = np.asarray(getattr(graph, m), dtype=bool)
    if graph.edge_weight is not None:
        out["edge_weight"] = np.asarray(graph.edge_weight, dtype=np.float32)
    if graph.edge_type is not None:
        out["edge_type"] = np.asarray(graph.edge_type, dtype=np.int64)
    return out
