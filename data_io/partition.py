"""Partitioned dataset format (version 1): a directory with ``partition.json`` and one HDF5 file per part.

Nodes are relabelled so that part ``p`` owns the contiguous new-global-id range
``[node_ranges[p], node_ranges[p+1])``; owner lookup is
``searchsorted(node_ranges, gid, side="right") - 1``. Every edge ``j -> i`` is
stored once, in the part that owns its destination ``i``.

Local ids of part ``p``: owned nodes ``0 .. num_owned-1`` (new gid minus
``node_ranges[p]``), then halo nodes ``num_owned .. num_owned+num_halo-1`` in
the order of ``halo_gid`` (sorted, hence grouped by owner). The halo nodes
owned by part ``q`` are ``halo_gid[halo_offsets[q]:halo_offsets[q+1]]`` and
form columns ``num_owned + halo_offsets[q] ..`` of the local CSR: exactly the
SAR block G_{p,q}.

The implementation of writers and readers lives here too (see ``read_partition``,
``write_partition``, ``PartitionBook``).

On disk::

    DIR/partition.json   format="hpc_graph.partition", version=1, num_parts, method,
                         node_ranges, edge_cut, replication_factor, balance, per-part
                         counts ("parts"), source path + sha256 of the whole source file,
                         feat_dim, num_classes, global_num_nodes, global_num_edges, name,
                         fields (optional arrays present in every part)
    DIR/part-00000.h5    attrs: format="hpc_graph.partition", version=1, part_id, num_parts,
                                num_classes, global_num_nodes, global_num_edges, name, feat_dim
      /node_ranges          int64[P+1]
      /node/orig_id         int64[n]
      /node/feat            float32[n, F]  optional, chunked by rows
      /node/label           int64[n]       optional
      /node/{train,val,test}_mask bool[n]  optional
      /graph/indptr         int64[n+1]
      /graph/indices        int64[E_p]     local ids in [0, n+h)
      /graph/edge_weight    float32[E_p]   optional
      /graph/edge_type      int16[E_p]     optional
      /halo/gid             int64[h]
      /halo/offsets         int64[P+1]
      /send/offsets         int64[P+1]
      /send/lid             int64[S]
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from data_io.dataset import MASKS, GraphData, check_finite, feat_chunk_shape
from data_io.errors import DataError, FormatError, atomic_output
from data_io.integrity import FILE_DIGEST_ATTR, check_header, create_dataset, seal

log = logging.getLogger(__name__)

FORMAT = "hpc_graph.partition"
VERSION = 1
META_NAME = "partition.json"
OPTIONAL_FIELDS = ("edge_weight", "edge_type", "feat", "label") + MASKS

# Partition field -> (HDF5 path, dtype); ``feat`` is 2-D, all others 1-D.
H5_PATHS: dict[str, tuple[str, Any]] = {
    "node_ranges": ("/node_ranges", np.int64),
    "orig_id": ("/node/orig_id", np.int64),
    "halo_gid": ("/halo/gid", np.int64),
    "halo_offsets": ("/halo/offsets", np.int64),
    "indptr": ("/graph/indptr", np.int64),
    "indices": ("/graph/indices", np.int64),
    "send_offsets": ("/send/offsets", np.int64),
    "send_lid": ("/send/lid", np.int64),
    "edge_weight": ("/graph/edge_weight", np.float32),
    "edge_type": ("/graph/edge_type", np.int16),
    "feat": ("/node/feat", np.float32),
    "label": ("/node/label", np.int64),
    **{m: (f"/node/{m}", np.bool_) for m in MASKS},
}
_REQUIRED = ("node_ranges", "orig_id", "halo_gid", "halo_offsets", "indptr", "indices",
             "send_offsets", "send_lid")


@dataclasses.dataclass
class Partition:
    """One part of a partitioned dataset, in memory (NumPy arrays).

    Fields (P = num_parts, n = num_owned, h = num_halo, E_p = edges into owned nodes):

    * ``part_id`` int, ``num_parts`` int, ``node_ranges`` int64[P+1]
    * ``orig_id`` int64[n]: id of each owned node in the source dataset
    * ``halo_gid`` int64[h]: new global ids of halo nodes, sorted ascending
    * ``halo_offsets`` int64[P+1]: halo nodes owned by q are ``halo_gid[halo_offsets[q]:halo_offsets[q+1]]``
      (empty for q == part_id)
    * ``indptr`` int64[n+1], ``indices`` int64[E_p]: CSR over owned destinations,
      columns are local ids in ``[0, n+h)``
    * ``edge_weight`` float32[E_p] | None, ``edge_type`` int16[E_p] | None
    * ``feat`` float32[n, F] | None, ``label`` int64[n] | None,
      ``train_mask`` / ``val_mask`` / ``test_mask`` bool[n] | None
    * ``send_offsets`` int64[P+1], ``send_lid`` int64[S]: owned local ids to send to
      part q are ``send_lid[send_offsets[q]:send_offsets[q+1]]``, in the order of q's
      halo block for p (ascending gid)
    * ``num_classes`` int, ``global_num_nodes`` int, ``global_num_edges`` int, ``name`` str
    """

    part_id: int
    num_parts: int
    node_ranges: np.ndarray
    orig_id: np.ndarray
    halo_gid: np.ndarray
    halo_offsets: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    send_offsets: np.ndarray
    send_lid: np.ndarray
    edge_weight: np.ndarray | None = None
    edge_type: np.ndarray | None = None
    feat: np.ndarray | None = None
    label: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int = 0
    global_num_nodes: int = 0
    global_num_edges: int = 0
    name: str = "graph"

    @property
    def num_owned(self) -> int:
        return int(self.node_ranges[self.part_id + 1] - self.node_ranges[self.part_id])

    @property
    def num_halo(self) -> int:
        return int(len(self.halo_gid))

    @property
    def first_gid(self) -> int:
        return int(self.node_ranges[self.part_id])

    @property
    def num_edges(self) -> int:
        return int(len(self.indices))

    @property
    def feat_dim(self) -> int:
        return 0 if self.feat is None else int(self.feat.shape[1])

    def local_to_global(self) -> np.ndarray:
        """int64[n+h]: new global id of every local id (owned, then halo)."""
        owned = np.arange(self.first_gid, self.first_gid + self.num_owned, dtype=np.int64)
        return np.concatenate([owned, self.halo_gid.astype(np.int64, copy=False)])

    def send_to(self, q: int) -> np.ndarray:
        """int64[k]: owned local ids whose rows part ``q`` needs (its halo block for this part)."""
        return self.send_lid[self.send_offsets[q]:self.send_offsets[q + 1]]

    def halo_from(self, q: int) -> np.ndarray:
        """int64[k]: new global ids of the halo nodes owned by part ``q``."""
        return self.halo_gid[self.halo_offsets[q]:self.halo_offsets[q + 1]]


def part_file_name(part_id: int) -> str:
    """File name of part ``part_id`` inside a partition directory (``part-00003.h5``)."""
    return f"part-{int(part_id):05d}.h5"


class PartitionBook:
    """Range partition book: new global id -> owning part and local id.

    Args:
        node_ranges: int64[P+1]; part ``p`` owns new global ids
            ``[node_ranges[p], node_ranges[p+1])``. Empty parts are allowed.
    """

    def __init__(self, node_ranges: np.ndarray):
        r = np.asarray(node_ranges, dtype=np.int64)
        if r.ndim != 1 or r.shape[0] < 2 or r[0] != 0 or (np.diff(r) < 0).any():
            raise ValueError(f"node_ranges: expected non-decreasing int64[P+1] starting at 0, got {r!r}")
        self.node_ranges = r

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "PartitionBook":
        """The book of a partition directory (read from its ``partition.json``)."""
        return cls(np.asarray(read_partition_meta(path)["node_ranges"], dtype=np.int64))

    @property
    def num_parts(self) -> int:
        return int(self.node_ranges.shape[0] - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.node_ranges[-1])

    def part_range(self, part_id: int) -> tuple[int, int]:
        """``(first, stop)`` new global ids owned by ``part_id``."""
        return int(self.node_ranges[part_id]), int(self.node_ranges[part_id + 1])

    def _check(self, gids: np.ndarray) -> np.ndarray:
        g = np.asarray(gids, dtype=np.int64)
        if g.size and (g.min() < 0 or g.max() >= self.num_nodes):
            bad = g[(g < 0) | (g >= self.num_nodes)][0]
            raise ValueError(f"global id {bad} out of range [0, {self.num_nodes})")
        return g

    def owner(self, gids: np.ndarray) -> np.ndarray:
        """int64[k]: owning part of each new global id (``searchsorted`` on ``node_ranges``)."""
        g = self._check(gids)
        return np.searchsorted(self.node_ranges, g, side="right").astype(np.int64) - 1

    def to_local(self, gids: np.ndarray) -> np.ndarray:
        """int64[k]: local id of each new global id inside its owning part."""
        g = self._check(gids)
        return g - self.node_ranges[self.owner(g)]

    def __repr__(self) -> str:
        return f"PartitionBook(num_parts={self.num_parts}, num_nodes={self.num_nodes})"


# -- writing -----------------------------------------------------------------------------------

def _part_attrs(part: Partition, feat_dim: int) -> dict[str, Any]:
    return dict(format=FORMAT, version=VERSION, part_id=int(part.part_id), num_parts=int(part.num_parts),
                num_classes=int(part.num_classes), global_num_nodes=int(part.global_num_nodes),
                global_num_edges=int(part.global_num_edges), name=str(part.name), feat_dim=int(feat_dim))


def _write_part_h5(h5: h5py.File, part: Partition, feat_dim: int | None = None) -> None:
    """Write every array of ``part`` into the open file ``h5``.

    When ``part.feat`` is None and ``feat_dim`` > 0 an empty row-chunked
    ``/node/feat`` of shape ``[n, feat_dim]`` is created, to be filled later.
    """
    feat_dim = part.feat_dim if feat_dim is None else int(feat_dim)
    for k, v in _part_attrs(part, feat_dim).items():
        h5.attrs[k] = v
    for field, (path, dtype) in H5_PATHS.items():
        if field == "feat":
            continue
        value = getattr(part, field)
        if value is None:
            continue
        create_dataset(h5, path, data=np.asarray(value, dtype=dtype))
    if feat_dim:
        n = part.num_owned
        d = create_dataset(h5, "/node/feat", shape=(n, feat_dim), dtype=np.float32,
                           chunks=feat_chunk_shape(n, feat_dim) if n else None)
        if part.feat is not None and n:
            d[...] = np.asarray(part.feat, dtype=np.float32)


def write_partition(path: str | os.PathLike, part: Partition, *, force: bool = False) -> str:
    """Write one part file atomically (``partition.json`` is written by the partitioner); return its
    content digest (:func:`data_io.integrity.seal`), which ``partition.json`` records."""
    with atomic_output(path, force) as tmp:
        with h5py.File(tmp, "w") as h5:
            _write_part_h5(h5, part)
            return seal(h5)


# -- reading -----------------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def meta_problems(meta: Any, source: str) -> list[FormatError]:
    """Check a parsed ``partition.json``; return every problem found (empty when valid)."""
    out: list[FormatError] = []

    def bad(field: str, msg: str) -> None:
        out.append(FormatError(source, field, msg))

    if not isinstance(meta, dict):
        bad(None, f"expected a JSON object, got {type(meta).__name__}")
        return out
    if meta.get("format") != FORMAT:
        bad("format", f"expected {FORMAT!r}, got {meta.get('format')!r}")
        return out
    if meta.get("version") != VERSION:
        bad("version", f"unsupported version {meta.get('version')!r} (this reader: {VERSION})")
        return out
    for key in ("num_parts", "global_num_nodes", "global_num_edges", "feat_dim", "num_classes"):
        v = meta.get(key)
        if not _is_int(v) or v < 0:
            bad(key, f"expected a non-negative integer, got {v!r}")
    if out:
        return out
    P, N = meta["num_parts"], meta["global_num_nodes"]
    if P < 1:
        bad("num_parts", f"must be >= 1, got {P}")
        return out
    if not isinstance(meta.get("name", ""), str):
        bad("name", "expected a string")
    fields = meta.get("fields", [])
    if not isinstance(fields, list) or any(f not in OPTIONAL_FIELDS for f in fields):
        bad("fields", f"expected a list of names from {OPTIONAL_FIELDS}, got {fields!r}")
    r = meta.get("node_ranges")
    if not isinstance(r, list) or len(r) != P + 1 or not all(_is_int(x) for x in r):
        bad("node_ranges", f"expected a list of {P + 1} integers")
        return out
    if r[0] != 0 or r[-1] != N:
        bad("node_ranges", f"must run from 0 to global_num_nodes={N}, got {r[0]}..{r[-1]}")
    if any(b < a for a, b in zip(r[:-1], r[1:])):
        bad("node_ranges", "not non-decreasing (ranges overlap)")
    parts = meta.get("parts")
    if not isinstance(parts, list) or len(parts) != P:
        bad("parts", f"expected a list of {P} entries")
        return out
    total_edges = 0
    for p, e in enumerate(parts):
        where = f"parts[{p}]"
        if not isinstance(e, dict):
            bad(where, "expected an object")
            continue
        if e.get("file") != part_file_name(p):
            bad(f"{where}.file", f"expected {part_file_name(p)!r}, got {e.get('file')!r}")
        for key in ("num_nodes", "num_edges", "num_halo", "num_train"):
            if not _is_int(e.get(key)) or e[key] < 0:
                bad(f"{where}.{key}", f"expected a non-negative integer, got {e.get(key)!r}")
        if e.get(FILE_DIGEST_ATTR) is not None and not isinstance(e[FILE_DIGEST_ATTR], str):
            bad(f"{where}.{FILE_DIGEST_ATTR}", f"expected a hex string, got {e[FILE_DIGEST_ATTR]!r}")
        if _is_int(e.get("num_nodes")) and e["num_nodes"] != r[p + 1] - r[p]:
            bad(f"{where}.num_nodes", f"{e['num_nodes']} does not match node_ranges ({r[p + 1] - r[p]})")
        if _is_int(e.get("num_edges")):
            total_edges += e["num_edges"]
    if not out and total_edges != meta["global_num_edges"]:
        bad("parts", f"edge counts sum to {total_edges}, global_num_edges={meta['global_num_edges']}")
    return out


def read_partition_meta(path: str | os.PathLike) -> dict:
    """Read and validate ``DIR/partition.json``; raise :class:`DataError` naming the file and field."""
    d = Path(path)
    if not d.is_dir():
        raise DataError(f"{d}: not a partition directory" + ("" if d.exists() else " (does not exist)"))
    f = d / META_NAME
    if not f.is_file():
        raise FormatError(f, None, "missing (not a partition directory, or an incomplete one)")
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f, None, f"not readable JSON ({exc})") from None
    probs = meta_problems(meta, str(f))
    if probs:
        raise probs[0]
    return meta


def _read_part(d: Path, meta: dict, part_id: int, features: bool = True, digests: bool = True
               ) -> tuple[Partition | None, list[FormatError]]:
    """Read and check part ``part_id`` of directory ``d``; return (part or None, problems). ``digests``:
    compare the recorded file digest with the attributes and ``partition.json`` (``hpc-graph check``
    verifies the digests itself and reads the part regardless)."""
    f = d / part_file_name(part_id)
    probs: list[FormatError] = []

    def bad(field: str | None, msg: str) -> None:
        probs.append(FormatError(f, field, msg))

    if not f.is_file():
        bad(None, "missing part file")
        return None, probs
    try:
        h5 = h5py.File(f, "r")
    except OSError as exc:
        bad(None, f"not a readable HDF5 file (truncated or corrupt: {exc})")
        return None, probs
    with h5:
        a = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in h5.attrs.items()}
        fmt = a.get("format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if fmt != FORMAT:
            bad("/@format", f"expected {FORMAT!r}, got {fmt!r}")
            return None, probs
        if a.get("version") != VERSION:
            bad("/@version", f"unsupported version {a.get('version')!r} (this reader: {VERSION})")
            return None, probs
        for key, want in (("part_id", part_id), ("num_parts", meta["num_parts"]),
                          ("global_num_nodes", meta["global_num_nodes"]),
                          ("global_num_edges", meta["global_num_edges"])):
            if key not in a or int(a[key]) != want:
                bad(f"/@{key}", f"expected {want}, got {a.get(key)!r}")
        if probs:
            return None, probs
        arrays: dict[str, np.ndarray] = {}
        for field in list(_REQUIRED) + list(meta.get("fields", [])):
            path, dtype = H5_PATHS[field]
            obj = h5.get(path)
            if not isinstance(obj, h5py.Dataset):
                bad(path, "missing")
                continue
            if obj.dtype != dtype:
                bad(path, f"expected {np.dtype(dtype)}, got {obj.dtype}")
                continue
            if obj.ndim != (2 if field == "feat" else 1):
                bad(path, f"expected a {2 if field == 'feat' else 1}-D array, got shape {obj.shape}")
                continue
            if field == "feat" and not features:  # shape checked, rows not read
                n = int(meta["node_ranges"][part_id + 1] - meta["node_ranges"][part_id])
                if obj.shape != (n, meta["feat_dim"]):
                    bad(path, f"expected shape ({n}, {meta['feat_dim']}), got {obj.shape}")
                continue
            try:
                arrays[field] = obj[...]
            except (OSError, RuntimeError, ValueError) as exc:
                bad(path, f"unreadable (corrupt or truncated: {exc})")
                continue
            if field == "feat":
                try:
                    check_finite(arrays[field], f, path)  # the rank's own rows, one pass
                except FormatError as exc:
                    probs.append(exc)
        if probs:
            return None, probs
        digest_problem: FormatError | None = None
        try:  # attributes only; HDF5 checked each chunk's Fletcher32 checksum as the arrays were read
            if digests:
                check_header(h5, f, meta["parts"][part_id].get(FILE_DIGEST_ATTR))
        except FormatError as exc:
            digest_problem = exc
    probs += _array_problems(f, meta, part_id, arrays)
    if not probs and digest_problem is not None:  # a field's own problem is the more precise report
        probs.append(digest_problem)
    if probs:
        return None, probs
    part = Partition(part_id=part_id, num_parts=meta["num_parts"],
                     num_classes=meta["num_classes"], global_num_nodes=meta["global_num_nodes"],
                     global_num_edges=meta["global_num_edges"], name=meta.get("name", "graph"),
                     **arrays)
    return part, probs


def _array_problems(f: Path, meta: dict, p: int, a: dict[str, np.ndarray]) -> list[FormatError]:
    """Shape and value checks of one part's arrays (all present, right dtypes)."""
    out: list[FormatError] = []

    def bad(field: str, msg: str) -> None:
        out.append(FormatError(f, H5_PATHS[field][0], msg))

    P, N = meta["num_parts"], meta["global_num_nodes"]
    ranges = np.asarray(meta["node_ranges"], dtype=np.int64)
    if a["node_ranges"].shape != (P + 1,) or not np.array_equal(a["node_ranges"], ranges):
        bad("node_ranges", f"does not match {META_NAME} node_ranges")
        return out
    lo, hi = int(ranges[p]), int(ranges[p + 1])
    n = hi - lo
    for field in ("orig_id", "label") + MASKS:
        if field in a and a[field].shape != (n,):
            bad(field, f"expected shape ({n},), got {a[field].shape}")
    if "feat" in a and a["feat"].shape != (n, meta["feat_dim"]):
        bad("feat", f"expected shape ({n}, {meta['feat_dim']}), got {a['feat'].shape}")
    for field in ("halo_offsets", "send_offsets"):
        if a[field].shape != (P + 1,):
            bad(field, f"expected shape ({P + 1},), got {a[field].shape}")
    if a["indptr"].shape != (n + 1,):
        bad("indptr", f"expected shape ({n + 1},), got {a['indptr'].shape}")
    if out:
        return out
    orig = a["orig_id"]
    if n and (orig.min() < 0 or orig.max() >= N):
        bad("orig_id", f"id out of range [0, {N})")
    if "label" in a and n:
        lab = a["label"]
        if lab.min() < -1 or (meta["num_classes"] and lab.max() >= meta["num_classes"]):
            bad("label", f"label out of range [-1, num_classes={meta['num_classes']})")
    # halo: sorted, inside [0, N), not owned here, offsets = owner blocks
    hg = a["halo_gid"]
    h = int(hg.shape[0])
    if h and (hg.min() < 0 or hg.max() >= N):
        bad("halo_gid", f"global id out of range [0, {N})")
    elif h and (np.diff(hg) <= 0).any():
        bad("halo_gid", f"not strictly ascending (first at position {int(np.argmax(np.diff(hg) <= 0)) + 1})")
    elif h and ((hg >= lo) & (hg < hi)).any():
        bad("halo_gid", f"holds a node owned by this part (range [{lo}, {hi}))")
    elif not np.array_equal(a["halo_offsets"], np.searchsorted(hg, ranges)):
        bad("halo_offsets", "does not match the owners of /halo/gid (searchsorted on node_ranges)")
    # local CSR
    ip, ind = a["indptr"], a["indices"]
    e = int(ind.shape[0])
    if ip[0] != 0 or ip[-1] != e:
        bad("indptr", f"must run from 0 to len(/graph/indices)={e}, got {ip[0]}..{ip[-1]}")
    elif (np.diff(ip) < 0).any():
        bad("indptr", f"not non-decreasing (first drop at row {int(np.argmax(np.diff(ip) < 0))})")
    if e and (ind.min() < 0 or ind.max() >= n + h):
        badv = ind[(ind < 0) | (ind >= n + h)][0]
        bad("indices", f"local id {badv} out of range [0, {n + h}) (owned {n} + halo {h})")
    for field in ("edge_weight", "edge_type"):
        if field in a and a[field].shape != (e,):
            bad(field, f"expected shape ({e},), got {a[field].shape}")
    if "edge_weight" in a and e and a["edge_weight"].shape == (e,) and not np.isfinite(a["edge_weight"]).all():
        bad("edge_weight", "contains NaN or Inf")
    if "edge_type" in a and e and a["edge_type"].shape == (e,) and a["edge_type"].min() < 0:
        bad("edge_type", "negative edge type")
    # send lists
    so, sl = a["send_offsets"], a["send_lid"]
    if so[0] != 0 or so[-1] != sl.shape[0] or (np.diff(so) < 0).any():
        bad("send_offsets", f"must be non-decreasing from 0 to len(/send/lid)={sl.shape[0]}")
    elif so[p + 1] != so[p]:
        bad("send_offsets", f"non-empty send list to itself (part {p})")
    elif sl.size and (sl.min() < 0 or sl.max() >= n):
        badv = sl[(sl < 0) | (sl >= n)][0]
        bad("send_lid", f"local id {badv} out of range [0, {n}) (owned nodes)")
    else:
        for q in range(P):
            blk = sl[so[q]:so[q + 1]]
            if blk.size > 1 and (np.diff(blk) <= 0).any():
                bad("send_lid", f"send list to part {q} not strictly ascending")
                break
    return out


