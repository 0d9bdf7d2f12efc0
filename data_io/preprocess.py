"""Preprocessing steps that add a derived field to an existing dataset file.

* :func:`laplacian_pe`: the ``k`` eigenvectors of the symmetric normalised Laplacian
  ``L = I - D^-1/2 A D^-1/2`` (of the graph made undirected) with the smallest non-trivial
  eigenvalues, float32[N, k]: the positional encodings of the GT graph transformer
  (Dwivedi & Bresson). Eigenvectors are defined up to sign (the model flips signs at
  random while training); an isolated node gets zeros.
* :func:`add_node_field`: write such an array as ``/node/<name>`` into a dataset file,
  validated first and written under a temporary name that is renamed only when complete,
  so a failure leaves the file as it was.
"""
from __future__ import annotations

import logging
import os

import h5py
import numpy as np

from data_io.errors import FormatError
from data_io.integrity import FILE_DIGEST_ATTR, create_dataset, seal

log = logging.getLogger(__name__)

#: node fields that :func:`add_node_field` may write, with their dtype
NODE_FIELDS = {"lap_pe": np.float32}


def laplacian_pe(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, k: int, seed: int = 0,
                 graph_ptr: np.ndarray | None = None) -> np.ndarray:
    """float32[N, k]: eigenvectors of the normalised Laplacian for the k smallest non-trivial eigenvalues.

    Small graphs (N <= 2000) use a dense eigendecomposition; larger ones ARPACK (``eigsh``:
    the largest eigenvalues of the normalised adjacency, started from a seeded vector so the
    result is reproducible). When the graph has fewer than k + 1 nodes the missing columns are 0.
    With ``graph_ptr`` (a graph-level dataset's ``/graphs/ptr``) every graph gets its own
    eigenvectors (a disconnected graph keeps the extra zero eigenvalues' eigenvectors, which
    are constant on its components).

    Raises:
        ValueError: ``k < 1`` or inconsistent arrays.
    """
    n = int(num_nodes)
    if k < 1:
        raise ValueError(f"laplacian_pe: k must be >= 1, got {k}")
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if indptr.shape != (n + 1,) or indptr[-1] != indices.shape[0]:
        raise ValueError("laplacian_pe: indptr must have num_nodes + 1 entries ending at len(indices)")
    if graph_ptr is None:
        pe, vals = _laplacian_pe(indptr, indices, n, k, seed)
        log.info("laplacian_pe: %d nodes, eigenvalues %s", n, np.array2string(vals, precision=4))
        return pe
    gp = np.asarray(graph_ptr, dtype=np.int64)
    out = np.zeros((n, k), dtype=np.float32)
    for g in range(gp.shape[0] - 1):
        p0, p1 = int(gp[g]), int(gp[g + 1])
        e0, e1 = int(indptr[p0]), int(indptr[p1])
        sub = indices[e0:e1] - p0
        if sub.size and (sub.min() < 0 or sub.max() >= p1 - p0):
            raise ValueError(f"laplacian_pe: graph {g} has an edge leaving it")
        out[p0:p1] = _laplacian_pe(indptr[p0:p1 + 1] - e0, sub, p1 - p0, k, seed)[0]
    log.info("laplacian_pe: %d graphs, %d nodes", gp.shape[0] - 1, n)
    return out


def _laplacian_pe(indptr: np.ndarray, indices: np.ndarray, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(pe float32[n, k], the non-trivial eigenvalues used) of one graph; see :func:`laplacian_pe`."""
    import scipy.sparse as sp

    a = sp.csr_matrix((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))
    a = ((a + a.T) > 0).astype(np.float64)
    a.setdiag(0)
    a.eliminate_zeros()
    deg = np.asarray(a.sum(1)).ravel()
    dinv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-300)), 0.0)
    lap = sp.identity(n, format="csr") - sp.diags(dinv) @ a @ sp.diags(dinv)
    want = min(k + 1, n)
    if n <= 2000:
        vals, vecs = np.linalg.eigh(lap.toarray())
        vals, vecs = vals[:want], vecs[:, :want]
    else:
        from scipy.sparse.linalg import eigsh

        # the smallest eigenvalues of L = I - D^-1/2 A D^-1/2 are the largest of D^-1/2 A D^-1/2:
        # plain Lanczos on the normalised adjacency, no factorisation (shift-invert's sparse LU
        # fills in badly on random graphs: minutes at 65K nodes instead of ~2 s)
        v0 = np.random.default_rng(seed).standard_normal(n)
        adj_n = sp.diags(dinv) @ a @ sp.diags(dinv)
        vals, vecs = eigsh(adj_n, k=want, which="LA", v0=v0, tol=1e-9)
        vals = 1.0 - vals
        order = np.argsort(vals)
        vals, vecs = vals[order], vecs[:, order]
    pe = np.zeros((n, k), dtype=np.float32)
    pe[:, :max(0, want - 1)] = vecs[:, 1:want]  # drop the trivial eigenvector (eigenvalue 0)
    pe[deg == 0] = 0.0
    return pe, vals[1:want]


def add_node_field(path: str | os.PathLike, name: str, values: np.ndarray, *, force: bool = False) -> None:
    """Write ``values`` as ``/node/<name>`` of the dataset file at ``path`` (all or nothing).

    Raises:
        FormatError: the file is not a dataset, the field exists (without ``force``), or ``values``
            does not fit (wrong row count, dtype, or NaN/Inf).
    """
    path = os.fspath(path)
    if name not in NODE_FIELDS:
        raise ValueError(f"add_node_field: unknown field {name!r}; choose one of {list(NODE_FIELDS)}")
    values = np.ascontiguousarray(values, dtype=NODE_FIELDS[name])
    if not np.isfinite(values).all():
        raise FormatError(path, f"/node/{name}", "values contain NaN or Inf (nothing written)")
    try:
        h5 = h5py.File(path, "r+")
    except OSError as exc:
        raise FormatError(path, "/", f"cannot open for writing ({exc})") from None
    tmp = f"node/.{name}.partial"
    with h5:
        if "graph/indptr" not in h5:
            raise FormatError(path, "/graph/indptr", "missing (not a dataset file)")
        n = int(h5["graph/indptr"].shape[0] - 1)
        if values.shape[0] != n:
            raise FormatError(path, f"/node/{name}", f"{values.shape[0]} rows given for {n} nodes (nothing written)")
        if f"node/{name}" in h5 and not force:
            raise FormatError(path, f"/node/{name}", "already present (use --force to replace it)")
        if tmp in h5:
            del h5[tmp]
        try:
            create_dataset(h5, tmp, data=values)
            h5.flush()
        except BaseException:
            if tmp in h5:
                del h5[tmp]
            raise
        if f"node/{name}" in h5:
            del h5[f"node/{name}"]
        h5.move(tmp, f"node/{name}")
        if FILE_DIGEST_ATTR in h5.attrs:  # a sealed file stays sealed: digest the new field, then the file
            seal(h5)  # the new field was digested as it was created
