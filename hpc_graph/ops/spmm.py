"""``spmm``: differentiable sparse-dense aggregation over a :class:`CSR` (sum / mean / max).

``out[i] = reduce_{e=(j->i)} w_e * x[j]`` over the in-edges of each destination
row ``i``. Forward and backward run numba kernels (CPU or CUDA twin by device):
the backward w.r.t. ``x`` walks the cached transposed copy of the graph (no
atomics), the gradient w.r.t. the edge weights is an SDDMM. No ``E x F``
intermediate is ever allocated; ``max`` keeps an int64 ``argmax[num_dst, F]``.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import (absent, check_graph, check_tensor, csc, empty, gathered,
                                        inv_degree, kernel, no_eids)
from hpc_graph.ops.csr import CSR
from numba_kernels import get_kernel

REDUCES = ("sum", "mean", "max")

#: CPU sum/mean SpMM: source rows are processed in column ranges of about this many bytes of ``x``
#: (the last-level cache of the development machine's CPU) when ``x`` is at least twice as large;
#: see :func:`numba_kernels.cpu.spmm.spmm_sum_blocked`. 0 turns the blocking off.
BLOCK_BYTES = 32 << 20
#: at most this many ranges: every range a destination row has edges in costs one read and one
#: write of that output row, so past ~8 ranges the output traffic eats the gain (R-MAT scale 20,
#: F = 128: 8 ranges 0.62 s, 16 ranges 0.75 s, unblocked 0.93 s)
MAX_BLOCKS = 8


def _num_blocks(num_src: int, row_bytes: int) -> int:
    if BLOCK_BYTES <= 0:
        return 0
    return min(int(round(num_src * row_bytes / BLOCK_BYTES)), MAX_BLOCKS)


def _sum_kernel(indptr, indices, eids, w_arr, scale, x_arr, out_arr, mean: bool, cache: dict, key,
                device, num_src: int) -> None:
    """Run ``spmm_sum`` over (indptr, indices), column-blocked on the CPU when ``x`` outgrows the cache.

    The blocked order (``column_blocks``) is built once per graph and direction (``cache[key]``).
    """
    nb = _num_blocks(num_src, x_arr.strides[0]) if device.type == "cpu" else 0
    if nb < 2:
        get_kernel("spmm.spmm_sum", device.type)(indptr, indices, eids, w_arr, scale, x_arr, out_arr, mean)
        return
    weighted = w_arr.shape[0] > 0
    ck = ("spmm.blocked", key, nb, weighted)
    if ck not in cache:
        cache[ck] = get_kernel("spmm.column_blocks")(indptr, indices, eids, num_src, nb, with_eids=weighted)
    bptr, bidx, beid = cache[ck]
    get_kernel("spmm.spmm_sum_blocked")(indptr, bptr, bidx, beid, nb, w_arr, scale, x_arr, out_arr, mean)


def spmm(g: CSR, x: torch.Tensor, reduce: str = "sum",
         edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Aggregate source rows over each destination's in-edges.

    Args:
        g: graph, ``num_dst`` rows over ``num_src`` source columns.
        x: float32/float64 ``[num_src, F]``, or ``[num_src, H, D]`` for multi-head
            features; on the graph's device.
        reduce: ``"sum"``, ``"mean"`` (sum divided by the number of in-edges)
            or ``"max"`` (elementwise; the gradient goes to the first maximal edge).
            Rows without in-edges give 0 for all three.
        edge_weight: optional ``[E]`` weights (or ``[E, H]``, one per head, with
            3-D ``x``), same dtype as ``x``, in ``g``'s edge order; multiplies
            each message before the reduction. ``g.edge_weight`` is *not* applied
            implicitly: pass it here.
    Returns:
        ``[num_dst, F]`` (or ``[num_dst, H, D]``), differentiable w.r.t. ``x``
        and ``edge_weight``.
    Raises:
        ValueError: bad ``reduce``, shapes, dtypes, devices or graph indices
            (checked before any kernel runs).
    """
    op = "spmm"
    check_graph(g, op)
    if reduce not in REDUCES:
        raise ValueError(f"{op}: reduce must be one of {', '.join(REDUCES)}; got {reduce!r}")
    check_tensor(op, "x", x, g, g.num_src, (2, 3))
    x3 = x.unsqueeze(1) if x.dim() == 2 else x
    w2 = None
    if edge_weight is not None:
        check_tensor(op, "edge_weight", edge_weight, g, g.num_edges, (1, 2))
        if edge_weight.dtype != x.dtype:
            raise ValueError(f"{op}: edge_weight dtype {edge_weight.dtype} differs from x dtype {x.dtype}")
        if edge_weight.dim() == 2 and edge_weight.shape[1] not in (1, x3.shape[1]):
            raise ValueError(f"{op}: edge_weight shape {tuple(edge_weight.shape)} must be [E] or "
                             f"[E, H] with H={x3.shape[1]} heads of x")
        w2 = edge_weight.reshape(g.num_edges, -1) if edge_weight.dim() == 1 else edge_weight
    if reduce == "max":
        out = _SpMMMax.apply(g, x3, w2)
    else:
        out = _SpMMSum.apply(g, x3, w2, reduce == "mean")
    return out.squeeze(1) if x.dim() == 2 else out


