"""``dropout``: feature dropout as one kernel pass, with nothing saved for the backward pass.

The mask is a counter-based hash of (key, element index)
(:mod:`numba_kernels.cpu.dropout`): the forward pass writes ``x * scale`` or 0
in one pass, and the backward pass redraws the same mask from the key to
compute ``grad * scale`` or 0. Nothing of size N x F is kept (``torch``'s
dropout keeps its mask; a bool mask is N x F bytes). The key is drawn from
torch's default generator, so ``torch.manual_seed`` makes runs reproducible.

``ids`` (int64[N], optional): the dataset id of each row. The mask of a row
then depends on its id, not its position (:mod:`numba_kernels.cpu.dropout`),
so a rank holding some rows of the graph drops exactly what one process
holding all of them drops with the same key.

Every key a model's forward pass draws goes through :func:`draw_key`. A layer pipeline (the ``flow`` engine)
runs some of a model's units on each rank: :func:`record_key_draws` notes the draws of each unit once, and
:func:`skip_key_draws` advances a stage's generator past those of the units it does not run, so that every
layer draws the key it draws in one process, whatever the cut.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import empty, kernel

_LEVELS = 1 << 16
KEY_HIGH = 2**62  # keys are drawn from [0, KEY_HIGH)

_key_records: list[list[int]] = []
_own_streams = [0]  # depth of own_key_stream contexts


def draw_key(high: int = KEY_HIGH) -> int:
    """A random key in ``[0, high)`` from torch's default generator (``torch.randint``), noted by every active
    :func:`record_key_draws` (unless drawn inside :func:`own_key_stream`)."""
    key = int(torch.randint(0, high, (1,)).item())
    if not _own_streams[0]:
        for rec in _key_records:
            rec.append(int(high))
    return key


@contextlib.contextmanager
def own_key_stream() -> Iterator[None]:
    """Mark draws made on a stream the caller seeded for itself and restores after (``torch.random.fork_rng``
    and a seed of its own, as a reversible block's recomputable dropout does): they leave the default stream
    where it was, so :func:`record_key_draws` does not note them."""
    _own_streams[0] += 1
    try:
        yield
    finally:
        _own_streams[0] -= 1


@contextlib.contextmanager
def record_key_draws() -> Iterator[list[int]]:
    """``with record_key_draws() as highs:`` the ``high`` of every :func:`draw_key` inside, in order."""
    rec: list[int] = []
    _key_records.append(rec)
    try:
        yield rec
    finally:
        _key_records.remove(rec)


def skip_key_draws(highs: Sequence[int]) -> None:
    """Advance torch's default generator exactly as :func:`draw_key` with these ``highs`` would (how far one
    draw advances it depends on the range)."""
    for high in highs:
        torch.randint(0, int(high), (1,))


def row_ids(ids: torch.Tensor | None, x: torch.Tensor, op: str) -> torch.Tensor | None:
    """``ids`` as int64 on ``x``'s device, checked to give one id per row of ``x`` (None passes through)."""
    if ids is None:
        return None
    if ids.dim() != 1 or x.dim() == 0 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: ids must be int64[{x.shape[0] if x.dim() else 0}] (one per row of x), got "
                         f"{tuple(ids.shape)}")
    return ids.to(device=x.device, dtype=torch.int64)


def apply_mask(t: torch.Tensor, key: int, cut: int, scale: float, out: torch.Tensor,
               ids: torch.Tensor | None = None) -> torch.Tensor:
    """``out = t * scale`` where the mask of ``key`` (and ``ids``) keeps an element, else 0; returns ``out``
    (which may be ``t``; both contiguous, same shape)."""
    kernel("dropout.dropout_apply", t)(as_array(t.view(-1)), key, cut, scale, as_array(out.view(-1)),
                                       ids=as_array(ids))
    return out


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key, cut, scale, ids):
        x = x.contiguous()
        out = apply_mask(x, key, cut, scale, empty(tuple(x.shape), x.dtype, x.device), ids)
        ctx.key, ctx.cut, ctx.scale, ctx.ids = key, cut, scale, ids
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = apply_mask(grad, ctx.key, ctx.cut, ctx.scale, empty(tuple(grad.shape), grad.dtype, grad.device),
                         ctx.ids)
        return out, None, None, None, None


def dropout(x: torch.Tensor, p: float, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Zero each element of ``x`` float[N, ...] with probability ``round(p * 65536) / 65536`` and scale the
    rest by the inverse keep probability (so the expectation is exact); differentiable in ``x``. ``ids``:
    int64[N] row ids keying the mask (module docstring), or None (the elements' positions)."""
    ids = row_ids(ids, x, "dropout")
    cut = int(round(p * _LEVELS))
    keep = 1.0 - cut / _LEVELS
    key = draw_key()
    return _Dropout.apply(x, key, cut, 1.0 / keep, ids)


def activation(x: torch.Tensor, act: str | None) -> torch.Tensor:
    """``act(x)`` with autograd: ``act`` None (``x`` itself), ``"relu"`` or ``"elu"``."""
    from torch.nn import functional as F

    if act == "relu":
        return F.relu(x)
    if act == "elu":
        return F.elu(x)
    if act is not None:
        raise ValueError(f"act: must be None, 'relu' or 'elu', got {act!r}")
    return x


def act_dropout(x: torch.Tensor, act: str | None, p: float, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(act(x), p)`` step by step for a dense float ``x`` (``act`` None, ``"relu"`` or ``"elu"``): the
    masks and values the fused ops (:func:`hpc_graph.ops.dropout_linear.mask_params`) draw, with autograd
    (``ids``: as for :func:`dropout`)."""
    x = activation(x, act)
    return dropout(x, p, ids) if p > 0 else x
