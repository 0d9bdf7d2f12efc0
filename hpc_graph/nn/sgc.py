"""``SGC``: simplified graph convolution (Wu et al., ICML 2019)."""
from __future__ import annotations

import weakref

import torch
from torch import nn

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import number_in, positive_int
from hpc_graph.nn._propagate import as_dense, gcn_propagate


class SGC(nn.Module):
    """Logistic regression on K-hop smoothed features: ``softmax(S^K X W + b)``.

    ``S = D^-1/2 (A + I) D^-1/2`` (``D = in_degree + 1``); the softmax is left to
    the loss, so ``forward`` returns the logits ``dropout(S^K X) W + b`` float[N, out_dim]
    (the paper has no dropout: the default is 0).

    ``S^K X`` has no parameters, so it is computed once (:meth:`precompute`: K
    message-passing steps through the graph, hence distributed like any layer:
    halo exchanges under ``dp``/``sylvie``, block rotation under ``sar``) and
    cached on the first forward pass over a *full* graph, i.e. a context that is
    its own layer (``graph.layer(0) is graph``). The cache is keyed by the
    identity of the graph and of the feature tensor (weak references: it never
    keeps either alive), so a model moved to another graph or given other
    features recomputes; it is not part of the ``state_dict``. The input
    features are treated as constants (no gradient flows to ``x``).

    On a mini-batch :class:`~hpc_graph.graph.block.BlockStack` every batch has
    its own sampled blocks, so nothing is cached: the K steps run on the batch's
    K blocks (step ``k`` on ``graph.layer(k - 1)``, input rows from
    ``layer_input``) before the linear layer; with all neighbours sampled the
    seeds' rows are exactly those of the full graph. ``message_passing_layers = K``.

    Args:
        in_dim, out_dim: feature and class widths.
        hops: propagation steps K (2).
        dropout: dropout probability on the propagated features.

    Parameters: ``lin`` (Linear in_dim -> out_dim).
    ``forward(graph, x)``: x float[input rows, in_dim] (dense or sparse CSR) -> float[output rows, out_dim].
    """

    def __init__(self, in_dim: int, out_dim: int, hops: int = 2, dropout: float = 0.0):
        super().__init__()
        positive_int("in_dim", in_dim)
        positive_int("out_dim", out_dim)
        self.hops = positive_int("hops", hops)
        self.dropout = number_in("dropout", dropout, 0.0, 1.0, hi_open=True)
        self.message_passing_layers = self.hops
        self.lin = nn.Linear(in_dim, out_dim)
        self._cache: tuple[weakref.ref, weakref.ref, torch.Tensor] | None = None

    def precompute(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        """``S^K x`` float[output rows, in_dim]: K message-passing steps, ``x`` a constant (no cache here).

        Grad mode is left as it is (nothing requires a gradient): a mini-batch
        engine may push the rows it sees in training mode.
        """
        z = as_dense(x.detach())
        for k in range(self.hops):
            g = graph.layer(k)
            z = gcn_propagate(g, g.layer_input(z))
        return z

    def features(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        """``S^K x``: cached per (graph, x) on a full graph, recomputed on every block stack."""
        if graph.layer(0) is not graph:
            return self.precompute(graph, x)
        cache = self._cache
        if cache is not None and cache[0]() is graph and cache[1]() is x:
            return cache[2]
        z = self.precompute(graph, x)
        self._cache = (weakref.ref(graph), weakref.ref(x), z)
        return z

    def clear_cache(self) -> None:
        """Forget the cached ``S^K x`` (e.g. after changing the graph or the features in place)."""
        self._cache = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # pickling and deepcopy: weak references do not pickle; recompute
        state["_cache"] = None
        return state

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        z = dropout(self.features(graph, x), self.dropout, self.training, graph.row_ids(output=True))
        return linear(z, self.lin.weight, self.lin.bias)

    def extra_repr(self) -> str:
        return f"hops={self.hops}, dropout={self.dropout:g}, cached={self._cache is not None}"