class _SpMMSum(torch.autograd.Function):
    """Sum / mean aggregation; ``x`` [Ns,H,D], ``w`` [E,H|1] or None."""

    @staticmethod
    def forward(ctx, g: CSR, x: torch.Tensor, w: torch.Tensor | None, mean: bool) -> torch.Tensor:
        out = empty((g.num_dst,) + tuple(x.shape[1:]), x.dtype, x.device)
        w_arr = absent(x.dtype, x.device, 2) if w is None else as_array(w)
        _sum_kernel(as_array(g.indptr), as_array(g.indices), no_eids(x.device), w_arr, absent(x.dtype, x.device, 1),
                    as_array(x), as_array(out), mean, g._cache, "csr", x.device, g.num_src)
        ctx.g = g
        ctx.mean = mean
        need_w = w is not None and ctx.needs_input_grad[2]
        ctx.save_for_backward(x if need_w else None, w)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        g, mean = ctx.g, ctx.mean
        x, w = ctx.saved_tensors
        go = grad_out.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            indptr_t, indices_t, perm = csc(g, perm=w is not None)
            grad_x = empty((g.num_src,) + tuple(go.shape[1:]), go.dtype, go.device)
            scale = as_array(inv_degree(g, go.dtype)) if mean else absent(go.dtype, go.device, 1)
            if w is None:
                eids, w_arr = no_eids(go.device), absent(go.dtype, go.device, 2)
            else:
                eids, w_arr = as_array(perm), as_array(w)
            # a symmetric graph's transpose is the CSR itself: its unweighted blocked copy serves both directions
            key = "csr" if (w is None and indices_t is g.indices) else "csc"
            _sum_kernel(as_array(indptr_t), as_array(indices_t), eids, w_arr, scale, gathered(go, g.num_edges),
                        as_array(grad_x), False, g._cache, key, go.device, g.num_dst)
        if ctx.needs_input_grad[2]:
            gs = go * inv_degree(g, go.dtype)[:, None, None] if mean else go
            dots = empty((g.num_edges, go.shape[1]), go.dtype, go.device)
            kernel("sddmm.sddmm", go)(as_array(g.indptr), as_array(g.indices), as_array(gs),
                                      as_array(x), as_array(dots))
            grad_w = dots if w.shape[1] == dots.shape[1] else dots.sum(1, keepdim=True)
        return None, grad_x, grad_w, None


class _SpMMMax(torch.autograd.Function):
    """Max aggregation with saved argmax; ``x`` [Ns,H,D], ``w`` [E,H|1] or None."""

    @staticmethod
    def forward(ctx, g: CSR, x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        shape = (g.num_dst,) + tuple(x.shape[1:])
        out = empty(shape, x.dtype, x.device)
        argmax = empty(shape, torch.int64, x.device)
        w_arr = absent(x.dtype, x.device, 2) if w is None else as_array(w)
        kernel("spmm.spmm_max", x)(as_array(g.indptr), as_array(g.indices), no_eids(x.device), w_arr,
                                   as_array(x), as_array(out), as_array(argmax))
        ctx.g = g
        need_w = w is not None and ctx.needs_input_grad[2]
        ctx.save_for_backward(argmax, x if need_w else None, w)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        g = ctx.g
        argmax, x, w = ctx.saved_tensors
        go = grad_out.contiguous()
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            indptr_t, indices_t, perm = csc(g)
            grad_x = empty((g.num_src,) + tuple(go.shape[1:]), go.dtype, go.device)
            w_arr = absent(go.dtype, go.device, 2) if w is None else as_array(w)
            kernel("spmm.spmm_max_backward", go)(as_array(indptr_t), as_array(indices_t), as_array(perm),
                                                 w_arr, as_array(argmax), gathered(go, g.num_edges),
                                                 as_array(grad_x))
        if ctx.needs_input_grad[2]:
            grad_w = empty(tuple(w.shape), go.dtype, go.device)
            kernel("spmm.spmm_max_weight_grad", go)(as_array(g.indptr), as_array(g.indices),
                                                    as_array(argmax), as_array(x), as_array(go),
                                                    as_array(grad_w))
        return None, grad_x, grad_w
