"""``AttentionState``: the online-softmax state shared by the block-wise attention ops.

The SAR engine aggregates one partition block of sources at a time and never
stores an E x H attention tensor.  Per destination ``i`` and head ``h`` it keeps
the running max ``m`` of the scores seen so far, the running sum
``l = sum exp(score - m)`` and the un-normalised numerator
``acc = sum exp(score - m) * value``; when a block raises the max, ``l`` and
``acc`` are rescaled by ``exp(m_old - m_new)``.  :func:`finalize` divides by
``l``; ``m`` and ``l`` are kept because the backward pass recomputes the
normalised weights ``exp(score - m) / l`` from them.

Used by :mod:`hpc_graph.ops.gat_attention` and :mod:`hpc_graph.ops.dot_attention`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hpc_graph.ops._bridge import as_array, get_kernel, kernel_device


@dataclass
class AttentionState:
    """Running softmax state of ``num_dst`` destinations.

    Attributes:
        m: float[num_dst, H] running max of the scores (-inf before any edge).
        l: float[num_dst, H] running sum of ``exp(score - m)``.
        acc: float[num_dst, H, D] numerator; after :func:`finalize` the output.
        finalized: set by :func:`finalize`; accumulating afterwards is an error.
    """

    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor
    finalized: bool = False

    @property
    def num_dst(self) -> int:
        return int(self.acc.shape[0])

    @property
    def heads(self) -> int:
        return int(self.acc.shape[1])

    @property
    def dim(self) -> int:
        return int(self.acc.shape[2])


def init_state(num_dst: int, heads: int, dim: int, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> AttentionState:
    """A fresh state for ``num_dst`` destinations, ``heads`` heads of ``dim`` features."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"init_state: dtype must be float32 or float64, got {dtype}")
    if num_dst < 0 or heads < 1 or dim < 1:
        raise ValueError(f"init_state: need num_dst >= 0, heads >= 1, dim >= 1, got {num_dst}, {heads}, {dim}")
    return AttentionState(
        m=torch.full((num_dst, heads), float("-inf"), dtype=dtype, device=device),
        l=torch.zeros((num_dst, heads), dtype=dtype, device=device),
        acc=torch.zeros((num_dst, heads, dim), dtype=dtype, device=device),
    )


def finalize(state: AttentionState) -> torch.Tensor:
    """Normalise in place and return the output float[num_dst, H, D] (``state.acc``).

    Destinations without any in-edge get 0.  ``state.m`` and ``state.l`` stay
    valid for the backward pass.  Calling it twice returns the same tensor.
    """
    if not state.finalized:
        device = kernel_device(state.acc)
        get_kernel("gat_attention.finalize", device)(as_array(state.m), as_array(state.l),
                                                     as_array(state.acc))
        state.finalized = True
    return state.acc


def output_delta(state: AttentionState, grad_out: torch.Tensor) -> torch.Tensor:
    """float[num_dst, H]: ``grad_out[i,h,:] . out[i,h,:]``, the softmax-backward term."""
    if not state.finalized:
        raise ValueError("output_delta: the state must be finalized first")
    check_tensor("grad_out", grad_out, tuple(state.acc.shape), state.acc.dtype, state.acc.device)
    delta = torch.empty_like(state.m)
    get_kernel("gat_attention.output_delta", kernel_device(state.acc))(
        as_array(grad_out), as_array(state.acc), as_array(delta))
    return delta


def check_tensor(name: str, t, shape: tuple, dtype: torch.dtype | None, device: torch.device) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``t`` is a tensor of ``shape`` (``None``
    entries match any size), ``dtype`` (``None``: any float32/float64) and ``device``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    if dtype is None:
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name}: expected dtype float32 or float64, got {t.dtype}")
    elif t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.device != torch.device(device):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")


def check_block(name: str, block, num_dst: int, device: torch.device) -> None:
    """Validate a block CSR (type, index ranges, ``num_dst`` rows, device); ``ValueError`` otherwise."""
    from hpc_graph.ops.csr import CSR
    if not isinstance(block, CSR):
        raise ValueError(f"{name}: expected an hpc_graph.ops.CSR, got {type(block).__name__}")
    if block.num_dst != num_dst:
        raise ValueError(f"{name}: has {block.num_dst} destination rows, expected {num_dst}")
    if block.indptr.device != torch.device(device) or block.indices.device != torch.device(device):
        raise ValueError(f"{name}: on device {block.indptr.device}, expected {device}")
    block.validate()
