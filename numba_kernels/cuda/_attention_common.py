"""Private helpers shared by the CUDA attention kernels (twins of ``numba_kernels/cpu/_attention_common.py``).

Device functions ``_gid`` (the global id keying the attention-dropout hash of
:mod:`numba_kernels.cuda._hash`), ``_leaky`` and ``_raise_max`` (the online-softmax rescale that every
forward kernel applies when a block raises a row's max), a launcher, ``global_ids``, and the state
functions ``init_state``/``finalize``/``output_delta``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from numba_kernels.cuda._launch import stream, to_device

THREADS_PER_BLOCK = 128


@cuda.jit(device=True, inline=True)
def _gid(ids, k):
    return ids[k] if ids[0] >= 0 else k


@cuda.jit(device=True, inline=True)
def _leaky(pre, slope):
    return pre if pre >= 0 else pre * slope


@cuda.jit(device=True, inline=True)
def _raise_max(i, h, mx, m, l, acc):
    """Rescale row ``i``, head ``h`` of the state ``(m, l, acc)`` to the new max ``mx`` (when it grew).

    Returns the running sum and the stored max (in the state's precision: backward divides by the same).
    """
    run_l = l[i, h]
    if mx > m[i, h]:
        r = math.exp(m[i, h] - mx)
        run_l *= r
        for d in range(acc.shape[2]):
            acc[i, h, d] *= r
        m[i, h] = mx
    return run_l, m[i, h]


_LOCAL_IDS: dict = {}


def device_key() -> int:
    """Id of the current GPU (0 under the CUDA simulator), for per-device caches."""
    get = getattr(cuda, "get_current_device", None)
    return get().id if get is not None else 0


def local_ids():
    """Device array ``[-1]``: "global id = local id" (the CPU twin's ``LOCAL_IDS``), one per GPU."""
    key = device_key()
    if key not in _LOCAL_IDS:
        _LOCAL_IDS[key] = cuda.to_device(np.full(1, -1, dtype=np.int64))  # synchronous: shared by all streams
    return _LOCAL_IDS[key]


def global_ids(src_gid, dst_gid):
    """``(src_gid, dst_gid)`` with ``None`` (global id = local id) given as :func:`local_ids`."""
    return (local_ids() if src_gid is None else src_gid), (local_ids() if dst_gid is None else dst_gid)


def launch(kernel, num_threads: int, *args) -> None:
    """Run ``kernel`` on a 1-D grid of at least ``num_threads`` threads (nothing for 0)."""
    if num_threads <= 0:
        return
    blocks = (num_threads + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    kernel[blocks, THREADS_PER_BLOCK, stream()](*args)


def init_state(num_dst: int, heads: int, dim: int, dtype=np.float32):
    """Device arrays ``m`` = -inf, ``l`` = 0 float[num_dst, heads] and ``acc`` = 0 float[num_dst, heads, dim]."""
    m = to_device(np.full((num_dst, heads), -np.inf, dtype=dtype))
    l = to_device(np.zeros((num_dst, heads), dtype=dtype))
    acc = to_device(np.zeros((num_dst, heads, dim), dtype=dtype))
    return m, l, acc


@cuda.jit
def _finalize(l, acc):
    t = cuda.grid(1)
    H = acc.shape[1]
    if t >= acc.shape[0] * H:
        return
    i = t // H
    h = t - i * H
    s = l[i, h]
    inv = 1.0 / s if s > 0 else 0.0
    for d in range(acc.shape[2]):
        acc[i, h, d] = acc[i, h, d] * inv if s > 0 else 0.0


def finalize(m, l, acc) -> None:
    """Normalise in place: ``acc[i,h,:] /= l[i,h]`` (rows without edges become 0)."""
    launch(_finalize, acc.shape[0] * acc.shape[1], l, acc)


@cuda.jit
def _output_delta(grad_out, out, delta):
    t = cuda.grid(1)
    H = out.shape[1]
    if t >= out.shape[0] * H:
        return
    i = t // H
    h = t - i * H
    s = 0.0
    for d in range(out.shape[2]):
        s += grad_out[i, h, d] * out[i, h, d]
    delta[i, h] = s


def output_delta(grad_out, out, delta) -> None:
    """``delta[i,h] = grad_out[i,h,:] . out[i,h,:]``."""
    launch(_output_delta, out.shape[0] * out.shape[1], grad_out, out, delta)

