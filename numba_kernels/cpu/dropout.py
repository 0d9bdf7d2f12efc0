"""Dropout in one pass with a counter-based mask (CPU twin): no mask is stored, backward redraws it.

``dropout_apply(x, key, cut, scale, out)``: element ``i`` of the flat arrays is
kept when its 16-bit uniform ``u_i >= cut`` and then ``out[i] = x[i] * scale``,
else ``out[i] = 0``. The uniforms come four to a 64-bit hash:
``h_w = splitmix64(key_hash ^ w)`` for word ``w``, ``u_{4w+l} = (h_w >> 16 l) & 0xffff``
(``key_hash = splitmix64(key)``). The mask depends only on (key, i), so the
backward pass (``dropout_apply`` on the gradient with the same key) drops
exactly the same elements, whatever the thread count. Keep probability
``1 - cut / 65536``; the caller passes ``scale = 1 / keep``.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import SMALL_WORK, _splitmix64

__all__ = ["dropout_apply", "key_hash"]


def key_hash(key: int) -> np.uint64:
    """``splitmix64(key mod 2^64)`` (pure Python; the CUDA twin uses the same)."""
    x = (int(key) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(x ^ (x >> 31))


_BLOCK = 1024  # words hashed into a local buffer before the elementwise pass (fits L1)


@njit(cache=True, nogil=True, inline="always")
def _words(x, kh, cut, scale, out, w0, w1, n, hs):
    # Two passes per block of words: the hashes alone (a loop LLVM vectorises with
    # 64-bit multiplies), then the elements with a branch-free select.
    zero = x.dtype.type(0)
    for b0 in range(w0, w1, _BLOCK):
        b1 = min(w1, b0 + _BLOCK)
        for w in range(b0, b1):
            hs[w - b0] = _splitmix64(kh ^ np.uint64(w))
        if 4 * b1 <= n:
            for w in range(b0, b1):
                h = hs[w - b0]
                for lane in range(4):
                    u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                    out[4 * w + lane] = x[4 * w + lane] * (scale if u >= cut else zero)
        else:  # the last, partial word
            for w in range(b0, b1):
                h = hs[w - b0]
                for lane in range(4):
                    i = 4 * w + lane
                    if i < n:
                        u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                        out[i] = x[i] * (scale if u >= cut else zero)
    return 0


@njit(cache=True, nogil=True, parallel=True)
def _apply_par(x, kh, cut, scale, out, chunk):
    n = x.shape[0]
    words = (n + 3) // 4
    nchunks = (words + chunk - 1) // chunk
    for c in prange(nchunks):
        hs = np.empty(_BLOCK, np.uint64)
        _words(x, kh, cut, scale, out, c * chunk, min(words, (c + 1) * chunk), n, hs)


@njit(cache=True, nogil=True)
def _apply_ser(x, kh, cut, scale, out):
    n = x.shape[0]
    hs = np.empty(_BLOCK, np.uint64)
    _words(x, kh, cut, scale, out, 0, (n + 3) // 4, n, hs)


def dropout_apply(x, key, cut, scale, out) -> None:
    """``out = x * scale`` where the counter mask keeps an element, else 0 (flat float32/float64 arrays).

    Args:
        x, out: 1-D float arrays of the same length (``out`` may be ``x`` itself).
        key: the call's 64-bit key (an int; the caller draws it from its RNG).
        cut: 0..65536: an element is dropped when its 16-bit uniform is below ``cut``.
        scale: factor of the kept elements (``1 / keep``).
    """
    if x.shape != out.shape:
        raise ValueError(f"dropout_apply: x {x.shape} and out {out.shape} differ")
    kh = key_hash(key)
    s = x.dtype.type(scale)
    if x.shape[0] < SMALL_WORK:
        _apply_ser(x, kh, int(cut), s, out)
    else:
        chunk = max(1024, -(-((x.shape[0] + 3) // 4) // (8 * numba.get_num_threads())))
        _apply_par(x, kh, int(cut), s, out, chunk)
