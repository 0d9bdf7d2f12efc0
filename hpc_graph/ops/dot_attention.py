"""Fused dot-product edge attention (graph transformer): block-wise functions and the autograd op.

``out[i,h,:] = sum_j softmax_j(scale * q[i,h,:] . k[j,h,:] + bias[e,h]) * v[j,h,:]``
over the in-edges ``e = (j -> i)`` of a :class:`~hpc_graph.ops.csr.CSR`, by the
numba kernels in ``numba_kernels/{cpu,cuda}/dot_attention.py``; no E x H
attention tensor is stored (only the optional bias and its gradient are E x H).

The block-wise protocol is the one of :mod:`hpc_graph.ops.gat_attention`
(same :class:`~hpc_graph.ops.attention_state.AttentionState`)::

    state = init_state(num_dst, H, Dv, dtype)
    for blk, k_q, v_q, bias_q in blocks:
        accumulate(state, blk, q, k_q, v_q, bias_q)
    out = finalize(state)
    delta = output_delta(state, grad_out)
    for blk, k_q, v_q, bias_q in blocks:
        gq, gk_q, gv_q, gb_q = backward_block(state, grad_out, delta, blk, q, k_q, v_q, bias_q)
        grad_q += gq

``bias_q`` is float[E_q, H] in block ``q``'s CSR edge order (or ``None``); or, with
``codes_q`` uint8[E_q], a table float[C, H] indexed by each edge's code (the graph
transformers' structural bias: one byte per edge is kept instead of H floats, and the
backward returns the table's gradient float[C, H]).
"""
from __future__ import annotations

import math

import torch

from hpc_graph.ops._bridge import as_array, get_kernel, kernel_device
from hpc_graph.ops.attention_state import (AttentionState, check_block, check_tensor, finalize,
                                           init_state, output_delta)
from hpc_graph.ops.csr import CSR

__all__ = ["AttentionState", "init_state", "accumulate", "finalize", "output_delta", "backward_block",
           "DotAttention", "dot_attention"]


def _check_inputs(state: AttentionState, block: CSR, q, k_block, v_block, bias_block, codes_block=None) -> None:
    """Validate one block's inputs (``ValueError`` naming the argument)."""
    ref = state.acc
    check_block("block", block, state.num_dst, ref.device)
    check_tensor("q", q, (state.num_dst, state.heads, None), ref.dtype, ref.device)
    check_tensor("k_block", k_block, (block.num_src, state.heads, q.shape[2]), ref.dtype, ref.device)
    check_tensor("v_block", v_block, (block.num_src, state.heads, state.dim), ref.dtype, ref.device)
    if codes_block is not None:
        check_codes(codes_block, block.num_edges, bias_block, state.heads, ref)
    elif bias_block is not None:
        check_tensor("bias_block", bias_block, (block.num_edges, state.heads), ref.dtype, ref.device)


