"""``linear``: ``x W^T (+ b)`` for dense or sparse CSR inputs (private to the layers).

torch's own backward of ``F.linear`` on a CSR input transposes the input
(a sort of all non-zeros) on every call, which costs more than the rest of a
GCN step on Cora. The input features are constants (no gradient), so only the
weight gradient ``W_grad^T = x^T g`` is needed; the transpose's structure
(column pointer, row ids, value permutation) is computed once and kept on the
tensor (:mod:`hpc_graph.nn._csr_plan`); dropout copies it to its output,
whose sparsity structure is the same.
"""
from __future__ import annotations

import warnings

import torch
from torch.nn import functional as F

from hpc_graph.nn._csr_plan import transpose_plan
from hpc_graph.ops.csr import dense_columns


class _CSRLinear(torch.autograd.Function):
    """``y = x @ weight.T`` for a constant sparse CSR ``x`` [N, F_in]; gradient for ``weight`` [F_out, F_in] only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.x = x
        return torch.sparse.mm(x, weight.t())

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x = ctx.x
        ccol, rows, perm = transpose_plan(x)
        values = x.values()[perm].to(grad_out.dtype)
        with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
            warnings.simplefilter("ignore", UserWarning)
            xt = torch.sparse_csr_tensor(ccol, rows, values, (x.shape[1], x.shape[0]), check_invariants=False)
        return None, torch.sparse.mm(xt, grad_out).t()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: x float[N, F_in] dense or sparse CSR (a constant), weight float[F_out, F_in]."""
    if x.layout == torch.strided:
        return F.linear(x, weight, bias)
    if x.layout != torch.sparse_csr:
        raise ValueError(f"linear: input layout must be dense or sparse CSR, got {x.layout}")
    block = dense_columns(x)
    if block is not None:  # a dense column slice (NFP's input): one GEMM over the slice's columns
        lo, values = block
        # the weight's columns copied out (F_out x w, small): on the strided slice itself torch computes the
        # weight gradient as values^T @ grad, reading ``values`` across its rows (~1.5x slower at 25K rows)
        return F.linear(values, weight[:, lo:lo + values.shape[1]].contiguous(), bias)
    out = _CSRLinear.apply(x, weight)
    return out if bias is None else out + bias


def input_linear(x: torch.Tensor, weights, biases, act: str | None = None, p: float = 0.0,
                 row_scale: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``a = dropout(act(x), p)``; ``(linear(a, weights[k], biases[k]) * row_scale for k)``: a layer's input
    transform (``row_scale`` an optional constant float[N, 1]; ``ids`` the rows' dataset ids keying the
    dropout mask, ``GraphContext.row_ids``).

    ``x`` float[N, F_in] (dense, or sparse CSR with ``act=None``); ``act`` ``None`` or ``"relu"``;
    ``p`` the dropout probability (0 outside training). With a dense float input and
    autograd recording, the activation, the dropout and the projections run as one
    autograd node that keeps only ``x`` (:func:`hpc_graph.ops.dropout_linear.dropout_linear_multi`):
    neither the activation's output nor the dropped copy stays alive until the
    backward pass. Otherwise the same masks are drawn the same way
    (:func:`hpc_graph.nn._dropout.dropout`), step by step, and without autograd (evaluation) the row
    scale is applied in place.
    """
    fused = (act is not None or p > 0.0) and x.layout == torch.strided and x.dim() == 2 \
        and x.dtype in (torch.float32, torch.float64) and p < 1.0 and torch.is_grad_enabled() \
        and (x.requires_grad or any(w.requires_grad for w in weights))
    if fused:
        from hpc_graph.ops.dropout_linear import dropout_linear_multi

        return dropout_linear_multi(x, weights, biases, p, act, row_scale, ids)
    a = act_dropout(x, act, p, ids)
    outs = tuple(linear(a, w, b) for w, b in zip(weights, biases))
    del a  # the activation's output dies before the caller's next tensor exists
    if row_scale is None:
        return outs
    # in place where nothing records it (evaluation): no third N x F_out tensor beside x and the projection
    return tuple(o.mul_(row_scale) if not o.requires_grad else o * row_scale for o in outs)


def act_dropout(x: torch.Tensor, act: str | None, p: float, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(act(x), p)`` step by step (the masks :func:`input_linear` draws); ``act`` None, ``"relu"`` or
    ``"elu"``; ``x`` dense or (``act`` None) sparse CSR; ``ids`` as for :func:`input_linear`."""
    from hpc_graph.nn._dropout import dropout
    from hpc_graph.ops.dropout import activation

    return dropout(activation(x, act), p, p > 0.0, ids)