def read_partition(path: str | os.PathLike, part_id: int, *, features: bool = True) -> Partition:
    """Read part ``part_id`` of the partition directory ``path``.

    Checks format, version, dtypes, shapes and index ranges, and raises
    :class:`FormatError` naming the file and field of the first problem.
    ``features=False`` skips reading ``/node/feat`` (``Partition.feat`` is None).
    """
    d = Path(path)
    meta = read_partition_meta(d)
    if not _is_int(part_id) and not isinstance(part_id, np.integer) or not 0 <= part_id < meta["num_parts"]:
        raise DataError(f"{d}: part_id {part_id!r} out of range [0, {meta['num_parts']})")
    part, probs = _read_part(d, meta, int(part_id), features)
    if probs:
        raise probs[0]
    assert part is not None
    return part


def reassemble(path: str | os.PathLike, *, features: bool = True) -> GraphData:
    """Rebuild the source graph (original node ids) from a partition directory.

    Edges come out grouped by destination in original id order; within a row
    they keep the order stored in the part (the source order, for directories
    written by :func:`data_io.partitioner.partition_dataset`).
    """
    d = Path(path)
    meta = read_partition_meta(d)
    N, P = meta["global_num_nodes"], meta["num_parts"]
    fields = set(meta.get("fields", []))
    parts = [read_partition(d, p, features=False) for p in range(P)]
    new_to_orig = np.concatenate([q.orig_id for q in parts]) if P else np.zeros(0, np.int64)
    src_chunks, dst_chunks, ew_chunks, et_chunks = [], [], [], []
    for q in parts:
        l2g = q.local_to_global()
        src_chunks.append(new_to_orig[l2g[q.indices]])
        dst_chunks.append(np.repeat(q.orig_id, np.diff(q.indptr)))
        if q.edge_weight is not None:
            ew_chunks.append(q.edge_weight)
        if q.edge_type is not None:
            et_chunks.append(q.edge_type)
    src = np.concatenate(src_chunks)
    dst = np.concatenate(dst_chunks)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=N), out=indptr[1:])
    data = GraphData(indptr=indptr, indices=src[order], name=meta.get("name", "graph"),
                     num_classes=meta["num_classes"], directed=bool(meta.get("directed", False)),
                     task=meta.get("task", "node"))
    if "edge_weight" in fields:
        data.edge_weight = np.concatenate(ew_chunks)[order]
    if "edge_type" in fields:
        data.edge_type = np.concatenate(et_chunks)[order]
    for field in ("label",) + MASKS:
        if field in fields:
            vals = np.concatenate([getattr(q, field) for q in parts])
            out = np.empty(N, dtype=vals.dtype)
            out[new_to_orig] = vals
            setattr(data, field, out)
    if features and "feat" in fields:
        feat = np.empty((N, meta["feat_dim"]), dtype=np.float32)
        for p in range(P):
            q = read_partition(d, p)
            feat[q.orig_id] = q.feat
        data.feat = feat
    return data
