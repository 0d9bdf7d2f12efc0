"""Convert an OGB node-property dataset directory, read with gzip + NumPy (no ``ogb`` package).

Layout (as unpacked by OGB, e.g. ``ogbn_arxiv/``)::

    DIR/raw/edge.csv.gz           "src,dst" per line (directed for ogbn-arxiv: use symmetrize)
    DIR/raw/node-feat.csv.gz      F comma-separated floats per line, one line per node (optional)
    DIR/raw/node-label.csv.gz     one label per line; "nan" = unlabelled (optional)
    DIR/raw/num-node-list.csv.gz  one line: N (optional; else label count, else max id + 1)
    DIR/split/<name>/{train,valid,test}.csv.gz   node ids, one per line (optional)

Uncompressed ``.csv`` files are accepted too. Every file is streamed in byte
blocks; features go to the dataset file block by block.
"""
from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

import numpy as np

from data_io.converters._csr import build_csr, is_symmetric
from data_io.converters._text import DEFAULT_CHUNK_BYTES, block_parse_bytes, iter_rows, sample_rows
from data_io.converters.edgelist import edgelist_csr_bytes, read_edgelist
from data_io.dataset import DatasetWriter
from data_io.errors import DataError, FormatError, check_output
from data_io.memory import MIB, require_memory

log = logging.getLogger(__name__)

