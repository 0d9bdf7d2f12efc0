"""Shared pieces of the synthetic generators.

* :class:`GeneratorParamError`: a bad generator argument, naming the parameter.
* Seeded sub-streams, so that each part of a graph (edges, permutation,
  features, labels, split) has its own reproducible random stream.
* :func:`coo_to_csr`: edge list -> CSR over destinations by a counting sort,
  optionally symmetrised, without self-loops and without duplicates.
* Feature rows produced in fixed blocks (same values whether the graph is built
  in memory or streamed to a file).
* :class:`GeneratedGraph`: a generator's output, turned into a :class:`GraphData`
  or written through :class:`DatasetWriter` with features in row blocks.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Callable, Iterator

import numpy as np
from numba import njit, prange

from data_io.dataset import MASKS, DatasetWriter, GraphData
from data_io.errors import DataError

log = logging.getLogger(__name__)

# sub-stream ids of np.random.SeedSequence([seed, stream, ...])
STREAM_PERM, STREAM_FEAT, STREAM_LABEL, STREAM_SPLIT, STREAM_EDGES, STREAM_MEANS, STREAM_DEGREE = range(1, 8)
# bytes of float32 features produced per block
_FEAT_BLOCK_BYTES = 8 << 20


class GeneratorParamError(DataError):
    """A generator argument is out of range: ``param`` names it (e.g. ``"scale"``)."""

    def __init__(self, param: str, message: str):
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}")


# -- argument checks ---------------------------------------------------------------------------

def check_int(param: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """Return ``value`` as an int in ``[lo, hi]`` or raise :class:`GeneratorParamError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise GeneratorParamError(param, f"expected an integer, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise GeneratorParamError(param, f"must be in {rng}, got {value}")
    return value


def check_float(param: str, value, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> float:
    """Return ``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise GeneratorParamError(param, f"expected a number, got {value!r}") from None
    if not math.isfinite(value):
        raise GeneratorParamError(param, f"must be finite, got {value}")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise GeneratorParamError(param, f"must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise GeneratorParamError(param, f"must be <= {hi}, got {value}")
    return value


def check_split(train: float, val: float, test: float) -> tuple[float, float, float]:
    """Check split fractions: each in [0, 1] and their sum <= 1."""
    fr = (check_float("train_frac", train, 0.0, 1.0), check_float("val_frac", val, 0.0, 1.0),
          check_float("test_frac", test, 0.0, 1.0))
    if sum(fr) > 1.0 + 1e-9:
        raise GeneratorParamError("train_frac", f"train, val and test fractions sum to {sum(fr):g} > 1")
    return fr


def check_seed(seed) -> int:
    return check_int("seed", seed, 0, 2**63 - 1)


# -- random streams ------------------------------------------------------------------------------

def rng_for(seed: int, stream: int, *extra: int) -> np.random.Generator:
    """Independent generator for one part of a graph (``stream``) and optional block ids."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream, *extra]))


def random_split(num_nodes: int, fractions: tuple[float, float, float], seed: int) -> dict[str, np.ndarray]:
    """Random disjoint train/val/test masks (bool[N]) of sizes ``round(f * N)``."""
    order = rng_for(seed, STREAM_SPLIT).permutation(num_nodes)
    sizes = [int(round(f * num_nodes)) for f in fractions]
    sizes[-1] = min(sizes[-1], num_nodes - sizes[0] - sizes[1])
    masks, start = {}, 0
    for name, size in zip(MASKS, sizes):
        m = np.zeros(num_nodes, dtype=np.bool_)
        m[order[start:start + size]] = True
        masks[name] = m
        start += size
    return masks


def feat_block_rows(feat_dim: int) -> int:
    """Rows per feature block (depends only on ``feat_dim``, so results are reproducible)."""
    return max(64, _FEAT_BLOCK_BYTES // max(1, 4 * feat_dim))


def gaussian_feat_blocks(num_nodes: int, feat_dim: int, seed: int,
                         means: np.ndarray | None = None, label: np.ndarray | None = None
                         ) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, rows)`` blocks of float32[rows, F] standard-normal features.

    With ``means`` (float32[C, F]) and ``label`` (int64[N]), row i is shifted by
    ``means[label[i]]``. Block b uses its own seeded stream, so any consumer sees
    the same values.
    """
    step = feat_block_rows(feat_dim)
    for b, start in enumerate(range(0, num_nodes, step)):
        stop = min(num_nodes, start + step)
        rows = rng_for(seed, STREAM_FEAT, b).standard_normal((stop - start, feat_dim), dtype=np.float32)
        if means is not None:
            rows += means[label[start:stop]]
        yield start, rows


# -- edge list -> CSR ------------------------------------------------------------------------------

@njit(cache=True)
def _in_degrees(src, dst, num_nodes, symmetric, drop_loops):
    deg = np.zeros(num_nodes + 1, dtype=np.int64)
    for e in range(src.shape[0]):
        s, d = src[e], dst[e]
        if drop_loops and s == d:
            continue
        deg[d + 1] += 1
        if symmetric:
            deg[s + 1] += 1
    return deg


@njit(cache=True)
def _scatter(src, dst, symmetric, drop_loops, indptr, indices):
    pos = indptr[:-1].copy()
    for e in range(src.shape[0]):
        s, d = src[e], dst[e]
        if drop_loops and s == d:
            continue
        indices[pos[d]] = s
        pos[d] += 1
        if symmetric:
            indices[pos[s]] = d
            pos[s] += 1


@njit(parallel=True, cache=True)
def _sort_rows_count_unique(indptr, indices, counts):
    for i in prange(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        if hi - lo > 1:
            indices[lo:hi].sort()
        k = 0
        for j in range(lo, hi):
            if j == lo or indices[j] != indices[j - 1]:
                k += 1
        counts[i + 1] = k


@njit(cache=True)
def _compact_unique(indptr, indices, new_indptr):
    # new row i starts at or before old row i: a forward sequential copy is safe in place
    for i in range(indptr.shape[0] - 1):
        lo, hi = indptr[i], indptr[i + 1]
        w = new_indptr[i]
        for j in range(lo, hi):
            if j == lo or indices[j] != indices[j - 1]:
                indices[w] = indices[j]
                w += 1


def coo_to_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, *, symmetric: bool,
               drop_self_loops: bool, dedupe: bool) -> tuple[np.ndarray, np.ndarray]:
    """Build a CSR over destinations from edges ``src[e] -> dst[e]`` by counting sort.

    Args:
        src, dst: int32/int64[M] endpoints in ``[0, num_nodes)``.
        symmetric: also insert ``dst[e] -> src[e]`` for every edge.
        drop_self_loops: skip edges with ``src == dst``.
        dedupe: keep one copy of each (source, destination) pair; rows come out sorted.

    Returns:
        ``(indptr int64[N+1], indices[E])`` with ``indices`` of ``src``'s dtype.
    """
    indptr = _in_degrees(src, dst, num_nodes, symmetric, drop_self_loops)
    np.cumsum(indptr, out=indptr)
    indices = np.empty(int(indptr[-1]), dtype=src.dtype)
    _scatter(src, dst, symmetric, drop_self_loops, indptr, indices)
    counts = np.zeros(num_nodes + 1, dtype=np.int64)
    _sort_rows_count_unique(indptr, indices, counts)
    if dedupe:
        np.cumsum(counts, out=counts)
        if counts[-1] < indptr[-1]:
            _compact_unique(indptr, indices, counts)
            indices = indices[:counts[-1]].copy()
        indptr = counts
    return indptr, indices


def check_edge_types(value) -> int:
    """The ``edge_types`` argument: 0 (untyped) or a type count R in [1, 32767] (int16 storage)."""
    return check_int("edge_types", value, 0, 32767)


# -- edge types ------------------------------------------------------------------------------------

@njit(cache=True, parallel=True)
def _edge_types_kernel(indptr, indices, num_types, seed, label, split, out):
    n = len(indptr) - 1
    mult1 = np.uint64(0x9E3779B97F4A7C15)
    mult2 = np.uint64(0xBF58476D1CE4E5B9)
    mult3 = np.uint64(0x94D049BB133111EB)
    same_types = (num_types + 1) // 2
    for i in prange(n):
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            lo, hi = (i, j) if i < j else (j, i)
            x = np.uint64(lo) * mult1 + np.uint64(hi) * mult2 + np.uint64(seed) * mult3 + np.uint64(1)
            x ^= x >> np.uint64(30)
            x *= mult2
            x ^= x >> np.uint64(27)
            x *= mult3
            x ^= x >> np.uint64(31)
            if split and num_types >= 2:
                if label[i] == label[j]:
                    out[e] = np.int16(x % np.uint64(same_types))
                else:
                    out[e] = np.int16(same_types + x % np.uint64(num_types - same_types))
            else:
                out[e] = np.int16(x % np.uint64(num_types))


def draw_edge_types(indptr: np.ndarray, indices: np.ndarray, num_types: int, seed: int,
               label: np.ndarray | None = None) -> np.ndarray:
    """int16[E]: a type in ``[0, num_types)`` for every edge of a CSR, from a hash of its unordered end points.

    An edge and its reverse get the same type (the hash is of ``(min, max)`` and ``seed``), so a
    symmetric graph stays symmetric per type. Without ``label`` the types are uniform and carry no
    signal (scale tests). With ``label`` int64[N] and ``num_types >= 2``, edges inside a class draw
    from the first ``ceil(R / 2)`` types and edges between classes from the others, so a
    relational model can tell them apart (a plain GCN cannot).
    """
    out = np.empty(len(indices), dtype=np.int16)
    lab = np.zeros(1, dtype=np.int64) if label is None else np.asarray(label, dtype=np.int64)
    _edge_types_kernel(np.asarray(indptr, dtype=np.int64), indices, int(num_types), int(seed), lab,
                       label is not None, out)
    return out


# -- output ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class GeneratedGraph:
    """Everything a generator produced except the features, which come in blocks.

    ``feat_blocks()`` yields ``(start, float32[rows, feat_dim])`` covering all rows in order.
    """

    name: str
    indptr: np.ndarray
    indices: np.ndarray
    label: np.ndarray
    masks: dict[str, np.ndarray]
    num_classes: int
    directed: bool
    feat_dim: int
    feat_blocks: Callable[[], Iterator[tuple[int, np.ndarray]]]
    edge_type: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(len(self.indptr) - 1)

    def to_graph_data(self) -> GraphData:
        """Assemble a :class:`GraphData` (features float32[N, F] in memory)."""
        feat = None
        if self.feat_dim:
            feat = np.empty((self.num_nodes, self.feat_dim), dtype=np.float32)
            for start, rows in self.feat_blocks():
                feat[start:start + len(rows)] = rows
        return GraphData(indptr=self.indptr, indices=self.indices, feat=feat, label=self.label,
                         name=self.name, num_classes=self.num_classes, directed=self.directed,
                         edge_type=self.edge_type, **self.masks)

    def write(self, path: str | os.PathLike, force: bool) -> dict[str, int]:
        """Write atomically through :class:`DatasetWriter`, features block by block."""
        t0 = time.perf_counter()
        n = self.num_nodes
        with DatasetWriter(path, num_nodes=n, feat_dim=self.feat_dim, name=self.name,
                           num_classes=self.num_classes, directed=self.directed, force=force) as w:
            w.write_graph(self.indptr, self.indices, edge_type=self.edge_type)
            w.write_node("label", self.label)
            for m, v in self.masks.items():
                w.write_node(m, v)
            next_report = 0.25
            for start, rows in (self.feat_blocks() if self.feat_dim else ()):
                w.write_feat(start, rows)
                done = (start + len(rows)) / n
                if done >= next_report and done < 1.0:
                    log.info("%s: features %d%% written", path, int(100 * done))
                    next_report += 0.25
        log.info("%s: written in %.1f s", path, time.perf_counter() - t0)
        return {"num_nodes": n, "num_edges": int(len(self.indices)), "feat_dim": self.feat_dim}
