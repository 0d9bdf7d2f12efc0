"""HDF5's Fletcher32 checksum of many chunks at once (CPU only).

HDF5's ``fletcher32`` filter appends to every chunk it writes a 32-bit checksum of the chunk's bytes, stored
little-endian: the bytes are read as big-endian 16-bit words, two running sums start at 0 (``s1 += w``,
``s2 += s1`` per word) and are folded to 16 bits and a carry (``(s & 0xffff) + (s >> 16)``) after every 360
words (an odd last byte counts as the high byte of one more word, then folded), a last fold of each, and the
checksum is ``s2 << 16 | s1``. The sums are uint32: whatever they would wrap, they wrap here too.

HDF5 verifies it inside a read, one chunk after the other on one thread. :func:`fletcher32_chunks` checks
chunks read raw (``h5py``'s ``read_direct_chunk``) in parallel, each block of up to 360 words in one pass:
``s2 += t * s1 + sum((t - j) * w_j)`` and ``s1 += sum(w_j)`` over the block's ``t`` words is the per-word
recurrence summed, so the result is HDF5's bit for bit.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_M32 = np.uint64(0xFFFFFFFF)
_M16 = np.uint64(0xFFFF)
_S16 = np.uint64(16)
_S8 = np.uint64(8)


@njit(cache=True, nogil=True, inline="always")
def _fold(s):
    s = s & _M32
    return (s & _M16) + (s >> _S16)


@njit(cache=True, nogil=True)
def _fletcher32(buf, lo, nbytes) -> np.uint32:
    """Fletcher32 of ``buf[lo:lo + nbytes]`` as HDF5 computes it."""
    words = nbytes // 2
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    w0 = 0
    while w0 < words:
        t = min(360, words - w0)
        a = np.uint64(0)
        b = np.uint64(0)
        base = lo + 2 * w0
        for j in range(t):
            w = (np.uint64(buf[base + 2 * j]) << _S8) | np.uint64(buf[base + 2 * j + 1])
            a += w
            b += np.uint64(t - j) * w
        s2 = _fold(s2 + np.uint64(t) * s1 + b)
        s1 = _fold(s1 + a)
        w0 += t
    if nbytes % 2:
        s1 = s1 + (np.uint64(buf[lo + nbytes - 1]) << _S8)
        s2 = _fold(s2 + s1)
        s1 = _fold(s1)
    s1 = _fold(s1)
    s2 = _fold(s2)
    return np.uint32(((s2 << _S16) | s1) & _M32)


@njit(cache=True, nogil=True)
def fletcher32(buf, lo, nbytes) -> np.uint32:
    """HDF5's Fletcher32 of ``buf[lo:lo + nbytes]`` (``buf`` uint8[:])."""
    return _fletcher32(buf, lo, nbytes)


@njit(parallel=True, cache=True, nogil=True)
def fletcher32_chunks(buf, chunk_bytes, stored, bad) -> int:
    """Check ``len(stored)`` chunks laid end to end in ``buf`` (uint8[:], chunk ``k`` at
    ``buf[k * chunk_bytes:(k + 1) * chunk_bytes]``) against their stored checksums ``stored`` (uint32[:]): ``bad[k]``
    (uint8[:]) is set to 1 where chunk ``k``'s checksum matches neither ``stored[k]`` nor the byte order HDF5
    before 1.6.3 wrote (the bytes of each 16-bit half swapped), else 0. Returns the number of bad chunks."""
    n = stored.shape[0]
    halves = np.uint32(0x00FF00FF)
    eight = np.uint32(8)
    for k in prange(n):
        f = _fletcher32(buf, k * chunk_bytes, chunk_bytes)
        swapped = np.uint32(((f & halves) << eight) | ((f >> eight) & halves))
        bad[k] = 0 if (f == stored[k] or swapped == stored[k]) else 1
    count = 0
    for k in range(n):
        count += bad[k]
    return count
