"""``sddmm``: differentiable per-edge dot products over a :class:`CSR`, multi-head.

``out[e, h] = sum_d a[dst(e), h, d] * b[src(e), h, d]``. Both gradients are
weighted SpMMs: ``grad_a`` over the graph, ``grad_b`` over its cached
transposed copy (no atomics).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import absent, check_graph, check_tensor, csc, empty, kernel, no_eids
from hpc_graph.ops.csr import CSR


def sddmm(g: CSR, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-edge dot products of destination and source rows.

    Args:
        g: graph with ``E`` edges.
        a: float32/float64 ``[num_dst, H, D]`` destination-side rows (or ``[num_dst, D]``).
        b: ``[num_src, H, D]`` source-side rows (or ``[num_src, D]``), same dtype and trailing shape.
    Returns:
        ``[E, H]`` (``[E]`` for 2-D inputs) in ``g``'s edge order, differentiable in ``a`` and ``b``.
    Raises:
        ValueError: shapes, dtypes, devices or graph indices inconsistent (before any kernel runs).
    """
    op = "sddmm"
    check_graph(g, op)
    check_tensor(op, "a", a, g, g.num_dst, (2, 3))
    check_tensor(op, "b", b, g, g.num_src, (2, 3))
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"{op}: a {tuple(a.shape)} and b {tuple(b.shape)} must agree in all but the first dimension")
    if a.dtype != b.dtype:
        raise ValueError(f"{op}: a dtype {a.dtype} differs from b dtype {b.dtype}")
    flat = a.dim() == 2
    out = _SDDMM.apply(g, a.unsqueeze(1) if flat else a, b.unsqueeze(1) if flat else b)
    return out.squeeze(1) if flat else out


class _SDDMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: CSR, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = empty((g.num_edges, a.shape[1]), a.dtype, a.device)
        kernel("sddmm.sddmm", a)(as_array(g.indptr), as_array(g.indices), as_array(a), as_array(b),
                                 as_array(out))
        ctx.g = g
        ctx.save_for_backward(a if ctx.needs_input_grad[2] else None,
                              b if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        g = ctx.g
        a, b = ctx.saved_tensors
        go = as_array(grad_out.contiguous())
        scale = absent(grad_out.dtype, grad_out.device, 1)
        grad_a = grad_b = None
        spmm_sum = kernel("spmm.spmm_sum", grad_out)
        if ctx.needs_input_grad[1]:
            grad_a = empty((g.num_dst,) + tuple(b.shape[1:]), b.dtype, b.device)
            spmm_sum(as_array(g.indptr), as_array(g.indices), no_eids(b.device), go, scale,
                     as_array(b), as_array(grad_a), False)
        if ctx.needs_input_grad[2]:
            indptr_t, indices_t, perm = csc(g)
            grad_b = empty((g.num_src,) + tuple(a.shape[1:]), a.dtype, a.device)
            spmm_sum(as_array(indptr_t), as_array(indices_t), as_array(perm), go, scale,
                     as_array(a), as_array(grad_b), False)
        return None, grad_a, grad_b
