"""Shared plumbing of the kernel-backed ops: checks, cached per-graph arrays, kernel views.

Everything here is computed once per :class:`~hpc_graph.ops.csr.CSR` and kept
in ``g._cache`` (the transpose in ``g._csc``), so repeated calls on one graph
pay no set-up cost. All checks run before any kernel is launched and raise
``ValueError`` naming the argument.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from hpc_graph.ops._bridge import as_array, get_kernel, kernel_device
from hpc_graph.ops.csr import CSR

FLOAT_DTYPES = (torch.float32, torch.float64)
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
                 torch.uint8: np.uint8}
#: CPU outputs at least this large are allocated by NumPy (transparent huge pages)
_HUGE_BYTES = 4 << 20


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised output tensor; large CPU ones come from NumPy, zero-copy.

    NumPy asks the kernel for transparent huge pages (``madvise``) on large
    arrays, torch does not (unless ``THP_MEM_ALLOC_ENABLE=1``): that turns
    ~260k 4-KiB page faults per GiB written into ~500, and makes later random
    row reads of the tensor (the next layer's gathers) miss the TLB far less.
    """
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if torch.device(device).type == "cpu" and np_dtype is not None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(np_dtype).itemsize
        if nbytes >= _HUGE_BYTES:
            return torch.from_numpy(np.empty(shape, dtype=np_dtype))
    return torch.empty(shape, dtype=dtype, device=device)


def torch_huge_pages() -> bool:
    """Whether torch puts its large CPU tensors on transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``,
    which importing :mod:`hpc_graph` sets unless the user chose otherwise)."""
    return os.environ.get("THP_MEM_ALLOC_ENABLE", "") == "1"


def gathered(t: torch.Tensor, num_edges: int):
    """Kernel view of ``t`` for a kernel that reads its rows at random, ``num_edges`` times in all.

    A large CPU tensor that torch allocated (4-KiB pages) is first copied into
    a huge-page buffer (:func:`empty`) when the rows are read at least twice
    on average: one sequential copy costs far less than the TLB misses it saves
    (the backward SpMM at R-MAT scale 20, F=128 runs 1.5x faster). Used for
    gradients in backward passes, which torch allocates; skipped when torch puts
    large tensors on huge pages itself (:func:`torch_huge_pages`).
    """
    t = t.contiguous()
    if t.device.type == "cpu" and not torch_huge_pages() and t.numel() and t.dtype in _NUMPY_DTYPES \
            and t.numel() * t.element_size() >= _HUGE_BYTES and num_edges >= 2 * t.shape[0]:
        buf = empty(tuple(t.shape), t.dtype, t.device)
        buf.copy_(t)
        t = buf
    return as_array(t)


def kernel(name: str, t: torch.Tensor):
    """The CPU or CUDA twin of kernel ``"<family>.<function>"`` for tensor ``t``'s device."""
    return get_kernel(name, kernel_device(t))


def check_graph(g: CSR, op: str) -> None:
    """Validate ``g`` (shapes, index ranges) once per graph object; ``ValueError`` on failure."""
    if not isinstance(g, CSR):
        raise ValueError(f"{op}: g must be an hpc_graph.ops.CSR, got {type(g).__name__}")
    if not g._cache.get("ops.validated"):
        try:
            g.validate()
        except ValueError as exc:
            raise ValueError(f"{op}: {exc}") from None
        g._cache["ops.validated"] = True


def check_tensor(op: str, name: str, t, g: CSR, rows: int, ndims: tuple[int, ...]) -> None:
    """Check that ``t`` is a float32/float64 tensor on ``g``'s device with ``rows`` rows and a rank in ``ndims``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: {name} must be float32 or float64, got {t.dtype}")
    if t.dim() not in ndims:
        raise ValueError(f"{op}: {name} must have {' or '.join(map(str, ndims))} dimensions, "
                         f"got shape {tuple(t.shape)}")
    if t.shape[0] != rows:
        raise ValueError(f"{op}: {name} has {t.shape[0]} rows, expected {rows} (shape {tuple(t.shape)})")
    if t.device != g.device:
        raise ValueError(f"{op}: {name} is on {t.device} but the graph is on {g.device}")


def csc(g: CSR, perm: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``g.csc(perm)`` (kept for callers of this module; the CSR builds it with the numba kernel on the CPU)."""
    return g.csc(perm)


def inv_degree(g: CSR, dtype: torch.dtype) -> torch.Tensor:
    """float[num_dst]: ``1 / in_degree`` (0 for rows without edges), cached per dtype."""
    key = ("ops.inv_degree", dtype)
    if key not in g._cache:
        deg = g.in_degree().to(dtype)
        g._cache[key] = torch.where(deg > 0, 1.0 / deg.clamp(min=1), torch.zeros((), dtype=dtype,
                                                                                  device=g.device))
    return g._cache[key]


def absent(dtype: torch.dtype, device: torch.device, ndim: int):
    """Kernel view of an empty placeholder for an optional argument (weight ``[0, 1]``, vectors ``[0]``)."""
    shape = (0, 1) if ndim == 2 else (0,)
    return as_array(torch.empty(shape, dtype=dtype, device=device))


def no_eids(device: torch.device):
    """Kernel view of an empty int64 edge-id array (identity edge order)."""
    return as_array(torch.empty(0, dtype=torch.int64, device=device))
