"""``sylvie`` engine: full-batch domain parallelism with low-bit, adaptive, optionally stale halo messages.

Sylvie (thesis ch. 3) attacks the halo exchange of ``dp``: the rows each rank
sends forward and the halo gradients it returns backward travel as 1-, 2-,
4- or 8-bit integers with stochastic rounding (:mod:`hpc_graph.ops.quant`),
and an epoch may run on halo rows one epoch old while the current ones travel
in the background (:mod:`hpc_graph.ops.quant_exchange`). Partitions, models,
trainer and results are those of ``dp``; only :meth:`HaloGraph.halo` differs.

Bit widths (``engine.bits``):

* ``1 | 2 | 4 | 8``: every row; ``32``: full precision (then equal to ``dp``);
* ``auto``: per node and per epoch. A rank's boundary node v (an owned node
  another rank holds as a halo row) has importance ``p_v`` in [0, 1]: the rank
  of its global in-degree among the rank's boundary nodes (the highest degree
  gets 1; equal degrees share a value), §3.4.1. The epoch's base width ``b_t``
  comes from the loss descent rate (below). Node v then gets
  ``C_t[min(|C_t| - 1, floor(p_v |C_t|))]`` from the candidates
  ``C_t = {b in (1, 2, 4, 8): b >= b_t}`` (Fig. 3.6): low-degree nodes the
  base width, hubs up to 8 bits. The halo side receives ``p_v`` once at start-up,
  so both ends compute the same table and no message carries a header.

Loss descent rate (§3.5.1, Eq. 3.4): ``F_t = lambda F_(t-1) + (1 - lambda) L_t``
(``L_t`` the global training loss, ``lambda = engine.ldr_smoothing``) and
``LDR_t = (F_(t-1) - F_t) / (epoch seconds)``. The thesis prints
``(F_t - F_(t-1))/et_t``, which is negative while the loss falls; we use the
positive rate, so "the loss falls more slowly than delta epochs ago"
(``LDR_t < LDR_(t-delta)``, ``delta = engine.ldr_window``) asks for more bits
(``b <- 2b``) and otherwise the width is halved, starting from 1 bit. After a
change the width is held for ``delta`` epochs (a cooldown the thesis does not
have: without it the width flips every epoch on noisy losses). Every rank
takes the all-reduced maximum of (loss, epoch seconds), so all ranks run the
same policy on the same numbers and reach the same ``b_t``.

Pipeline (``engine.pipeline``, §3.5.2): ``off`` synchronous; ``on`` every
epoch after the first uses the previous epoch's halo rows and halo gradients
while this epoch's exchange runs behind the computation (staleness 1);
``adaptive`` like ``on``, but the epoch after one whose loss descent rate
asks for more bits runs synchronously. Evaluation always runs exactly
(full precision, synchronous). A checkpoint keeps each rank's last halo rows and
gradients and the policy, so a resumed run continues exactly as the uninterrupted one.

Departure from the thesis: the loss descent rate is per epoch by default
(``engine.ldr_time: epochs``), not per second, so that decisions, and therefore
runs, are reproducible; ``ldr_time: wall`` is the thesis' rate.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Any, Iterator

import numpy as np
import torch

from hpc_graph.engines.base import Engine
from hpc_graph.graph.dist_graph import load_dist_graph, partition_tensors
from hpc_graph.graph.halo_graph import HaloGraph, partition_model_problem
from hpc_graph.ops.quant import PARAM_DTYPES, QUANT_BITS
from hpc_graph.options import BITS as BITS_SPEC
from hpc_graph.options import choice_spec, float_spec, int_spec, option
from hpc_graph.ops.quant_exchange import (BitTable, ExchangeCall, ExchangeStats, HaloPlan, HaloSlot,
                                          noise_key, quant_halo)

log = logging.getLogger(__name__)

PIPELINES = ("off", "on", "adaptive")
BITS = ("auto", 1, 2, 4, 8, 32)


# -- bit policy ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Decision:
    """The policy's answer after one epoch: the next base width, whether the next epoch must be
    synchronous, and which branch was taken (``up``, ``down``, ``hold``, ``cooldown``, ``warmup``)."""

    bits: int
    sync: bool
    branch: str
    ldr: float | None


class BitPolicy:
    """Time-adaptive base bit width from the loss descent rate (Eq. 3.4 with a cooldown).

    Args:
        smoothing: lambda of ``F_t``; window: delta (compared epochs, and cooldown length);
        widths: the candidate widths, smallest first (the start width is the smallest).
        cooldown: hold a new width for ``window`` epochs (always on in the engine; off only to
            replay the thesis' rule, see ``benchmarks/sylvie_policy_replay.py``).
        thesis_sign: use the LDR as printed in the thesis, ``(F_t - F_(t-1)) / time`` (replays only).
    """

    def __init__(self, smoothing: float = 0.9, window: int = 5, widths: tuple[int, ...] = QUANT_BITS,
                 cooldown: bool = True, thesis_sign: bool = False):
        self.smoothing, self.window, self.widths = float(smoothing), int(window), tuple(widths)
        self.cooldown, self.thesis_sign = bool(cooldown), bool(thesis_sign)
        self.bits = self.widths[0]
        self.t = 0
        self.smoothed: float | None = None
        self.ldr: list[float | None] = []
        self.last_change = 0

    def update(self, loss: float, seconds: float) -> Decision:
        """Feed epoch t's global loss and epoch time; returns the decision for epoch t+1."""
        self.t += 1
        t, delta = self.t, self.window
        if not math.isfinite(loss) or not seconds > 0:
            self.ldr.append(None)
            return Decision(self.bits, False, "hold", None)
        prev = self.smoothed
        self.smoothed = loss if prev is None else self.smoothing * prev + (1.0 - self.smoothing) * loss
        ldr = None if prev is None else (prev - self.smoothed) / seconds * (-1.0 if self.thesis_sign else 1.0)
        self.ldr.append(ldr)
        past = self.ldr[t - 1 - delta] if t > delta else None
        if ldr is None or past is None:
            return Decision(self.bits, False, "warmup", ldr)
        more = ldr < past
        if self.cooldown and self.last_change > 0 and t - self.last_change <= delta:  # held after a change
            return Decision(self.bits, more, "cooldown", ldr)
        i = self.widths.index(self.bits)
        if more and i + 1 < len(self.widths):
            self.bits, self.last_change, branch = self.widths[i + 1], t, "up"
        elif not more and i > 0:
            self.bits, self.last_change, branch = self.widths[i - 1], t, "down"
        else:
            branch = "hold"
        return Decision(self.bits, more, branch, ldr)

    def state_dict(self) -> dict[str, Any]:
        return {"bits": self.bits, "t": self.t, "smoothed": self.smoothed, "ldr": list(self.ldr),
                "last_change": self.last_change}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bits = int(state["bits"])
        self.t = int(state["t"])
        self.smoothed = state["smoothed"]
        self.ldr = list(state["ldr"])
        self.last_change = int(state["last_change"])


def node_importance(in_degree: np.ndarray, boundary: np.ndarray) -> np.ndarray:
    """``p`` float64[len(boundary)]: rank of each boundary node's in-degree among the boundary nodes.

    ``p = (#{u: deg(u) <= deg(v)} - 1) / (#boundary - 1)``: the highest degree gets 1, nodes with
    equal degrees get the same value, a single boundary node gets 1.
    """
    d = np.asarray(in_degree)[boundary]
    if d.shape[0] <= 1:
        return np.ones(d.shape[0])
    at_most = np.searchsorted(np.sort(d), d, side="right")
    return (at_most - 1) / (d.shape[0] - 1)


def assign_bits(p: np.ndarray, base: int) -> np.ndarray:
    """int8 bit widths from importances ``p`` and the base width: ``C[min(|C|-1, floor(p |C|))]``,
    ``C = {b in (1, 2, 4, 8): b >= base}``."""
    cand = np.array([b for b in QUANT_BITS if b >= base], dtype=np.int8)
    idx = np.minimum(len(cand) - 1, np.floor(np.asarray(p) * len(cand)).astype(np.int64))
    return cand[idx]


def _cpu(pair: tuple[torch.Tensor, torch.Tensor | None] | None) -> tuple | None:
    return None if pair is None else tuple(None if t is None else t.detach().cpu() for t in pair)


def _to(pair: tuple | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    return None if pair is None else tuple(None if t is None else t.to(device) for t in pair)


# -- the graph context ---------------------------------------------------------------------------
class _SylvieGraph(HaloGraph):
    """``HaloGraph`` whose halo rows arrive through the engine's quantised (possibly stale) exchange."""

    def __init__(self, dg: Any, comm: Any, engine: "SylvieEngine"):
        super().__init__(dg, comm)
        self.engine = engine

    def halo(self, x: torch.Tensor, extra: torch.Tensor | None = None):
        eng = self.engine
        if eng.evaluating:
            return super().halo(x, extra)  # evaluation is exact: full precision, synchronous
        return quant_halo(x, extra, eng.next_call(), stale=eng.stale)


@dataclasses.dataclass
class SylvieOptions:
    """``sylvie``'s options: the bit width of the halo messages, the pipeline, and the bit policy's settings."""
    bits: object = option("auto", BITS_SPEC,
                          "Bit width of the halo rows and halo gradients sent between ranks: 1, 2, 4 or 8 "
                          "(stochastic rounding, per-row scale and zero point), 32 (plain float32, as `dp`), or "
                          "`auto`: per node and per epoch, from the node's in-degree rank and the loss descent "
                          "rate (docs/sylvie.md).", section="engine")
    pipeline: str = option("off", choice_spec(*PIPELINES),
                           "`on`: every layer aggregates the halo rows (and returns the halo gradients) "
                           "of the previous epoch while this epoch's exchange runs in the background (staleness "
                           "1 epoch); `adaptive`: like `on`, but an epoch runs synchronously whenever the loss "
                           "descent rate asks for more bits; `off`: synchronous.", section="engine")
    scale_dtype: str = option("float32", choice_spec("float32", "float16"),
                              "Type of the per-row scale and zero point sent with quantised rows.", section="engine")
    ldr_smoothing: float = option(0.9, float_spec(0.0, 1.0, hi_open=True),
                                  "`bits: auto`: lambda of the smoothed loss F_t = lambda F_(t-1) + "
                                  "(1 - lambda) L_t.", section="engine")
    ldr_time: str = option("epochs", choice_spec("wall", "epochs"),
                           "`bits: auto`: the loss descent rate is per epoch (`epochs`: decisions do not depend "
                           "on timings, so runs and their resumptions are reproducible bit for bit) or per "
                           "second of the (all-ranks maximum) epoch time (`wall`, as the thesis: faster low-bit "
                           "epochs count, but two runs may decide differently).", section="engine")
    ldr_window: int = option(5, int_spec(1),
                             "`bits: auto`: delta, the epochs between the loss descent rates compared, "
                             "and the epochs the bit width is held after each change.", section="engine")


class SylvieEngine(Engine):
    """Quantised, optionally pipelined domain-parallel engine (module docstring). ``source``: a
    partition directory.

    Options: ``bits`` (``auto``, 1, 2, 4, 8, 32), ``pipeline`` (``off``, ``on``, ``adaptive``),
    ``scale_dtype`` (``float32``, ``float16``), ``ldr_smoothing`` (lambda), ``ldr_window``
    (delta), ``ldr_time`` (``wall``: per second, ``epochs``: per epoch), ``seed`` (rounding noise).
    """

    name = "sylvie"
    summary = "halo exchange with low-bit quantised messages and an optional stale pipeline (docs/sylvie.md)."
    shared_rng = True
    rank_state = True  # the pipeline's halo rows and gradients of the last epoch differ per rank
    Options = SylvieOptions

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        return partition_model_problem(model, mc)

    @classmethod
    def plan_load_extra(cls, graph: Any, rank: Any, ranks: int, dtype: str, options: dict[str, Any]) -> int:
        """The part file's int64 columns, alive while the partition makes its int32 copy."""
        return max(int(rank.edges) * 8, cls._read_as_float32_extra(graph, rank.owned, dtype))

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        o = self.opts
        smoothing, window = o.ldr_smoothing, o.ldr_window
        self.ldr_time = o.ldr_time
        self.bits, self.pipeline = o.bits, o.pipeline
        self.param_dtype = PARAM_DTYPES[o.scale_dtype]
        self.seed = int(self.options["seed"])

        dg, part = load_dist_graph(self.source, comm, self.device, dtype)
        data = partition_tensors(part, self.device, dtype, self.source)
        del part
        self.plan = HaloPlan.from_dist_graph(dg)
        self.send_p, self.recv_p = self._importance(dg)
        self.feat, self.label, self.masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self._setup(dg, smoothing, window)
        self.reset_stats()  # loading exchanged halo ids and importances: count training traffic only

    @classmethod
    def plan_assumptions(cls, options: dict[str, Any]) -> list[str]:
        o = cls.parse_options({k: v for k, v in options.items() if k not in ("seed", "feature_norm")})
        bits = "the widest width, 8 bits, for every row (bits: auto)" if o.bits == "auto" else f"{o.bits} bits"
        return [f"sylvie: halo rows and gradients at {bits}, {o.scale_dtype} scales; pipeline {o.pipeline}"
                + ("; the stale exchanges are hidden behind the step's computation up to its length"
                   if o.pipeline != "off" else "")]

    @classmethod
    def plan_instance(cls, graph: Any, rank: Any, ranks: int, comm: Any, dtype: torch.dtype,
                      options: dict[str, Any], hints: dict[str, Any] | None = None) -> "SylvieEngine":
        """The engine of ``rank`` from sizes alone (the planner's): every row of a message at one width, the
        widest the policy may choose under ``bits: auto`` (which weighs rows by their in-degree rank, which only
        the data gives, and climbs when the loss stalls): the plan holds for any epoch."""
        eng = cls.__new__(cls)
        Engine.__init__(eng, "<sylvie: sizes only>", comm, torch.device("meta"), dtype, options)
        o = eng.opts
        eng.ldr_time, eng.bits, eng.pipeline = o.ldr_time, o.bits, o.pipeline
        eng.param_dtype, eng.seed = PARAM_DTYPES[o.scale_dtype], int(eng.options["seed"])
        dg = cls._shape_partition(graph, rank, ranks, dtype)
        eng.plan = HaloPlan.of_shape(dg, rank.boundary_rows)
        eng.send_p = eng.recv_p = None
        # the rows' importances the engine keeps (float64 per row sent and per halo row; bits: auto)
        eng._importance_held = (torch.empty(eng.plan.send_total, dtype=torch.float64, device="meta"),
                                torch.empty(eng.plan.num_halo, dtype=torch.float64, device="meta"))
        eng.num_classes, eng.num_features = int(graph.classes), int(graph.features)
        eng._setup(dg, o.ldr_smoothing, o.ldr_window)
        if eng.bits == "auto":
            eng.policy.bits = eng._epoch_bits = max(eng.policy.widths)
        return eng

    def _setup(self, dg: Any, smoothing: float, window: int) -> None:
        """The graph context and the bit policy's state, after the plan and the importances."""
        self.graph = _SylvieGraph(dg, self.comm, self)
        self.policy = BitPolicy(float(smoothing), int(window))
        self.epoch = 0
        self.evaluating = False
        self.stale = False
        self._force_sync = True  # the first epoch has no previous halo rows
        self._calls = 0
        self._slots: dict[int, HaloSlot] = {}
        self._tables: dict[int, BitTable] = {}
        self._xstats = ExchangeStats()
        self._last: Decision | None = None
        self._epoch_bits = self.policy.bits if self.bits == "auto" else int(self.bits)
        self.history: list[dict[str, Any]] = []  # per epoch: base bits, mode, decision (same on every rank)

    def check_model(self, model: torch.nn.Module) -> None:
        self._check_attention_pattern(model)

    # -- set-up ------------------------------------------------------------------------------------
    def _importance(self, dg: Any) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Importance of every row this rank sends (per peer) and receives (fetched from the owners)."""
        plan = self.plan
        deg = dg.in_degree.cpu().numpy()
        boundary = np.unique(plan.send_all.cpu().numpy())
        p_full = np.zeros(plan.num_owned)
        p_full[boundary] = node_importance(deg, boundary)
        send_p = {q: p_full[lid.cpu().numpy()] for q, lid in plan.send_lid.items()}
        got = self.comm.exchange({q: torch.from_numpy(v) for q, v in send_p.items()},
                                 {q: ((c,), torch.float64) for q, c in plan.recv_count.items()})
        return send_p, {q: got[q].cpu().numpy() for q in plan.recv_count}

    def table(self, base: int) -> BitTable:
        """The bit table for base width ``base`` (``auto``) or the static width; cached."""
        if self.bits != "auto":
            base = int(self.bits)
        if base not in self._tables:
            if self.bits == "auto" and self.send_p is not None:
                self._tables[base] = BitTable({q: assign_bits(p, base) for q, p in self.send_p.items()},
                                              {q: assign_bits(p, base) for q, p in self.recv_p.items()},
                                              f"auto:{base}")
            else:
                self._tables[base] = BitTable.uniform(self.plan, base)
        return self._tables[base]

    # -- per call ----------------------------------------------------------------------------------
    def next_call(self) -> ExchangeCall:
        """The exchange of the next halo fetch of this epoch's forward pass (layer ``k``)."""
        k = self._calls
        self._calls += 1
        rank = int(self.comm.rank)
        slot = None
        if self.pipeline != "off":
            slot = self._slots.setdefault(k, HaloSlot())
        keys = {d: noise_key(self.seed, self.epoch, k, rank, d) for d in ("fwd", "bwd")}
        return ExchangeCall(self.plan, self.comm, self.table(self.policy.bits), keys, self.param_dtype,
                            self._xstats, slot, k)

    # -- trainer hooks -----------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._calls = 0
        self._epoch_bits = self.policy.bits if self.bits == "auto" else int(self.bits)
        sync = self.pipeline == "off" or self._force_sync
        self.stale = not sync
        if sync:
            for slot in self._slots.values():
                slot.drain()

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        both = torch.tensor([loss if math.isfinite(loss) else math.inf, float(seconds)], dtype=torch.float64)
        if self.comm.size > 1:
            self.comm.allreduce_(both, "max")  # exact: every rank gets the same two numbers
        g_loss, g_seconds = float(both[0]), (float(both[1]) if self.ldr_time == "wall" else 1.0)
        used = self._epoch_bits
        decision = self.policy.update(g_loss, g_seconds)
        self._last = decision
        self._force_sync = self.pipeline == "adaptive" and decision.sync
        self.history.append({"epoch": epoch, "bits": used, "mode": "async" if self.stale else "sync",
                             "branch": decision.branch, "next_bits": decision.bits,
                             "next_sync": self.pipeline == "off" or self._force_sync})
        if decision.branch in ("up", "down") and self.bits == "auto":
            log.info("sylvie: epoch %d: loss descent rate %.3g -> base width %d bit(s) (%s)", epoch,
                     decision.ldr if decision.ldr is not None else float("nan"), decision.bits, decision.branch)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        previous, self.evaluating = self.evaluating, True
        try:
            yield
        finally:
            self.evaluating = previous

    def close(self) -> None:
        for slot in self._slots.values():
            slot.drain()

    def state_dict(self) -> dict[str, Any]:
        """The bit policy, whether the next epoch runs synchronously, and this rank's pipeline state: every
        layer's halo rows and halo gradients of the last epoch (exchanges in flight completed first), which the
        next stale epoch uses. So a resumed run continues exactly as the uninterrupted one."""
        slots = {}
        for k, slot in self._slots.items():
            slot.drain()
            slots[k] = {"halo": _cpu(slot.halo), "grad": _cpu(slot.grad)}
        return {"policy": self.policy.state_dict(), "force_sync": self._force_sync, "slots": slots}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy"):
            self.policy.load_state_dict(state["policy"])
        slots = state.get("slots")
        if slots is None:  # a checkpoint without the pipeline state: the next epoch exchanges synchronously
            self._force_sync = True
            return
        self._force_sync = bool(state["force_sync"])
        self._slots = {}
        for k, s in slots.items():
            slot = self._slots[int(k)] = HaloSlot()
            slot.halo, slot.grad = _to(s["halo"], self.device), _to(s["grad"], self.device)

    # -- statistics --------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        super().reset_stats()
        if hasattr(self, "_xstats"):
            self._xstats = ExchangeStats()

    def stats(self) -> dict[str, Any]:
        """Base counters plus: ``halo_bytes_fwd``/``_bwd`` (quantised messages sent),
        ``halo_full_bytes`` (what full-precision messages would have been), ``bits_rows``
        ({width: rows sent}), ``base_bits``, ``mode`` (sync/async), ``staleness`` (epochs),
        ``codec_seconds`` (encoding + decoding), ``in_flight`` (exchanges still travelling)."""
        out: dict[str, Any] = dict(super().stats())
        x = self._xstats
        out.update({"halo_bytes_fwd": x.bytes["fwd"], "halo_bytes_bwd": x.bytes["bwd"],
                    "halo_full_bytes": x.full_bytes["fwd"] + x.full_bytes["bwd"],
                    "bits_rows": {str(b): c for b, c in sorted(x.rows.items())},
                    "base_bits": self._epoch_bits,
                    "mode": "async" if self.stale else "sync", "staleness": int(self.stale),
                    "codec_seconds": x.codec_seconds, "nonfinite_rows": x.nonfinite,
                    "in_flight": sum(s.in_flight for s in self._slots.values())})
        if self.history:
            h = self.history[-1]
            out.update({"next_bits": h["next_bits"], "policy_branch": h["branch"]})
        return out
