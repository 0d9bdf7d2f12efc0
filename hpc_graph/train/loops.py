"""The training loops, one per engine kind (``Engine.kind``, :data:`hpc_graph.engines.base.KINDS`).

Every loop makes one epoch's optimiser steps and returns ``(global loss, finite everywhere)``:

* ``full`` and ``sequence``: one step over the engine's ``graph`` and the trainer's features
  (:func:`full_epoch`); the loss sums over this rank's training nodes and divides by their global count;
* ``sampled``: one step per mini-batch (:func:`sampled_epoch`): ``engine.iterations(epoch)``, the global
  batch sizes from ``engine.batch_sizes``, each ``engine.batch(epoch, i)`` a
  :class:`~hpc_graph.engines.base.Batch` whose loss is divided by its global size;
* ``pipeline``: one GPipe pass over stages and micro-batches (:func:`pipeline_epoch`,
  :mod:`hpc_graph.train.pipeline`).

Each step ends in :func:`apply_gradients`: one bucketed all-reduce of the gradients together with the loss,
the stop request and the finiteness flags of every rank, then the optimiser step (or the
``train.on_nonfinite`` policy).
"""
from __future__ import annotations

import logging
import math
import statistics
from typing import Any, Callable

import torch
from torch.nn import functional as F

from hpc_graph.train.preflight import agreed
from hpc_graph.train.steps import sampled_batches, sync_gradients

log = logging.getLogger(__name__)


EXIT_DIVERGED = 3  # hpc-graph train's exit status for a run that diverged


class DivergedError(RuntimeError):
    """Training diverged (raised on every rank alike; ``hpc-graph train`` exits 3 with its one line)."""


class NonFiniteLossError(DivergedError):
    """A NaN/Inf loss or gradient with ``train.on_nonfinite: stop`` (raised on every rank; names epoch and ranks)."""


class DivergenceWatch:
    """Stops a run whose loss blows up: an epoch's global loss above ``factor`` times the loss of the run's first
    optimiser step (the untrained model's; ``train.diverge_factor``; 0: off), or ``streak`` optimiser steps in a
    row skipped for non-finite values under ``train.on_nonfinite: skip`` (``train.nonfinite_streak``; 0: off).
    The first step, not the first epoch: a sampled epoch takes many steps, and a learning rate that blows the
    model up does so within the first. Every rank sees the same global loss and flags, so every rank raises
    alike."""

    def __init__(self, factor: float, streak: int):
        self.factor, self.streak = float(factor), int(streak)
        self.first: float | None = None
        self.skipped = 0

    def first_step(self, loss: float) -> None:
        """The global loss of an optimiser step: the first finite one is the reference."""
        if self.first is None and math.isfinite(loss):
            self.first = abs(loss)

    def update(self, epoch: int, loss: float, ok: bool) -> None:
        """Raise :class:`DivergedError` naming the epoch and the loss when the run diverged."""
        if not ok:
            self.skipped += 1
            if self.streak and self.skipped >= self.streak:
                raise agreed(DivergedError(
                    f"diverged: epoch {epoch}: {self.skipped} optimiser steps in a row skipped for non-finite "
                    f"values (train.nonfinite_streak: {self.streak}; try a lower optim.lr)"))
            return
        self.skipped = 0
        self.first_step(loss)
        if self.factor and self.first is not None and loss > self.factor * max(self.first, 1e-12):
            raise agreed(DivergedError(
                f"diverged: epoch {epoch}: loss {loss:.4g} is more than {self.factor:g}x the first step's "
                f"{self.first:.4g} (train.diverge_factor; try a lower optim.lr)"))


def _hooked(tr: Any, epoch: int, iteration: int, loss: torch.Tensor) -> torch.Tensor:
    for hook in tr.step_hooks:
        loss = hook.on_loss(tr, epoch, iteration, loss)
    return loss


def full_epoch(tr: Any, epoch: int) -> tuple[float, bool]:
    """One full-graph step: forward on the whole (local) graph, loss over the training nodes."""
    tr.optimizer.zero_grad(set_to_none=False)
    x, idx, count = tr.train_inputs(epoch)
    logits = tr.model(tr.graph, x)
    loss = F.cross_entropy(logits[idx], tr.label[idx], reduction="sum") / count
    if tr.step_hooks:
        loss = _hooked(tr, epoch, 0, loss)
    return apply_gradients(tr, loss, epoch)


