"""Dropout in one pass with a counter-based mask (CUDA twin of :mod:`numba_kernels.cpu.dropout`).

One thread per 64-bit word of four 16-bit uniforms (grid-stride): the same
hash, the same mask, so a CUDA run drops exactly the elements the CPU twin
drops for the same key. ``x * scale`` is one multiplication (nothing to fuse).
With row ``ids`` (see the CPU twin), one thread per element: its row's id gives
its position, and the position the uniform.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from numba_kernels.cuda._launch import stream

from numba_kernels.cpu.dropout import check_ids, key_hash
from numba_kernels.cuda._hash import _splitmix64

__all__ = ["dropout_apply", "act_dropout_apply", "act_dropout_grad", "key_hash"]

_THREADS = 256
_MAX_BLOCKS = 4096


@cuda.jit
def _apply(x, kh, cut, scale, out):
    n = x.shape[0]
    words = (n + 3) // 4
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for w in range(start, words, stride):
        h = _splitmix64(kh ^ np.uint64(w))
        for lane in range(4):
            i = 4 * w + lane
            if i < n:
                u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                out[i] = x[i] * scale if u >= cut else x[i] * 0


@cuda.jit
def _rows(x, g, ids, width, kh, cut, scale, act, grad, out):
    n = x.shape[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i // width
        pos = np.uint64(ids[r]) * np.uint64(width) + np.uint64(i - r * width)
        h = _splitmix64(kh ^ (pos >> np.uint64(2)))
        u = np.int64((h >> (np.uint64(16) * (pos & np.uint64(3)))) & np.uint64(0xFFFF))
        s = scale if u >= cut else scale * 0
        v = x[i]
        on = v > 0 or act == 0
        if grad:
            out[i] = g[i] * (s if on else s * 0)
        else:
            out[i] = (v if on else v * 0) * s


def _rows_call(x, g, ids, key, cut, scale, act, grad, out, op) -> None:
    width = check_ids(ids, x.shape[0], op)
    if width == 0:
        return
    blocks = min(_MAX_BLOCKS, (x.shape[0] + _THREADS - 1) // _THREADS)
    _rows[blocks, _THREADS, stream()](x, g, ids, np.int64(width), key_hash(key), int(cut), x.dtype.type(scale),
                                      int(act), bool(grad), out)


def dropout_apply(x, key, cut, scale, out, ids=None) -> None:
    """See :func:`numba_kernels.cpu.dropout.dropout_apply`; ``x``/``out`` are 1-D device arrays, ``ids`` an
    int64 device array or None."""
    if ids is not None:
        _rows_call(x, x, ids, key, cut, scale, 0, False, out, "dropout_apply")
        return
    n = x.shape[0]
    if n == 0:
        return
    words = (n + 3) // 4
    blocks = min(_MAX_BLOCKS, (words + _THREADS - 1) // _THREADS)
    _apply[blocks, _THREADS, stream()](x, key_hash(key), int(cut), x.dtype.type(scale), out)


@cuda.jit
def _act_apply(x, g, kh, cut, scale, act, grad, out):
    n = x.shape[0]
    words = (n + 3) // 4
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for w in range(start, words, stride):
        h = _splitmix64(kh ^ np.uint64(w))
        for lane in range(4):
            i = 4 * w + lane
            if i < n:
                u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                s = scale if u >= cut else scale * 0
                v = x[i]
                pos = v > 0
                if grad:
                    d = s if (pos or act == 0) else s * 0
                    out[i] = g[i] * d
                else:
                    a = v if (pos or act == 0) else v * 0
                    out[i] = a * s


def _act_call(x, g, key, cut, scale, act, grad, out, ids=None) -> None:
    if x.shape != out.shape or g.shape != out.shape:
        raise ValueError(f"act_dropout: x {x.shape}, g {g.shape} and out {out.shape} differ")
    if int(act) not in (0, 1):
        raise ValueError(f"act_dropout: activation code must be 0 (none) or 1 (ReLU), got {act}")
    if ids is not None:
        _rows_call(x, g, ids, key, cut, scale, act, grad, out, "act_dropout")
        return
    n = x.shape[0]
    if n == 0:
        return
    blocks = min(_MAX_BLOCKS, ((n + 3) // 4 + _THREADS - 1) // _THREADS)
    _act_apply[blocks, _THREADS, stream()](x, g, key_hash(key), int(cut), x.dtype.type(scale), int(act), bool(grad),
                                           out)


def act_dropout_apply(x, key, cut, scale, act, out, ids=None) -> None:
    """See :func:`numba_kernels.cpu.dropout.act_dropout_apply`; 1-D device arrays."""
    _act_call(x, x, key, cut, scale, act, False, out, ids)


def act_dropout_grad(x, g, key, cut, scale, act, out, ids=None) -> None:
    """See :func:`numba_kernels.cpu.dropout.act_dropout_grad`; 1-D device arrays."""
    _act_call(x, g, key, cut, scale, act, True, out, ids)