def check_codes(codes: torch.Tensor, num_edges: int, table: torch.Tensor | None, heads: int,
                ref: torch.Tensor, check_range: bool = False) -> None:
    """``codes`` uint8[num_edges] on ``ref``'s device with a bias table float[C, heads] (and, with
    ``check_range``, every code < C); ``ValueError`` otherwise."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.shape != (num_edges,):
        raise ValueError(f"codes: expected uint8[{num_edges}], got "
                         f"{getattr(codes, 'dtype', type(codes).__name__)}{tuple(getattr(codes, 'shape', ()))}")
    if codes.device != ref.device:
        raise ValueError(f"codes: expected device {ref.device}, got {codes.device}")
    if table is None:
        raise ValueError("codes: given without a bias table")
    check_tensor("bias table", table, (None, heads), ref.dtype, ref.device)
    if check_range and num_edges and int(codes.max()) >= table.shape[0]:
        raise ValueError(f"codes: code {int(codes.max())} has no row in the {table.shape[0]}-row bias table")


def _scale(scale: float | None, dim: int) -> float:
    return 1.0 / math.sqrt(dim) if scale is None else float(scale)


def accumulate(state: AttentionState, block: CSR, q: torch.Tensor, k_block: torch.Tensor,
               v_block: torch.Tensor, bias_block: torch.Tensor | None = None,
               scale: float | None = None, codes_block: torch.Tensor | None = None) -> None:
    """Fold one block of sources into ``state`` (in place, no autograd).

    Args:
        state: from :func:`init_state` with ``dim = Dv``.
        block: CSR with ``num_dst`` rows; columns are block-local source ids.
        q: float[num_dst, H, Dk]; k_block: float[block.num_src, H, Dk]; v_block: float[block.num_src, H, Dv].
        bias_block: optional float[block.num_edges, H] score bias in the block's edge order
            (with ``codes_block``: a table float[C, H]).
        scale: score multiplier, default ``1/sqrt(Dk)``.
        codes_block: optional uint8[block.num_edges], each edge's row of the table ``bias_block``.
    """
    if state.finalized:
        raise ValueError("accumulate: state is already finalized")
    _check_inputs(state, block, q, k_block, v_block, bias_block, codes_block)
    get_kernel("dot_attention.accumulate", kernel_device(state.acc))(
        as_array(block.indptr), as_array(block.indices), as_array(q), as_array(k_block), as_array(v_block),
        as_array(bias_block), _scale(scale, q.shape[2]), as_array(state.m), as_array(state.l), as_array(state.acc),
        codes=as_array(codes_block))


def backward_block(state: AttentionState, grad_out: torch.Tensor, delta: torch.Tensor, block: CSR,
                   q: torch.Tensor, k_block: torch.Tensor, v_block: torch.Tensor,
                   bias_block: torch.Tensor | None = None, scale: float | None = None,
                   codes_block: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of one block, recomputing its scores (no autograd).

    Args:
        state: the finalized forward state; grad_out: float[num_dst, H, Dv];
        delta: float[num_dst, H] from :func:`output_delta`;
        block, q, k_block, v_block, bias_block, scale: as passed to :func:`accumulate`.
    Returns:
        ``(grad_q float[num_dst, H, Dk]`` (this block's share, to be summed over
        blocks), ``grad_k_block``, ``grad_v_block``, ``grad_bias_block`` float[E, H]
        (with ``codes_block``: the table's gradient float[C, H]) or ``None`` without bias).
    """
    if not state.finalized:
        raise ValueError("backward_block: the state must be finalized first")
    _check_inputs(state, block, q, k_block, v_block, bias_block, codes_block)
    ref = state.acc
    check_tensor("grad_out", grad_out, tuple(ref.shape), ref.dtype, ref.device)
    check_tensor("delta", delta, tuple(state.m.shape), ref.dtype, ref.device)
    device = kernel_device(ref)
    sc = _scale(scale, q.shape[2])
    grad_q = torch.zeros_like(q)
    grad_k = torch.zeros_like(k_block)
    grad_v = torch.zeros_like(v_block)
    grad_bias = None if bias_block is None else torch.zeros_like(bias_block)
    common = (as_array(q), as_array(k_block), as_array(v_block), as_array(bias_block), sc,
              as_array(state.m), as_array(state.l), as_array(grad_out), as_array(delta))
    codes = as_array(codes_block)
    get_kernel("dot_attention.backward_dst", device)(
        as_array(block.indptr), as_array(block.indices), *common, as_array(grad_q), as_array(grad_bias), codes=codes)
    indptr_t, indices_t, perm = block.csc()
    get_kernel("dot_attention.backward_src", device)(
        as_array(indptr_t), as_array(indices_t), as_array(perm), *common, as_array(grad_k), as_array(grad_v),
        codes=codes)
    return grad_q, grad_k, grad_v, grad_bias


class DotAttention(torch.autograd.Function):
    """Autograd wrapper: one block holding all sources.  Use :func:`dot_attention`."""

    @staticmethod
    def forward(ctx, g: CSR, q, k, v, bias, scale, codes=None):
        state = init_state(g.num_dst, v.shape[1], v.shape[2], v.dtype, v.device)
        accumulate(state, g, q, k, v, bias, scale, codes)
        out = finalize(state)
        ctx.save_for_backward(q, k, v, bias, state.m, state.l, out)
        ctx.g, ctx.scale, ctx.codes = g, scale, codes  # codes: 1 byte per edge, no gradient
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, m, l, out = ctx.saved_tensors
        state = AttentionState(m, l, out, finalized=True)
        grad_out = grad_out.contiguous()
        delta = output_delta(state, grad_out)
        gq, gk, gv, gb = backward_block(state, grad_out, delta, ctx.g, q, k, v, bias, ctx.scale, ctx.codes)
        return None, gq, gk, gv, gb, None, None


def dot_attention(g: CSR, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor | None = None, scale: float | None = None,
                  codes: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse (edge) softmax attention over the in-edges of ``g``; differentiable in q, k, v, bias.

    Args:
        g: CSR, row ``i`` lists the sources attended by destination ``i`` (no self-loops added).
        q: float[Nd, H, Dk]; k: float[Ns, H, Dk]; v: float[Ns, H, Dv].
        bias: optional float[E, H] additive score bias in ``g``'s edge order; with ``codes`` a
            per-head table float[C, H] (edge ``e`` gets ``bias[codes[e]]``; its gradient is the table's).
        scale: score multiplier, default ``1/sqrt(Dk)``.
        codes: optional uint8[E], every code < C (checked).
    Returns:
        float[Nd, H, Dv]; rows without in-edges are 0.
    """
    check_tensor("v", v, (None, None, None), None, getattr(v, "device", "cpu"))
    for name, t in (("q", q), ("k", k)):
        check_tensor(name, t, (None, None, None), v.dtype, v.device)
    if codes is not None:
        check_codes(codes, g.num_edges, bias, v.shape[1], v, check_range=True)
    if bias is not None:
        check_tensor("bias", bias, (None, None), v.dtype, v.device)
        bias = bias.contiguous()
    return DotAttention.apply(g, q.contiguous(), k.contiguous(), v.contiguous(), bias,
                              None if scale is None else float(scale), codes)
