"""``RevGCN`` and ``RevGAT``: grouped reversible residual GNNs (Li, Müller, Ghanem, Koltun, ICML 2021).

"Training Graph Neural Networks with 1000 Layers" stacks *grouped reversible*
residual blocks: the input of a block can be computed exactly from its output,
so the backward pass recomputes every block's input instead of keeping it, and
the activations kept for the backward pass do not grow with the depth.

Block (``C = groups``, the ``hidden`` channels split into ``C`` groups of
``w = hidden / C``: ``X = [X_1 | .. | X_C]``, each float[N, w])::

    X'_0 = sum_{i=2..C} X_i
    X'_i = X_i + f_i(X'_(i-1))                 i = 1 .. C      (forward)
    X_i  = X'_i - f_i(X'_(i-1))                i = C .. 1      (inverse; X'_0 from the recovered X_2..X_C)
    f_i(z) = conv_i(dropout(relu(LayerNorm_i(z))))            float[N, w] -> float[N, w]

``conv_i`` is a :class:`~hpc_graph.nn.gcn_conv.GCNConv` (RevGCN) or a
:class:`~hpc_graph.nn.gat_conv.GATConv` whose ``heads`` concatenated heads are
``w`` wide (RevGAT). The normalisation is a LayerNorm (row-wise statistics, no
running statistics): it needs no communication, is identical on every engine
and is the same function in the forward pass and in the recomputation, which a
batch norm with running statistics would not be.

Memory: with ``reversible=True`` one ``torch.autograd.Function`` runs the whole
chain of ``L`` blocks under ``torch.no_grad()`` and keeps only the chain's
output; its backward walks the blocks from the last to the first, recomputes
each block's input from its output (the inverse above), re-runs the block with
gradients enabled and back-propagates through that one block. Kept for the
backward pass: O(1) activations of size N x hidden, whatever ``L``; the price
is about one extra forward pass (the inverse) and the re-run of every block.

Randomness is replayed exactly: every block draws one integer seed from torch's
default generator per forward pass, and the dropout of ``f_i`` runs on the
default generator re-seeded with ``seed + i`` (inside ``torch.random.fork_rng``,
so the global stream only advances by the one draw per block); the GAT
attention dropout seed comes from the conv's call counter (see ``GATConv``),
which the recomputation rewinds. ``reversible=False`` builds the same
parameters and computes the same function (same masks) with plain autograd:
a deep *residual* GNN that keeps every block's activations (the reference).

Rows: the chain adds a block's input to its output, so every layer must keep
the rows: these models run on full-graph engines (``single``, ``dp``, ``sar``,
``sylvie``); a sampled block (``layer_input``/``dst`` changing the row count)
raises a ``ValueError``. Aggregations inside the recomputation may
communicate: every rank recomputes the blocks in the same order.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn_conv import GCNConv


class _Key(NamedTuple):
    """What one forward pass of a block drew: the dropout seed (None: no dropout) and each conv's call count."""

    seed: int | None
    calls: tuple


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run the body on torch's default generator (and ``device``'s, if CUDA) seeded with ``seed``; restore after."""
    from hpc_graph.ops.dropout import own_key_stream

    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" \
        else []
    with torch.random.fork_rng(devices=devices), own_key_stream():
        torch.default_generator.manual_seed(seed)
        for d in devices:
            torch.cuda.default_generators[d].manual_seed(seed)
        yield


class GroupRevBlock(nn.Module):
    """One grouped reversible block on ``C = len(convs)`` channel groups of width ``width``.

    ``forward(g, x, key)``: x float[N, C*width] -> float[N, C*width] (formula in the module
    docstring); ``inverse(g, y, key)`` recovers ``x`` from ``y = forward(g, x, key)``. ``key``
    (from :meth:`draw_key`, drawn once per forward pass) fixes the dropout masks and the
    attention-dropout seeds, so both directions and any recomputation see the same ``f_i``.

    Parameters: ``norms`` (C LayerNorm(width)), ``convs`` (the C convolutions, width -> width).
    """

    def __init__(self, convs: list[nn.Module], width: int, p: float):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in convs)
        self.convs = nn.ModuleList(convs)
        self.p = float(p)

    def draw_key(self) -> _Key:
        """Draw this forward pass's dropout seed (torch's default generator) and note the convs' call counts."""
        from hpc_graph.ops.dropout import draw_key

        seed = draw_key() if self.training and self.p > 0 else None
        return _Key(seed, tuple(getattr(conv, "_calls", None) for conv in self.convs))

    def f(self, i: int, g: GraphContext, z: torch.Tensor, key: _Key) -> torch.Tensor:
        """``f_i(z) = conv_i(dropout(relu(LayerNorm_i(z))))``: float[N, width] -> float[N, width]."""
        conv = self.convs[i]
        if key.calls[i] is not None:  # GATConv: its attention seed follows its call count; replay it
            conv._calls = key.calls[i]
        h = F.relu(self.norms[i](z))
        if key.seed is not None:
            with _seeded(key.seed + i, h.device):
                h = dropout(h, self.p, self.training, g.row_ids())
        return conv(g, h)

    def forward(self, g: GraphContext, x: torch.Tensor, key: _Key) -> torch.Tensor:
        xs = x.chunk(len(self.convs), dim=1)
        prev = _sum(xs[1:])
        ys = []
        for i, xi in enumerate(xs):
            prev = xi + self.f(i, g, prev, key)
            ys.append(prev)
        return torch.cat(ys, dim=1)

    def inverse(self, g: GraphContext, y: torch.Tensor, key: _Key) -> torch.Tensor:
        """The block's input ``x`` float[N, C*width] from its output ``y`` (same ``key`` as the forward pass)."""
        ys = y.chunk(len(self.convs), dim=1)
        xs = [None] * len(ys)
        for i in range(len(ys) - 1, 0, -1):
            xs[i] = ys[i] - self.f(i, g, ys[i - 1], key)
        xs[0] = ys[0] - self.f(0, g, _sum(xs[1:]), key)
        return torch.cat(xs, dim=1)


