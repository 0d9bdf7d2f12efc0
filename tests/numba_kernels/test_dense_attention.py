"""``numba_kernels.cpu.dense_attention``: the fused far-pair kernels against a NumPy softmax over all pairs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from numba_kernels.cpu.dense_attention import COLS, ROWS, accumulate_far, backward_far


def _case(seed, n, T, H, dk, dv, dtype, masked_rows=()):
    """Random inputs, a random sorted mask per row (rows in ``masked_rows`` mask every column), and a prior
    state over ``T`` tokens as the sparse kernels would leave it (rows ``>= n`` and some others empty)."""
    rng = np.random.default_rng(seed)
    q = (3 * rng.standard_normal((T, H, dk))).astype(dtype)
    k = (3 * rng.standard_normal((T, H, dk))).astype(dtype)
    v = rng.standard_normal((T, H, dv)).astype(dtype)
    far = rng.standard_normal(H).astype(dtype)
    mask = rng.random((n, n)) < 0.1
    for r in masked_rows:
        mask[r] = True
    rows, cols = np.nonzero(mask)
    mptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=mptr[1:])
    # a prior state: per row a few "pattern" scores already folded in (every third row has none)
    prior = rng.standard_normal((T, H, 3)) * 2
    pv = rng.standard_normal((T, H, 3, dv))
    has = (np.arange(T) % 3 != 0)[:, None, None]
    prior = np.where(has, prior, -np.inf)
    return q, k, v, far, mptr, cols.astype(np.int64), mask, prior, pv


def _state_from_prior(prior, pv, dtype):
    m = prior.max(-1)
    w = np.where(np.isinf(m)[..., None], 0.0, np.exp(prior - np.where(np.isinf(m), 0, m)[..., None]))
    return (m.astype(dtype), w.sum(-1).astype(dtype), (w[..., None] * pv).sum(-2).astype(dtype))


def _reference(q, k, v, far, mask, prior, pv, n, go):
    """Outputs and gradients of softmax over [prior scores, far scores] in float64 (autograd-free NumPy)."""
    T, H, dk = q.shape
    scale = 1 / math.sqrt(dk)
    q, k, v, far = (x.astype(np.float64) for x in (q, k, v, far))
    s = np.einsum("ihd,jhd->hij", q[:n], k[:n]) * scale + far[:, None, None]  # [H, n, n]
    s[:, mask] = -np.inf
    full = np.full((H, T, 3 + n), -np.inf)
    full[:, :, :3] = prior.transpose(1, 0, 2)
    full[:, :n, 3:] = s
    mx = full.max(-1, keepdims=True)
    e = np.where(np.isinf(full), 0.0, np.exp(full - np.where(np.isinf(mx), 0, mx)))
    tot = e.sum(-1, keepdims=True)
    p = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0.0)  # [H, T, 3+n]
    vals = np.zeros((H, T, 3 + n, v.shape[2]))
    vals[:, :, :3] = pv.transpose(1, 0, 2, 3)
    vals[:, :n, 3:] = v[:n].transpose(1, 0, 2)[:, None]
    out = np.einsum("htj,htjd->thd", p, vals)
    # gradients of the far part only
    g = go.transpose(1, 0, 2).astype(np.float64)  # [H, T, dv]
    dp = np.einsum("htd,htjd->htj", g, vals)
    delta = np.einsum("thd,thd->ht", go, out)
    ds = p * (dp - delta[..., None])  # [H, T, 3+n]
    dsf = ds[:, :n, 3:]
    gq = np.zeros_like(q)
    gq[:n] = np.einsum("hij,jhd->ihd", dsf, k[:n]) * scale
    gk = np.zeros_like(k)
    gk[:n] = np.einsum("hij,ihd->jhd", dsf, q[:n]) * scale
    gv = np.zeros_like(v)
    gv[:n] = np.einsum("hij,hid->jhd", p[:, :n, 3:], g[:, :n])
    return out, gq, gk, gv, dsf.sum((1, 2)), delta.T


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n,dk,dv,chunks", [(ROWS * 3 + 5, 8, 8, 1), (COLS + 37, 11, 5, 3), (1, 3, 2, 2)])
def test_far_pairs_fold_into_the_state_and_back(dtype, n, dk, dv, chunks):
    T, H = n + 2, 3
    q, k, v, far, mptr, mcols, mask, prior, pv = _case(n + dk, n, T, H, dk, dv, dtype, masked_rows=(0,))
    m, l, acc = _state_from_prior(prior, pv, dtype)
    kT = np.ascontiguousarray(k[:n].transpose(1, 2, 0))
    vT = np.ascontiguousarray(v[:n].transpose(1, 2, 0))
    scale = 1 / math.sqrt(dk)
    accumulate_far(q, kT, vT, far, scale, mptr, mcols, n, m, l, acc)
    out = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1)[..., None], 0).astype(dtype)
    go = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
    ref_out, gq_ref, gk_ref, gv_ref, gfar_ref, delta = _reference(q, k, v, far, mask, prior, pv, n, go)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(out, ref_out, **tol)
    gq = np.zeros_like(q)
    gkT = np.zeros((chunks, H, dk, n), dtype)
    gvT = np.zeros((chunks, H, dv, n), dtype)
    gfar = np.full((chunks, H), 7.0, dtype)  # written, not accumulated
    backward_far(q, kT, vT, far, scale, mptr, mcols, n, m, l, go, delta.astype(dtype), gq, gkT, gvT, gfar)
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(gq, gq_ref, **tol)
    np.testing.assert_allclose(gkT.sum(0).transpose(2, 0, 1), gk_ref[:n], **tol)
    np.testing.assert_allclose(gvT.sum(0).transpose(2, 0, 1), gv_ref[:n], **tol)
    np.testing.assert_allclose(gfar.sum(0), gfar_ref, **tol)


def test_a_row_with_every_column_masked_and_no_prior_stays_empty():
    n, T, H = 4, 4, 1
    q = np.ones((T, H, 2), np.float32)
    kT = np.ones((H, 2, n), np.float32)
    vT = np.ones((H, 2, n), np.float32)
    mptr = np.array([0, 4, 4, 4, 4], np.int64)  # row 0: every column is a pattern entry
    mcols = np.arange(4, dtype=np.int64)
    m = np.full((T, H), -np.inf, np.float32)
    l = np.zeros((T, H), np.float32)
    acc = np.zeros((T, H, 2), np.float32)
    accumulate_far(q, kT, vT, np.zeros(H, np.float32), 1.0, mptr, mcols, n, m, l, acc)
    assert np.isneginf(m[0, 0]) and l[0, 0] == 0 and not acc[0].any()
    np.testing.assert_allclose(l[1:, 0], 4.0)  # the others see 4 equal scores: max subtracted, sum 4


def test_layouts_and_read_only_inputs_compile_nothing_new():
    """A transposed (F-ordered) ``delta`` or read-only inputs reuse the C-contiguous signature compiled for
    the dtype (each signature of these kernels costs tens of seconds of compiling): equal results, and the
    kernels' compiled signatures do not grow."""
    from numba_kernels.cpu import dense_attention as DA

    n, T, H, dk, dv = 11, 12, 2, 3, 2
    q, k, v, far, mptr, mcols, mask, prior, pv = _case(5, n, T, H, dk, dv, np.float64)
    m, l, acc = _state_from_prior(prior, pv, np.float64)
    kT = np.ascontiguousarray(k[:n].transpose(1, 2, 0))
    vT = np.ascontiguousarray(v[:n].transpose(1, 2, 0))
    go = np.random.default_rng(2).standard_normal((T, H, dv))
    delta_c = np.random.default_rng(3).standard_normal((T, H))

    def backward(delta, qq):
        grads = (np.zeros_like(q), np.zeros((1, H, dk, n)), np.zeros((1, H, dv, n)), np.zeros((1, H)))
        backward_far(qq, kT, vT, far, 0.5, mptr, mcols, n, m, l, go, delta, *grads)
        return grads

    def fold(qq):
        state = (m.copy(), l.copy(), acc.copy())
        accumulate_far(qq, kT, vT, far, 0.5, mptr, mcols, n, *state)
        return state

    want_b, want_f = backward(delta_c, q), fold(q)
    before = (len(DA._backward_far.signatures), len(DA._accumulate_far.signatures))
    delta_f = np.asfortranarray(delta_c)
    q_ro = q.copy()
    q_ro.flags.writeable = False
    assert delta_f.flags.f_contiguous and not delta_f.flags.c_contiguous
    for got, want in zip(backward(delta_f, q_ro) + fold(q_ro), want_b + want_f):
        np.testing.assert_array_equal(got, want)
    assert (len(DA._backward_far.signatures), len(DA._accumulate_far.signatures)) == before
