"""CPU SDDMM kernel against a plain NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest

from numba_kernels.cpu.sddmm import sddmm

DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,dim", [(1, 1), (1, 16), (4, 13), (2, 32)])
@pytest.mark.parametrize("num_src", [None, 19])
def test_sddmm_matches_numpy(awkward_graph, dtype, heads, dim, num_src):
    indptr, indices = awkward_graph(heads * 7 + dim, num_dst=27, num_src=num_src, num_edges=160)
    ns = 27 if num_src is None else num_src
    rng = np.random.default_rng(dim)
    a = rng.standard_normal((27, heads, dim)).astype(dtype)
    b = rng.standard_normal((ns, heads, dim)).astype(dtype)
    out = np.full((indices.shape[0], heads), np.nan, dtype)
    sddmm(indptr, indices, a, b, out)
    dst = np.repeat(np.arange(27), np.diff(indptr))
    ref = np.einsum("ehd,ehd->eh", a[dst].astype(np.float64), b[indices].astype(np.float64))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, ref, **tol)


def test_sddmm_no_edges():
    indptr = np.zeros(5, np.int64)
    out = np.empty((0, 2), np.float32)
    sddmm(indptr, np.empty(0, np.int64), np.ones((4, 2, 3), np.float32), np.ones((3, 2, 3), np.float32), out)
    assert out.shape == (0, 2)
