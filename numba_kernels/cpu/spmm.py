"""SpMM over a destination-major CSR (CPU twin): sum / mean / max aggregation.

Shapes (``Nd`` destination rows, ``Ns`` source rows, ``E`` edges, ``H`` heads,
``D`` features per head; a plain ``[N, F]`` feature matrix is passed as
``[N, 1, F]``):

* ``indptr`` int64[Nd+1], ``indices`` int64[E]: row ``i`` gathers the source
  rows ``indices[indptr[i]:indptr[i+1]]``.
* ``eids`` int64[E] or int64[0]: edge id of CSR position ``k`` (used to index
  ``weight`` and reported in ``argmax``); empty means the identity. A transposed
  (CSC) copy passes its permutation here, so per-edge values stay in the
  original edge order.
* ``weight`` float[E, H] or float[E, 1] (one weight for all heads), or a
  0-row array for an unweighted graph; indexed by edge id.
* ``col_scale`` float[Ns] or float[0]: multiplies every gathered source row
  (the backward pass of ``mean`` uses ``1 / in_degree``).
* ``x`` float[Ns, H, D] input rows, ``out`` float[Nd, H, D] written in full.

All float arrays share one dtype (float32 or float64) and are C-contiguous;
indices are trusted (the ops layer validates them). Kernels are row-parallel
over chunks of equal work (:mod:`numba_kernels.cpu._partition`), write each
output row once and use no atomics; the backward passes run on the transposed
CSR. Threads: ``NUMBA_NUM_THREADS`` (or ``numba.set_num_threads``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from numba_kernels.cpu._partition import default_chunks
from numba_kernels.cpu._prefetch import PREFETCH_DISTANCE, prefetch_row, row_lines

_JIT = dict(parallel=True, fastmath=False, cache=True, nogil=True)


def spmm_sum(indptr, indices, eids, weight, col_scale, x, out, mean: bool, epilogue=None) -> None:
    """``out[i] = sum_k w[e_k] * col_scale[j_k] * x[j_k]`` over row ``i``'s edges (``/ deg(i)`` if ``mean``).

    Rows without edges get 0. ``mean`` divides by the number of edges (not
    by the sum of the weights). ``epilogue`` (see :func:`epilogue_arrays`) finishes each
    row in the same pass: ``out[i] = row_scale[i] * agg[i] + self_scale[i] * self_x[i] + bias``.
    """
    rs, sx, ss, b = epilogue_arrays(epilogue, out)
    heads, x2, out2, sx2 = _flat(weight, x, out, sx)
    _spmm_sum(default_chunks(indptr), indptr, indices, eids, weight, col_scale, x2, out2, heads, bool(mean),
              rs, sx2, ss, b)


def _flat(weight, x, out, sx):
    """``(heads, x, out, self_x)`` as 2-D row-major views ``[rows, H * D]`` for the sum kernels.

    The kernels walk a row as one flat run of ``H * D`` values (LLVM vectorises it better than a
    ``[H, D]`` nest: 4-8 % less time on R-MAT scale 20, F = 128); ``heads`` is ``H`` when
    the weights differ per head and 1 otherwise (nothing in the row then depends on the head).
    """
    if not out.flags.c_contiguous:
        raise ValueError("spmm_sum: out must be C-contiguous (it is written through a flat view)")
    heads = out.shape[1] if (weight.shape[0] > 0 and weight.shape[1] > 1) else 1
    width = int(np.prod(out.shape[1:]))
    return (heads, x.reshape(x.shape[0], width), out.reshape(out.shape[0], width), sx.reshape(sx.shape[0], width))


def epilogue_arrays(epilogue, out):
    """``(row_scale, self_x, self_scale, bias)`` for the kernels, absent ones as 0-length arrays.

    ``epilogue`` is None or a tuple of four arrays or Nones (dtype of ``out``):
    ``row_scale`` float[Nd] multiplies the aggregate of row ``i``; ``self_x`` float[Ns', H, D]
    is added to rows ``i < Ns'`` (a self loop when it is the source array itself),
    times ``self_scale`` float[Ns'] if given; ``bias`` float[H * D] is added to every row.
    """
    rs = sx = ss = b = None
    if epilogue is not None:
        rs, sx, ss, b = epilogue
    dt = out.dtype
    return (np.empty(0, dt) if rs is None else rs,
            np.empty((0,) + tuple(out.shape[1:]), dt) if sx is None else sx,
            np.empty(0, dt) if ss is None else ss,
            np.empty(0, dt) if b is None else b)


def spmm_max(indptr, indices, eids, weight, x, out, argmax) -> None:
    """``out[i,h,d] = max_k w[e_k,h] * x[j_k,h,d]``; ``argmax`` int64[Nd,H,D] gets the winning edge id.

    Rows without edges get ``out = 0`` and ``argmax = -1``; ties go to the
    first edge in row order.
    """
    _spmm_max(default_chunks(indptr), indptr, indices, eids, weight, x, out, argmax)


def spmm_max_backward(indptr_t, indices_t, perm, weight, argmax, grad_out, grad_x) -> None:
    """Gradient of :func:`spmm_max` w.r.t. ``x``, walking the transposed CSR (no atomics).

    Args:
        indptr_t: int64[Ns+1]; indices_t: int64[E] destination row of each
            source-major edge; perm: int64[E] its edge id.
        weight: as in :func:`spmm_max` (indexed by edge id).
        argmax: int64[Nd,H,D] from the forward pass; grad_out: float[Nd,H,D].
        grad_x: float[Ns,H,D], written in full:
            ``grad_x[j,h,d] = sum over edges e=(j->i) with argmax[i,h,d]==e of w[e,h] * grad_out[i,h,d]``.
    """
    _spmm_max_backward(default_chunks(indptr_t), indptr_t, indices_t, perm, weight, argmax,
                       grad_out, grad_x)


def spmm_max_weight_grad(indptr, indices, argmax, x, grad_out, grad_w) -> None:
    """Gradient of :func:`spmm_max` (run without ``eids``) w.r.t. the edge weights.

    ``grad_w`` float[E, H] (or float[E, 1] for weights shared by all heads) is
    written in full: ``grad_w[e,h] = sum_d [argmax[i,h,d]==e] * grad_out[i,h,d] * x[src(e),h,d]``.
    """
    _spmm_max_weight_grad(default_chunks(indptr), indptr, indices, argmax, x, grad_out, grad_w)


@njit(nogil=True, inline="always")
def _finish_row(out, i, acc, inv, rs, sx, ss, bias, accumulate):
    """``out[i] = ((out[i] if accumulate) + acc * inv) * rs[i] + ss[i] * sx[i] + bias`` (absent terms skipped;
    ``out`` / ``sx`` ``[rows, F]``, ``acc`` and ``bias`` ``[F]``)."""
    F = out.shape[1]
    one = inv * 0 + 1
    r = rs[i] if rs.shape[0] > 0 else one
    has_self = i < sx.shape[0]
    sf = ss[i] if (has_self and ss.shape[0] > 0) else one
    has_b = bias.shape[0] > 0
    for f in range(F):
        v = acc[f] * inv
        if accumulate:
            v += out[i, f]
        v *= r
        if has_self:
            v += sf * sx[i, f]
        if has_b:
            v += bias[f]
        out[i, f] = v


@njit(nogil=True, inline="always")
def _gather_row(acc, x, j, e, s, weight, heads, has_w, w_heads):
    """``acc += s * w[e, h] * x[j]`` over one flat row (``w`` skipped when ``has_w`` is false, ``s`` when 1)."""
    F = acc.shape[0]
    if has_w:
        D = F // heads
        for h in range(heads):
            cf = s * weight[e, h if w_heads else 0]
            # unsigned positions: no negative-index wraparound test per element, so LLVM vectorises the loop
            # (weighted SpMM at R-MAT 20, F = 128: 0.92 -> 0.41 s per head, 1.0 -> 0.36 s shared)
            o = np.uint64(h * D)
            for f in range(np.uint64(D)):
                acc[o + f] += cf * x[j, o + f]
    elif s != 1:
        for f in range(F):
            acc[f] += s * x[j, f]
    else:
        for f in range(F):
            acc[f] += x[j, f]


@njit(**_JIT)
def _spmm_sum(bounds, indptr, indices, eids, weight, col_scale, x, out, heads, mean, rs, sx, ss, bias):
    # x [Ns, F], out [Nd, F], sx [Ns', F] (see _flat); weight [E, heads] or [E, 1]
    F = out.shape[1]
    has_e = eids.shape[0] > 0
    has_w = weight.shape[0] > 0
    has_s = col_scale.shape[0] > 0
    w_heads = weight.shape[1] > 1
    E = indices.shape[0]
    base = x.ctypes.data
    rb = x.strides[0]
    lines = row_lines(rb)
    plain = rs.shape[0] == 0 and sx.shape[0] == 0 and bias.shape[0] == 0
    for c in prange(bounds.shape[0] - 1):
        acc = np.empty(F, dtype=out.dtype)
        one = np.ones(1, dtype=out.dtype)[0]
        for i in range(bounds[c], bounds[c + 1]):
            acc[:] = 0
            start = indptr[i]
            end = indptr[i + 1]
            for k in range(start, end):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, indices[k + PREFETCH_DISTANCE])
                j = indices[k]
                _gather_row(acc, x, j, eids[k] if has_e else k, col_scale[j] if has_s else one, weight, heads,
                            has_w, w_heads)
            inv = one / (end - start) if (mean and end > start) else one
            if plain:
                for f in range(F):
                    out[i, f] = acc[f] * inv
            else:
                _finish_row(out, i, acc, inv, rs, sx, ss, bias, False)


@njit(fastmath=False, nogil=True, inline="always")
def _max_step(x, j, weight, e, w_heads, has_w, one, rel, best0, arg0, best1, arg1):
    # best1/arg1 <- elementwise max of (best0/arg0, w*x[j]) with position rel on a strict win.
    # Loading both old values unconditionally and writing to a *different*
    # buffer keeps LLVM from emitting masked (microcoded on some CPUs) stores.
    H = best0.shape[0]
    D = best0.shape[1]
    for h in range(H):
        cf = weight[e, h if w_heads else 0] if has_w else one
        for d in range(D):
            v = cf * x[j, h, d]
            b = best0[h, d]
            a = arg0[h, d]
            gt = v > b
            best1[h, d] = v if gt else b
            arg1[h, d] = rel if gt else a


@njit(**_JIT)
def _spmm_max(bounds, indptr, indices, eids, weight, x, out, argmax):
    H = out.shape[1]
    D = out.shape[2]
    has_e = eids.shape[0] > 0
    has_w = weight.shape[0] > 0
    w_heads = weight.shape[1] > 1
    E = indices.shape[0]
    base = x.ctypes.data
    rb = x.strides[0]
    lines = row_lines(rb)
    for c in prange(bounds.shape[0] - 1):
        # two (value, position) buffers used alternately (ping-pong), positions relative to the row start
        b0 = np.empty((H, D), dtype=out.dtype)
        a0 = np.empty((H, D), dtype=np.int32)
        b1 = np.empty((H, D), dtype=out.dtype)
        a1 = np.empty((H, D), dtype=np.int32)
        one = np.ones(1, dtype=out.dtype)[0]
        for i in range(bounds[c], bounds[c + 1]):
            start = indptr[i]
            end = indptr[i + 1]
            if end == start:
                for h in range(H):
                    for d in range(D):
                        out[i, h, d] = 0
                        argmax[i, h, d] = -1
                continue
            j = indices[start]
            e = eids[start] if has_e else start
            for h in range(H):
                cf = weight[e, h if w_heads else 0] if has_w else one
                for d in range(D):
                    b0[h, d] = cf * x[j, h, d]
                    a0[h, d] = 0
            for k in range(start + 1, end):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, indices[k + PREFETCH_DISTANCE])
                _max_step(x, indices[k], weight, eids[k] if has_e else k, w_heads, has_w, one,
                          np.int32(k - start), b0, a0, b1, a1)
                b0, b1 = b1, b0
                a0, a1 = a1, a0
            for h in range(H):
                for d in range(D):
                    out[i, h, d] = b0[h, d]
                    pos = start + a0[h, d]
                    argmax[i, h, d] = eids[pos] if has_e else pos


@njit(**_JIT)
def _spmm_max_backward(bounds, indptr_t, indices_t, perm, weight, argmax, grad_out, grad_x):
    H = grad_x.shape[1]
    D = grad_x.shape[2]
    has_w = weight.shape[0] > 0
    w_heads = weight.shape[1] > 1
    E = indices_t.shape[0]
    g_base = grad_out.ctypes.data
    g_rb = grad_out.strides[0]
    g_lines = row_lines(g_rb)
    a_base = argmax.ctypes.data
    a_rb = argmax.strides[0]
    a_lines = row_lines(a_rb)
    for c in prange(bounds.shape[0] - 1):
        acc = np.empty((H, D), dtype=grad_x.dtype)
        one = np.ones(1, dtype=grad_x.dtype)[0]
        zero = np.zeros(1, dtype=grad_x.dtype)[0]
        for j in range(bounds[c], bounds[c + 1]):
            acc[:, :] = 0
            for k in range(indptr_t[j], indptr_t[j + 1]):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(g_base, g_rb, g_lines, indices_t[k + PREFETCH_DISTANCE])
                    prefetch_row(a_base, a_rb, a_lines, indices_t[k + PREFETCH_DISTANCE])
                i = indices_t[k]
                e = perm[k]
                for h in range(H):
                    cf = weight[e, h if w_heads else 0] if has_w else one
                    for d in range(D):
                        gv = cf * grad_out[i, h, d]
                        acc[h, d] += gv if argmax[i, h, d] == e else zero
            for h in range(H):
                for d in range(D):
                    grad_x[j, h, d] = acc[h, d]


@njit(**_JIT)
def _spmm_max_weight_grad(bounds, indptr, indices, argmax, x, grad_out, grad_w):
    H = grad_out.shape[1]
    D = grad_out.shape[2]
    WH = grad_w.shape[1]
    for c in prange(bounds.shape[0] - 1):
        for i in range(bounds[c], bounds[c + 1]):
            for k in range(indptr[i], indptr[i + 1]):
                for h in range(WH):
                    grad_w[k, h] = 0
            for h in range(H):
                wh = h if WH > 1 else 0
                for d in range(D):
                    e = argmax[i, h, d]
                    if e >= 0:
                        grad_w[e, wh] += grad_out[i, h, d] * x[indices[e], h, d]


# ----------------------------------------------------------------------------- column-blocked SpMM
# CPU only (a cache-blocking scheme; the CUDA twin has no use for it): the source columns are cut into
# ``nb`` ranges small enough that a range's rows of ``x`` stay in the last-level cache while every
# destination row gathers its edges into that range; ranges are processed one after the other, so the
# random row reads hit the cache instead of DRAM. A destination row is read and written once per range
# in which it has edges (rows without edges there are skipped).


def column_blocks(indptr, indices, eids, num_src: int, nb: int, with_eids: bool = True):
    """The CSR re-ordered by source-column range: ``(bptr int64[nb*N+1], bidx int32[E], beid int32|int64[E])``.

    Row ``b * N + i`` holds the edges of destination ``i`` whose source ``j`` has
    ``j * nb // num_src == b`` (order kept within a row); ``beid`` is each edge's id
    (``eids[k]``, or the CSR position ``k`` when ``eids`` is empty), or an empty array
    when ``with_eids`` is false (unweighted aggregation needs no edge ids). Indices are
    stored as int32 when ``num_src`` (resp. the edge count) fits: half the bytes to keep.
    """
    n = indptr.shape[0] - 1
    counts = np.zeros(nb * n + 1, dtype=np.int64)
    _block_count(indptr, indices, num_src, nb, counts)
    bptr = np.empty(nb * n + 1, dtype=np.int64)
    bptr[0] = 0
    np.cumsum(counts[:-1], out=bptr[1:])
    E = indices.shape[0]
    bidx = np.empty(E, dtype=np.int32 if num_src < 2**31 else np.int64)
    beid = np.empty(E if with_eids else 0, dtype=np.int32 if E < 2**31 else np.int64)
    _block_fill(indptr, indices, eids, num_src, nb, bptr, bidx, beid)
    return bptr, bidx, beid


@njit(parallel=True, cache=True, nogil=True)
def _block_count(indptr, indices, num_src, nb, counts):
    n = indptr.shape[0] - 1
    for i in prange(n):
        for k in range(indptr[i], indptr[i + 1]):
            counts[(indices[k] * nb // num_src) * n + i] += 1


@njit(parallel=True, cache=True, nogil=True)
def _block_fill(indptr, indices, eids, num_src, nb, bptr, bidx, beid):
    n = indptr.shape[0] - 1
    has_e = eids.shape[0] > 0
    want_e = beid.shape[0] > 0
    for i in prange(n):
        pos = np.empty(nb, dtype=np.int64)
        for b in range(nb):
            pos[b] = bptr[b * n + i]
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            b = j * nb // num_src
            bidx[pos[b]] = j
            if want_e:
                beid[pos[b]] = eids[k] if has_e else k
            pos[b] += 1


def spmm_sum_blocked(indptr, bptr, bidx, beid, nb, weight, col_scale, x, out, mean: bool, epilogue=None) -> None:
    """:func:`spmm_sum` over the column blocks of :func:`column_blocks` (same result up to summation order).

    Args:
        indptr: int64[Nd+1] of the original CSR (row costs and ``mean`` degrees).
        bptr, bidx, beid: from :func:`column_blocks` with the same ``nb`` (``beid`` needed with ``weight``).
        weight, col_scale, x, out, mean, epilogue: as :func:`spmm_sum` (``weight`` indexed by ``beid``;
            the epilogue runs with the last column range).
    """
    if weight.shape[0] > 0 and beid.shape[0] != bidx.shape[0]:
        raise ValueError("spmm_sum_blocked: weighted aggregation needs the edge ids (column_blocks(with_eids=True))")
    bounds = default_chunks(indptr)
    rs, sx, ss, bias = epilogue_arrays(epilogue, out)
    heads, x2, out2, sx2 = _flat(weight, x, out, sx)
    for b in range(nb):
        _spmm_sum_block(bounds, indptr, bptr, bidx, beid, b, nb, weight, col_scale, x2, out2, heads, bool(mean),
                        rs, sx2, ss, bias)


@njit(**_JIT)
def _spmm_sum_block(bounds, indptr, bptr, bidx, beid, b, nb, weight, col_scale, x, out, heads, mean, rs, sx, ss,
                    bias):
    n = indptr.shape[0] - 1
    F = out.shape[1]
    has_w = weight.shape[0] > 0
    has_s = col_scale.shape[0] > 0
    w_heads = weight.shape[1] > 1
    E = bidx.shape[0]
    base = x.ctypes.data
    rb = x.strides[0]
    lines = row_lines(rb)
    off = b * n
    last_plain = b < nb - 1 or (rs.shape[0] == 0 and sx.shape[0] == 0 and bias.shape[0] == 0)
    for c in prange(bounds.shape[0] - 1):
        acc = np.empty(F, dtype=out.dtype)
        one = np.ones(1, dtype=out.dtype)[0]
        for i in range(bounds[c], bounds[c + 1]):
            start = bptr[off + i]
            end = bptr[off + i + 1]
            if end == start and b > 0 and last_plain:
                continue
            acc[:] = 0
            for k in range(start, end):
                if k + PREFETCH_DISTANCE < E:
                    prefetch_row(base, rb, lines, bidx[k + PREFETCH_DISTANCE])
                j = bidx[k]
                _gather_row(acc, x, j, beid[k] if has_w else k, col_scale[j] if has_s else one, weight, heads,
                            has_w, w_heads)
            deg = indptr[i + 1] - indptr[i]
            inv = one / deg if (mean and deg > 0) else one
            if not last_plain:
                _finish_row(out, i, acc, inv, rs, sx, ss, bias, b > 0)
            elif b == 0:
                for f in range(F):
                    out[i, f] = acc[f] * inv
            else:
                for f in range(F):
                    out[i, f] += acc[f] * inv
