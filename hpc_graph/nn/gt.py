"""``GT``: the Graph Transformer of Dwivedi & Bresson (2021) with Laplacian eigenvector positional encodings."""
from __future__ import annotations

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._init import glorot_
from hpc_graph.nn._transformer import AttentionSchedule, TransformerLayer


class GT(nn.Module):
    """Node classifier: ``h = x W_in + pe W_pe``; ``num_layers`` post-norm transformer layers; a linear head.

    ``pe`` is the first ``pe_dim`` columns of the dataset's ``/node/lap_pe`` (``hpc-graph preprocess
    lap-pe``), each column's sign flipped at random in every training step (eigenvectors are defined
    up to sign). The flips of step ``s`` come from a generator seeded by ``(pe_seed, s)``, ``pe_seed``
    drawn from torch's generator when the model is built: the same on every rank (whose own streams the
    trainer decorrelates for dropout), so ``seqpar``'s ranks flip the rows they hold alike and ``dp``
    over batches of graphs flips as ``single`` does; a resumed run (``step`` is a buffer) flips as
    the uninterrupted one. ``pe_dim=0``
    runs without positional encodings. Attention is ``graph.attention`` under the ``schedule``
    (sparse pattern, dense, or interleaved), with an optional global token (a learned vector
    appended to the sequence). Sizes of the TorchGT paper: 4 layers x 128 x 8 heads.

    Graph-level data (``graph.num_graphs`` G > 0): one global token per graph (the same learned vector;
    ``global_token`` must be on), and the head reads the G tokens out instead of the nodes.

    ``forward(graph, x)``: x float[num_nodes, in_dim] -> logits float[num_nodes, out_dim]
    (float[G, out_dim] for a graph batch).
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 4, heads: int = 8,
                 dropout: float = 0.0, pe_dim: int = 8, schedule: AttentionSchedule | None = None,
                 global_token: bool = False):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.pe_dim = int(pe_dim)
        self.pe = nn.Linear(self.pe_dim, hidden) if self.pe_dim else None
        self.layers = nn.ModuleList(TransformerLayer(hidden, heads, dropout, pre_norm=False, activation="relu")
                                    for _ in range(num_layers))
        self.token = nn.Parameter(torch.zeros(1, hidden)) if global_token else None
        self.head = nn.Linear(hidden, out_dim)
        self.schedule = schedule or AttentionSchedule()
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.message_passing_layers = int(num_layers)
        for lin in (self.inp, self.head) + ((self.pe,) if self.pe is not None else ()):
            glorot_(lin.weight)
            nn.init.zeros_(lin.bias)
        self.pe_seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if self.pe_dim else 0

    def _step(self) -> int:
        """The training steps taken (0 on shapes: the planner's model has no values)."""
        return 0 if self.step.is_meta else int(self.step)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        h = self.inp(x)
        if self.pe is not None:
            pe = graph.node_field("lap_pe")
            if pe.shape[1] < self.pe_dim:
                raise ValueError(f"model.pe_dim: {self.pe_dim} but /node/lap_pe has {pe.shape[1]} columns")
            pe = pe[:, :self.pe_dim].to(h.dtype)
            if self.training:
                gen = torch.Generator().manual_seed(self.pe_seed * 1_000_003 + self._step())
                sign = torch.randint(0, 2, (self.pe_dim,), generator=gen).to(h.dtype) * 2 - 1
                pe = pe * sign.to(h.device)
            h = h + self.pe(pe)
        glob = self.token is not None
        graphs = int(getattr(graph, "num_graphs", 0))
        if graphs and not glob:
            raise ValueError("model.global_token: a graph-level dataset reads out from global tokens (set it true)")
        if glob:
            h = torch.cat([h, self.token.to(h.dtype).expand(max(graphs, 1), -1)], 0)
        step = self._step()
        for layer, block in enumerate(self.layers):
            h = block(graph, h, mode=self.schedule.mode(layer, step, self.training), global_token=glob,
                      far_prior=self.schedule.far_prior)
        if self.training:
            self.step += 1
        return self.head(h[n:] if graphs else h[:n])
