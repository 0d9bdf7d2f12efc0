"""Dropout in one pass with a counter-based mask (CPU twin): no mask is stored, backward redraws it.

``dropout_apply(x, key, cut, scale, out)``: element ``i`` of the flat arrays is
kept when its 16-bit uniform ``u_i >= cut`` and then ``out[i] = x[i] * scale``,
else ``out[i] = 0``. The uniforms come four to a 64-bit hash:
``h_w = splitmix64(key_hash ^ w)`` for word ``w``, ``u_{4w+l} = (h_w >> 16 l) & 0xffff``
(``key_hash = splitmix64(key)``). The mask depends only on (key, i), so the
backward pass (``dropout_apply`` on the gradient with the same key) drops
exactly the same elements, whatever the thread count. Keep probability
``1 - cut / 65536``; the caller passes ``scale = 1 / keep``.

``act_dropout_apply(x, key, cut, scale, act, out)`` fuses an activation in
front of the same mask (``out[i] = act(x[i]) * scale`` where kept, else 0) and
``act_dropout_grad(x, g, key, cut, scale, act, out)`` is its derivative
(``out[i] = g[i] * scale * act'(x[i])`` where kept, else 0), both from the
pre-activation ``x``: activation codes 0 (none) and 1 (ReLU). (An ELU here would
call a scalar ``exp`` per element, 10x slower than torch's vectorised one: GAT
keeps torch's ELU and the plain dropout.)

**Row ids.** Each function takes ``ids`` (int64[R], or None): the flat arrays
are then ``R`` rows of ``W = len(x) / R`` elements, and element ``c`` of row
``r`` takes the uniform of position ``ids[r] * W + c`` (word ``pos // 4``, lane
``pos % 4``) instead of its own index. A row's mask then depends on its id, not
on where the row sits: the rows of a partition (ids: their dataset node ids)
get exactly the masks the same rows get in the whole tensor, and
``ids = arange(R)`` gives the mask of ``ids=None``.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from numba_kernels.cpu._attention_common import SMALL_WORK
from numba_kernels.cpu._hash import _splitmix64

__all__ = ["dropout_apply", "act_dropout_apply", "act_dropout_grad", "key_hash", "ACTIVATIONS", "check_ids"]

#: activation codes of :func:`act_dropout_apply` / :func:`act_dropout_grad`
ACTIVATIONS = {None: 0, "relu": 1}


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


@njit(cache=True, nogil=True, inline="always")
def _elem(x, g, i, s, act, grad, out):
    # one element: act and grad are literals at every call site below, so each loop is specialised
    zero = x.dtype.type(0)
    v = x[i]
    if act == 1:
        if grad:
            out[i] = g[i] * (s if v > zero else zero)
        else:
            out[i] = (v if v > zero else zero) * s
    elif grad:
        out[i] = g[i] * s
    else:
        out[i] = v * s


@njit(cache=True, nogil=True, inline="always")
def _row_elems(x, g, r, ids, width, kh, cut, scale, act, grad, out, hs):
    # row r of the [R, width] view, its uniforms taken at positions ids[r] * width + c
    zero = x.dtype.type(0)
    base = np.uint64(ids[r]) * np.uint64(width)
    off = r * width
    if width % 4 == 0:  # the row starts on a word: its words' hashes first (a loop LLVM vectorises), then the row
        w0 = base >> np.uint64(2)
        nw = width // 4
        for j in range(nw):
            hs[j] = _splitmix64(kh ^ (w0 + np.uint64(j)))
        for j in range(nw):
            h = hs[j]
            for lane in range(4):
                u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                _elem(x, g, off + 4 * j + lane, scale if u >= cut else zero, act, grad, out)
        return 0
    c = 0
    while c < width:
        pos = base + np.uint64(c)
        h = _splitmix64(kh ^ (pos >> np.uint64(2)))
        lane = np.int64(pos & np.uint64(3))
        m = min(4 - lane, width - c)
        for k in range(m):
            u = np.int64((h >> np.uint64(16 * (lane + k))) & np.uint64(0xFFFF))
            _elem(x, g, off + c + k, scale if u >= cut else zero, act, grad, out)
        c += m
    return 0


@njit(cache=True, nogil=True, inline="always")
def _rows_range(x, g, ids, width, kh, cut, scale, act, grad, out, r0, r1):
    hs = np.empty(width // 4 + 1, np.uint64)
    for r in range(r0, r1):  # literal act and direction per call site: one specialised loop each
        if act == 1:
            if grad:
                _row_elems(x, g, r, ids, width, kh, cut, scale, 1, True, out, hs)
            else:
                _row_elems(x, g, r, ids, width, kh, cut, scale, 1, False, out, hs)
        elif grad:
            _row_elems(x, g, r, ids, width, kh, cut, scale, 0, True, out, hs)
        else:
            _row_elems(x, g, r, ids, width, kh, cut, scale, 0, False, out, hs)
    return 0


@njit(cache=True, nogil=True, parallel=True)
def _rows_par(x, g, ids, width, kh, cut, scale, act, grad, out, chunk):
    n = ids.shape[0]
    for c in prange((n + chunk - 1) // chunk):
        _rows_range(x, g, ids, width, kh, cut, scale, act, grad, out, c * chunk, min(n, (c + 1) * chunk))


@njit(cache=True, nogil=True)
def _rows_ser(x, g, ids, width, kh, cut, scale, act, grad, out):
    _rows_range(x, g, ids, width, kh, cut, scale, act, grad, out, 0, ids.shape[0])


def check_ids(ids, n: int, op: str) -> int:
    """The row width of ``n`` flat elements cut into ``len(ids)`` rows (``ValueError`` naming ``op`` when they
    do not divide, or ``ids`` is not a 1-D integer array)."""
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"{op}: ids must be a 1-D integer array, got {ids.dtype}[{ids.shape}]")
    r = int(ids.shape[0])
    if (r == 0 and n) or (r and n % r):
        raise ValueError(f"{op}: {n} elements do not make {r} rows (ids)")
    return n // r if r else 0


def _rows_call(x, g, ids, key, cut, scale, act, grad, out, op) -> None:
    width = check_ids(ids, x.shape[0], op)
    if width == 0:
        return
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    args = (x, g, ids, np.int64(width), key_hash(key), int(cut), x.dtype.type(scale), int(act), bool(grad), out)
    if x.shape[0] < SMALL_WORK:
        _rows_ser(*args)
    else:  # chunks of rows: 8 per thread, each at least ~4096 elements
        chunk = max(-(-4096 // width), -(-ids.shape[0] // (8 * numba.get_num_threads())))
        _rows_par(*args, np.int64(chunk))


def dropout_apply(x, key, cut, scale, out, ids=None) -> None:
    """``out = x * scale`` where the counter mask keeps an element, else 0 (flat float32/float64 arrays).

    Args:
        x, out: 1-D float arrays of the same length (``out`` may be ``x`` itself).
        key: the call's 64-bit key (an int; the caller draws it from its RNG).
        cut: 0..65536: an element is dropped when its 16-bit uniform is below ``cut``.
        scale: factor of the kept elements (``1 / keep``).
        ids: int64[R] row ids (module docstring), or None: every element's own index.
    """
    if x.shape != out.shape:
        raise ValueError(f"dropout_apply: x {x.shape} and out {out.shape} differ")
    if ids is not None:
        _rows_call(x, x, ids, key, cut, scale, 0, False, out, "dropout_apply")
        return
    kh = key_hash(key)
    s = x.dtype.type(scale)
    if x.shape[0] < SMALL_WORK:
        _apply_ser(x, kh, int(cut), s, out)
    else:
        chunk = max(1024, -(-((x.shape[0] + 3) // 4) // (8 * numba.get_num_threads())))
        _apply_par(x, kh, int(cut), s, out, chunk)


@njit(cache=True, nogil=True, inline="always")
def _act_words(x, g, kh, cut, scale, act, grad, out, w0, w1, n, hs):
    # as _words (hashes first, then a branch-free elementwise pass); the activation and the
    # direction are constants of each call site in _act_par, so every loop is specialised:
    # grad False: out = act(x) * scale | 0; grad True: out = g * scale * act'(x) | 0
    zero = x.dtype.type(0)
    for b0 in range(w0, w1, _BLOCK):
        b1 = min(w1, b0 + _BLOCK)
        for w in range(b0, b1):
            hs[w - b0] = _splitmix64(kh ^ np.uint64(w))
        full = 4 * b1 <= n
        for w in range(b0, b1):
            h = hs[w - b0]
            for lane in range(4):
                i = 4 * w + lane
                if full or i < n:
                    u = np.int64((h >> np.uint64(16 * lane)) & np.uint64(0xFFFF))
                    _elem(x, g, i, scale if u >= cut else zero, act, grad, out)
    return 0


@njit(cache=True, nogil=True, parallel=True)
def _act_par(x, g, kh, cut, scale, act, grad, out, chunk):
    n = x.shape[0]
    words = (n + 3) // 4
    nchunks = (words + chunk - 1) // chunk
    for c in prange(nchunks):
        hs = np.empty(_BLOCK, np.uint64)
        w0, w1 = c * chunk, min(words, (c + 1) * chunk)
        if act == 1:  # literal activation and direction per call site: one specialised loop each
            if grad:
                _act_words(x, g, kh, cut, scale, 1, True, out, w0, w1, n, hs)
            else:
                _act_words(x, g, kh, cut, scale, 1, False, out, w0, w1, n, hs)
        elif grad:
            _act_words(x, g, kh, cut, scale, 0, True, out, w0, w1, n, hs)
        else:
            _act_words(x, g, kh, cut, scale, 0, False, out, w0, w1, n, hs)


def _act_call(x, g, key, cut, scale, act, grad, out, ids=None) -> None:
    if x.shape != out.shape or g.shape != out.shape:
        raise ValueError(f"act_dropout: x {x.shape}, g {g.shape} and out {out.shape} differ")
    if int(act) not in (0, 1):
        raise ValueError(f"act_dropout: activation code must be 0 (none) or 1 (ReLU), got {act}")
    if ids is not None:
        _rows_call(x, g, ids, key, cut, scale, act, grad, out, "act_dropout")
        return
    if x.shape[0] == 0:
        return
    chunk = max(1024, -(-((x.shape[0] + 3) // 4) // (8 * numba.get_num_threads())))
    _act_par(x, g, key_hash(key), int(cut), x.dtype.type(scale), int(act), bool(grad), out, chunk)


def act_dropout_apply(x, key, cut, scale, act, out, ids=None) -> None:
    """``out = act(x) * scale`` where the mask of ``key`` keeps an element, else 0 (flat float arrays).

    ``act``: 0 none, 1 ReLU; the mask is :func:`dropout_apply`'s for the same key, ``cut``
    and ``ids`` (``cut=0``, ``scale=1``: the activation alone). ``out`` may be ``x``.
    """
    _act_call(x, x, key, cut, scale, act, False, out, ids)


def act_dropout_grad(x, g, key, cut, scale, act, out, ids=None) -> None:
    """Gradient of :func:`act_dropout_apply` w.r.t. ``x``: ``out = g * scale * act'(x)`` where kept, else 0.

    ``x`` is the pre-activation input of the forward call, ``g`` the gradient of its output;
    ``out`` may be ``g``.
    """
    _act_call(x, g, key, cut, scale, act, True, out, ids)
