"""``build_model``: every node classifier by name.

``gcn``, ``sage``, ``gat``: one configurable stack of convolutions (:class:`GNN`);
``gcn2`` (:class:`~hpc_graph.nn.gcn2.GCNII`), ``jknet`` (:class:`~hpc_graph.nn.jknet.JKNet`),
``appnp`` (:class:`~hpc_graph.nn.appnp.APPNP`), ``sgc`` (:class:`~hpc_graph.nn.sgc.SGC`) and
``dagnn`` (:class:`~hpc_graph.nn.dagnn.DAGNN`): deep models, one per file; ``mlp``
(:class:`~hpc_graph.nn.mlp.MLPNet`): no graph at all; ``rgcn`` (:class:`~hpc_graph.nn.rgcn.RGCN`):
relational convolutions over the edge types of a typed graph; ``revgcn``/``revgat``
(:class:`~hpc_graph.nn.revgnn.RevGCN`, :class:`~hpc_graph.nn.revgnn.RevGAT`): grouped reversible
deep GNNs whose saved activations do not grow with depth. Every model has a
``message_passing_layers`` attribute: the blocks a sampled mini-batch needs (one per
``graph.layer(l)`` it asks for).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from hpc_graph.graph.base import GraphContext
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn._linear import linear
from hpc_graph.nn._options import positive_int
from hpc_graph.nn._transformer import AttentionSchedule
from hpc_graph.nn.appnp import APPNP
from hpc_graph.nn.dagnn import DAGNN
from hpc_graph.nn.dist_batch_norm import DistBatchNorm
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn2 import GCNII
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.graphormer import Graphormer
from hpc_graph.nn.gt import GT
from hpc_graph.nn.jknet import JKNet
from hpc_graph.nn.mlp import MLPNet
from hpc_graph.nn.revgnn import RevGAT, RevGCN
from hpc_graph.nn.rgcn import RGCN
from hpc_graph.nn.sage_conv import SAGEConv
from hpc_graph.nn.sgc import SGC

log = logging.getLogger(__name__)

STACK_MODELS = ("gcn", "sage", "gat")
# keyword options of build_model beyond the stack's, the models that use them, and their defaults
MODEL_OPTIONS = {"alpha": (("gcn2", "appnp"), 0.1), "theta": (("gcn2",), 0.5),
                 "hops": (("appnp", "sgc", "dagnn"), None), "jk": (("jknet",), "concat"),
                 "conv": (("jknet",), "gcn"), "num_bases": (("rgcn",), None),
                 "groups": (("revgcn", "revgat"), 2), "reversible": (("revgcn", "revgat"), True),
                 "attention": (("gt", "graphormer"), "sparse"), "dense_every": (("gt", "graphormer"), 10),
                 "dense_layers": (("gt", "graphormer"), ()), "far_prior": (("gt", "graphormer"), True),
                 "pe_dim": (("gt",), 8),
                 "global_token": (("gt",), False), "max_degree": (("graphormer",), 64),
                 "max_spd": (("graphormer",), 2)}
# build_model's stack options (only gcn/sage/gat use them) and their defaults
STACK_OPTIONS = {"heads": 8, "out_heads": 1, "attn_dropout": 0.0, "residual": False, "batchnorm": False,
                 "gat_projection": "linear"}
# stack options that another model uses too
SHARED_STACK_OPTIONS = {"heads": ("revgat", "gt", "graphormer"), "attn_dropout": ("revgat",)}
DEFAULT_HOPS = {"appnp": 10, "sgc": 2, "dagnn": 10}


def _gt_partition_problem(mc: Any) -> str | None:
    if mc.attention != "sparse" or mc.global_token or mc.pe_dim:
        return ("gt on a partitioned graph runs sparse attention over self loops and edges (a K/V halo exchange): "
                "it needs model.attention: sparse, global_token: false, pe_dim: 0 (dense attention, the global "
                "token and the encodings need the whole sequence)")
    return None


def _needs_sequence(mc: Any) -> str | None:
    return f"{mc.name!r} attends over the whole sequence (its degree bias and global token)"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the suite needs to know of a model before building it: the engines ask these, never the name.

    Attributes:
        name: ``model.name``.
        sampled: runs on sampled mini-batches (one block per message-passing layer: ``minibatch``, ``apt``).
        pipeline: can be cut into a chain of pipeline stages (``pipeline_units``/``forward_units``: ``flow``).
        sequence: a graph transformer over a sequence of tokens (``seqpar``, and what ``auto`` picks for it).
        layer_stack: a stack of one convolution type whose input layer ``apt`` parallelises.
        affine_input: the input layer is affine in its input features (``apt``'s NFP splits them by columns).
        partition_problem: for a ``sequence`` model, why it cannot run on a partition of the graph (the halo
            engines ``dp``, ``sar``, ``sylvie``) with the given ``model`` config section, or None when it can;
            None (the attribute) for a model that never can.
        node_classifier: classifies nodes from features (LM co-training feeds such models).
        build: for a model registered from outside (:func:`register_model`): ``build(in_dim, out_dim, mc)``
            returns the module (``forward(graph, x)``), ``mc`` being the config's ``model`` section; None for
            the built-in models (:func:`build_model`).
        layers: for such a model, its message-passing layers under ``mc`` (default ``mc.num_layers``).
        sparse_input: its input layer takes the features as a sparse CSR tensor (``data.feature_layout: auto``
            gives sparse bag-of-words features so; other models get them dense).
    """

    name: str
    sampled: bool = True
    pipeline: bool = False
    sequence: bool = False
    layer_stack: bool = False
    affine_input: bool = False
    partition_problem: Callable[[Any], str | None] | None = None
    node_classifier: bool = True
    build: Callable[..., nn.Module] | None = None
    layers: Callable[[Any], int] | None = None
    sparse_input: bool = False

    def message_passing_layers(self, mc: Any) -> int:
        """Message-passing layers (blocks of a sampled mini-batch) of this model under the ``model`` section
        ``mc``."""
        if self.layers is not None:
            return int(self.layers(mc))
        return message_passing_layers(self.name, mc.num_layers, getattr(mc, "hops", None))


