"""``RGCN``: relational graph convolution with basis decomposition (Schlichtkrull et al., ESWC 2018)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import as_dense


class RGCNConv(nn.Module):
    """One R-GCN layer (PyG ``RGCNConv`` semantics, ``aggr="mean"``)::

        out_i = x_i W_root + b + sum_r mean_{j -r-> i} (x_j) W_r              float[N, F_out]
        W_r   = sum_b comp[r, b] V_b      (basis decomposition, num_bases = B)

    ``mean`` is over the in-edges of type ``r`` of node ``i`` in the whole graph (a relation
    without such edges contributes 0). The relation-wise means come from one call of
    :meth:`GraphContext.aggregate_relations` (one halo exchange for all relations, one pass
    over the edges: see :func:`hpc_graph.ops.csr.relational_csr`), then one GEMM
    ``[N, R * F_in] @ [R * F_in, F_out]``. With bases and ``B * F_out < F_in`` the layer
    projects first, ``x V_b`` float[N, B * F_out], and aggregates that (fewer columns to move
    and sum), then mixes with ``comp``: the same function, cheaper on wide inputs.

    Args:
        in_channels, out_channels: F_in, F_out.
        num_relations: edge types R.
        num_bases: B (None: one full weight per relation).
        root_weight, bias: the self term ``x_i W_root`` and the bias.

    Parameters (PyG's names): ``weight`` float[R, F_in, F_out] or ``weight`` float[B, F_in, F_out]
    (the bases) with ``comp`` float[R, B]; ``root`` float[F_in, F_out]; ``bias`` float[F_out].
    ``forward(graph, x)``: x float[N, F_in] (dense or sparse CSR) -> float[N, F_out].
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 root_weight: bool = True, bias: bool = True):
        super().__init__()
        self.in_channels = positive_int("in_dim", in_channels)
        self.out_channels = positive_int("hidden", out_channels)
        self.num_relations = positive_int("num_relations", num_relations)
        self.num_bases = None if num_bases is None else positive_int("num_bases", num_bases)
        k = self.num_relations if self.num_bases is None else self.num_bases
        self.weight = nn.Parameter(torch.empty(k, in_channels, out_channels))
        self.comp = None if self.num_bases is None else nn.Parameter(torch.empty(self.num_relations, self.num_bases))
        self.root = nn.Parameter(torch.empty(in_channels, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        for p in (self.comp, self.root):
            if p is not None:
                glorot_(p)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """float[R, F_in, F_out]: ``W_r`` (from the bases when ``num_bases`` is set)."""
        if self.comp is None:
            return self.weight
        return torch.einsum("rb,bio->rio", self.comp, self.weight)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        r, f_in, f_out = self.num_relations, self.in_channels, self.out_channels
        if graph.num_relations != r:
            raise ValueError(f"RGCNConv: built for {r} relations but the graph has {graph.num_relations} "
                             "edge types (/graph/edge_type)")
        if self.comp is not None and self.num_bases * f_out < f_in:
            b = self.num_bases
            h = linear(x, self.weight.permute(0, 2, 1).reshape(b * f_out, f_in))  # [N, B * F_out]
            agg = graph.aggregate_relations(h, "mean").view(-1, r, b, f_out)
            out = torch.einsum("nrbo,rb->no", agg, self.comp)
        else:
            agg = graph.aggregate_relations(as_dense(x), "mean")
            out = agg.reshape(agg.shape[0], r * f_in) @ self.relation_weights().reshape(r * f_in, f_out)
        if self.root is not None:
            out = out + linear(graph.dst(x), self.root.t())
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, "
                f"num_bases={self.num_bases}")


class RGCN(nn.Module):
    """A stack of :class:`RGCNConv` layers for node classification on a typed graph.

    Per layer ``l``: ``h = relu(conv_l(graph, dropout(h)))`` (no ReLU after the last layer,
    which outputs the class logits). Widths ``in_dim -> hidden -> ... -> out_dim``.

    Message passing: layer ``l`` is ``graph.layer(l)``; relation-wise aggregation needs a
    full graph (engines ``single``, ``dp``, ``sar``, ``sylvie``): a sampled block is refused.
    ``message_passing_layers = num_layers``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths.
        num_relations: edge types R of the graph (the engine's ``graph.num_relations``).
        num_layers: R-GCN layers (>= 1).
        num_bases: basis matrices per layer (None: a full weight per relation).
        dropout: dropout probability before every layer.

    ``forward(graph, x)``: x float[N, in_dim] (dense or sparse CSR) -> float[N, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_relations: int, num_layers: int = 2,
                 num_bases: int | None = None, dropout: float = 0.5):
        super().__init__()
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers), ("num_relations", num_relations)):
            positive_int(field, value)
        if num_bases is not None:
            positive_int("num_bases", num_bases)
        self.dropout = number_in("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.message_passing_layers = int(num_layers)
        widths = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(RGCNConv(a, b, num_relations, num_bases) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        h = x
        last = len(self.convs) - 1
        for layer, conv in enumerate(self.convs):
            g = graph.layer(layer)
            if g is not graph:
                raise ValueError("model.name: 'rgcn' needs a full-graph engine (single, dp, sar, sylvie); "
                                 "relation-wise aggregation over sampled blocks is not supported")
            h = conv(g, dropout(h, self.dropout, self.training, g.row_ids()))
            if layer != last:
                h = F.relu(h)
        return h
