"""Preemption: SIGTERM/SIGUSR1 ask the training loop to stop cleanly after the current epoch.

Batch systems warn a job before killing it: SLURM sends SIGUSR1 ahead of the
time limit when asked (``#SBATCH --signal=USR1@120``, see ``jobscripts/``), and
SIGTERM on preemption or ``scancel``; PBS sends SIGTERM before SIGKILL. The
signal may reach only some ranks, so the handler only records it; the trainer
all-reduces a stop flag with every step (in the same call as the gradients),
and when any rank saw a signal every rank finishes that epoch, rank 0 writes a
checkpoint and :class:`Preempted` is raised on every rank. ``hpc-graph train``
turns it into exit status :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``:
"try again"), and ``--resume RUN_DIR`` continues the run.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

EXIT_PREEMPTED = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Training stopped on a signal after ``epoch`` epochs; ``checkpoint`` is the file written by rank 0."""

    def __init__(self, epoch: int, checkpoint: Path, signal_name: str | None):
        self.epoch = int(epoch)
        self.checkpoint = Path(checkpoint)
        self.signal_name = signal_name
        by = f" by {signal_name}" if signal_name else " (a signal on another rank)"
        super().__init__(f"preempted{by} after epoch {self.epoch}; checkpoint {self.checkpoint} "
                         f"(resume with --resume {self.checkpoint.parent.parent})")


class StopSignal:
    """Record SIGTERM/SIGUSR1 (``signals``) while active: ``with StopSignal() as stop: ... stop.requested``.

    With ``signal.SIGINT`` among ``signals`` (``hpc-graph train`` adds it), the
    first Ctrl-C stops cleanly like SIGTERM and a second one raises
    ``KeyboardInterrupt``. The previous handlers are restored on exit. Outside the main thread (where
    Python cannot install handlers) it only supports :meth:`request`.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS):
        self.signals = tuple(signals)
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived (or :meth:`request` was called)."""
        return self.signum is not None

    @property
    def name(self) -> str | None:
        """Name of the signal that asked to stop (``"SIGUSR1"``), or None."""
        if self.signum is None:
            return None
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask to stop as if ``signum`` had arrived (tests, or a caller's own policy)."""
        if self.signum is None:
            self.signum = int(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: do not wait for the epoch to end
        self.request(signum)  # only a flag: the loop notices it at the next step

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