_SPECS = [
    ModelSpec("gcn", pipeline=True, layer_stack=True, affine_input=True),
    ModelSpec("sage", pipeline=True, layer_stack=True, affine_input=True),
    ModelSpec("gat", pipeline=True, layer_stack=True),
    ModelSpec("gcn2"), ModelSpec("jknet"), ModelSpec("appnp"), ModelSpec("sgc"), ModelSpec("dagnn"),
    ModelSpec("mlp"),
    ModelSpec("rgcn", sampled=False),  # relation-wise aggregation over sampled blocks is not built
    ModelSpec("revgcn", sampled=False, pipeline=True),  # a reversible chain needs every layer to keep its rows
    ModelSpec("revgat", sampled=False, pipeline=True),
    ModelSpec("gt", sampled=False, sequence=True, partition_problem=_gt_partition_problem, node_classifier=False),
    ModelSpec("graphormer", sampled=False, sequence=True, partition_problem=_needs_sequence, node_classifier=False),
]
# every built-in model's input layer takes sparse CSR features (hpc_graph.nn._linear.input_linear)
_SPECS = [dataclasses.replace(s, sparse_input=True) for s in _SPECS]
#: every model :func:`build_model` builds, by name (``model.name``)
MODEL_SPECS: dict[str, ModelSpec] = {s.name: s for s in _SPECS}
MODELS = tuple(MODEL_SPECS)
ENTRY_POINT_GROUP = "hpc_graph.models"
_BUILTIN_MODELS = frozenset(MODELS)


def is_builtin_model(name: str) -> bool:
    """Whether ``name`` is one of the model zoo's own models (not a path or a registered model of one's own)."""
    return name in _BUILTIN_MODELS
