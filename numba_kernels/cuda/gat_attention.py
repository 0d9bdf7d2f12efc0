"""Fused GATv1 attention, block-wise with an online softmax (CUDA twin).

Same functions, arguments and semantics as :mod:`numba_kernels.cpu.gat_attention`
(see there for the formulas); arrays are numba device arrays or anything with
``__cuda_array_interface__``. No atomics, a deterministic result.

Rows of ``F = H * D <= 32 * MAX_SLOTS`` features (every usual GAT layer) take
the warp kernels: one warp per destination row (forward, row backward) or per
source row (column backward over the transposed CSR), lane ``t`` owning the
features ``t, t + 32, ...`` in registers, so every gathered row of ``z`` or
``grad_out`` is one coalesced load per slot and the state is read and written
once per row, not once per edge. Each lane recomputes the scores of its heads
(cheap next to the row loads). The per-head dot products of the backward pass
are factored out of the edge loop (``sum_e p_e s_e <go_i, z_j>`` =
``<go_i, sum_e p_e s_e z_j>``) and reduced once per row through shared memory;
the rows of a block advance together so the block can synchronise. Wider rows
use one thread per (row, head).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from numba_kernels.cuda._attention_common import (_gid, _keep, _mix, finalize, init_state, launch, local_ids,
                                                  output_delta)
from numba_kernels.cuda._launch import stream

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src", "MAX_SLOTS"]

#: feature slots per lane of the warp kernels (F = H * D <= 32 * MAX_SLOTS)
MAX_SLOTS = 8
_WARPS = 4  # warps (rows) per block of the warp kernels
_MAX_BLOCKS = 65535 * 4


def _build_warp(nbtype, C: int):
    """The three warp kernels for ``C`` feature slots per lane (compile-time)."""
    SH = (_WARPS, 32 * C)  # shared scratch of a block: one row of partials per warp (a constant tuple)

    @cuda.jit(device=True, inline=True)
    def _slot_heads(lane, F, D, heads):
        for c in range(C):
            f = lane + 32 * c
            heads[c] = f // D if f < F else -1

    @cuda.jit
    def accumulate_warp(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, acc, D):
        # z [Ns, F], acc [Nd, F] flat views; s_*, m, l [rows, H]. Every lane of a head reads the head's
        # m and l; its first lane writes them back after the block's barrier (no lane reads a new value).
        F = acc.shape[1]
        n = indptr.shape[0] - 1
        w = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        heads = cuda.local.array(C, np.int64)
        mx = cuda.local.array(C, nbtype)
        sd = cuda.local.array(C, nbtype)
        run_l = cuda.local.array(C, nbtype)
        ac = cuda.local.array(C, nbtype)
        _slot_heads(lane, F, D, heads)
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        for base in range(cuda.blockIdx.x * _WARPS, n, cuda.gridDim.x * _WARPS):
            i = base + w
            lo = 0
            hi = 0
            if i < n:
                lo = indptr[i]
                hi = indptr[i + 1]
            if hi > lo:
                for c in range(C):
                    h = heads[c]
                    if h >= 0:
                        sd[c] = s_dst[i, h]
                        mx[c] = m[i, h]
                for e in range(lo, hi):
                    j = indices[e]
                    for c in range(C):
                        h = heads[c]
                        if h >= 0:
                            a = sd[c] + s_src[j, h]
                            if a < 0:
                                a = a * slope
                            if a > mx[c]:
                                mx[c] = a
                for c in range(C):
                    h = heads[c]
                    if h >= 0:
                        old = m[i, h]
                        rl = l[i, h]
                        av = acc[i, lane + 32 * c]
                        if mx[c] > old:
                            r = math.exp(old - mx[c])
                            rl *= r
                            av *= r
                        else:
                            mx[c] = old
                        run_l[c] = rl
                        ac[c] = av
            cuda.syncthreads()  # every lane has read m and l of its row
            if hi > lo:
                dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
                for e in range(lo, hi):
                    j = indices[e]
                    edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
                    for c in range(C):
                        h = heads[c]
                        if h >= 0:
                            a = sd[c] + s_src[j, h]
                            if a < 0:
                                a = a * slope
                            wt = math.exp(a - mx[c])
                            run_l[c] += wt
                            if use_drop:
                                if not _keep(edge_hash, h, p):
                                    continue
                                wt = wt * inv_keep
                            ac[c] += wt * z[j, lane + 32 * c]
                for c in range(C):
                    h = heads[c]
                    if h >= 0:
                        acc[i, lane + 32 * c] = ac[c]
                        if (lane + 32 * c) % D == 0:
                            m[i, h] = mx[c]
                            l[i, h] = run_l[c]

    @cuda.jit(device=True, inline=True)
    def _head_sums(sh, w, lane, F, D, heads, part, out, C_):
        """Write each slot's partial to shared memory, sync, and let each head's first lane add them up."""
        for c in range(C_):
            if heads[c] >= 0:
                sh[w, lane + 32 * c] = part[c]
        cuda.syncthreads()
        for c in range(C_):
            f = lane + 32 * c
            out[c] = 0.0
            if heads[c] >= 0 and f % D == 0:
                t = sh[w, f] * 0
                for q in range(f, f + D):
                    t += sh[w, q]
                out[c] = t
        cuda.syncthreads()

    @cuda.jit
    def backward_dst_warp(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out,
                          delta, grad_s_dst, D):
        # z [Ns, F], grad_out [Nd, F] flat views; grad_s_dst[i, h] += sum_e ge
        F = grad_out.shape[1]
        n = indptr.shape[0] - 1
        w = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        sh = cuda.shared.array(SH, nbtype)
        heads = cuda.local.array(C, np.int64)
        bz = cuda.local.array(C, nbtype)   # sum_e p_e kept_e s_e z_j   (per feature)
        tt = cuda.local.array(C, nbtype)   # sum_e p_e s_e               (per head, same in its lanes)
        part = cuda.local.array(C, nbtype)
        tot = cuda.local.array(C, nbtype)
        _slot_heads(lane, F, D, heads)
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        for base in range(cuda.blockIdx.x * _WARPS, n, cuda.gridDim.x * _WARPS):
            i = base + w
            active = i < n
            for c in range(C):
                bz[c] = 0
                tt[c] = 0
            if active:
                dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
                for e in range(indptr[i], indptr[i + 1]):
                    j = indices[e]
                    edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
                    for c in range(C):
                        h = heads[c]
                        if h >= 0:
                            pre = s_dst[i, h] + s_src[j, h]
                            a = pre if pre >= 0 else pre * slope
                            prob = math.exp(a - m[i, h]) / l[i, h]
                            sl = 1.0 if pre >= 0 else slope
                            tt[c] += prob * sl
                            kept = inv_keep
                            if use_drop and not _keep(edge_hash, h, p):
                                kept = 0.0
                            bz[c] += prob * kept * sl * z[j, lane + 32 * c]
            for c in range(C):
                part[c] = grad_out[i, lane + 32 * c] * bz[c] if (active and heads[c] >= 0) else 0
            _head_sums(sh, w, lane, F, D, heads, part, tot, C)
            if active:
                for c in range(C):
                    h = heads[c]
                    if h >= 0 and (lane + 32 * c) % D == 0:
                        grad_s_dst[i, h] += tot[c] - delta[i, h] * tt[c]

    @cuda.jit
    def backward_src_warp(indptr_t, indices_t, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out,
                          delta, grad_z, grad_s_src, D):
        # over the transposed CSR: row j lists the destinations i of j's out-edges
        F = z.shape[1]
        n = indptr_t.shape[0] - 1
        w = cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        sh = cuda.shared.array(SH, nbtype)
        heads = cuda.local.array(C, np.int64)
        gz = cuda.local.array(C, nbtype)   # sum_i p kept go_i            (grad_z)
        ag = cuda.local.array(C, nbtype)   # sum_i p kept s go_i          (dotted with z_j)
        tt = cuda.local.array(C, nbtype)   # sum_i p s delta_i            (per head)
        part = cuda.local.array(C, nbtype)
        tot = cuda.local.array(C, nbtype)
        _slot_heads(lane, F, D, heads)
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        seed_hash = _mix(np.uint64(0), seed)
        for base in range(cuda.blockIdx.x * _WARPS, n, cuda.gridDim.x * _WARPS):
            j = base + w
            active = j < n
            for c in range(C):
                gz[c] = 0
                ag[c] = 0
                tt[c] = 0
            if active:
                for e in range(indptr_t[j], indptr_t[j + 1]):
                    i = indices_t[e]
                    edge_hash = _mix(_mix(seed_hash, _gid(dst_gid, i)), _gid(src_gid, j)) if use_drop \
                        else np.uint64(0)
                    for c in range(C):
                        h = heads[c]
                        if h >= 0:
                            pre = s_dst[i, h] + s_src[j, h]
                            a = pre if pre >= 0 else pre * slope
                            prob = math.exp(a - m[i, h]) / l[i, h]
                            sl = 1.0 if pre >= 0 else slope
                            tt[c] += prob * sl * delta[i, h]
                            kept = inv_keep
                            if use_drop and not _keep(edge_hash, h, p):
                                kept = 0.0
                            g = grad_out[i, lane + 32 * c]
                            gz[c] += prob * kept * g
                            ag[c] += prob * kept * sl * g
            for c in range(C):
                part[c] = z[j, lane + 32 * c] * ag[c] if (active and heads[c] >= 0) else 0
            _head_sums(sh, w, lane, F, D, heads, part, tot, C)
            if active:
                for c in range(C):
                    h = heads[c]
                    if h >= 0:
                        grad_z[j, lane + 32 * c] += gz[c]
                        if (lane + 32 * c) % D == 0:
                            grad_s_src[j, h] += tot[c] - tt[c]

    return accumulate_warp, backward_dst_warp, backward_src_warp


_WARP_CACHE: dict = {}


def _warp_kernels(dtype, features: int):
    """The warp kernels for rows of ``features`` values, or None when wider than ``32 * MAX_SLOTS``."""
    C = (features + 31) // 32
    if C > MAX_SLOTS or features == 0:
        return None
    key = (np.dtype(dtype).name, C)
    if key not in _WARP_CACHE:
        if key[0] not in ("float32", "float64"):
            raise ValueError(f"gat_attention CUDA kernels support float32/float64, got {key[0]}")
        _WARP_CACHE[key] = _build_warp(float32 if key[0] == "float32" else float64, C)
    return _WARP_CACHE[key]


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2])


def _warp_blocks(rows: int) -> int:
    """Blocks of ``_WARPS`` warps for one warp per row (grid-stride beyond ``_MAX_BLOCKS``)."""
    return max(1, min((rows + _WARPS - 1) // _WARPS, _MAX_BLOCKS))


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
    warp = _warp_kernels(acc.dtype, z.shape[1] * z.shape[2])
    if warp is not None:
        rows = indptr.shape[0] - 1
        warp[0][_warp_blocks(rows), 32 * _WARPS, stream()](
            indptr, indices, _flat(z), s_src, s_dst, src_gid, dst_gid, float(negative_slope), float(attn_dropout),
            int(seed), m, l, _flat(acc), z.shape[2])
        return
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
    warp = _warp_kernels(grad_out.dtype, z.shape[1] * z.shape[2])
    if warp is not None:
        rows = indptr.shape[0] - 1
        warp[1][_warp_blocks(rows), 32 * _WARPS, stream()](
            indptr, indices, _flat(z), s_src, s_dst, src_gid, dst_gid, float(negative_slope), float(attn_dropout),
            int(seed), m, l, _flat(grad_out), delta, grad_s_dst, z.shape[2])
        return
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
    warp = _warp_kernels(grad_z.dtype, z.shape[1] * z.shape[2])
    if warp is not None:
        rows = indptr_t.shape[0] - 1
        warp[2][_warp_blocks(rows), 32 * _WARPS, stream()](
            indptr_t, indices_t, _flat(z), s_src, s_dst, src_gid, dst_gid, float(negative_slope),
            float(attn_dropout), int(seed), m, l, _flat(grad_out), delta, _flat(grad_z), grad_s_src, z.shape[2])
        return
    launch(_backward_src, (indptr_t.shape[0] - 1) * z.shape[1], indptr_t, indices_t, z, s_src, s_dst,
           src_gid, dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta,
           grad_z, grad_s_src)
