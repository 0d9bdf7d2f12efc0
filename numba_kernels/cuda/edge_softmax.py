"""Edge softmax over each destination's in-edges (CUDA twin of :mod:`numba_kernels.cpu.edge_softmax`).

One block of 128 threads per destination row (grid-stride). Thread ``t``
handles head ``t % H`` on every ``(128 // H)``-th edge of the row; per-head
maxima and sums are reduced through shared memory. Requires ``H <= 128``.
Same arguments and semantics as the CPU twin (all ``-inf`` rows give 0).
"""
from __future__ import annotations

import math

from numba import cuda

from numba_kernels.cuda._launch import compiled, stream

_THREADS = 128  # fixed: the shared-memory reduction buffers have this size
_MAX_BLOCKS = 65535 * 4


def _build(nbtype):
    zero = nbtype(0)
    neg_inf = nbtype(-math.inf)

    @cuda.jit(device=True)
    def _reduce(buf, H, lanes, is_max):
        # buf[t] holds thread t's partial for head t % H; leave the result for head h in buf[h]
        cuda.syncthreads()
        t = cuda.threadIdx.x
        if t < H:
            acc = buf[t]
            for r in range(1, lanes):
                v = buf[t + r * H]
                if is_max:
                    acc = v if v > acc else acc
                else:
                    acc += v
            buf[t] = acc
        cuda.syncthreads()

    @cuda.jit
    def forward(indptr, scores, out):
        H = scores.shape[1]
        buf = cuda.shared.array(_THREADS, nbtype)
        t = cuda.threadIdx.x
        lanes = _THREADS // H
        h = t % H
        lane = t // H
        for i in range(cuda.blockIdx.x, indptr.shape[0] - 1, cuda.gridDim.x):
            start = indptr[i]
            end = indptr[i + 1]
            m = neg_inf
            if lane < lanes:
                for k in range(start + lane, end, lanes):
                    v = scores[k, h]
                    m = v if v > m else m
            buf[t] = m
            _reduce(buf, H, lanes, True)
            m = buf[h]
            if m == neg_inf:
                m = zero
            cuda.syncthreads()
            s = zero
            if lane < lanes:
                for k in range(start + lane, end, lanes):
                    ev = math.exp(scores[k, h] - m)
                    out[k, h] = ev
                    s += ev
            buf[t] = s
            _reduce(buf, H, lanes, False)
            s = buf[h]
            if lane < lanes and s > zero:
                for k in range(start + lane, end, lanes):
                    out[k, h] = out[k, h] / s
            cuda.syncthreads()

    @cuda.jit
    def backward(indptr, out, grad_out, grad_scores):
        H = out.shape[1]
        buf = cuda.shared.array(_THREADS, nbtype)
        t = cuda.threadIdx.x
        lanes = _THREADS // H
        h = t % H
        lane = t // H
        for i in range(cuda.blockIdx.x, indptr.shape[0] - 1, cuda.gridDim.x):
            start = indptr[i]
            end = indptr[i + 1]
            s = zero
            if lane < lanes:
                for k in range(start + lane, end, lanes):
                    s += out[k, h] * grad_out[k, h]
            buf[t] = s
            _reduce(buf, H, lanes, False)
            s = buf[h]
            if lane < lanes:
                for k in range(start + lane, end, lanes):
                    grad_scores[k, h] = out[k, h] * (grad_out[k, h] - s)
            cuda.syncthreads()

    return forward, backward


_kernels = compiled("edge_softmax", _build)


def _check_heads(h: int) -> None:
    if h > _THREADS:
        raise ValueError(f"edge_softmax CUDA kernel supports at most {_THREADS} heads, got {h}")


def edge_softmax(indptr, scores, out) -> None:
    """See :func:`numba_kernels.cpu.edge_softmax.edge_softmax`."""
    n = indptr.shape[0] - 1
    if n == 0 or scores.shape[0] == 0 or scores.shape[1] == 0:
        return
    _check_heads(scores.shape[1])
    _kernels(scores.dtype)[0][min(n, _MAX_BLOCKS), _THREADS, stream()](indptr, scores, out)


def edge_softmax_backward(indptr, out, grad_out, grad_scores) -> None:
    """See :func:`numba_kernels.cpu.edge_softmax.edge_softmax_backward`."""
    n = indptr.shape[0] - 1
    if n == 0 or out.shape[0] == 0 or out.shape[1] == 0:
        return
    _check_heads(out.shape[1])
    _kernels(out.dtype)[1][min(n, _MAX_BLOCKS), _THREADS, stream()](indptr, out, grad_out, grad_scores)
