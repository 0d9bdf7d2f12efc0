"""``spmm``: differentiable sparse-dense aggregation over a :class:`CSR` (sum / mean / max).

``out[i] = reduce_{e=(j->i)} w_e * x[j]`` over the in-edges of each destination
row ``i``. Forward and backward run numba kernels (CPU or CUDA twin by device):
the backward w.r.t. ``x`` walks the cached transposed copy of the graph (no
atomics), the gradient w.r.t. the edge weights is an SDDMM. No ``E x F``
intermediate is ever allocated; ``max`` keeps an int64 ``argmax[num_dst, F]``.
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from hpc_graph.ops._bridge import as_array, get_kernel
from hpc_graph.ops._kernel_args import (absent, check_graph, check_tensor, csc, empty, gathered,
                                        inv_degree, kernel, no_eids)
from data_io.memory import env_bytes
from hpc_graph.ops.csr import CSR

REDUCES = ("sum", "mean", "max")


#: CPU sum/mean SpMM: source rows are processed in column ranges of about this many bytes of ``x``
#: (the last-level cache of the development machine's CPU) when ``x`` is at least twice as large;
#: see :func:`numba_kernels.cpu.spmm.spmm_sum_blocked`. 0 turns the blocking off.
#: ``HPC_GRAPH_SPMM_BLOCK_BYTES`` (e.g. ``256MiB``, ``0``) sets it per machine
#: (``benchmarks/bench_spmm_blocks.py`` shows which suits a machine).
BLOCK_BYTES = env_bytes("HPC_GRAPH_SPMM_BLOCK_BYTES", 32 << 20, 0)
#: at most this many ranges: every range a destination row has edges in costs one read and one
#: write of that output row, so past ~8 ranges the output traffic eats the gain (R-MAT scale 20,
#: F = 128: 8 ranges 0.62 s, 16 ranges 0.75 s, unblocked 0.93 s on one machine; on another 2 ranges
#: were best and 8 cost 12 %). ``HPC_GRAPH_SPMM_MAX_BLOCKS`` sets it.
MAX_BLOCKS = env_bytes("HPC_GRAPH_SPMM_MAX_BLOCKS", 8, 1)


def _num_blocks(num_src: int, row_bytes: int) -> int:
    if BLOCK_BYTES <= 0:
        return 0
    return min(int(round(num_src * row_bytes / BLOCK_BYTES)), MAX_BLOCKS)


def _sum_kernel(indptr, indices, eids, w_arr, scale, x_arr, out_arr, mean: bool, cache: dict, key,
                device, num_src: int, epilogue=None) -> None:
    """Run ``spmm_sum`` over (indptr, indices), column-blocked on the CPU when ``x`` outgrows the cache.

    The blocked order (``column_blocks``) is built once per graph and direction (``cache[key]``).
    ``epilogue``: the kernels' ``(row_scale, self_x, self_scale, bias)`` arrays, or None.
    """
    nb = _num_blocks(num_src, x_arr.strides[0]) if device.type in ("cpu", "meta") else 0  # meta: a CPU run
    if nb < 2:
        get_kernel("spmm.spmm_sum", device.type)(indptr, indices, eids, w_arr, scale, x_arr, out_arr, mean,
                                                 epilogue)
        return
    weighted = w_arr.shape[0] > 0
    ck = ("spmm.blocked", key, nb, weighted)
    if ck not in cache:
        cache[ck] = get_kernel("spmm.column_blocks", device)(indptr, indices, eids, num_src, nb, with_eids=weighted)
    bptr, bidx, beid = cache[ck]
    get_kernel("spmm.spmm_sum_blocked", device)(indptr, bptr, bidx, beid, nb, w_arr, scale, x_arr, out_arr, mean,
                                        epilogue)


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


def spmm_fused(g: CSR, x: torch.Tensor, reduce: str = "sum", *, scale: torch.Tensor | None = None,
               self_loop: bool = False, self_rows: torch.Tensor | None = None,
               self_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``out = scale * reduce(x) + self_scale * S + bias`` in one pass over the rows (no temporaries).

    ``reduce(x)`` is :func:`spmm` (``"sum"`` or ``"mean"``, unweighted); ``S`` is ``x[:num_dst]``
    (``self_loop``: the destinations are the first sources, as on a full graph or a halo layout)
    or ``self_rows``. GCN's layer output is ``scale = self_scale = d^-1/2``, ``self_loop``; SAGE's
    is ``mean`` plus ``self_rows = x W_r``. The backward pass is one transposed SpMM with the
    scales folded in (and the self loop added in the same pass); ``scale`` and ``self_scale``
    are constants (no gradient).

    Args:
        g: graph, ``num_dst`` rows over ``num_src`` sources.
        x: float[num_src, F] or float[num_src, H, D].
        scale, self_scale: float[num_dst] or None.
        self_rows: float[num_dst, ...] as the output, or None (exclusive with ``self_loop``).
        bias: float[F] (or float[H, D]) or None.
    Returns:
        float[num_dst, ...] like ``x``; differentiable w.r.t. ``x``, ``self_rows`` and ``bias``.
    Raises:
        ValueError: bad shapes, dtypes or devices (checked before any kernel runs).
    """
    op = "spmm_fused"
    check_graph(g, op)
    if reduce not in ("sum", "mean"):
        raise ValueError(f"{op}: reduce must be 'sum' or 'mean'; got {reduce!r}")
    check_tensor(op, "x", x, g, g.num_src, (2, 3))
    if self_loop and self_rows is not None:
        raise ValueError(f"{op}: give self_loop or self_rows, not both")
    if self_loop and g.num_src < g.num_dst:
        raise ValueError(f"{op}: self_loop needs the destinations among the first sources "
                         f"(num_src {g.num_src} < num_dst {g.num_dst})")
    for name, t in (("scale", scale), ("self_scale", self_scale)):
        if t is not None:
            check_tensor(op, name, t, g, g.num_dst, (1,))
            if t.dtype != x.dtype:
                raise ValueError(f"{op}: {name} dtype {t.dtype} differs from x dtype {x.dtype}")
    tail = tuple(x.shape[1:])
    if self_rows is not None and (tuple(self_rows.shape) != (g.num_dst,) + tail or self_rows.dtype != x.dtype
                                  or self_rows.device != x.device):
        raise ValueError(f"{op}: self_rows must be {x.dtype} {(g.num_dst,) + tail} on {x.device}, got "
                         f"{self_rows.dtype} {tuple(self_rows.shape)} on {self_rows.device}")
    row = math.prod(tail)  # values per row (x may have no rows)
    if bias is not None and (bias.numel() != row or bias.dtype != x.dtype or bias.device != x.device):
        raise ValueError(f"{op}: bias must hold {row} {x.dtype} values on {x.device}, got "
                         f"{bias.dtype} {tuple(bias.shape)} on {bias.device}")
    x3 = x.unsqueeze(1) if x.dim() == 2 else x
    s3 = None if self_rows is None else self_rows.reshape((g.num_dst,) + tuple(x3.shape[1:]))
    out = _SpMMFused.apply(g, x3, reduce == "mean", scale, bool(self_loop), s3, self_scale,
                           None if bias is None else bias.reshape(-1))
    return out.squeeze(1) if x.dim() == 2 else out