_SPLIT_FILES = (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask"))


def _find(folder: Path, stem: str, required: bool = True) -> Path | None:
    """``folder/stem.csv.gz`` or ``folder/stem.csv``; DataError naming the file if required and absent."""
    for suffix in (".csv.gz", ".csv"):
        p = folder / f"{stem}{suffix}"
        if p.is_file():
            return p
    if required:
        raise DataError(f"{folder / (stem + '.csv.gz')}: missing (expected the OGB node-property layout)")
    return None


def _read_column(path: Path, chunk_bytes: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """All values of a one-column file (float64 or int64 ``[rows]``) and their 1-based line numbers."""
    parts, lines = [], []
    for block in iter_rows(path, csv=True, chunk_bytes=chunk_bytes):
        if block.values.shape[1] != 1:
            raise FormatError(path, f"line {block.line_of(0)}",
                              f"expected one {what} per line, got {block.values.shape[1]} columns")
        parts.append(block.values[:, 0])
        lines.append(block.lines if block.lines is not None
                     else block.first_line + np.arange(len(block.values), dtype=np.int64))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len({p.dtype for p in parts}) > 1:
        parts = [p.astype(np.float64) for p in parts]
    return np.concatenate(parts), np.concatenate(lines)


def _read_labels(path: Path, chunk_bytes: int) -> np.ndarray:
    """Node labels int64 ``[N]``; NaN becomes -1 (unlabelled)."""
    raw, lines = _read_column(path, chunk_bytes, "label")
    if raw.dtype == np.float64:
        nan = np.isnan(raw)
        bad = ~nan & ((raw != np.floor(raw)) | ~np.isfinite(raw))
        if bad.any():
            k = int(np.argmax(bad))
            raise FormatError(path, f"line {lines[k]}", f"label {raw[k]} is not an integer")
        raw = np.where(nan, -1, raw).astype(np.int64)
    if raw.size and raw.min() < -1:
        k = int(np.argmin(raw))
        raise FormatError(path, f"line {lines[k]}", f"negative label {raw[k]}")
    return raw


def _read_ids(path: Path, n: int, chunk_bytes: int) -> np.ndarray:
    """Node ids of a split file, checked to be integers in ``[0, n)``."""
    ids, lines = _read_column(path, chunk_bytes, "node id")
    if ids.dtype != np.int64:
        bad = (ids != np.floor(ids)) | ~np.isfinite(ids)
        if bad.any():
            k = int(np.argmax(bad))
            raise FormatError(path, f"line {lines[k]}", f"node id {ids[k]} is not an integer")
        ids = ids.astype(np.int64)
    bad = (ids < 0) | (ids >= n)
    if bad.any():
        k = int(np.argmax(bad))
        raise FormatError(path, f"line {lines[k]}", f"node id {ids[k]} out of range [0, {n})")
    return ids


def _split_dir(root: Path, split: str | None) -> Path | None:
    """The chosen ``split/<name>`` folder (the only one when ``split`` is None), or None."""
    base = root / "split"
    if split is not None:
        d = base / split
        if not d.is_dir():
            have = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
            raise DataError(f"{d}: missing split folder (have: {', '.join(have) or 'none'})")
        return d
    if not base.is_dir():
        log.warning("%s: no split/ folder: the dataset gets no train/val/test masks", root)
        return None
    names = sorted(p.name for p in base.iterdir() if p.is_dir())
    if len(names) > 1:
        raise DataError(f"{base}: several splits ({', '.join(names)}): choose one with --split")
    return base / names[0] if names else None


def _ogb_num_nodes(raw: Path, chunk_bytes: int) -> int | None:
    """N from ``num-node-list`` (a one-line file, read whole), else None."""
    nn_file = _find(raw, "num-node-list", required=False)
    if nn_file is None:
        return None
    counts, _ = _read_column(nn_file, chunk_bytes, "node count")
    return int(counts[0]) if len(counts) == 1 and counts[0] > 0 else None


def estimate_ogb_bytes(src_dir: str | os.PathLike, *, symmetrize: bool = False, remove_self_loops: bool = False,
                       dedup: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Peak memory of :func:`convert_ogb` above the interpreter's own, in bytes (an estimate).

    Sizes come from the folder without reading it: N from ``num-node-list`` (one line), else
    the label file's estimated rows, else the largest sampled edge id + 1; E and the feature
    width F from :func:`~data_io.converters._text.sample_rows` of ``edge.csv*`` (2 % added)
    and ``node-feat.csv*``. With E' = 2 E under ``symmetrize``, the peak is the largest of:

    * the labels: values and line numbers (16 N), NaN and check masks and the int64 copy
      (18 N): ``34 N``;
    * the edges read into the CSR (:func:`~data_io.converters.edgelist.edgelist_csr_bytes`,
      no relabelling) beside the labels (8 N);
    * the features, streamed: the CSR (8 N + 4 E'), labels and masks (11 N) and one block of
      features parsed (:func:`~data_io.converters._text.block_parse_bytes`) and converted to
      float32 with a finiteness mask (6 bytes a value);
    * the final validation: the CSR, labels and masks, indptr and its diff and the labels
      read back (24 N) and up to 64 MiB of indices;

    plus 16 MiB.

    Measured (peak RSS minus RSS before the call; gzip files, 8 MiB blocks): N = 100 000,
    E = 1 000 000, F = 16: 69 MiB measured, 84 MiB estimated (+21 %); the same with ``symmetrize``
    and ``dedup``: 71 vs 87.5 MiB (+24 %); N = 20 000, E = 200 000, F = 100: 70 vs 79 MiB (+13 %).
    """
    root = Path(src_dir)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory")
    raw = root / "raw"
    edge = sample_rows(_find(raw, "edge"), csv=True)
    e = int(edge.rows * 1.02) + 1
    n = _ogb_num_nodes(raw, chunk_bytes)
    label_file = _find(raw, "node-label", required=False)
    if n is None and label_file is not None:
        n = sample_rows(label_file, csv=True).rows
    if n is None:
        n = min(max(1, edge.max_value + 1), 2 * e)
    ep = 2 * e if symmetrize else e
    block = min(int(chunk_bytes), edge.text_bytes)
    csr = edgelist_csr_bytes(e, n, symmetrize=symmetrize, remove_self_loops=remove_self_loops, dedup=dedup,
                             relabel=False, num_nodes_given=True,
                             parse_bytes=block_parse_bytes(block, block * edge.rows // max(1, edge.text_bytes) + 1,
                                                           2, csv=True, comments=edge.comments))
    phases = [34 * n, csr + 8 * n]
    feat_file = _find(raw, "node-feat", required=False)
    kept = 8 * (n + 1) + 4 * ep + 11 * n
    if feat_file is not None:
        feat = sample_rows(feat_file, csv=True)
        fblock = min(int(chunk_bytes), feat.text_bytes)
        frows = int(fblock * feat.rows / max(1, feat.text_bytes)) + 1
        phases.append(kept + block_parse_bytes(fblock, frows, feat.ncols, csv=True, comments=feat.comments)
                      + 6 * frows * feat.ncols)
    phases.append(kept + 24 * n + min(4 * ep, 64 * MIB))
    return max(phases) + 16 * MIB


def convert_ogb(src_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                name: str | None = None, split: str | None = None, symmetrize: bool = False,
                remove_self_loops: bool = False, dedup: bool = False,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Path:
    """Convert an OGB node-property dataset directory (see the module docstring) to a dataset file.

    Args:
        src_dir: the dataset folder holding ``raw/`` (and ``split/``).
        out: dataset file to write (atomically).
        force: overwrite ``out`` when it exists, and only warn when the estimated peak memory
            (:func:`estimate_ogb_bytes`) exceeds :func:`~data_io.memory.available_bytes`
            (without ``force``: :class:`~data_io.memory.MemoryRefusal` before reading the data).
        name: dataset name (default: the folder name).
        split: which ``split/<name>`` to use (default: the only one).
        symmetrize, remove_self_loops, dedup: as in :func:`~data_io.converters.convert_edgelist`.
        chunk_bytes: bytes parsed per step.

    Returns:
        ``out`` as a Path.
    """
    root = Path(src_dir)
    out = check_output(out, force)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory")
    raw = root / "raw"
    edge_file = _find(raw, "edge")
    assert edge_file is not None
    require_memory(estimate_ogb_bytes(root, symmetrize=symmetrize, remove_self_loops=remove_self_loops,
                                      dedup=dedup, chunk_bytes=chunk_bytes),
                   f"convert ogb {root}", force=force)
    n = None
    nn_file = _find(raw, "num-node-list", required=False)
    if nn_file is not None:
        counts, _ = _read_column(nn_file, chunk_bytes, "node count")
        if len(counts) != 1:
            raise FormatError(nn_file, None, f"{len(counts)} graphs: graph-property datasets are not supported")
        n = int(counts[0])
        if n <= 0:
            raise FormatError(nn_file, "line 1", f"node count must be positive, got {n}")
    label = None
    label_file = _find(raw, "node-label", required=False)
    if label_file is not None:
        label = _read_labels(label_file, chunk_bytes)
        if n is None:
            n = len(label)
        elif len(label) != n:
            raise FormatError(label_file, None, f"{len(label)} labels for {n} nodes")
    s, d, _ = read_edgelist(edge_file, num_nodes=n, chunk_bytes=chunk_bytes, csv=True, weighted=False)
    if n is None:
        if len(s) == 0:
            raise FormatError(edge_file, None, "no edges and no node count: empty graph")
        n = int(max(s.max(), d.max())) + 1
    indptr, indices, _ = build_csr(s, d, n, symmetrize=symmetrize, remove_self_loops=remove_self_loops, dedup=dedup)
    del s, d
    directed = False if symmetrize else not is_symmetric(indptr, indices)

    masks = {}
    sdir = _split_dir(root, split)
    if sdir is not None:
        for stem, field in _SPLIT_FILES:
            mask = np.zeros(n, dtype=bool)
            mask[_read_ids(_find(sdir, stem), n, chunk_bytes)] = True
            masks[field] = mask

    feat_file = _find(raw, "node-feat", required=False)
    blocks = iter(()) if feat_file is None else iter_rows(feat_file, csv=True, ints=False, chunk_bytes=chunk_bytes)
    first = next(blocks, None)
    feat_dim = 0 if first is None else int(first.values.shape[1])
    num_classes = int(label.max()) + 1 if label is not None and len(label) and label.max() >= 0 else 0
    with DatasetWriter(out, num_nodes=n, feat_dim=feat_dim, name=name or root.resolve().name,
                       num_classes=num_classes, directed=directed, force=force) as wr:
        wr.write_graph(indptr, indices)
        row = 0
        for block in [] if first is None else itertools.chain([first], blocks):
            rows = block.values
            if row + len(rows) > n:
                raise FormatError(feat_file, f"line {block.line_of(n - row)}", f"more feature rows than {n} nodes")
            bad = ~np.isfinite(rows)
            if bad.any():
                r = int(np.argmax(bad.any(axis=1)))
                raise FormatError(feat_file, f"line {block.line_of(r)}", "NaN or Inf feature")
            wr.write_feat(row, rows)
            row += len(rows)
        if feat_dim and row != n:
            raise FormatError(feat_file, None, f"{row} feature rows for {n} nodes")
        if label is not None:
            wr.write_node("label", label)
        for field, mask in masks.items():
            wr.write_node(field, mask)
    log.info("converted %s -> %s (%d nodes, %d edges, %d features)", root, out, n, len(indices), feat_dim)
    return out