_discovered = False


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a model to the registry under ``spec.name``: ``spec.build(in_dim, out_dim, mc)`` makes it (a module
    whose ``forward(graph, x)`` asks ``graph`` to aggregate, as the built-in layers do), its other fields say what
    it can do (the engines ask them). Replaces an earlier registration of the name; a built-in model cannot be
    replaced (``ValueError``). Packages register theirs through the ``hpc_graph.models`` entry-point group (the
    entry point's object is a ModelSpec)."""
    global MODELS
    if not isinstance(spec, ModelSpec) or spec.build is None:
        raise ValueError(f"register_model: a ModelSpec with a build function is needed, got {spec!r}")
    if spec.name in _BUILTIN_MODELS:
        raise ValueError(f"register_model: {spec.name!r} is a built-in model name")
    MODEL_SPECS[spec.name] = spec
    MODELS = tuple(MODEL_SPECS)
    return spec


def unregister_model(name: str) -> None:
    """Forget a model registered with :func:`register_model` (no-op for an unknown or built-in one)."""
    global MODELS
    if name not in _BUILTIN_MODELS:
        MODEL_SPECS.pop(name, None)
        MODELS = tuple(MODEL_SPECS)


def discover_models() -> tuple[str, ...]:
    """Register the models of the ``hpc_graph.models`` entry points (once); every model's name."""
    global _discovered
    if not _discovered:
        _discovered = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                spec = ep.load()
                if spec.name != ep.name:
                    raise ValueError(f"its ModelSpec is named {spec.name!r}")
                if spec.name not in _BUILTIN_MODELS:
                    register_model(spec)
            except Exception as exc:  # noqa: BLE001 - one broken plug-in must not stop the others
                log.warning("models: entry point %s:%s (%s) not loaded: %s", ENTRY_POINT_GROUP, ep.name, ep.value,
                            exc)
    return MODELS


def model_names() -> tuple[str, ...]:
    """Every model ``model.name`` may name: the built-in ones, then the registered and entry-point ones."""
    return discover_models()


def build_from_config(mc: Any, in_dim: int, out_dim: int, *, num_relations: int = 1,
                      graph_level: bool = False) -> nn.Module:
    """The model of a config's ``model`` section ``mc`` for ``in_dim`` input features and ``out_dim`` classes:
    a registered model's own ``build``, else :func:`build_model` with the section's fields."""
    spec = model_spec(mc.name)
    if spec.build is not None:
        if graph_level:
            return GraphReadout(spec.build(in_dim, out_dim, mc))
        return spec.build(in_dim, out_dim, mc)
    return build_model(mc.name, in_dim, mc.hidden, out_dim, num_layers=mc.num_layers, dropout=mc.dropout,
                       heads=mc.heads, out_heads=mc.out_heads, attn_dropout=mc.attn_dropout, residual=mc.residual,
                       gat_projection=mc.gat_projection,
                       batchnorm=mc.batchnorm, alpha=mc.alpha, theta=mc.theta, hops=mc.hops, jk=mc.jk, conv=mc.conv,
                       num_bases=mc.num_bases, groups=mc.groups, reversible=mc.reversible,
                       num_relations=num_relations, attention=mc.attention, dense_every=mc.dense_every,
                       dense_layers=tuple(mc.dense_layers), far_prior=mc.far_prior, pe_dim=mc.pe_dim,
                       global_token=mc.global_token, max_degree=mc.max_degree, max_spd=mc.max_spd,
                       graph_level=graph_level)


def models_with(trait: str) -> tuple[str, ...]:
    """The names of the registered models whose :class:`ModelSpec` has ``trait`` (e.g. ``"pipeline"``)."""
    return tuple(name for name, spec in MODEL_SPECS.items() if getattr(spec, trait))


def model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``model.name`` ``name``: a registered model, or ``"package.module:attr"``
    imported (:func:`import_model`). ``ValueError`` naming the choices, or what failed to import, otherwise."""
    if name not in MODEL_SPECS:
        discover_models()
    if isinstance(name, str) and name not in MODEL_SPECS and ":" in name:
        return import_model(name)
    try:
        return MODEL_SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"model.name: must be one of {', '.join(map(repr, MODELS))}, or 'package.module:Factory', "
                         f"got {name!r}") from None


def check_forward(model: nn.Module, name: str) -> None:
    """``ValueError`` naming model ``name`` when its ``forward`` cannot be called as ``forward(graph, x)``."""
    import inspect

    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return  # a builtin or C forward: nothing to inspect
    try:
        sig.bind(None, None)
    except TypeError:
        params = ", ".join(p.name for p in sig.parameters.values())
        raise ValueError(f"model {name}: {type(model).__name__}.forward({params}) cannot be called as "
                         f"forward(graph, x) (graph: the engine's GraphContext, x: the input features)") from None


def spec_for(name: str, obj: Any) -> ModelSpec:
    """A :class:`ModelSpec` named ``name`` for ``obj``: a ModelSpec (renamed), or a factory
    ``obj(in_dim, out_dim, mc) -> nn.Module`` (a class or a function; ``mc``: the config's ``model`` section)
    with the default traits (sampled over ``mc.num_layers`` blocks; not a pipeline, not a sequence model).
    A factory may declare traits as attributes of the same names as ModelSpec's (``sampled = False`` ...)."""
    if isinstance(obj, ModelSpec):
        if obj.build is None:
            raise ValueError(f"model.name: {name!r} is a ModelSpec without a build function")
        return dataclasses.replace(obj, name=name)
    if isinstance(obj, nn.Module) or not callable(obj):
        raise ValueError(f"model.name: {name!r} must be a factory (in_dim, out_dim, model_section) -> nn.Module "
                         f"or a ModelSpec, got {type(obj).__name__}")
    traits: dict[str, Any] = {}
    for f in dataclasses.fields(ModelSpec):
        value = getattr(obj, f.name, None) if f.name not in ("name", "build") else None
        if isinstance(value, bool) or (f.name in ("partition_problem", "layers") and callable(value)):
            traits[f.name] = value
    return ModelSpec(name=name, build=lambda in_dim, out_dim, mc: obj(in_dim, out_dim, mc), **traits)


def import_model(path: str) -> ModelSpec:
    """Register and return the model at ``"package.module:attr"`` (:func:`spec_for`): what ``model.name`` and
    ``hpc-graph train --model`` name for a model of one's own. ``ValueError`` naming the path when the module
    does not import or has no such attribute."""
    import importlib

    module, _, attr = path.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise ValueError(f"model.name: {path!r} is not 'package.module:Factory'")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import error is the user's module's, reported in one line
        raise ValueError(f"model.name: cannot import module {module!r} of {path!r}: "
                         f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"model.name: module {module!r} has no attribute {attr!r} ({path!r})")
        obj = getattr(obj, part)
    spec = spec_for(path, obj)
    MODEL_SPECS[path] = spec
    return spec


def message_passing_layers(name: str, num_layers: int = 2, hops: int | None = None) -> int:
    """Message-passing layers (blocks of a mini-batch) of model ``name``: ``num_layers`` for the
    stacks, ``gcn2`` and ``jknet``; ``hops`` (default per model) for ``appnp``, ``sgc``, ``dagnn``."""
    if name in DEFAULT_HOPS:
        return positive_int("hops", DEFAULT_HOPS[name] if hops is None else hops)
    return positive_int("num_layers", num_layers)


class GraphReadout(nn.Module):
    """A node model turned graph classifier: the mean of its node outputs over each graph of a batch.

    ``forward(graph, x)``: x float[num_nodes, in_dim] -> float[num_graphs, out_dim]
    (``graph.readout(model(graph, x))``).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.message_passing_layers = getattr(model, "message_passing_layers", 0)

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        return graph.readout(self.model(graph, x))


class GNN(nn.Module):
    """A stack of graph convolutions for node classification.

    Per layer ``l``: ``h = dropout(h)``; ``y = conv_l(graph, h)``; with ``residual``
    ``y = y + res_l(h)`` (identity, or a bias-free linear projection when the
    widths differ); on hidden layers ``y = act(bn_l(graph, y))`` (the
    DistBatchNorm only with ``batchnorm``); ``h = y``. ``act`` is ELU for GAT,
    ReLU otherwise. Dropout is applied to the input features too (as in the
    GCN and GAT papers); its mask comes from a fast CPU sampler (see
    :mod:`hpc_graph.nn._dropout`). Without residuals the activation of a
    hidden layer is applied by the next convolution together with its dropout
    and projection (the same function; GCN and SAGE: one autograd node keeping
    only the pre-activation, :func:`hpc_graph.nn._linear.input_linear`; GAT: the
    graph's ``gat_projected``, which on ``single`` and ``sar`` keeps only the
    pre-activation too).

    GAT hidden layers have ``heads`` concatenated heads of ``hidden`` features
    (width ``heads * hidden``); the output layer averages ``out_heads`` heads.

    ``forward(graph, x)``: x float[num_nodes, in_dim], dense or sparse CSR (sparse input
    features make the first layer's dropout and projection cost O(nnz)) -> logits
    float[num_nodes, out_dim].
    """

    def __init__(self, name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.5, heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0,
                 residual: bool = False, batchnorm: bool = False, gat_projection: str = "linear"):
        super().__init__()
        if name not in STACK_MODELS:
            raise ValueError(f"model.name: GNN stacks {', '.join(STACK_MODELS)}, not {name!r}")
        for field, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim),
                             ("num_layers", num_layers), ("heads", heads), ("out_heads", out_heads)):
            if int(value) < 1:
                raise ValueError(f"model.{field}: must be a positive integer, got {value}")
        self.name = name
        self.dropout = float(dropout)
        self.message_passing_layers = int(num_layers)
        self.activation = F.elu if name == "gat" else F.relu
        self.convs = nn.ModuleList()
        self.residuals = nn.ModuleList() if residual else None
        self.norms = nn.ModuleList() if batchnorm else None
        width = in_dim
        for layer in range(num_layers):
            last = layer == num_layers - 1
            if name == "gcn":
                conv, out_width = GCNConv(width, out_dim if last else hidden), out_dim if last else hidden
            elif name == "sage":
                conv, out_width = SAGEConv(width, out_dim if last else hidden), out_dim if last else hidden
            elif last:
                conv = GATConv(width, out_dim, heads=out_heads, concat=False, attn_dropout=attn_dropout,
                               projection=gat_projection)
                out_width = out_dim
            else:
                conv = GATConv(width, hidden, heads=heads, concat=True, attn_dropout=attn_dropout,
                               projection=gat_projection)
                out_width = hidden * heads
            self.convs.append(conv)
            if self.residuals is not None:
                self.residuals.append(nn.Identity() if width == out_width
                                      else nn.Linear(width, out_width, bias=False))
            if self.norms is not None and not last:
                self.norms.append(DistBatchNorm(out_width))
            width = out_width

    def pipeline_units(self) -> list[list[nn.Module]]:
        """The model as a chain of units a layer pipeline can cut between (the ``flow`` engine): unit ``l`` is
        layer ``l``'s convolution, residual projection and norm (whatever exists)."""
        units = []
        for layer, conv in enumerate(self.convs):
            unit = [conv]
            if self.residuals is not None:
                unit.append(self.residuals[layer])
            if self.norms is not None and layer < len(self.norms):
                unit.append(self.norms[layer])
            units.append(unit)
        return units

    def forward_units(self, graph: GraphContext, h: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Units ``start .. stop - 1`` of :meth:`pipeline_units` on ``h``: the features (``start`` 0) or what unit
        ``start - 1`` returned; returns the logits when ``stop`` is the last unit's. ``forward`` is all of them."""
        last = len(self.convs) - 1
        # without residuals a hidden layer's activation waits for the next layer, whose
        # convolution applies it, the dropout and its projection as one step keeping only h
        fuse = self.residuals is None
        act = "elu" if self.name == "gat" else "relu"
        p = self.dropout if self.training else 0.0
        for layer in range(start, stop):
            conv = self.convs[layer]
            g = graph.layer(layer)
            if fuse:
                y = conv(g, g.layer_input(h), act=act if layer else None, p=p)
            else:
                h_in = dropout(g.layer_input(h), self.dropout, self.training, g.row_ids())
                y = conv(g, h_in)
                if self.residuals is not None:
                    skip, own = self.residuals[layer], g.dst(h_in)
                    y = y + (linear(own, skip.weight) if isinstance(skip, nn.Linear) else own.to_dense())
            if layer != last:
                if self.norms is not None:
                    y = self.norms[layer](g, y)
                if not fuse:
                    y = self.activation(y)
            h = y
        return h

    def forward(self, graph: GraphContext, x: torch.Tensor) -> torch.Tensor:
        return self.forward_units(graph, x, 0, len(self.convs))


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                dropout: float = 0.5, heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0,
                residual: bool = False, batchnorm: bool = False, *, alpha: float = 0.1, theta: float = 0.5,
                hops: int | None = None, jk: str = "concat", conv: str = "gcn", num_bases: int | None = None,
                groups: int = 2, reversible: bool = True, num_relations: int = 1, attention: str = "sparse",
                dense_every: int = 10, dense_layers: tuple = (), far_prior: bool = True, pe_dim: int = 8,
                global_token: bool = False,
                max_degree: int = 64, max_spd: int = 2, graph_level: bool = False,
                gat_projection: str = "linear") -> nn.Module:
    """Build a node classifier by name; see :class:`GNN` and the model classes for the layouts.

    Args:
        name: one of :data:`MODELS`.
        in_dim: input features per node.
        hidden: hidden width (features per head for GAT; unused by ``sgc``).
        out_dim: classes (logits per node).
        num_layers: graph convolutions (>= 1) of ``gcn``/``sage``/``gat``/``jknet``/``rgcn``, reversible
            blocks of ``revgcn``/``revgat``, GCNII layers of
            ``gcn2``, linear layers of ``mlp`` and of the MLP of ``appnp``/``dagnn`` (unused by ``sgc``).
        dropout: feature dropout (where each model puts it: see its class).
        heads: GAT heads in hidden layers (``revgat``: heads per group); out_heads: GAT heads
            (averaged) in the output layer.
        attn_dropout: GAT (and ``revgat``) attention-coefficient dropout.
        gat_projection: GAT's projection, ``"linear"`` or ``"relu"`` (DistGNN-MB's modified GAT; :class:`GATConv`).
        residual: add (projected) skip connections (``gcn``/``sage``/``gat``).
        batchnorm: DistBatchNorm after every hidden convolution (``gcn``/``sage``/``gat``).
        alpha: ``gcn2`` initial-residual weight, ``appnp`` teleport probability.
        theta: ``gcn2``'s lambda (``beta_l = log(theta / l + 1)``).
        hops: propagation steps K of ``appnp`` (10), ``sgc`` (2), ``dagnn`` (10); None: that default.
        jk: ``jknet`` combination: ``concat``, ``max`` or ``attention``.
        conv: ``jknet`` layers: ``gcn`` or ``sage``.
        num_bases: ``rgcn`` basis matrices per layer (None: a full weight per relation).
        groups: ``revgcn``/``revgat`` channel groups per reversible block (``hidden`` divisible by it).
        reversible: ``revgcn``/``revgat`` recompute activations in the backward pass (False: the same
            residual network with plain autograd, which keeps them).
        num_relations: edge types of the graph (``graph.num_relations``; only ``rgcn`` uses it).
        attention, dense_every, dense_layers, far_prior: ``gt``/``graphormer`` attention schedule
            (:class:`hpc_graph.nn._transformer.AttentionSchedule`) and the far pairs' count prior in its
            dense layers.
        pe_dim, global_token: ``gt`` positional-encoding columns and global token.
        max_degree: ``graphormer`` degree-embedding cap.
        max_spd: ``graphormer`` shortest-path distance cap of the structural bias (``max_spd + 4`` buckets:
            self, 1..max_spd hops, farther, global token, unreachable).
        graph_level: the data is a batch of graphs with one label each (``graph.num_graphs > 0``): the
            graph transformers read out from one global token per graph (``gt`` gets its tokens whatever
            ``global_token`` says); every other model is wrapped in :class:`GraphReadout` (mean of its node
            outputs per graph).
    Returns:
        a module with ``forward(graph, x) -> float[num_nodes, out_dim]`` (``[num_graphs, out_dim]`` for
        graph-level data) and ``message_passing_layers``.
    Raises:
        ValueError naming ``model.<field>``: an unknown model, a bad value, or an option set (to a
        value other than its default) for a model that does not use it.
    """
    if name not in _BUILTIN_MODELS:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {list(MODELS)}")
    given = {"alpha": alpha, "theta": theta, "hops": hops, "jk": jk, "conv": conv, "num_bases": num_bases,
             "groups": groups, "reversible": reversible, "attention": attention, "dense_every": dense_every,
             "dense_layers": tuple(dense_layers), "far_prior": far_prior, "pe_dim": pe_dim,
             "global_token": global_token,
             "max_degree": max_degree, "max_spd": max_spd}
    for option, (users, default) in MODEL_OPTIONS.items():
        if name not in users and given[option] != default:
            raise ValueError(f"model.{option}: only used by model {' or '.join(map(repr, users))}, "
                             f"but model.name is {name!r}")
    if graph_level and name not in ("gt", "graphormer"):
        return GraphReadout(build_model(name, in_dim, hidden, out_dim, num_layers, dropout, heads, out_heads,
                                        attn_dropout, residual, batchnorm, alpha=alpha, theta=theta, hops=hops,
                                        jk=jk, conv=conv, num_bases=num_bases, groups=groups,
                                        reversible=reversible, num_relations=num_relations))
    stack = {"heads": heads, "out_heads": out_heads, "attn_dropout": attn_dropout, "residual": residual,
             "batchnorm": batchnorm, "gat_projection": gat_projection}
    if name in STACK_MODELS:
        return GNN(name, in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout, **stack)
    for option, default in STACK_OPTIONS.items():
        if stack[option] != default and name not in SHARED_STACK_OPTIONS.get(option, ()):
            raise ValueError(f"model.{option}: only used by model {' or '.join(map(repr, STACK_MODELS))}, "
                             f"but model.name is {name!r}")
    steps = message_passing_layers(name, num_layers, hops)
    if name in ("gt", "graphormer"):
        bad = [x for x in dense_layers if x >= num_layers]
        if bad:
            raise ValueError(f"model.dense_layers: layers {bad} do not exist (model.num_layers is {num_layers})")
        schedule = AttentionSchedule(attention, dense_every, tuple(dense_layers), far_prior)
        if name == "gt":
            return GT(in_dim, hidden, out_dim, num_layers=num_layers, heads=heads, dropout=dropout, pe_dim=pe_dim,
                      schedule=schedule, global_token=global_token or graph_level)
        if isinstance(max_spd, bool) or not isinstance(max_spd, int) or not 1 <= max_spd <= 250:
            raise ValueError(f"model.max_spd: must be an integer in [1, 250], got {max_spd!r}")
        return Graphormer(in_dim, hidden, out_dim, num_layers=num_layers, heads=heads, dropout=dropout,
                          max_degree=max_degree, max_spd=max_spd, schedule=schedule)
    if name == "gcn2":
        return GCNII(in_dim, hidden, out_dim, num_layers=num_layers, alpha=alpha, theta=theta, dropout=dropout)
    if name == "jknet":
        return JKNet(in_dim, hidden, out_dim, num_layers=num_layers, jk=jk, conv=conv, dropout=dropout)
    if name == "appnp":
        return APPNP(in_dim, hidden, out_dim, num_layers=num_layers, hops=steps, alpha=alpha, dropout=dropout)
    if name == "revgcn":
        return RevGCN(in_dim, hidden, out_dim, num_layers=num_layers, groups=groups, dropout=dropout,
                      reversible=reversible)
    if name == "revgat":
        return RevGAT(in_dim, hidden, out_dim, num_layers=num_layers, groups=groups, heads=heads, dropout=dropout,
                      attn_dropout=attn_dropout, reversible=reversible)
    if name == "rgcn":
        return RGCN(in_dim, hidden, out_dim, num_relations, num_layers=num_layers, num_bases=num_bases,
                    dropout=dropout)
    if name == "mlp":
        return MLPNet(in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout)
    if name == "sgc":
        return SGC(in_dim, out_dim, hops=steps, dropout=dropout)
    return DAGNN(in_dim, hidden, out_dim, num_layers=num_layers, hops=steps, dropout=dropout)
