"""The hpc_graph dataset file (version 1): one HDF5 file per graph.

Layout (see ``docs/file-format.md``)::

    /                  attrs: format="hpc_graph.dataset", version=1, name, task,
                              num_nodes, num_edges, num_classes, directed
    /graph/indptr      int64[N+1]   CSR over destinations: row i lists the sources j of edges j->i
    /graph/indices     int32|int64[E]
    /graph/edge_weight float32[E]   optional
    /graph/edge_type   int16[E]     optional
    /node/feat         float32[N,F] optional, chunked by rows
    /node/label        int64[N]     optional; -1 marks an unlabelled node
    /node/train_mask, /node/val_mask, /node/test_mask  bool[N] optional
    /node/lap_pe       float32[N,k] optional (hpc-graph preprocess lap-pe)
    /node/text         variable-length UTF-8 string[N] optional (text-attributed graphs)

A graph-level dataset (``task="graph"``: many small graphs, one label each) stores them as one
block-diagonal graph (no edge joins two graphs) plus::

    /graphs/ptr        int64[G+1]   graph g is nodes ptr[g]:ptr[g+1] (every graph non-empty)
    /graphs/label      int64[G]     class of each graph (num_classes counts graph classes)
    /graphs/train_mask, /graphs/val_mask, /graphs/test_mask  bool[G] optional

Writers go through :func:`data_io.errors.atomic_output` (temporary name, then
rename). Readers check format, version, dtypes, shapes and index ranges and
name the file and field in every error.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from data_io.errors import DataError, FormatError, atomic_output, check_output
from data_io.integrity import DIGEST_ATTR, Digest, check_header, create_dataset, seal

log = logging.getLogger(__name__)

FORMAT = "hpc_graph.dataset"
VERSION = 1
MASKS = ("train_mask", "val_mask", "test_mask")
#: per-graph fields of a graph-level dataset (group ``/graphs``)
GRAPH_FIELDS = ("graph_ptr", "graph_label") + tuple(f"graph_{m}" for m in MASKS)
# rows of features read or written per step when streaming (bounded memory)
_CHUNK_BYTES = 64 << 20


def feat_chunk_shape(num_rows: int, feat_dim: int) -> tuple[int, int]:
    """HDF5 chunk shape for a row-chunked ``[num_rows, feat_dim]`` float32 array (~1 MiB)."""
    rows = max(1, min(num_rows, (1 << 20) // max(1, 4 * feat_dim)))
    return (rows, max(1, feat_dim))


def check_finite(rows: np.ndarray, source: Any, field: str, start: int = 0) -> None:
    """Raise :class:`FormatError` naming ``source``, ``field`` and the row range when ``rows`` (rows
    ``start..`` of the field) hold a NaN or an infinity; scanned in blocks (no full-size mask)."""
    n = rows.shape[0]
    if not n:
        return
    step = max(1, _CHUNK_BYTES // 4 // max(1, rows.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))))
    for s in range(0, n, step):
        block = rows[s:s + step]
        ok = np.isfinite(block)
        if not ok.all():
            first = start + s + int(np.flatnonzero(~ok.reshape(len(block), -1).all(axis=1))[0])
            raise FormatError(source, field, f"NaN or Inf in row {first} (first found among rows "
                                             f"[{start}, {start + n}) read): fix or regenerate the data")


@dataclasses.dataclass
class GraphData:
    """A whole graph in memory, as NumPy arrays.

    Shapes: ``indptr`` int64[N+1], ``indices`` int32/int64[E] (CSR over
    destinations: ``indices[indptr[i]:indptr[i+1]]`` are the sources of the
    edges into node ``i``), ``feat`` float32[N, F], ``label`` int64[N],
    masks bool[N], ``edge_weight`` float32[E], ``edge_type`` int16[E]; a
    graph-level dataset (``task="graph"``): ``graph_ptr`` int64[G+1],
    ``graph_label`` int64[G], ``graph_*_mask`` bool[G].
    """

    indptr: np.ndarray
    indices: np.ndarray
    feat: np.ndarray | None = None
    label: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    edge_weight: np.ndarray | None = None
    edge_type: np.ndarray | None = None
    name: str = "graph"
    num_classes: int = 0
    directed: bool = False
    task: str = "node"
    graph_ptr: np.ndarray | None = None
    graph_label: np.ndarray | None = None
    graph_train_mask: np.ndarray | None = None
    graph_val_mask: np.ndarray | None = None
    graph_test_mask: np.ndarray | None = None
    text: Any = None  # list[str] or object array [N]: each node's text (``/node/text``)

    @property
    def num_nodes(self) -> int:
        return int(len(self.indptr) - 1)

    @property
    def num_edges(self) -> int:
        return int(len(self.indices))

    @property
    def feat_dim(self) -> int:
        return 0 if self.feat is None else int(self.feat.shape[1])

    def validate(self, source: str = "<memory>") -> None:
        """Raise :class:`FormatError` naming ``source`` and the field on any inconsistency."""
        problems = _check_arrays(self.__dict__, source, self.num_classes)
        if problems:
            raise problems[0]

    def edge_sources_destinations(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(src, dst)`` int64[E] arrays of all edges in CSR order."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        return self.indices.astype(np.int64, copy=False), dst


def _check_arrays(a: dict[str, Any], source: str, num_classes: int,
                  check_values: bool = True) -> list[FormatError]:
    """Check dtypes, shapes and (optionally) value ranges of dataset arrays.

    ``a`` maps field names to arrays (NumPy or h5py datasets). Returns every
    problem found, in field order, as :class:`FormatError`.
    """
    out: list[FormatError] = []

    def bad(field: str, msg: str) -> None:
        out.append(FormatError(source, field, msg))

    indptr, indices = a.get("indptr"), a.get("indices")
    if indptr is None:
        bad("/graph/indptr", "missing")
        return out
    if indices is None:
        bad("/graph/indices", "missing")
        return out
    if indptr.ndim != 1 or indptr.shape[0] < 1:
        bad("/graph/indptr", f"expected a 1-D array of length N+1, got shape {indptr.shape}")
        return out
    if indptr.dtype != np.int64:
        bad("/graph/indptr", f"expected int64, got {indptr.dtype}")
    if indices.ndim != 1:
        bad("/graph/indices", f"expected a 1-D array, got shape {indices.shape}")
        return out
    if indices.dtype not in (np.int32, np.int64):
        bad("/graph/indices", f"expected int32 or int64, got {indices.dtype}")
    n = int(indptr.shape[0] - 1)
    e = int(indices.shape[0])
    if n == 0:
        bad("/graph/indptr", "empty graph (0 nodes)")
        return out
    if out:
        return out
    if check_values:
        ip = np.asarray(indptr[...])
        if ip[0] != 0:
            bad("/graph/indptr", f"indptr[0] must be 0, got {ip[0]}")
        if ip[-1] != e:
            bad("/graph/indptr", f"indptr[-1]={ip[-1]} does not match len(/graph/indices)={e}")
        d = np.diff(ip)
        if d.size and d.min() < 0:
            bad("/graph/indptr", f"not non-decreasing (first drop at row {int(np.argmax(d < 0))})")
        if e:
            lo, hi = _min_max(indices)
            if lo < 0:
                bad("/graph/indices", f"negative index {lo}")
            if hi >= n:
                bad("/graph/indices", f"index {hi} out of range [0, {n})")
    for field, path, dtype in (("edge_weight", "/graph/edge_weight", np.float32),
                               ("edge_type", "/graph/edge_type", np.int16)):
        arr = a.get(field)
        if arr is None:
            continue
        if arr.shape != (e,):
            bad(path, f"expected shape ({e},), got {arr.shape}")
        elif arr.dtype != dtype:
            bad(path, f"expected {np.dtype(dtype)}, got {arr.dtype}")
        elif check_values and field == "edge_weight" and e and not np.isfinite(_min_max(arr)).all():
            bad(path, "contains NaN or Inf")
        elif check_values and field == "edge_type" and e and _min_max(arr)[0] < 0:
            bad(path, "negative edge type")
    feat = a.get("feat")
    if feat is not None:
        if feat.ndim != 2 or feat.shape[0] != n:
            bad("/node/feat", f"expected shape ({n}, F), got {feat.shape}")
        elif feat.dtype != np.float32:
            bad("/node/feat", f"expected float32, got {feat.dtype}")
    label = a.get("label")
    if label is not None:
        if label.shape != (n,):
            bad("/node/label", f"expected shape ({n},), got {label.shape}")
        elif label.dtype != np.int64:
            bad("/node/label", f"expected int64, got {label.dtype}")
        elif check_values:
            lab = np.asarray(label[...])
            if lab.size and lab.min() < -1:
                bad("/node/label", f"label {lab.min()} < -1 (-1 marks an unlabelled node)")
            if lab.size and num_classes and lab.max() >= num_classes:
                bad("/node/label", f"label {lab.max()} >= num_classes={num_classes}")
    pe = a.get("lap_pe")
    if pe is not None:
        if pe.ndim != 2 or pe.shape[0] != n or pe.shape[1] < 1:
            bad("/node/lap_pe", f"expected shape ({n}, k) with k >= 1, got {pe.shape}")
        elif pe.dtype != np.float32:
            bad("/node/lap_pe", f"expected float32, got {pe.dtype}")
        elif check_values and not np.isfinite(np.asarray(pe[...])).all():
            bad("/node/lap_pe", "contains NaN or Inf")
    text = a.get("text")
    if text is not None:
        shape = getattr(text, "shape", (len(text),))
        if shape != (n,):
            bad("/node/text", f"expected one string per node, shape ({n},), got {shape}")
        elif isinstance(text, h5py.Dataset):
            info = h5py.check_string_dtype(text.dtype)
            if info is None or info.length is not None:
                bad("/node/text", f"expected variable-length UTF-8 strings, got {text.dtype}")
        elif check_values and not all(isinstance(t, str) for t in text):
            bad("/node/text", "expected str values")
    for m in MASKS:
        arr = a.get(m)
        if arr is None:
            continue
        if arr.shape != (n,):
            bad(f"/node/{m}", f"expected shape ({n},), got {arr.shape}")
        elif arr.dtype != np.bool_:
            bad(f"/node/{m}", f"expected bool, got {arr.dtype}")
    out += _check_graphs(a, source, num_classes, check_values, n)
    return out


def _check_graphs(a: dict[str, Any], source: str, num_classes: int, check_values: bool, n: int) -> list[FormatError]:
    """Problems of the ``/graphs/*`` fields of a graph-level dataset (none when absent and not required)."""
    out: list[FormatError] = []
    ptr = a.get("graph_ptr")
    task = a.get("task", "node")
    if ptr is None:
        if task == "graph":
            out.append(FormatError(source, "/graphs/ptr", "missing (task is 'graph')"))
        elif any(a.get(k) is not None for k in GRAPH_FIELDS):
            out.append(FormatError(source, "/graphs/ptr", "missing (other /graphs fields are present)"))
        return out
    if task != "graph":
        out.append(FormatError(source, "/@task", f"must be 'graph' in a file with /graphs/ptr, got {task!r}"))
        return out
    if ptr.ndim != 1 or ptr.shape[0] < 2 or ptr.dtype != np.int64:
        out.append(FormatError(source, "/graphs/ptr", f"expected int64[G+1] with G >= 1, got {ptr.dtype}{ptr.shape}"))
        return out
    g = int(ptr.shape[0] - 1)
    if check_values:
        p = np.asarray(ptr[...])
        if p[0] != 0 or p[-1] != n:
            out.append(FormatError(source, "/graphs/ptr", f"must run from 0 to num_nodes={n}, got {p[0]} .. {p[-1]}"))
            return out
        d = np.diff(p)
        if (d <= 0).any():
            out.append(FormatError(source, "/graphs/ptr", f"graph {int(np.argmax(d <= 0))} is empty "
                                                           "(offsets must increase)"))
            return out
        indptr, indices = a.get("indptr"), a.get("indices")
        if indptr is not None and indices is not None and indices.shape[0]:
            node_graph = np.repeat(np.arange(g, dtype=np.int64), d)
            ip = np.asarray(indptr[...])
            src = np.asarray(indices[...], dtype=np.int64)
            if src.min() >= 0 and src.max() < n:
                dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(ip))
                cross = node_graph[src] != node_graph[dst]
                if cross.any():
                    e = int(np.argmax(cross))
                    out.append(FormatError(source, "/graph/indices", f"edge {src[e]} -> {dst[e]} joins graphs "
                                           f"{node_graph[src[e]]} and {node_graph[dst[e]]} (graphs of "
                                           "/graphs/ptr must not share edges)"))
    label = a.get("graph_label")
    if label is None:
        out.append(FormatError(source, "/graphs/label", "missing (a graph-level dataset needs one label per graph)"))
    elif label.shape != (g,) or label.dtype != np.int64:
        out.append(FormatError(source, "/graphs/label", f"expected int64[{g}], got {label.dtype}{label.shape}"))
    elif check_values:
        lab = np.asarray(label[...])
        if lab.min() < -1:
            out.append(FormatError(source, "/graphs/label", f"label {lab.min()} < -1 (-1 marks an unlabelled graph)"))
        if num_classes and lab.max() >= num_classes:
            out.append(FormatError(source, "/graphs/label", f"label {lab.max()} >= num_classes={num_classes}"))
    for m in MASKS:
        arr = a.get(f"graph_{m}")
        if arr is not None and (arr.shape != (g,) or arr.dtype != np.bool_):
            out.append(FormatError(source, f"/graphs/{m}", f"expected bool[{g}], got {arr.dtype}{arr.shape}"))
    return out


def _min_max(arr: Any) -> tuple[Any, Any]:
    """Min and max of a NumPy array or h5py dataset, streamed in chunks."""
    n = arr.shape[0]
    step = max(1, _CHUNK_BYTES // max(1, arr.dtype.itemsize))
    lo = hi = None
    for s in range(0, n, step):
        c = np.asarray(arr[s:s + step])
        clo, chi = c.min(), c.max()  # NaN-propagating, like np.minimum below
        lo = clo if lo is None else np.minimum(lo, clo)
        hi = chi if hi is None else np.maximum(hi, chi)
    return lo, hi


class DatasetWriter:
    """Write a dataset file piece by piece, atomically.

    Use as a context manager; the file appears at ``path`` only when the block
    exits without an exception and the content validates::

        with DatasetWriter("g.h5", num_nodes=N, feat_dim=F, name="g", num_classes=C) as w:
            w.write_graph(indptr, indices)
            for start in range(0, N, 4096):
                w.write_feat(start, feat_rows)
            w.write_node("label", label)
            w.write_node("train_mask", train)

    Features may be written in row blocks so that a graph whose features do not
    fit in memory can still be written.
    """

    def __init__(self, path: str | os.PathLike, *, num_nodes: int, feat_dim: int = 0,
                 name: str = "graph", num_classes: int = 0, directed: bool = False,
                 task: str = "node", force: bool = False):
        if num_nodes <= 0:
            raise DataError(f"{path}: cannot write an empty graph (num_nodes={num_nodes})")
        self.path = Path(path)
        self.num_nodes = int(num_nodes)
        self.feat_dim = int(feat_dim)
        self.attrs = dict(format=FORMAT, version=VERSION, name=str(name), task=str(task),
                          num_nodes=self.num_nodes, num_edges=0, num_classes=int(num_classes),
                          directed=bool(directed))
        self.force = force
        check_output(self.path, force)
        self._ctx = None
        self._h5: h5py.File | None = None
        self._feat_written = 0
        # the features' digest, fed the rows while they arrive in order (else read back when sealing)
        self._feat_digest: Digest | None = Digest(np.float32, (self.num_nodes, self.feat_dim)) if feat_dim else None

    def __enter__(self) -> "DatasetWriter":
        self._ctx = atomic_output(self.path, self.force)
        tmp = self._ctx.__enter__()
        self._tmp = tmp
        self._h5 = h5py.File(tmp, "w")
        if self.feat_dim:
            create_dataset(self._h5, "node/feat", shape=(self.num_nodes, self.feat_dim), dtype=np.float32,
                           chunks=feat_chunk_shape(self.num_nodes, self.feat_dim))
        return self

    def write_graph(self, indptr: np.ndarray, indices: np.ndarray,
                    edge_weight: np.ndarray | None = None, edge_type: np.ndarray | None = None) -> None:
        """Write the CSR (over destinations) and optional per-edge arrays."""
        assert self._h5 is not None, "use DatasetWriter as a context manager"
        indptr = np.asarray(indptr)
        if indptr.shape != (self.num_nodes + 1,):
            raise FormatError(self.path, "/graph/indptr",
                              f"expected shape ({self.num_nodes + 1},), got {indptr.shape}")
        indices = np.asarray(indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64 if self.num_nodes >= 2**31 else np.int32)
        create_dataset(self._h5, "graph/indptr", data=indptr.astype(np.int64, copy=False))
        create_dataset(self._h5, "graph/indices", data=indices)
        if edge_weight is not None:
            create_dataset(self._h5, "graph/edge_weight", data=np.asarray(edge_weight, dtype=np.float32))
        if edge_type is not None:
            create_dataset(self._h5, "graph/edge_type", data=np.asarray(edge_type, dtype=np.int16))
        self.attrs["num_edges"] = int(len(indices))

    def write_feat(self, start: int, rows: np.ndarray) -> None:
        """Write feature rows ``[start, start + len(rows))``."""
        assert self._h5 is not None, "use DatasetWriter as a context manager"
        rows = np.asarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.feat_dim or start < 0 or start + len(rows) > self.num_nodes:
            raise FormatError(self.path, "/node/feat",
                              f"rows [{start}, {start + len(rows)}) of shape {rows.shape} do not fit "
                              f"({self.num_nodes}, {self.feat_dim})")
        self._h5["node/feat"][start:start + len(rows)] = rows
        if self._feat_digest is not None:
            if start == self._feat_written:
                self._feat_digest.update(rows)
            else:
                self._feat_digest = None
        self._feat_written += len(rows)

    def write_node(self, field: str, values: np.ndarray) -> None:
        """Write a per-node array: ``label`` (int64) or one of the masks (bool)."""
        assert self._h5 is not None, "use DatasetWriter as a context manager"
        dtype = np.int64 if field == "label" else np.bool_
        if field != "label" and field not in MASKS:
            raise ValueError(f"unknown node field {field!r}")
        create_dataset(self._h5, f"node/{field}", data=np.asarray(values, dtype=dtype))

    def write_text(self, texts: Any) -> None:
        """Write ``/node/text``: one str per node (variable-length UTF-8, any length, empty allowed)."""
        assert self._h5 is not None, "use DatasetWriter as a context manager"
        texts = list(texts)
        if len(texts) != self.num_nodes:
            raise FormatError(self.path, "/node/text", f"{len(texts)} strings for {self.num_nodes} nodes")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise FormatError(self.path, "/node/text", f"node {bad}: expected str, got {type(texts[bad]).__name__}")
        arr = np.empty(self.num_nodes, dtype=object)
        arr[:] = texts
        create_dataset(self._h5, "node/text", data=arr, dtype=h5py.string_dtype("utf-8"),
                       chunks=(min(self.num_nodes, 16384),))

    def write_graphs(self, ptr: np.ndarray, label: np.ndarray, masks: dict[str, np.ndarray] | None = None) -> None:
        """Write the per-graph fields of a graph-level dataset: ``ptr`` int64[G+1], ``label`` int64[G],
        ``masks`` {"train_mask"|"val_mask"|"test_mask": bool[G]} (checked with the rest on exit)."""
        assert self._h5 is not None, "use DatasetWriter as a context manager"
        create_dataset(self._h5, "graphs/ptr", data=np.asarray(ptr, dtype=np.int64))
        create_dataset(self._h5, "graphs/label", data=np.asarray(label, dtype=np.int64))
        for m, v in (masks or {}).items():
            if m not in MASKS:
                raise ValueError(f"unknown graph mask {m!r}; expected one of {MASKS}")
            create_dataset(self._h5, f"graphs/{m}", data=np.asarray(v, dtype=np.bool_))

    def __exit__(self, exc_type, exc, tb) -> bool:
        assert self._h5 is not None and self._ctx is not None
        try:
            if exc_type is None:
                if "graph/indptr" not in self._h5:
                    raise FormatError(self.path, "/graph", "write_graph() was never called")
                if self.feat_dim and self._feat_written < self.num_nodes:
                    raise FormatError(self.path, "/node/feat",
                                      f"only {self._feat_written} of {self.num_nodes} rows written")
                for k, v in self.attrs.items():
                    self._h5.attrs[k] = v
                h5 = self._h5
                arrays = _h5_fields(h5)
                probs = _check_arrays(arrays, str(self.path), self.attrs["num_classes"])
                if probs:
                    raise probs[0]
                if self._feat_digest is not None:
                    h5["node/feat"].attrs[DIGEST_ATTR] = self._feat_digest.hexdigest()
                seal(h5)  # digests last: the content is final
        except BaseException as err:
            self._h5.close()
            self._ctx.__exit__(type(err), err, err.__traceback__)
            raise
        self._h5.close()
        return bool(self._ctx.__exit__(exc_type, exc, tb))


def _h5_fields(h5: h5py.File) -> dict[str, Any]:
    """Map field names to the h5py datasets present in a dataset file."""
    names = {"indptr": "graph/indptr", "indices": "graph/indices", "edge_weight": "graph/edge_weight",
             "edge_type": "graph/edge_type", "feat": "node/feat", "label": "node/label", "lap_pe": "node/lap_pe",
             "text": "node/text"}
    names.update({m: f"node/{m}" for m in MASKS})
    names.update({"graph_ptr": "graphs/ptr", "graph_label": "graphs/label"})
    names.update({f"graph_{m}": f"graphs/{m}" for m in MASKS})
    out = {}
    for k, p in names.items():
        if p in h5:
            obj = h5[p]
            if isinstance(obj, h5py.Dataset):
                out[k] = obj
    task = h5.attrs.get("task", "node")
    out["task"] = task.decode() if isinstance(task, bytes) else str(task)
    return out


def write_dataset(path: str | os.PathLike, data: GraphData, *, force: bool = False) -> None:
    """Validate ``data`` and write it to ``path`` atomically (features in row blocks)."""
    data.validate(str(path))
    with DatasetWriter(path, num_nodes=data.num_nodes, feat_dim=data.feat_dim, name=data.name,
                       num_classes=data.num_classes, directed=data.directed, task=data.task,
                       force=force) as w:
        w.write_graph(data.indptr, data.indices, data.edge_weight, data.edge_type)
        if data.feat is not None and data.feat_dim:
            step = max(1, _CHUNK_BYTES // max(1, 4 * data.feat_dim))
            for s in range(0, data.num_nodes, step):
                w.write_feat(s, data.feat[s:s + step])
        if data.label is not None:
            w.write_node("label", data.label)
        for m in MASKS:
            v = getattr(data, m)
            if v is not None:
                w.write_node(m, v)
        if data.text is not None:
            w.write_text(data.text)
        if data.graph_ptr is not None:
            w.write_graphs(data.graph_ptr, data.graph_label,
                           {m: getattr(data, f"graph_{m}") for m in MASKS if getattr(data, f"graph_{m}") is not None})
    log.info("wrote %s: %d nodes, %d edges, %d features", path, data.num_nodes, data.num_edges, data.feat_dim)


class Dataset:
    """A dataset file opened lazily (read-only, h5py).

    Opening checks format, version, attributes, dtypes and shapes; index ranges
    are checked too unless ``check_values=False`` (they cost one pass over the
    edges). Arrays are read on demand: ``indptr()``, ``indices()``,
    ``feat_rows(start, stop)``, ``label()``, ``mask(name)``, or all at once with
    :meth:`load`.
    """

    def __init__(self, path: str | os.PathLike, check_values: bool = True):
        self.path = Path(path)
        if not self.path.exists():
            raise DataError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise DataError(f"{self.path}: is a directory, expected a dataset file (.h5)")
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as exc:
            raise FormatError(self.path, None, f"not a readable HDF5 file ({exc})") from None
        try:
            self._read_header(check_values)
        except BaseException:
            self._h5.close()
            raise

    def _read_header(self, check_values: bool) -> None:
        attrs = self._h5.attrs
        fmt = attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != FORMAT:
            raise FormatError(self.path, "/@format", f"expected {FORMAT!r}, got {fmt!r}")
        version = attrs.get("version")
        if version != VERSION:
            raise FormatError(self.path, "/@version", f"unsupported version {version!r} (this reader: {VERSION})")
        for key in ("num_nodes", "num_edges", "num_classes"):
            if key not in attrs:
                raise FormatError(self.path, f"/@{key}", "missing attribute")
        self.name = str(attrs.get("name", self.path.stem))
        self.task = str(attrs.get("task", "node"))
        self.num_classes = int(attrs["num_classes"])
        self.directed = bool(attrs.get("directed", False))
        try:
            fields = _h5_fields(self._h5)
            probs = _check_arrays(fields, str(self.path), self.num_classes, check_values)
        except (OSError, KeyError, RuntimeError) as exc:  # corrupt/truncated file contents
            raise FormatError(self.path, None, f"corrupt or truncated HDF5 file ({exc})") from None
        if probs:
            raise probs[0]
        check_header(self._h5, self.path)  # attributes only; HDF5 checks each chunk's checksum as it is read
        self._fields = fields
        self.num_nodes = int(fields["indptr"].shape[0] - 1)
        self.num_edges = int(fields["indices"].shape[0])
        if int(attrs["num_nodes"]) != self.num_nodes:
            raise FormatError(self.path, "/@num_nodes",
                              f"attribute says {int(attrs['num_nodes'])}, /graph/indptr has {self.num_nodes} rows")
        if int(attrs["num_edges"]) != self.num_edges:
            raise FormatError(self.path, "/@num_edges",
                              f"attribute says {int(attrs['num_edges'])}, /graph/indices has {self.num_edges}")
        self.feat_dim = int(fields["feat"].shape[1]) if "feat" in fields else 0

    # -- readers -------------------------------------------------------------------------------
    def has(self, field: str) -> bool:
        """Whether an optional field (``feat``, ``label``, a mask, ``edge_weight``, ``edge_type``) is present."""
        return field in self._fields

    def _read(self, field: str) -> np.ndarray:
        if field not in self._fields:
            path = {"feat": "/node/feat", "label": "/node/label", "edge_weight": "/graph/edge_weight",
                    "edge_type": "/graph/edge_type"}.get(field, f"/node/{field}")
            if field.startswith("graph_"):
                path = "/graphs/" + ("ptr" if field == "graph_ptr" else field[len("graph_"):])
            raise FormatError(self.path, path, "missing")
        try:
            return np.asarray(self._fields[field][...])
        except (OSError, RuntimeError) as exc:
            raise FormatError(self.path, self._fields[field].name, f"unreadable ({exc})") from None

    def indptr(self) -> np.ndarray:
        return self._read("indptr")

    def graph_ptr(self) -> np.ndarray:
        """int64[G+1] of a graph-level dataset (``/graphs/ptr``)."""
        return self._read("graph_ptr")

    def graph_label(self) -> np.ndarray:
        """int64[G]: the class of each graph (``/graphs/label``)."""
        return self._read("graph_label")

    def graph_mask(self, name: str) -> np.ndarray:
        """bool[G]: ``/graphs/<name>`` (all False when absent)."""
        if name not in MASKS:
            raise ValueError(f"unknown mask {name!r}; expected one of {MASKS}")
        if not self.has(f"graph_{name}"):
            return np.zeros(self.graph_ptr().shape[0] - 1, dtype=bool)
        return self._read(f"graph_{name}")

    def lap_pe(self) -> np.ndarray:
        """float32[N, k]: Laplacian eigenvector positional encodings (``hpc-graph preprocess lap-pe``)."""
        return self._read("lap_pe")

    def indices(self) -> np.ndarray:
        return self._read("indices")

    def text(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The texts of nodes ``[start, stop)`` (``/node/text``) as Python str."""
        if "text" not in self._fields:
            raise FormatError(self.path, "/node/text", "missing (a text-attributed graph is needed: "
                              "hpc-graph generate tag, or a converter that keeps node text)")
        stop = self.num_nodes if stop is None else stop
        try:
            return list(self._fields["text"].asstr()[start:stop])
        except (OSError, RuntimeError, UnicodeDecodeError) as exc:
            raise FormatError(self.path, "/node/text", f"unreadable ({exc})") from None

    def edge_weight(self) -> np.ndarray | None:
        return self._read("edge_weight") if self.has("edge_weight") else None

    def edge_type(self) -> np.ndarray | None:
        return self._read("edge_type") if self.has("edge_type") else None

    def label(self) -> np.ndarray:
        return self._read("label")

    def mask(self, name: str) -> np.ndarray:
        if name not in MASKS:
            raise ValueError(f"unknown mask {name!r}; expected one of {MASKS}")
        return self._read(name)

    def node_labels(self) -> np.ndarray:
        """int64[N] node labels, -1 for every node when the file has none."""
        return self.label() if self.has("label") else np.full(self.num_nodes, -1, dtype=np.int64)

    def split_masks(self) -> dict[str, np.ndarray]:
        """``{"train"|"val"|"test": bool[N]}``; a mask the file lacks is all False."""
        return {k: (self.mask(f"{k}_mask") if self.has(f"{k}_mask") else np.zeros(self.num_nodes, dtype=bool))
                for k in ("train", "val", "test")}

    @property
    def feat(self) -> h5py.Dataset:
        """The feature dataset itself (h5py, row-sliceable without loading all rows)."""
        if "feat" not in self._fields:
            raise FormatError(self.path, "/node/feat", "missing")
        return self._fields["feat"]

    def feat_rows(self, start: int, stop: int) -> np.ndarray:
        """Feature rows ``[start, stop)`` as float32[stop-start, F]."""
        try:
            rows = np.asarray(self.feat[start:stop])
        except (OSError, RuntimeError) as exc:
            raise FormatError(self.path, "/node/feat", f"unreadable ({exc})") from None
        check_finite(rows, self.path, "/node/feat", start)  # one pass over the rows read
        return rows

    def graph_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                                         np.ndarray | None]:
        """Rows ``[start, stop)`` of the CSR without reading the rest (a distributed reader's slice).

        Returns ``(indptr int64[k+1] starting at 0, indices[E_k], edge_weight[E_k] | None,
        edge_type[E_k] | None)``; indices are checked to lie in ``[0, num_nodes)``.
        """
        try:
            ptr = np.asarray(self._fields["indptr"][start:stop + 1], dtype=np.int64)
            e0, e1 = int(ptr[0]), int(ptr[-1])
            out = [np.asarray(self._fields[f][e0:e1]) if f in self._fields else None
                   for f in ("indices", "edge_weight", "edge_type")]
        except (OSError, RuntimeError) as exc:
            raise FormatError(self.path, "/graph", f"unreadable ({exc})") from None
        if np.any(np.diff(ptr) < 0):
            raise FormatError(self.path, "/graph/indptr", f"decreasing within rows {start}..{stop}")
        idx = out[0]
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= self.num_nodes):
            raise FormatError(self.path, "/graph/indices",
                              f"index out of range [0, {self.num_nodes}) in rows {start}..{stop}")
        return ptr - e0, idx, out[1], out[2]

    def edges_in_rows(self, start: int, stop: int) -> int:
        """Number of edges into rows ``[start, stop)`` (two reads of ``/graph/indptr``)."""
        try:
            return int(self._fields["indptr"][stop]) - int(self._fields["indptr"][start])
        except (OSError, RuntimeError) as exc:
            raise FormatError(self.path, "/graph/indptr", f"unreadable ({exc})") from None

    def node_rows(self, field: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of ``label`` or a mask."""
        if field not in self._fields:
            raise FormatError(self.path, f"/node/{field}", "missing")
        try:
            return np.asarray(self._fields[field][start:stop])
        except (OSError, RuntimeError) as exc:
            raise FormatError(self.path, f"/node/{field}", f"unreadable ({exc})") from None

    def feat_take(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of arbitrary node ids (int64[k]) as float32[k, F], read in sorted blocks."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.feat_dim), dtype=np.float32)
        if len(ids) == 0:
            return out
        order = np.argsort(ids, kind="stable")
        sids = ids[order]
        step = max(1, _CHUNK_BYTES // max(1, 4 * self.feat_dim))
        pos = 0
        while pos < len(sids):
            lo = sids[pos]
            end = int(np.searchsorted(sids, lo + step, side="left"))
            block = self.feat_rows(int(lo), int(min(sids[end - 1] + 1, self.num_nodes)))
            out[order[pos:end]] = block[sids[pos:end] - lo]
            pos = end
        return out

    def load(self, features: bool = True) -> GraphData:
        """Read the whole dataset into memory."""
        return GraphData(
            indptr=self.indptr(), indices=self.indices(),
            feat=self.feat_rows(0, self.num_nodes) if features and self.has("feat") else None,
            label=self._read("label") if self.has("label") else None,
            train_mask=self._read("train_mask") if self.has("train_mask") else None,
            val_mask=self._read("val_mask") if self.has("val_mask") else None,
            test_mask=self._read("test_mask") if self.has("test_mask") else None,
            edge_weight=self.edge_weight(), edge_type=self.edge_type(),
            name=self.name, num_classes=self.num_classes, directed=self.directed, task=self.task,
            text=self.text() if self.has("text") else None,
            **{f: (self._read(f) if self.has(f) else None) for f in GRAPH_FIELDS})

    def attrs(self) -> dict[str, Any]:
        """Root attributes as plain Python values."""
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in self._h5.attrs.items()}

    def close(self) -> None:
        self._h5.close()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Dataset({str(self.path)!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"feat_dim={self.feat_dim}, classes={self.num_classes})")


def dataset_task(path: str | os.PathLike) -> str:
    """The ``task`` attribute of a dataset file (``"node"`` or ``"graph"``) without validating it;
    ``"node"`` when the file cannot be read (the loader reports that properly)."""
    try:
        with h5py.File(path, "r") as h5:
            task = h5.attrs.get("task", "node")
    except OSError:
        return "node"
    return task.decode() if isinstance(task, bytes) else str(task)


def dataset_field_shape(path: str | os.PathLike, field: str) -> tuple[int, ...] | None:
    """The shape of dataset ``field`` (an HDF5 path such as ``"/node/lap_pe"``) read from the file's header
    without validating it; None when the file has no such field. ``OSError`` when the file cannot be read."""
    with h5py.File(path, "r") as h5:
        obj = h5.get(field)
        return tuple(int(s) for s in obj.shape) if isinstance(obj, h5py.Dataset) else None


def open_dataset(path: str | os.PathLike, check_values: bool = True) -> Dataset:
    """Open a dataset file lazily; see :class:`Dataset`."""
    return Dataset(path, check_values=check_values)


def validate_dataset(path: str | os.PathLike) -> list[str]:
    """Fully validate a dataset file; return a list of problems (empty when valid)."""
    try:
        with Dataset(path, check_values=True) as ds:
            probs = _check_arrays(ds._fields, str(path), ds.num_classes, True)
            if ds.has("feat"):
                # read every row once: catches truncated or corrupt chunks
                step = max(1, _CHUNK_BYTES // max(1, 4 * ds.feat_dim))
                for s in range(0, ds.num_nodes, step):
                    try:
                        ds.feat_rows(s, s + step)  # checks the values are finite
                    except FormatError as exc:
                        probs.append(exc)
                        break
            return [str(p) for p in probs]
    except DataError as exc:
        return [str(exc)]
