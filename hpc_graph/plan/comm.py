"""The communicator a planned rank talks to: nothing travels, every message is counted.

A rank's training step runs alone on shape-only tensors (:mod:`hpc_graph.plan.rank`); what its peers would
send it is known from the rank's sizes (the receive specs every exchange gives). :class:`PlanCommunicator`
returns received buffers of those shapes on the ``meta`` device (counted as the ``halo`` component), reports each
exchange (bytes out, bytes in, peers) and each all-reduce to the :class:`~hpc_graph.plan.tracker.StepTracker`,
and answers the collective calls of the engines' set-up with this rank's own values.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch


class _Done:
    """A request that is complete at once (what :meth:`PlanCommunicator.exchange_start` returns); ``entry``: its
    message, marked waited for when :meth:`wait` is called."""

    def __init__(self, results: Any, entry: dict | None = None):
        self._results, self._entry = results, entry
        self.done = True

    def test(self) -> Any:
        return self._results if self._results is not None else True

    def wait(self) -> Any:
        if self._entry is not None:
            self._entry["waited"] = True
        return self._results


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(int(s) for s in shape) * torch.empty((), dtype=dtype).element_size()


class PlanCommunicator:
    """Rank ``rank`` of ``size`` as the planner runs it (module docstring). ``tracker``: where messages go."""

    backend = "plan"

    def __init__(self, rank: int, size: int, tracker: Any, link: Any = None, device: str = "meta"):
        self.rank, self.size = int(rank), int(size)
        self.device = device  # "cpu": receive zero-filled buffers (a real step run alone, to check a plan)
        self.local_rank, self.local_size = 0, int(size)
        self.tracker, self.link = tracker, link
        self.max_message_bytes = (1 << 31) - 1
        self._open: list[dict] = []
        self.reset_counters()

    def reset_counters(self) -> None:
        self.bytes_sent, self.comm_seconds = 0, 0.0
        self.recv_max = 0  # the largest receive of one exchange (all its peers together)
        self.modeled_seconds = self.modeled_wait_seconds = 0.0
        self.bytes_by_op: dict[str, int] = {}
        self.modeled_by_op: dict[str, float] = {}
        self.modeled_wait_by_op: dict[str, float] = {}

    def set_link(self, link: Any) -> None:
        self.link = link

    def _sent(self, op: str, nbytes: int) -> None:
        if self.size > 1 and nbytes:
            self.bytes_sent += int(nbytes)
            self.bytes_by_op[op] = self.bytes_by_op.get(op, 0) + int(nbytes)

    # -- point to point ----------------------------------------------------------------------------------
    def exchange_start(self, sends: dict[int, torch.Tensor], recv_specs: dict[int, tuple], *,
                       device: Any = None, channel: int = 0) -> _Done:
        out_bytes = sum(int(t.numel()) * t.element_size() for p, t in sends.items() if p != self.rank)
        in_bytes = sum(_nbytes(shape, dtype) for p, (shape, dtype) in recv_specs.items() if p != self.rank)
        self.recv_max = max(self.recv_max, sum(_nbytes(shape, dtype) for shape, dtype in recv_specs.values()))
        peers = len({p for p in list(sends) + list(recv_specs) if p != self.rank})
        with self.tracker.component("halo"):
            results = {p: (torch.empty if self.device == "meta" else torch.zeros)(tuple(shape), dtype=dtype,
                                                                                   device=self.device)
                       for p, (shape, dtype) in sorted(recv_specs.items())}
        entry = {"message": (out_bytes, in_bytes, peers), "phase": self.tracker.current_phase, "waited": False}
        self._open.append(entry)
        self._sent("exchange", out_bytes)
        return _Done(results, entry)

    def end_step(self) -> None:
        """Report the step's exchanges to the tracker: those the step waited for, and in the background those
        it left in flight (a pipelined exchange, waited for by the next step)."""
        for e in self._open:
            if e["phase"] in self.tracker.work:
                out, inb, peers = e["message"]
                before = self.tracker._phase
                self.tracker._phase = e["phase"]
                try:
                    self.tracker.message(out, inb, peers, background=not e["waited"])
                finally:
                    self.tracker._phase = before
        self._open = []

    def exchange(self, sends: dict[int, torch.Tensor], recv_specs: dict[int, tuple], *,
                 device: Any = None) -> dict[int, torch.Tensor]:
        return self.exchange_start(sends, recv_specs, device=device).wait()

    # -- collectives -------------------------------------------------------------------------------------
    def allreduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        nbytes = int(t.numel()) * t.element_size()
        self.tracker.allreduce(nbytes, self.size)
        self._sent("allreduce", nbytes)
        return t

    def allreduce_start(self, t: torch.Tensor) -> _Done:
        return _Done(self.allreduce_(t))

    def allreduce_bucketed_(self, tensors: Sequence[torch.Tensor], bucket_bytes: int = 25 << 20,
                            op: str = "sum") -> Sequence[torch.Tensor]:
        nbytes = sum(int(t.numel()) * t.element_size() for t in tensors)
        self.tracker.allreduce(nbytes, self.size)
        self._sent("allreduce", nbytes)
        return tensors

    def bcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        return t

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list:
        return [obj] * self.size

    def barrier(self) -> None:
        return None
