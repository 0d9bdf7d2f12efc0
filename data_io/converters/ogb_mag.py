"""Convert an OGB-MAG-style heterogeneous folder to a typed dataset file (``/graph/edge_type``).

Layout (as unpacked by OGB for ``ogbn-mag``; ``.csv`` instead of ``.csv.gz`` is accepted)::

    DIR/raw/num-node-dict.csv.gz                       header: node type names; one line: their counts
    DIR/raw/relations/<src>___<rel>___<dst>/edge.csv.gz   "s,d" per line, ids local to the src/dst types
    DIR/raw/node-feat/<type>/node-feat.csv.gz          F floats per line (for some types only)
    DIR/raw/node-label/<type>/node-label.csv.gz        one label per line (the target type)
    DIR/split/<name>/<type>/{train,valid,test}.csv.gz  local ids of the target type

The heterogeneous graph becomes one homogeneous graph with typed edges:

* node types in the order of ``num-node-dict``; a node of type ``t`` with local id ``i`` gets
  global id ``offset[t] + i``;
* relation ``k`` (folders sorted by name) gives edge type ``2k`` for ``s -> d`` and, with
  ``reverse`` (default), type ``2k + 1`` for ``d -> s`` (messages flow both ways, each direction
  with its own R-GCN weight, as in the R-GCN setup for OGB-MAG);
* features: the featured types' rows (all of one width F), zeros for types without features,
  followed by a one-hot of the node type (so featureless types are told apart: width F + T);
* labels and masks on the target type only (``-1`` / False elsewhere).

The names are kept as dataset attributes: ``node_type_names``, ``node_type_offsets`` (T+1 ints)
and ``edge_type_names`` (``"src___rel___dst"`` and ``"rev:src___rel___dst"``), as JSON lists.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import os
from pathlib import Path

import numpy as np

from data_io.converters._text import DEFAULT_CHUNK_BYTES, block_parse_bytes, iter_rows, sample_rows
from data_io.converters.edgelist import read_edgelist
from data_io.converters.ogb import _SPLIT_FILES, _find, _read_ids, _read_labels
from data_io.dataset import DatasetWriter
from data_io.errors import DataError, FormatError, check_output
from data_io.memory import MIB, require_memory

log = logging.getLogger(__name__)


def _read_node_dict(path: Path) -> tuple[list[str], np.ndarray]:
    """Node type names and counts from ``num-node-dict`` (a header line and one line of counts)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        rows = [r for r in csv.reader(io.TextIOWrapper(fh, encoding="utf-8")) if r]
    if len(rows) != 2 or len(rows[0]) != len(rows[1]) or not rows[0]:
        raise FormatError(path, None, "expected a header of node type names and one line of counts")
    names = [s.strip() for s in rows[0]]
    try:
        counts = np.array([int(c) for c in rows[1]], dtype=np.int64)
    except ValueError:
        raise FormatError(path, "line 2", f"node counts must be integers, got {rows[1]}") from None
    if len(set(names)) != len(names) or (counts <= 0).any():
        raise FormatError(path, None, "node type names must be distinct and every count positive")
    return names, counts


def _relations(raw: Path, names: list[str]) -> list[tuple[str, int, int, Path]]:
    """``(folder name, src type, dst type, edge file)`` of every relation, sorted by name."""
    base = raw / "relations"
    if not base.is_dir():
        raise DataError(f"{base}: missing (expected one folder per relation, <src>___<rel>___<dst>)")
    out = []
    for d in sorted(p for p in base.iterdir() if p.is_dir()):
        parts = d.name.split("___")
        if len(parts) != 3 or parts[0] not in names or parts[2] not in names:
            raise DataError(f"{d}: relation folder must be named <src>___<rel>___<dst> with node types "
                            f"from num-node-dict ({', '.join(names)})")
        out.append((d.name, names.index(parts[0]), names.index(parts[2]), _find(d, "edge")))
    if not out:
        raise DataError(f"{base}: no relation folders")
    return out


