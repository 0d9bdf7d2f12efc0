"""Checksums of every HDF5 file hpc_graph writes: a per-chunk filter HDF5 verifies, and content digests.

Two layers protect a dataset file or a part file:

* **Fletcher32, per chunk.** Every numeric dataset is created chunked with HDF5's
  Fletcher32 filter (:func:`create_dataset`). HDF5 recomputes the checksum of each
  chunk it reads; a flipped byte makes the read fail, and the readers report that as
  one line naming the file and the dataset. It costs nothing to check at load.
  Variable-length strings (``/node/text``) cannot carry a filter; the digest below
  covers them.
* **sha256 digests of the content.** When a writer finishes a file it seals it
  (:func:`seal`): each dataset gets the attribute ``sha256`` of its content (its
  elements in C order, as stored), and the file the root attribute
  ``content_sha256`` over its datasets' names and digests and its other root
  attributes. A partitioner records each part's ``content_sha256`` in
  ``partition.json``. :func:`verify` recomputes everything (``hpc-graph check``);
  :func:`file_digest` recomputes the file digest from the stored attributes alone
  (no data read), which the loaders compare with ``partition.json`` at load: a part
  file from another partitioning, or one whose attributes were altered, is refused.

A file written before checksums existed has neither: it still loads, and
``hpc-graph check`` says it is unprotected.
"""
from __future__ import annotations

import hashlib
from typing import Any

import h5py
import numpy as np

from data_io.errors import FormatError

DIGEST_ATTR = "sha256"
FILE_DIGEST_ATTR = "content_sha256"
_BLOCK_BYTES = 4 << 20  # rows hashed per read (a small transient beside a writer's own peak)


class Digest:
    """The sha256 content digest of a dataset of ``dtype`` and ``shape``, fed its rows in order: what
    :func:`dataset_digest` computes from the stored data, computed instead from the rows as they are written
    (no read-back). ``update(rows)`` takes the next rows; ``hexdigest()`` once all are in."""

    def __init__(self, dtype: Any, shape: tuple[int, ...]):
        self._h = hashlib.sha256(f"{np.dtype(dtype).str}{tuple(int(s) for s in shape)}".encode())
        self.dtype = np.dtype(dtype)

    def update(self, rows: np.ndarray) -> None:
        self._h.update(np.ascontiguousarray(rows, dtype=self.dtype).view(np.uint8))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _filterable(dtype: Any) -> bool:
    return h5py.check_string_dtype(np.dtype(dtype)) is None and np.dtype(dtype).kind != "O"


def create_dataset(h5: h5py.Group, name: str, *, data: Any = None, shape: tuple[int, ...] | None = None,
                   dtype: Any = None, chunks: Any = None, **kw: Any) -> h5py.Dataset:
    """``h5.create_dataset`` with the Fletcher32 filter (and chunking, which the filter needs) whenever the
    dtype allows one. ``chunks``: a chunk shape, or None for h5py's guess."""
    if data is not None and not isinstance(data, np.ndarray):
        data = np.asarray(data, dtype=dtype)
    dt = dtype if dtype is not None else data.dtype
    if _filterable(dt):
        kw.update(fletcher32=True, chunks=chunks if chunks is not None else True)
    elif chunks is not None:
        kw["chunks"] = chunks
    ds = h5.create_dataset(name, data=data, shape=shape, dtype=dtype, **kw)
    if data is not None and _filterable(ds.dtype):  # digested from memory now, not read back by seal()
        d = Digest(ds.dtype, ds.shape)
        d.update(data)
        ds.attrs[DIGEST_ATTR] = d.hexdigest()
    return ds


