"""Fused GATv1 attention, block-wise with an online softmax (CUDA twin).

Same functions, arguments and semantics as :mod:`numba_kernels.cpu.gat_attention`
(see there for the formulas); arrays are numba device arrays or anything with
``__cuda_array_interface__``. No atomics, a deterministic result.

Rows of ``F = H * D <= 32 * MAX_SLOTS`` features (every usual GAT layer) take
the chunked kernels (:mod:`numba_kernels.cuda._chunks`): the CSR positions are
cut into chunks of ``EDGES_PER_CHUNK``, one warp per chunk, lane ``t`` owning
the features ``t, t + 32, ...`` in registers, so every gathered row of ``z``
or ``grad_out`` is one coalesced load per slot and a hub row is shared by as
many warps as it has chunks. Each lane recomputes the scores of its heads.

* forward: each row segment gets its own softmax state (max, weight sum,
  weighted rows); whole rows merge it with the old state, and the parts of
  rows that cross chunks are merged in chunk order by a second kernel. The
  old ``m``/``l`` are read from a snapshot, so no lane reads a value another
  lane has already replaced.
* backward: the per-head dot products are factored out of the edge loops
  (``sum_e p_e s_e <go_i, z_j> = <go_i, sum_e p_e s_e z_j>``): the chunk
  kernels accumulate per-feature sums, write ``go * sums`` (or ``z * sums``)
  per row into scratch, and a small kernel adds each head's features up.

Wider rows use one thread per (row, head), walking a row alone.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from numba_kernels.cuda._attention_common import (_gid, _leaky, _raise_max, finalize, global_ids, init_state, launch,
                                                  output_delta)
from numba_kernels.cuda._hash import _keep, _mix
from numba_kernels.cuda._chunks import chunk_kernels, launch_chunks, sum_parts
from numba_kernels.cuda._launch import compiled, scratch, stream

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src", "MAX_SLOTS"]

#: feature slots per lane of the chunked kernels (F = H * D <= 32 * MAX_SLOTS)
MAX_SLOTS = 8
#: CSR positions per chunk (one warp's share of the edges, see numba_kernels.cuda._chunks)
EDGES_PER_CHUNK = 256
_THREADS = 128
_MAX_BLOCKS = 65535 * 4


def _build_chunked(nbtype, C: int):
    """The three chunked computations (forward, row backward, column backward) for ``C`` slots per lane.

    A warp takes a chunk of CSR positions (:func:`numba_kernels.cuda._chunks.chunk_kernels`); lane ``t`` owns
    features ``t, t + 32, ...`` of every row it touches and recomputes the scores of its heads. ``z``,
    ``acc``, ``grad_out``, ``grad_z`` are flat ``[rows, F]`` views; scores and states ``[rows, H]``.
    """
    zero = nbtype(0)
    one = nbtype(1)
    ninf = nbtype(-np.inf)

    # Every edge loop below runs each slot's arithmetic without a per-slot test: a slot past the row's F
    # features uses head 0 and column 0 (``slots``) and computes values that ``store``/``put`` never
    # write, so the loads of all slots are issued together. The scores' arithmetic is in the rows' precision
    # (``slope`` arrives as a scalar of that type; literals are typed), only the dropout test uses ``p`` as
    # given, as the CPU twin does.

    @cuda.jit(device=True, inline=True)
    def keep_scale(p):
        return nbtype(1.0 / (1.0 - p)) if p > 0.0 else one

    # ---------------------------------------------------------------- forward: acc = (max, weight sum, rows)
    # args = (z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m0, l0, m, l, out)
    @cuda.jit(device=True, inline=True)
    def fwd_reset(acc):
        for c in range(C):
            acc[0, c] = ninf
            acc[1, c] = zero
            acc[2, c] = zero

    @cuda.jit(device=True, inline=True)
    def fwd_segment(i, k0, k1, indices, args, heads, slots, tmp, lane, acc):
        """Softmax state of row ``i`` over positions ``[k0, k1)`` alone: max, sum of weights, weighted rows."""
        z, s_src, s_dst, src_gid, dst_gid, slope, p, seed = (args[0], args[1], args[2], args[3], args[4], args[5],
                                                             args[6], args[7])
        for c in range(C):
            tmp[0, c] = s_dst[i, slots[0, c]]
        for e in range(k0, k1):
            j = indices[e]
            for c in range(C):
                a = _leaky(tmp[0, c] + s_src[j, slots[0, c]], slope)
                if a > acc[0, c]:
                    acc[0, c] = a
        use_drop = p > 0.0
        inv_keep = keep_scale(p)
        dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
        for e in range(k0, k1):
            j = indices[e]
            edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                w = math.exp(_leaky(tmp[0, c] + s_src[j, slots[0, c]], slope) - acc[0, c])
                acc[1, c] += w
                if use_drop:
                    w = w * inv_keep if _keep(edge_hash, slots[0, c], p) else zero
                acc[2, c] += w * z[j, slots[1, c]]

    @cuda.jit(device=True, inline=True)
    def fold(acc, c, m2, l2, a2):
        """Fold the state ``(m2, l2, a2)`` into slot ``c`` (online softmax)."""
        top = acc[0, c] if acc[0, c] > m2 else m2
        if top == ninf:
            return
        r1 = math.exp(acc[0, c] - top) if acc[0, c] > ninf else zero
        r2 = math.exp(m2 - top) if m2 > ninf else zero
        acc[1, c] = acc[1, c] * r1 + l2 * r2
        acc[2, c] = acc[2, c] * r1 + a2 * r2
        acc[0, c] = top

    @cuda.jit(device=True, inline=True)
    def fwd_merge(acc, part, ch, heads, lane):
        for c in range(C):
            if heads[c] >= 0:
                f = lane + 32 * c
                fold(acc, c, part[0, ch, f], part[1, ch, f], part[2, ch, f])

    @cuda.jit(device=True, inline=True)
    def fwd_store(i, deg, D, args, heads, lane, acc):
        """Merge a whole row's new state with its old one (``m0``/``l0``: a snapshot nobody writes) and store it."""
        m0, l0, m, l, out = args[8], args[9], args[10], args[11], args[12]
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                fold(acc, c, m0[i, h], l0[i, h], out[i, f])
                out[i, f] = acc[2, c]
                if f == h * D:
                    m[i, h] = acc[0, c]
                    l[i, h] = acc[1, c]

    # ---------------------------------------------------------------- backward over rows: acc = (bz, tt)
    # args = (z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, rowbuf, rowtt)
    @cuda.jit(device=True, inline=True)
    def dst_segment(i, k0, k1, indices, args, heads, slots, tmp, lane, acc):
        """Add row ``i``'s positions: ``bz += p kept s z_j`` (per feature), ``tt += p s`` (per head)."""
        z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l = (args[0], args[1], args[2], args[3], args[4],
                                                                   args[5], args[6], args[7], args[8], args[9])
        for c in range(C):  # the row's score, max and weight sum per slot: loaded once
            tmp[0, c] = s_dst[i, slots[0, c]]
            tmp[1, c] = m[i, slots[0, c]]
            tmp[2, c] = l[i, slots[0, c]]
        use_drop = p > 0.0
        inv_keep = keep_scale(p)
        dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
        for e in range(k0, k1):
            j = indices[e]
            edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                pre = tmp[0, c] + s_src[j, slots[0, c]]
                prob = math.exp(_leaky(pre, slope) - tmp[1, c]) / tmp[2, c]
                slf = one if pre >= 0 else slope
                acc[1, c] += prob * slf
                kept = inv_keep
                if use_drop and not _keep(edge_hash, slots[0, c], p):
                    kept = zero
                acc[0, c] += prob * kept * slf * z[j, slots[1, c]]

    @cuda.jit(device=True, inline=True)
    def dst_store(i, deg, D, args, heads, lane, acc):
        grad_out, rowbuf, rowtt = args[10], args[11], args[12]
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                rowbuf[i, f] = grad_out[i, f] * acc[0, c]
                if f == h * D:
                    rowtt[i, h] = acc[1, c]

    # ---------------------------------------------------------------- backward over columns: acc = (gz, ag, tt)
    # args = (z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, delta, grad_z, rowbuf, rowtt)
    @cuda.jit(device=True, inline=True)
    def src_segment(j, k0, k1, indices_t, args, heads, slots, tmp, lane, acc):
        """Add source ``j``'s transposed positions: ``gz += p kept go_i``, ``ag += p kept s go_i`` (per feature),
        ``tt += p s delta_i`` (per head)."""
        s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, delta = (
            args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], args[10], args[11])
        for c in range(C):  # the source's score per slot: loaded once
            tmp[0, c] = s_src[j, slots[0, c]]
        use_drop = p > 0.0
        inv_keep = keep_scale(p)
        seed_hash = _mix(np.uint64(0), seed)
        for e in range(k0, k1):
            i = indices_t[e]
            edge_hash = _mix(_mix(seed_hash, _gid(dst_gid, i)), _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                h = slots[0, c]
                pre = s_dst[i, h] + tmp[0, c]
                prob = math.exp(_leaky(pre, slope) - m[i, h]) / l[i, h]
                slf = one if pre >= 0 else slope
                acc[2, c] += prob * slf * delta[i, h]
                kept = inv_keep
                if use_drop and not _keep(edge_hash, h, p):
                    kept = zero
                g = grad_out[i, slots[1, c]]
                acc[0, c] += prob * kept * g
                acc[1, c] += prob * kept * slf * g

    @cuda.jit(device=True, inline=True)
    def src_store(j, deg, D, args, heads, lane, acc):
        z, grad_z, rowbuf, rowtt = args[0], args[12], args[13], args[14]
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                grad_z[j, f] += acc[0, c]
                rowbuf[j, f] = z[j, f] * acc[1, c]
                if f == h * D:
                    rowtt[j, h] = acc[2, c]

    reset2, merge2 = sum_parts(32, C, 2, nbtype)
    reset3, merge3 = sum_parts(32, C, 3, nbtype)
    return (chunk_kernels(nbtype, 32, C, 3, fwd_reset, fwd_segment, fwd_store, fwd_merge, skip_empty=True, NT=1),
            chunk_kernels(nbtype, 32, C, 2, reset2, dst_segment, dst_store, merge2, skip_empty=True, NT=3),
            chunk_kernels(nbtype, 32, C, 3, reset3, src_segment, src_store, merge3, skip_empty=True, NT=1))


@cuda.jit
def _head_reduce(indptr, rowbuf, rowtt, scale, out, D):
    """``out[i, h] += sum_d rowbuf[i, h D + d] - scale[i, h] * rowtt[i, h]`` for rows with edges (thread per
    (row, head); ``scale`` of 0 rows means 1)."""
    t = cuda.grid(1)
    H = out.shape[1]
    if t >= out.shape[0] * H:
        return
    i = t // H
    h = t - i * H
    if indptr[i + 1] == indptr[i]:
        return
    s = rowbuf[i, h * D] * 0
    for d in range(D):
        s += rowbuf[i, h * D + d]
    tt = rowtt[i, h]
    if scale.shape[0] > 0:
        tt = tt * scale[i, h]
    out[i, h] += s - tt


_chunked = compiled("gat_attention", _build_chunked)


def _chunked_kernels(dtype, features: int):
    """The chunked kernels for rows of ``features`` values, or None when wider than ``32 * MAX_SLOTS``."""
    C = (features + 31) // 32
    if C > MAX_SLOTS or features == 0:
        return None
    return _chunked(dtype, C)


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2])


