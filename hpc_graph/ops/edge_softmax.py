"""``edge_softmax``: differentiable softmax of edge scores over each destination's in-edges.

``out[e, h] = exp(s[e, h]) / sum_{e' -> dst(e)} exp(s[e', h])``, computed with
the row maximum subtracted (stable for large scores). A destination whose
scores are all ``-inf`` gets 0 on its edges.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import check_graph, check_tensor, empty, kernel
from hpc_graph.ops.csr import CSR


def edge_softmax(g: CSR, scores: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` over the in-edges of every destination, per head.

    Args:
        g: graph with ``E`` edges.
        scores: float32/float64 ``[E, H]`` (or ``[E]``) in ``g``'s edge order.
    Returns:
        Same shape as ``scores``; every non-empty row sums to 1 per head.
        Differentiable w.r.t. ``scores``.
    Raises:
        ValueError: shape, dtype, device or graph indices inconsistent (before any kernel runs).
    """
    op = "edge_softmax"
    check_graph(g, op)
    check_tensor(op, "scores", scores, g, g.num_edges, (1, 2))
    flat = scores.dim() == 1
    out = _EdgeSoftmax.apply(g, scores.unsqueeze(1) if flat else scores)
    return out.squeeze(1) if flat else out


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g: CSR, scores: torch.Tensor) -> torch.Tensor:
        out = empty(tuple(scores.shape), scores.dtype, scores.device)
        kernel("edge_softmax.edge_softmax", scores)(as_array(g.indptr), as_array(scores), as_array(out))
        ctx.g = g
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        (out,) = ctx.saved_tensors
        grad = empty(tuple(out.shape), out.dtype, out.device)
        kernel("edge_softmax.edge_softmax_backward", out)(as_array(ctx.g.indptr), as_array(out),
                                                          as_array(grad_out.contiguous()), as_array(grad))
        return None, grad