class _SpMMFused(torch.autograd.Function):
    """:func:`spmm_fused`; ``x`` [Ns,H,D], ``self_rows`` [Nd,H,D] or None, ``bias`` [H*D] or None."""

    @staticmethod
    def forward(ctx, g: CSR, x, mean: bool, scale, self_loop: bool, self_rows, self_scale, bias):
        out = empty((g.num_dst,) + tuple(x.shape[1:]), x.dtype, x.device)
        sx = x[:g.num_dst] if self_loop else self_rows
        epi = tuple(None if t is None else as_array(t) for t in (scale, sx, self_scale, bias))
        _sum_kernel(as_array(g.indptr), as_array(g.indices), no_eids(x.device), absent(x.dtype, x.device, 2),
                    absent(x.dtype, x.device, 1), as_array(x), as_array(out), mean, g._cache, "csr", x.device,
                    g.num_src, epi)
        ctx.g, ctx.mean, ctx.self_loop = g, mean, self_loop
        ctx.save_for_backward(scale, self_scale)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        g = ctx.g
        scale, self_scale = ctx.saved_tensors
        go = grad_out.contiguous()
        grad_x = grad_self = grad_b = None
        if ctx.needs_input_grad[1]:
            indptr_t, indices_t, _ = csc(g, perm=False)
            col = scale
            if ctx.mean:
                col = inv_degree(g, go.dtype) if col is None else col * inv_degree(g, go.dtype)
            grad_x = empty((g.num_src,) + tuple(go.shape[1:]), go.dtype, go.device)
            gx = gathered(go, g.num_edges)
            # x[j] <- sum_{i: j->i} col_i go_i (+ self_scale_j go_j for j < num_dst: the self loop's share)
            epi = (None, gx, None if self_scale is None else as_array(self_scale), None) if ctx.self_loop else None
            key = "csr" if indices_t is g.indices else "csc"
            _sum_kernel(as_array(indptr_t), as_array(indices_t), no_eids(go.device), absent(go.dtype, go.device, 2),
                        absent(go.dtype, go.device, 1) if col is None else as_array(col), gx, as_array(grad_x),
                        False, g._cache, key, go.device, g.num_dst, epi)
        if ctx.needs_input_grad[5]:
            grad_self = go if self_scale is None else go * self_scale.view(-1, 1, 1)
        if ctx.needs_input_grad[7]:
            grad_b = go.sum(0).reshape(-1)
        return None, grad_x, None, None, None, grad_self, None, grad_b


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
