"""``Trainer``: full-batch node-classification training on any engine.

One training step (= one epoch, full batch) on every rank::

    logits = model(engine.graph, feat)                       # engine does the communication
    loss   = sum(CE over this rank's train nodes) / N_train  # N_train: GLOBAL count, all-reduced once
    loss.backward()
    all-reduce (sum) of all gradients + the loss, in ONE bucketed call
    optimizer.step(); scheduler.step()

Because every rank divides by the global number of training nodes, the summed
gradients equal the single-process gradient, so ``dp``/``sar`` on P ranks
follow the ``single`` engine's trajectory (up to floating-point order; exactly
without dropout). All ranks seed torch identically and rank 0 broadcasts the
initial parameters, so replicas start equal and stay equal.

Accuracy recipes (``recipes`` section, :mod:`hpc_graph.train.recipes`, docs/recipes.md): with
label augmentation each epoch's input features carry the drawn training nodes' one-hot labels
and the loss sums over the other training nodes, divided by their global count
(:meth:`Trainer.train_inputs`); evaluation feeds every training label
(:meth:`Trainer.eval_inputs`). With Correct & Smooth, :meth:`Trainer.fit` post-processes the
best-validation model's predictions after the last epoch (:meth:`Trainer.correct_and_smooth`)
and the summary gets ``correct_smooth: {before, after}`` accuracies.

Outputs in ``run_dir``: ``metrics.rank<R>.jsonl`` from every rank (one line per
epoch, see :mod:`hpc_graph.train.metrics`) and ``summary.json`` from rank 0.

Per-epoch metric fields: ``rank, epoch, loss, train_acc, val_acc, test_acc``
(accuracies ``null`` on epochs without evaluation), ``lr``, ``epoch_seconds``
(the training step: forward, backward, gradient all-reduce, optimizer),
``compute_seconds`` (= epoch_seconds - comm_seconds), ``comm_seconds`` and
``bytes_sent`` (this rank's traffic through the communicator during the step:
halo exchange + gradient all-reduce), ``modeled_comm_seconds`` and
``modeled_wait_seconds`` (with a modelled link, ``comm.link_bandwidth``: the
link time of the step's communication, and the part of it that was not hidden
behind computation; 0 without one), ``eval_seconds``, ``eval_bytes_sent``,
``peak_rss_mb`` (high-water resident memory so far), ``engine_stats``.
At the end rank 0 merges the per-rank files into ``metrics.jsonl``.

Lifecycle (see docs/configuration.md):

* checkpoints every ``train.checkpoint_every`` epochs and at the end
  (:mod:`hpc_graph.train.checkpoint`); ``Trainer(config, resume=RUN_DIR)``
  continues from the newest valid one, bit for bit as if never stopped;
* SIGTERM/SIGUSR1 on any rank: every rank finishes the epoch, rank 0 writes a
  checkpoint and :class:`~hpc_graph.train.signals.Preempted` is raised on every
  rank (the stop flag travels in the gradient all-reduce);
* failures: inputs are checked on every rank before anything collective and the
  ranks agree, so a bad config, data path, part file or resume is one
  ``ConfigError``/``DataError`` on every rank; any other exception on one rank
  logs ``rank R: ...`` and aborts the whole job (``MPI_Abort``); a NaN/Inf loss or
  gradient on any rank is noticed by all (``train.on_nonfinite``). The
  environment variable ``HPC_GRAPH_DEBUG_FAIL="rank=R,epoch=E,kind=exception|nan|exit"``
  injects such a failure.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch.nn import functional as F

from data_io.errors import DataError, atomic_output
from hpc_graph.comm.malloc import configure_malloc, malloc_policy
from hpc_graph.engines import create_engine, engine_class
from hpc_graph.engines.base import Engine
from hpc_graph.graph.dist_graph import row_normalize
from hpc_graph.nn import build_model, optim
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.config import (Config, ConfigError, check_paths, check_resolved_engine, config_to_dict,
                                    validate_config)
from hpc_graph.train.metrics import MERGED_METRICS, MetricsWriter, ProgressBar, merge_metrics, peak_rss_mb
from hpc_graph.train.recipes import CorrectAndSmooth, LabelAugmentation, check_recipes, dataset_node_ids
from hpc_graph.train.signals import Preempted, StopSignal

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_SPLITS = ("train", "val", "test")
SPARSE_MAX_DENSITY = 0.1
DEBUG_FAIL_ENV = "HPC_GRAPH_DEBUG_FAIL"
_DEBUG_KINDS = ("exception", "nan", "exit")
_DEBUG_EXIT_STATUS = 3


class NonFiniteLossError(RuntimeError):
    """A NaN/Inf loss or gradient with ``train.on_nonfinite: stop`` (raised on every rank; names epoch and ranks)."""


@dataclasses.dataclass(frozen=True)
class _DebugFailure:
    rank: int
    epoch: int
    kind: str


def _parse_debug_failure(text: str | None) -> _DebugFailure | None:
    """``"rank=2,epoch=1,kind=nan"`` -> _DebugFailure (ConfigError naming the variable when malformed)."""
    if text is None or not text.strip():
        return None
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("rank", "epoch", "kind"):
            raise ConfigError(f"{DEBUG_FAIL_ENV}: expected rank=R,epoch=E,kind=exception|nan|exit, got {text!r}")
        fields[key.strip()] = value.strip()
    try:
        rank, epoch = int(fields.get("rank", "0")), int(fields.get("epoch", "1"))
    except ValueError:
        raise ConfigError(f"{DEBUG_FAIL_ENV}: rank and epoch must be integers, got {text!r}") from None
    kind = fields.get("kind", "exception")
    if kind not in _DEBUG_KINDS or rank < 0 or epoch < 1:
        raise ConfigError(f"{DEBUG_FAIL_ENV}: need rank >= 0, epoch >= 1, kind in {_DEBUG_KINDS}, got {text!r}")
    return _DebugFailure(rank, epoch, kind)


def _agreed(exc: BaseException) -> BaseException:
    """Mark an exception that every rank raises at the same point (no abort needed; the CLI prints it once)."""
    exc._hpc_graph_agreed = True  # type: ignore[attr-defined]
    exc.collective = True  # type: ignore[attr-defined]
    return exc


def to_layout(x: torch.Tensor, layout: str, max_density: float = SPARSE_MAX_DENSITY) -> torch.Tensor:
    """Features as given (``dense``), as sparse CSR (``sparse``), or CSR when ``auto`` finds at most
    ``max_density`` of the entries non-zero: float[N, F] -> float[N, F]."""
    if layout == "dense" or x.numel() == 0:
        return x
    if layout == "auto" and float((x != 0).sum()) > max_density * x.numel():
        return x
    with warnings.catch_warnings():  # "sparse CSR support is in beta": linear layers are all we need
        warnings.simplefilter("ignore", UserWarning)
        return x.to_sparse_csr()


def choose_engine(name: str, size: int, data_path: str, model: str | None = None) -> str:
    """Resolve ``engine.name``: ``auto`` is ``single`` on one process with a dataset file, else ``dp``
    (for the graph transformers ``gt``/``graphormer``: ``single`` on one process, else ``seqpar``; on a
    graph-level dataset file, for every model: ``single`` on one process, else ``dp`` over batches of graphs).

    Raises ConfigError for ``single`` with more than one rank.
    """
    from hpc_graph.engines import is_graph_level

    if name == "auto":
        if is_graph_level(data_path):
            return "single" if size == 1 else "dp"
        if model in ("gt", "graphormer"):
            return "single" if size == 1 else "seqpar"
        return "single" if size == 1 and Path(data_path).is_file() else "dp"
    if name == "single" and size > 1:
        raise ConfigError(f"engine.name: 'single' runs on one process, but this job has {size} ranks; "
                          + ("use 'dp' (data parallel over the batches of graphs)" if is_graph_level(data_path) else
                             "use 'dp' or 'sar' with a partitioned dataset (hpc-graph partition)"))
    return name


def malloc_threshold(config: Any, engine_name: str) -> int:
    """The C allocator's mmap threshold a run gets (bytes; 0: glibc's adaptive default):
    ``train.malloc_mmap_threshold`` when set, else what the engine declares
    (:attr:`~hpc_graph.engines.base.Engine.malloc_mmap_threshold`)."""
    given = config.train.malloc_mmap_threshold
    if given is not None:
        return int(given)
    return int(engine_class(engine_name, config.data.path).malloc_mmap_threshold)


def engine_options_from_config(config: Any, engine_name: str) -> dict[str, Any]:
    """The options engine ``engine_name`` takes from a config: its ``OPTIONS`` found in the sections
    ``data``, ``engine``, ``sampler``, ``hec``, the training seed, and for ``apt`` what its cost model (and
    NFP's check) must know of the model."""
    from hpc_graph.engines import engine_class

    options = {k: getattr(section, k) for section in (config.data, config.engine, config.sampler, config.hec)
               for k in engine_class(engine_name, config.data.path).OPTIONS if hasattr(section, k)}
    options["seed"] = config.train.seed
    if engine_name == "apt":
        mc = config.model
        gat = mc.name == "gat"
        options.update(model=mc.name, heads=mc.heads if gat else 1, hidden=mc.hidden * (mc.heads if gat else 1),
                       dropout=mc.dropout, model_flags=tuple(f for f in ("residual", "batchnorm") if getattr(mc, f)))
    return options


class Trainer:
    """Train ``config.model`` on ``config.data`` with the configured engine.

    Args:
        config: a :class:`~hpc_graph.train.config.Config` (validated again here).
        comm: a :class:`hpc_graph.comm.Communicator`; default
            ``get_communicator(config.train.comm_backend)``.

    Attributes: ``model``, ``engine``, ``graph`` (``engine.graph``), ``feat``
    (possibly row-normalised; sparse CSR per ``data.feature_layout``), ``optimizer``, ``scheduler``, ``comm``, ``rank``,
    ``size``, ``run_dir``, ``best`` (dict: ``val_acc``, ``test_acc``, ``epoch``),
    ``best_state`` (CPU copy of the model's state at the best validation accuracy).
    Raises ConfigError (a ValueError naming the field) for settings that cannot work here.
    """

    def __init__(self, config: Config, comm: Any = None, *, resume: str | os.PathLike | None = None,
                 force_memory: bool = False):
        self.config = config = validate_config(config)
        if comm is None:
            from hpc_graph.comm import get_communicator
            comm = get_communicator(config.train.comm_backend)
        self.comm = comm
        from hpc_graph.comm.threads import configure_threads
        # before any kernel runs; collective over comm (the ranks sharing a host compare CPU masks)
        self.threads = configure_threads(config.train.threads, explicit_name="train.threads", comm=comm)
        self.rank, self.size = int(comm.rank), int(comm.size)
        if self.size > 1:  # one process (tests, notebooks) keeps Python's own exception handling
            from hpc_graph.comm import install_abort_handler
            install_abort_handler(comm)
        tc = config.train
        self.stop = StopSignal()
        self._stop_agreed = False
        self._identity: dict[str, Any] | None = None
        self.resumed_from: Path | None = None
        state = self._preflight(resume)  # every rank checks its inputs; all agree before anything collective
        self._check_memory(force_memory)  # refuse (on every rank) what cannot fit, before loading anything
        if resume is not None:
            tc.run_dir = str(resume)
        with self._fail_fast():
            self._build(state)

    def _build(self, state: dict[str, Any] | None) -> None:
        config, comm, tc = self.config, self.comm, self.config.train
        self.dtype = _DTYPES[tc.dtype]
        if config.comm.link_bandwidth:
            from hpc_graph.comm.link import LinkModel, parse_bandwidth, parse_latency
            link = LinkModel(parse_bandwidth(config.comm.link_bandwidth), parse_latency(config.comm.link_latency))
            comm.set_link(link)
            if self.rank == 0:
                log.info("trainer: modelled network link %s", link.describe())
        engine_options = engine_options_from_config(config, self.engine_name)
        self.engine: Engine = create_engine(self.engine_name, config.data.path, comm, self.device, self.dtype,
                                            engine_options)
        self.graph = self.engine.graph
        feat = self.engine.feat
        if config.data.feature_norm == "row":
            feat = row_normalize(feat)
        self.feat = to_layout(feat, config.data.feature_layout)
        self.label = self.engine.label
        self.masks = {k: self.engine.masks[k] & (self.label >= 0) for k in _SPLITS}
        self.train_idx = self.masks["train"].nonzero().squeeze(1)
        rc = config.recipes
        self.label_aug: LabelAugmentation | None = None
        if rc.label_aug > 0:
            self.label_aug = LabelAugmentation(rc.label_aug, tc.seed, self.label, self.masks["train"],
                                               dataset_node_ids(self.engine), self.engine.num_classes)
        self._eval_x: torch.Tensor | None = None
        self._loss_mask: torch.Tensor | None = None
        self.cs_result: dict[str, Any] | None = None
        self.cs_probs: torch.Tensor | None = None

        self.cotrain = None
        if config.lm.enabled:
            self._start_cotraining()
        self._seed_all(tc.seed)
        mc = config.model
        in_dim = self.engine.num_features + (self.engine.num_classes if self.label_aug is not None else 0)
        if self.cotrain is not None:
            in_dim += self.cotrain.extra_dim
        self.model = build_model(mc.name, in_dim, mc.hidden, self.engine.num_classes,
                                 num_layers=mc.num_layers, dropout=mc.dropout, heads=mc.heads,
                                 out_heads=mc.out_heads, attn_dropout=mc.attn_dropout, residual=mc.residual,
                                 batchnorm=mc.batchnorm, alpha=mc.alpha, theta=mc.theta, hops=mc.hops, jk=mc.jk,
                                 conv=mc.conv, num_bases=mc.num_bases, groups=mc.groups, reversible=mc.reversible,
                                 num_relations=self.graph.num_relations, attention=mc.attention,
                                 dense_every=mc.dense_every, dense_layers=tuple(mc.dense_layers),
                                 far_prior=mc.far_prior, pe_dim=mc.pe_dim,
                                 global_token=mc.global_token, max_degree=mc.max_degree, max_spd=mc.max_spd,
                                 graph_level=self.graph.num_graphs > 0,
                                 ).to(device=self.device, dtype=self.dtype)
        if self.size > 1:
            for t in self.model.state_dict().values():
                comm.bcast(t, 0)
            if not self.engine.shared_rng:  # replicas are equal now; decorrelate the ranks' dropout streams
                torch.manual_seed(tc.seed + 1_000_003 * self.rank)
        if state is not None:  # before the model is handed over: a pipeline keeps its checkpoint's stage split
            engine_state = state.get("engine_state") or {}
            self.engine.load_state_dict(engine_state[self.rank] if isinstance(engine_state, list) else engine_state)
        try:
            self.engine.check_model(self.model)
        except ValueError as exc:
            raise _agreed(ConfigError(str(exc))) from None
        self.engine.attach_model(self.model, self.feat)  # a pipeline engine keeps its stage's layers only
        self.pipeline = getattr(self.engine, "kind", "full") == "pipeline"
        self.params = [p for p in self.model.parameters() if p.requires_grad and not p.is_meta]
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()

        counts = torch.tensor([float(self.train_idx.numel())], dtype=torch.float64)
        if not getattr(self.engine, "replicated", False):  # every rank holds every node: nothing to add up
            comm.allreduce_(counts)
        self.num_train = float(counts.item())
        if self.num_train == 0:
            what = ("graphs (/graphs/train_mask)" if self.graph.num_graphs else "nodes (/node/train_mask)")
            raise _agreed(ConfigError(f"data.path: {config.data.path} has no labelled training {what}"))
        self.run_dir = Path(tc.run_dir) if tc.run_dir else Path(self._default_run_dir())
        self.best: dict[str, Any] = {"val_acc": -math.inf, "test_acc": None, "epoch": None}
        self.best_state: dict[str, torch.Tensor] | None = None
        self.epoch = 0
        self._last_eval: dict[str, Any] = {}
        self._last_loss = float("nan")
        if state is not None:
            self._restore(state)
        log.info("trainer: engine %s, %d rank(s), model %s, %d parameters, %d training "
                 + ("graphs" if self.graph.num_graphs else "nodes") + "%s",
                 self.engine_name, self.size, mc.name, sum(p.numel() for p in self.params), int(self.num_train),
                 f", resumed from {self.resumed_from} (epoch {self.epoch})" if state is not None else "")

    def _start_cotraining(self) -> None:
        """Build the LM co-training (``lm.*``): the GNN's input becomes ``features | LM embedding | flag``."""
        if self.engine_name not in ("single", "flow"):
            raise _agreed(ConfigError(f"lm.enabled: language-model co-training runs on engine 'single' or 'flow', "
                                      f"but engine.name resolved to {self.engine_name!r}"))
        from data_io.errors import DataError
        from hpc_graph.train.cotrain import CoTraining

        tc = self.config.train
        try:
            self.cotrain = CoTraining(self.config.lm, self.config.data.path, dataset_node_ids(self.engine),
                                      self.comm, tc.epochs, tc.seed, self.dtype)
        except (ImportError, FileNotFoundError, ValueError, DataError) as exc:
            raise _agreed(ConfigError(f"lm: {exc}")) from None
        self._base_feat = self.feat
        self.feat = self.cotrain.inputs(self._base_feat)
        if self.cotrain.interleaver is not None:
            self.engine.idle_hook = self.cotrain.interleaver.wait

    # -- input checks and failure handling ------------------------------------------------------
    def _preflight(self, resume: str | os.PathLike | None) -> dict[str, Any] | None:
        """Check config, data and checkpoint on every rank, then agree: on any rank's problem every rank
        raises (its own error, or one naming the failing rank). Returns the checkpoint state to resume."""
        config = self.config
        problem: BaseException | None = None
        state = None
        found = None
        try:
            self._debug_failure = _parse_debug_failure(os.environ.get(DEBUG_FAIL_ENV))
            check_paths(config)
            self.device = self._device(config.train.device)
            self.engine_name = choose_engine(config.engine.name, self.size, config.data.path, config.model.name)
            check_resolved_engine(config, self.engine_name)
            check_recipes(config, self.engine_name)
            try:
                engine_class(self.engine_name, config.data.path).check_options(
                    engine_options_from_config(config, self.engine_name), self.size)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            configure_malloc(malloc_threshold(config, self.engine_name))  # before a checkpoint or the data comes in
            if resume is not None:
                path, state = ckpt.latest_checkpoint(resume)
                found = (str(path), int(state.get("epoch", -1)))
                self._check_resume(path, state)
                self.resumed_from = path
            self._check_data()
        except (ConfigError, DataError, OSError) as exc:
            problem = exc
        if self.size > 1:
            reports = self.comm.allgather_object(
                (None if problem is None else f"{type(problem).__name__}: {problem}", found))
            failed = [(r, msg) for r, (msg, _) in enumerate(reports) if msg is not None]
            if problem is None and failed:
                r, msg = failed[0]
                more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
                raise ConfigError(f"rank {r}: {msg}{more}")
            if problem is None and len({f for _, f in reports}) > 1:
                raise ConfigError(f"--resume {resume}: ranks found different checkpoints "
                                  f"({sorted({f for _, f in reports})}); is the run directory shared?")
            if problem is not None and len(failed) == self.size and len({m for _, m in failed}) == 1:
                problem.collective = True  # every rank refused alike: the CLI prints it once (rank 0)
        if problem is not None:
            raise problem
        return state

    def _check_memory(self, force: bool) -> None:
        """Refuse to start when the ranks of a host would need more memory than it has (collective).

        Each rank predicts what it will still allocate (:func:`hpc_graph.plan.fullbatch.train_estimate`:
        single/dp/sar and the models the planner describes; no check otherwise); the ranks of a host add
        theirs up and compare the sum with the memory available there
        (:func:`data_io.memory.require_memory`); if any rank refuses, every rank raises the same
        :class:`~data_io.memory.MemoryRefusal` (one line; ``force`` only warns).
        """
        import socket

        from data_io.memory import MemoryRefusal, require_memory
        from hpc_graph.plan.fullbatch import train_estimate

        try:
            est = train_estimate(self.config, self.engine_name, self.rank, self.size)
        except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made is no reason to stop
            log.debug("memory check skipped: %s", exc)
            est = None
        host = socket.gethostname()
        mine = (host, None if est is None else est[0])
        reports = self.comm.allgather_object(mine) if self.size > 1 else [mine]
        local = [need for h, need in reports if h == host and need is not None]
        refusal = None
        if est is not None:
            what = f"train ({est[1]})" if len(local) == 1 else \
                f"train ({len(local)} ranks on host {host} together; {est[1]})"
            advice = ("flow holds the whole graph on every rank: use engine sar, dp or sylvie on a partition"
                      if self.engine_name == "flow" else "use more ranks or engine sar")
            try:
                require_memory(sum(local), what, force=force,
                               hint=f"{advice} (hpc-graph plan --memory-per-rank SIZE shows what fits)")
            except MemoryRefusal as exc:
                refusal = str(exc)
        verdicts = self.comm.allgather_object(refusal) if self.size > 1 else [refusal]
        refused = [(r, v) for r, v in enumerate(verdicts) if v is not None]
        if refused:
            r, text = refused[0]
            raise _agreed(MemoryRefusal(refusal if refusal is not None else f"rank {r}: {text}"))

    def _check_data(self) -> None:
        """The partition directory has one part per rank and this rank's part file opens (DataError otherwise)."""
        path = Path(self.config.data.path)
        if path.is_file():
            from data_io.dataset import dataset_task

            if dataset_task(path) == "graph":
                rc = self.config.recipes
                if rc.label_aug > 0 or rc.correct_smooth:
                    raise ConfigError("recipes: label_aug and correct_smooth work on node labels; "
                                      f"{path} is a graph-level dataset (one label per graph)")
                if self.engine_name == "dp":  # over batches of graphs (the config allows single or dp only)
                    return
        if self.engine_name in ("single", "seqpar", "flow"):
            if not path.is_file():
                raise ConfigError(f"data.path: engine {self.engine_name!r} needs a dataset file, {path} is a directory")
            return
        if self.engine_name in ("minibatch", "apt") and path.is_file() and self.size == 1:
            return  # one process may sample a whole dataset file
        if not path.is_dir():
            raise ConfigError(f"data.path: engine {self.engine_name!r} needs a partition directory "
                              f"(hpc-graph partition), {path} is a file"
                              + (" (a dataset file works on one process)" if self.engine_name in ("minibatch", "apt") else ""))
        from data_io.partition import part_file_name, read_partition_meta
        from hpc_graph.graph.dist_graph import check_ranks

        meta = read_partition_meta(path)
        check_ranks(int(meta["num_parts"]), self.comm, str(path))
        part = path / part_file_name(self.rank)
        try:
            with open(part, "rb") as fh:
                fh.read(8)
        except OSError as exc:
            raise DataError(f"{part}: cannot read part file of rank {self.rank} ({exc.strerror or exc})") from None

    def _check_resume(self, path: Path, state: dict[str, Any]) -> None:
        """ConfigError listing every difference between the checkpoint and this run (ranks, data, config)."""
        probs = []
        if state.get("world_size") != self.size:
            probs.append(f"number of ranks: the checkpoint was written by {state.get('world_size')} rank(s), "
                         f"this job has {self.size}")
        probs += ckpt.config_problems(state.get("config") or {}, config_to_dict(self.config),
                                      defaults=config_to_dict(Config()))
        if not probs:
            self._identity = ckpt.data_identity(self.config.data.path)
            probs += ckpt.identity_problems(state.get("data") or {}, self._identity)
        if probs:
            raise ConfigError(f"--resume: {path} does not match this run: " + "; ".join(probs))

    @contextlib.contextmanager
    def _fail_fast(self) -> Iterator[None]:
        """In a multi-rank job, an exception that the other ranks do not raise too ends the job now
        (logged as ``rank R: Type: message``, then ``comm.abort(1)``) instead of leaving them waiting."""
        try:
            yield
        except BaseException as exc:
            if self.size > 1 and not getattr(exc, "_hpc_graph_agreed", False):
                log.critical("rank %d: %s: %s (aborting all %d ranks)", self.rank, type(exc).__name__, exc,
                             self.size, exc_info=not isinstance(exc, (DataError, ConfigError)))
                _flush_logs()
                self.comm.abort(1)
            raise

    # -- setup helpers ------------------------------------------------------------------------
    def _device(self, name: str) -> torch.device:
        if name == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError("train.device: 'cuda' requested but torch sees no CUDA device")
        local_rank = int(getattr(self.comm, "local_rank", 0))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        # the rank's GPU becomes the current device of torch and of numba's kernels (one context per GPU)
        torch.cuda.set_device(device)
        try:
            from numba import cuda as numba_cuda

            numba_cuda.select_device(device.index)
        except Exception as exc:  # no CUDA target in this numba, or it cannot reach the driver
            raise ConfigError(f"train.device: 'cuda' needs numba's CUDA target for the GPU kernels "
                              f"(pip install -e '.[cuda13]', or '.[cuda12]' for a CUDA 12 driver): "
                              f"{type(exc).__name__}: {exc}") from None
        return device

    @staticmethod
    def _seed_all(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _optimizer(self) -> optim.Optimizer:
        oc = self.config.optim
        if oc.name == "adam":
            return optim.Adam(self.params, lr=oc.lr, weight_decay=oc.weight_decay)
        return optim.SGD(self.params, lr=oc.lr, momentum=oc.momentum, weight_decay=oc.weight_decay)

    def _scheduler(self):
        oc = self.config.optim
        if oc.schedule == "step":
            return optim.StepLR(self.optimizer, step_size=oc.step_size, gamma=oc.gamma)
        if oc.schedule == "cosine":
            return optim.CosineLR(self.optimizer, T_max=self.config.train.epochs)
        return None

    def _default_run_dir(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S") if self.rank == 0 else None
        if self.size > 1:
            stamp = self.comm.bcast_object(stamp, 0)
        return f"runs/{stamp}"

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _gpu_peak(self) -> dict[str, float]:
        """``{"peak_gpu_mb": ...}``: the most GPU memory torch's allocator has held for tensors so far
        (``torch.cuda.max_memory_allocated``, MiB) on a GPU run; empty on the CPU."""
        if self.device.type != "cuda":
            return {}
        return {"peak_gpu_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}

    # -- functional API -----------------------------------------------------------------------
    def step(self) -> float:
        """One epoch: a full-batch step, or every mini-batch iteration of a sampling engine.

        Returns the global training loss (mean CE over all training nodes of the epoch, or the mean
        over iterations of each iteration's global mean). The gradient all-reduce of every step also
        carries this rank's stop request (a signal) and whether its loss and gradients are finite, so
        every rank learns both without another collective.
        """
        self.model.train()
        epoch = self.epoch + 1
        t_start = time.perf_counter()
        self.engine.begin_epoch(epoch)
        if self.cotrain is not None:
            self.cotrain.begin_epoch()
        fail = self._debug_failure
        fail = fail if fail is not None and fail.rank == self.rank and fail.epoch == epoch else None
        if fail is not None and fail.kind != "nan":
            self._inject(fail)
        if getattr(self.engine, "kind", "full") == "minibatch":
            loss, ok = self._minibatch_epoch(epoch, fail)
        elif self.pipeline:
            from hpc_graph.train.pipeline import train_pass

            self.optimizer.zero_grad(set_to_none=False)
            if self._loss_mask is None:
                self._loss_mask = torch.zeros_like(self.masks["train"])
                self._loss_mask[self.train_idx] = True
            loss_t = train_pass(self.engine, self.model, self.feat, self.label, self._loss_mask, self.num_train)
            if fail is not None:  # kind "nan"
                loss_t = loss_t * float("nan")
            loss, ok = self._apply_gradients(loss_t, epoch, backward=False)
        else:
            self.optimizer.zero_grad(set_to_none=False)
            x, idx, count = self.train_inputs(epoch)
            logits = self.model(self.graph, x)
            loss_t = F.cross_entropy(logits[idx], self.label[idx], reduction="sum") / count
            if fail is not None:  # kind "nan"
                loss_t = loss_t * float("nan")
            loss, ok = self._apply_gradients(loss_t, epoch)
        if self.scheduler is not None:
            self.scheduler.step()
        if self.cotrain is not None and self.cotrain.end_epoch(epoch, loss if ok else float("nan")):
            self.feat = self.cotrain.inputs(self._base_feat)  # the collaborator's sync: fresh encodings
            self._eval_x = None
        self.epoch = epoch
        self.engine.end_epoch(epoch, loss if ok else float("nan"), time.perf_counter() - t_start)
        return loss

    def train_inputs(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The input features of training epoch ``epoch``, the owned nodes its loss sums over and the
        global count it divides by: ``(x float[N, F(+C)], idx int64[n_loss], count)``.

        Without label augmentation: ``(feat, train nodes, global train count)``. With it
        (``recipes.label_aug``): the epoch's drawn training labels appended to ``feat``, the other
        training nodes, and their global count (one all-reduce of a scalar; at least 1).
        """
        if self.label_aug is None:
            return self.feat, self.train_idx, self.num_train
        x, loss_mask = self.label_aug.epoch_inputs(self.feat, epoch)
        count = torch.tensor([float(loss_mask.sum())], dtype=torch.float64)
        if self.size > 1:
            self.comm.allreduce_(count)
        return x, loss_mask.nonzero().squeeze(1), max(float(count.item()), 1.0)

    def eval_inputs(self) -> torch.Tensor:
        """The input features of evaluation: ``feat``, with every training label appended under label
        augmentation (built once)."""
        if self.label_aug is None:
            return self.feat
        if self._eval_x is None:
            self._eval_x = self.label_aug.eval_inputs(self.feat)
        return self._eval_x

    @torch.no_grad()
    def correct_and_smooth(self, use_best: bool = True) -> dict[str, Any]:
        """Correct & Smooth (``recipes.cs_*``) on the model's predictions; collective (every rank calls it).

        Runs the model (the best-validation parameters when ``use_best`` and an evaluation happened,
        else the current ones, which are restored afterwards) in evaluation mode, post-processes the
        softmax with :class:`~hpc_graph.train.recipes.CorrectAndSmooth` through the engine's graph, and
        returns ``{"before": accuracies, "after": accuracies}`` (``train_acc``, ``val_acc``,
        ``test_acc`` each). The corrected and smoothed scores of the owned nodes are kept in
        ``cs_probs`` (float[N, C]) and the result in ``cs_result``.
        """
        current = None
        if use_best and self.best_state is not None:
            current = _cpu(self.model.state_dict())
            self.model.load_state_dict(copy.deepcopy(self.best_state))
        try:
            self.model.eval()
            with self.engine.evaluation():
                probs = self.model(self.graph, self.eval_inputs()).softmax(1)
                cs = CorrectAndSmooth.from_config(self.config.recipes)
                out = cs(self.graph, probs, self.label, self.masks["train"])
        finally:
            if current is not None:
                self.model.load_state_dict(current)
        self.cs_probs = out
        self.cs_result = {"before": self._accuracies(probs.argmax(1)), "after": self._accuracies(out.argmax(1))}
        if self.rank == 0:
            b, a = self.cs_result["before"], self.cs_result["after"]
            log.info("correct & smooth: val acc %s -> %s, test acc %s -> %s", _fmt_acc(b["val_acc"]),
                     _fmt_acc(a["val_acc"]), _fmt_acc(b["test_acc"]), _fmt_acc(a["test_acc"]))
        return self.cs_result

    def _minibatch_epoch(self, epoch: int, fail: _DebugFailure | None) -> tuple[float, bool]:
        """Every iteration of a sampling engine's epoch (the same number on every rank)."""
        eng = self.engine
        iters = eng.iterations(epoch)
        _, global_sizes = eng.batch_sizes(epoch, iters)
        losses, ok = [], True
        for it in range(iters):
            self.optimizer.zero_grad(set_to_none=False)
            batch = eng.batch(epoch, it).to(self.device)  # sampling engines build batches on the CPU
            logits = self.model(batch.graph, batch.feat)  # gathered rows: dense
            loss_t = F.cross_entropy(logits, batch.label, reduction="sum") / max(global_sizes[it], 1.0)
            if fail is not None and it == 0:  # kind "nan"
                loss_t = loss_t * float("nan")
            value, step_ok = self._apply_gradients(loss_t, epoch, f"iteration {it + 1} of ")
            losses.append(value)
            ok = ok and step_ok
        return (statistics.fmean(losses) if losses else float("nan")), ok

    def _apply_gradients(self, loss: torch.Tensor, epoch: int, where: str = "",
                         backward: bool = True) -> tuple[float, bool]:
        """Backward (unless done: a pipeline pass), one bucketed all-reduce of gradients and flags (flags only
        for a pipeline, whose stages hold disjoint parameters), optimiser step (or the ``on_nonfinite``
        policy); returns the global loss and whether it was finite everywhere."""
        if backward:
            loss.backward()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss_ok = bool(torch.isfinite(loss.detach()))
        # one fused max-abs over all gradients: NaN and Inf both make it non-finite
        grads_ok = bool(torch.isfinite(torch.nn.utils.get_total_norm([p.grad for p in self.params], float("inf"))))
        # [global loss, ranks asked to stop, per rank: loss non-finite, per rank: gradient non-finite]
        n = self.size
        flags = torch.zeros(2 + 2 * n, dtype=loss.dtype, device=loss.device)
        flags[0] = loss.detach()
        flags[1] = float(self.stop.requested)
        flags[2 + self.rank] = float(not loss_ok)
        flags[2 + n + self.rank] = float(not grads_ok)
        if n > 1:
            self.comm.allreduce_bucketed_(([] if self.pipeline else [p.grad for p in self.params]) + [flags])
        flags = flags.cpu()
        self._stop_agreed = bool(flags[1] > 0)
        bad_loss = [r for r in range(n) if flags[2 + r] != 0]
        bad_grad = [r for r in range(n) if flags[2 + n + r] != 0]
        if bad_loss or bad_grad:
            # a NaN born on one rank reaches the others' gradients through the halo exchange: name its source
            what, ranks = ("loss", bad_loss) if bad_loss else ("gradient", bad_grad)
            what = (f"non-finite {what} in {where}epoch {epoch} on rank{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(map(str, ranks))}")
            if self.config.train.on_nonfinite == "stop":
                raise _agreed(NonFiniteLossError(f"{what} (train.on_nonfinite: stop; try a lower optim.lr)"))
            log.warning("%s: optimiser step skipped on every rank (train.on_nonfinite: skip)", what)
            return float(flags[0]), False
        self.optimizer.step()
        return float(flags[0]), True

    def _inject(self, fail: _DebugFailure) -> None:
        """Fail as ``HPC_GRAPH_DEBUG_FAIL`` asks (kinds ``exception`` and ``exit``)."""
        what = f"rank {self.rank}: injected failure in epoch {fail.epoch} ({DEBUG_FAIL_ENV}={fail.kind})"
        if fail.kind == "exception":
            raise RuntimeError(what)
        log.critical("%s: exiting with status %d", what, _DEBUG_EXIT_STATUS)
        _flush_logs()
        os._exit(_DEBUG_EXIT_STATUS)

    def request_stop(self) -> None:
        """Ask the loop to stop as a SIGTERM would: after the current epoch, with a checkpoint (:class:`Preempted`)."""
        self.stop.request()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Accuracy on each split over all ranks: ``{"train_acc", "val_acc", "test_acc"}`` (None if a split is empty)."""
        self.model.eval()
        with self.engine.evaluation():
            if self.pipeline:
                from hpc_graph.train.pipeline import predict

                pred = predict(self.engine, self.model, self.eval_inputs())
            else:
                pred = self.model(self.graph, self.eval_inputs()).argmax(1)
        return self._accuracies(pred)

    def _accuracies(self, pred: torch.Tensor) -> dict[str, float | None]:
        """Global accuracy of the owned nodes' predictions ``pred`` int64[N] on each split (one all-reduce)."""
        counts = []
        for split in _SPLITS:
            m = self.masks[split]
            counts += [float((pred[m] == self.label[m]).sum()), float(m.sum())]
        t = torch.tensor(counts, dtype=torch.float64)
        if not getattr(self.engine, "replicated", False):
            self.comm.allreduce_(t)
        out = {}
        for k, split in enumerate(_SPLITS):
            correct, total = float(t[2 * k]), float(t[2 * k + 1])
            out[f"{split}_acc"] = correct / total if total > 0 else None
        return out

    # -- the loop -----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train up to ``train.epochs`` epochs, evaluate every ``train.eval_every``; return (and write) the summary.

        Continues from ``self.epoch`` (a resumed run's checkpoint epoch). Writes checkpoints as configured.
        Raises :class:`~hpc_graph.train.signals.Preempted` on every rank after a stop signal (checkpoint
        written), :class:`NonFiniteLossError` on every rank per ``train.on_nonfinite``.
        """
        tc = self.config.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._fail_fast(), self.stop, self._pid_file():
            return self._fit(tc)

    def _fit(self, tc) -> dict[str, Any]:
        start = self.epoch
        if self.rank == 0:  # rewritten at the end; never leave one that disagrees with the per-rank files
            (self.run_dir / MERGED_METRICS).unlink(missing_ok=True)
        bar = ProgressBar(max(tc.epochs - start, 0), enabled=tc.progress and self.rank == 0,
                          desc=f"train[{self.engine_name}]")
        every = tc.checkpoint_every
        last_saved = self.epoch if self.resumed_from is not None else None
        try:
            with MetricsWriter(self.run_dir, self.rank, start if self.resumed_from is not None else None) as writer:
                epoch_seconds = [float(r.get("epoch_seconds", 0.0)) for r in writer.previous]
                step_bytes = [int(r.get("bytes_sent", 0)) for r in writer.previous]
                for epoch in range(start + 1, tc.epochs + 1):
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.engine.reset_stats()
                    b0, c0 = self.comm.bytes_sent, self.comm.comm_seconds
                    m0, w0 = _modeled(self.comm)
                    t0 = time.perf_counter()
                    loss = self._last_loss = self.step()
                    self._sync()
                    dt = time.perf_counter() - t0
                    step_b, step_c = self.comm.bytes_sent - b0, self.comm.comm_seconds - c0
                    m1, w1 = _modeled(self.comm)
                    modeled, modeled_wait = m1 - m0, w1 - w0
                    engine_stats = self.engine.stats()
                    if self.cotrain is not None:
                        engine_stats.update(self.cotrain.stats())
                    evaluated = {"train_acc": None, "val_acc": None, "test_acc": None}
                    eval_s, eval_b = 0.0, 0
                    if epoch % tc.eval_every == 0 or epoch == tc.epochs:
                        b1, t1 = self.comm.bytes_sent, time.perf_counter()
                        evaluated = self._last_eval = self.evaluate()
                        self._sync()
                        eval_s, eval_b = time.perf_counter() - t1, self.comm.bytes_sent - b1
                        self._track_best(epoch, evaluated)
                    epoch_seconds.append(dt)
                    step_bytes.append(int(step_b))
                    writer.write({"epoch": epoch, "loss": loss, **evaluated, "lr": lr, "epoch_seconds": dt,
                                  "compute_seconds": max(dt - step_c, 0.0), "comm_seconds": step_c,
                                  "bytes_sent": int(step_b), "modeled_comm_seconds": modeled,
                                  "modeled_wait_seconds": modeled_wait,
                                  "eval_seconds": eval_s, "eval_bytes_sent": int(eval_b),
                                  "peak_rss_mb": peak_rss_mb(), **self._gpu_peak(),
                                  "engine_stats": engine_stats})
                    bar.update(loss=loss, val=evaluated["val_acc"], test=evaluated["test_acc"])
                    if evaluated["val_acc"] is not None:
                        log.debug("epoch %d: loss %.4f, val %.4f, test %.4f", epoch, loss,
                                  evaluated["val_acc"], evaluated["test_acc"] or float("nan"))
                    if epoch == tc.epochs or (every and epoch % every == 0) or self._stop_agreed:
                        path = self.save_checkpoint()
                        last_saved = epoch
                        if self._stop_agreed and epoch < tc.epochs:
                            exc = Preempted(epoch, path, self.stop.name)
                            if self.rank == 0:
                                log.info("%s", exc)
                            raise _agreed(exc)
                if last_saved != self.epoch:  # nothing left to train (a finished run resumed): still checkpoint
                    self.save_checkpoint()
                if self.config.recipes.correct_smooth:
                    self.correct_and_smooth()
                self.engine.close()
        finally:
            bar.close()
        summary = self._summary(epoch_seconds, step_bytes, self._last_eval, self._last_loss)
        if self.rank == 0:
            merge_metrics(self.run_dir)
        return summary

    @contextlib.contextmanager
    def _pid_file(self) -> Iterator[None]:
        """``RUN_DIR/pids/rank<R>`` holds this rank's process id while :meth:`fit` runs (to signal one rank)."""
        path = self.run_dir / "pids" / f"rank{self.rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path, force=True) as tmp:
            Path(tmp).write_text(f"{os.getpid()}\n", encoding="utf-8")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write ``RUN_DIR/checkpoints/ckpt-<epoch>.pt`` (collective: every rank calls it; rank 0 writes).

        Holds model, optimiser, scheduler, epoch, best-validation state, every rank's RNG states
        (gathered), the config, the data identity, the number of ranks and the parameter shapes.
        """
        rng = _rng_state(self.device)
        states = self.comm.allgather_object(rng) if self.size > 1 else [rng]
        model_state, best_state = self._model_state(), self.best_state
        optimizer_state: Any = self.optimizer.state_dict()
        engine_state: Any = self.engine.state_dict()
        if self.pipeline and self.size > 1:  # each stage holds its own parameters, optimiser and engine state
            parts = self.comm.allgather_object((self.best_state, optimizer_state, engine_state))
            optimizer_state = [opt for _, opt, _ in parts]
            engine_state = [eng for _, _, eng in parts]  # e.g. each stage's stale history
            if best_state is not None:
                best_state = {k: v for own, _, _ in parts for k, v in (own or {}).items()}
        lm_state = None
        if self.cotrain is not None:  # the LM is the same on every rank; its random stream is not
            lm_state = self.cotrain.state_dict()
            lm_state["rng"] = self.comm.allgather_object(lm_state["rng"]) if self.size > 1 else [lm_state["rng"]]
        path = ckpt.checkpoint_path(self.run_dir, self.epoch)
        if self.rank == 0:
            if self._identity is None:
                self._identity = ckpt.data_identity(self.config.data.path)
            state = {
                "epoch": self.epoch,
                "model": model_state,
                "optimizer": optimizer_state,
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                "best": dict(self.best),
                "best_state": best_state,
                "last_eval": dict(self._last_eval),
                "loss": self._last_loss,
                "rng": states,
                "config": config_to_dict(self.config),
                "data": self._identity,
                "world_size": self.size,
                "engine": self.engine_name,
                "engine_state": engine_state,
                "param_shapes": _shapes(self.model),
                "lm_state": lm_state,
            }
            path = ckpt.save_checkpoint(self.run_dir, self.epoch, state)
        if self.size > 1:
            self.comm.barrier()
        return path

    def _restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's training state into this (freshly built) trainer; this rank's RNG states too."""
        probs = ckpt.shape_problems(state.get("param_shapes") or {}, _shapes(self.model))
        if probs:
            raise _agreed(ConfigError(f"--resume: {self.resumed_from} does not match this run: " + "; ".join(probs)))
        self._load_model_state(state["model"])
        opt = state["optimizer"]
        self.optimizer.load_state_dict(opt[self.rank] if isinstance(opt, list) else opt)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        self.best = dict(state["best"])
        self.best_state = state.get("best_state")
        if self.best_state is not None and self.pipeline:
            self.best_state = self._owned(self.best_state)
        self._last_eval = dict(state.get("last_eval") or {})
        self._last_loss = float(state.get("loss", float("nan")))
        _set_rng_state(state["rng"][self.rank], self.device)
        if self.cotrain is not None:
            lm_state = state.get("lm_state")
            if lm_state is None or len(lm_state["rng"]) != self.size:
                raise _agreed(ConfigError(f"--resume: {self.resumed_from} holds no LM co-training state for "
                                          f"{self.size} rank(s) (lm.enabled)"))
            self.cotrain.load_state_dict(lm_state, self.rank, self.epoch)
            self.feat = self.cotrain.inputs(self._base_feat)

    def _track_best(self, epoch: int, evaluated: dict[str, Any]) -> None:
        val = evaluated["val_acc"]
        if val is not None and val > self.best["val_acc"]:
            self.best = {"val_acc": val, "test_acc": evaluated["test_acc"], "epoch": epoch}
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
                               if not v.is_meta}

    def _summary(self, epoch_seconds: list[float], step_bytes: list[int], last_eval: dict[str, Any],
                 loss: float) -> dict[str, Any]:
        mine = {"rank": self.rank, "peak_rss_mb": peak_rss_mb(), **self._gpu_peak(), "epoch_seconds": epoch_seconds,
                "num_parameters": sum(p.numel() for p in self.params),
                "bytes_per_epoch": float(np.mean(step_bytes)) if step_bytes else 0.0,
                "threads": _threads_in_use(self.threads), "malloc": malloc_policy()}
        ranks = self.comm.allgather_object(mine) if self.size > 1 else [mine]
        # an epoch lasts as long as its slowest rank
        slowest = [max(r["epoch_seconds"][e] for r in ranks) for e in range(len(epoch_seconds))]
        best_val = self.best["val_acc"] if self.best["epoch"] is not None else None
        summary = {
            "best_val_acc": best_val,
            "test_acc": self.best["test_acc"],
            "best_epoch": self.best["epoch"],
            "final": {"loss": loss, **last_eval},
            "epochs": len(epoch_seconds),
            "median_epoch_seconds": statistics.median(slowest) if slowest else None,
            "peak_rss_mb": [r["peak_rss_mb"] for r in ranks],
            **({"peak_gpu_mb": [r.get("peak_gpu_mb") for r in ranks]} if self.device.type == "cuda" else {}),
            "bytes_per_epoch": sum(r["bytes_per_epoch"] for r in ranks),
            "bytes_per_epoch_per_rank": [r["bytes_per_epoch"] for r in ranks],
            "world_size": self.size,
            "threads_per_rank": [r["threads"] for r in ranks],
            "malloc_per_rank": [r["malloc"] for r in ranks],
            "engine": self.engine_name,
            "num_parameters": (sum(r["num_parameters"] for r in ranks) if self.pipeline
                               else sum(p.numel() for p in self.params)),
            "parameters_per_rank": [r["num_parameters"] for r in ranks],
            "run_dir": str(self.run_dir),
            "config": config_to_dict(self.config),
        }
        if self.cs_result is not None:  # accuracies of the best-validation model before/after C&S
            summary["correct_smooth"] = self.cs_result
        if self.rank == 0:
            with atomic_output(self.run_dir / "summary.json", force=True) as tmp:
                tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return summary

    def load_best(self) -> None:
        """Load the parameters of the best-validation epoch into ``model`` (no-op before any evaluation)."""
        if self.best_state is not None:
            self._load_model_state(copy.deepcopy(self.best_state))

    def _owned(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The entries of a full model state this rank holds (a pipeline stage holds its units' only)."""
        mine = self.model.state_dict()
        return {k: v for k, v in state.items() if k in mine and not mine[k].is_meta}

    def _load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.pipeline:
            self.model.load_state_dict(self._owned(state), strict=False)
        else:
            self.model.load_state_dict(state)

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state on CPU; collective for a pipeline of several stages (each gives its part)."""
        own = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items() if not v.is_meta}
        if not self.pipeline or self.size == 1:
            return own
        return {k: v for part in self.comm.allgather_object(own) for k, v in part.items()}


# -- module helpers ------------------------------------------------------------------------------
def _fmt_acc(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _flush_logs() -> None:
    for h in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            h.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def _modeled(comm: Any) -> tuple[float, float]:
    """The communicator's modelled-link seconds so far: (total modelled, slept)."""
    return float(getattr(comm, "modeled_seconds", 0.0)), float(getattr(comm, "modeled_wait_seconds", 0.0))


def _threads_in_use(plan) -> dict[str, Any]:
    """The decided threads (and why) next to what numba and torch use now."""
    import numba
    from numba.np.ufunc import parallel

    return {**plan.as_dict(), "numba": numba.get_num_threads(), "numba_pool": int(parallel.NUM_THREADS),
            "torch": torch.get_num_threads()}


def _cpu(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


def _shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def _rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states: torch (CPU and, on a GPU, the device's), NumPy and ``random``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
