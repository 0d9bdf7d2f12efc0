"""Convert a SNAP-style edge-list text file, streamed in byte blocks.

Format: one edge per line, ``src dst`` or ``src dst weight`` separated by
spaces or tabs; lines starting with ``#`` or ``%`` are comments; blank lines
are skipped; a ``.gz`` file is decompressed on the fly. Every line must have
the column count of the first edge line.

The file is read ``chunk_bytes`` at a time; only compact integer arrays
(uint32 ids when they fit, float32 weights) are kept per block, so a file much
larger than memory converts as long as its edges fit as ~8 bytes each.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from data_io.converters._csr import build_csr, is_symmetric, unique_ids
from data_io.converters._text import DEFAULT_CHUNK_BYTES, _Block, block_parse_bytes, iter_rows, sample_rows
from data_io.dataset import MASKS, DatasetWriter
from data_io.errors import DataError, FormatError, check_output
from data_io.memory import MIB, require_memory

log = logging.getLogger(__name__)

_MAX_EXACT = 2**53  # ids parsed as float64 (weighted files) are exact below this


def read_edgelist(src: str | os.PathLike, *, num_nodes: int | None = None,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES, csv: bool = False, weighted: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Stream an edge-list file into compact arrays.

    Args:
        src: the text file (``.gz`` allowed).
        num_nodes: when given, every id must be below it (checked per line).
        chunk_bytes: bytes parsed per step.
        csv: accept commas as separators (OGB ``edge.csv.gz``).
        weighted: accept a third (weight) column.

    Returns:
        ``(src_ids, dst_ids, weight)``: uint32 (or int64 when an id is >= 2**32)
        ``[E]`` arrays in file order, and float32 ``[E]`` weights or None.

    Raises:
        FormatError: naming the file and line of a malformed line, a negative or
            non-integer id, an id >= ``num_nodes`` or a NaN/Inf weight.
    """
    src = Path(src)
    s_parts: list[np.ndarray] = []
    d_parts: list[np.ndarray] = []
    w_parts: list[np.ndarray] = []
    nblocks = 0
    for block in iter_rows(src, ncols=(2, 3) if weighted else 2, csv=csv, chunk_bytes=chunk_bytes):
        s, d, w = _edges_of_block(block, src, num_nodes)
        s_parts.append(s)
        d_parts.append(d)
        if w is not None:
            w_parts.append(w)
        nblocks += 1
        if nblocks % 64 == 0:
            log.info("%s: %d edges read (line %d)", src, sum(len(p) for p in s_parts), block.line_of(len(s) - 1))
    if not s_parts:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32), None
    s_all = np.concatenate(s_parts)
    s_parts.clear()
    d_all = np.concatenate(d_parts)
    d_parts.clear()
    w_all = np.concatenate(w_parts) if w_parts else None
    log.debug("%s: %d edges in %d blocks", src, len(s_all), nblocks)
    return s_all, d_all, w_all


