"""Dense ("far pair") attention folded into an online-softmax state, fused: no score tile in memory (CPU).

The graph transformers' dense mode attends from every node token ``i < n`` to every node token
``j < n``. The pairs that are entries of the sparse pattern go through the sparse kernels
(:mod:`numba_kernels.cpu.dot_attention`) with their own bias; these kernels add every *other*
pair (the "far" pairs), with a per-head bias ``far[h]``::

    s_ij = scale * q[i,h,:] . k[j,h,:] + far[h]       for j < n, (i, j) not a pattern entry

Forward (:func:`accumulate_far`) folds them into the state ``(m, l, acc)`` of the sparse kernels
(running max, sum, numerator) in place. Backward (:func:`backward_far`), from the final ``m``,
``l`` and ``delta_i = grad_out_i . out_i``::

    p_ij  = exp(s_ij - m_i) / l_i ;  ds_ij = p_ij * (grad_out_i . v_j - delta_i)
    grad_q_i += scale * ds_ij * k_j ;  grad_k_j += scale * ds_ij * q_i ;  grad_v_j += p_ij * grad_out_i
    grad_far[h] += ds_ij

Layouts: ``q`` float[T, H, Dk] and ``grad_out`` float[T, H, Dv] (rows ``>= n`` are not read),
``kT`` float[H, Dk, n] and ``vT`` float[H, Dv, n] (keys and values transposed once by the caller,
so that a block of columns is contiguous), the pattern's node entries of row ``i`` as the sorted
columns ``mcols[mptr[i]:mptr[i+1]]``.

A task is (head, block of :data:`ROWS` query rows) in the forward pass and (head, chunk of rows)
in the backward pass; it walks the columns in blocks of :data:`COLS` (the key and value block stay
in cache across its rows). Every inner loop runs over a block of columns with unit stride so that
LLVM vectorises it; the per-dimension work is unrolled eight dimensions at a time, and four rows
(two in the reductions, eight in the gradient outer products) share each load of a key or value
column block, which a row at a time would need once per multiply-add. Two pieces
need help to vectorise: the block maximum is an integer maximum over order-preserving keys of the
float bits, and in float32 ``exp`` is computed inline (``2^t``: round-to-nearest range reduction,
a degree-7 Taylor polynomial on ``[-ln2/2, ln2/2]``, the exponent written into the bits; ``-inf``
and anything below ``2^-127`` give exactly 0), since this LLVM has no vector ``exp``. float64
calls ``np.exp`` and a plain maximum. Each backward task adds to its own copy of ``grad_kT`` /
``grad_vT`` for its head (the caller sums the copies), so no two threads write the same value.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

from numba_kernels.cpu._attention_common import FASTMATH, plain_array

__all__ = ["ROWS", "COLS", "accumulate_far", "backward_far", "far_chunks"]

#: query rows per forward task, and key columns per block
ROWS = 8
COLS = 256

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@intrinsic
def _float_bits(typingctx, x):
    """The bits of a float32 (float64) as an int32 (int64)."""
    if x == types.float32:
        sig, lt = types.int32(x), ir.IntType(32)
    elif x == types.float64:
        sig, lt = types.int64(x), ir.IntType(64)
    else:
        return None
    return sig, lambda context, builder, signature, args: builder.bitcast(args[0], lt)


@intrinsic
def _bits_float(typingctx, x):
    """The float32 (float64) whose bits are the int32 (int64) ``x``."""
    if x == types.int32:
        sig, lt = types.float32(x), ir.FloatType()
    elif x == types.int64:
        sig, lt = types.float64(x), ir.DoubleType()
    else:
        return None
    return sig, lambda context, builder, signature, args: builder.bitcast(args[0], lt)


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _block_max(row, nb, precise, ninf):
    """max(row[:nb]) (``-inf`` entries allowed)."""
    if precise:
        bm = ninf
        for jj in range(nb):
            v = row[jj]
            bm = v if v > bm else bm
        return bm
    # order-preserving integer keys of the float bits: LLVM vectorises an integer max, not a float one
    best = np.int32(-2147483647)
    for jj in range(nb):
        b = np.int32(_float_bits(row[jj]))
        best = max(best, np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF))))
    best = np.int32(best ^ ((best >> np.int32(31)) & np.int32(0x7FFFFFFF)))
    return _bits_float(best)


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _exp_shifted(row, nb, mi, precise, zero):
    """``row[:nb] = exp(row[:nb] - mi)`` in place (arguments <= 0) and return their sum."""
    tot = zero
    if precise:
        for jj in range(nb):
            p = np.exp(row[jj] - mi)
            row[jj] = p
            tot += p
        return tot
    for jj in range(nb):
        t = (row[jj] - mi) * np.float32(_LOG2E)
        t = max(t, np.float32(-127.0))
        r = np.floor(t + np.float32(0.5))
        f = (t - r) * np.float32(_LN2)
        p = np.float32(1.0 / 5040.0)
        p = p * f + np.float32(1.0 / 720.0)
        p = p * f + np.float32(1.0 / 120.0)
        p = p * f + np.float32(1.0 / 24.0)
        p = p * f + np.float32(1.0 / 6.0)
        p = p * f + np.float32(0.5)
        p = p * f + np.float32(1.0)
        p = p * f + np.float32(1.0)
        p = p * _bits_float(np.int32((np.int32(r) + np.int32(127)) << np.int32(23)))  # r = -127: exactly 0
        row[jj] = p
        tot += p
    return tot


@njit(cache=True, inline="always")
def _eight(A, h, d0, j0, nb):
    """The column block ``j0:j0+nb`` of dimensions ``d0 .. d0+7`` of head ``h`` (eight 1-d views)."""
    return (A[h, d0, j0:j0 + nb], A[h, d0 + 1, j0:j0 + nb], A[h, d0 + 2, j0:j0 + nb], A[h, d0 + 3, j0:j0 + nb],
            A[h, d0 + 4, j0:j0 + nb], A[h, d0 + 5, j0:j0 + nb], A[h, d0 + 6, j0:j0 + nb], A[h, d0 + 7, j0:j0 + nb])


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _products_rows(S, nr, A, h, j0, nb, w, D, init):
    """``S[r, :nb] = init + sum_d w[r, d] * A[h, d, j0:j0+nb]`` for every ``r < nr``: four rows at a time
    share each load of ``A`` (a row at a time is bound by the loads: one per multiply-add)."""
    r0 = 0
    while r0 + 4 <= nr:
        s0 = S[r0, 0:nb]
        s1 = S[r0 + 1, 0:nb]
        s2 = S[r0 + 2, 0:nb]
        s3 = S[r0 + 3, 0:nb]
        for jj in range(nb):
            s0[jj] = init
            s1[jj] = init
            s2[jj] = init
            s3[jj] = init
        d0 = 0
        while d0 + 8 <= D:
            a0, a1, a2, a3, a4, a5, a6, a7 = _eight(A, h, d0, j0, nb)
            for jj in range(nb):
                x0 = a0[jj]
                x1 = a1[jj]
                x2 = a2[jj]
                x3 = a3[jj]
                x4 = a4[jj]
                x5 = a5[jj]
                x6 = a6[jj]
                x7 = a7[jj]
                s0[jj] += (w[r0, d0] * x0 + w[r0, d0 + 1] * x1 + w[r0, d0 + 2] * x2 + w[r0, d0 + 3] * x3
                           + w[r0, d0 + 4] * x4 + w[r0, d0 + 5] * x5 + w[r0, d0 + 6] * x6 + w[r0, d0 + 7] * x7)
                s1[jj] += (w[r0 + 1, d0] * x0 + w[r0 + 1, d0 + 1] * x1 + w[r0 + 1, d0 + 2] * x2
                           + w[r0 + 1, d0 + 3] * x3 + w[r0 + 1, d0 + 4] * x4 + w[r0 + 1, d0 + 5] * x5
                           + w[r0 + 1, d0 + 6] * x6 + w[r0 + 1, d0 + 7] * x7)
                s2[jj] += (w[r0 + 2, d0] * x0 + w[r0 + 2, d0 + 1] * x1 + w[r0 + 2, d0 + 2] * x2
                           + w[r0 + 2, d0 + 3] * x3 + w[r0 + 2, d0 + 4] * x4 + w[r0 + 2, d0 + 5] * x5
                           + w[r0 + 2, d0 + 6] * x6 + w[r0 + 2, d0 + 7] * x7)
                s3[jj] += (w[r0 + 3, d0] * x0 + w[r0 + 3, d0 + 1] * x1 + w[r0 + 3, d0 + 2] * x2
                           + w[r0 + 3, d0 + 3] * x3 + w[r0 + 3, d0 + 4] * x4 + w[r0 + 3, d0 + 5] * x5
                           + w[r0 + 3, d0 + 6] * x6 + w[r0 + 3, d0 + 7] * x7)
            d0 += 8
        for d in range(d0, D):
            a = A[h, d, j0:j0 + nb]
            w0, w1, w2, w3 = w[r0, d], w[r0 + 1, d], w[r0 + 2, d], w[r0 + 3, d]
            for jj in range(nb):
                x = a[jj]
                s0[jj] += w0 * x
                s1[jj] += w1 * x
                s2[jj] += w2 * x
                s3[jj] += w3 * x
        r0 += 4
    for r in range(r0, nr):
        row = S[r, 0:nb]
        for jj in range(nb):
            row[jj] = init
        for d in range(D):  # a plain loop: at most three rows, in a task's last block only
            a = A[h, d, j0:j0 + nb]
            wd = w[r, d]
            for jj in range(nb):
                row[jj] += wd * a[jj]


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _reduce_rows(S, nr, A, h, j0, nb, out, D, z):
    """``out[r, d] += S[r, :nb] . A[h, d, j0:j0+nb]`` for every ``r < nr``, ``d < D``: two rows at a time
    share each load of ``A``."""
    r0 = 0
    while r0 + 2 <= nr:
        p = S[r0, 0:nb]
        q = S[r0 + 1, 0:nb]
        d0 = 0
        while d0 + 8 <= D:
            a0, a1, a2, a3, a4, a5, a6, a7 = _eight(A, h, d0, j0, nb)
            u0 = u1 = u2 = u3 = u4 = u5 = u6 = u7 = z
            t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = z
            for jj in range(nb):
                x = p[jj]
                y = q[jj]
                b0 = a0[jj]
                b1 = a1[jj]
                b2 = a2[jj]
                b3 = a3[jj]
                b4 = a4[jj]
                b5 = a5[jj]
                b6 = a6[jj]
                b7 = a7[jj]
                u0 += x * b0
                u1 += x * b1
                u2 += x * b2
                u3 += x * b3
                u4 += x * b4
                u5 += x * b5
                u6 += x * b6
                u7 += x * b7
                t0 += y * b0
                t1 += y * b1
                t2 += y * b2
                t3 += y * b3
                t4 += y * b4
                t5 += y * b5
                t6 += y * b6
                t7 += y * b7
            out[r0, d0] += u0
            out[r0, d0 + 1] += u1
            out[r0, d0 + 2] += u2
            out[r0, d0 + 3] += u3
            out[r0, d0 + 4] += u4
            out[r0, d0 + 5] += u5
            out[r0, d0 + 6] += u6
            out[r0, d0 + 7] += u7
            out[r0 + 1, d0] += t0
            out[r0 + 1, d0 + 1] += t1
            out[r0 + 1, d0 + 2] += t2
            out[r0 + 1, d0 + 3] += t3
            out[r0 + 1, d0 + 4] += t4
            out[r0 + 1, d0 + 5] += t5
            out[r0 + 1, d0 + 6] += t6
            out[r0 + 1, d0 + 7] += t7
            d0 += 8
        for d in range(d0, D):
            a = A[h, d, j0:j0 + nb]
            u = z
            t = z
            for jj in range(nb):
                u += p[jj] * a[jj]
                t += q[jj] * a[jj]
            out[r0, d] += u
            out[r0 + 1, d] += t
        r0 += 2
    for r in range(r0, nr):  # a plain loop: at most one row, in a task's last block only
        p = S[r, 0:nb]
        for d in range(D):
            a = A[h, d, j0:j0 + nb]
            s = z
            for jj in range(nb):
                s += p[jj] * a[jj]
            out[r, d] += s


@njit(cache=True, inline="always", fastmath=FASTMATH)
def _add_outer(P, nr, G, c, h, j0, nb, W, D):
    """``G[c, h, d, j0:j0+nb] += sum_r W[r, d] * P[r, :nb]`` over the block's ``nr`` rows, for every
    ``d < D``: one read-modify-write of ``G`` per eight rows, not one per row."""
    r0 = 0
    while r0 + 8 <= nr:
        p0 = P[r0, 0:nb]
        p1 = P[r0 + 1, 0:nb]
        p2 = P[r0 + 2, 0:nb]
        p3 = P[r0 + 3, 0:nb]
        p4 = P[r0 + 4, 0:nb]
        p5 = P[r0 + 5, 0:nb]
        p6 = P[r0 + 6, 0:nb]
        p7 = P[r0 + 7, 0:nb]
        for d in range(D):
            g = G[c, h, d, j0:j0 + nb]
            w0, w1, w2, w3 = W[r0, d], W[r0 + 1, d], W[r0 + 2, d], W[r0 + 3, d]
            w4, w5, w6, w7 = W[r0 + 4, d], W[r0 + 5, d], W[r0 + 6, d], W[r0 + 7, d]
            for jj in range(nb):
                g[jj] += (w0 * p0[jj] + w1 * p1[jj] + w2 * p2[jj] + w3 * p3[jj]
                          + w4 * p4[jj] + w5 * p5[jj] + w6 * p6[jj] + w7 * p7[jj])
        r0 += 8
    for d in range(D):
        g = G[c, h, d, j0:j0 + nb]
        for r in range(r0, nr):
            wr = W[r, d]
            pr = P[r, 0:nb]
            for jj in range(nb):
                g[jj] += wr * pr[jj]


@njit(cache=True, inline="always")
def _mask_block(row, mcols, start, stop, j0, nb, ninf):
    """Set the pattern's columns in ``[j0, j0+nb)`` to ``-inf``, from position ``start``; return where it
    stopped (the next block's start)."""
    pe = start
    while pe < stop and mcols[pe] < j0 + nb:
        row[mcols[pe] - j0] = ninf
        pe += 1
    return pe


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _accumulate_far(q, kT, vT, far, scale64, mptr, mcols, n, precise, m, l, acc):
    H = kT.shape[0]
    Dk = kT.shape[1]
    Dv = vT.shape[1]
    nrb = (n + ROWS - 1) // ROWS
    for task in prange(H * nrb):
        h = task // nrb
        i0 = (task % nrb) * ROWS
        nr = min(ROWS, n - i0)
        consts = np.zeros(4, dtype=acc.dtype)  # scalars in the array dtype: float32 math stays float32
        consts[0] = scale64
        consts[2] = -np.inf
        consts[3] = 1.0
        scale = consts[0]
        zero = consts[1]
        ninf = consts[2]
        one = consts[3]
        S = np.empty((ROWS, COLS), dtype=acc.dtype)  # the block's scores, then exp(score - max), per row
        qs = np.empty((ROWS, Dk), dtype=acc.dtype)
        ptr = np.empty(ROWS, dtype=np.int64)
        mloc = np.empty(ROWS, dtype=acc.dtype)
        lloc = np.empty(ROWS, dtype=acc.dtype)
        alph = np.empty(ROWS, dtype=acc.dtype)
        aloc = np.zeros((ROWS, Dv), dtype=acc.dtype)
        part = np.empty((ROWS, Dv), dtype=acc.dtype)
        for r in range(nr):
            i = i0 + r
            for d in range(Dk):
                qs[r, d] = q[i, h, d] * scale
            ptr[r] = mptr[i]
            mloc[r] = m[i, h]
            lloc[r] = l[i, h]
            for d in range(Dv):
                aloc[r, d] = acc[i, h, d]
        fh = far[h]
        for j0 in range(0, n, COLS):
            nb = min(COLS, n - j0)
            _products_rows(S, nr, kT, h, j0, nb, qs, Dk, fh)
            for r in range(nr):
                row = S[r, 0:nb]
                ptr[r] = _mask_block(row, mcols, ptr[r], mptr[i0 + r + 1], j0, nb, ninf)
                bm = _block_max(row, nb, precise, ninf)
                if bm == ninf:  # every column of the block is a pattern entry: nothing to add
                    for jj in range(nb):
                        row[jj] = zero
                    alph[r] = one
                    continue
                mold = mloc[r]
                mnew = max(mold, bm)
                alpha = np.exp(mold - mnew) if mold > ninf else zero
                tot = _exp_shifted(row, nb, mnew, precise, zero)
                lloc[r] = lloc[r] * alpha + tot
                alph[r] = alpha
                mloc[r] = mnew
            for r in range(nr):
                for d in range(Dv):
                    part[r, d] = zero
            _reduce_rows(S, nr, vT, h, j0, nb, part, Dv, zero)
            for r in range(nr):
                for d in range(Dv):
                    aloc[r, d] = aloc[r, d] * alph[r] + part[r, d]
        for r in range(nr):
            i = i0 + r
            m[i, h] = mloc[r]
            l[i, h] = lloc[r]
            for d in range(Dv):
                acc[i, h, d] = aloc[r, d]


def _c_inputs(q, kT, vT, far, mptr, mcols):
    """The read-only inputs as :func:`plain_array` s, the pattern's arrays int64: one compiled signature per float
    dtype (an ``F``-ordered ``delta`` from NumPy once made a second one)."""
    return (plain_array(q), plain_array(kT), plain_array(vT), plain_array(far), plain_array(mptr, np.int64),
            plain_array(mcols, np.int64))


def accumulate_far(q, kT, vT, far, scale: float, mptr, mcols, n: int, m, l, acc) -> None:
    """Fold the far pairs of the first ``n`` tokens into the state ``(m, l, acc)`` in place.

    Args:
        q: float[T, H, Dk]; kT: float[H, Dk, n]; vT: float[H, Dv, n] (C-contiguous).
        far: float[H] the far pairs' bias; scale: score multiplier.
        mptr: int64[n+1], mcols: int64[*]: row ``i``'s pattern entries among node columns, sorted.
        m, l: float[T, H]; acc: float[T, H, Dv]: the online-softmax state (not finalised).
    """
    if n == 0:
        return
    precise = q.dtype != np.float32
    q, kT, vT, far, mptr, mcols = _c_inputs(q, kT, vT, far, mptr, mcols)
    _accumulate_far(q, kT, vT, far, float(scale), mptr, mcols, int(n), precise, m, l, acc)


def far_chunks(n: int, heads: int) -> int:
    """Row chunks per head in :func:`backward_far` (each adds to its own gradient copy): enough
    (head, chunk) tasks for every thread."""
    threads = numba.get_num_threads()
    return max(1, min(-(-threads // max(heads, 1)), -(-n // ROWS)))


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def _backward_far(q, kT, vT, far, scale64, mptr, mcols, n, precise, chunks, m, l, grad_out, delta,
                  grad_q, grad_kT, grad_vT, grad_far):
    H = kT.shape[0]
    Dk = kT.shape[1]
    Dv = vT.shape[1]
    per = (n + chunks - 1) // chunks
    for task in prange(H * chunks):
        h = task % H
        c = task // H
        lo = min(n, c * per)
        hi = min(n, lo + per)
        consts = np.zeros(4, dtype=grad_q.dtype)  # scalars in the array dtype
        consts[0] = scale64
        consts[2] = 1.0
        consts[3] = -np.inf
        scale = consts[0]
        zero = consts[1]
        one = consts[2]
        ninf = consts[3]
        P = np.empty((ROWS, COLS), dtype=grad_q.dtype)  # p of the block's rows
        DS = np.empty((ROWS, COLS), dtype=grad_q.dtype)  # d loss / d score of the block's rows
        qs = np.empty((ROWS, Dk), dtype=grad_q.dtype)
        go = np.empty((ROWS, Dv), dtype=grad_q.dtype)
        gq = np.empty((ROWS, Dk), dtype=grad_q.dtype)
        ptr = np.empty(ROWS, dtype=np.int64)
        fh = far[h]
        gfar = zero
        for i0 in range(lo, hi, ROWS):
            nr = min(ROWS, hi - i0)
            for r in range(nr):
                for d in range(Dk):
                    qs[r, d] = q[i0 + r, h, d] * scale
                    gq[r, d] = zero
                for d in range(Dv):
                    go[r, d] = grad_out[i0 + r, h, d]
                ptr[r] = mptr[i0 + r]
            for j0 in range(0, n, COLS):
                nb = min(COLS, n - j0)
                _products_rows(P, nr, kT, h, j0, nb, qs, Dk, fh)  # scores
                _products_rows(DS, nr, vT, h, j0, nb, go, Dv, zero)  # grad_out_i . v_j
                for r in range(nr):
                    i = i0 + r
                    row = P[r, 0:nb]
                    ds = DS[r, 0:nb]
                    ptr[r] = _mask_block(row, mcols, ptr[r], mptr[i + 1], j0, nb, ninf)
                    li = l[i, h]
                    if li <= zero:  # no entry at all: nothing flows back
                        for jj in range(nb):
                            row[jj] = zero
                            ds[jj] = zero
                        continue
                    _exp_shifted(row, nb, m[i, h], precise, zero)
                    inv = one / li
                    di = delta[i, h]
                    tot = zero
                    for jj in range(nb):
                        pj = row[jj] * inv
                        row[jj] = pj
                        x = pj * (ds[jj] - di)
                        ds[jj] = x
                        tot += x
                    gfar += tot
                _reduce_rows(DS, nr, kT, h, j0, nb, gq, Dk, zero)
                _add_outer(P, nr, grad_vT, c, h, j0, nb, go, Dv)
                _add_outer(DS, nr, grad_kT, c, h, j0, nb, qs, Dk)
            for r in range(nr):
                for d in range(Dk):
                    grad_q[i0 + r, h, d] += scale * gq[r, d]
        grad_far[c, h] = gfar


def backward_far(q, kT, vT, far, scale: float, mptr, mcols, n: int, m, l, grad_out, delta, grad_q, grad_kT,
                 grad_vT, grad_far) -> None:
    """Add the far pairs' gradients (see the module docstring).

    ``grad_q`` float[T, H, Dk] is accumulated (``+=``); ``grad_kT`` float[C, H, Dk, n] and ``grad_vT``
    float[C, H, Dv, n] (``C`` = :func:`far_chunks`, zero-filled by the caller) get one partial sum per
    row chunk; ``grad_far`` float[C, H] is written. ``m``, ``l``: the final state; ``delta`` float[T, H].
    """
    grad_far[...] = 0
    if n == 0:
        return
    precise = q.dtype != np.float32
    q, kT, vT, far, mptr, mcols = _c_inputs(q, kT, vT, far, mptr, mcols)
    m, l, grad_out, delta = (plain_array(a) for a in (m, l, grad_out, delta))
    _backward_far(q, kT, vT, far, float(scale), mptr, mcols, int(n), precise, grad_kT.shape[0], m, l, grad_out,
                  delta, grad_q, grad_kT, grad_vT, grad_far)
