"""``Trainer``: node-classification training on any engine.

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
  ranks agree (:mod:`hpc_graph.train.preflight`), so a bad config, data path, part file
  or resume is one ``ConfigError``/``DataError`` on every rank; any other exception on
  one rank logs ``rank R: ...`` and aborts the whole job (``MPI_Abort``); a NaN/Inf loss
  or gradient on any rank is noticed by all (``train.on_nonfinite``). The environment
  variable ``HPC_GRAPH_DEBUG_FAIL="rank=R,epoch=E,kind=exception|nan|exit"`` injects such
  a failure (:mod:`hpc_graph.train.faults`, a step hook).

The parts: this module wires engine, model, optimiser and metrics together and runs the
epochs; :mod:`~hpc_graph.train.preflight` checks before anything is loaded;
:mod:`~hpc_graph.train.loops` holds one training loop per engine kind (the engine's
``kind`` selects it); :mod:`~hpc_graph.train.checkpoint` saves and restores;
:mod:`~hpc_graph.train.recipes` and :mod:`~hpc_graph.train.cotrain` hold the accuracy
recipes and the LM co-training.
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
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from data_io.errors import DataError, atomic_output
from hpc_graph.comm.malloc import malloc_policy
from hpc_graph.engines import create_engine
from hpc_graph.engines.base import Engine
from hpc_graph.graph.dist_graph import row_normalize
from hpc_graph.nn import optim
from hpc_graph.nn.models import ModelSpec, build_from_config, check_forward, register_model, spec_for
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.config import Config, ConfigError, config_to_dict, validate_config
from hpc_graph.train.faults import DEBUG_FAIL_ENV  # noqa: F401 - documented here, re-exported
from hpc_graph.train.loops import LOOPS, DivergedError, DivergenceWatch, NonFiniteLossError  # noqa: F401
from hpc_graph.train.metrics import MERGED_METRICS, MetricsWriter, ProgressBar, merge_metrics, peak_rss_mb
from hpc_graph.train.preflight import (agreed, check_memory, choose_engine, fail_fast, malloc_threshold,  # noqa: F401
                                       preflight)
from hpc_graph.train.recipes import CorrectAndSmooth, LabelAugmentation, dataset_node_ids
from hpc_graph.train.signals import EXIT_PREEMPTED, Preempted, StopSignal
from hpc_graph.train.steps import broadcast_parameters, global_count, seed_stream

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_SPLITS = ("train", "val", "test")
SPARSE_MAX_DENSITY = 0.1


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


def trainer_inputs(feat: torch.Tensor, label: torch.Tensor, masks: dict[str, torch.Tensor], feature_norm: str,
                   feature_layout: str, train_rows: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """What the trainer trains on, from an engine's ``feat``, ``label`` and ``masks``: the input features
    (divided by their row sums with ``feature_norm: row``, a new tensor; sparse CSR per ``feature_layout``), the
    labels, the masks restricted to labelled rows, and the training rows' ids. On tensors without data (the
    planner) ``train_rows`` gives the number of training rows."""
    if feature_norm == "row":
        feat = row_normalize(feat)
    x = feat if feat.is_meta else to_layout(feat, feature_layout)
    masks = {k: masks[k] & (label >= 0) for k in _SPLITS}
    if feat.is_meta:
        train_idx = torch.empty(int(train_rows or 0), dtype=torch.int64, device="meta")
    else:
        train_idx = masks["train"].nonzero().squeeze(1)
    return x, label, masks, train_idx


def input_layout(config: Any) -> str:
    """``data.feature_layout``, with ``auto`` resolved to ``dense`` for a model that does not declare sparse CSR
    input (:attr:`~hpc_graph.nn.models.ModelSpec.sparse_input`; the built-in models take it)."""
    from hpc_graph.nn.models import model_spec

    layout = config.data.feature_layout
    if layout == "auto" and not model_spec(config.model.name).sparse_input:
        return "dense"
    return layout


def engine_options_from_config(config: Any, engine_name: str) -> dict[str, Any]:
    """The options engine ``engine_name`` takes from a config (:meth:`Engine.options_from_config
    <hpc_graph.engines.base.Engine.options_from_config>`)."""
    from hpc_graph.engines import engine_class

    return engine_class(engine_name, config.data.path).options_from_config(config)


class Trainer:
    """Train ``config.model`` on ``config.data`` with the configured engine.

    Args:
        config: a :class:`~hpc_graph.train.config.Config` (validated again here).
        comm: a :class:`hpc_graph.comm.Communicator`; default
            ``get_communicator(config.train.comm_backend)``.
        model: a model of one's own instead of ``config.model.name``'s: a ``torch.nn.Module`` whose
            ``forward(graph, x)`` asks ``graph`` (a :class:`~hpc_graph.graph.base.GraphContext`) to aggregate,
            a factory ``model(in_dim, out_dim, model_section) -> nn.Module``, or a
            :class:`~hpc_graph.nn.models.ModelSpec`. It is registered under a name of its own
            (``config.model.name`` becomes ``"<module.Name>"``), so that the memory check and ``plan`` build it
            too; the config's other ``model`` fields reach a factory as ``model_section``. A module given as
            such is trained in place (its parameters are broadcast from rank 0 first).
        resume: a run directory to continue from its newest valid checkpoint (the run continues there).
        force_memory: start even when the predicted peak exceeds the memory available.
        resume_if_possible: with ``resume``: start afresh from ``config`` when that directory holds no
            checkpoint file yet (every rank must see the same), instead of refusing.

    Attributes: ``model``, ``engine``, ``graph`` (``engine.graph``), ``feat``
    (possibly row-normalised; sparse CSR per ``data.feature_layout``), ``optimizer``, ``scheduler``, ``comm``, ``rank``,
    ``size``, ``run_dir``, ``best`` (dict: ``val_acc``, ``test_acc``, ``epoch``),
    ``best_state`` (CPU copy of the model's state at the best validation accuracy).
    Raises ConfigError (a ValueError naming the field) for settings that cannot work here.
    """

    def __init__(self, config: Config, comm: Any = None, *, model: Any = None,
                 resume: str | os.PathLike | None = None, force_memory: bool = False,
                 resume_if_possible: bool = False):
        self._given_model: nn.Module | None = None
        if model is not None:
            config, self._given_model = _adopt_model(config, model)
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
        # a frozen peer ends the job instead of hanging it; preempted already: 75, the scripts resubmit
        comm.set_timeout(config.comm.timeout, self._stall_status)
        tc = config.train
        self.stop = StopSignal()
        self._stop_agreed = False
        self._identity: dict[str, Any] | None = None
        self.resumed_from: Path | None = None
        #: objects with ``before_step(trainer, epoch)`` and ``on_loss(trainer, epoch, iteration, loss) -> loss``
        #: (:mod:`hpc_graph.train.faults`); empty unless a test or ``HPC_GRAPH_DEBUG_FAIL`` installs one
        self.step_hooks: list[Any] = []
        # every rank checks its inputs; all agree before anything collective
        state = preflight(self, resume, optional=resume_if_possible)
        check_memory(self, force_memory)  # refuse (on every rank) what cannot fit, before loading anything
        if resume is not None:
            tc.run_dir = str(resume)
        with fail_fast(self):
            self._build(state)

    def _stall_status(self) -> int:
        """Exit status of a job the stall watchdog ends: 75 when a stop signal had arrived (preempted; the job
        scripts resubmit it and it resumes from its last checkpoint), else 1."""
        stop = getattr(self, "stop", None)
        return EXIT_PREEMPTED if stop is not None and stop.requested else 1

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
        self.feat, self.label, self.masks, self.train_idx = trainer_inputs(
            self.engine.feat, self.engine.label, self.engine.masks, config.data.feature_norm,
            input_layout(config))
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
        if self._given_model is not None:
            self.model = self._given_model.to(device=self.device, dtype=self.dtype)
        else:
            self.model = build_from_config(mc, in_dim, self.engine.num_classes,
                                           num_relations=self.graph.num_relations,
                                           graph_level=self.graph.num_graphs > 0).to(device=self.device,
                                                                                     dtype=self.dtype)
        try:
            check_forward(self.model, mc.name)
        except ValueError as exc:
            raise agreed(ConfigError(str(exc))) from None
        broadcast_parameters(self.model, comm)
        # The training stream (dropout keys, sampling) starts here, after the weights were drawn, so that a
        # model given as a module trains as the same model built here does. Engines without a shared stream
        # decorrelate their ranks' dropout (the replicas are equal now).
        seed_stream(tc.seed, comm, self.engine)
        if state is not None:  # before the model is handed over: a pipeline keeps its checkpoint's stage split
            engine_state = state.get("engine_state") or {}
            self.engine.load_state_dict(engine_state[self.rank] if isinstance(engine_state, list) else engine_state)
        try:
            self.engine.check_model(self.model)
        except ValueError as exc:
            raise agreed(ConfigError(str(exc))) from None
        self.engine.attach_model(self.model, self.feat)  # a pipeline engine keeps its stage's layers only
        self.pipeline = self.engine.kind == "pipeline"
        self.params = [p for p in self.model.parameters() if p.requires_grad and not p.is_meta]
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()

        self.num_train = global_count(self.train_idx.numel(), comm, self.engine)
        if self.num_train == 0:
            what = ("graphs (/graphs/train_mask)" if self.graph.num_graphs else "nodes (/node/train_mask)")
            raise agreed(ConfigError(f"data.path: {config.data.path} has no labelled training {what}"))
        self.run_dir = Path(tc.run_dir) if tc.run_dir else Path(self._default_run_dir())
        self.best: dict[str, Any] = {"val_acc": -math.inf, "test_acc": None, "epoch": None}
        self.best_state: dict[str, torch.Tensor] | None = None
        self.epoch = 0
        self._last_eval: dict[str, Any] = {}
        self._last_loss = float("nan")
        self._divergence = DivergenceWatch(tc.diverge_factor, tc.nonfinite_streak)
        if state is not None:
            ckpt.restore_trainer(self, state)
        log.info("trainer: engine %s, %d rank(s), model %s, %d parameters, %d training "
                 + ("graphs" if self.graph.num_graphs else "nodes") + "%s",
                 self.engine_name, self.size, mc.name, sum(p.numel() for p in self.params), int(self.num_train),
                 f", resumed from {self.resumed_from} (epoch {self.epoch})" if state is not None else "")

    def _start_cotraining(self) -> None:
        """Build the LM co-training (``lm.*``): the GNN's input becomes ``features | LM embedding | flag``."""
        if not self.engine.cotraining:
            raise agreed(ConfigError(f"lm.enabled: language-model co-training does not run on engine "
                                     f"{self.engine_name!r}"))
        from hpc_graph.train.cotrain import CoTraining

        tc = self.config.train
        try:
            self.cotrain = CoTraining(self.config.lm, self.config.data.path, dataset_node_ids(self.engine),
                                      self.comm, tc.epochs, tc.seed, self.dtype)
        except (ImportError, FileNotFoundError, ValueError, DataError) as exc:
            raise agreed(ConfigError(f"lm: {exc}")) from None
        self._base_feat = self.feat
        self.feat = self.cotrain.inputs(self._base_feat)
        if self.cotrain.interleaver is not None:
            self.engine.idle_hook = self.cotrain.interleaver.wait

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
        """One epoch: the loop the engine's kind selects (:mod:`hpc_graph.train.loops`): a full-batch step,
        every mini-batch iteration of a sampling engine, or a pipeline pass.

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
        for hook in self.step_hooks:
            hook.before_step(self, epoch)
        loss, ok = LOOPS[self.engine.kind](self, epoch)
        self._divergence.update(epoch, loss, ok)  # DivergedError on every rank alike
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
        with self._weights(use_best):
            self.model.eval()
            with self.engine.evaluation():
                probs = self.model(self.graph, self.eval_inputs()).softmax(1)
                cs = CorrectAndSmooth.from_config(self.config.recipes)
                out = cs(self.graph, probs, self.label, self.masks["train"])
        self.cs_probs = out
        self.cs_result = {"before": self._accuracies(probs.argmax(1)), "after": self._accuracies(out.argmax(1))}
        if self.rank == 0:
            b, a = self.cs_result["before"], self.cs_result["after"]
            log.info("correct & smooth: val acc %s -> %s, test acc %s -> %s", _fmt_acc(b["val_acc"]),
                     _fmt_acc(a["val_acc"]), _fmt_acc(b["test_acc"]), _fmt_acc(a["test_acc"]))
        return self.cs_result

    def request_stop(self) -> None:
        """Ask the loop to stop as a SIGTERM would: after the current epoch, with a checkpoint (:class:`Preempted`)."""
        self.stop.request()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Accuracy on each split over all ranks: ``{"train_acc", "val_acc", "test_acc"}`` (None if a split is
        empty)."""
        self.model.eval()
        with self.engine.evaluation():
            if self.pipeline:
                from hpc_graph.train.pipeline import predict

                pred = predict(self.engine, self.model, self.eval_inputs())
            else:
                pred = self.model(self.graph, self.eval_inputs()).argmax(1)
        return self._accuracies(pred)

    @contextlib.contextmanager
    def _weights(self, use_best: bool) -> Iterator[None]:
        """The best-validation parameters in the model for the block (when ``use_best`` and an evaluation kept
        them), the current ones restored after it."""
        current = None
        if use_best and self.best_state is not None:
            current = _cpu(self.model.state_dict())
            self.model.load_state_dict(copy.deepcopy(self.best_state))
        try:
            yield
        finally:
            if current is not None:
                self.model.load_state_dict(current)

    @torch.no_grad()
    def predict(self, use_best: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's output for the nodes this rank holds, in evaluation mode: ``(ids, out)`` with ``ids``
        int64[num_nodes] their dataset ids and ``out`` float[num_nodes, C] the model's output rows (a classifier's
        logits; a model that returns embeddings, its embeddings). Collective: every rank calls it. ``use_best``:
        with the best-validation parameters when an evaluation kept them (the current ones are restored)."""
        with self._weights(use_best):
            self.model.eval()
            with self.engine.evaluation():
                if self.pipeline:
                    from hpc_graph.train.pipeline import predict

                    out = predict(self.engine, self.model, self.eval_inputs(), outputs=True)
                else:
                    out = self.model(self.graph, self.eval_inputs())
        return dataset_node_ids(self.engine).to(torch.int64), out

    def write_predictions(self, path: str | os.PathLike, use_best: bool = True) -> Path:
        """Every node's model output (:meth:`predict`) into the HDF5 file ``path``: ``/node/output`` float32[N, C],
        row i the node of dataset id i (rows no rank holds stay NaN), attributes ``engine``, ``model``, ``epoch``.
        Collective; the ranks write in turn into one file, which appears at ``path`` only when complete (a
        temporary beside it until then). Returns the path."""
        import h5py

        from data_io.integrity import create_dataset, seal

        ids, out = self.predict(use_best)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        n, c = int(self.graph.global_num_nodes), int(out.shape[1])
        if self.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            with h5py.File(tmp, "w") as f:
                ds = create_dataset(f, "node/output", shape=(n, c), dtype="float32", fillvalue=np.nan,
                                    chunks=(max(1, min(n, (1 << 20) // max(c, 1))), c))
                ds.attrs.update({"engine": self.engine_name, "model": self.config.model.name,
                                 "epoch": int(self.best["epoch"] if use_best and self.best_state is not None
                                              else self.epoch)})
        writers = [0] if self.engine.replicated else range(self.size)
        order = torch.argsort(ids)
        rows, values = ids[order].cpu().numpy(), out[order].float().cpu().numpy()
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1  # runs of consecutive ids: one slice write each
        for writer in writers:
            if self.size > 1:
                self.comm.barrier()
            if writer == self.rank:
                with h5py.File(tmp, "r+") as f:
                    ds = f["node/output"]
                    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(rows)]):
                        if hi > lo:
                            ds[rows[lo]:rows[hi - 1] + 1] = values[lo:hi]
        if self.size > 1:
            self.comm.barrier()
        if self.rank == 0:
            with h5py.File(tmp, "r+") as f:
                seal(f)
            os.replace(tmp, path)
        return path

    def _accuracies(self, pred: torch.Tensor) -> dict[str, float | None]:
        """Global accuracy of the owned nodes' predictions ``pred`` int64[N] on each split (one all-reduce)."""
        counts = []
        for split in _SPLITS:
            m = self.masks[split]
            counts += [float((pred[m] == self.label[m]).sum()), float(m.sum())]
        t = torch.tensor(counts, dtype=torch.float64)
        if not self.engine.replicated:
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
        if self.rank == 0:
            ckpt.clean_orphans(self.run_dir, self.size)
        with fail_fast(self), self.stop, self._pid_file():
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
                            raise agreed(exc)
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
        """Write ``RUN_DIR/checkpoints/ckpt-<epoch>.pt`` (collective: every rank calls it; rank 0 writes;
        :func:`hpc_graph.train.checkpoint.save_trainer`)."""
        return ckpt.save_trainer(self)

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
            ckpt.load_model_state(self, copy.deepcopy(self.best_state))

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state on CPU; collective for a pipeline of several stages (each gives its part)."""
        return ckpt.model_state(self)


# -- module helpers ------------------------------------------------------------------------------
def _adopt_model(config: Config, model: Any) -> tuple[Config, nn.Module | None]:
    """``config`` naming ``model`` (registered under ``"<module.Name>"``), and the module to train when
    ``model`` is one."""
    given = model if isinstance(model, nn.Module) else None
    target = type(model) if given is not None or isinstance(model, ModelSpec) else model
    name = (model.name if isinstance(model, ModelSpec) else
            f"<{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(model).__name__)}>")
    try:
        if given is not None:
            check_forward(given, name)
            # the traits its class declares; the planner and the memory check build copies of the module
            spec = dataclasses.replace(spec_for(name, type(given)),
                                       build=lambda in_dim, out_dim, mc: copy.deepcopy(given))
        else:
            spec = spec_for(name, model)
        register_model(spec)  # refuses a built-in model's name
    except ValueError as exc:
        raise ConfigError(f"Trainer(model=...): {exc}") from None
    return dataclasses.replace(config, model=dataclasses.replace(config.model, name=name)), given


def _fmt_acc(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


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
