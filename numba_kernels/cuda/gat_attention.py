"""Fused GATv1 attention, block-wise with an online softmax (CUDA twin).

Same functions, arguments and semantics as :mod:`numba_kernels.cpu.gat_attention`
(see there for the formulas); arrays are numba device arrays or anything with
``__cuda_array_interface__``.  One thread per (destination, head) in the
forward and row-backward kernels, one per (source, head) in the column
backward over the transposed CSR, so no atomics and a deterministic result.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from numba_kernels.cuda._attention_common import (_gid, _keep, _mix, finalize, init_state, launch, local_ids,
                                                  output_delta)

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src"]


@cuda.jit
def _accumulate(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, acc):
    t = cuda.grid(1)
    H = z.shape[1]
    if t >= (indptr.shape[0] - 1) * H:
        return
    i = t // H
    h = t - i * H
    lo = indptr[i]
    hi = indptr[i + 1]
    if lo == hi:
        return
    sd = s_dst[i, h]
    mx = m[i, h]
    for e in range(lo, hi):
        a = sd + s_src[indices[e], h]
        if a < 0:
            a = a * slope
        mx = max(mx, a)
    run_l = l[i, h]
    if mx > m[i, h]:
        r = math.exp(m[i, h] - mx)
        run_l *= r
        for d in range(z.shape[2]):
            acc[i, h, d] *= r
        m[i, h] = mx
        mx = m[i, h]  # the stored (possibly float32) max: backward divides by the same
    use_drop = p > 0.0
    inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
    dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
    for e in range(lo, hi):
        j = indices[e]
        a = sd + s_src[j, h]
        if a < 0:
            a = a * slope
        w = math.exp(a - mx)
        run_l += w
        if use_drop:
            if not _keep(_mix(dst_hash, _gid(src_gid, j)), h, p):
                continue
            w = w * inv_keep
        for d in range(z.shape[2]):
            acc[i, h, d] += w * z[j, h, d]
    l[i, h] = run_l


def accumulate(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
               attn_dropout: float, seed: int, m, l, acc) -> None:
    """Fold one block of sources into the state ``(m, l, acc)`` in place (see the CPU twin)."""
    if indices.shape[0] == 0:
        return
    src_gid = local_ids() if src_gid is None else src_gid
    dst_gid = local_ids() if dst_gid is None else dst_gid
    launch(_accumulate, (indptr.shape[0] - 1) * z.shape[1], indptr, indices, z, s_src, s_dst, src_gid,
           dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, acc)


@cuda.jit(device=True, inline=True)
def _edge_grad(i, j, h, z, s_src, s_dst, edge_hash, slope, p, m, l, grad_out, delta):
    """(grad wrt the pre-activation score, weight p_ij * keep / (1-p)) of edge (i, j), head h."""
    pre = s_dst[i, h] + s_src[j, h]
    a = pre if pre >= 0 else pre * slope
    prob = math.exp(a - m[i, h]) / l[i, h]
    kept = 1.0 / (1.0 - p) if p > 0.0 else 1.0
    if p > 0.0 and not _keep(edge_hash, h, p):
        kept = 0.0
    dot = 0.0
    if kept != 0.0:
        for d in range(z.shape[2]):
            dot += grad_out[i, h, d] * z[j, h, d]
    ge = prob * (kept * dot - delta[i, h])
    if pre < 0:
        ge = ge * slope
    return ge, prob * kept


@cuda.jit
def _backward_dst(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out,
                  delta, grad_s_dst):
    t = cuda.grid(1)
    H = z.shape[1]
    if t >= (indptr.shape[0] - 1) * H:
        return
    i = t // H
    h = t - i * H
    dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if p > 0.0 else np.uint64(0)
    total = 0.0
    for e in range(indptr[i], indptr[i + 1]):
        j = indices[e]
        edge_hash = _mix(dst_hash, _gid(src_gid, j)) if p > 0.0 else np.uint64(0)
        ge, w = _edge_grad(i, j, h, z, s_src, s_dst, edge_hash, slope, p, m, l, grad_out, delta)
        total += ge
    grad_s_dst[i, h] += total


def backward_dst(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
                 attn_dropout: float, seed: int, m, l, grad_out, delta, grad_s_dst) -> None:
    """Row pass of one block's backward: ``grad_s_dst += sum_j grad_e_ij`` (see the CPU twin)."""
    if indices.shape[0] == 0:
        return
    src_gid = local_ids() if src_gid is None else src_gid
    dst_gid = local_ids() if dst_gid is None else dst_gid
    launch(_backward_dst, (indptr.shape[0] - 1) * z.shape[1], indptr, indices, z, s_src, s_dst, src_gid,
           dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta, grad_s_dst)


@cuda.jit
def _backward_src(indptr_t, indices_t, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out,
                  delta, grad_z, grad_s_src):
    t = cuda.grid(1)
    H = z.shape[1]
    if t >= (indptr_t.shape[0] - 1) * H:
        return
    j = t // H
    h = t - j * H
    seed_hash = _mix(np.uint64(0), seed)
    total = 0.0
    for e in range(indptr_t[j], indptr_t[j + 1]):
        i = indices_t[e]
        edge_hash = _mix(_mix(seed_hash, _gid(dst_gid, i)), _gid(src_gid, j)) if p > 0.0 else np.uint64(0)
        ge, w = _edge_grad(i, j, h, z, s_src, s_dst, edge_hash, slope, p, m, l, grad_out, delta)
        total += ge
        if w != 0.0:
            for d in range(z.shape[2]):
                grad_z[j, h, d] += w * grad_out[i, h, d]
    grad_s_src[j, h] += total


def backward_src(indptr_t, indices_t, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
                 attn_dropout: float, seed: int, m, l, grad_out, delta, grad_z, grad_s_src) -> None:
    """Column pass of one block's backward over the transposed CSR (see the CPU twin)."""
    if indices_t.shape[0] == 0:
        return
    src_gid = local_ids() if src_gid is None else src_gid
    dst_gid = local_ids() if dst_gid is None else dst_gid
    launch(_backward_src, (indptr_t.shape[0] - 1) * z.shape[1], indptr_t, indices_t, z, s_src, s_dst,
           src_gid, dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta,
           grad_z, grad_s_src)
