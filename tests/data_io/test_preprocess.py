"""Laplacian positional encodings against a dense eigendecomposition; the all-or-nothing field writer; the CLI."""
from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from data_io.errors import FormatError
from data_io.preprocess import add_node_field, laplacian_pe


def _graph(n, m, seed):
    rng = np.random.default_rng(seed)
    s = np.concatenate([np.arange(n), rng.integers(0, n, m)])  # a ring keeps it connected
    d = np.concatenate([(np.arange(n) + 1) % n, rng.integers(0, n, m)])
    keep = s != d
    s, d = s[keep], d[keep]
    order = np.argsort(d, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(d, minlength=n), out=indptr[1:])
    return indptr, s[order].astype(np.int64)


def _laplacian(indptr, indices, n):
    a = sp.csr_matrix((np.ones(indices.shape[0]), indices, indptr), shape=(n, n))
    a = ((a + a.T) > 0).astype(np.float64).toarray()
    np.fill_diagonal(a, 0)
    deg = a.sum(1)
    dinv = np.where(deg > 0, deg ** -0.5, 0)
    return np.eye(n) - dinv[:, None] * a * dinv[None, :]


@pytest.mark.parametrize("n, k", [(40, 4), (2300, 3)])  # dense path, ARPACK path
def test_eigenvectors_of_the_smallest_nontrivial_eigenvalues(n, k):
    indptr, indices = _graph(n, n, 1)
    pe = laplacian_pe(indptr, indices, n, k).astype(np.float64)
    assert pe.shape == (n, k)
    lap = _laplacian(indptr, indices, n)
    want = np.linalg.eigvalsh(lap)[1:k + 1]
    lam = np.einsum("ik,ij,jk->k", pe, lap, pe)  # Rayleigh quotients of unit vectors
    np.testing.assert_allclose(np.linalg.norm(pe, axis=0), 1.0, atol=1e-4)
    np.testing.assert_allclose(lam, want, atol=1e-4)
    np.testing.assert_allclose(lap @ pe, pe * lam, atol=1e-3)  # eigenvectors, not just any vectors


def test_small_graph_pads_and_bad_k():
    indptr, indices = _graph(3, 0, 0)
    pe = laplacian_pe(indptr, indices, 3, 5)
    assert pe.shape == (3, 5) and not pe[:, 2:].any()
    with pytest.raises(ValueError, match="k"):
        laplacian_pe(indptr, indices, 3, 0)


def _write_dataset(path, n=30):
    from data_io.dataset import GraphData, write_dataset

    indptr, indices = _graph(n, n, 2)
    write_dataset(path, GraphData(indptr=indptr, indices=indices, feat=np.ones((n, 2), np.float32),
                                  label=np.zeros(n, np.int64), num_classes=1, name="t"))
    return indptr, indices


def test_add_node_field_is_all_or_nothing(tmp_path):
    path = tmp_path / "g.h5"
    _write_dataset(path)
    with pytest.raises(FormatError, match="rows"):
        add_node_field(path, "lap_pe", np.zeros((29, 2), np.float32))
    with pytest.raises(FormatError, match="NaN"):
        add_node_field(path, "lap_pe", np.full((30, 2), np.nan, np.float32))
    with h5py.File(path) as h5:
        assert "lap_pe" not in h5["node"] and not [k for k in h5["node"] if "partial" in k]
    add_node_field(path, "lap_pe", np.ones((30, 2), np.float32))
    with pytest.raises(FormatError, match="already present"):
        add_node_field(path, "lap_pe", np.zeros((30, 2), np.float32))
    add_node_field(path, "lap_pe", np.zeros((30, 3), np.float32), force=True)
    from data_io.dataset import open_dataset

    with open_dataset(path) as ds:
        assert ds.lap_pe().shape == (30, 3) and not ds.lap_pe().any()


def test_cli_preprocess_lap_pe_then_check(tmp_path):
    path = tmp_path / "g.h5"
    indptr, indices = _write_dataset(path)
    run = [sys.executable, "-m", "hpc_graph.cli"]
    out = subprocess.run(run + ["preprocess", "lap-pe", str(path), "--k", "3"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    from data_io.dataset import open_dataset

    with open_dataset(path) as ds:
        np.testing.assert_allclose(ds.lap_pe(), laplacian_pe(indptr, indices, 30, 3))
    assert subprocess.run(run + ["check", str(path)], capture_output=True, timeout=120).returncode == 0
    again = subprocess.run(run + ["preprocess", "lap-pe", str(path)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr
    bad = subprocess.run(run + ["preprocess", "lap-pe", str(tmp_path / "missing.h5")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "missing.h5" in bad.stderr
