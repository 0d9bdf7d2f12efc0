"""Zero-copy views of torch tensors as kernel arrays (NumPy on CPU, numba device arrays on CUDA)."""
from __future__ import annotations

import torch


def kernel_device(t: torch.Tensor) -> str:
    """``"cuda"`` or ``"cpu"``: which kernel twin handles tensor ``t``."""
    return "cuda" if t.is_cuda else "cpu"


def as_array(t: torch.Tensor | None):
    """View ``t`` (detached, made contiguous if needed) as a NumPy or numba CUDA array; ``None`` passes through."""
    if t is None:
        return None
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_cuda:
        from numba import cuda  # imported lazily: CPU-only runs never touch CUDA
        return cuda.as_cuda_array(t)
    return t.numpy()
