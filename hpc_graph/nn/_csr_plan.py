"""The transpose plan of a sparse CSR input, kept on the tensor (private to the layers).

:func:`hpc_graph.nn._linear.linear` needs ``x^T`` of a constant CSR input for the weight gradient;
its structure is computed once and kept on ``x`` (attribute ``_hpc_csr_transpose``).
:func:`hpc_graph.nn._dropout.dropout` gives its output, which has the same sparsity structure, the
same plan.
"""
from __future__ import annotations

import torch

_PLAN = "_hpc_csr_transpose"


def transpose_plan(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ccol int64[F_in+1], rows int64[nnz], perm int64[nnz])`` of a CSR ``x`` [N, F_in], cached on ``x``.

    ``x^T`` as CSR is ``(ccol, rows, x.values()[perm])``.
    """
    plan = getattr(x, _PLAN, None)
    if plan is None:
        crow, col = x.crow_indices(), x.col_indices()
        rows = torch.repeat_interleave(torch.arange(x.shape[0], device=crow.device), crow[1:] - crow[:-1])
        perm = torch.argsort(col, stable=True)
        ccol = torch.zeros(x.shape[1] + 1, dtype=torch.int64, device=crow.device)
        torch.cumsum(torch.bincount(col, minlength=x.shape[1]), 0, out=ccol[1:])
        plan = (ccol, rows[perm], perm)
        setattr(x, _PLAN, plan)
    return plan


def share_transpose_plan(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Give CSR ``dst`` (same sparsity structure as ``src``) ``src``'s transpose plan; returns ``dst``."""
    setattr(dst, _PLAN, transpose_plan(src))
    return dst
