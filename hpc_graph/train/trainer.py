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

Outputs in ``run_dir``: ``metrics.rank<R>.jsonl`` from every rank (one line per
epoch, see :mod:`hpc_graph.train.metrics`) and ``summary.json`` from rank 0.

Per-epoch metric fields: ``rank, epoch, loss, train_acc, val_acc, test_acc``
(accuracies ``null`` on epochs without evaluation), ``lr``, ``epoch_seconds``
(the training step: forward, backward, gradient all-reduce, optimizer),
``compute_seconds`` (= epoch_seconds - comm_seconds), ``comm_seconds`` and
``bytes_sent`` (this rank's traffic through the communicator during the step:
halo exchange + gradient all-reduce), ``eval_seconds``, ``eval_bytes_sent``,
``peak_rss_mb`` (high-water resident memory so far), ``engine_stats``.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import random
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from data_io.errors import atomic_output
from hpc_graph.engines import create_engine
from hpc_graph.engines.base import Engine
from hpc_graph.nn import build_model
from hpc_graph.train.config import Config, ConfigError, check_paths, config_to_dict, validate_config
from hpc_graph.train.metrics import MetricsWriter, ProgressBar, peak_rss_mb

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_SPLITS = ("train", "val", "test")
SPARSE_MAX_DENSITY = 0.1


def row_normalize(x: torch.Tensor) -> torch.Tensor:
    """Divide every row by its sum (rows summing to 0 are left unchanged): float[N, F] -> float[N, F]."""
    s = x.sum(1, keepdim=True)
    return x / torch.where(s == 0, torch.ones_like(s), s)


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


