"""Fused dot-product edge attention, block-wise with an online softmax (CUDA twin).

Same functions, arguments and semantics as :mod:`numba_kernels.cpu.dot_attention`
(see there for the formulas).  One thread per (destination, head) in the
forward and row-backward kernels, one per (source, head) in the column
backward over the transposed CSR: no atomics, deterministic results, except
the per-code bias gradient with ``codes`` (one atomic add per edge and head into
the [C, H] table).  Scores are recomputed instead of buffered.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda


from numba_kernels.cuda._attention_common import _raise_max, device_key, finalize, init_state, launch, output_delta

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src"]

_DUMMIES: dict = {}


def _bias_or_dummy(bias, q):
    """``(bias, True)``, or a cached 1-row device stand-in and ``False`` for ``None`` (never read)."""
    if bias is not None:
        return bias, True
    key = (device_key(), str(q.dtype), q.shape[1])
    if key not in _DUMMIES:
        _DUMMIES[key] = cuda.to_device(np.zeros((1, q.shape[1]), dtype=q.dtype))  # synchronous: shared
    return _DUMMIES[key], False


def _codes_or_dummy(codes):
    """``(codes, True)``, or a cached 1-entry device stand-in and ``False`` for ``None``."""
    if codes is not None:
        return codes, True
    key = (device_key(), "codes")
    if key not in _DUMMIES:
        _DUMMIES[key] = cuda.to_device(np.zeros(1, dtype=np.uint8))
    return _DUMMIES[key], False


@cuda.jit(device=True, inline=True)
def _score(i, j, e, h, q, k, bias, has_bias, codes, has_codes, scale):
    s = 0.0
    for d in range(q.shape[2]):
        s += q[i, h, d] * k[j, h, d]
    s *= scale
    if has_bias:
        if has_codes:
            s += bias[codes[e], h]
        else:
            s += bias[e, h]
    return s


@cuda.jit
def _accumulate(indptr, indices, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, acc):
    t = cuda.grid(1)
    H = q.shape[1]
    if t >= (indptr.shape[0] - 1) * H:
        return
    i = t // H
    h = t - i * H
    lo = indptr[i]
    hi = indptr[i + 1]
    if lo == hi:
        return
    mx = m[i, h]
    for e in range(lo, hi):
        mx = max(mx, _score(i, indices[e], e, h, q, k, bias, has_bias, codes, has_codes, scale))
    run_l, mx = _raise_max(i, h, mx, m, l, acc)
    for e in range(lo, hi):
        j = indices[e]
        w = math.exp(_score(i, j, e, h, q, k, bias, has_bias, codes, has_codes, scale) - mx)
        run_l += w
        for d in range(v.shape[2]):
            acc[i, h, d] += w * v[j, h, d]
    l[i, h] = run_l


def accumulate(indptr, indices, q, k, v, bias, scale: float, m, l, acc, codes=None) -> None:
    """Fold one block of sources into the state ``(m, l, acc)`` in place (see the CPU twin)."""
    if indices.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    launch(_accumulate, (indptr.shape[0] - 1) * q.shape[1], indptr, indices, q, k, v, bias, has_bias, codes,
           has_codes, float(scale), m, l, acc)


@cuda.jit(device=True, inline=True)
def _grad_score(i, j, e, h, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, grad_out, delta):
    """(softmax weight p_e, grad wrt the score s_e) of edge e = (j -> i), head h."""
    prob = math.exp(_score(i, j, e, h, q, k, bias, has_bias, codes, has_codes, scale) - m[i, h]) / l[i, h]
    dot = 0.0
    for d in range(v.shape[2]):
        dot += grad_out[i, h, d] * v[j, h, d]
    return prob, prob * (dot - delta[i, h])


@cuda.jit
def _backward_dst(indptr, indices, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, grad_out, delta, grad_q,
                  grad_bias):
    t = cuda.grid(1)
    H = q.shape[1]
    if t >= (indptr.shape[0] - 1) * H:
        return
    i = t // H
    h = t - i * H
    for e in range(indptr[i], indptr[i + 1]):
        j = indices[e]
        prob, gs = _grad_score(i, j, e, h, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, grad_out, delta)
        if has_bias:
            if has_codes:
                cuda.atomic.add(grad_bias, (codes[e], h), gs)
            else:
                grad_bias[e, h] = gs
        gs *= scale
        for d in range(q.shape[2]):
            grad_q[i, h, d] += gs * k[j, h, d]


def backward_dst(indptr, indices, q, k, v, bias, scale: float, m, l, grad_out, delta, grad_q,
                 grad_bias, codes=None) -> None:
    """Row pass of one block's backward: ``grad_q`` and ``grad_bias`` (see the CPU twin)."""
    if indices.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    grad_bias = bias if grad_bias is None else grad_bias
    launch(_backward_dst, (indptr.shape[0] - 1) * q.shape[1], indptr, indices, q, k, v, bias, has_bias, codes,
           has_codes, float(scale), m, l, grad_out, delta, grad_q, grad_bias)


@cuda.jit
def _backward_src(indptr_t, indices_t, perm, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, grad_out, delta,
                  grad_k, grad_v):
    t = cuda.grid(1)
    H = q.shape[1]
    if t >= (indptr_t.shape[0] - 1) * H:
        return
    j = t // H
    h = t - j * H
    for s in range(indptr_t[j], indptr_t[j + 1]):
        i = indices_t[s]
        prob, gs = _grad_score(i, j, perm[s], h, q, k, v, bias, has_bias, codes, has_codes, scale, m, l, grad_out,
                               delta)
        gs *= scale
        for d in range(v.shape[2]):
            grad_v[j, h, d] += prob * grad_out[i, h, d]
        for d in range(q.shape[2]):
            grad_k[j, h, d] += gs * q[i, h, d]


def backward_src(indptr_t, indices_t, perm, q, k, v, bias, scale: float, m, l, grad_out, delta,
                 grad_k, grad_v, codes=None) -> None:
    """Column pass of one block's backward over the transposed CSR (see the CPU twin)."""
    if indices_t.shape[0] == 0:
        return
    bias, has_bias = _bias_or_dummy(bias, q)
    codes, has_codes = _codes_or_dummy(codes)
    launch(_backward_src, (indptr_t.shape[0] - 1) * q.shape[1], indptr_t, indices_t, perm, q, k, v, bias,
           has_bias, codes, has_codes, float(scale), m, l, grad_out, delta, grad_k, grad_v)
