"""Graph500 Kronecker (R-MAT) graphs with random features, labels and split.

``2**scale`` vertices and ``edge_factor * 2**scale`` generated edges, drawn by
the parallel numba kernel :func:`numba_kernels.cpu.rmat.rmat_edges` (quadrant
probabilities a=0.57, b=0.19, c=0.19, d=0.05 by default). As in Graph500, vertex
ids are randomly permuted so that degree is not correlated with id. The CSR
(over destinations) is built by a counting sort; by default the graph is
symmetrised and self-loops and duplicate edges are removed.

Features are float32 standard normals, labels uniform in ``[0, num_classes)``;
neither carries any signal (this generator is for scale and speed tests).
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from data_io.dataset import GraphData
from data_io.errors import check_output
from data_io.memory import MIB, require_memory
from data_io.generators._common import (
    STREAM_LABEL, STREAM_PERM, GeneratedGraph, GeneratorParamError, check_float, check_int, check_seed,
    check_edge_types, check_split, coo_to_csr, draw_edge_types, gaussian_feat_blocks, random_split, rng_for,
)
from numba_kernels.cpu.rmat import rmat_edges

log = logging.getLogger(__name__)

GRAPH500_ABC = (0.57, 0.19, 0.19)


def _check_args(scale, edge_factor, a, b, c, feat_dim, num_classes, fractions, seed):
    scale = check_int("scale", scale, 1, 40)
    edge_factor = check_int("edge_factor", edge_factor, 0)
    a, b, c = (check_float(p, v, 0.0, 1.0) for p, v in (("a", a), ("b", b), ("c", c)))
    if a + b + c > 1.0 + 1e-12:
        raise GeneratorParamError("a", f"a + b + c = {a + b + c:g} > 1 (d = 1 - a - b - c)")
    if a + b <= 0.0 or a + b >= 1.0:
        raise GeneratorParamError("a", f"a + b must be in (0, 1), got {a + b:g}")
    feat_dim = check_int("feat_dim", feat_dim, 0)
    num_classes = check_int("num_classes", num_classes, 1, 2**scale)
    return scale, edge_factor, (a, b, c), feat_dim, num_classes, check_split(*fractions), check_seed(seed)


def _build(scale: int, edge_factor: int, abc: tuple[float, float, float], symmetrize: bool,
           remove_self_loops: bool, remove_duplicates: bool, feat_dim: int, num_classes: int,
           fractions: tuple[float, float, float], seed: int) -> GeneratedGraph:
    n = 1 << scale
    m = edge_factor * n
    idx = np.int32 if n <= 2**31 - 1 else np.int64
    t0 = time.perf_counter()
    log.info("rmat: scale %d, %d nodes, drawing %d edges", scale, n, m)
    perm = rng_for(seed, STREAM_PERM).permutation(n).astype(idx)
    src = np.empty(m, dtype=idx)
    dst = np.empty(m, dtype=idx)
    rmat_edges(seed, scale, abc[0], abc[1], abc[2], 0, perm, src, dst)
    del perm
    log.info("rmat: edges drawn in %.1f s; building CSR", time.perf_counter() - t0)
    indptr, indices = coo_to_csr(src, dst, n, symmetric=symmetrize, drop_self_loops=remove_self_loops,
                                 dedupe=remove_duplicates)
    del src, dst
    log.info("rmat: CSR with %d edges after %.1f s", len(indices), time.perf_counter() - t0)
    label = rng_for(seed, STREAM_LABEL).integers(0, num_classes, n, dtype=np.int64)
    masks = random_split(n, fractions, seed)
    name = f"rmat-s{scale}-ef{edge_factor}"
    return GeneratedGraph(name=name, indptr=indptr, indices=indices, label=label, masks=masks,
                          num_classes=num_classes, directed=not symmetrize, feat_dim=feat_dim,
                          feat_blocks=lambda: gaussian_feat_blocks(n, feat_dim, seed))


def estimate_rmat_bytes(scale: int, edge_factor: int = 16, *, symmetrize: bool = True,
                        remove_duplicates: bool = True, edge_types: int = 0) -> int:
    """Peak memory of :func:`write_rmat` above the interpreter's own, in bytes (an upper bound).

    With N = 2**scale, M = edge_factor * N generated edges, s = 4 bytes per id (int32; 8 when
    N >= 2**31) and E0 = 2M with ``symmetrize`` (else M) CSR entries before de-duplication,
    the peak is the larger of two phases, plus 16 MiB (one 8 MiB feature block, HDF5 buffers):

    * building the CSR (:func:`~data_io.generators._common.coo_to_csr`): the edge arrays src, dst
      (2 s M), the unsorted indices (s E0), their de-duplicated copy (s E0, upper bound: the
      copy is only as long as the distinct edges) and indptr + counts (2 x 8 N):
      ``2 s M + 2 s E0 + 16 N`` (``2 s M + s E0 + 16 N`` without ``remove_duplicates``);
    * writing, at the final validation of the file: the CSR (8 N + s E0), labels (8 N), masks
      (3 N), edge types (2 E0, with ``edge_types``) and what the validation reads back (indptr
      and its diff, 16 N, the labels, 8 N, and up to 64 MiB of indices):
      ``(s + 2) E0 + min(s E0, 64 MiB) + 43 N``.

    Measured (peak RSS minus RSS before the call, ``edge_factor=16``, ``feat_dim=128``, defaults):
    scale 16: 36.3 MiB measured, 41 MiB estimated (+13 %); scale 18: 96.8 vs 116 MiB (+20 %);
    scale 20: 392 vs 416 MiB (+6 %).
    """
    n = 1 << int(scale)
    m = int(edge_factor) * n
    s = 4 if n <= 2**31 - 1 else 8
    e0 = 2 * m if symmetrize else m
    build = 2 * s * m + s * e0 * (2 if remove_duplicates else 1) + 16 * (n + 1)
    write = (s + (2 if edge_types else 0)) * e0 + min(s * e0, 64 * MIB) + 43 * n
    return max(build, write) + 16 * MIB


def generate_rmat(scale: int, edge_factor: int = 16, *, a: float = 0.57, b: float = 0.19, c: float = 0.19,
                  symmetrize: bool = True, remove_self_loops: bool = True, remove_duplicates: bool = True,
                  feat_dim: int = 128, num_classes: int = 16,
                  train_frac: float = 0.6, val_frac: float = 0.2, test_frac: float = 0.2,
                  seed: int = 0, edge_types: int = 0) -> GraphData:
    """Generate a Graph500 Kronecker graph in memory.

    Args:
        scale: log2 of the number of nodes, 1..40 (N = 2**scale).
        edge_factor: generated edges per node (M = edge_factor * N, before
            symmetrisation and removal of self-loops/duplicates).
        a, b, c: R-MAT quadrant probabilities (d = 1 - a - b - c).
        symmetrize: add the reverse of every edge (undirected graph).
        remove_self_loops, remove_duplicates: clean the edge list.
        feat_dim: width F of the float32 N(0, 1) features (0: no features).
        num_classes: labels are uniform in ``[0, num_classes)``.
        train_frac, val_frac, test_frac: random disjoint split (sum <= 1).
        seed: int >= 0; equal seeds give identical arrays.
        edge_types: 0 (untyped), or R: a typed graph whose ``edge_type`` int16[E] is uniform in
            ``[0, R)`` from a hash of each edge's unordered end points (an edge and its reverse share
            a type; no signal: for scale and memory tests of relational models).

    Returns:
        :class:`GraphData` with indptr int64[N+1], indices int32[E] (int64 when
        N >= 2**31), feat float32[N, F], label int64[N], the three masks bool[N] and,
        with ``edge_types``, edge_type int16[E].

    Raises:
        GeneratorParamError: an argument out of range (names the parameter).
    """
    args = _check_args(scale, edge_factor, a, b, c, feat_dim, num_classes, (train_frac, val_frac, test_frac), seed)
    edge_types = check_edge_types(edge_types)
    scale, edge_factor, abc, feat_dim, num_classes, fractions, seed = args
    return _typed(_build(scale, edge_factor, abc, symmetrize, remove_self_loops, remove_duplicates, feat_dim,
                         num_classes, fractions, seed), edge_types, seed).to_graph_data()


def write_rmat(path: str | os.PathLike, scale: int, edge_factor: int = 16, *, a: float = 0.57,
               b: float = 0.19, c: float = 0.19, symmetrize: bool = True, remove_self_loops: bool = True,
               remove_duplicates: bool = True, feat_dim: int = 128, num_classes: int = 16,
               train_frac: float = 0.6, val_frac: float = 0.2, test_frac: float = 0.2, seed: int = 0,
               edge_types: int = 0, force: bool = False) -> dict[str, int]:
    """Generate a Graph500 Kronecker graph straight into a dataset file.

    Same arguments and same arrays as :func:`generate_rmat`, but features are
    produced and written in row blocks, so peak memory is the CSR plus one
    block (about ``24 * edge_factor * N`` bytes for N < 2**31, see
    :func:`estimate_rmat_bytes`). The file appears only when complete; an existing
    ``path`` is replaced only with ``force``. Arguments are checked before anything
    is computed or written, and so is the memory: :class:`~data_io.memory.MemoryRefusal`
    when the estimate exceeds :func:`~data_io.memory.available_bytes` (``force`` also
    skips that check, with a logged warning).

    Returns:
        ``{"num_nodes": N, "num_edges": E, "feat_dim": F}``.
    """
    args = _check_args(scale, edge_factor, a, b, c, feat_dim, num_classes, (train_frac, val_frac, test_frac), seed)
    edge_types = check_edge_types(edge_types)
    check_output(path, force)
    scale, edge_factor, abc, feat_dim, num_classes, fractions, seed = args
    require_memory(estimate_rmat_bytes(scale, edge_factor, symmetrize=symmetrize,
                                       remove_duplicates=remove_duplicates, edge_types=edge_types),
                   f"generate rmat --scale {scale} --edge-factor {edge_factor}", force=force,
                   hint="use a smaller --scale or --edge-factor")
    g = _build(scale, edge_factor, abc, symmetrize, remove_self_loops, remove_duplicates, feat_dim,
               num_classes, fractions, seed)
    return _typed(g, edge_types, seed).write(path, force)


def _typed(g, edge_types: int, seed: int):
    """``g`` with uniform hashed edge types when ``edge_types`` > 0 (see :func:`generate_rmat`)."""
    if edge_types:
        g.edge_type = draw_edge_types(g.indptr, g.indices, edge_types, seed)
        g.name += f"-t{edge_types}"
    return g
