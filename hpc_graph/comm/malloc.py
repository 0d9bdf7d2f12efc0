"""The C allocator's large-block policy, set once per process before the data is loaded (glibc only).

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes from fresh pages (``mmap``) and gives them back
when it is freed; smaller blocks come from its heaps, whose freed space is reused but seldom returned. By
default the threshold adapts: every freed mmapped block raises it to that block's size, up to 32 MiB.

Which policy is right depends on how a rank allocates, so each engine declares the one it needs
(:attr:`hpc_graph.engines.base.Engine.malloc_mmap_threshold`) and ``train.malloc_mmap_threshold`` overrides it:

* **fixed at 1 MiB** (the full-graph, pipeline and sequence engines): a step allocates the same large tensors
  every time, in changing orders. With the adaptive threshold those of 1-32 MiB land on the heap after the
  first step and fragment it: a ``seqpar`` rank grew from 1.7 to 2.9 GB over four steps (docs/benchmarks.md,
  history §9.2). Fixed, the rank's memory is its live tensors; the page faults of a fresh block are paid once per
  tensor per step, small beside a full-graph step.
* **glibc's adaptive default** (the sampled engines, ``minibatch`` and ``apt``): an epoch is hundreds of
  short iterations, each allocating tensors of 1-100 MiB whose sizes change with the sampled batch. Served
  from fresh pages, every one of them is page-faulted in and unmapped again each iteration: a ``minibatch``
  epoch on R-MAT 18 ran 1.43x slower fixed at 1 MiB than with the default, for 13 % less peak RSS
  (docs/benchmarks.md, history §6). From the heap their pages are reused.

A fixed threshold cannot be undone in a running process (glibc then stops adapting), so it is applied once
the engine is known: by the :class:`~hpc_graph.train.trainer.Trainer` before it loads anything, or by the CLI
before torch is imported when the config gives a value. ``MALLOC_MMAP_THRESHOLD_`` in the environment,
glibc's own knob, wins over both.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers
M_TRIM_THRESHOLD = -1
TRIM_DEFAULT = 128 << 10  # glibc's trim threshold once the mmap threshold is fixed (it stops adapting both)
MAX_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit systems
ENV = "MALLOC_MMAP_THRESHOLD_"

_applied: int | None = None


def _libc():
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None
    except OSError:
        return None


def configure_malloc(threshold: int) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (0: leave glibc's adaptive default).

    Returns whether the setting was applied. Not applied (with a debug message): 0, a C library other than
    glibc, or ``MALLOC_MMAP_THRESHOLD_`` set in the environment (the user's explicit choice). 0 after a fixed
    threshold was applied in this process cannot restore the adaptive default (glibc keeps the fixed one).

    Raises:
        ValueError: ``threshold`` outside ``[0, 32 MiB]`` (``train.malloc_mmap_threshold``).
    """
    global _applied
    threshold = int(threshold)
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"train.malloc_mmap_threshold: must be in [0, {MAX_THRESHOLD}] bytes, got {threshold}")
    if threshold == 0:
        if _applied is not None:
            log.debug("malloc: mmap threshold stays fixed at %d bytes (glibc cannot adapt again)", _applied)
        return False
    if os.environ.get(ENV):
        log.debug("malloc: %s=%s is set; train.malloc_mmap_threshold not applied", ENV, os.environ[ENV])
        return False
    if _applied == threshold:
        return True
    libc = _libc()
    if libc is None:
        log.debug("malloc: not glibc; train.malloc_mmap_threshold not applied")
        return False
    if libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)) != 1:
        log.warning("malloc: glibc refused mmap threshold %d", threshold)
        return False
    _applied = threshold
    log.debug("malloc: mmap threshold fixed at %d bytes", threshold)
    return True


@contextlib.contextmanager
def heap_blocks(limit: int = 8 << 20):
    """Within the block, serve allocations below ``limit`` bytes from the heap even where the process fixed a
    lower mmap threshold: for code that allocates many short-lived temporaries of a few MiB in a loop (a
    chunked op), which would otherwise page-fault fresh pages in and unmap them again for every one; the heap's
    freed top is kept for them too (trim threshold ``4 * limit``). On exit the fixed threshold and glibc's trim
    threshold come back, and the next free returns the heap's top as before. Nothing changes under glibc's
    adaptive default, ``MALLOC_MMAP_THRESHOLD_`` or another C library."""
    libc = _libc() if _applied is not None and _applied < limit and not os.environ.get(ENV) else None
    if libc is not None:  # and keep the freed top of the heap for the next temporaries instead of trimming it
        libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(int(limit)))
        libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(4 * int(limit)))
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(_applied))
            libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(_trim_threshold()))


def _trim_threshold() -> int:
    try:
        return int(os.environ.get("MALLOC_TRIM_THRESHOLD_", TRIM_DEFAULT))
    except ValueError:
        return TRIM_DEFAULT


def malloc_policy() -> str:
    """The large-block policy in effect in this process, in words (for run summaries): ``"mmap threshold
    1048576 (fixed)"``, ``"... (MALLOC_MMAP_THRESHOLD_)"`` or ``"glibc adaptive"``."""
    if os.environ.get(ENV):
        return f"mmap threshold {os.environ[ENV]} ({ENV})"
    if _applied is not None:
        return f"mmap threshold {_applied} (fixed)"
    return "glibc adaptive"
