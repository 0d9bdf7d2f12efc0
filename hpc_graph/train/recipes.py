"""Accuracy recipes: label augmentation and Correct & Smooth, on any engine (docs/recipes.md).

Both recipes only read the labels of *training* nodes: every label tensor they
build is ``where(train_mask, label, 0)`` one-hot encoded and multiplied by the
training mask, so validation and test labels can hold anything.

**Label augmentation** (the "label trick": Wang et al., "Bag of Tricks for Node
Classification with Graph Neural Networks", 2021; Shi et al., UniMP, IJCAI
2021). In epoch ``t`` every training node ``i`` is drawn into the *input set*
with probability ``fraction``::

    u_i = hash(seed, t, id_i) / 2^64,     input_i = train_i and u_i < fraction
    x_i' = [x_i | onehot(y_i) * input_i]                  float[N, F + C]
    loss = sum_{i in train, not input_i} CE(f(x')_i, y_i) / |{i in train, not input_i}|   (global count)

``id_i`` is the node's id in the source dataset (not the relabelled global id
of a partitioned dataset), so the same nodes are drawn on every engine and
rank count, and a resumed run draws what an uninterrupted one would. At
evaluation every training node is in the input set.

**Correct & Smooth** (Huang et al., "Combining Label Propagation and Simple
Models Out-performs Graph Neural Networks", ICLR 2021). With
``S = D^-1/2 A D^-1/2`` (``D``: whole-graph in-degree, no self loops; a node of
in-degree 0 sends and receives nothing), base class probabilities
``Z = softmax(logits)`` float[N, C] and training one-hot labels ``Y_L``::

    correct:  E0 = [Y_L - Z_L ; 0],  E <- (1 - a1) E0 + a1 S E     (K1 steps)
              autoscale:  E clamped to [-1, 1] after every step,
                          Zc = Z + sigma / ||E_i||_1 * E_i,  sigma = mean_{i in L} ||E0_i||_1
                          (a factor that is infinite or above 1000 is replaced by 1)
              fixed:      E_L reset to E0_L after every step, Zc = Z + s E
    smooth:   G0 = Zc with the rows of L replaced by Y_L,
              G <- (1 - a2) G0 + a2 S G, clamped to [0, 1]    (K2 steps); predict argmax G.

Propagation runs through the engine's ``GraphContext`` only (``aggregate``,
``in_degree``, ``all_reduce_sum``), so it is the same computation on ``single``,
``dp``, ``sar``, ``sylvie`` (exact while evaluating) and ``minibatch``'s full
evaluation graph. The paper's OGB runs also feed validation labels to C&S; we
never do.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.train.config import Config, ConfigError, RecipesConfig

log = logging.getLogger(__name__)

_CS_FIELDS = ("cs_correct_layers", "cs_correct_alpha", "cs_smooth_layers", "cs_smooth_alpha", "cs_autoscale",
              "cs_scale")
_MAX_AUTOSCALE = 1000.0


# -- configuration checks --------------------------------------------------------------------------
def check_recipes(config: Config, engine_name: str) -> None:
    """Cross-field checks of the ``recipes`` section (single fields are checked by the config loader).

    Raises:
        ConfigError naming the field: a ``cs_*`` field set while ``recipes.correct_smooth`` is false,
        ``cs_scale`` set with ``cs_autoscale: true``, or ``recipes.label_aug`` with an engine that trains on
        sampled batches (a sampled batch's remote input rows have no label on this rank).
    """
    rc = config.recipes
    default = RecipesConfig()
    if not rc.correct_smooth:
        for name in _CS_FIELDS:
            if getattr(rc, name) != getattr(default, name):
                raise ConfigError(f"recipes.{name}: only used with recipes.correct_smooth: true, "
                                  "which is false")
    elif rc.cs_autoscale and rc.cs_scale != default.cs_scale:
        raise ConfigError("recipes.cs_scale: only used with recipes.cs_autoscale: false "
                          "(autoscale computes the scale)")
    from hpc_graph.engines import engine_class, is_graph_level

    if rc.label_aug > 0 and engine_class(engine_name, config.data.path).kind == "sampled" and \
            not is_graph_level(config.data.path):  # graph-level data: refused for its labels (check_data)
        raise ConfigError(f"recipes.label_aug: not supported by engine {engine_name!r} (the input rows of a "
                          "sampled batch come from other ranks without their labels); use a full-batch "
                          "engine (single, dp, sar, sylvie) or set recipes.label_aug: 0")


# -- label augmentation ---------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele et al. 2014) on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def node_uniforms(node_ids: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """A uniform number in [0, 1) per node, a function of (seed, epoch, node id) only.

    ``u = (h >> 11) * 2^-53`` with ``h = splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ id)``.

    Args:
        node_ids: int64[n] node ids (source-dataset ids, >= 0).
        seed, epoch: non-negative integers.
    Returns:
        float64[n] on ``node_ids``' device.
    """
    key = _splitmix64(np.array([seed], dtype=np.uint64))
    key = _splitmix64(key ^ np.uint64(epoch))
    ids = node_ids.detach().cpu().numpy().astype(np.uint64)
    h = _splitmix64(ids ^ key)
    u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return torch.from_numpy(u).to(node_ids.device)


def dataset_node_ids(engine: Any) -> torch.Tensor:
    """int64[num_nodes]: the source-dataset id of every owned node of ``engine`` (its graph's
    :meth:`~hpc_graph.graph.base.GraphContext.dataset_ids`: a partition relabels nodes)."""
    return engine.graph.dataset_ids()


def train_onehot(label: torch.Tensor, train_mask: torch.Tensor, num_classes: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """One-hot training labels, zero rows elsewhere: float[N, C] (reads no label outside ``train_mask``)."""
    safe = torch.where(train_mask, label, torch.zeros_like(label))
    return F.one_hot(safe, num_classes).to(dtype) * train_mask.unsqueeze(1).to(dtype)


def append_columns(x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """``[x | extra]``: float[N, F] and float[N, C] -> float[N, F + C], in ``x``'s layout.

    A sparse CSR ``x`` gives a sparse CSR result that stores ``x``'s entries and the non-zeros of
    ``extra`` (each row: ``x``'s columns, then ``extra``'s); a dense one a dense result.
    """
    if x.layout != torch.sparse_csr:
        return torch.cat([x, extra.to(x.dtype)], 1)
    n, f = int(x.shape[0]), int(x.shape[1])
    crow, col, val = x.crow_indices(), x.col_indices(), x.values()
    rows_e, cols_e = extra.nonzero(as_tuple=True)  # row-major order
    vals_e = extra[rows_e, cols_e].to(val.dtype)
    per_row = torch.bincount(rows_e, minlength=n)
    old_counts = (crow[1:] - crow[:-1]).to(torch.int64)
    new_crow = torch.zeros(n + 1, dtype=torch.int64, device=crow.device)
    torch.cumsum(old_counts + per_row, 0, out=new_crow[1:])
    before = new_crow[:-1]  # first new position of each row
    nnz_old = int(col.numel())
    row_old = torch.repeat_interleave(torch.arange(n, device=crow.device), old_counts)
    pos_old = before[row_old] + (torch.arange(nnz_old, device=crow.device) - crow[:-1].to(torch.int64)[row_old])
    # the extra entries of a row follow its old ones, in column order
    first_e = torch.zeros(n + 1, dtype=torch.int64, device=crow.device)
    torch.cumsum(per_row, 0, out=first_e[1:])
    rank_e = torch.arange(int(rows_e.numel()), device=crow.device) - first_e[rows_e]
    pos_e = before[rows_e] + old_counts[rows_e] + rank_e
    total = int(new_crow[-1])
    new_col = torch.empty(total, dtype=torch.int64, device=crow.device)
    new_val = torch.empty(total, dtype=val.dtype, device=val.device)
    new_col[pos_old] = col.to(torch.int64)
    new_val[pos_old] = val
    new_col[pos_e] = cols_e + f
    new_val[pos_e] = vals_e
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(new_crow.to(crow.dtype), new_col.to(col.dtype), new_val,
                                       (n, f + int(extra.shape[1])), check_invariants=False)


class LabelAugmentation:
    """Label augmentation (the label trick): inputs and loss nodes of each epoch (see the module docstring).

    Args:
        fraction: probability in [0, 1) that a training node's label is an input in an epoch.
        seed: the training seed (``train.seed``).
        label: int64[N] labels of the owned nodes (only rows in ``train_mask`` are read).
        train_mask: bool[N] owned training nodes.
        node_ids: int64[N] source-dataset ids of the owned nodes (:func:`dataset_node_ids`).
        num_classes: C.

    ``epoch_inputs(feat, epoch) -> (x, loss_mask)``: x float[N, F + C] (``feat``'s layout), loss_mask
    bool[N] (training nodes whose label is not an input); ``eval_inputs(feat) -> x``: every training
    label as input. ``input_mask(epoch) -> bool[N]``.
    """

    def __init__(self, fraction: float, seed: int, label: torch.Tensor, train_mask: torch.Tensor,
                 node_ids: torch.Tensor, num_classes: int):
        if not 0.0 <= float(fraction) < 1.0:
            raise ConfigError(f"recipes.label_aug: must be a number in [0, 1), got {fraction!r}")
        self.fraction, self.seed, self.num_classes = float(fraction), int(seed), int(num_classes)
        self.train_mask = train_mask
        self.node_ids = node_ids
        self._onehot64 = train_onehot(label, train_mask, num_classes, torch.float64)

    def input_mask(self, epoch: int) -> torch.Tensor:
        """bool[N]: training nodes whose one-hot label is an input feature in ``epoch``."""
        u = node_uniforms(self.node_ids, self.seed, epoch).to(self.train_mask.device)
        return self.train_mask & (u < self.fraction)

    def _inputs(self, feat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        onehot = (self._onehot64 * rows.unsqueeze(1).to(torch.float64)).to(feat.dtype)
        return append_columns(feat, onehot)

    def epoch_inputs(self, feat: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of training epoch ``epoch`` and the training nodes its loss is taken over."""
        rows = self.input_mask(epoch)
        return self._inputs(feat, rows), self.train_mask & ~rows

    def eval_inputs(self, feat: torch.Tensor) -> torch.Tensor:
        """Inputs for evaluation and C&S: every training label fed."""
        return self._inputs(feat, self.train_mask)


# -- Correct & Smooth -------------------------------------------------------------------------------
def sym_propagate(graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
    """``S x`` with ``S = D^-1/2 A D^-1/2`` (no self loops, ``D`` the whole graph's in-degree).

    ``out_i = d_i^-1/2 sum_{j->i} d_j^-1/2 x_j`` (0 for ``d = 0``); rows are scaled by their owner before
    the aggregation, so halo copies arrive scaled and no halo degrees are needed.

    Args:
        graph: a full-graph context (its own layer).
        x: float[num_nodes, C] rows of the owned nodes.
    Returns:
        float[num_nodes, C].
    """
    deg = graph.in_degree().to(device=x.device, dtype=x.dtype)
    dinv = torch.where(deg > 0, deg.clamp_min(1.0).rsqrt(), torch.zeros_like(deg)).unsqueeze(1)
    return graph.aggregate(x * dinv, "sum") * dinv


def label_propagation(graph: GraphContext, y: torch.Tensor, alpha: float, layers: int, post=None) -> torch.Tensor:
    """``layers`` steps of ``G <- post((1 - alpha) y + alpha S G)`` from ``G = y``: float[N, C] -> float[N, C]."""
    out = y
    base = (1.0 - alpha) * y
    for _ in range(int(layers)):
        out = alpha * sym_propagate(graph, out) + base
        if post is not None:
            out = post(out)
    return out


class CorrectAndSmooth:
    """Correct & Smooth post-processing (Huang et al., ICLR 2021; formulas in the module docstring).

    Args:
        correct_layers, correct_alpha: K1 and a1 of the correct stage.
        smooth_layers, smooth_alpha: K2 and a2 of the smooth stage.
        autoscale: scale the propagated error per node to the mean training error (else by ``scale``).
        scale: the fixed scale s (``autoscale=False``).

    ``correct(graph, probs, label, train_mask) -> float[N, C]``, ``smooth(graph, probs, label, train_mask)
    -> float[N, C]``, and ``__call__`` = smooth(correct(...)). ``probs``: float[N, C] base class
    probabilities of the owned nodes; ``label`` int64[N] (read on ``train_mask`` only). Collective: every
    rank calls them (aggregations and one all-reduce).
    """

    def __init__(self, correct_layers: int = 50, correct_alpha: float = 0.5, smooth_layers: int = 50,
                 smooth_alpha: float = 0.8, autoscale: bool = True, scale: float = 1.0):
        for name, value in (("cs_correct_layers", correct_layers), ("cs_smooth_layers", smooth_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"recipes.{name}: must be a positive integer, got {value!r}")
        for name, value in (("cs_correct_alpha", correct_alpha), ("cs_smooth_alpha", smooth_alpha)):
            if not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"recipes.{name}: must be a number in [0, 1], got {value!r}")
        if not float(scale) >= 0.0:
            raise ConfigError(f"recipes.cs_scale: must be a non-negative number, got {scale!r}")
        self.correct_layers, self.correct_alpha = int(correct_layers), float(correct_alpha)
        self.smooth_layers, self.smooth_alpha = int(smooth_layers), float(smooth_alpha)
        self.autoscale, self.scale = bool(autoscale), float(scale)

    @classmethod
    def from_config(cls, rc: RecipesConfig) -> "CorrectAndSmooth":
        return cls(rc.cs_correct_layers, rc.cs_correct_alpha, rc.cs_smooth_layers, rc.cs_smooth_alpha,
                   rc.cs_autoscale, rc.cs_scale)

    @torch.no_grad()
    def correct(self, graph: GraphContext, probs: torch.Tensor, label: torch.Tensor,
                train_mask: torch.Tensor) -> torch.Tensor:
        """``Z + scale * E``: the base probabilities corrected by the propagated training residuals."""
        num_classes = int(probs.shape[1])
        m = train_mask.unsqueeze(1).to(probs.dtype)
        error = (train_onehot(label, train_mask, num_classes, probs.dtype) - probs) * m
        if self.autoscale:
            stats = torch.stack([error.abs().sum(), train_mask.sum().to(probs.dtype)])
            stats = graph.all_reduce_sum(stats)
            sigma = stats[0] / stats[1].clamp_min(1.0)
            smoothed = label_propagation(graph, error, self.correct_alpha, self.correct_layers,
                                         post=lambda e: e.clamp(-1.0, 1.0))
            norm = smoothed.abs().sum(1, keepdim=True)
            factor = torch.where(norm > 0, sigma / torch.where(norm > 0, norm, torch.ones_like(norm)),
                                 torch.ones_like(norm))
            factor = torch.where(torch.isinf(factor) | (factor > _MAX_AUTOSCALE), torch.ones_like(factor), factor)
            return probs + factor * smoothed
        fixed = train_mask.unsqueeze(1)
        smoothed = label_propagation(graph, error, self.correct_alpha, self.correct_layers,
                                     post=lambda e: torch.where(fixed, error, e))
        return probs + self.scale * smoothed

    @torch.no_grad()
    def smooth(self, graph: GraphContext, probs: torch.Tensor, label: torch.Tensor,
               train_mask: torch.Tensor) -> torch.Tensor:
        """Label propagation of ``probs`` with the training rows clamped to their one-hot labels."""
        num_classes = int(probs.shape[1])
        start = torch.where(train_mask.unsqueeze(1), train_onehot(label, train_mask, num_classes, probs.dtype),
                            probs)
        return label_propagation(graph, start, self.smooth_alpha, self.smooth_layers,
                                 post=lambda g: g.clamp(0.0, 1.0))

    def __call__(self, graph: GraphContext, probs: torch.Tensor, label: torch.Tensor,
                 train_mask: torch.Tensor) -> torch.Tensor:
        return self.smooth(graph, self.correct(graph, probs, label, train_mask), label, train_mask)
