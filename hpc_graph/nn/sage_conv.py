"""``SAGEConv``: GraphSAGE convolution with mean aggregation (Hamilton et al.)."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._linear import act_dropout, input_linear, linear


class SAGEConv(nn.Module):
    """``out_i = lin_l(mean_{j->i} x_j) + lin_r(x_i)`` (PyG ``SAGEConv`` semantics, ``aggr="mean"``).

    A node without in-edges aggregates to zero (its output is ``lin_l.bias + lin_r(x_i)``).
    When ``out_channels < in_channels`` the projection ``lin_l`` is applied before
    the aggregation (exact, since the mean is linear and ``lin_l(0) = bias``):
    fewer features are gathered and travel between ranks. With equal widths the
    aggregation moves the same bytes either way, so the GEMM's row count decides:
    where every input row is an output row (full-graph engines) it is the same, and
    both projections become one autograd node that keeps only its input for the
    backward pass (the aggregated rows are never kept); on a sampled block, whose
    sources outnumber its destinations several times, aggregating first multiplies
    only the destination rows. A sparse (CSR) input is always projected first:
    aggregation takes dense rows.

    Args:
        in_channels: input features F_in.
        out_channels: output features F_out.
        root_weight: add ``lin_r(x_i)``.
        bias: bias of ``lin_l``.

    Parameters mirror PyG's names: ``lin_l.weight``/``lin_l.bias``, ``lin_r.weight``.
    ``forward(graph, x, act=None, p=0.0)``: x float[num_nodes, F_in] (dense or sparse CSR) ->
    float[num_nodes, F_out]; ``act`` (``None`` or ``"relu"``) and dropout ``p`` are applied to ``x`` first
    (fused with the projections where it can, see :func:`~hpc_graph.nn._linear.input_linear`).
    """

    def __init__(self, in_channels: int, out_channels: int, root_weight: bool = True, bias: bool = True):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        if self.lin_r is not None:
            self.lin_r.reset_parameters()

    def forward(self, graph: GraphContext, x: torch.Tensor, act: str | None = None, p: float = 0.0) -> torch.Tensor:
        whole = graph.dst(x) is x  # every input row is an output row
        project_first = (self.out_channels < self.in_channels or x.layout != torch.strided
                         or (whole and self.out_channels == self.in_channels))
        if project_first and whole:
            weights = (self.lin_l.weight,) + ((self.lin_r.weight,) if self.lin_r is not None else ())
            t, *root = input_linear(x, weights, (None,) * len(weights), act, p, ids=graph.row_ids() if p > 0 else None)
            # mean + root + bias in the aggregation's own pass (no aggregate temporary)
            return graph.aggregate_combine(t, "mean", self_rows=root[0] if root else None, bias=self.lin_l.bias)
        if act is not None or p > 0.0:  # mini-batch blocks: the root term reads only the destination rows
            x = act_dropout(x, act, p, graph.row_ids() if p > 0 else None)
        if project_first:
            out = graph.aggregate(linear(x, self.lin_l.weight), "mean")
            if self.lin_l.bias is not None:
                out = out + self.lin_l.bias
        else:
            out = self.lin_l(graph.aggregate(x, "mean"))
        if self.lin_r is not None:
            out = out + linear(graph.dst(x), self.lin_r.weight)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, root_weight={self.lin_r is not None}"
