"""The counter-based hash (splitmix64) behind every random draw of the kernels.

A draw is a hash of counters (a seed, ids, positions), not a step of a generator's stream, so it does
not depend on the order in which threads, blocks or ranks make it: the neighbour sampler
(:mod:`~numba_kernels.cpu.sample`), the quantiser's stochastic rounding (:mod:`~numba_kernels.cpu.quant`),
feature dropout (:mod:`~numba_kernels.cpu.dropout`) and attention dropout
(:mod:`~numba_kernels.cpu.gat_attention`) all use it.

* ``_splitmix64``: the 64-bit mixing function;
* ``_mix``: fold a non-negative integer into a hash state;
* ``_keep``: attention dropout. Edge ``(dst, src)`` head ``h`` is kept when
  ``uniform(mix(mix(mix(mix(seed), dst), src), h)) >= p``; the value depends only
  on the seed and the global ids, so every engine, every block split and the
  backward pass see the same mask.

The CUDA twin (``numba_kernels/cuda/_hash.py``) computes the same bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_INV_2_53 = 1.0 / 9007199254740992.0


@njit(cache=True, inline="always")
def _splitmix64(x):
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _mix(state, value):
    """Fold a non-negative integer ``value`` into a 64-bit hash ``state``."""
    return _splitmix64(state ^ np.uint64(value))


@njit(cache=True, inline="always")
def _keep(edge_hash, head, p):
    """True when head ``head`` of the edge hashed to ``edge_hash`` survives dropout ``p``."""
    u = np.float64(_splitmix64(edge_hash ^ np.uint64(head)) >> np.uint64(11)) * _INV_2_53
    return u >= p