def _sum(ts) -> torch.Tensor:
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


class _ReversibleChain(torch.autograd.Function):
    """``blocks[L-1](..blocks[0](x))`` keeping only the output; backward recomputes inputs from outputs."""

    @staticmethod
    def forward(ctx, x, blocks, graphs, keys, *params):
        with torch.no_grad():
            h = x
            for block, g, key in zip(blocks, graphs, keys):
                h = block(g, h, key)
        ctx.blocks, ctx.graphs, ctx.keys = blocks, graphs, keys
        ctx.save_for_backward(h)
        return h

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        blocks, graphs, keys = ctx.blocks, ctx.graphs, ctx.keys
        calls_now = [[getattr(c, "_calls", None) for c in b.convs] for b in blocks]
        counts = [len(list(b.parameters())) for b in blocks]
        grads: list = []
        y = y.detach()
        for block, g, key, count in zip(reversed(blocks), reversed(graphs), reversed(keys), reversed(counts)):
            with torch.no_grad():
                x = block.inverse(g, y, key)
            params = list(block.parameters())
            need = [p for p in params if p.requires_grad]
            with torch.enable_grad():
                xr = x.detach().requires_grad_(True)
                out = block(g, xr, key)
                got = torch.autograd.grad(out, [xr] + need, grad, allow_unused=True)
            del out
            it = iter(got[1:])
            grads.append([next(it) if p.requires_grad else None for p in params])
            grad, y = got[0], x
        for block, calls in zip(blocks, calls_now):  # the recomputation replayed old call counts
            for conv, c in zip(block.convs, calls):
                if c is not None:
                    conv._calls = c
        flat = [gp for block_grads in reversed(grads) for gp in block_grads]
        return (grad, None, None, None, *flat)


