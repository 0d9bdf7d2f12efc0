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
from numba import cuda, float32, float64

from numba_kernels.cuda._attention_common import (_gid, _keep, _mix, finalize, init_state, launch, local_ids,
                                                  output_delta)
from numba_kernels.cuda._chunks import chunk_rows, num_chunks
from numba_kernels.cuda._launch import scratch, stream

__all__ = ["init_state", "accumulate", "finalize", "output_delta", "backward_dst", "backward_src", "MAX_SLOTS"]

#: feature slots per lane of the chunked kernels (F = H * D <= 32 * MAX_SLOTS)
MAX_SLOTS = 8
#: CSR positions per chunk (one warp's share of the edges, see numba_kernels.cuda._chunks)
EDGES_PER_CHUNK = 256
_THREADS = 128
_MAX_BLOCKS = 65535 * 4


def _build_chunked(nbtype, C: int):
    """The chunked forward / row-backward / column-backward kernels for ``C`` feature slots per lane.

    A warp takes a chunk of CSR positions; lane ``t`` owns features ``t, t + 32, ...`` of every row it
    touches and recomputes the scores of its heads. Arrays: ``z``/``acc``/``grad_out``/``grad_z`` as
    flat ``[rows, F]`` views, scores and states ``[rows, H]``, ``D`` the features per head.
    """
    zero = nbtype(0)
    ninf = nbtype(-np.inf)

    @cuda.jit(device=True, inline=True)
    def slot_heads(lane, F, D, heads):
        for c in range(C):
            f = lane + 32 * c
            heads[c] = f // D if f < F else -1

    @cuda.jit(device=True, inline=True)
    def leaky(a, slope):
        return a if a >= 0 else a * slope

    # ---------------------------------------------------------------- forward
    @cuda.jit(device=True, inline=True)
    def fwd_segment(i, k0, k1, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, heads, lane, mx, sl, ac):
        """Softmax state of row ``i`` over positions ``[k0, k1)`` alone: max, sum of weights, weighted rows."""
        for c in range(C):
            mx[c] = ninf
            sl[c] = zero
            ac[c] = zero
        for e in range(k0, k1):
            j = indices[e]
            for c in range(C):
                h = heads[c]
                if h >= 0:
                    a = leaky(s_dst[i, h] + s_src[j, h], slope)
                    if a > mx[c]:
                        mx[c] = a
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
        for e in range(k0, k1):
            j = indices[e]
            edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                h = heads[c]
                if h >= 0:
                    w = math.exp(leaky(s_dst[i, h] + s_src[j, h], slope) - mx[c])
                    sl[c] += w
                    if use_drop:
                        if not _keep(edge_hash, h, p):
                            continue
                        w = w * inv_keep
                    ac[c] += w * z[j, lane + 32 * c]

    @cuda.jit(device=True, inline=True)
    def merge(c, mx, sl, ac, m2, l2, a2):
        """Fold the state ``(m2, l2, a2)`` into slot ``c`` of ``(mx, sl, ac)`` (online softmax)."""
        top = mx[c] if mx[c] > m2 else m2
        if top == ninf:
            return
        r1 = math.exp(mx[c] - top) if mx[c] > ninf else 0.0
        r2 = math.exp(m2 - top) if m2 > ninf else 0.0
        sl[c] = sl[c] * r1 + l2 * r2
        ac[c] = ac[c] * r1 + a2 * r2
        mx[c] = top

    @cuda.jit(device=True, inline=True)
    def fwd_store(i, heads, lane, D, mx, sl, ac, m0, l0, m, l, acc):
        """Merge a whole row's new state with its old one (``m0``/``l0``: a snapshot nobody writes) and store it."""
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                merge(c, mx, sl, ac, m0[i, h], l0[i, h], acc[i, f])
                acc[i, f] = ac[c]
                if f % D == 0:
                    m[i, h] = mx[c]
                    l[i, h] = sl[c]

    @cuda.jit(device=True, inline=True)
    def put3(ch, heads, lane, a, b, d, pa, pb, pd):
        for c in range(C):
            if heads[c] >= 0:
                pa[ch, lane + 32 * c] = a[c]
                pb[ch, lane + 32 * c] = b[c]
                pd[ch, lane + 32 * c] = d[c]

    @cuda.jit
    def fwd_chunks(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m0, l0, m, l, acc, D, T,
                   pm_f, pl_f, pa_f, pm_l, pl_l, pa_l, ext):
        n = indptr.shape[0] - 1
        F = acc.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        mx = cuda.local.array(C, nbtype)
        sl = cuda.local.array(C, nbtype)
        ac = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            lo, hi, r0, r1, lead = chunk_rows(ch, T, indptr, n, indices.shape[0], nchunks)
            if lead > lo:
                fwd_segment(r0 - 1, lo, lead, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, heads,
                            lane, mx, sl, ac)
                put3(ch, heads, lane, mx, sl, ac, pm_f, pl_f, pa_f)
            last = -1
            for r in range(r0, r1):
                start = indptr[r]
                end = indptr[r + 1]
                if start == end:
                    continue  # no edges: the state stays as it is
                fwd_segment(r, start, min(end, hi), indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed,
                            heads, lane, mx, sl, ac)
                if end <= hi:
                    fwd_store(r, heads, lane, D, mx, sl, ac, m0, l0, m, l, acc)
                else:
                    last = r
                    put3(ch, heads, lane, mx, sl, ac, pm_l, pl_l, pa_l)
            if lane == 0:
                ext[ch] = last

    @cuda.jit
    def fwd_fixup(indptr, m0, l0, m, l, acc, D, T, pm_f, pl_f, pa_f, pm_l, pl_l, pa_l, ext):
        F = acc.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        mx = cuda.local.array(C, nbtype)
        sl = cuda.local.array(C, nbtype)
        ac = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            i = ext[ch]
            if i < 0:
                continue
            end = indptr[i + 1]
            for c in range(C):
                if heads[c] >= 0:
                    f = lane + 32 * c
                    mx[c] = pm_l[ch, f]
                    sl[c] = pl_l[ch, f]
                    ac[c] = pa_l[ch, f]
            c2 = ch + 1
            while c2 * T < end:
                for c in range(C):
                    if heads[c] >= 0:
                        f = lane + 32 * c
                        merge(c, mx, sl, ac, pm_f[c2, f], pl_f[c2, f], pa_f[c2, f])
                c2 += 1
            fwd_store(i, heads, lane, D, mx, sl, ac, m0, l0, m, l, acc)

    # ---------------------------------------------------------------- backward, rows (destinations)
    @cuda.jit(device=True, inline=True)
    def dst_segment(i, k0, k1, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, heads, lane, bz, tt):
        """Add row ``i``'s positions ``[k0, k1)``: ``bz += p kept s z_j`` (per feature), ``tt += p s`` (per head)."""
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        dst_hash = _mix(_mix(np.uint64(0), seed), _gid(dst_gid, i)) if use_drop else np.uint64(0)
        for e in range(k0, k1):
            j = indices[e]
            edge_hash = _mix(dst_hash, _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                h = heads[c]
                if h >= 0:
                    pre = s_dst[i, h] + s_src[j, h]
                    prob = math.exp(leaky(pre, slope) - m[i, h]) / l[i, h]
                    slf = 1.0 if pre >= 0 else slope
                    tt[c] += prob * slf
                    kept = inv_keep
                    if use_drop and not _keep(edge_hash, h, p):
                        kept = 0.0
                    bz[c] += prob * kept * slf * z[j, lane + 32 * c]

    @cuda.jit(device=True, inline=True)
    def put2(ch, heads, lane, a, b, pa, pb):
        for c in range(C):
            if heads[c] >= 0:
                pa[ch, lane + 32 * c] = a[c]
                pb[ch, lane + 32 * c] = b[c]

    @cuda.jit(device=True, inline=True)
    def dst_store(i, heads, lane, D, bz, tt, grad_out, rowbuf, rowtt):
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                rowbuf[i, f] = grad_out[i, f] * bz[c]
                if f % D == 0:
                    rowtt[i, h] = tt[c]

    @cuda.jit
    def dst_chunks(indptr, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, D, T,
                   rowbuf, rowtt, pb_f, pt_f, pb_l, pt_l, ext):
        n = indptr.shape[0] - 1
        F = grad_out.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        bz = cuda.local.array(C, nbtype)
        tt = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            lo, hi, r0, r1, lead = chunk_rows(ch, T, indptr, n, indices.shape[0], nchunks)
            if lead > lo:
                for c in range(C):
                    bz[c] = zero
                    tt[c] = zero
                dst_segment(r0 - 1, lo, lead, indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l,
                            heads, lane, bz, tt)
                put2(ch, heads, lane, bz, tt, pb_f, pt_f)
            last = -1
            for r in range(r0, r1):
                start = indptr[r]
                end = indptr[r + 1]
                if start == end:
                    continue
                for c in range(C):
                    bz[c] = zero
                    tt[c] = zero
                dst_segment(r, start, min(end, hi), indices, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m,
                            l, heads, lane, bz, tt)
                if end <= hi:
                    dst_store(r, heads, lane, D, bz, tt, grad_out, rowbuf, rowtt)
                else:
                    last = r
                    put2(ch, heads, lane, bz, tt, pb_l, pt_l)
            if lane == 0:
                ext[ch] = last

    @cuda.jit
    def dst_fixup(indptr, grad_out, D, T, rowbuf, rowtt, pb_f, pt_f, pb_l, pt_l, ext):
        F = grad_out.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        bz = cuda.local.array(C, nbtype)
        tt = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            i = ext[ch]
            if i < 0:
                continue
            end = indptr[i + 1]
            for c in range(C):
                if heads[c] >= 0:
                    bz[c] = pb_l[ch, lane + 32 * c]
                    tt[c] = pt_l[ch, lane + 32 * c]
            c2 = ch + 1
            while c2 * T < end:
                for c in range(C):
                    if heads[c] >= 0:
                        bz[c] += pb_f[c2, lane + 32 * c]
                        tt[c] += pt_f[c2, lane + 32 * c]
                c2 += 1
            dst_store(i, heads, lane, D, bz, tt, grad_out, rowbuf, rowtt)

    # ---------------------------------------------------------------- backward, columns (sources)
    @cuda.jit(device=True, inline=True)
    def src_segment(j, k0, k1, indices_t, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, delta,
                    heads, lane, gz, ag, tt):
        """Add source ``j``'s transposed positions ``[k0, k1)``: ``gz += p kept go_i``, ``ag += p kept s go_i``
        (per feature), ``tt += p s delta_i`` (per head)."""
        use_drop = p > 0.0
        inv_keep = 1.0 / (1.0 - p) if use_drop else 1.0
        seed_hash = _mix(np.uint64(0), seed)
        for e in range(k0, k1):
            i = indices_t[e]
            edge_hash = _mix(_mix(seed_hash, _gid(dst_gid, i)), _gid(src_gid, j)) if use_drop else np.uint64(0)
            for c in range(C):
                h = heads[c]
                if h >= 0:
                    pre = s_dst[i, h] + s_src[j, h]
                    prob = math.exp(leaky(pre, slope) - m[i, h]) / l[i, h]
                    slf = 1.0 if pre >= 0 else slope
                    tt[c] += prob * slf * delta[i, h]
                    kept = inv_keep
                    if use_drop and not _keep(edge_hash, h, p):
                        kept = 0.0
                    g = grad_out[i, lane + 32 * c]
                    gz[c] += prob * kept * g
                    ag[c] += prob * kept * slf * g

    @cuda.jit(device=True, inline=True)
    def src_store(j, heads, lane, D, gz, ag, tt, z, grad_z, rowbuf, rowtt):
        for c in range(C):
            h = heads[c]
            if h >= 0:
                f = lane + 32 * c
                grad_z[j, f] += gz[c]
                rowbuf[j, f] = z[j, f] * ag[c]
                if f % D == 0:
                    rowtt[j, h] = tt[c]

    @cuda.jit
    def src_chunks(indptr_t, indices_t, z, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l, grad_out, delta,
                   grad_z, D, T, rowbuf, rowtt, pz_f, pa_f, pt_f, pz_l, pa_l, pt_l, ext):
        n = indptr_t.shape[0] - 1
        F = z.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        gz = cuda.local.array(C, nbtype)
        ag = cuda.local.array(C, nbtype)
        tt = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            lo, hi, r0, r1, lead = chunk_rows(ch, T, indptr_t, n, indices_t.shape[0], nchunks)
            if lead > lo:
                for c in range(C):
                    gz[c] = zero
                    ag[c] = zero
                    tt[c] = zero
                src_segment(r0 - 1, lo, lead, indices_t, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m, l,
                            grad_out, delta, heads, lane, gz, ag, tt)
                put3(ch, heads, lane, gz, ag, tt, pz_f, pa_f, pt_f)
            last = -1
            for r in range(r0, r1):
                start = indptr_t[r]
                end = indptr_t[r + 1]
                if start == end:
                    continue
                for c in range(C):
                    gz[c] = zero
                    ag[c] = zero
                    tt[c] = zero
                src_segment(r, start, min(end, hi), indices_t, s_src, s_dst, src_gid, dst_gid, slope, p, seed, m,
                            l, grad_out, delta, heads, lane, gz, ag, tt)
                if end <= hi:
                    src_store(r, heads, lane, D, gz, ag, tt, z, grad_z, rowbuf, rowtt)
                else:
                    last = r
                    put3(ch, heads, lane, gz, ag, tt, pz_l, pa_l, pt_l)
            if lane == 0:
                ext[ch] = last

    @cuda.jit
    def src_fixup(indptr_t, z, grad_z, D, T, rowbuf, rowtt, pz_f, pa_f, pt_f, pz_l, pa_l, pt_l, ext):
        F = z.shape[1]
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % 32
        heads = cuda.local.array(C, np.int64)
        gz = cuda.local.array(C, nbtype)
        ag = cuda.local.array(C, nbtype)
        tt = cuda.local.array(C, nbtype)
        slot_heads(lane, F, D, heads)
        for ch in range(tid // 32, nchunks, cuda.gridDim.x * cuda.blockDim.x // 32):
            j = ext[ch]
            if j < 0:
                continue
            end = indptr_t[j + 1]
            for c in range(C):
                if heads[c] >= 0:
                    f = lane + 32 * c
                    gz[c] = pz_l[ch, f]
                    ag[c] = pa_l[ch, f]
                    tt[c] = pt_l[ch, f]
            c2 = ch + 1
            while c2 * T < end:
                for c in range(C):
                    if heads[c] >= 0:
                        f = lane + 32 * c
                        gz[c] += pz_f[c2, f]
                        ag[c] += pa_f[c2, f]
                        tt[c] += pt_f[c2, f]
                c2 += 1
            src_store(j, heads, lane, D, gz, ag, tt, z, grad_z, rowbuf, rowtt)

    return fwd_chunks, fwd_fixup, dst_chunks, dst_fixup, src_chunks, src_fixup


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


_CHUNKED: dict = {}


def _chunked_kernels(dtype, features: int):
    """The chunked kernels for rows of ``features`` values, or None when wider than ``32 * MAX_SLOTS``."""
    C = (features + 31) // 32
    if C > MAX_SLOTS or features == 0:
        return None
    key = (np.dtype(dtype).name, C)
    if key not in _CHUNKED:
        if key[0] not in ("float32", "float64"):
            raise ValueError(f"gat_attention CUDA kernels support float32/float64, got {key[0]}")
        _CHUNKED[key] = _build_chunked(float32 if key[0] == "float32" else float64, C)
    return _CHUNKED[key]


def _flat(a):
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2])


