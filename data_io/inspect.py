"""Summaries (``info``) and full validation (``check``) of dataset files and partition directories.

``info(path)`` and ``check(path)`` accept either a dataset file (``*.h5``) or a
partition directory and return plain dicts (JSON-serialisable); the CLI turns
them into text. ``check`` never raises for bad content: it collects every
problem as one line naming the file and field.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from data_io.dataset import MASKS, check_finite, open_dataset, validate_dataset
from data_io.errors import DataError, FormatError
from data_io.integrity import FILE_DIGEST_ATTR, verify
from data_io.partition import (META_NAME, Partition, _read_part, meta_problems, part_file_name,
                               read_partition_meta)
from data_io.partitioner import file_sha256

log = logging.getLogger(__name__)

def _stats(x: np.ndarray) -> dict[str, float]:
    if not len(x):
        return {"min": 0, "mean": 0.0, "max": 0, "median": 0.0}
    return {"min": int(x.min()), "mean": round(float(x.mean()), 4), "max": int(x.max()),
            "median": float(np.median(x))}


def _class_counts(lab: np.ndarray, num_classes: int) -> tuple[int, list[int]]:
    """Labelled entries (label >= 0) and their count per class (at least ``num_classes`` classes)."""
    k = max(num_classes, int(lab.max()) + 1 if len(lab) else 0)
    return int(np.count_nonzero(lab >= 0)), np.bincount(lab[lab >= 0], minlength=k).tolist()


def dataset_info(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of a dataset file: counts, degree statistics, classes, splits, fields present.

    Degrees: ``in_degree`` counts the edges into each node (CSR row lengths),
    ``out_degree`` the edges out of it; both as min/mean/max/median. A graph-level
    dataset (``/graphs/ptr``) adds ``num_graphs``, ``graph_nodes`` (nodes per graph,
    min/mean/max/median), ``graph_splits``, ``labelled_graphs`` and ``graph_class_counts``.
    """
    p = Path(path)
    with open_dataset(p, check_values=False) as ds:
        n = ds.num_nodes
        indptr = ds.indptr()
        indeg = np.diff(indptr)
        src = ds.indices()
        if len(src) and (src.min() < 0 or src.max() >= n):
            raise FormatError(p, "/graph/indices", f"index out of range [0, {n})")
        outdeg = np.bincount(src, minlength=n)
        self_loops = int(np.count_nonzero(src == np.repeat(np.arange(n, dtype=src.dtype), indeg)))
        del src
        info: dict[str, Any] = {
            "kind": "dataset", "path": str(p), "name": ds.name, "task": ds.task, "directed": ds.directed,
            "num_nodes": n, "num_edges": ds.num_edges, "feat_dim": ds.feat_dim, "num_classes": ds.num_classes,
            "fields": [f for f in ("edge_weight", "edge_type", "feat", "label", "lap_pe") + MASKS if ds.has(f)],
            "in_degree": _stats(indeg), "out_degree": _stats(outdeg),
            "isolated_nodes": int(np.count_nonzero((indeg == 0) & (outdeg == 0))),
            "self_loops": self_loops, "file_size_bytes": p.stat().st_size,
        }
        info["splits"] = {m[:-5]: int(np.count_nonzero(ds.mask(m))) for m in MASKS if ds.has(m)}
        if ds.has("label"):
            info["labelled_nodes"], info["class_counts"] = _class_counts(ds.label(), ds.num_classes)
        if ds.has("graph_ptr"):
            sizes = np.diff(ds.graph_ptr())
            info["num_graphs"] = int(sizes.shape[0])
            info["graph_nodes"] = _stats(sizes) if sizes.size else None
            info["graph_splits"] = {m[:-5]: int(np.count_nonzero(ds.graph_mask(m))) for m in MASKS
                                    if ds.has(f"graph_{m}")}
            if ds.has("graph_label"):
                info["labelled_graphs"], info["graph_class_counts"] = _class_counts(ds.graph_label(), ds.num_classes)
    return info


def partition_info(path: str | os.PathLike) -> dict[str, Any]:
    """Summary of a partition directory: ``partition.json`` plus the per-part table."""
    meta = read_partition_meta(path)
    return {"kind": "partition", "path": str(path), **meta}


