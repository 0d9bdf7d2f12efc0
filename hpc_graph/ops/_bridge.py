"""Zero-copy views of torch tensors as kernel arrays, and kernels that launch on torch's current stream.

On the CPU a tensor becomes a NumPy view. On a GPU it becomes a numba device
array over the same memory (``__cuda_array_interface__``, no copy and no
synchronisation), and a CUDA twin returned by :func:`get_kernel` launches on
``torch.cuda.current_stream()`` of the tensor's device, so numba kernels are
ordered with the torch work around them on any stream a caller picks
(``with torch.cuda.stream(s): ...``), never on numba's default stream.

On the ``meta`` device (tensors with shapes and no data: the planner runs the real training step on them, see
:mod:`hpc_graph.plan`) a tensor becomes a :class:`~numba_kernels.work.ShapeArray` and a kernel its shape twin
(:func:`numba_kernels.work.shape_kernel`), which computes nothing and reports the work it stands for to the
hook set with :func:`set_work_hook`.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from numba_kernels import get_kernel as _twin


_work_hook: Callable[[tuple], None] | None = None


def set_work_hook(hook: Callable[[tuple], None] | None) -> Callable[[tuple], None] | None:
    """Send the work records of the shape twins (``("spmm", edges, width)``, ...) to ``hook`` (None: drop them);
    returns the hook set before."""
    global _work_hook
    previous, _work_hook = _work_hook, hook
    return previous


def _report(record: tuple) -> None:
    if _work_hook is not None:
        _work_hook(record)


def kernel_device(t: torch.Tensor) -> str:
    """``"cuda"``, ``"cpu"`` or ``"meta"``: which kernel twin handles tensor ``t``."""
    return "cuda" if t.is_cuda else "meta" if t.is_meta else "cpu"


def as_array(t: torch.Tensor | None):
    """View ``t`` (detached, made contiguous if needed) as a NumPy or numba CUDA array (a
    :class:`~numba_kernels.work.ShapeArray` on the ``meta`` device); ``None`` passes through."""
    if t is None:
        return None
    if t.is_meta:
        from numba_kernels.work import ShapeArray

        return ShapeArray(tuple(t.shape), str(t.dtype).replace("torch.", ""))
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_cuda:
        from numba import cuda  # imported lazily: CPU-only runs never touch CUDA
        # sync=False: the kernel runs on the tensor's (current) stream, so waiting for it here would only stall
        return cuda.as_cuda_array(t, sync=False)
    return t.numpy()


def _numba_device(index: int) -> None:
    """Make numba's current CUDA context the one of GPU ``index`` (torch's current device)."""
    from numba import cuda

    if cuda.get_current_device().id != index:
        cuda.select_device(index)


_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
                 "uint8": torch.uint8}


def _scratch_allocator(index: int):
    """Kernel scratch memory from torch's caching allocator on GPU ``index`` (reused, stream-ordered, counted)."""
    device = torch.device("cuda", index)

    def alloc(shape, dtype):
        return torch.empty(shape, dtype=_TORCH_DTYPES[dtype.name], device=device)
    return alloc


def _on_torch_stream(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        from numba_kernels.cuda._launch import on_stream

        index = torch.cuda.current_device()
        _numba_device(index)
        with on_stream(torch.cuda.current_stream(index).cuda_stream, _scratch_allocator(index)):
            return fn(*args, **kwargs)
    return call


@functools.lru_cache(maxsize=None)
def _cuda_twin(name: str):
    return _on_torch_stream(_twin(name, "cuda"))


def get_kernel(name: str, device="cpu"):
    """Kernel ``"<family>.<function>"`` for ``device`` (``"cpu"``, ``"cuda"`` or a ``torch.device``).

    The CPU twin is returned as it is; the CUDA twin is wrapped so that it
    launches on torch's current stream of the current device (the device of
    the tensors: callers run under ``torch.cuda.device(t.device)`` when they
    use several GPUs in one process).
    """
    kind = device.type if isinstance(device, torch.device) else str(device)
    if kind.startswith("cuda"):
        return _cuda_twin(name)
    if kind == "meta":
        from numba_kernels.work import shape_kernel

        return shape_kernel(name, _report)
    return _twin(name, "cpu")
