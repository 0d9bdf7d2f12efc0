"""The counter-based hash (splitmix64) as CUDA device functions (twin of ``numba_kernels/cpu/_hash.py``).

``_splitmix64``, ``_mix`` and ``_keep`` compute the same bits as the CPU twin's, so a CUDA kernel draws
what its CPU twin draws (the sampler, the quantiser, feature and attention dropout).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_INV_2_53 = 1.0 / 9007199254740992.0


@cuda.jit(device=True, inline=True)
def _splitmix64(x):
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@cuda.jit(device=True, inline=True)
def _mix(state, value):
    return _splitmix64(state ^ np.uint64(value))


@cuda.jit(device=True, inline=True)
def _keep(edge_hash, head, p):
    u = np.float64(_splitmix64(edge_hash ^ np.uint64(head)) >> np.uint64(11)) * _INV_2_53
    return u >= p
