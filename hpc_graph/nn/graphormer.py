"""``Graphormer``: degree embeddings, a per-head structural (shortest-path) bias, and a global token."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.attention_pattern import num_codes
from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._transformer import AttentionSchedule, TransformerLayer


class Graphormer(nn.Module):
    """Node classifier after Ying et al. (2021), node-level as in TorchGT.

    ``h = x W_in + z_in[min(deg_in, max_degree)] + z_out[min(deg_out, max_degree)]``; a learned global
    token (the paper's virtual node) is appended; ``num_layers`` pre-norm transformer layers whose
    attention scores get a learned per-head bias ``b_l[code(i, j)]`` of the pair's structural bucket
    (self, 1 hop, 2 hops, farther or unreachable, to/from the global token: the spatial encoding,
    shortest-path distance capped at 3, see :mod:`hpc_graph.graph.attention_pattern`); a final
    LayerNorm and a linear head on the node tokens. The bias enters the same softmax in sparse and
    dense attention. Sizes of TorchGT's GPH_slim: 4 layers x 64 x 8 heads.

    ``forward(graph, x)``: x float[num_nodes, in_dim] -> logits float[num_nodes, out_dim].
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 4, heads: int = 8,
                 dropout: float = 0.0, max_degree: int = 64, max_spd: int = 2,
                 schedule: AttentionSchedule | None = None):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.max_degree = int(max_degree)
        self.z_in = nn.Embedding(self.max_degree + 1, hidden)
        self.z_out = nn.Embedding(self.max_degree + 1, hidden)
        self.token = nn.Parameter(torch.zeros(1, hidden))
        self.bias = nn.Parameter(torch.zeros(num_layers, num_codes(max_spd), heads))
        self.layers = nn.ModuleList(TransformerLayer(hidden, heads, dropout, pre_norm=True) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, out_dim)
        self.schedule = schedule or AttentionSchedule()
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.message_passing_layers = int(num_layers)
        for lin in (self.inp, self.head):
            glorot_(lin.weight)
            nn.init.zeros_(lin.bias)
        nn.init.normal_(self.z_in.weight, std=0.02)
        nn.init.normal_(self.z_out.weight, std=0.02)
        # N(0, 1), as torch initialises an embedding: with equal starting values (zeros) the buckets of
        # structurally different graphs weigh alike, and on symmetric inputs (REG3-CC: every node alike)
        # training sat on a plateau for 50+ epochs or for good
        nn.init.normal_(self.bias, std=1.0)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        cap = self.max_degree
        h = (self.inp(x) + self.z_in(graph.in_degree().clamp(max=cap).to(x.device)).to(x.dtype)
             + self.z_out(graph.out_degree().clamp(max=cap).to(x.device)).to(x.dtype))
        graphs = int(getattr(graph, "num_graphs", 0))
        h = torch.cat([h, self.token.to(h.dtype).expand(max(graphs, 1), -1)], 0)
        step = 0 if self.step.is_meta else int(self.step)  # 0 on shapes (the planner)
        for layer, block in enumerate(self.layers):
            h = block(graph, h, bias=self.bias[layer].to(h.dtype), global_token=True,
                      mode=self.schedule.mode(layer, step, self.training), far_prior=self.schedule.far_prior)
        if self.training:
            self.step += 1
        return self.head(self.norm(h[n:] if graphs else h[:n]))
