"""R-MAT / Graph500 Kronecker edge generation (CPU).

Each edge draws its own random numbers from a counter-based generator (a
SplitMix64 hash of ``(seed, edge number, level)``), so the output depends only
on the seed and the edge numbers, never on the number of threads or on how the
edge range is split into calls.

No CUDA twin yet: generation is a one-off step that runs on the CPU.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)
_INV32 = 1.0 / 4294967296.0


@njit(cache=True, inline="always")
def _mix64(z: np.uint64) -> np.uint64:
    """SplitMix64 finaliser: a bijective 64-bit hash with good avalanche."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(parallel=True, cache=True)
def rmat_edges(seed, scale, a, b, c, first_edge, perm, src, dst):
    """Draw R-MAT edges ``first_edge .. first_edge + len(src) - 1``.

    At each of ``scale`` bit levels an edge falls into quadrant a (0,0), b (0,1),
    c (1,0) or d (1,1) of the adjacency matrix (d = 1 - a - b - c); the row bit
    goes to the source, the column bit to the destination.

    Args:
        seed: int >= 0.
        scale: number of bit levels; vertex ids lie in ``[0, 2**scale)``.
        a, b, c: quadrant probabilities (floats, a + b < 1).
        first_edge: number of the first edge (int >= 0); edges are numbered globally
            so that a range can be produced in several calls.
        perm: int[2**scale] vertex relabelling applied to both ends, or an empty
            array for none.
        src, dst: int32/int64[m] outputs (``m`` edges).
    """
    m = src.shape[0]
    ab = a + b
    a_norm = a / ab
    c_norm = c / (1.0 - ab)
    key = _mix64(np.uint64(seed) * _GOLDEN + np.uint64(0x5DEECE66D))
    use_perm = perm.shape[0] > 0
    for e in prange(m):
        state = key ^ _mix64(np.uint64(first_edge + e))
        u = 0
        v = 0
        for _ in range(scale):
            state = state + _GOLDEN
            z = _mix64(state)
            r1 = np.float64(z >> np.uint64(32)) * _INV32
            r2 = np.float64(z & _LOW32) * _INV32
            ii = 1 if r1 > ab else 0
            if ii == 1:
                jj = 1 if r2 > c_norm else 0
            else:
                jj = 1 if r2 > a_norm else 0
            u = (u << 1) | ii
            v = (v << 1) | jj
        if use_perm:
            src[e] = perm[u]
            dst[e] = perm[v]
        else:
            src[e] = u
            dst[e] = v