def info(path: str | os.PathLike) -> dict[str, Any]:
    """:func:`partition_info` for a directory, :func:`dataset_info` for a file."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    return partition_info(p) if p.is_dir() else dataset_info(p)


def check_dataset(path: str | os.PathLike) -> dict[str, Any]:
    """Full validation of a dataset file (every array, every feature row) and of its checksums."""
    problems = validate_dataset(path)
    notes: list[str] = []
    _check_checksums(Path(path), problems, notes)
    return {"kind": "dataset", "path": str(path), "valid": not problems, "problems": problems, "notes": notes}


def _check_checksums(f: Path, probs: list[str], notes: list[str], expected: str | None = None) -> bool:
    """Recompute every digest of file ``f`` (:func:`data_io.integrity.verify`, against ``expected`` from
    ``partition.json``); problems and a note on an unprotected file are appended. Returns whether the
    file carries checksums."""
    import h5py

    try:
        with h5py.File(f, "r") as h5:
            protected, found = verify(h5, f, expected)
    except (OSError, KeyError, RuntimeError) as exc:
        msg = f"{f}: not a readable HDF5 file ({exc})"
        if msg not in probs:
            probs.append(msg)
        return False
    probs += [str(x) for x in found if str(x) not in probs]
    if not protected:
        notes.append(f"{f}: unprotected: written without checksums (rewrite it with this version's "
                     "convert/generate/partition to add them)")
    return protected


def check(path: str | os.PathLike) -> dict[str, Any]:
    """:func:`check_partition` for a directory, :func:`check_dataset` for a file.

    Returns ``{"kind", "path", "valid", "problems": [str], "notes": [str]}``.
    """
    p = Path(path)
    if not p.exists():
        return {"kind": "unknown", "path": str(p), "valid": False,
                "problems": [f"{p}: no such file or directory"], "notes": []}
    return check_partition(p) if p.is_dir() else check_dataset(p)


def check_partition(path: str | os.PathLike, compare_source: bool = True) -> dict[str, Any]:
    """Validate a partition directory, each part and across parts.

    Checks: ``partition.json`` (format, version, ranges cover ``[0, N)`` once);
    every part file (format, dtypes, shapes, index ranges, halo sorted and
    grouped by owner); per-part counts against ``partition.json``; ``orig_id``
    over all parts is a permutation of ``[0, N)``; the send list of p to q equals
    the halo block of q owned by p; the edge cut; every halo node is used by an
    edge. When the source dataset is still there with the recorded sha256, every
    part's edges (with weights and types), features, labels and masks are
    compared with it (so each source edge is in exactly one part); otherwise only
    internal consistency is checked (said in ``notes``).
    """
    d = Path(path)
    res: dict[str, Any] = {"kind": "partition", "path": str(d), "valid": False, "problems": [], "notes": []}
    probs: list[str] = res["problems"]
    mf = d / META_NAME
    try:
        meta = json.loads(mf.read_text(encoding="utf-8"))
    except FileNotFoundError:
        probs.append(f"{mf}: missing (not a partition directory, or an incomplete one)")
        return res
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        probs.append(f"{mf}: not readable JSON ({exc})")
        return res
    mp = meta_problems(meta, str(mf))
    if mp:
        probs += [str(x) for x in mp]
        return res
    P, N = meta["num_parts"], meta["global_num_nodes"]
    ranges = np.asarray(meta["node_ranges"], dtype=np.int64)
    parts: dict[int, Partition] = {}
    for p in range(P):
        part, pp = _read_part(d, meta, p, features=False, digests=False)  # digests: _check_checksums
        probs += [str(x) for x in pp]
        if part is not None:
            parts[p] = part
            _check_counts(d, meta, part, probs)
    for p in range(P):
        f = d / part_file_name(p)
        if f.is_file() and _check_checksums(f, probs, res["notes"], meta["parts"][p].get(FILE_DIGEST_ATTR)) \
                and not meta["parts"][p].get(FILE_DIGEST_ATTR):
            res["notes"].append(f"{mf}: parts[{p}]: records no content digest (written by an older version)")
    for extra in sorted(set(x.name for x in d.glob("part-*.h5")) - {part_file_name(p) for p in range(P)}):
        res["notes"].append(f"{d / extra}: not listed in {META_NAME} (ignored)")
    # orig_id: a permutation of [0, N)
    perm_ok = len(parts) == P
    if perm_ok:
        orig = np.concatenate([parts[p].orig_id for p in range(P)])
        cnt = np.bincount(orig, minlength=N)
        if (cnt != 1).any():
            perm_ok = False
            dup, miss = np.flatnonzero(cnt > 1), np.flatnonzero(cnt == 0)
            where = str(d)
            if len(dup):  # name the part holding the second copy of the first repeated id
                gid = int(np.argmax(_first_dup(orig)))
                where = str(d / part_file_name(int(np.searchsorted(ranges, gid, side="right") - 1)))
            probs.append(f"{where}: /node/orig_id: not a permutation of [0, {N}): {len(dup)} id(s) repeated "
                         f"(e.g. {dup[:3].tolist()}), {len(miss)} missing (e.g. {miss[:3].tolist()})")
    # send lists of p to q == halo block of q owned by p
    for q, pq in parts.items():
        for p, pp in parts.items():
            if p == q:
                continue
            want = pq.halo_from(p)
            got = pp.send_to(q) + ranges[p]
            if len(want) != len(got) or not np.array_equal(want, got):
                probs.append(f"{d / part_file_name(p)}: /send/lid: send list to part {q} ({len(got)} nodes) does not "
                             f"match the halo block for part {p} in {part_file_name(q)} /halo/gid ({len(want)} nodes)")
    # edge cut and halo usage
    if len(parts) == P:
        cut = sum(int(np.count_nonzero(q.indices >= q.num_owned)) for q in parts.values())
        if cut != meta.get("edge_cut", cut):
            probs.append(f"{mf}: edge_cut: says {meta['edge_cut']}, the parts have {cut} edges from halo nodes")
    for p, q in parts.items():
        used = np.zeros(q.num_halo, dtype=bool)
        used[q.indices[q.indices >= q.num_owned] - q.num_owned] = True
        if not used.all():
            probs.append(f"{d / part_file_name(p)}: /halo/gid: {int((~used).sum())} halo node(s) not used by any edge "
                         f"(e.g. gid {int(q.halo_gid[np.argmin(used)])})")
    compared = False
    if compare_source and perm_ok:  # every part read and structurally valid
        compared = _compare_source(d, meta, parts, orig, res)
    if not compared and "feat" in meta.get("fields", []):
        for p, q in parts.items():  # read every feature row once: truncated or corrupt chunks
            _check_feat(d / part_file_name(p), q, meta["feat_dim"], probs)
    res["valid"] = not probs
    return res


def _first_dup(orig: np.ndarray) -> np.ndarray:
    """bool[len(orig)]: True at the first position whose id was already seen."""
    order = np.argsort(orig, kind="stable")
    rep = np.zeros(len(orig), dtype=bool)
    rep[order[1:][orig[order[1:]] == orig[order[:-1]]]] = True
    return rep


def _check_counts(d: Path, meta: dict, q: Partition, probs: list[str]) -> None:
    e = meta["parts"][q.part_id]
    f = d / part_file_name(q.part_id)
    have = {"num_edges": q.num_edges, "num_halo": q.num_halo}
    if q.train_mask is not None:
        have["num_train"] = int(np.count_nonzero(q.train_mask))
    for k, v in have.items():
        if e.get(k) != v:
            probs.append(f"{f}: {k}: {META_NAME} says {e.get(k)}, the file has {v}")


def _edge_keys(q: Partition, new_to_orig: np.ndarray, n: int) -> np.ndarray:
    """int64[E_p] keys ``dst_orig * n + src_orig`` of a part's edges."""
    l2g = q.local_to_global()
    src = new_to_orig[l2g[q.indices]]
    dst = np.repeat(q.orig_id, np.diff(q.indptr))
    return dst * n + src