def _typed(value: float, dtype):
    """``value`` as a scalar of the rows' type: a float32 kernel then scores in float32, not float64."""
    return np.dtype(dtype).type(value)


def _run(kernels, indptr, indices, z, args, dtype, num_acc: int) -> None:
    """One chunked computation over ``(indptr, indices)`` with ``z``'s rows of ``H x D`` features."""
    launch_chunks(kernels, 32, _THREADS, _MAX_BLOCKS, stream(), indptr, indices, z.shape[1] * z.shape[2], z.shape[2],
                  EDGES_PER_CHUNK, args, dtype, scratch, num_acc)


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
        mx = max(mx, _leaky(sd + s_src[indices[e], h], slope))
    run_l, mx = _raise_max(i, h, mx, m, l, acc)
    use_drop = p > 0.0
    inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
    dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
    for e in range(lo, hi):
        j = indices[e]
        w = math.exp(_leaky(sd + s_src[j, h], slope) - mx)
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
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    ks = _chunked_kernels(acc.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        m0, l0 = scratch(m.shape, m.dtype), scratch(l.shape, l.dtype)  # the old state, read while m, l change
        m0.copy_to_device(m, stream=stream())
        l0.copy_to_device(l, stream=stream())
        args = (_flat(z), s_src, s_dst, src_gid, dst_gid, _typed(negative_slope, acc.dtype), float(attn_dropout),
                int(seed), m0, l0, m, l, _flat(acc))
        _run(ks[0], indptr, indices, z, args, acc.dtype, 3)
        return
    launch(_accumulate, (indptr.shape[0] - 1) * z.shape[1], indptr, indices, z, s_src, s_dst, src_gid,
           dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, acc)


@cuda.jit(device=True, inline=True)
def _edge_grad(i, j, h, z, s_src, s_dst, edge_hash, slope, p, m, l, grad_out, delta):
    """(grad wrt the pre-activation score, weight p_ij * keep / (1-p)) of edge (i, j), head h."""
    pre = s_dst[i, h] + s_src[j, h]
    prob = math.exp(_leaky(pre, slope) - m[i, h]) / l[i, h]
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
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    ks = _chunked_kernels(grad_out.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        n, H, D = indptr.shape[0] - 1, z.shape[1], z.shape[2]
        rowbuf, rowtt = scratch((n, H * D), grad_out.dtype), scratch((n, H), grad_out.dtype)
        args = (_flat(z), s_src, s_dst, src_gid, dst_gid, _typed(negative_slope, grad_out.dtype),
                float(attn_dropout), int(seed), m, l, _flat(grad_out), rowbuf, rowtt)
        _run(ks[1], indptr, indices, z, args, grad_out.dtype, 2)
        launch(_head_reduce, n * H, indptr, rowbuf, rowtt, delta, grad_s_dst, D)
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
    src_gid, dst_gid = global_ids(src_gid, dst_gid)
    ks = _chunked_kernels(grad_z.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        n, H, D = indptr_t.shape[0] - 1, z.shape[1], z.shape[2]
        rowbuf, rowtt = scratch((n, H * D), grad_z.dtype), scratch((n, H), grad_z.dtype)
        args = (_flat(z), s_src, s_dst, src_gid, dst_gid, _typed(negative_slope, grad_z.dtype),
                float(attn_dropout), int(seed), m, l, _flat(grad_out), delta, _flat(grad_z), rowbuf, rowtt)
        _run(ks[2], indptr_t, indices_t, z, args, grad_z.dtype, 3)
        launch(_head_reduce, n * H, indptr_t, rowbuf, rowtt, scratch((0, 1), grad_z.dtype), grad_s_src, D)
        return
    launch(_backward_src, (indptr_t.shape[0] - 1) * z.shape[1], indptr_t, indices_t, z, s_src, s_dst,
           src_gid, dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta,
           grad_z, grad_s_src)
