"""Fault injection, to check how a job goes down: ``HPC_GRAPH_DEBUG_FAIL="rank=R,epoch=E,kind=..."``.

Rank R fails in epoch E: ``exception`` raises, ``nan`` makes the step's loss (a sampled epoch's first
iteration's) NaN, ``exit`` ends the process at once with status 3. The trainer installs a
:class:`FaultInjector` as a step hook when the variable is set (:attr:`Trainer.step_hooks
<hpc_graph.train.trainer.Trainer.step_hooks>`); without it nothing of this runs in a step.

A step hook is any object with ``before_step(trainer, epoch)`` and ``on_loss(trainer, epoch, iteration,
loss) -> loss`` (``iteration``: 0-based within a sampled epoch, 0 otherwise).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from hpc_graph.options import ConfigError

log = logging.getLogger(__name__)

DEBUG_FAIL_ENV = "HPC_GRAPH_DEBUG_FAIL"
KINDS = ("exception", "nan", "exit")
EXIT_STATUS = 3


@dataclasses.dataclass(frozen=True)
class FaultInjector:
    """Fail on rank ``rank`` in epoch ``epoch`` as ``kind`` says (a step hook)."""

    rank: int
    epoch: int
    kind: str

    @classmethod
    def from_text(cls, text: str | None) -> "FaultInjector | None":
        """``"rank=2,epoch=1,kind=nan"`` -> a FaultInjector (None for an empty text; ConfigError naming the
        variable when malformed)."""
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
        if kind not in KINDS or rank < 0 or epoch < 1:
            raise ConfigError(f"{DEBUG_FAIL_ENV}: need rank >= 0, epoch >= 1, kind in {KINDS}, got {text!r}")
        return cls(rank, epoch, kind)

    @classmethod
    def from_env(cls) -> "FaultInjector | None":
        return cls.from_text(os.environ.get(DEBUG_FAIL_ENV))

    def _mine(self, trainer: Any, epoch: int) -> bool:
        return trainer.rank == self.rank and epoch == self.epoch

    def before_step(self, trainer: Any, epoch: int) -> None:
        if not self._mine(trainer, epoch) or self.kind == "nan":
            return
        what = f"rank {trainer.rank}: injected failure in epoch {epoch} ({DEBUG_FAIL_ENV}={self.kind})"
        if self.kind == "exception":
            raise RuntimeError(what)
        from hpc_graph.train.preflight import flush_logs

        log.critical("%s: exiting with status %d", what, EXIT_STATUS)
        flush_logs()
        os._exit(EXIT_STATUS)

    def on_loss(self, trainer: Any, epoch: int, iteration: int, loss: Any) -> Any:
        if self.kind == "nan" and iteration == 0 and self._mine(trainer, epoch):
            return loss * float("nan")
        return loss
