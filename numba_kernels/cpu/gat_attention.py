"""Fused GATv1 attention, block-wise with an online softmax (CPU twin).

For destination ``i``, in-edge source ``j`` (CSR row ``i`` lists ``j``), head ``h``::

    e_ij    = LeakyReLU(s_dst[i,h] + s_src[j,h], negative_slope)
    alpha_ij = softmax_j(e_ij)                 over ALL in-edges of i (all blocks)
    out[i,h,:] = sum_j alpha_ij * keep_ij / (1-p) * z[j,h,:]

The sources arrive in blocks (a SAR block G_{p,q}: the CSR columns are
block-local source ids).  :func:`accumulate` folds one block into the running
state ``(m, l, acc)`` (max, sum of ``exp(e - m)``, un-normalised numerator;
rescaled whenever the max grows); :func:`finalize` divides by ``l``.  No
E x H tensor is ever stored.  Self-loops are not added here: pass them as an
extra block (a diagonal CSR over the destination rows).

Backward for one block recomputes the scores (``p_ij = exp(e_ij - m_i)/l_i``)::

    grad_e_ij   = p_ij * (keep_ij/(1-p) * grad_out_i . z_j - delta_i) * LeakyReLU'(.)
    grad_z_j   += p_ij * keep_ij/(1-p) * grad_out_i
    grad_s_src_j += grad_e_ij ;  grad_s_dst_i += grad_e_ij

with ``delta_i = grad_out_i . out_i`` (:func:`output_delta`).  Without atomics:
:func:`backward_dst` walks the CSR rows (grad wrt ``s_dst``),
:func:`backward_src` walks the transposed copy (grad wrt ``z`` and ``s_src``).

Attention dropout: head ``h`` of edge ``(i, j)`` is kept when a splitmix64 hash
of ``(seed, dst_gid[i], src_gid[j], h)`` maps to a uniform ``>= p``; kept values
are scaled by ``1/(1-p)``.  The same mask results for every block split and is
recomputed in backward.  ``src_gid``/``dst_gid`` are int64 global ids, or
``None`` for "global id = local id" (only read when ``attn_dropout > 0``).

All outputs are accumulated (``+=``) into caller-allocated arrays; all float
arrays share one dtype (float32 or float64) and are C-contiguous.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import (FASTMATH, _edge_hash, _gid, _head_dot, _leaky, _scalars, _small,
                                                 finalize, global_ids, init_state, output_delta, run_parallel)
from numba_kernels.cpu._hash import _keep, _mix

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src"]


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _accumulate(bounds, indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope64, p, seed, m, l, acc):
    H = z.shape[1]
    D = z.shape[2]
    use_drop = p > 0.0
    seed_hash = _mix(np.uint64(0), seed)
    for c in prange(bounds.shape[0] - 1):
        slope, inv_keep, _, one = _scalars(z, slope64, 1.0 / (1.0 - p))
        mnew = np.empty(H, dtype=z.dtype)
        sdi = np.empty(H, dtype=z.dtype)
        rl = np.empty(H, dtype=z.dtype)
        racc = np.empty((H, D), dtype=z.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            lo = indptr[i]
            hi = indptr[i + 1]
            if lo == hi:
                continue
            # pass 1: block max of the scores
            for h in range(H):
                mnew[h] = m[i, h]
                sdi[h] = s_dst[i, h]
            for e in range(lo, hi):
                j = indices[e]
                for h in range(H):
                    a = _leaky(sdi[h] + s_src[j, h], slope)
                    if a > mnew[h]:
                        mnew[h] = a
            # rescale what earlier blocks accumulated (exp(-inf) = 0 on the first block)
            for h in range(H):
                r = np.exp(m[i, h] - mnew[h]) if mnew[h] > m[i, h] else one
                rl[h] = l[i, h] * r
                for d in range(D):
                    racc[h, d] = acc[i, h, d] * r
            # pass 2: accumulate into the row's registers
            dst_hash = _mix(seed_hash, _gid(dst_gid, i)) if use_drop else np.uint64(0)
            for e in range(lo, hi):
                j = indices[e]
                edge_hash = _edge_hash(dst_hash, src_gid, j, use_drop)
                for h in range(H):
                    w = np.exp(_leaky(sdi[h] + s_src[j, h], slope) - mnew[h])
                    rl[h] += w
                    if use_drop:
                        if not _keep(edge_hash, h, p):
                            continue
                        w = w * inv_keep
                    for d in range(D):
                        racc[h, d] += w * z[j, h, d]
            for h in range(H):
                m[i, h] = mnew[h]
                l[i, h] = rl[h]
                for d in range(D):
                    acc[i, h, d] = racc[h, d]


def accumulate(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
               attn_dropout: float, seed: int, m, l, acc) -> None:
    """Fold one block of sources into the state ``(m, l, acc)`` in place.

    Args:
        indptr: int64[num_dst+1], indices: int64[E] block CSR (columns are block-local sources).
        z: float[num_src, H, D] source features of the block.
        s_src: float[num_src, H] source scores; s_dst: float[num_dst, H] destination scores.
        src_gid: int64[num_src], dst_gid: int64[num_dst] global ids (dropout hash only) or None.
        negative_slope: LeakyReLU slope; attn_dropout: drop probability in [0, 1); seed: int >= 0.
        m, l: float[num_dst, H]; acc: float[num_dst, H, D]: state, updated in place.
    """
    if indptr.shape[0] == 1 or indices.shape[0] == 0:
        return
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    work = indices.shape[0] * z.shape[1] * (z.shape[2] + 4)
    run_parallel(_accumulate, indptr, work, indices, z, s_src, s_dst, src_gid, dst_gid,
                float(negative_slope), float(attn_dropout), int(seed), m, l, acc)


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _backward_dst(bounds, indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope64, p, seed,
                  m, l, grad_out, delta, grad_s_dst):
    H = z.shape[1]
    use_drop = p > 0.0
    seed_hash = _mix(np.uint64(0), seed)
    for c in prange(bounds.shape[0] - 1):
        slope, inv_keep, zero, _ = _scalars(z, slope64, 1.0 / (1.0 - p))
        gsum = np.empty(H, dtype=z.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            lo = indptr[i]
            hi = indptr[i + 1]
            if lo == hi:
                continue
            for h in range(H):
                gsum[h] = zero
            dst_hash = _mix(seed_hash, _gid(dst_gid, i)) if use_drop else np.uint64(0)
            for e in range(lo, hi):
                j = indices[e]
                edge_hash = _edge_hash(dst_hash, src_gid, j, use_drop)
                for h in range(H):
                    pre = s_dst[i, h] + s_src[j, h]
                    prob = np.exp(_leaky(pre, slope) - m[i, h]) / l[i, h]
                    kept = inv_keep
                    if use_drop and not _keep(edge_hash, h, p):
                        kept = zero
                    dot = _head_dot(grad_out, i, z, j, h, zero) if kept != 0 else zero
                    ge = prob * (kept * dot - delta[i, h])
                    if pre < 0:
                        ge = ge * slope
                    gsum[h] += ge
            for h in range(H):
                grad_s_dst[i, h] += gsum[h]


def backward_dst(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
                 attn_dropout: float, seed: int, m, l, grad_out, delta, grad_s_dst) -> None:
    """Row pass of one block's backward: ``grad_s_dst[i,h] += sum_j grad_e_ij``.

    ``m``, ``l`` are the final state, ``grad_out`` float[num_dst, H, D] the
    output gradient and ``delta`` float[num_dst, H] from :func:`output_delta`.
    Other arguments as in :func:`accumulate`.
    """
    if indptr.shape[0] == 1 or indices.shape[0] == 0:
        return
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    work = indices.shape[0] * z.shape[1] * (z.shape[2] + 4)
    run_parallel(_backward_dst, indptr, work, indices, z, s_src, s_dst, src_gid, dst_gid,
                 float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta, grad_s_dst)


@njit(parallel=True, cache=True)
def _pack_dst(s_dst, m, l, delta, aux):
    """aux[i, h, :] = (s_dst, m, 1/l, delta): one cache line per destination in the column pass."""
    for i in prange(s_dst.shape[0]):
        for h in range(s_dst.shape[1]):
            aux[i, h, 0] = s_dst[i, h]
            aux[i, h, 1] = m[i, h]
            aux[i, h, 2] = 1.0 / l[i, h] if l[i, h] > 0 else 0.0
            aux[i, h, 3] = delta[i, h]


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _backward_src(bounds, indptr_t, indices_t, z, s_src, aux, src_gid, dst_gid, slope64, p, seed,
                  grad_out, grad_z, grad_s_src):
    H = z.shape[1]
    D = z.shape[2]
    use_drop = p > 0.0
    seed_hash = _mix(np.uint64(0), seed)
    for c in prange(bounds.shape[0] - 1):
        slope, inv_keep, zero, _ = _scalars(z, slope64, 1.0 / (1.0 - p))
        gs = np.empty(H, dtype=z.dtype)
        gz = np.empty((H, D), dtype=z.dtype)
        for j in range(bounds[c], bounds[c + 1]):
            lo = indptr_t[j]
            hi = indptr_t[j + 1]
            if lo == hi:
                continue
            for h in range(H):
                gs[h] = zero
                for d in range(D):
                    gz[h, d] = zero
            for t in range(lo, hi):
                i = indices_t[t]
                dst_hash = _mix(seed_hash, _gid(dst_gid, i)) if use_drop else seed_hash
                edge_hash = _edge_hash(dst_hash, src_gid, j, use_drop)
                for h in range(H):
                    pre = aux[i, h, 0] + s_src[j, h]
                    prob = np.exp(_leaky(pre, slope) - aux[i, h, 1]) * aux[i, h, 2]
                    ge = -prob * aux[i, h, 3]
                    if not (use_drop and not _keep(edge_hash, h, p)):
                        w = prob * inv_keep
                        dot = zero
                        for d in range(D):
                            g = grad_out[i, h, d]
                            dot += g * z[j, h, d]
                            gz[h, d] += w * g
                        ge += w * dot
                    if pre < 0:
                        ge = ge * slope
                    gs[h] += ge
            for h in range(H):
                grad_s_src[j, h] += gs[h]
                for d in range(D):
                    grad_z[j, h, d] += gz[h, d]


def backward_src(indptr_t, indices_t, z, s_src, s_dst, src_gid, dst_gid, negative_slope: float,
                 attn_dropout: float, seed: int, m, l, grad_out, delta, grad_z, grad_s_src) -> None:
    """Column pass of one block's backward over the transposed CSR.

    ``indptr_t`` int64[num_src+1], ``indices_t`` int64[E] (destination of each
    edge, source-major; :meth:`hpc_graph.ops.CSR.csc`).  Accumulates
    ``grad_z`` float[num_src, H, D] and ``grad_s_src`` float[num_src, H].
    Other arguments as in :func:`backward_dst`.
    """
    if indptr_t.shape[0] == 1 or indices_t.shape[0] == 0:
        return
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    work = indices_t.shape[0] * z.shape[1] * (2 * z.shape[2] + 4)
    aux = np.empty((s_dst.shape[0], s_dst.shape[1], 4), dtype=s_dst.dtype)
    _small(_pack_dst, work, s_dst, m, l, delta, aux)
    run_parallel(_backward_src, indptr_t, work, indices_t, z, s_src, aux, src_gid, dst_gid,
                 float(negative_slope), float(attn_dropout), int(seed), grad_out, grad_z, grad_s_src)