def choose_engine(name: str, size: int, data_path: str) -> str:
    """Resolve ``engine.name``: ``auto`` is ``single`` on one process with a dataset file, else ``dp``.

    Raises ConfigError for ``single`` with more than one rank.
    """
    if name == "auto":
        return "single" if size == 1 and Path(data_path).is_file() else "dp"
    if name == "single" and size > 1:
        raise ConfigError(f"engine.name: 'single' runs on one process, but this job has {size} ranks; "
                          "use 'dp' or 'sar' with a partitioned dataset (hpc-graph partition)")
    return name


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

    def __init__(self, config: Config, comm: Any = None):
        self.config = config = validate_config(config)
        check_paths(config)
        if comm is None:
            from hpc_graph.comm import get_communicator
            comm = get_communicator(config.train.comm_backend)
        self.comm = comm
        self.rank, self.size = int(comm.rank), int(comm.size)
        if self.size > 1:  # one process (tests, notebooks) keeps Python's own exception handling
            from hpc_graph.comm import install_abort_handler
            install_abort_handler(comm)
        tc = config.train
        self.device = self._device(tc.device)
        self.dtype = _DTYPES[tc.dtype]
        self.engine_name = choose_engine(config.engine.name, self.size, config.data.path)
        self.engine: Engine = create_engine(self.engine_name, config.data.path, comm, self.device, self.dtype,
                                            {"prefetch": config.engine.prefetch})
        self.graph = self.engine.graph
        feat = self.engine.feat
        if config.data.feature_norm == "row":
            feat = row_normalize(feat)
        self.feat = to_layout(feat, config.data.feature_layout)
        self.label = self.engine.label
        self.masks = {k: self.engine.masks[k] & (self.label >= 0) for k in _SPLITS}
        self.train_idx = self.masks["train"].nonzero().squeeze(1)

        self._seed_all(tc.seed)
        mc = config.model
        self.model = build_model(mc.name, self.engine.num_features, mc.hidden, self.engine.num_classes,
                                 num_layers=mc.num_layers, dropout=mc.dropout, heads=mc.heads,
                                 out_heads=mc.out_heads, attn_dropout=mc.attn_dropout, residual=mc.residual,
                                 batchnorm=mc.batchnorm).to(device=self.device, dtype=self.dtype)
        if self.size > 1:
            for t in self.model.state_dict().values():
                comm.bcast(t, 0)
            # replicas are equal now; decorrelate the ranks' dropout streams
            torch.manual_seed(tc.seed + 1_000_003 * self.rank)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()

        counts = torch.tensor([float(self.train_idx.numel())], dtype=torch.float64)
        comm.allreduce_(counts)
        self.num_train = float(counts.item())
        if self.num_train == 0:
            raise ConfigError(f"data.path: {config.data.path} has no labelled training nodes (/node/train_mask)")
        self.run_dir = Path(tc.run_dir) if tc.run_dir else Path(self._default_run_dir())
        self.best: dict[str, Any] = {"val_acc": -math.inf, "test_acc": None, "epoch": None}
        self.best_state: dict[str, torch.Tensor] | None = None
        self.epoch = 0
        log.info("trainer: engine %s, %d rank(s), model %s, %d parameters, %d training nodes",
                 self.engine_name, self.size, mc.name, sum(p.numel() for p in self.params), int(self.num_train))

    # -- setup helpers ------------------------------------------------------------------------
    def _device(self, name: str) -> torch.device:
        if name == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError("train.device: 'cuda' requested but torch sees no CUDA device")
        local_rank = int(getattr(self.comm, "local_rank", 0))
        return torch.device("cuda", local_rank % torch.cuda.device_count())

    @staticmethod
    def _seed_all(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _optimizer(self) -> torch.optim.Optimizer:
        oc = self.config.optim
        if oc.name == "adam":
            return torch.optim.Adam(self.params, lr=oc.lr, weight_decay=oc.weight_decay)
        return torch.optim.SGD(self.params, lr=oc.lr, momentum=oc.momentum, weight_decay=oc.weight_decay)

    def _scheduler(self):
        oc = self.config.optim
        if oc.schedule == "step":
            return torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=oc.step_size, gamma=oc.gamma)
        if oc.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=self.config.train.epochs)
        return None

    def _default_run_dir(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S") if self.rank == 0 else None
        if self.size > 1:
            stamp = self.comm.bcast_object(stamp, 0)
        return f"runs/{stamp}"

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- functional API -----------------------------------------------------------------------
    def step(self) -> float:
        """One full-batch training step; returns the global training loss (mean CE over all train nodes)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        logits = self.model(self.graph, self.feat)
        idx = self.train_idx
        loss = F.cross_entropy(logits[idx], self.label[idx], reduction="sum") / self.num_train
        loss.backward()
        total = loss.detach().reshape(1).clone()
        if self.size > 1:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self.comm.allreduce_bucketed_([p.grad for p in self.params] + [total])
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.epoch += 1
        return float(total.item())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Accuracy on each split over all ranks: ``{"train_acc", "val_acc", "test_acc"}`` (None if a split is empty)."""
        self.model.eval()
        pred = self.model(self.graph, self.feat).argmax(1)
        counts = []
        for split in _SPLITS:
            m = self.masks[split]
            counts += [float((pred[m] == self.label[m]).sum()), float(m.sum())]
        t = torch.tensor(counts, dtype=torch.float64)
        self.comm.allreduce_(t)
        out = {}
        for k, split in enumerate(_SPLITS):
            correct, total = float(t[2 * k]), float(t[2 * k + 1])
            out[f"{split}_acc"] = correct / total if total > 0 else None
        return out

    # -- the loop -----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train ``train.epochs`` epochs, evaluate every ``train.eval_every``; return (and write) the summary."""
        tc = self.config.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        bar = ProgressBar(tc.epochs, enabled=tc.progress and self.rank == 0, desc=f"train[{self.engine_name}]")
        epoch_seconds: list[float] = []
        step_bytes: list[int] = []
        last_eval: dict[str, Any] = {}
        loss = float("nan")
        try:
            with MetricsWriter(self.run_dir, self.rank) as writer:
                for epoch in range(1, tc.epochs + 1):
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.engine.reset_stats()
                    b0, c0 = self.comm.bytes_sent, self.comm.comm_seconds
                    t0 = time.perf_counter()
                    loss = self.step()
                    self._sync()
                    dt = time.perf_counter() - t0
                    step_b, step_c = self.comm.bytes_sent - b0, self.comm.comm_seconds - c0
                    engine_stats = self.engine.stats()
                    evaluated = {"train_acc": None, "val_acc": None, "test_acc": None}
                    eval_s, eval_b = 0.0, 0
                    if epoch % tc.eval_every == 0 or epoch == tc.epochs:
                        b1, t1 = self.comm.bytes_sent, time.perf_counter()
                        evaluated = last_eval = self.evaluate()
                        self._sync()
                        eval_s, eval_b = time.perf_counter() - t1, self.comm.bytes_sent - b1
                        self._track_best(epoch, evaluated)
                    epoch_seconds.append(dt)
                    step_bytes.append(int(step_b))
                    writer.write({"epoch": epoch, "loss": loss, **evaluated, "lr": lr, "epoch_seconds": dt,
                                  "compute_seconds": max(dt - step_c, 0.0), "comm_seconds": step_c,
                                  "bytes_sent": int(step_b), "eval_seconds": eval_s, "eval_bytes_sent": int(eval_b),
                                  "peak_rss_mb": peak_rss_mb(), "engine_stats": engine_stats})
                    bar.update(loss=loss, val=evaluated["val_acc"], test=evaluated["test_acc"])
                    if evaluated["val_acc"] is not None:
                        log.debug("epoch %d: loss %.4f, val %.4f, test %.4f", epoch, loss,
                                  evaluated["val_acc"], evaluated["test_acc"] or float("nan"))
        finally:
            bar.close()
        return self._summary(epoch_seconds, step_bytes, last_eval, loss)

    def _track_best(self, epoch: int, evaluated: dict[str, Any]) -> None:
        val = evaluated["val_acc"]
        if val is not None and val > self.best["val_acc"]:
            self.best = {"val_acc": val, "test_acc": evaluated["test_acc"], "epoch": epoch}
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def _summary(self, epoch_seconds: list[float], step_bytes: list[int], last_eval: dict[str, Any],
                 loss: float) -> dict[str, Any]:
        mine = {"rank": self.rank, "peak_rss_mb": peak_rss_mb(), "epoch_seconds": epoch_seconds,
                "bytes_per_epoch": float(np.mean(step_bytes)) if step_bytes else 0.0}
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
            "bytes_per_epoch": sum(r["bytes_per_epoch"] for r in ranks),
            "bytes_per_epoch_per_rank": [r["bytes_per_epoch"] for r in ranks],
            "world_size": self.size,
            "engine": self.engine_name,
            "num_parameters": sum(p.numel() for p in self.params),
            "run_dir": str(self.run_dir),
            "config": config_to_dict(self.config),
        }
        if self.rank == 0:
            with atomic_output(self.run_dir / "summary.json", force=True) as tmp:
                tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return summary

    def load_best(self) -> None:
        """Load the parameters of the best-validation epoch into ``model`` (no-op before any evaluation)."""
        if self.best_state is not None:
            self.model.load_state_dict(copy.deepcopy(self.best_state))
