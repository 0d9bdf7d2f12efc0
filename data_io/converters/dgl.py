"""Convert between a DGL graph (``dgl.DGLGraph``, homogeneous) and :class:`~data_io.dataset.GraphData`.

dgl is imported inside :func:`to_dgl` only; :func:`from_dgl` reads any object with DGL's graph interface
(``num_nodes()``, ``edges(order="eid")``, ``ndata``, ``edata``), so ``data_io`` works without dgl.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from data_io.converters._arrays import graph_fields, graph_from_arrays
from data_io.dataset import MASKS, GraphData

_SOURCE = "<DGLGraph>"
ETYPE_KEYS = ("etype", "_TYPE")  # a graph's own edge types; what dgl.to_homogeneous writes (dgl.ETYPE)


def from_dgl(g: Any, name: str = "graph", num_classes: int | None = None, *, feat: str = "feat",
             label: str = "label", weight: str = "weight") -> GraphData:
    """Convert a homogeneous DGL graph to a :class:`GraphData`.

    Reads the edges ``g.edges(order="eid")`` (source, destination), ``g.ndata[feat]`` [N, F] (stored float32),
    ``g.ndata[label]`` int [N], ``g.ndata["train_mask"|"val_mask"|"test_mask"]`` bool [N] (DGL's built-in
    datasets use these names), ``g.edata[weight]`` [E] or [E, 1] and the edge types ``g.edata["etype"]`` (or
    ``g.edata[dgl.ETYPE]``, which ``dgl.to_homogeneous`` writes). Edges are kept as given.

    Args:
        g: the graph (tensors on any device).
        name: dataset name; num_classes: default ``max(label) + 1``.
        feat, label, weight: the ``ndata``/``edata`` keys of the features, labels and edge weights.
    Raises:
        TypeError: ``g`` does not have DGL's graph interface.
        ValueError: ``g`` has several node or edge types (convert it with ``dgl.to_homogeneous`` first).
        FormatError: a field has the wrong shape or dtype (names it as ``ndata[...]``/``edata[...]``).
    """
    if not all(hasattr(g, a) for a in ("num_nodes", "edges", "ndata", "edata")):
        raise TypeError(f"from_dgl expects a dgl.DGLGraph, got {type(g).__name__}")
    if not getattr(g, "is_homogeneous", True):
        raise ValueError("from_dgl: the graph has several node or edge types; convert it with dgl.to_homogeneous "
                         "(its edge types become /graph/edge_type)")
    src, dst = g.edges(order="eid")
    ndata, edata = g.ndata, g.edata
    etype_key = next((k for k in ETYPE_KEYS if k in edata), None)
    names = {"src": "edges()", "dst": "edges()", "feat": f"ndata[{feat!r}]", "label": f"ndata[{label!r}]",
             "edge_weight": f"edata[{weight!r}]", "edge_type": f"edata[{etype_key!r}]"}
    names.update({m: f"ndata[{m!r}]" for m in MASKS})
    return graph_from_arrays(
        _SOURCE, int(g.num_nodes()), src, dst, feat=ndata[feat] if feat in ndata else None,
        label=ndata[label] if label in ndata else None, masks={m: ndata[m] for m in MASKS if m in ndata},
        edge_weight=edata[weight] if weight in edata else None,
        edge_type=edata[etype_key] if etype_key is not None else None, name=name, num_classes=num_classes,
        names=names)


def to_dgl(graph: GraphData) -> Any:
    """A :class:`GraphData` (e.g. ``open_dataset(path).load()``) as a ``dgl.DGLGraph``: the edges in the CSR's
    order (grouped by destination), ``ndata["feat"]`` float32[N, F], ``ndata["label"]`` int64[N], the masks
    bool[N], ``edata["weight"]`` float32[E] and ``edata["etype"]`` int64[E] when the graph has them.
    :func:`from_dgl` of the result gives ``graph`` back.

    Raises:
        ImportError: dgl is not installed.
    """
    try:
        import dgl
        import torch
    except ImportError as exc:
        raise ImportError("data_io.converters.to_dgl needs dgl (see dgl.ai for the wheel matching your torch)") from exc
    a = graph_fields(graph)
    g = dgl.graph((torch.from_numpy(a.pop("src")), torch.from_numpy(a.pop("dst"))), num_nodes=graph.num_nodes)
    rename = {"edge_weight": "weight", "edge_type": "etype"}
    for key, values in a.items():
        target = g.edata if key.startswith("edge_") else g.ndata
        target[rename.get(key, key)] = torch.from_numpy(np.ascontiguousarray(values))
    return g