def _edges_of_block(block: _Block, src: Path, num_nodes: int | None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Check one parsed block; return compact ``(src, dst, weight)`` arrays."""
    v = block.values
    ids = v[:, :2]
    if ids.dtype != np.int64:  # a weighted file parsed as float64
        frac = (ids != np.floor(ids)) | ~np.isfinite(ids)
        if frac.any():
            r = int(np.argmax(frac.any(axis=1)))
            raise FormatError(src, f"line {block.line_of(r)}", f"node id is not an integer: {ids[r].tolist()}")
        big = np.abs(ids) >= _MAX_EXACT
        if big.any():
            r = int(np.argmax(big.any(axis=1)))
            raise FormatError(src, f"line {block.line_of(r)}", f"node id too large: {ids[r].tolist()}")
        ids = ids.astype(np.int64)
    neg = ids < 0
    if neg.any():
        r = int(np.argmax(neg.any(axis=1)))
        raise FormatError(src, f"line {block.line_of(r)}", f"negative node id in {ids[r].tolist()}")
    hi = int(ids.max())
    if num_nodes is not None and hi >= num_nodes:
        r = int(np.argmax((ids >= num_nodes).any(axis=1)))
        raise FormatError(src, f"line {block.line_of(r)}",
                          f"node id in {ids[r].tolist()} out of range [0, {num_nodes}) (--num-nodes)")
    dtype = np.uint32 if hi < 2**32 else np.int64
    w = None
    if v.shape[1] == 3:
        w = v[:, 2].astype(np.float32)
        bad = ~np.isfinite(w)
        if bad.any():
            r = int(np.argmax(bad))
            raise FormatError(src, f"line {block.line_of(r)}", f"weight {v[r, 2]} is not finite (as float32)")
    return ids[:, 0].astype(dtype), ids[:, 1].astype(dtype), w


def _relabel(s: np.ndarray, d: np.ndarray, uniq: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Map ids to ``0..U-1`` in increasing order of the original id (``uniq``: the sorted ids)."""
    dtype = np.uint32 if len(uniq) < 2**32 else np.int64
    s = np.searchsorted(uniq, s).astype(dtype)
    d = np.searchsorted(uniq, d).astype(dtype)
    return s, d, len(uniq)


def _parse_split(split: tuple[float, float, float]) -> tuple[float, float, float]:
    if len(split) != 3 or min(split) < 0 or sum(split) > 1 + 1e-9:
        raise DataError(f"--split: expected three non-negative fractions with sum <= 1, got {split}")
    return tuple(float(x) for x in split)  # type: ignore[return-value]


def edgelist_csr_bytes(num_edges: int, num_nodes: int, *, weighted: bool = False, symmetrize: bool = False,
                       remove_self_loops: bool = False, dedup: bool = False, check_symmetry: bool = True,
                       relabel: bool | None = None, num_nodes_given: bool = False, parse_bytes: int | None = None
                       ) -> int:
    """Peak memory of reading E edges of text into a CSR (:func:`read_edgelist`, the relabelling,
    :func:`~data_io.converters._csr.build_csr` and :func:`~data_io.converters._csr.is_symmetric`).

    Ids are kept as uint32 (4 bytes), weights as float32; E' = 2 E with ``symmetrize``. Phases:

    * reading: the parse of one block (``parse_bytes``, from
      :func:`~data_io.converters._text.block_parse_bytes`; default: an 8 MiB block of 10-byte
      lines with comments), or the kept ids and their concatenation, whichever is larger:
      ``max(parse, 12 E)`` (``20 E`` weighted);
    * finding the distinct ids (``relabel`` None or True, no ``num_nodes``): a sorted copy of the
      sources and of the destinations and the sorted union, U <= min(2 E, N) ids: ``8 E + 5 E + 26 U``;
    * relabelling: searchsorted's int64 result and its uint32 copy per side: ``8 E + 12 E + 4 U``;
    * the CSR: the caller's ids (8 E), int64 keys and int32 indices (12 E'), searchsorted's
      three int64 [N+1] (24 N); weighted: the stable argsort and sorted copies (32 E' + 4 E);
      ``remove_self_loops`` adds a mask and the kept copies (9 E, weights 4 E), ``dedup`` a mask
      and the in-place compaction's block copies (E' + min(4 E', 16 MiB); measured, the blocks
      are up to 32 MiB but do not coincide with the searchsorted arrays);
    * the symmetry check (not with ``symmetrize``): the CSR (8 N + 4 E', weights 4 E') and two
      int64 [E'] keys, a mask and a diff (17 E' + 8 N).
    """
    e, n = int(num_edges), int(num_nodes)
    ep = 2 * e if symmetrize else e
    if parse_bytes is None:
        parse_bytes = block_parse_bytes(DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_BYTES // 10, 3 if weighted else 2)
    phases = [max(int(parse_bytes), (20 if weighted else 12) * e)]
    if relabel is None and num_nodes_given:
        relabel = False
    if relabel is None or relabel:
        u = min(2 * e, n)
        phases.append(13 * e + 26 * u)
    if relabel:
        phases.append(20 * e + 4 * min(2 * e, n))
    phases.append(8 * e + ((32 * ep + 4 * e) if weighted else 12 * ep) + 24 * (n + 1)
                  + ((13 if weighted else 9) * e if remove_self_loops else 0)
                  + (ep + min(4 * ep, 16 * MIB) if dedup else 0))
    if check_symmetry and not symmetrize:
        phases.append(8 * (n + 1) + (8 if weighted else 4) * ep + 17 * ep + 8 * n)
    return max(phases)


def estimate_edgelist_bytes(src: str | os.PathLike, *, symmetrize: bool = False, remove_self_loops: bool = False,
                            dedup: bool = False, relabel: bool | None = None,
                            num_nodes: int | None = None, random_features: int = 0, num_classes: int = 0,
                            chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Peak memory of :func:`convert_edgelist` above the interpreter's own, in bytes (an estimate).

    E comes from :func:`~data_io.converters._text.sample_rows` (the file size and a few sampled
    pieces; 2 % added), N from ``num_nodes``, else from the largest sampled id + 1 (capped at
    2 E). The peak is the larger of :func:`edgelist_csr_bytes` and the writing phase (the CSR,
    8 N + 4 E' (weights 4 E'); the final validation's reads: indptr and its diff, 16 N, up to
    64 MiB of indices; with ``num_classes`` labels, split permutation, a mask and the labels read
    back, 25 N; with ``random_features`` 32 MiB row blocks and their projection, 48 MiB), plus 16 MiB.

    Measured (peak RSS minus RSS before the call; random ids, one comment line): E = 2 000 000,
    N = 1 000 000: 81 MiB measured, 94.5 MiB estimated (+17 %); the same with ``symmetrize``:
    80 vs 101 MiB (+26 %); with ``symmetrize``, ``dedup`` and ``num_nodes``: 105 vs 121 MiB (+15 %); weighted:
    96 vs 124.5 MiB (+29 %); weighted with ``remove_self_loops`` and ``dedup``: 111 vs 160 MiB
    (+43 %, the one case beyond 30 %); E = 1 000 000 on 10**9 sparse ids (relabelled): 69 vs 82 MiB (+19 %);
    E = 1 000 000, N = 100 000 with 64 random features and 5 classes: 94 vs 102 MiB (+9 %);
    E = 300 000 (one block): 44 vs 55 MiB (+23 %).
    """
    sample = sample_rows(src)
    e = int(sample.rows * 1.02) + 1
    weighted = sample.ncols == 3
    if num_nodes is not None:
        n = int(num_nodes)
    else:
        n = min(max(1, sample.max_value + 1), 2 * e)
    ep = 2 * e if symmetrize else e
    block = min(int(chunk_bytes), sample.text_bytes)
    csr = edgelist_csr_bytes(e, n, weighted=weighted, symmetrize=symmetrize, remove_self_loops=remove_self_loops,
                             dedup=dedup, relabel=relabel,
                             num_nodes_given=num_nodes is not None,
                             parse_bytes=block_parse_bytes(block, block * sample.rows // max(1, sample.text_bytes) + 1,
                                                           sample.ncols, comments=True))
    write = (24 * n + (8 if weighted else 4) * ep + min(4 * ep, 64 * MIB) + (25 * n if num_classes else 0)
             + (48 * MIB if random_features else 0))
    return max(csr, write) + 16 * MIB


def convert_edgelist(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                     name: str | None = None, symmetrize: bool = False, remove_self_loops: bool = False,
                     dedup: bool = False, relabel: bool | None = None, num_nodes: int | None = None,
                     random_features: int = 0, num_classes: int = 0,
                     split: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Path:
    """Convert an edge-list text file to a dataset file.

    Args:
        src: edge-list file (see the module docstring).
        out: dataset file to write (atomically).
        force: overwrite ``out`` when it exists, and only warn when the estimated peak memory
            (:func:`estimate_edgelist_bytes`) exceeds :func:`~data_io.memory.available_bytes`
            (without ``force``: :class:`~data_io.memory.MemoryRefusal` before reading the edges).
        name: dataset name (default: the file stem).
        symmetrize: add ``v -> u`` for every ``u -> v`` (the result is undirected).
        remove_self_loops: drop edges ``u -> u``.
        dedup: keep one copy of repeated edges (the first, with its weight).
        relabel: map the ids that occur to ``0..U-1`` (in id order). ``None``
            (default) relabels when the ids are sparse (fewer than half of
            ``0..max_id`` occur) and ``num_nodes`` is not given.
        num_nodes: number of nodes N; ids must be below it (or, with
            ``relabel``, at most N distinct ids). Default: max id + 1.
        random_features: attach float32 ``[N, F]`` standard-normal features.
        num_classes: attach int64 labels in ``0..C-1`` and a random
            train/val/test split. With features, a label is the argmax of a
            fixed random linear map of the features (so it can be learned);
            without, it is uniform.
        split: train/val/test fractions of the nodes.
        seed: seed of the random features, labels and split.
        chunk_bytes: bytes parsed per step (memory bound of the reader).

    Returns:
        ``out`` as a Path.
    """
    src = Path(src)
    out = check_output(out, force)
    if num_nodes is not None and num_nodes <= 0:
        raise DataError(f"--num-nodes: must be positive, got {num_nodes}")
    if random_features < 0 or num_classes < 0:
        raise DataError("--random-features/--num-classes: must be non-negative")
    split = _parse_split(split)
    require_memory(estimate_edgelist_bytes(src, symmetrize=symmetrize, remove_self_loops=remove_self_loops,
                                           dedup=dedup, relabel=relabel, num_nodes=num_nodes,
                                           random_features=random_features, num_classes=num_classes,
                                           chunk_bytes=chunk_bytes),
                   f"convert edgelist {src}", force=force)
    s, d, w = read_edgelist(src, num_nodes=None if relabel else num_nodes, chunk_bytes=chunk_bytes)
    if len(s) == 0 and num_nodes is None:
        raise FormatError(src, None, "no edges (and no --num-nodes): empty graph")
    max_id = int(max(s.max(), d.max())) if len(s) else -1
    uniq = None
    if relabel is None:
        relabel = False
        if num_nodes is None:
            uniq = unique_ids(s, d)
            relabel = len(uniq) < (max_id + 1) / 2
            if relabel:
                log.info("%s: ids are sparse (%d of 0..%d used): relabelling to 0..%d",
                         src, len(uniq), max_id, len(uniq) - 1)
            else:
                uniq = None
    if relabel:
        if uniq is None:
            uniq = unique_ids(s, d)
        s, d, used = _relabel(s, d, uniq)
        del uniq
        if num_nodes is not None and num_nodes < used:
            raise DataError(f"{src}: --num-nodes={num_nodes} is less than the {used} distinct node ids")
        n = num_nodes if num_nodes is not None else used
    else:
        n = num_nodes if num_nodes is not None else max_id + 1
    indptr, indices, weight = build_csr(s, d, n, w, symmetrize=symmetrize,
                                        remove_self_loops=remove_self_loops, dedup=dedup)
    del s, d, w
    directed = False if symmetrize else not is_symmetric(indptr, indices)
    if random_features and not num_classes:
        log.warning("--random-features without --num-classes: no labels, the dataset cannot be trained on")
    with DatasetWriter(out, num_nodes=n, feat_dim=random_features, name=name or src.name.split(".")[0],
                       num_classes=num_classes, directed=directed, force=force) as wr:
        wr.write_graph(indptr, indices, weight)
        _write_random_nodes(wr, n, random_features, num_classes, split, seed)
    log.info("converted %s -> %s (%d nodes, %d edges)", src, out, n, len(indices))
    return out


def _write_random_nodes(wr: DatasetWriter, n: int, feat_dim: int, num_classes: int,
                        split: tuple[float, float, float], seed: int) -> None:
    """Write random features (row blocks), labels and a split: see :func:`convert_edgelist`."""
    rng = np.random.default_rng(seed)
    label = np.empty(n, dtype=np.int64) if num_classes else None
    if feat_dim:
        proj = rng.standard_normal((feat_dim, max(1, num_classes)), dtype=np.float32)
        step = max(1, (32 << 20) // (4 * feat_dim))
        for start in range(0, n, step):
            rows = rng.standard_normal((min(step, n - start), feat_dim), dtype=np.float32)
            wr.write_feat(start, rows)
            if label is not None:
                label[start:start + len(rows)] = np.argmax(rows @ proj, axis=1)
    elif label is not None:
        label[:] = rng.integers(0, num_classes, size=n)
    if label is None:
        return
    wr.write_node("label", label)
    perm = rng.permutation(n)
    bounds = np.cumsum([0, *(int(round(f * n)) for f in split)])
    bounds = np.minimum(bounds, n)
    for m, lo, hi in zip(MASKS, bounds[:-1], bounds[1:]):
        mask = np.zeros(n, dtype=bool)
        mask[perm[lo:hi]] = True
        wr.write_node(m, mask)
