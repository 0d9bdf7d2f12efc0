"""The C allocator's large-block policy, set once per process at start-up (glibc only).

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes from fresh pages (``mmap``) and gives them back
when it is freed; smaller blocks come from its heaps, whose freed space is reused but seldom returned. By
default the threshold adapts: every freed mmapped block raises it to that block's size, up to 32 MiB. A
training step allocates and frees many tensors of 1-32 MiB in changing orders, so after the first step they
all land on the heap, and the heap fragments: a ``seqpar`` rank grew from 1.7 to 2.9 GB over four steps
(measured, benchmarks.md). A fixed threshold (``train.malloc_mmap_threshold``, default 1 MiB) keeps large
tensors out of the heap; the epoch time did not change in the measurements.

The setting must come before the heap holds large blocks (the CLI applies it before torch is imported; the
:class:`~hpc_graph.train.trainer.Trainer` applies it again, which helps a Python program that has not
allocated much yet). ``MALLOC_MMAP_THRESHOLD_`` in the environment, glibc's own knob, wins.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
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
    glibc, or ``MALLOC_MMAP_THRESHOLD_`` set in the environment (the user's explicit choice).

    Raises:
        ValueError: ``threshold`` outside ``[0, 32 MiB]`` (``train.malloc_mmap_threshold``).
    """
    global _applied
    threshold = int(threshold)
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"train.malloc_mmap_threshold: must be in [0, {MAX_THRESHOLD}] bytes, got {threshold}")
    if threshold == 0:
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
