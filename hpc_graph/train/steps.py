"""The distributed training step, as public helpers: what :class:`~hpc_graph.train.trainer.Trainer` does on every
engine, for a training loop of one's own that must give the Trainer's numbers (docs/python-api.md).

A step on N ranks gives one process's numbers when:

1. every rank starts from the same parameters (:func:`broadcast_parameters` from rank 0);
2. the random stream follows the engine's rule (:func:`seed_stream`): engines whose every rank makes the calls one
   process would make (``engine.shared_rng``: ``dp``, ``sar``, ``sylvie``...) draw the same stream on every
   rank, so dropout keyed on dataset ids (``hpc_graph.nn.dropout``) drops what one process drops; the others
   decorrelate their ranks;
3. the loss sums over this rank's training rows and divides by the *global* count (:func:`global_count`), so that
   the gradients add up to one process's;
4. the gradients are summed over ranks in one bucketed all-reduce that also carries the loss and any flags
   (:func:`sync_gradients`), then every rank steps its optimiser;
5. a sampled engine's epoch has the same number of iterations on every rank, each batch's loss divided by the
   batch's global size (:func:`sampled_batches`).

Every helper is a no-op where one process makes it one (``comm.size == 1``).
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
from torch import nn

__all__ = ["broadcast_parameters", "seed_stream", "global_count", "sync_gradients", "any_rank", "sampled_batches"]


def broadcast_parameters(model: nn.Module, comm: Any, root: int = 0) -> None:
    """Every parameter and buffer of ``model`` (``state_dict`` order) from rank ``root``, in place."""
    if comm.size > 1:
        for t in model.state_dict().values():
            comm.bcast(t, root)


def seed_stream(seed: int, comm: Any, engine: Any) -> None:
    """Seed torch's default generator for training (dropout keys, sampling) by the engine's rule: ``seed`` on
    every rank where ``engine.shared_rng`` (or on one process), ``seed + 1_000_003 * rank`` otherwise. Call it
    after the model's weights are drawn (and broadcast)."""
    shared = comm.size == 1 or bool(getattr(engine, "shared_rng", False))
    torch.manual_seed(seed if shared else seed + 1_000_003 * int(comm.rank))


def global_count(count: float, comm: Any, engine: Any = None) -> float:
    """The sum of ``count`` over ranks (a loss's denominator: training rows, a batch's seeds), in float64; the
    count itself where every rank holds every node (``engine.replicated``) or on one process."""
    t = torch.tensor([float(count)], dtype=torch.float64)
    if comm.size > 1 and not bool(getattr(engine, "replicated", False)):
        comm.allreduce_(t)
    return float(t.item())


def sync_gradients(params: Sequence[torch.Tensor], comm: Any, values: torch.Tensor | None = None,
                   gradients: bool = True) -> torch.Tensor | None:
    """Sum the gradients of ``params`` over ranks in place, together with ``values`` (a 1-D tensor of losses and
    flags, summed too), in one bucketed all-reduce; returns ``values`` (summed). A parameter without a gradient
    gets zeros first (every rank must send the same tensors). ``gradients=False``: ``values`` only (stages of a
    pipeline hold disjoint parameters)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if comm.size > 1:
        comm.allreduce_bucketed_(([p.grad for p in params] if gradients else []) + ([] if values is None else
                                                                                    [values]))
    return values


def any_rank(flag: bool, comm: Any) -> bool:
    """Whether ``flag`` is true on any rank (every rank learns the same answer: stop, skip, checkpoint)."""
    t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
    if comm.size > 1:
        comm.allreduce_(t)
    return bool(t.item() > 0)


def sampled_batches(engine: Any, epoch: int, device: torch.device | str = "cpu") -> Iterator[tuple[Any, float]]:
    """The iterations of a sampled engine's (``engine.kind == "sampled"``) epoch: ``(batch, global_size)`` per
    iteration, the same number on every rank. ``batch.graph``, ``batch.feat`` float[rows, F] and
    ``batch.label`` int64[seeds] are on ``device``; divide the batch's summed loss by ``max(global_size, 1)``."""
    iters = engine.iterations(epoch)
    _, global_sizes = engine.batch_sizes(epoch, iters)
    for it in range(iters):
        yield engine.batch(epoch, it).to(device), float(global_sizes[it])