def sampled_epoch(tr: Any, epoch: int) -> tuple[float, bool]:
    """Every iteration of a sampling engine's epoch (the same number on every rank); the loss is the mean of the
    iterations' global losses."""
    losses, ok = [], True
    # sampling engines build batches on the CPU; gathered rows are dense
    for it, (batch, global_size) in enumerate(sampled_batches(tr.engine, epoch, tr.device)):
        tr.optimizer.zero_grad(set_to_none=False)
        logits = tr.model(batch.graph, batch.feat)
        loss = F.cross_entropy(logits, batch.label, reduction="sum") / max(global_size, 1.0)
        if tr.step_hooks:
            loss = _hooked(tr, epoch, it, loss)
        value, step_ok = apply_gradients(tr, loss, epoch, f"iteration {it + 1} of ")
        losses.append(value)
        ok = ok and step_ok
    return (statistics.fmean(losses) if losses else float("nan")), ok


def pipeline_epoch(tr: Any, epoch: int) -> tuple[float, bool]:
    """One pass of the layer pipeline (forward and backward of every micro-batch, then one optimiser step)."""
    from hpc_graph.train.pipeline import train_pass

    tr.optimizer.zero_grad(set_to_none=False)
    if tr._loss_mask is None:
        tr._loss_mask = torch.zeros_like(tr.masks["train"])
        tr._loss_mask[tr.train_idx] = True
    loss = train_pass(tr.engine, tr.model, tr.feat, tr.label, tr._loss_mask, tr.num_train)
    if tr.step_hooks:
        loss = _hooked(tr, epoch, 0, loss)
    return apply_gradients(tr, loss, epoch, backward=False)


#: the loop each engine kind selects
LOOPS: dict[str, Callable[[Any, int], tuple[float, bool]]] = {
    "full": full_epoch, "sequence": full_epoch, "sampled": sampled_epoch, "pipeline": pipeline_epoch}


def apply_gradients(tr: Any, loss: torch.Tensor, epoch: int, where: str = "",
                    backward: bool = True) -> tuple[float, bool]:
    """Backward (unless done: a pipeline pass), one bucketed all-reduce of gradients and flags (flags only
    for a pipeline, whose stages hold disjoint parameters), optimiser step (or the ``on_nonfinite``
    policy); returns the global loss and whether it was finite everywhere."""
    if backward:
        loss.backward()
    for p in tr.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    loss_ok = bool(torch.isfinite(loss.detach()))
    # one fused max-abs over all gradients: NaN and Inf both make it non-finite
    grads_ok = bool(torch.isfinite(torch.nn.utils.get_total_norm([p.grad for p in tr.params], float("inf"))))
    # [global loss, ranks asked to stop, per rank: loss non-finite, per rank: gradient non-finite]
    n = tr.size
    flags = torch.zeros(2 + 2 * n, dtype=loss.dtype, device=loss.device)
    flags[0] = loss.detach()
    flags[1] = float(tr.stop.requested)
    flags[2 + tr.rank] = float(not loss_ok)
    flags[2 + n + tr.rank] = float(not grads_ok)
    sync_gradients(tr.params, tr.comm, flags, gradients=not tr.pipeline)
    flags = flags.cpu()
    tr._stop_agreed = bool(flags[1] > 0)
    bad_loss = [r for r in range(n) if flags[2 + r] != 0]
    bad_grad = [r for r in range(n) if flags[2 + n + r] != 0]
    if bad_loss or bad_grad:
        # a NaN born on one rank reaches the others' gradients through the halo exchange: name its source
        what, ranks = ("loss", bad_loss) if bad_loss else ("gradient", bad_grad)
        what = (f"non-finite {what} in {where}epoch {epoch} on rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))}")
        if tr.config.train.on_nonfinite == "stop":
            raise agreed(NonFiniteLossError(f"{what} (train.on_nonfinite: stop; try a lower optim.lr)"))
        log.warning("%s: optimiser step skipped on every rank (train.on_nonfinite: skip)", what)
        return float(flags[0]), False
    tr.optimizer.step()
    watch = getattr(tr, "_divergence", None)
    if watch is not None:
        watch.first_step(float(flags[0]))
    return float(flags[0]), True


__all__ = ["EXIT_DIVERGED", "LOOPS", "DivergedError", "DivergenceWatch", "NonFiniteLossError", "apply_gradients",
           "full_epoch", "pipeline_epoch", "sampled_epoch"]
