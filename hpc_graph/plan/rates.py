"""Seconds per unit of work on one rank: the kernel and link rates the planner turns a step's work into time with
(:mod:`hpc_graph.plan.profile` measures them; :mod:`hpc_graph.plan.predict` uses them)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass
class Rates:
    """Seconds per unit of work, and the links. All per rank at ``threads`` threads.

    ``spmm_fwd``/``spmm_bwd``: ``(a, b)``, an SpMM over E edges at width w takes ``E (a + b w)``
    seconds (forward over the CSR, backward over its transpose). ``gat_fwd``/``gat_bwd``: the same for
    the fused attention kernels with ``w = H D``. ``gemm_flops``: flop/s of a dense GEMM.
    ``stream``: bytes/s of an elementwise pass (reads + writes); ``mask``: elements/s of the counter-based
    dropout kernels; ``score``: elements/s of a GAT score with its backward; ``codec``: row elements/s
    through sylvie's low-bit encode or decode (8 bits). ``parallel``: fraction of the
    kernels' time that scales with threads (Amdahl), measured at 1 and ``threads`` threads.
    ``exchange``/``allreduce``: ``(alpha s, beta bytes/s)`` or None (no measured link: ``link`` used).
    ``link``: a :class:`~hpc_graph.comm.link.LinkModel` (a modelled network, or the default).
    ``sources``: where each number came from (printed). ``step_overhead``: seconds an epoch takes beyond
    what these rates predict for its kernels, added to every rank's compute: measured by ``hpc-graph plan`` as
    a real training run's epoch minus the prediction for it on a calibration graph (the probes time each kernel
    alone; a step also builds the autograd graph, allocates, runs Python and the optimizer between them: a
    few tenths of a second per epoch on the machines measured, about the same at 2^15 and 2^20 nodes, which
    is why it is added, not multiplied: a factor measured on a small graph over-predicted large ones).
    ``step_overhead_threads``: overheads measured at given thread counts (they also absorb the error of the
    parallel fraction, measured from a few speed-ups only); a rank uses the nearest (:meth:`step_overhead_for`).
    ``contention``: ``{over: factor}``, how much slower a rank runs when the ranks of a node run ``over``
    threads per core, measured (``hpc-graph plan``: copies of a real run at once against one alone); where none
    was measured for a rank's ``over``, ``over`` itself (a time slice of a core).
    """

    spmm_fwd: tuple[float, float]
    spmm_bwd: tuple[float, float]
    gat_fwd: tuple[float, float]
    gat_bwd: tuple[float, float]
    gemm_flops: float
    stream: float
    mask: float = 1e9
    score: float = 1e9
    codec: float = 1e9
    threads: int = 1
    parallel: float = 1.0
    exchange: tuple[float, float] | None = None
    allreduce: tuple[float, float] | None = None
    link: Any = None
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    step_overhead: float = 0.0
    step_overhead_threads: dict[int, float] = dataclasses.field(default_factory=dict)
    contention: dict[float, float] = dataclasses.field(default_factory=dict)

    def oversubscribed(self, over: float) -> float | None:
        """The factor measured for ranks running ``over`` threads per core (``contention``: ``{over: factor}``,
        copies of a real run at once against one alone), or None where none was measured."""
        for k, f in self.contention.items():
            if abs(float(k) - over) <= 1e-6 * max(1.0, over):
                return float(f)
        return None

    def step_overhead_for(self, threads: int) -> float:
        """The per-epoch overhead of a rank running ``threads`` threads: the one measured at the nearest thread
        count (in log scale; ``step_overhead_threads``), else ``step_overhead``."""
        if not self.step_overhead_threads:
            return self.step_overhead
        t = math.log2(max(1, threads))
        best = min(self.step_overhead_threads, key=lambda k: (abs(math.log2(max(1, k)) - t), -k))
        return self.step_overhead_threads[best]

    @classmethod
    def from_kernels(cls, kernels: Any, **links: Any) -> "Rates":
        """The rates of a measured :class:`~hpc_graph.plan.profile.KernelRates` (every field they share),
        plus the links' fields (``exchange``, ``allreduce``, ``link``, ``sources``) given by keyword."""
        own = {f.name for f in dataclasses.fields(cls)}
        shared = {f.name: getattr(kernels, f.name) for f in dataclasses.fields(kernels) if f.name in own}
        return cls(**shared, **links)

    def slowdown(self, threads: int, cores_share: float) -> float:
        """Factor on the measured kernel times for a rank running ``threads`` threads on
        ``cores_share`` cores (less than its threads when ranks oversubscribe a node)."""
        f = min(max(self.parallel, 0.0), 1.0)

        def t(k: float) -> float:
            return (1.0 - f) + f / max(k, 1e-9)

        t_here = t(self.threads)
        t_rank = t(max(1, threads))
        over = max(1.0, threads / cores_share) if cores_share > 0 else 1.0
        measured = self.oversubscribed(over) if over > 1.0 else None
        return t_rank / t_here * (over if measured is None else measured)

    def exchange_time(self, out_bytes: float, in_bytes: float, peers: int) -> float:
        if peers <= 0 or (out_bytes <= 0 and in_bytes <= 0):
            return 0.0
        if self.link is not None:
            t = self.link.cost(int(out_bytes), int(in_bytes), peers)
            if self.exchange is not None:  # a modelled link sleeps until its time has passed
                t = max(t, self.exchange[0] + max(out_bytes, in_bytes) / self.exchange[1])
            return t
        if self.exchange is None:
            return 0.0
        alpha, beta = self.exchange
        return alpha + max(out_bytes, in_bytes) / beta

    def allreduce_time(self, nbytes: float, size: int, calls: int) -> float:
        if size <= 1 or nbytes <= 0:
            return 0.0
        if self.link is not None:
            t = self.link.allreduce_cost(int(nbytes), size)
            if self.allreduce is not None:
                t = max(t, calls * self.allreduce[0] + nbytes / self.allreduce[1])
            return t
        if self.allreduce is None:
            return 0.0
        return calls * self.allreduce[0] + nbytes / self.allreduce[1]
