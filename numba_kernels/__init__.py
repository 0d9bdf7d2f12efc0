"""numba_kernels: array kernels with CPU (``numba_kernels.cpu``) and CUDA (``numba_kernels.cuda``) twins.

Conventions (every kernel family follows them):

* ``numba_kernels/cpu/<family>.py`` and ``numba_kernels/cuda/<family>.py``
  define functions of the same names and the same arguments.
* Arguments are arrays (NumPy on the CPU, numba device arrays or anything with
  ``__cuda_array_interface__`` on the GPU) and scalars; outputs are written into
  arrays the caller allocated, so both twins have one signature.
* No torch autograd, no MPI here.

Use :func:`get_kernel` to pick the twin by device.
"""
from __future__ import annotations

import importlib
from typing import Callable


def get_kernel(name: str, device: str = "cpu") -> Callable:
    """Return kernel ``"<family>.<function>"`` from the CPU or CUDA twin.

    >>> get_kernel("spmm.spmm_sum", "cpu")  # doctest: +SKIP
    """
    family, _, func = name.partition(".")
    if not func:
        raise ValueError(f"kernel name must be '<family>.<function>', got {name!r}")
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    module = importlib.import_module(f"numba_kernels.{kind}.{family}")
    try:
        return getattr(module, func)
    except AttributeError:
        raise ValueError(f"no kernel {func!r} in numba_kernels.{kind}.{family}") from None


def cpu_cache_state(probe: str = "spmm._spmm_sum") -> tuple[bool | None, str]:
    """``(warm, folder)``: whether numba's on-disk cache holds machine code of the CPU kernel ``probe`` for its
    current source, and the folder it caches in.

    ``warm`` is False on a fresh install (or after a kernel's source changed): the first calls of every kernel
    compile it (minutes in all, on every process that calls them first); None when the cache cannot be
    inspected (a numba without these internals). Nothing is compiled or loaded here."""
    family, _, func = probe.partition(".")
    try:
        cache = getattr(importlib.import_module(f"numba_kernels.cpu.{family}"), func)._cache
        return bool(cache._cache_file._load_index()), str(cache._cache_path)
    except Exception:  # numba's caching internals are not public API
        return None, ""