def _canonical(keys: np.ndarray, *cols: np.ndarray | None) -> list[np.ndarray]:
    """Sort edge keys with their per-edge values (ties broken by the values)."""
    cs = [c for c in cols if c is not None]
    order = np.lexsort(tuple(reversed([keys] + cs)))
    return [keys[order]] + [c[order] for c in cs]


def _compare_source(d: Path, meta: dict, parts: dict[int, Partition], new_to_orig: np.ndarray,
                    res: dict[str, Any]) -> bool:
    """Compare every part with the source dataset, when it is there unchanged.

    Returns whether the comparison ran (False: source missing or changed).
    """
    src = meta.get("source") or {}
    sp = Path(src.get("path", "")) if src.get("path") else None
    if sp is None or not sp.is_file():
        res["notes"].append(f"source dataset {src.get('path')!r} not found: checked internal consistency only")
        return False
    digest = src.get("sha256")
    if digest and file_sha256(sp) != digest:
        res["problems"].append(f"{d / META_NAME}: source.sha256: {sp} changed since it was partitioned "
                               "(checksum differs); the partition is stale")
        return False
    probs = res["problems"]
    N = meta["global_num_nodes"]
    fields = set(meta.get("fields", []))
    try:
        ds = open_dataset(sp)
    except DataError as exc:
        probs.append(f"source dataset: {exc}")
        return False
    with ds:
        if ds.num_nodes != N or ds.num_edges != meta["global_num_edges"]:
            probs.append(f"{d / META_NAME}: global_num_nodes/global_num_edges: do not match {sp}")
            return False
        indptr, indices = ds.indptr(), ds.indices()
        ew, et = ds.edge_weight(), ds.edge_type()
        node = {f: ds.label() if f == "label" else ds.mask(f) for f in ("label",) + MASKS if ds.has(f)}
        for p, q in parts.items():
            f = d / part_file_name(p)
            rows = q.orig_id
            deg = np.diff(indptr)[rows]
            pos = np.repeat(indptr[:-1][rows] - np.concatenate([[0], np.cumsum(deg)[:-1]]), deg)
            pos += np.arange(len(pos), dtype=np.int64)
            want = _canonical(np.repeat(rows, deg) * N + indices[pos],
                              None if ew is None else ew[pos], None if et is None else et[pos])
            got = _canonical(_edge_keys(q, new_to_orig, N), q.edge_weight, q.edge_type)
            if len(want[0]) != len(got[0]) or not np.array_equal(want[0], got[0]):
                missing = len(np.setdiff1d(want[0], got[0]))
                extra = len(np.setdiff1d(got[0], want[0]))
                probs.append(f"{f}: /graph/indices: edges into this part's nodes differ from {sp} "
                             f"({len(got[0])} stored, {len(want[0])} in the source; "
                             f"{missing} source edge(s) missing, {extra} not in the source)")
                continue
            col = 1
            for path, theirs, mine in (("/graph/edge_weight", ew, q.edge_weight),
                                       ("/graph/edge_type", et, q.edge_type)):
                if (theirs is None) != (mine is None):
                    probs.append(f"{f}: {path}: present in only one of the part and {sp}")
                    break
                if theirs is not None:
                    if not np.array_equal(want[col], got[col]):
                        probs.append(f"{f}: {path}: values differ from {sp}")
                    col += 1
            for field, vals in node.items():
                mine = getattr(q, field)
                if mine is None or not np.array_equal(mine, vals[rows]):
                    probs.append(f"{f}: /node/{field}: differs from {sp}")
            if "feat" in fields:
                _check_feat(f, q, meta["feat_dim"], probs, ds)
        res["notes"].append(f"compared with source {sp} (sha256 matches)")
    return True


def _check_feat(f: Path, q: Partition, feat_dim: int, probs: list[str], ds: Any = None) -> None:
    """Read a part's feature rows in blocks: finite, and equal to the source rows when ``ds`` is given."""
    import h5py

    step = max(1, (64 << 20) // max(1, 4 * feat_dim))
    try:
        with h5py.File(f, "r") as h5:
            feat = h5["/node/feat"]
            for s in range(0, q.num_owned, step):
                mine = np.asarray(feat[s:s + step])
                try:
                    check_finite(mine, f, "/node/feat", s)
                except FormatError as exc:
                    probs.append(str(exc))
                    return
                if ds is not None and not np.array_equal(mine, ds.feat_take(q.orig_id[s:s + step])):
                    probs.append(f"{f}: /node/feat: rows [{s}, {s + len(mine)}) differ from the source")
                    return
    except (OSError, KeyError, RuntimeError) as exc:
        probs.append(f"{f}: /node/feat: unreadable ({exc})")