def _grid(nchunks: int) -> int:
    """Blocks of ``_THREADS`` threads for one warp per chunk (grid-stride beyond ``_MAX_BLOCKS``)."""
    return max(1, min((nchunks * 32 + _THREADS - 1) // _THREADS, _MAX_BLOCKS))


def _parts(k: int, nchunks: int, features: int, dtype):
    return [scratch((nchunks, features), dtype) for _ in range(k)]


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
    ks = _chunked_kernels(acc.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        T, F = EDGES_PER_CHUNK, z.shape[1] * z.shape[2]
        nchunks = num_chunks(indices.shape[0], T)
        m0, l0 = scratch(m.shape, m.dtype), scratch(l.shape, l.dtype)  # the old state, read while m, l change
        m0.copy_to_device(m, stream=stream())
        l0.copy_to_device(l, stream=stream())
        parts = _parts(6, nchunks, F, acc.dtype)
        ext = scratch((nchunks,), np.int64)
        args = (float(negative_slope), float(attn_dropout), int(seed))
        ks[0][_grid(nchunks), _THREADS, stream()](indptr, indices, _flat(z), s_src, s_dst, src_gid, dst_gid, *args,
                                                  m0, l0, m, l, _flat(acc), z.shape[2], T, *parts, ext)
        ks[1][_grid(nchunks), _THREADS, stream()](indptr, m0, l0, m, l, _flat(acc), z.shape[2], T, *parts, ext)
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
    ks = _chunked_kernels(grad_out.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        T, F, D = EDGES_PER_CHUNK, z.shape[1] * z.shape[2], z.shape[2]
        nchunks = num_chunks(indices.shape[0], T)
        n = indptr.shape[0] - 1
        rowbuf, rowtt = scratch((n, F), grad_out.dtype), scratch((n, z.shape[1]), grad_out.dtype)
        parts = _parts(4, nchunks, F, grad_out.dtype)
        ext = scratch((nchunks,), np.int64)
        args = (float(negative_slope), float(attn_dropout), int(seed))
        ks[2][_grid(nchunks), _THREADS, stream()](indptr, indices, _flat(z), s_src, s_dst, src_gid, dst_gid, *args,
                                                  m, l, _flat(grad_out), D, T, rowbuf, rowtt, *parts, ext)
        ks[3][_grid(nchunks), _THREADS, stream()](indptr, _flat(grad_out), D, T, rowbuf, rowtt, *parts, ext)
        launch(_head_reduce, n * z.shape[1], indptr, rowbuf, rowtt, delta, grad_s_dst, D)
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
    ks = _chunked_kernels(grad_z.dtype, z.shape[1] * z.shape[2])
    if ks is not None:
        T, F, D = EDGES_PER_CHUNK, z.shape[1] * z.shape[2], z.shape[2]
        nchunks = num_chunks(indices_t.shape[0], T)
        n = indptr_t.shape[0] - 1
        rowbuf, rowtt = scratch((n, F), grad_z.dtype), scratch((n, z.shape[1]), grad_z.dtype)
        parts = _parts(6, nchunks, F, grad_z.dtype)
        ext = scratch((nchunks,), np.int64)
        args = (float(negative_slope), float(attn_dropout), int(seed))
        ks[4][_grid(nchunks), _THREADS, stream()](indptr_t, indices_t, _flat(z), s_src, s_dst, src_gid, dst_gid,
                                                  *args, m, l, _flat(grad_out), delta, _flat(grad_z), D, T, rowbuf,
                                                  rowtt, *parts, ext)
        ks[5][_grid(nchunks), _THREADS, stream()](indptr_t, _flat(z), _flat(grad_z), D, T, rowbuf, rowtt, *parts,
                                                  ext)
        launch(_head_reduce, n * z.shape[1], indptr_t, rowbuf, rowtt, scratch((0, 1), grad_z.dtype),
               grad_s_src, D)
        return
    launch(_backward_src, (indptr_t.shape[0] - 1) * z.shape[1], indptr_t, indices_t, z, s_src, s_dst,
           src_gid, dst_gid, float(negative_slope), float(attn_dropout), int(seed), m, l, grad_out, delta,
           grad_z, grad_s_src)
