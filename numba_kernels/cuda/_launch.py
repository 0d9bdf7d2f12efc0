"""The CUDA stream this package's kernels launch on (set by the caller, default stream otherwise).

Kernels here know nothing of torch: a caller that keeps its own stream (the
ops layer uses torch's current stream) wraps its calls in
:func:`on_stream` with the raw ``cudaStream_t`` handle as an integer, and every
launch, device allocation and host copy made by a CUDA twin inside that block
goes to that stream. Without it everything runs on the default stream (0).

Scratch memory a kernel needs beyond its outputs (the partial rows of the
load-balanced SpMM) comes from :func:`scratch`: from the allocator given to
:func:`on_stream` (the ops layer passes torch's caching allocator, so the
memory is reused, stream-ordered and counted by torch), else from numba.

The settings are per thread, so two threads driving two streams do not mix.
Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) every handle maps to 0:
the simulator runs kernels synchronously. Importing this module under the
simulator also makes the simulator's ``cuda``-module swap thread-safe (see
:func:`thread_safe_swap`): our kernels call device functions from other modules
(``_hash``, ``_attention_common``), which the simulator's own swap races on.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
from numba import config, cuda, float32, float64

_local = threading.local()
_EXTERNAL: dict = {}
_SIMULATED = bool(getattr(config, "ENABLE_CUDASIM", False))


def thread_safe_swap(real_cuda) -> Callable:
    """A thread-safe stand-in for the CUDA simulator's ``swapped_cuda_module(fn, fake)``.

    The simulator runs every GPU thread of a block as a Python thread, and each call
    of a device function puts the launch's fake ``cuda`` module into the function's
    module globals for the duration of the call, then puts ``real_cuda`` back. When
    the device function lives in a module other than the kernel's, threads race:
    one thread's restore leaves another thread mid-call with the real module (an
    ``AttributeError`` on ``cuda.local``/``cuda.threadIdx``), and one thread's swap
    can resize the globals dict while another iterates it ("dictionary changed size
    during iteration", seen in CI). Here the swaps of one globals dict are counted
    under a lock: the first entry swaps, the last exit restores.

    Args:
        real_cuda: the module object the globals hold between calls (``numba.cuda``).
    """
    lock = threading.Lock()
    held: dict = {}  # id(globals dict) -> [entries, {name: original value}]

    @contextmanager
    def swapped(fn, fake):
        globs = fn.__globals__
        key = id(globs)
        with lock:
            entry = held.get(key)
            if entry is None:
                orig = {name: value for name, value in list(globs.items()) if value is real_cuda}
                globs.update(dict.fromkeys(orig, fake))
                entry = held[key] = [0, orig]
            entry[0] += 1
        try:
            yield
        finally:
            with lock:
                entry[0] -= 1
                if entry[0] == 0:
                    globs.update(entry[1])
                    del held[key]

    return swapped


def _install_simulator_swap() -> None:
    try:
        from numba.cuda.simulator import kernel, kernelapi
    except ImportError:  # a simulator laid out differently: leave it as it is
        return
    if not (hasattr(kernel, "swapped_cuda_module") and hasattr(kernelapi, "swapped_cuda_module")):
        return
    if getattr(kernel.swapped_cuda_module, "_hpc_graph_thread_safe", False):
        return
    safe = thread_safe_swap(cuda)
    safe._hpc_graph_thread_safe = True
    kernel.swapped_cuda_module = kernelapi.swapped_cuda_module = safe


if _SIMULATED:
    _install_simulator_swap()


def compiled(what: str, build: Callable) -> Callable:
    """A per-dtype compile cache for kernels made by a factory.

    ``build(nbtype, *params)`` compiles the kernels of one element type (``numba.float32`` or ``numba.float64``)
    and integer parameters (tile widths, slot counts); the returned ``get(dtype, *params)`` compiles each
    combination once per process and refuses any other dtype with a ``ValueError`` naming ``what``.
    """
    cache: dict = {}

    def get(dtype, *params):
        key = (np.dtype(dtype).name,) + tuple(params)
        kernels = cache.get(key)
        if kernels is None:
            if key[0] not in ("float32", "float64"):
                raise ValueError(f"{what} CUDA kernels support float32/float64, got {key[0]}")
            kernels = cache[key] = build(float32 if key[0] == "float32" else float64, *params)
        return kernels

    return get


def stream():
    """The stream kernels launch on now: a numba stream object, or 0 (the default stream)."""
    return getattr(_local, "stream", 0)


def _external(handle: int):
    if not handle or _SIMULATED:
        return 0
    key = (cuda.get_current_device().id, int(handle))
    s = _EXTERNAL.get(key)
    if s is None:
        s = _EXTERNAL[key] = cuda.external_stream(int(handle))
    return s


@contextmanager
def on_stream(handle: int, allocator: Callable | None = None) -> Iterator[None]:
    """Launch this package's CUDA kernels on the stream with raw handle ``handle`` inside the block.

    Args:
        handle: a ``cudaStream_t`` as an integer (e.g. ``torch.cuda.current_stream().cuda_stream``);
            0 means the legacy default stream.
        allocator: ``allocator(shape, numpy_dtype)`` returning an object with ``__cuda_array_interface__``
            (uninitialised, on the current device, usable on that stream) for :func:`scratch`; None: numba's.
    """
    prev = stream(), getattr(_local, "allocator", None)
    _local.stream = _external(handle)
    _local.allocator = allocator
    try:
        yield
    finally:
        _local.stream, _local.allocator = prev


def scratch(shape, dtype):
    """An uninitialised device array for a kernel's scratch use, valid on the current stream."""
    alloc = getattr(_local, "allocator", None)
    if alloc is not None and not _SIMULATED:
        return cuda.as_cuda_array(alloc(tuple(shape), np.dtype(dtype)), sync=False)
    return cuda.device_array(shape, dtype, stream=stream())


def to_device(array):
    """``cuda.to_device(array)`` on the current stream (a small host array: constants, initial states)."""
    return cuda.to_device(array, stream=stream())


def device_array(shape, dtype):
    """``cuda.device_array`` (uninitialised) on the current stream."""
    return cuda.device_array(shape, dtype, stream=stream())