class _RevGNN(nn.Module):
    """Shared body of :class:`RevGCN` and :class:`RevGAT` (``make_conv(width)`` builds one group's conv)."""

    kind = "RevGNN"

    def _build(self, in_dim, hidden, out_dim, num_layers, groups, dropout, reversible, make_conv) -> None:
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers), ("groups", groups)):
            positive_int(field, value)
        if groups < 2:
            raise ValueError(f"model.groups: must be an integer >= 2 (a reversible block splits the hidden "
                             f"channels into groups), got {groups!r}")
        if hidden % groups:
            raise ValueError(f"model.hidden: must be divisible by model.groups={groups}, got {hidden!r}")
        if not isinstance(reversible, bool):
            raise ValueError(f"model.reversible: must be true or false, got {reversible!r}")
        self.dropout = number_in("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.reversible = reversible
        self.groups = int(groups)
        self.message_passing_layers = int(num_layers)
        width = hidden // groups
        self.lin_in = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(GroupRevBlock([make_conv(width) for _ in range(groups)], width, self.dropout)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.lin_out = nn.Linear(hidden, out_dim)

    def _layer_graphs(self, graph: GraphContext, h: torch.Tensor, layers: range) -> list[GraphContext]:
        """``graph.layer(l)`` for every block in ``layers``, refusing any that changes the row count (a sampled
        block)."""
        rows = h.shape[0]
        graphs = []
        with torch.no_grad():
            probe = h.detach()
            for layer in layers:
                g = graph.layer(layer)
                rows_in = g.layer_input(probe).shape[0]
                rows_out = g.dst(probe).shape[0] if rows_in == rows else rows_in
                if rows_in != rows or rows_out != rows:
                    raise ValueError(
                        f"{self.kind}: layer {layer} turns {rows} rows into {rows_in} input and {rows_out} output "
                        f"rows (a sampled block); a reversible residual chain needs every layer to keep the rows: "
                        f"use a full-graph engine (single, dp, sar, sylvie, flow with cross_edges exact or drop)")
                graphs.append(g)
        return graphs

    def pipeline_units(self) -> list[list[nn.Module]]:
        """The model as a chain of units a layer pipeline can cut between (the ``flow`` engine): ``lin_in``, each
        reversible block, then ``norm`` with ``lin_out``. A stage's blocks form one reversible chain."""
        return [[self.lin_in]] + [[block] for block in self.blocks] + [[self.norm, self.lin_out]]

    def forward_units(self, graph: GraphContext, h: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Units ``start .. stop - 1`` of :meth:`pipeline_units` on ``h`` (the features when ``start`` is 0, else
        what unit ``start - 1`` returned); ``forward`` is all of them."""
        num_blocks = len(self.blocks)
        if start == 0:
            h = linear(dropout(h, self.dropout, self.training, graph.row_ids()), self.lin_in.weight,
                       self.lin_in.bias)
        lo, hi = max(start, 1) - 1, min(stop, num_blocks + 1) - 1
        if lo < hi:
            blocks = list(self.blocks)[lo:hi]
            graphs = self._layer_graphs(graph, h, range(lo, hi))
            keys = [block.draw_key() for block in blocks]
            params = [p for block in blocks for p in block.parameters()]
            if self.reversible and torch.is_grad_enabled() and \
                    (h.requires_grad or any(p.requires_grad for p in params)):
                h = _ReversibleChain.apply(h, blocks, graphs, keys, *params)
            else:
                for block, g, key in zip(blocks, graphs, keys):
                    h = block(g, h, key)
        if stop == num_blocks + 2:
            h = dropout(F.relu(self.norm(h)), self.dropout, self.training, graph.row_ids(output=True))
            h = linear(h, self.lin_out.weight, self.lin_out.bias)
        return h

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        return self.forward_units(graph, x, 0, len(self.blocks) + 2)


class RevGCN(_RevGNN):
    """Grouped reversible deep GCN (RevGCN of Li et al., ICML 2021).

    ::

        h_0 = dropout(x) W_in + b_in                                        [N, hidden]
        h_l = Block_l(h_(l-1))            l = 1 .. L  (module docstring; f_i with a GCNConv)
        out = dropout(relu(LayerNorm(h_L))) W_out + b_out                   [N, out_dim]

    ``GCNConv`` is ``D^-1/2 (A + I) D^-1/2 Z W + b`` on one group of ``w = hidden / groups``
    channels (``W`` float[w, w]). With ``reversible=True`` the backward pass recomputes each
    block's input from its output: kept activations do not grow with ``num_layers``.
    Normalisation is LayerNorm, not batch norm: row-wise, no running statistics,
    identical on every engine and in the recomputation.

    Message passing: block ``l`` runs on ``graph.layer(l - 1)``; every layer must keep the
    rows (full-graph engines ``single``, ``dp``, ``sar``, ``sylvie``; sampled blocks raise
    ``ValueError``). ``message_passing_layers = num_layers``.

    Args:
        in_dim, hidden, out_dim: feature, hidden and class widths (``hidden`` divisible by ``groups``).
        num_layers: reversible blocks L.
        groups: channel groups C >= 2 per block.
        dropout: probability of the input-feature dropout, of the dropout inside every
            ``f_i`` and before ``lin_out``.
        reversible: recompute instead of keeping activations (``False``: the same function
            and parameters with plain autograd, a residual deep GCN).

    Parameters: ``lin_in`` (Linear in_dim -> hidden), ``blocks`` (L :class:`GroupRevBlock`, each
    with C ``norms``/``convs``), ``norm`` (LayerNorm(hidden)), ``lin_out`` (Linear hidden -> out_dim).
    ``forward(graph, x)``: x float[N, in_dim] (dense or sparse CSR) -> float[N, out_dim].
    """

    kind = "RevGCN"

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 8, groups: int = 2,
                 dropout: float = 0.5, reversible: bool = True):
        super().__init__()
        self._build(in_dim, hidden, out_dim, num_layers, groups, dropout, reversible, lambda w: GCNConv(w, w))

    def extra_repr(self) -> str:
        return (f"layers={len(self.blocks)}, groups={self.groups}, dropout={self.dropout:g}, "
                f"reversible={self.reversible}")


class RevGAT(_RevGNN):
    """Grouped reversible deep GAT (RevGAT of Li et al., ICML 2021).

    The layout of :class:`RevGCN` with ``f_i(z) = GATConv(dropout(relu(LayerNorm(z))))``:
    ``heads`` concatenated heads of ``w / heads`` features each (``w = hidden / groups``, so
    ``w`` must be divisible by ``heads``), attention dropout ``attn_dropout`` (seeded by the
    conv's call count, replayed exactly in the recomputation).

    Args:
        in_dim, hidden, out_dim, num_layers, groups, dropout, reversible: as :class:`RevGCN`.
        heads: attention heads per group.
        attn_dropout: probability of dropping an attention coefficient while training.

    Parameters as :class:`RevGCN`, with ``GATConv`` (``lin.weight`` float[w, w], ``att_src``,
    ``att_dst`` float[1, heads, w / heads], ``bias`` float[w]) as ``convs``.
    ``forward(graph, x)``: x float[N, in_dim] (dense or sparse CSR) -> float[N, out_dim].
    """

    kind = "RevGAT"

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 8, groups: int = 2,
                 heads: int = 1, dropout: float = 0.5, attn_dropout: float = 0.0, reversible: bool = True):
        super().__init__()
        positive_int("heads", heads)
        self.attn_dropout = number_in("attn_dropout", attn_dropout, 0.0, 1.0, hi_open=True)
        self.heads = int(heads)
        if positive_int("hidden", hidden) % positive_int("groups", groups) == 0 and (hidden // groups) % heads:
            raise ValueError(f"model.heads: must divide the {hidden // groups} channels of a group "
                             f"(hidden / groups = {hidden} / {groups}), got {heads!r}")
        self._build(in_dim, hidden, out_dim, num_layers, groups, dropout, reversible,
                    lambda w: GATConv(w, w // heads, heads=heads, attn_dropout=self.attn_dropout))

    def extra_repr(self) -> str:
        return (f"layers={len(self.blocks)}, groups={self.groups}, heads={self.heads}, dropout={self.dropout:g}, "
                f"attn_dropout={self.attn_dropout:g}, reversible={self.reversible}")
