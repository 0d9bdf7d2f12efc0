"""Contextual stochastic block model (CSBM) graphs for node classification.

Nodes get balanced class labels. The graph has ``round(num_nodes *
avg_degree / 2)`` distinct undirected edges without self-loops, of which a
fraction ``homophily`` join two nodes of the same class. Each edge picks its
first end ``u`` with probability proportional to a propensity ``theta_u`` (1
for everyone, or power-law distributed with ``power_law``: a degree-corrected
SBM), then its second end, again proportional to theta, inside ``u``'s class or
outside it. The CSR holds both directions of every edge.

Features are ``mu[label] + N(0, I)`` with class means ``mu_c`` of norm ``snr``
in random directions: the larger ``snr``, the more the features alone reveal
the label. The defaults (weak features, strongly homophilous graph) make a
graph convolution clearly better than a feature-only model.
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
    STREAM_DEGREE, STREAM_EDGES, STREAM_LABEL, STREAM_MEANS, GeneratedGraph, GeneratorParamError, check_float,
    check_edge_types, check_int, check_seed, check_split, coo_to_csr, draw_edge_types, gaussian_feat_blocks,
    random_split, rng_for,
)

log = logging.getLogger(__name__)


def _check_args(num_nodes, num_classes, avg_degree, homophily, feat_dim, snr, power_law, fractions, seed):
    num_nodes = check_int("num_nodes", num_nodes, 1, 2**31 - 1)
    num_classes = check_int("num_classes", num_classes, 1)
    if num_classes > num_nodes:
        raise GeneratorParamError("num_classes", f"{num_classes} classes for only {num_nodes} nodes")
    avg_degree = check_float("avg_degree", avg_degree, 0.0, float(num_nodes - 1))
    homophily = check_float("homophily", homophily, 0.0, 1.0)
    if num_classes == 1 and homophily < 1.0:
        raise GeneratorParamError("homophily", "must be 1 with a single class (no inter-class edges possible)")
    feat_dim = check_int("feat_dim", feat_dim, 0)
    snr = check_float("snr", snr, 0.0)
    if power_law is not None:
        power_law = check_float("power_law", power_law, 2.0, lo_open=True)
    sizes = np.full(num_classes, num_nodes // num_classes, dtype=np.int64)
    sizes[:num_nodes % num_classes] += 1
    same_pairs = int((sizes * (sizes - 1) // 2).sum())
    m = int(round(num_nodes * avg_degree / 2))
    m_same = int(round(homophily * m))
    if m_same > same_pairs or m - m_same > num_nodes * (num_nodes - 1) // 2 - same_pairs:
        raise GeneratorParamError("avg_degree", f"{avg_degree:g} with homophily {homophily:g} needs more "
                                  f"same- or cross-class node pairs than {num_nodes} nodes in "
                                  f"{num_classes} classes have")
    return (num_nodes, num_classes, avg_degree, homophily, feat_dim, snr, power_law,
            check_split(*fractions), check_seed(seed))


def _propensities(n: int, avg_degree: float, power_law: float | None, seed: int) -> np.ndarray:
    """theta float64[N], mean 1: ones, or Pareto with density ~ x**-power_law (capped at degree N-1)."""
    if power_law is None:
        return np.ones(n)
    u = rng_for(seed, STREAM_DEGREE).random(n)
    theta = (1.0 - u) ** (-1.0 / (power_law - 1.0))
    theta /= theta.mean()
    if avg_degree > 0:
        np.minimum(theta, (n - 1) / avg_degree, out=theta)
    return theta / theta.mean()


def _sample_edges(label: np.ndarray, theta: np.ndarray, num_classes: int, num_edges: int,
                  homophily: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``num_edges`` distinct undirected pairs (u < v as int64 arrays), no self-loops.

    ``round(homophily * num_edges)`` pairs join nodes of one class, the rest join
    different classes. Each pair: u ~ theta, then v ~ theta inside (or outside)
    u's class. Pairs are drawn in rounds until each group has its count of
    distinct pairs (or 60 rounds pass, when the group has too few possible pairs).
    """
    rng = rng_for(seed, STREAM_EDGES)
    n = len(label)
    order = np.argsort(label, kind="stable")             # nodes grouped by class
    cum = np.cumsum(theta[order])                        # cumulative propensity in that order
    total = cum[-1]
    pos_end = np.searchsorted(label[order], np.arange(num_classes), side="right")   # class c: [pos_start, pos_end)
    pos_start = np.concatenate(([0], pos_end[:-1]))
    cum0 = np.concatenate(([0.0], cum))

    def draw(k: int, same: bool) -> np.ndarray:
        """k pairs as keys min * n + max, self-loops dropped (int64[<= k])."""
        u = order[np.minimum(np.searchsorted(cum, rng.random(k) * total, side="right"), n - 1)]
        cu = label[u]
        a, b = pos_start[cu], pos_end[cu]
        lo, hi = cum0[a], cum0[b]
        r = rng.random(k)
        if same:   # x in [lo, hi)
            p = np.clip(np.searchsorted(cum, lo + r * (hi - lo), side="right"), a, b - 1)
        else:      # x in [0, total - (hi - lo)) with u's interval [lo, hi) skipped
            x = r * (total - (hi - lo))
            x = np.where(x >= lo, x + (hi - lo), x)
            p = np.minimum(np.searchsorted(cum, x, side="right"), n - 1)
            # floating-point rounding at an interval end can land in u's class: step past it
            p = np.where((p >= a) & (p < b), b % n, p)
        v = order[p]
        keep = u != v
        u, v = u[keep], v[keep]
        return np.minimum(u, v) * n + np.maximum(u, v)

    groups = []
    m_same = int(round(homophily * num_edges))
    for same, target in ((True, m_same), (False, num_edges - m_same)):
        kept = np.empty(0, dtype=np.int64)
        for _ in range(60):
            deficit = target - len(kept)
            if deficit <= 0:
                break
            keys = np.concatenate((kept, draw(deficit + deficit // 8 + 16, same)))
            first = np.unique(keys, return_index=True)[1]   # first occurrence keeps draw order
            first.sort()
            kept = keys[first[:target]]
        if len(kept) < target:
            log.warning("csbm: only %d of %d distinct %s-class pairs found", len(kept), target,
                        "same" if same else "cross")
        groups.append(kept)
    keys = np.concatenate(groups)
    return keys // n, keys % n


def _build(num_nodes, num_classes, avg_degree, homophily, feat_dim, snr, power_law, fractions, seed
           ) -> GeneratedGraph:
    t0 = time.perf_counter()
    n = num_nodes
    idx = np.int32
    label = rng_for(seed, STREAM_LABEL).permutation(np.arange(n, dtype=np.int64) % num_classes)
    theta = _propensities(n, avg_degree, power_law, seed)
    m = int(round(n * avg_degree / 2))
    log.info("csbm: %d nodes, %d classes, drawing %d undirected edges", n, num_classes, m)
    u, v = _sample_edges(label, theta, num_classes, m, homophily, seed)
    indptr, indices = coo_to_csr(u.astype(idx), v.astype(idx), n, symmetric=True, drop_self_loops=False,
                                 dedupe=False)
    del u, v
    log.info("csbm: CSR with %d directed edges after %.1f s", len(indices), time.perf_counter() - t0)
    means = None
    if feat_dim:
        g = rng_for(seed, STREAM_MEANS).standard_normal((num_classes, feat_dim))
        g *= snr / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
        means = g.astype(np.float32)
    masks = random_split(n, fractions, seed)
    name = f"csbm-n{n}-c{num_classes}"
    return GeneratedGraph(name=name, indptr=indptr, indices=indices, label=label, masks=masks,
                          num_classes=num_classes, directed=False, feat_dim=feat_dim,
                          feat_blocks=lambda: gaussian_feat_blocks(n, feat_dim, seed, means, label))


def estimate_csbm_bytes(num_nodes: int, avg_degree: float = 10.0, homophily: float = 0.8, *,
                        edge_types: int = 0) -> int:
    """Peak memory of :func:`write_csbm` above the interpreter's own, in bytes (an upper bound).

    With N nodes, M = round(N * avg_degree / 2) undirected edges of which M_s = homophily * M
    join one class (M_c = M - M_s the others), E = 2 M CSR entries (int32) and
    k_g = 1.125 M_g + 16 pairs drawn in the first round for group g, the peak is the largest
    of these phases, plus 16 MiB (one 8 MiB feature block, HDF5 buffers):

    * drawing pairs (``_sample_edges``): per node the labels, propensities, class order and two
      cumulative sums (40 N); per drawn pair about a dozen float64/int64 temporaries of
      ``draw`` (measured: 96 bytes per pair for same-class pairs, 120 for cross-class ones,
      whose draw has more steps), on top of the same-class keys already kept (8 M_s):
      ``40 N + max(96 k_s, 8 M_s + 120 k_c)``;
    * building the CSR: the pair keys and their int64 ends (32 M), their int32 copies and the
      indices (16 M), indptr and counts (16 N) beside the node arrays: ``48 M + 56 N``;
    * writing, at the final validation: the CSR (8 N + 4 E), labels, propensities and masks
      (19 N), edge types (2 E with ``edge_types``), the validation's reads (24 N and up to
      64 MiB of indices): ``(4 + 2) E + min(4 E, 64 MiB) + 51 N``.

    Measured (peak RSS minus RSS before the call, ``feat_dim=128``, avg_degree 10):
    N = 100 000: 42.4 MiB measured, 61 MiB estimated (+44 %, mostly the fixed 16 MiB);
    N = 400 000: 180 vs 196 MiB (+9 %); N = 1 000 000: 420 vs 466 MiB (+11 %);
    N = 400 000 with homophily 0.5 and ``power_law=2.5``: 145 vs 168 MiB (+16 %);
    N = 1 000 000, avg_degree 2, ``edge_types=3`` (the writing phase): 121 vs 137 MiB (+13 %).
    """
    n = int(num_nodes)
    m = int(round(n * float(avg_degree) / 2))
    m_same = int(round(float(homophily) * m))
    m_cross = m - m_same
    k_same, k_cross = (int(1.125 * g) + 16 if g else 0 for g in (m_same, m_cross))
    e = 2 * m
    sample = 40 * n + max(96 * k_same, 8 * m_same + 120 * k_cross)
    build = 48 * m + 56 * n
    write = (4 + (2 if edge_types else 0)) * e + min(4 * e, 64 * MIB) + 51 * n
    return max(sample, build, write) + 16 * MIB


def generate_csbm(num_nodes: int = 10000, num_classes: int = 5, *, avg_degree: float = 10.0,
                  homophily: float = 0.8, feat_dim: int = 128, snr: float = 1.0,
                  power_law: float | None = None, train_frac: float = 0.6, val_frac: float = 0.2,
                  test_frac: float = 0.2, seed: int = 0, edge_types: int = 0) -> GraphData:
    """Generate a contextual stochastic block model graph in memory.

    Args:
        num_nodes: N in [1, 2**31 - 1].
        num_classes: C in ``[1, N]``; classes are balanced (sizes differ by at most 1).
        avg_degree: mean degree (>= 0): the graph has round(N * avg_degree / 2)
            distinct undirected edges (2x that many CSR entries).
        homophily: fraction of edges whose ends share a class, in [0, 1]
            (exact up to rounding, unless a group runs out of distinct pairs).
        feat_dim: width F of the float32 features (0: none).
        snr: norm of each class mean against unit-variance noise per dimension (>= 0).
        power_law: None, or an exponent > 2: node propensities (expected degrees)
            follow a power law with this exponent (degree-corrected SBM).
        train_frac, val_frac, test_frac: random disjoint split (sum <= 1).
        seed: int >= 0; equal seeds give identical arrays.
        edge_types: 0 (untyped), or R: ``edge_type`` int16[E] where edges inside a class take one
            of the first ceil(R / 2) types and edges between classes one of the others (hashed from
            the unordered end points: an edge and its reverse share a type), so relation-aware
            models can use the types; R = 1 makes every edge type 0.

    Returns:
        Undirected :class:`GraphData` (symmetric CSR, sorted rows, no self-loops or
        duplicates): indptr int64[N+1], indices int32[E], feat float32[N, F],
        label int64[N], masks bool[N].

    Raises:
        GeneratorParamError: an argument out of range (names the parameter).
    """
    args = _check_args(num_nodes, num_classes, avg_degree, homophily, feat_dim, snr, power_law,
                       (train_frac, val_frac, test_frac), seed)
    edge_types = check_edge_types(edge_types)
    return _typed(_build(*args), edge_types, args[-1]).to_graph_data()


def write_csbm(path: str | os.PathLike, num_nodes: int = 10000, num_classes: int = 5, *,
               avg_degree: float = 10.0, homophily: float = 0.8, feat_dim: int = 128, snr: float = 1.0,
               power_law: float | None = None, train_frac: float = 0.6, val_frac: float = 0.2,
               test_frac: float = 0.2, seed: int = 0, edge_types: int = 0, force: bool = False) -> dict[str, int]:
    """Generate a CSBM graph straight into a dataset file (features in row blocks).

    Same arguments and same arrays as :func:`generate_csbm`. The file appears only
    when complete; an existing ``path`` is replaced only with ``force``. Before anything
    is drawn, the peak memory (:func:`estimate_csbm_bytes`) is checked against
    :func:`~data_io.memory.available_bytes`: :class:`~data_io.memory.MemoryRefusal` when it
    does not fit, unless ``force`` (which then only logs a warning).

    Returns:
        ``{"num_nodes": N, "num_edges": E, "feat_dim": F}``.
    """
    args = _check_args(num_nodes, num_classes, avg_degree, homophily, feat_dim, snr, power_law,
                       (train_frac, val_frac, test_frac), seed)
    edge_types = check_edge_types(edge_types)
    check_output(path, force)
    require_memory(estimate_csbm_bytes(args[0], args[2], args[3], edge_types=edge_types),
                   f"generate csbm --num-nodes {args[0]} --avg-degree {args[2]:g}", force=force,
                   hint="use a smaller --num-nodes or --avg-degree")
    return _typed(_build(*args), edge_types, args[-1]).write(path, force)


def _typed(g, edge_types: int, seed: int):
    """``g`` with class-aware hashed edge types when ``edge_types`` > 0 (see :func:`generate_csbm`)."""
    if edge_types:
        g.edge_type = draw_edge_types(g.indptr, g.indices, edge_types, seed, label=g.label)
        g.name += f"-t{edge_types}"
    return g
