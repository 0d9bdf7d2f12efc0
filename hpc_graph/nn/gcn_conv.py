"""``GCNConv``: graph convolution with symmetric normalisation and self loops (Kipf & Welling)."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._linear import input_linear


class GCNConv(nn.Module):
    """``out = D^-1/2 (A + I) D^-1/2 X W + b`` with ``D = in_degree + 1`` (PyG ``GCNConv`` semantics).

    Computed as ``h = (X W) * dinv``; ``out = (aggregate(h, "sum") + h) * dinv + b``, the latter as one
    :meth:`~hpc_graph.graph.base.GraphContext.aggregate_combine` (one fused kernel pass on ``single``/``dp``).
    Scaling rows before the aggregation means every source row (owned or a halo
    copy) already carries its owner's ``deg^-1/2``, so no halo degrees are needed.

    Args:
        in_channels: input features F_in.
        out_channels: output features F_out.
        bias: add a learnable bias.

    Parameters mirror PyG's names: ``lin.weight`` float[F_out, F_in], ``bias`` float[F_out].
    ``forward(graph, x, act=None, p=0.0)``: x float[num_nodes, F_in] (dense or sparse CSR) ->
    float[num_nodes, F_out]; ``act`` (``None`` or ``"relu"``) and dropout ``p`` are applied to ``x`` first,
    fused with the projection (:func:`~hpc_graph.nn._linear.input_linear`: only ``x`` is kept for the
    backward pass).
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, graph: GraphContext, x: torch.Tensor, act: str | None = None, p: float = 0.0) -> torch.Tensor:
        dinv = (graph.in_degree().to(device=x.device, dtype=x.dtype) + 1.0).rsqrt()
        h = input_linear(x, (self.lin.weight,), (None,), act, p, row_scale=dinv.unsqueeze(1),
                         ids=graph.row_ids() if p > 0 else None)[0]
        d = graph.dst(dinv)
        # (aggregate(h) + h) * dinv + b in the aggregation's own pass (no aggregate temporary)
        return graph.aggregate_combine(h, "sum", scale=d, self_loop=True, self_scale=d, bias=self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, bias={self.bias is not None}"
