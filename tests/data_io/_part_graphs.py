"""Test helpers for the partition tests: random and planted-partition graphs as dataset files."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from data_io.dataset import GraphData, write_dataset


def csr_from_edges(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Destination-major CSR ``(indptr, indices, perm)``: edge k of the CSR is input edge ``perm[k]``."""
    perm = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[perm], perm


def random_graph(n: int, e: int, seed: int, feat_dim: int = 5, num_classes: int = 4,
                 weights: bool = True, types: bool = False, masks: bool = True) -> GraphData:
    """Random multigraph with self loops, duplicate edges and a few isolated nodes."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n - 2, e)  # the last two nodes are isolated
    dst = rng.integers(0, n - 2, e)
    src[:3] = dst[:3]  # a few self loops
    src[3:6], dst[3:6] = src[6], dst[6]  # duplicates
    indptr, indices, _ = csr_from_edges(src, dst, n)
    g = GraphData(indptr=indptr, indices=indices.astype(np.int32), name="rand", num_classes=num_classes)
    if feat_dim:
        g.feat = rng.standard_normal((n, feat_dim)).astype(np.float32)
    if num_classes:
        g.label = rng.integers(-1, num_classes, n)
    if masks:
        r = rng.random(n)
        g.train_mask, g.val_mask, g.test_mask = r < 0.4, (r >= 0.4) & (r < 0.6), r >= 0.6
    if weights:
        g.edge_weight = rng.random(e).astype(np.float32)
    if types:
        g.edge_type = rng.integers(0, 3, e).astype(np.int16)
    return g


def planted_graph(n: int, k: int, deg_in: float, deg_out: float, seed: int,
                  train_skew: bool = False) -> tuple[GraphData, np.ndarray]:
    """Undirected planted partition: ``k`` equal communities, mean in/out-community degree.

    With ``train_skew`` the training nodes sit mostly in the first half of the
    communities, so a partition that follows the communities is unbalanced in
    training nodes. Returns the graph and the community of each node.
    """
    rng = np.random.default_rng(seed)
    comm = np.arange(n) % k
    m_in, m_out = int(n * deg_in / 2), int(n * deg_out / 2)
    a = rng.integers(0, n, m_in)
    b = rng.integers(0, n // k, m_in) * k + comm[a]  # same community as a
    c = rng.integers(0, n, m_out)
    d = rng.integers(0, n, m_out)
    s = np.concatenate([a, c])
    t = np.concatenate([b, d])
    keep = s != t
    s, t = s[keep], t[keep]
    src, dst = np.concatenate([s, t]), np.concatenate([t, s])
    indptr, indices, _ = csr_from_edges(src, dst, n)
    g = GraphData(indptr=indptr, indices=indices.astype(np.int64), name="planted", num_classes=k,
                  label=comm.astype(np.int64))
    p_train = np.where(comm < k // 2, 0.6, 0.05) if train_skew else np.full(n, 0.3)
    g.train_mask = rng.random(n) < p_train
    return g, comm


def write(tmp_path: Path, g: GraphData, name: str = "g.h5") -> Path:
    path = Path(tmp_path) / name
    write_dataset(path, g)
    return path
