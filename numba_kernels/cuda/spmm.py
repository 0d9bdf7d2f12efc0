"""SpMM over a destination-major CSR (CUDA twin of :mod:`numba_kernels.cpu.spmm`).

Same functions, arguments and semantics as the CPU twin; arrays are numba
device arrays or anything exposing ``__cuda_array_interface__`` (torch CUDA
tensors), outputs preallocated by the caller. Kernels launch on the stream set
by :func:`numba_kernels.cuda._launch.on_stream` (the default stream otherwise).

``spmm_sum`` (also the backward of sum/mean, on the transposed CSR) balances
edges, not rows: the CSR positions are cut into chunks of ``EDGES_PER_CHUNK``
and each chunk goes to a group of ``G`` lanes (``G`` = 8, 16 or 32, the
smallest power of two >= F = H * D, at most a warp); lane ``t`` owns features
``t, t + G, ...`` (``C = ceil(F / G)`` of them, kept in registers), so each
gathered source row is one coalesced group load per slot; two edges a step,
their ``2 C`` loads issued together (no per-slot test in the edge loop: slots
past ``F`` read column 0 and are never stored). A chunk finishes the rows that start and end in it; the
part of a row that crosses chunks is summed per chunk into scratch rows and a
second kernel adds them up in chunk order (deterministic, no atomics), so a
hub row of 100 000 edges costs ~400 groups working side by side instead of
one walking it alone (R-MAT's hubs made a row-per-group kernel 16x slower
than cuSPARSE on an H200). Scratch: two ``[E / EDGES_PER_CHUNK, F]`` arrays
from :func:`~numba_kernels.cuda._launch.scratch`. Rows with
``F > 32 * MAX_SLOTS`` fall back to one thread block per row (its threads
stride over the features; hub rows are serial there). ``spmm_max`` uses the
block-per-row layout; its backward w.r.t. ``x`` walks the transposed CSR (no
atomics); its weight gradient uses ``cuda.atomic.add`` within a row's own edges.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from numba_kernels.cuda._chunks import chunk_kernels, launch_chunks, sum_parts
from numba_kernels.cuda._launch import compiled, device_array, scratch, stream

_THREADS = 128  # threads per block
_MAX_BLOCKS = 65535 * 4
#: feature slots per lane of the edge-balanced kernels (F <= 32 * MAX_SLOTS); wider rows use the block kernel
MAX_SLOTS = 8
#: CSR positions (edges) per chunk of the edge-balanced sum: a lane group's work, whatever the degrees
EDGES_PER_CHUNK = 256


def _launch(n_rows: int, features: int) -> tuple[int, int]:
    threads = min(_THREADS, max(32, (features + 31) // 32 * 32))
    return min(max(n_rows, 1), _MAX_BLOCKS), threads


def _build(nbtype):
    zero = nbtype(0)
    one = nbtype(1)

    @cuda.jit
    def sum_kernel(indptr, indices, eids, weight, col_scale, x, out, mean, rs, sx, ss, bias):
        H = out.shape[1]
        D = out.shape[2]
        has_e = eids.shape[0] > 0
        has_w = weight.shape[0] > 0
        has_s = col_scale.shape[0] > 0
        w_heads = weight.shape[1] > 1
        for i in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            start = indptr[i]
            end = indptr[i + 1]
            for f in range(cuda.threadIdx.x, H * D, cuda.blockDim.x):
                h = f // D
                d = f - h * D
                acc = zero
                for k in range(start, end):
                    j = indices[k]
                    cf = one
                    if has_s:
                        cf = col_scale[j]
                    if has_w:
                        e = eids[k] if has_e else k
                        cf = cf * weight[e, h if w_heads else 0]
                    acc += cf * x[j, h, d]
                if mean and end > start:
                    acc = acc / (end - start)
                if rs.shape[0] > 0:
                    acc = acc * rs[i]
                if i < sx.shape[0]:
                    sv = sx[i, h, d]
                    if ss.shape[0] > 0:
                        sv = sv * ss[i]
                    acc += sv
                if bias.shape[0] > 0:
                    acc += bias[f]
                out[i, h, d] = acc

    @cuda.jit
    def max_kernel(indptr, indices, eids, weight, x, out, argmax):
        H = out.shape[1]
        D = out.shape[2]
        has_e = eids.shape[0] > 0
        has_w = weight.shape[0] > 0
        w_heads = weight.shape[1] > 1
        for i in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            start = indptr[i]
            end = indptr[i + 1]
            for f in range(cuda.threadIdx.x, H * D, cuda.blockDim.x):
                h = f // D
                d = f - h * D
                best = zero
                arg = -1
                for k in range(start, end):
                    e = eids[k] if has_e else k
                    cf = one
                    if has_w:
                        cf = weight[e, h if w_heads else 0]
                    v = cf * x[indices[k], h, d]
                    if arg < 0 or v > best:
                        best = v
                        arg = e
                out[i, h, d] = best
                argmax[i, h, d] = arg

    @cuda.jit
    def max_backward_kernel(indptr_t, indices_t, perm, weight, argmax, grad_out, grad_x):
        H = grad_x.shape[1]
        D = grad_x.shape[2]
        has_w = weight.shape[0] > 0
        w_heads = weight.shape[1] > 1
        for j in range(cuda.blockIdx.x, grad_x.shape[0], cuda.gridDim.x):
            for f in range(cuda.threadIdx.x, H * D, cuda.blockDim.x):
                h = f // D
                d = f - h * D
                acc = zero
                for k in range(indptr_t[j], indptr_t[j + 1]):
                    i = indices_t[k]
                    e = perm[k]
                    if argmax[i, h, d] == e:
                        cf = one
                        if has_w:
                            cf = weight[e, h if w_heads else 0]
                        acc += cf * grad_out[i, h, d]
                grad_x[j, h, d] = acc

    @cuda.jit
    def zero_rows_kernel(grad_w):
        for p in range(cuda.grid(1), grad_w.shape[0] * grad_w.shape[1], cuda.gridsize(1)):
            grad_w[p // grad_w.shape[1], p % grad_w.shape[1]] = zero

    @cuda.jit
    def max_weight_grad_kernel(indptr, indices, argmax, x, grad_out, grad_w):
        H = grad_out.shape[1]
        D = grad_out.shape[2]
        WH = grad_w.shape[1]
        for i in range(cuda.blockIdx.x, grad_out.shape[0], cuda.gridDim.x):
            for f in range(cuda.threadIdx.x, H * D, cuda.blockDim.x):
                h = f // D
                d = f - h * D
                e = argmax[i, h, d]
                if e >= 0:
                    cuda.atomic.add(grad_w, (e, h if WH > 1 else 0), grad_out[i, h, d] * x[indices[e], h, d])

    return sum_kernel, max_kernel, max_backward_kernel, zero_rows_kernel, max_weight_grad_kernel


def _build_chunked(nbtype, G: int, C: int):
    """The edge-balanced sum: ``G`` lanes per chunk, ``C`` slots per lane, one accumulator (the row's sums).

    ``args = (eids, weight, col_scale, x, out, mean, rs, sx, ss, bias)`` with ``x``, ``out``, ``sx`` as flat
    ``[rows, F]`` views.
    """
    one = nbtype(1)

    @cuda.jit(device=True, inline=True)
    def segment(row, k0, k1, indices, args, heads, slots, tmp, lane, acc):
        """``acc[0, c] += sum_k cf_k * x[j_k, lane + G c]`` over positions ``[k0, k1)``, two edges a step.

        The edge loop has no per-slot test: a slot past the row's ``F`` features reads column 0 and sums values
        that ``store``/``put`` never write, so the ``2 C`` gathered loads of a step are issued together
        (a test per slot put each slot's two loads behind a branch: two in flight instead of ``2 C``). Row and
        column indices are unsigned: no negative-index wrap-around per access.
        """
        eids, weight, col_scale, x = args[0], args[1], args[2], args[3]
        has_e = eids.shape[0] > 0
        has_w = weight.shape[0] > 0
        has_s = col_scale.shape[0] > 0
        w_heads = weight.shape[1] > 1
        k = k0
        while k + 1 < k1:  # the two edges' loads are independent: 2 C loads in flight
            j0 = np.uint64(indices[k])
            j1 = np.uint64(indices[k + 1])
            c0 = one
            c1 = one
            if has_s:
                c0 = col_scale[j0]
                c1 = col_scale[j1]
            if has_w:
                e0 = np.uint64(eids[k]) if has_e else np.uint64(k)
                e1 = np.uint64(eids[k + 1]) if has_e else np.uint64(k + 1)
                for c in range(C):
                    f = np.uint64(slots[1, c])
                    h = np.uint64(slots[0, c]) if w_heads else np.uint64(0)
                    acc[0, c] += c0 * weight[e0, h] * x[j0, f] + c1 * weight[e1, h] * x[j1, f]
            else:
                for c in range(C):
                    f = np.uint64(slots[1, c])
                    acc[0, c] += c0 * x[j0, f] + c1 * x[j1, f]
            k += 2
        if k < k1:
            j0 = np.uint64(indices[k])
            c0 = one
            if has_s:
                c0 = col_scale[j0]
            if has_w:
                e0 = np.uint64(eids[k]) if has_e else np.uint64(k)
                for c in range(C):
                    h = np.uint64(slots[0, c]) if w_heads else np.uint64(0)
                    acc[0, c] += c0 * weight[e0, h] * x[j0, np.uint64(slots[1, c])]
            else:
                for c in range(C):
                    acc[0, c] += c0 * x[j0, np.uint64(slots[1, c])]

    @cuda.jit(device=True, inline=True)
    def store(row, deg, D, args, heads, lane, acc):
        """Write ``row`` of the output: mean, row scale, self rows and bias applied to the sums."""
        out, mean, rs, sx, ss, bias = args[4], args[5], args[6], args[7], args[8], args[9]
        for c in range(C):
            if heads[c] >= 0:
                f = lane + G * c
                v = acc[0, c]
                if mean and deg > 0:
                    v = v / nbtype(deg)  # in the row's precision (an int64 divisor made it a float64 division)
                if rs.shape[0] > 0:
                    v = v * rs[row]
                if row < sx.shape[0]:
                    sv = sx[row, f]
                    if ss.shape[0] > 0:
                        sv = sv * ss[row]
                    v += sv
                if bias.shape[0] > 0:
                    v += bias[f]
                out[row, f] = v

    reset, merge = sum_parts(G, C, 1, nbtype)
    return chunk_kernels(nbtype, G, C, 1, reset, segment, store, merge)


def _chunked_kernels(dtype, features: int):
    """``(sum_chunks, sum_fixup, G)`` for rows of ``features`` values, or None when wider than the slots."""
    G = 8
    while G < 32 and G < features:
        G *= 2
    C = (features + G - 1) // G
    if C > MAX_SLOTS:
        return None
    return _chunked(dtype, G, C)


def _flat(a, rows: int):
    """A contiguous ``[rows, H, D]`` device array as ``[rows, H * D]`` (no copy)."""
    return a.reshape(rows, int(np.prod(a.shape[1:])) if len(a.shape) > 1 else 1)


_kernels = compiled("spmm", _build)
_chunked = compiled("spmm", lambda nbtype, G, C: _build_chunked(nbtype, G, C) + (G,))


def spmm_sum(indptr, indices, eids, weight, col_scale, x, out, mean: bool, epilogue=None) -> None:
    """See :func:`numba_kernels.cpu.spmm.spmm_sum` (``epilogue`` arrays on the device)."""
    if out.shape[0] == 0:
        return
    rs, sx, ss, bias = _epilogue_arrays(epilogue, out)
    features = out.shape[1] * out.shape[2]
    chunked = _chunked_kernels(out.dtype, features)
    if chunked is None:
        blocks, threads = _launch(out.shape[0], features)
        _kernels(out.dtype)[0][blocks, threads, stream()](indptr, indices, eids, weight, col_scale, x, out,
                                                          bool(mean), rs, sx, ss, bias)
        return
    kernels, G = chunked[:2], chunked[2]
    args = (eids, weight, col_scale, _flat(x, x.shape[0]), _flat(out, out.shape[0]), bool(mean), rs,
            _flat(sx, sx.shape[0]), ss, bias)
    launch_chunks(kernels, G, _THREADS, _MAX_BLOCKS, stream(), indptr, indices, features, out.shape[2],
                  EDGES_PER_CHUNK, args, out.dtype, scratch, 1)


def _epilogue_arrays(epilogue, out):
    """Device arrays for :func:`spmm_sum`'s epilogue (absent ones 0-length), as the CPU twin's ``epilogue_arrays``."""
    rs = sx = ss = b = None
    if epilogue is not None:
        rs, sx, ss, b = epilogue
    dt = np.dtype(out.dtype)
    return (device_array(0, dt) if rs is None else rs,
            device_array((0,) + tuple(out.shape[1:]), dt) if sx is None else sx,
            device_array(0, dt) if ss is None else ss,
            device_array(0, dt) if b is None else b)


def spmm_max(indptr, indices, eids, weight, x, out, argmax) -> None:
    """See :func:`numba_kernels.cpu.spmm.spmm_max`."""
    if out.shape[0] == 0:
        return
    blocks, threads = _launch(out.shape[0], out.shape[1] * out.shape[2])
    _kernels(out.dtype)[1][blocks, threads, stream()](indptr, indices, eids, weight, x, out, argmax)


def spmm_max_backward(indptr_t, indices_t, perm, weight, argmax, grad_out, grad_x) -> None:
    """See :func:`numba_kernels.cpu.spmm.spmm_max_backward`."""
    if grad_x.shape[0] == 0:
        return
    blocks, threads = _launch(grad_x.shape[0], grad_x.shape[1] * grad_x.shape[2])
    _kernels(grad_x.dtype)[2][blocks, threads, stream()](indptr_t, indices_t, perm, weight, argmax, grad_out, grad_x)


def spmm_max_weight_grad(indptr, indices, argmax, x, grad_out, grad_w) -> None:
    """See :func:`numba_kernels.cpu.spmm.spmm_max_weight_grad`."""
    k = _kernels(grad_w.dtype)
    size = grad_w.shape[0] * grad_w.shape[1]
    if size > 0:
        k[3][min((size + _THREADS - 1) // _THREADS, _MAX_BLOCKS), _THREADS, stream()](grad_w)
    if grad_out.shape[0] == 0:
        return
    blocks, threads = _launch(grad_out.shape[0], grad_out.shape[1] * grad_out.shape[2])
    k[4][blocks, threads, stream()](indptr, indices, argmax, x, grad_out, grad_w)
