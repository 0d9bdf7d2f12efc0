"""Pieces shared by the graph transformers (``gt``, ``graphormer``): the attention schedule and one layer.

The layers call only :meth:`~hpc_graph.graph.base.GraphContext.attention`; which pairs a token
attends to (the sparse pattern, or every node in dense mode) is the engine's business.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._init import glorot_

#: attention schedules: ``sparse`` every layer, ``dense`` every layer, ``every_k_steps`` (dense on every
#: layer of one training step in ``dense_every``, sparse otherwise), ``dense_layers`` (the listed layers dense)
SCHEDULES = ("sparse", "dense", "every_k_steps", "dense_layers")


class AttentionSchedule:
    """Which attention mode layer ``l`` uses at training step ``s`` (TorchGT's dual-interleaved attention).

    The step is the model's own counter of training forward passes, identical on every rank (every
    rank runs the same steps), so all ranks switch modes together. Evaluation uses the mode of the
    schedule's sparse steps unless the schedule is ``dense`` or ``dense_layers``.
    """

    def __init__(self, kind: str = "sparse", dense_every: int = 10, dense_layers: tuple[int, ...] = (),
                 far_prior: bool = True):
        if kind not in SCHEDULES:
            raise ValueError(f"model.attention: must be one of {', '.join(map(repr, SCHEDULES))}, got {kind!r}")
        if isinstance(dense_every, bool) or not isinstance(dense_every, int) or dense_every < 1:
            raise ValueError(f"model.dense_every: must be a positive integer, got {dense_every!r}")
        if not isinstance(far_prior, bool):
            raise ValueError(f"model.far_prior: must be true or false, got {far_prior!r}")
        self.kind, self.every, self.layers = kind, int(dense_every), tuple(int(x) for x in dense_layers)
        self.far_prior = far_prior  # dense layers: the count prior on the far pairs (GraphContext.attention)

    def mode(self, layer: int, step: int, training: bool) -> str:
        if self.kind == "dense" or (self.kind == "dense_layers" and layer in self.layers):
            return "dense"
        if self.kind == "every_k_steps" and training and step % self.every == 0:
            return "dense"
        return "sparse"


class TransformerLayer(nn.Module):
    """Multi-head graph attention + feed-forward block, pre-norm (``pre_norm``) or post-norm.

    ``forward(graph, h, *, bias, mode, global_token)``: h float[T, dim] -> float[T, dim], with
    ``q, k, v = h W_q, h W_k, h W_v`` split into ``heads`` heads of ``dim / heads`` features, attention
    from ``graph.attention``, output projection, dropout, residual, then a 2-layer ReLU/GELU FFN
    (width ``ffn_mult * dim``) with its own residual. ``bias``: float[NUM_CODES, heads] or None.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, attn_dropout: float = 0.0,
                 pre_norm: bool = True, ffn_mult: int = 2, activation: str = "gelu"):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model.heads: must divide the hidden width {dim}, got {heads}")
        if attn_dropout:
            raise ValueError("model.attn_dropout: not supported by the graph transformers (use model.dropout)")
        self.dim, self.heads, self.dropout, self.pre_norm = dim, heads, float(dropout), bool(pre_norm)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)
        self.act = F.gelu if activation == "gelu" else F.relu
        for lin in (self.qkv, self.out, self.ffn1, self.ffn2):
            glorot_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, graph: GraphContext, h: torch.Tensor, *, bias: torch.Tensor | None = None,
                mode: str = "sparse", global_token: bool = False, far_prior: bool = True) -> torch.Tensor:
        T = h.shape[0]
        a = self.norm1(h) if self.pre_norm else h
        q, k, v = self.qkv(a).view(T, 3, self.heads, self.dim // self.heads).unbind(1)
        att = graph.attention(q, k, v, bias=bias, mode=mode, global_token=global_token,
                              far_prior=far_prior).reshape(T, self.dim)
        ids = self._token_ids(graph, T, global_token)
        h = h + self._drop(self.out(att), ids)
        if not self.pre_norm:
            h = self.norm1(h)
        a = self.norm2(h) if self.pre_norm else h
        h = h + self._drop(self.ffn2(self._drop(self.act(self.ffn1(a)), ids)), ids)
        return h if self.pre_norm else self.norm2(h)

    def _token_ids(self, graph: GraphContext, rows: int, global_token: bool) -> torch.Tensor | None:
        """The ids keying the dropout masks of the ``rows`` token rows: the nodes' dataset ids, and for the one
        global token appended after them the id ``global_num_nodes`` (the row it has on one process, where the
        ids are the positions); None (keyed on the positions) where the graph gives no ids or other rows."""
        if not (self.training and self.dropout > 0):
            return None
        ids = graph.row_ids()
        if ids is not None and global_token and rows == ids.shape[0] + 1:
            ids = torch.cat([ids, ids.new_full((1,), int(graph.global_num_nodes))])
        return ids if ids is not None and ids.shape[0] == rows else None

    def _drop(self, t: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        # no call at p = 0: the RNG stream (and the engines' agreement on it) is left alone
        return dropout(t, self.dropout, True, ids) if (self.training and self.dropout > 0) else t
