"""``GATConv``: graph attention (GATv1, Veličković et al.) over the engine's fused attention."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._linear import act_dropout, linear

_SEED_MOD = 2**31 - 1
PROJECTIONS = ("linear", "relu")


class GATConv(nn.Module):
    """Multi-head graph attention.

    ``z = x W`` viewed as [N, H, D]; ``s_src = (z * att_src).sum(-1)``,
    ``s_dst = (z * att_dst).sum(-1)``; the graph computes
    ``out_i = sum_j softmax_j(LeakyReLU(s_dst_i + s_src_j)) z_j`` over in-edges
    (plus the self loop); heads are concatenated ([N, H*D]) or averaged ([N, D]);
    then the bias is added.

    ``projection="relu"`` is DistGNN-MB's modified GAT: the bias and a ReLU go inside the projection,
    ``z = ReLU(x W + b)``, and the attention and the aggregation run on that ``z`` (no bias after the
    aggregation); ``lin`` then has a bias and ``bias`` is None.

    Attention dropout is drawn by the engine from a hash of a per-call seed and
    the edge's global end points, so every engine drops the same coefficients.
    The per-call seed is ``(self.seed, number of training calls)``: identical on
    all ranks because ``self.seed`` is drawn from torch's RNG at construction
    (same global seed on every rank) and every rank makes the same calls.

    Args:
        in_channels: input features F_in.
        out_channels: features per head D.
        heads: attention heads H.
        concat: concatenate heads (else average them).
        negative_slope: LeakyReLU slope of the attention logits.
        attn_dropout: probability of dropping an attention coefficient while training.
        add_self_loops: attend to the node itself too.
        bias: add a learnable bias (float[H*D] when concatenating, else float[D]).
        projection: ``"linear"`` (GAT's ``z = x W``) or ``"relu"`` (``z = ReLU(x W + b)``, DistGNN-MB).

    Parameters mirror PyG's names: ``lin.weight`` float[H*D, F_in], ``att_src``/``att_dst``
    float[1, H, D], ``bias``.
    ``forward(graph, x, act=None, p=0.0)``: x float[num_nodes, F_in] (dense or sparse CSR) -> float[num_nodes,
    H*D or D]; ``act`` (None, ``"relu"`` or ``"elu"``, dense ``x`` only) and feature dropout ``p`` are applied to
    ``x`` first, inside the graph's :meth:`~hpc_graph.graph.base.GraphContext.gat_projected` (which may keep
    only ``x`` for the backward pass and recompute the rest).
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attn_dropout: float = 0.0, add_self_loops: bool = True,
                 bias: bool = True, projection: str = "linear"):
        super().__init__()
        if projection not in PROJECTIONS:
            raise ValueError(f"model.gat_projection: one of {', '.join(PROJECTIONS)}, not {projection!r}")
        self.projection = projection
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.negative_slope = float(negative_slope)
        self.attn_dropout = float(attn_dropout)
        self.add_self_loops = add_self_loops
        inside = projection == "relu"
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=inside)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias and not inside else None
        self.seed = int(torch.randint(0, _SEED_MOD, (1,)).item())
        self._calls = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.lin.weight)
        if self.lin.bias is not None:
            nn.init.zeros_(self.lin.bias)
        glorot_(self.att_src)
        glorot_(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _next_seed(self) -> int:
        self._calls += 1
        return (self.seed * 1_000_003 + self._calls) % _SEED_MOD

    def forward(self, graph: GraphContext, x: torch.Tensor, act: str | None = None, p: float = 0.0) -> torch.Tensor:
        h, d = self.heads, self.out_channels
        q = self.attn_dropout if self.training else 0.0
        seed = self._next_seed() if q > 0 else 0
        kw = dict(negative_slope=self.negative_slope, attn_dropout=q, seed=seed, add_self_loops=self.add_self_loops)
        if self.projection == "relu":  # DistGNN-MB: bias and ReLU inside the projection
            x = act_dropout(x, act, p, graph.row_ids() if p > 0 else None)
            z = torch.relu(linear(x, self.lin.weight, self.lin.bias)).view(-1, h, d)
            out = graph.gat(z, (z * self.att_src).sum(-1), (graph.dst(z) * self.att_dst).sum(-1), **kw)
        elif x.layout == torch.strided:  # the graph may fuse it all (less kept for backward)
            out = graph.gat_projected(x, self.lin.weight, self.att_src, self.att_dst, act=act, p=p, **kw)
        else:  # sparse CSR input features
            x = act_dropout(x, act, p, graph.row_ids() if p > 0 else None)
            z = linear(x, self.lin.weight).view(-1, h, d)
            out = graph.gat(z, (z * self.att_src).sum(-1), (graph.dst(z) * self.att_dst).sum(-1), **kw)
        out = out.reshape(-1, h * d) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, "
                f"attn_dropout={self.attn_dropout}" + (", projection='relu'" if self.projection == "relu" else ""))
