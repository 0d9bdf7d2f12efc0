"""CPU edge-softmax kernels (forward, backward) against plain NumPy references."""
from __future__ import annotations

import numpy as np
import pytest

from numba_kernels.cpu.edge_softmax import edge_softmax, edge_softmax_backward

DTYPES = [np.float32, np.float64]


def _tol(dtype):
    return dict(rtol=2e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


def _ref_softmax(indptr, s):
    out = np.zeros(s.shape)
    for i in range(indptr.shape[0] - 1):
        seg = s[indptr[i]:indptr[i + 1]].astype(np.float64)
        if seg.shape[0]:
            ex = np.exp(seg - seg.max(0))
            out[indptr[i]:indptr[i + 1]] = ex / ex.sum(0)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [1, 3])
def test_edge_softmax_matches_numpy(awkward_graph, dtype, heads):
    indptr, _ = awkward_graph(heads, num_dst=25, num_edges=140)
    E = int(indptr[-1])
    rng = np.random.default_rng(heads)
    s = (rng.standard_normal((E, heads)) * 5).astype(dtype)
    s[:3] += 500  # large scores: must not overflow (max-subtracted)
    out = np.full(s.shape, np.nan, dtype)
    edge_softmax(indptr, s, out)
    ref = _ref_softmax(indptr, s)
    np.testing.assert_allclose(out, ref, **_tol(dtype))
    sums = np.add.reduceat(out.astype(np.float64), indptr[:-1][np.diff(indptr) > 0], axis=0)
    np.testing.assert_allclose(sums, 1.0, rtol=1e-5)

    g = rng.standard_normal((E, heads)).astype(dtype)
    grad = np.full(s.shape, np.nan, dtype)
    edge_softmax_backward(indptr, out, g, grad)
    ref_grad = np.zeros(s.shape)
    for i in range(indptr.shape[0] - 1):
        y = ref[indptr[i]:indptr[i + 1]]
        gg = g[indptr[i]:indptr[i + 1]].astype(np.float64)
        ref_grad[indptr[i]:indptr[i + 1]] = y * (gg - (y * gg).sum(0))
    np.testing.assert_allclose(grad, ref_grad, **_tol(dtype))


def test_edge_softmax_all_neg_inf_row_is_zero():
    indptr = np.array([0, 2, 4], np.int64)
    s = np.array([[-np.inf], [-np.inf], [0.0], [-np.inf]], np.float64)
    out = np.full(s.shape, np.nan)
    edge_softmax(indptr, s, out)
    np.testing.assert_array_equal(out[:, 0], [0.0, 0.0, 1.0, 0.0])