def _datasets(h5: h5py.File) -> list[h5py.Dataset]:
    out: list[h5py.Dataset] = []
    h5.visititems(lambda _name, obj: out.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return sorted(out, key=lambda d: d.name)


def dataset_digest(ds: h5py.Dataset) -> str:
    """sha256 (hex) of a dataset's content: shape, dtype, then the elements in C order (strings as
    length-prefixed UTF-8), read in blocks of rows."""
    text = h5py.check_string_dtype(ds.dtype) is not None
    if not text:
        d = Digest(ds.dtype, ds.shape)
        if ds.ndim == 0:
            d.update(np.asarray(ds[()]))
            return d.hexdigest()
        step = max(1, _BLOCK_BYTES // max(1, int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize))
        for s in range(0, ds.shape[0] if ds.size else 0, step):
            d.update(ds[s:s + step])
        return d.hexdigest()
    h = hashlib.sha256(f"{ds.dtype.str}{tuple(ds.shape)}".encode())
    if ds.shape is None or ds.size == 0:
        return h.hexdigest()
    step = max(1, _BLOCK_BYTES // (8 * max(1, int(np.prod(ds.shape[1:], dtype=np.int64)))))
    for s in range(0, ds.shape[0], step):
        for t in ds[s:s + step].ravel():
            b = t if isinstance(t, bytes) else str(t).encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def _attr_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, np.ndarray):
        return f"{value.dtype.str}{value.shape}{value.tolist()}"
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def file_digest(h5: h5py.File) -> str | None:
    """sha256 over the stored per-dataset digests and the root attributes (other than the file digest);
    None when a dataset has no digest (a file written without checksums). Reads no data."""
    h = hashlib.sha256()
    for ds in _datasets(h5):
        d = ds.attrs.get(DIGEST_ATTR)
        if d is None:
            return None
        h.update(f"{ds.name}\0{_attr_text(d)}\n".encode())
    for k in sorted(h5.attrs):
        if k != FILE_DIGEST_ATTR:
            h.update(f"@{k}\0{_attr_text(h5.attrs[k])}\n".encode())
    return h.hexdigest()


def seal(h5: h5py.File) -> str:
    """Digest the datasets of the open (writable) file that have no digest yet (read back) into their ``sha256``
    attributes, and the file into the root attribute ``content_sha256``; return the file digest. Call it last,
    after every write. A dataset created with its data by :func:`create_dataset`, or given a :class:`Digest` of
    its rows as written, already has its digest (so it must not be written to after that)."""
    for ds in _datasets(h5):
        if DIGEST_ATTR not in ds.attrs:
            ds.attrs[DIGEST_ATTR] = dataset_digest(ds)
    digest = file_digest(h5)
    assert digest is not None
    h5.attrs[FILE_DIGEST_ATTR] = digest
    return digest


def stored_digest(h5: h5py.File) -> str | None:
    """The file's recorded ``content_sha256`` (None when it has none)."""
    d = h5.attrs.get(FILE_DIGEST_ATTR)
    return None if d is None else _attr_text(d)


def check_header(h5: h5py.File, source: Any, expected: str | None = None) -> None:
    """Cheap load-time check (attributes only): the recorded file digest matches the datasets' recorded
    digests and root attributes, and ``expected`` (from ``partition.json``) when given. Raises
    :class:`FormatError` naming the file; a file without digests passes (it is unprotected)."""
    stored = stored_digest(h5)
    if stored is None:
        return
    now = file_digest(h5)
    if now != stored:
        raise FormatError(source, f"/@{FILE_DIGEST_ATTR}",
                          "does not match the file's own attributes and dataset digests (its metadata was "
                          "altered or damaged; rewrite the file)")
    if expected is not None and expected != stored:
        raise FormatError(source, f"/@{FILE_DIGEST_ATTR}",
                          "differs from the digest partition.json records for this part (a part file from "
                          "another partitioning, or rewritten since; partition again)")


def verify(h5: h5py.File, source: Any, expected: str | None = None) -> tuple[bool, list[FormatError]]:
    """Recompute every digest of an open file (reads all of it; HDF5 checks each chunk's Fletcher32 on the
    way), and compare the file digest with ``expected`` (from ``partition.json``) when given. Returns
    ``(protected, problems)``: ``protected`` is False for a file written without checksums (nothing to
    compare with; only unreadable chunks are reported then)."""
    probs: list[FormatError] = []
    datasets = _datasets(h5)
    protected = stored_digest(h5) is not None
    for ds in datasets:
        try:
            got = dataset_digest(ds)
        except (OSError, RuntimeError, ValueError) as exc:
            probs.append(FormatError(source, ds.name, f"unreadable: a chunk fails its checksum or is truncated "
                                                      f"({exc})"))
            continue
        want = ds.attrs.get(DIGEST_ATTR)
        if want is None:
            if protected:
                probs.append(FormatError(source, ds.name, "has no sha256 digest although the file is sealed "
                                                          "(a dataset added after writing)"))
            continue
        if _attr_text(want) != got:
            probs.append(FormatError(source, ds.name, "content differs from its recorded sha256 digest "
                                                      "(the data changed after writing)"))
        elif protected and _filterable(ds.dtype) and ds.size and not ds.fletcher32:
            probs.append(FormatError(source, ds.name, "written without the Fletcher32 filter"))
    if protected:
        try:
            check_header(h5, source, expected)
        except FormatError as exc:
            probs.append(exc)
    return protected, probs
