"""The trainer's loop for engines of ``kind = "pipeline"`` (``flow``): GPipe over stages and micro-batches.

A pipeline engine gives each rank a *stage*: a contiguous run ``units =
(start, stop)`` of the model's units (:meth:`forward_units`), and splits the
nodes into micro-batches computed in *groups* (one micro-batch each, or all
of them together when a stage needs a whole layer at once). One training
pass (:func:`train_pass`):

1. forward, group by group: the first stage reads the input rows, the others
   receive each micro-batch's rows from the previous stage; the stage runs
   its units on the group's graph context and sends each micro-batch's output
   rows on (the last stage computes the group's share of the loss instead);
2. backward, groups in reverse order: the last stage back-propagates its loss,
   the others receive the gradient of their output rows from the next stage;
   every stage but the first sends the gradient of its input rows back.

Parameter gradients accumulate over the groups: one optimiser step per pass
(the trainer's). The bytes autograd keeps between the two halves (the stage's
saved activations, :class:`~hpc_graph.train.metrics.SavedBytes`) go to the
engine's statistics. Evaluation (:func:`predict`) is the forward half without
autograd; the last stage's predictions are broadcast to every rank.

Each training pass of a stage replays the random draws (dropout keys) of the units before and after its own
(``key_draws``: :func:`~hpc_graph.ops.dropout.skip_key_draws`), so every layer draws the key it draws when one
process runs them all: with the same seed the run equals one process's, dropout included, wherever the stages
are cut.

The engine provides: ``first``/``last`` (bool), ``units``, ``key_draws``, ``groups(training)``,
``group_rows(group)``, ``context(group, training)``, ``begin_step(x, training)``,
``send(direction, m, t)``, ``recv(direction, m)``, ``end_step(saved_bytes=...)`` and
``predictions_from_last(pred)``.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from hpc_graph.ops.dropout import skip_key_draws
from hpc_graph.train.metrics import SavedBytes


def _split(t: torch.Tensor, engine, group: list[int], lo: int) -> list[tuple[int, torch.Tensor]]:
    """``[(m, rows of micro-batch m)]`` of a group's tensor ``t`` (rows ``lo:``)."""
    out = []
    for m in group:
        a, b = engine.group_rows([m])
        out.append((m, t[a - lo:b - lo]))
    return out


def _loss_rows(loss_mask: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """int64: the rows ``lo:hi`` the loss covers, relative to ``lo``. On a mask with no data (the planner's) their
    number is the mask's ``planned_rows`` share of the group (the rows are spread evenly)."""
    if loss_mask.is_meta:
        total = int(getattr(loss_mask, "planned_rows", 0))
        return torch.empty(round(total * (hi - lo) / max(int(loss_mask.shape[0]), 1)), dtype=torch.int64,
                           device="meta")
    return loss_mask[lo:hi].nonzero().squeeze(1)


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x if x.layout == torch.strided else x.to_dense()


def train_pass(engine, model: torch.nn.Module, x: torch.Tensor, label: torch.Tensor, loss_mask: torch.Tensor,
               count: float) -> torch.Tensor:
    """One GPipe pass; parameter gradients of this stage accumulate in ``.grad``.

    Args:
        x: float[N, F] input features (rows in the engine's order), label: int64[N], loss_mask: bool[N] (the rows the
            loss covers), count: the number the summed cross-entropy is divided by.
    Returns:
        the loss (0-dim, detached): this pass's mean cross-entropy on the last stage, 0 on the others.
    """
    x = _dense(x)
    engine.begin_step(x)
    kept: list = []
    loss = x.new_zeros(())
    saved = SavedBytes(model.parameters())
    try:
        with saved:
            _forward_groups(engine, model, x, label, loss_mask, count, kept)
        while kept:  # reverse order; each group's activations are freed once back-propagated
            group, lo, h_in, out = kept.pop()
            if engine.last:
                out.backward()
                loss = loss + out.detach()
            else:
                grad = torch.cat([engine.recv("backward", m) for m in group])
                out.backward(grad)
            if not engine.first:
                g = h_in.grad if h_in.grad is not None else torch.zeros_like(h_in)
                for m, rows in _split(g, engine, group, lo):
                    engine.send("backward", m, rows)
    finally:
        engine.end_step(saved_bytes=saved.bytes)
    return loss


def _forward_groups(engine, model, x, label, loss_mask, count, kept) -> None:
    """The forward half of :func:`train_pass`: ``kept`` gets ``(group, lo, input, output or loss part)``."""
    start, stop = engine.units
    before, after = engine.key_draws
    for group in engine.groups(training=True):
        lo, hi = engine.group_rows(group)
        if engine.first:
            h_in = x[lo:hi]
        else:
            h_in = torch.cat([engine.recv("forward", m) for m in group]).requires_grad_(True)
        skip_key_draws(before)
        out = model.forward_units(engine.context(group, True), h_in, start, stop)
        skip_key_draws(after)
        if engine.last:
            rows = _loss_rows(loss_mask, lo, hi)
            kept.append((group, lo, h_in, F.cross_entropy(out[rows], label[lo:hi][rows], reduction="sum") / count))
        else:
            for m, rows in _split(out, engine, group, lo):
                engine.send("forward", m, rows)
            kept.append((group, lo, h_in, out))


@torch.no_grad()
def predict(engine, model: torch.nn.Module, x: torch.Tensor, outputs: bool = False) -> torch.Tensor:
    """The forward half without autograd; returns int64[N] class predictions on every rank, or with ``outputs``
    the model's outputs float[N, num_classes]."""
    x = _dense(x)
    start, stop = engine.units
    engine.begin_step(x, training=False)
    pred = (torch.zeros(x.shape[0], engine.num_classes, dtype=x.dtype, device=x.device) if outputs else
            torch.zeros(x.shape[0], dtype=torch.int64, device=x.device))
    try:
        for group in engine.groups(training=False):
            lo, hi = engine.group_rows(group)
            h_in = x[lo:hi] if engine.first else torch.cat([engine.recv("forward", m) for m in group])
            out = model.forward_units(engine.context(group, False), h_in, start, stop)
            if engine.last:
                pred[lo:hi] = out if outputs else out.argmax(1)
            else:
                for m, rows in _split(out, engine, group, lo):
                    engine.send("forward", m, rows)
    finally:
        engine.end_step()
    return engine.predictions_from_last(pred)
