"""Fused dot-product edge attention (graph transformer), block-wise with an online softmax (CPU twin).

For destination ``i``, in-edge ``e = (j -> i)`` (CSR position ``e``), head ``h``::

    s_e      = scale * q[i,h,:] . k[j,h,:] + bias[e,h]        (bias optional)
    alpha_e  = softmax over the in-edges of i (all blocks)
    out[i,h,:] = sum_e alpha_e * v[j,h,:]

``q`` float[num_dst, H, Dk]; ``k`` float[num_src, H, Dk]; ``v`` float[num_src, H, Dv].
The state ``(m, l, acc)`` and the block-wise protocol are those of
:mod:`numba_kernels.cpu.gat_attention` (``init_state``/``finalize``/``output_delta``
are the same functions).  ``bias`` is float[E, H] in this block's CSR edge
order, or ``None``; with ``codes`` (uint8[E]) it is a table float[C, H] and edge ``e``
gets ``bias[codes[e], h]`` (a 1-byte index per edge instead of H floats), and the
backward sums each code's gradients into ``grad_bias`` float[C, H].

Backward, with ``p_e = exp(s_e - m_i)/l_i`` and ``delta_i = grad_out_i . out_i``::

    grad_s_e  = p_e * (grad_out_i . v_j - delta_i)       (= grad_bias[e,h])
    grad_q_i += scale * grad_s_e * k_j                   (row pass, backward_dst)
    grad_k_j += scale * grad_s_e * q_i ; grad_v_j += p_e * grad_out_i   (column pass, backward_src)

All outputs are accumulated (``+=``) into caller-allocated arrays, except
``grad_bias`` rows which are written.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import (FASTMATH, _head_dot, _scalars, finalize, init_state,
                                                 output_delta, run_parallel)

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src"]


def _bias_or_dummy(bias, q):
    """``(bias, True)``, or a 1-row stand-in and ``False`` for ``None`` (kernels never read it)."""
    if bias is None:
        return np.zeros((1, q.shape[1]), dtype=q.dtype), False
    return bias, True


def _codes_or_dummy(codes):
    """``(codes, True)``, or a 1-entry stand-in and ``False`` for ``None``."""
    if codes is None:
        return np.zeros(1, dtype=np.uint8), False
    return codes, True


@njit(inline="always")
def _score(q, k, i, j, h, scale, zero, bias, has_bias, codes, has_codes, e):
    """``scale * q[i,h,:] . k[j,h,:]`` plus the bias of edge ``e`` (its code's row with ``codes``)."""
    s = _head_dot(q, i, k, j, h, zero) * scale
    if has_bias:
        s += bias[codes[e] if has_codes else e, h]
    return s


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _accumulate(bounds, indptr, indices, q, k, v, bias, has_bias, codes, has_codes, scale64, m, l, acc):
    H = q.shape[1]
    Dv = v.shape[2]
    for c in prange(bounds.shape[0] - 1):
        scale, _, zero, _ = _scalars(q, scale64, 0.0)
        maxdeg = 0
        for i in range(bounds[c], bounds[c + 1]):
            maxdeg = max(maxdeg, indptr[i + 1] - indptr[i])
        scores = np.empty((maxdeg, H), dtype=acc.dtype)  # one row's scores only
        mnew = np.empty(H, dtype=acc.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            lo = indptr[i]
            hi = indptr[i + 1]
            if lo == hi:
                continue
            for h in range(H):
                mnew[h] = m[i, h]
            for e in range(lo, hi):
                j = indices[e]
                for h in range(H):
                    s = _score(q, k, i, j, h, scale, zero, bias, has_bias, codes, has_codes, e)
                    scores[e - lo, h] = s
                    if s > mnew[h]:
                        mnew[h] = s
            for h in range(H):
                if mnew[h] > m[i, h]:
                    r = np.exp(m[i, h] - mnew[h])
                    l[i, h] *= r
                    for d in range(Dv):
                        acc[i, h, d] *= r
                    m[i, h] = mnew[h]
            for e in range(lo, hi):
                j = indices[e]
                for h in range(H):
                    w = np.exp(scores[e - lo, h] - m[i, h])
                    l[i, h] += w
                    for d in range(Dv):
                        acc[i, h, d] += w * v[j, h, d]


def accumulate(indptr, indices, q, k, v, bias, scale: float, m, l, acc, codes=None) -> None:
    """Fold one block of sources into the state ``(m, l, acc)`` in place.

    Args:
        indptr: int64[num_dst+1], indices: int64[E]: block CSR (block-local source columns).
        q: float[num_dst, H, Dk]; k: float[num_src, H, Dk]; v: float[num_src, H, Dv].
        bias: float[E, H] per-edge score bias in CSR order, or None; with ``codes`` a table float[C, H].
        codes: uint8[E] the table row of each edge (values < C, unchecked here), or None.
        scale: score multiplier (usually ``1/sqrt(Dk)``).
        m, l: float[num_dst, H]; acc: float[num_dst, H, Dv]: state, updated in place.
    """
    n = indptr.shape[0] - 1
    if n == 0 or indices.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    work = indices.shape[0] * q.shape[1] * (q.shape[2] + v.shape[2])
    run_parallel(_accumulate, indptr, work, indices, q, k, v, bias, has_bias, codes, has_codes, float(scale), m, l,
                 acc)


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _backward_dst(bounds, indptr, indices, q, k, v, bias, has_bias, codes, has_codes, scale64, m, l, grad_out,
                  delta, grad_q, grad_bias, grad_table):
    H = q.shape[1]
    Dk = q.shape[2]
    for c in prange(bounds.shape[0] - 1):
        scale, _, zero, _ = _scalars(q, scale64, 0.0)
        for i in range(bounds[c], bounds[c + 1]):
            for e in range(indptr[i], indptr[i + 1]):
                j = indices[e]
                for h in range(H):
                    s = _score(q, k, i, j, h, scale, zero, bias, has_bias, codes, has_codes, e)
                    prob = np.exp(s - m[i, h]) / l[i, h]
                    dot = _head_dot(grad_out, i, v, j, h, zero)
                    gs = prob * (dot - delta[i, h])
                    if has_bias:
                        if has_codes:
                            grad_table[c, codes[e], h] += gs  # this chunk's partial sums, added up after
                        else:
                            grad_bias[e, h] = gs
                    gs *= scale
                    for d in range(Dk):
                        grad_q[i, h, d] += gs * k[j, h, d]


def backward_dst(indptr, indices, q, k, v, bias, scale: float, m, l, grad_out, delta, grad_q,
                 grad_bias, codes=None) -> None:
    """Row pass of one block's backward: accumulates ``grad_q`` float[num_dst, H, Dk] and
    writes ``grad_bias`` float[E, H] (``None`` when ``bias`` is ``None``); with ``codes``,
    accumulates each code's sum into ``grad_bias`` float[C, H].

    ``m``, ``l``: final state; ``grad_out`` float[num_dst, H, Dv]; ``delta``
    float[num_dst, H] from :func:`output_delta`.  Other arguments as in :func:`accumulate`.
    """
    n = indptr.shape[0] - 1
    if n == 0 or indices.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    grad_bias = bias if grad_bias is None else grad_bias
    work = indices.shape[0] * q.shape[1] * (2 * q.shape[2] + v.shape[2])
    if has_codes and has_bias:  # one partial table per row chunk (run_parallel makes at most 8 per thread)
        table = np.zeros((8 * numba.get_num_threads() + 1, bias.shape[0], bias.shape[1]), dtype=bias.dtype)
        run_parallel(_backward_dst, indptr, work, indices, q, k, v, bias, has_bias, codes, has_codes, float(scale), m,
                     l, grad_out, delta, grad_q, bias, table)
        grad_bias += table.sum(0)
    else:
        run_parallel(_backward_dst, indptr, work, indices, q, k, v, bias, has_bias, codes, False, float(scale), m, l,
                     grad_out, delta, grad_q, grad_bias, np.zeros((1, 1, 1), dtype=q.dtype))


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _backward_src(bounds, indptr_t, indices_t, perm, q, k, v, bias, has_bias, codes, has_codes, scale64, m, l,
                  grad_out, delta, grad_k, grad_v):
    H = q.shape[1]
    Dk = q.shape[2]
    Dv = v.shape[2]
    for c in prange(bounds.shape[0] - 1):
        scale, _, zero, _ = _scalars(q, scale64, 0.0)
        for j in range(bounds[c], bounds[c + 1]):
            for t in range(indptr_t[j], indptr_t[j + 1]):
                i = indices_t[t]
                for h in range(H):
                    s = _score(q, k, i, j, h, scale, zero, bias, has_bias, codes, has_codes, perm[t])
                    prob = np.exp(s - m[i, h]) / l[i, h]
                    dot = zero
                    for d in range(Dv):
                        g = grad_out[i, h, d]
                        dot += g * v[j, h, d]
                        grad_v[j, h, d] += prob * g
                    gs = prob * (dot - delta[i, h]) * scale
                    for d in range(Dk):
                        grad_k[j, h, d] += gs * q[i, h, d]


def backward_src(indptr_t, indices_t, perm, q, k, v, bias, scale: float, m, l, grad_out, delta,
                 grad_k, grad_v, codes=None) -> None:
    """Column pass of one block's backward over the transposed CSR.

    ``indptr_t`` int64[num_src+1], ``indices_t`` int64[E] destination of each
    edge in source-major order, ``perm`` int64[E] its CSR position (for
    ``bias``) (:meth:`hpc_graph.ops.CSR.csc`).  Accumulates ``grad_k``
    float[num_src, H, Dk] and ``grad_v`` float[num_src, H, Dv].
    """
    n = indptr_t.shape[0] - 1
    if n == 0 or indices_t.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    work = indices_t.shape[0] * q.shape[1] * (2 * q.shape[2] + 2 * v.shape[2])
    run_parallel(_backward_src, indptr_t, work, indices_t, perm, q, k, v, bias, has_bias, codes, has_codes,
                 float(scale), m, l, grad_out, delta, grad_k, grad_v)