def estimate_ogb_mag_bytes(src_dir: str | os.PathLike, *, reverse: bool = True,
                           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Peak memory of :func:`convert_ogb_mag` above the interpreter's own, in bytes (an estimate).

    N from ``num-node-dict`` (read: two lines); the edges E_r of each relation, the feature
    widths and rows from :func:`~data_io.converters._text.sample_rows` (2 % added to E_r).
    With E = sum E_r, E2 = 2 E with ``reverse`` (else E) and t = 2 bytes of type per stored
    edge, the peak is the largest of:

    * reading relation r (in name order) beside the int64 ids and types kept of the earlier
      ones (16 + t per stored edge): its text block parse, its uint32 ids (8 E_r) and their
      int64 copies plus one temporary (24 E_r);
    * the concatenation of all: the per-relation pieces and the concatenated src, dst and
      types (2 (16 + t) E2);
    * the sort: src, dst, types, lexsort's order and one sort temporary (34 E2), then the
      sorted indices and types (10 E2), with indptr and bincount (16 N); the per-relation
      pieces are freed by then, but stay resident (measured: the allocator keeps their
      heap pages, so they are counted): ``(16 + t) E + 36 E2 + 16 N``, the dominant phase;
    * the labels of the target type (34 N_t) and the masks, then the features streamed type by
      type (a parsed block and its float32 rows) and the final validation (24 N + up to 64 MiB
      of indices and of types) beside the CSR (8 N + 10 E2), labels and masks (11 N);

    plus 24 MiB (HDF5 buffers, and heap pages of the many freed per-relation temporaries that
    the allocator keeps: without ``reverse`` the last phase measured ~20 MiB above the model).

    Measured (peak RSS minus RSS before the call; three relations, 16 paper features):
    N = 194 000, E = 1 600 000, ``reverse``: 144.5 MiB measured, 170 MiB estimated (+18 %);
    the same without ``reverse``: 102-109 vs 118 MiB (+8 to +16 %); N = 58 000, E = 480 000,
    ``reverse``: 54 vs 74.6 MiB (+37 %, mostly the fixed 24 MiB).
    """
    root = Path(src_dir)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory")
    raw = root / "raw"
    names, counts = _read_node_dict(_find(raw, "num-node-dict"))
    n = int(counts.sum())
    per_edge = 16 + (4 if reverse else 2)  # int64 src and dst, int16 type(s), per input edge
    kept = 0
    phases = []
    total = 0
    for _, _, _, path in _relations(raw, names):
        smp = sample_rows(path, csv=True)
        e_r = int(smp.rows * 1.02) + 1
        block = min(int(chunk_bytes), smp.text_bytes)
        parse = block_parse_bytes(block, block * smp.rows // max(1, smp.text_bytes) + 1, 2, csv=True,
                                  comments=smp.comments)
        phases.append(kept + max(parse, 12 * e_r) + 24 * e_r)
        kept += per_edge * e_r
        total += e_r
    e2 = 2 * total if reverse else total
    phases.append(kept + 18 * e2)
    phases.append(kept + 36 * e2 + 16 * (n + 1))
    csr = 8 * (n + 1) + 10 * e2 + 11 * n
    t_max = int(counts.max())
    phases.append(csr + 34 * t_max)
    for t, name_t in enumerate(names):
        f = _find(raw / "node-feat" / name_t, "node-feat", required=False)
        if f is None:
            continue
        smp = sample_rows(f, csv=True)
        block = min(int(chunk_bytes), smp.text_bytes)
        rows = block * smp.rows // max(1, smp.text_bytes) + 1
        phases.append(csr + block_parse_bytes(block, rows, smp.ncols, csv=True, comments=smp.comments)
                      + 4 * rows * (smp.ncols + len(names)) + rows * smp.ncols)
    phases.append(csr + 24 * n + min(8 * e2, 64 * MIB) + min(2 * e2, 64 * MIB))
    return max(phases) + 24 * MIB


def convert_ogb_mag(src_dir: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                    name: str | None = None, split: str | None = None, target: str | None = None,
                    reverse: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Path:
    """Convert an OGB-MAG-style folder (module docstring) to a typed dataset file.

    Args:
        src_dir: the folder holding ``raw/`` (and ``split/``).
        out: dataset file to write (atomically: nothing is left at ``out`` on an error).
        force: overwrite ``out``, and only warn when the estimated peak memory
            (:func:`estimate_ogb_mag_bytes`) exceeds :func:`~data_io.memory.available_bytes`
            (without ``force``: :class:`~data_io.memory.MemoryRefusal` before reading the data).
        name: dataset name (default: the folder name).
        split: which ``split/<name>`` (default: the only one; none: no masks).
        target: the labelled node type (default: the only type with ``node-label``).
        reverse: add every edge's reverse with its own type.
        chunk_bytes: bytes of text parsed per step.
    Returns:
        ``out`` as a Path.
    Raises:
        DataError / FormatError naming the file (and line) of bad input.
    """
    root = Path(src_dir)
    out = check_output(out, force)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory")
    raw = root / "raw"
    require_memory(estimate_ogb_mag_bytes(root, reverse=reverse, chunk_bytes=chunk_bytes),
                   f"convert ogb-mag {root}", force=force)
    names, counts = _read_node_dict(_find(raw, "num-node-dict"))
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    n = int(offsets[-1])

    srcs, dsts, types, type_names = [], [], [], []
    for k, (rel, ts, td, path) in enumerate(_relations(raw, names)):
        s, d, _ = read_edgelist(path, num_nodes=int(max(counts[ts], counts[td])), chunk_bytes=chunk_bytes,
                                csv=True, weighted=False)
        for ids, t, what in ((s, ts, "source"), (d, td, "destination")):
            if len(ids) and ids.max() >= counts[t]:
                raise FormatError(path, None, f"{what} id {int(ids.max())} out of range for node type "
                                  f"{names[t]!r} ({int(counts[t])} nodes)")
        s = s.astype(np.int64) + offsets[ts]
        d = d.astype(np.int64) + offsets[td]
        srcs.append(s), dsts.append(d), types.append(np.full(len(s), 2 * k if reverse else k, np.int16))
        type_names.append(rel)
        if reverse:
            srcs.append(d), dsts.append(s), types.append(np.full(len(s), 2 * k + 1, np.int16))
            type_names.append(f"rev:{rel}")
        log.info("ogb-mag: relation %s: %d edges", rel, len(s))
    src, dst, etype = np.concatenate(srcs), np.concatenate(dsts), np.concatenate(types)
    del srcs, dsts, types
    order = np.lexsort((etype, src, dst))
    indices, etype = src[order], etype[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    del src, dst, order

    labelled = [t for t in names if _find(raw / "node-label" / t, "node-label", required=False)]
    if target is None:
        if len(labelled) != 1:
            raise DataError(f"{raw / 'node-label'}: {len(labelled)} labelled node types "
                            f"({', '.join(labelled) or 'none'}): choose one with --target")
        target = labelled[0]
    if target not in names:
        raise DataError(f"--target: unknown node type {target!r} (have: {', '.join(names)})")
    t_id, lo = names.index(target), int(offsets[names.index(target)])
    label = np.full(n, -1, dtype=np.int64)
    label_file = _find(raw / "node-label" / target, "node-label")
    lab = _read_labels(label_file, chunk_bytes)
    if len(lab) != counts[t_id]:
        raise FormatError(label_file, None, f"{len(lab)} labels for {int(counts[t_id])} {target!r} nodes")
    label[lo:lo + len(lab)] = lab
    masks = {}
    sbase = root / "split"
    if sbase.is_dir():
        have = sorted(p.name for p in sbase.iterdir() if p.is_dir())
        if split is None and len(have) > 1:
            raise DataError(f"{sbase}: several splits ({', '.join(have)}): choose one with --split")
        chosen = split or (have[0] if have else None)
        if chosen is not None:
            sdir = sbase / chosen / target
            if not sdir.is_dir():
                raise DataError(f"{sdir}: missing split folder for node type {target!r}")
            for stem, field in _SPLIT_FILES:
                mask = np.zeros(n, dtype=bool)
                mask[lo + _read_ids(_find(sdir, stem), int(counts[t_id]), chunk_bytes)] = True
                masks[field] = mask
    else:
        log.warning("%s: no split/ folder: the dataset gets no train/val/test masks", root)

    feat_files = {t: f for t, name_t in enumerate(names)
                  if (f := _find(raw / "node-feat" / name_t, "node-feat", required=False)) is not None}
    widths = {}
    for t, f in feat_files.items():
        first = next(iter_rows(f, csv=True, ints=False, chunk_bytes=chunk_bytes), None)
        widths[t] = 0 if first is None else int(first.values.shape[1])
    if len(set(widths.values())) > 1:
        raise DataError(f"node-feat: feature widths differ between node types: "
                        f"{ {names[t]: w for t, w in widths.items()} }")
    f_dim = next(iter(widths.values()), 0)
    num_t = len(names)
    num_classes = int(lab.max()) + 1 if len(lab) and lab.max() >= 0 else 0
    with DatasetWriter(out, num_nodes=n, feat_dim=f_dim + num_t, name=name or root.resolve().name,
                       num_classes=num_classes, directed=not reverse, force=force) as wr:
        wr.write_graph(indptr, indices, edge_type=etype)
        wr.attrs["node_type_names"] = json.dumps(names)
        wr.attrs["node_type_offsets"] = json.dumps([int(v) for v in offsets])
        wr.attrs["edge_type_names"] = json.dumps(type_names)
        for t in range(num_t):
            start, rows_left = int(offsets[t]), int(counts[t])
            f = feat_files.get(t)
            blocks = iter(()) if f is None else iter_rows(f, csv=True, ints=False, chunk_bytes=chunk_bytes)
            row = 0
            for block in blocks:
                vals = block.values
                if row + len(vals) > rows_left:
                    raise FormatError(f, f"line {block.line_of(rows_left - row)}",
                                      f"more feature rows than {rows_left} {names[t]!r} nodes")
                if not np.isfinite(vals).all():
                    raise FormatError(f, f"line {block.line_of(int(np.argmax(~np.isfinite(vals).all(1))))}",
                                      "NaN or Inf feature")
                out_rows = np.zeros((len(vals), f_dim + num_t), dtype=np.float32)
                out_rows[:, :f_dim] = vals
                out_rows[:, f_dim + t] = 1.0
                wr.write_feat(start + row, out_rows)
                row += len(vals)
            if f is not None and row != rows_left:
                raise FormatError(f, None, f"{row} feature rows for {rows_left} {names[t]!r} nodes")
            step = max(1, (8 << 20) // (4 * (f_dim + num_t)))
            for a in range(row, rows_left, step):  # featureless rows: zeros and the type's one-hot
                b = min(rows_left, a + step)
                out_rows = np.zeros((b - a, f_dim + num_t), dtype=np.float32)
                out_rows[:, f_dim + t] = 1.0
                wr.write_feat(start + a, out_rows)
        wr.write_node("label", label)
        for field, mask in masks.items():
            wr.write_node(field, mask)
    log.info("converted %s -> %s (%d nodes of %d types, %d edges of %d types, %d features)", root, out, n,
             num_t, len(indices), len(type_names), f_dim + num_t)
    return out
