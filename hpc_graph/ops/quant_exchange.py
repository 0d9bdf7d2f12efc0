"""Quantised halo exchange: synchronous, or pipelined with halo rows one epoch stale.

Both ops move the same messages as :mod:`hpc_graph.ops.halo_exchange` (owned
rows to the ranks that hold them as halo rows; halo-row gradients back to
their owners), encoded by :mod:`hpc_graph.ops.quant` with a per-row bit width
from a :class:`BitTable`. Both ends derive message sizes from the table, so
every message is payload only.

* :class:`QuantHaloExchange` (synchronous): forward sends the current rows and
  waits for the halo; backward sends the halo gradients and waits for the
  gradients of the rows it sent. The gradient of quantisation is the
  identity (straight-through): the owner adds the (dequantised) halo-row
  gradients to its rows.
* :class:`StaleHaloExchange` (pipelined, PipeGCN-style): forward returns the
  halo rows received for the same layer in the *previous* epoch and starts
  sending the current rows in the background; backward adds the halo-row
  gradients received in the previous epoch and starts sending the current
  ones. Staleness is exactly one epoch; the transfer overlaps a whole epoch of
  computation. In-flight messages are decoded with the bit table they were
  sent with.

A :class:`HaloSlot` per layer keeps what the next epoch needs: the last halo
rows and halo gradients received, and the exchanges still in flight.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from hpc_graph.ops._kernel_args import empty
from hpc_graph.ops.quant import (EncodeStats, MessageLayout, decode, encode,
                                 message_layout, row_ranges)

_MASK64 = (1 << 64) - 1
DIRECTIONS = {"fwd": 1, "bwd": 2}


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def noise_key(seed: int, epoch: int, layer: int, rank: int, direction: str) -> int:
    """64-bit key of one message's rounding noise from (seed, epoch, layer, rank, direction)."""
    h = 0
    for v in (seed, epoch, layer, rank, DIRECTIONS[direction]):
        h = _splitmix64(h ^ (int(v) & _MASK64))
    return h


@dataclasses.dataclass
class HaloPlan:
    """Who sends which rows to whom, from one rank's :class:`~hpc_graph.graph.dist_graph.DistGraph`.

    Attributes:
        send_lid: {q: int64[s_q]} owned rows rank q holds as halo rows (ascending q, q's halo order).
        send_gid: {q: int64[s_q]} their global ids (counter ids of the rounding noise).
        recv_count: {q: c_q} halo rows owned by q; halo_lo: {q: first halo row of q}.
        halo_gid: int64[h] global ids of the halo rows.
        send_all: int64[S] ``send_lid`` concatenated in ascending q (rows of returned gradients).
        num_owned, num_halo: n, h.
        boundary: int64[B] the distinct owned rows sent to any peer (ascending); ``send_pos[q]``:
            int64[s_q] position of each row of ``send_lid[q]`` in ``boundary`` (a row that goes to
            several peers is summarised once per exchange).
    """

    send_lid: dict[int, torch.Tensor]
    send_gid: dict[int, torch.Tensor]
    recv_count: dict[int, int]
    halo_lo: dict[int, int]
    halo_gid: torch.Tensor
    send_all: torch.Tensor
    num_owned: int
    num_halo: int
    boundary: torch.Tensor | None = None
    send_pos: dict | None = None

    def __post_init__(self) -> None:
        if self.boundary is None:
            b = np.unique(self.send_all.cpu().numpy())
            self.boundary = torch.from_numpy(b).to(self.send_all.device)
            self.send_pos = {q: np.searchsorted(b, lid.cpu().numpy()) for q, lid in self.send_lid.items()}

    @classmethod
    def from_dist_graph(cls, dg: Any) -> "HaloPlan":
        send_gid = {q: dg.gid.index_select(0, lid) for q, lid in dg.send_lid.items()}
        halo_lo = {q: dg.halo_range(q)[0] for q in dg.recv_count}
        parts = [dg.send_lid[q] for q in sorted(dg.send_lid)]
        send_all = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=dg.gid.device)
        return cls(dict(dg.send_lid), send_gid, dict(dg.recv_count), halo_lo, dg.halo_gid, send_all,
                   dg.num_owned, dg.num_halo)

    @classmethod
    def of_shape(cls, dg: Any, boundary: int) -> "HaloPlan":
        """The plan of a :class:`~hpc_graph.graph.dist_graph.DistGraph` with sizes and no data (the planner's),
        ``boundary`` distinct owned rows sent to any peer."""
        meta = torch.device("meta")
        send_gid = {q: torch.empty_like(lid) for q, lid in dg.send_lid.items()}
        halo_lo = {q: dg.halo_range(q)[0] for q in dg.recv_count}
        parts = [dg.send_lid[q] for q in sorted(dg.send_lid)]
        send_all = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=meta)
        return cls(dict(dg.send_lid), send_gid, dict(dg.recv_count), halo_lo, dg.halo_gid, send_all,
                   dg.num_owned, dg.num_halo, boundary=torch.empty(int(boundary), dtype=torch.int64, device=meta),
                   send_pos={q: np.zeros(int(lid.shape[0]), np.int64) for q, lid in dg.send_lid.items()})

    @property
    def send_total(self) -> int:
        return int(self.send_all.shape[0])


@dataclasses.dataclass(frozen=True)
class BitTable:
    """Bit widths (1, 2, 4, 8 or 32) of the rows this rank sends to / receives from each peer.

    ``send[q]``: int8[s_q] for the rows of ``plan.send_lid[q]``; ``recv[q]``: int8[c_q] for the
    halo rows owned by q. Rank q's ``send[p]`` equals rank p's ``recv[q]``: both come from the
    same node importances and the same epoch width, which is what lets every message go
    without a header. ``label`` names the table in logs (e.g. the epoch's base width).
    """

    send: dict[int, np.ndarray]
    recv: dict[int, np.ndarray]
    label: str = ""

    @classmethod
    def uniform(cls, plan: HaloPlan, bits: int) -> "BitTable":
        return cls({q: np.full(int(t.shape[0]), bits, np.int8) for q, t in plan.send_lid.items()},
                   {q: np.full(int(c), bits, np.int8) for q, c in plan.recv_count.items()}, str(bits))


@dataclasses.dataclass
class ExchangeStats:
    """Counters of quantised exchanges (per direction: ``fwd``, ``bwd``)."""

    bytes: dict = dataclasses.field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    full_bytes: dict = dataclasses.field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    rows: dict = dataclasses.field(default_factory=dict)  # {bit width: rows sent}
    codec_seconds: float = 0.0
    nonfinite: int = 0

    def add_rows(self, layout: MessageLayout) -> None:
        for b, c in layout.histogram.items():
            self.rows[b] = self.rows.get(b, 0) + c


@dataclasses.dataclass
class ExchangeCall:
    """Everything one layer's exchange in one epoch needs.

    ``plan`` and ``comm`` are fixed; ``table``, ``keys`` (``{"fwd": key, "bwd": key}``),
    ``layer`` and ``epoch`` change per call. ``param_dtype`` is float32 or float16.
    """

    plan: HaloPlan
    comm: Any
    table: BitTable
    keys: dict
    param_dtype: torch.dtype
    stats: ExchangeStats
    slot: "HaloSlot | None" = None
    layer: int = 0


class Pending:
    """An exchange in flight: :meth:`finish` waits for it and decodes what arrived."""

    def __init__(self, request: Any, layouts: dict[int, MessageLayout], rows: dict[int, torch.Tensor],
                 param_dtype: torch.dtype, stats: ExchangeStats):
        self.request, self.layouts, self.rows = request, layouts, rows
        self.param_dtype, self.stats = param_dtype, stats

    def finish(self, out: torch.Tensor, out_extra: torch.Tensor | None) -> None:
        got = self.request.wait()
        t0 = time.perf_counter()
        for q, layout in self.layouts.items():
            decode(got[q], layout, out, self.rows[q], out_extra=out_extra, param_dtype=self.param_dtype)
        self.stats.codec_seconds += time.perf_counter() - t0


def post(call: ExchangeCall, x: torch.Tensor, extra: torch.Tensor | None, direction: str) -> Pending:
    """Encode and start sending ``x`` (and ``extra``) rows in ``direction`` (``fwd``: owned rows to
    the ranks holding them as halo; ``bwd``: halo-row gradients to their owners). Non-blocking."""
    plan, table, stats = call.plan, call.table, call.stats
    width, e = int(x.shape[1]), (0 if extra is None else int(extra.shape[1]))
    dev, dtype = x.device, x.dtype
    key = call.keys[direction]
    es = EncodeStats()
    sends: dict[int, torch.Tensor] = {}
    specs: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
    layouts: dict[int, MessageLayout] = {}
    rows: dict[int, torch.Tensor] = {}
    t0 = time.perf_counter()
    x = x.contiguous()
    extra = None if extra is None else extra.contiguous()
    full_row = (width + e) * x.element_size()
    if direction == "fwd":
        shared = len(plan.send_lid) > 1 and not x.is_meta  # rows sent to several peers: their ranges once
        lo, hi = row_ranges(x, plan.boundary) if shared else (None, None)
        for q, lid in plan.send_lid.items():
            lay = message_layout(table.send[q], width, e, dtype, call.param_dtype, shape_only=x.is_meta)
            pos = plan.send_pos[q]
            sends[q] = encode(x, lid, lay, extra=extra, ids=plan.send_gid[q], key=key,
                              param_dtype=call.param_dtype, stats=es,
                              ranges=None if lo is None else (lo[pos], hi[pos]))
            stats.add_rows(lay)
            stats.full_bytes["fwd"] += int(lid.shape[0]) * full_row
        for q, c in plan.recv_count.items():
            lay = message_layout(table.recv[q], width, e, dtype, call.param_dtype, shape_only=x.is_meta)
            layouts[q], specs[q] = lay, ((lay.nbytes,), torch.uint8)
            lo = plan.halo_lo[q]
            rows[q] = torch.arange(lo, lo + c, device=dev)
    else:
        for q, c in plan.recv_count.items():
            lo = plan.halo_lo[q]
            lay = message_layout(table.recv[q], width, e, dtype, call.param_dtype, shape_only=x.is_meta)
            sends[q] = encode(x, torch.arange(lo, lo + c, device=dev), lay, extra=extra,
                              ids=plan.halo_gid[lo:lo + c], key=key, param_dtype=call.param_dtype, stats=es)
            stats.add_rows(lay)
            stats.full_bytes["bwd"] += c * full_row
        off = 0
        for q in sorted(plan.send_lid):
            s = int(plan.send_lid[q].shape[0])
            lay = message_layout(table.send[q], width, e, dtype, call.param_dtype, shape_only=x.is_meta)
            layouts[q], specs[q] = lay, ((lay.nbytes,), torch.uint8)
            rows[q] = torch.arange(off, off + s, device=dev)
            off += s
    stats.codec_seconds += time.perf_counter() - t0
    stats.bytes[direction] += sum(int(b.numel()) for b in sends.values())
    if es.nonfinite:
        stats.nonfinite += es.nonfinite
        import logging
        logging.getLogger(__name__).warning(
            "rank %d, layer %d (%s): %d row(s) with NaN/Inf sent as NaN rows", int(call.comm.rank),
            call.layer, "halo rows" if direction == "fwd" else "halo gradients", es.nonfinite)
    return Pending(call.comm.exchange_start(sends, specs, device=dev), layouts, rows, call.param_dtype, stats)


def _gradient_buffers(call: ExchangeCall, like: torch.Tensor, width: int, e: int):
    s = call.plan.send_total  # every row is written by the decode of its peer's message
    return empty((s, width), like.dtype, like.device), (None if e == 0 else like.new_empty((s, e)))


def _owned_gradient(call: ExchangeCall, like: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    grad = like.new_zeros((call.plan.num_owned, buf.shape[1]))
    if buf.shape[0]:
        grad.index_add_(0, call.plan.send_all, buf)
    return grad


class HaloSlot:
    """One layer's pipeline state: the last halo rows and halo gradients received, and exchanges in flight."""

    def __init__(self) -> None:
        self.halo: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.grad: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.pending_fwd: tuple[Pending, tuple] | None = None
        self.pending_bwd: tuple[Pending, tuple] | None = None

    def take_halo(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pending_fwd is not None:
            pending, bufs = self.pending_fwd
            pending.finish(*bufs)
            self.halo, self.pending_fwd = bufs, None
        if self.halo is None:
            raise RuntimeError("stale halo exchange: no halo rows from a previous epoch (run a synchronous "
                               "epoch first)")
        return self.halo

    def take_grad(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pending_bwd is not None:
            pending, bufs = self.pending_bwd
            pending.finish(*bufs)
            self.grad, self.pending_bwd = bufs, None
        if self.grad is None:
            raise RuntimeError("stale halo exchange: no halo gradients from a previous epoch")
        return self.grad

    def drain(self) -> None:
        """Complete every exchange in flight (their data kept for the next stale epoch)."""
        if self.pending_fwd is not None:
            self.take_halo()
        if self.pending_bwd is not None:
            self.take_grad()

    @property
    def in_flight(self) -> int:
        return int(self.pending_fwd is not None) + int(self.pending_bwd is not None)


def _empty_extra(x: torch.Tensor) -> torch.Tensor:
    return x.new_zeros((x.shape[0], 0))


class QuantHaloExchange(torch.autograd.Function):
    """``halo, halo_extra = QuantHaloExchange.apply(x, extra, call)``: synchronous quantised exchange.

    Args:
        x: float[n, F] owned rows; extra: float[n, E] rows sent unquantised (E may be 0).
        call: the :class:`ExchangeCall` (plan, bit table, keys, stats, optional slot).
    Returns:
        float[h, F], float[h, E]: the halo rows (dequantised), differentiable (straight-through).
    """

    @staticmethod
    def forward(ctx, x, extra, call: ExchangeCall):
        h, width, e = call.plan.num_halo, int(x.shape[1]), int(extra.shape[1])
        halo = empty((h, width), x.dtype, x.device)  # every halo row comes from exactly one peer's message
        halo_e = x.new_empty((h, e))
        post(call, x.detach(), extra.detach() if e else None, "fwd").finish(halo, halo_e if e else None)
        if call.slot is not None:  # what a following stale epoch uses
            call.slot.halo = (halo.detach(), halo_e.detach() if e else None)
        ctx.call, ctx.e = call, e
        return halo, halo_e

    @staticmethod
    def backward(ctx, g_halo, g_extra):
        call, e = ctx.call, ctx.e
        g_halo = g_halo.contiguous()
        buf, buf_e = _gradient_buffers(call, g_halo, g_halo.shape[1], e)
        post(call, g_halo, g_extra.contiguous() if e else None, "bwd").finish(buf, buf_e)
        if call.slot is not None:
            call.slot.grad = (buf, buf_e)
        grad_x = _owned_gradient(call, g_halo, buf)
        grad_e = _owned_gradient(call, g_halo, buf_e) if e else g_halo.new_zeros((call.plan.num_owned, 0))
        return grad_x, grad_e, None


class StaleHaloExchange(torch.autograd.Function):
    """``halo, halo_extra = StaleHaloExchange.apply(x, extra, call)``: the pipelined exchange.

    Returns the halo rows received for this layer in the previous epoch (``call.slot``) and
    starts sending ``x`` in the background; backward returns the halo-row gradients received
    in the previous epoch and starts sending the current ones.
    """

    @staticmethod
    def forward(ctx, x, extra, call: ExchangeCall):
        slot = call.slot
        halo, halo_e = slot.take_halo()
        e = int(extra.shape[1])
        h, width = call.plan.num_halo, int(x.shape[1])
        if halo.shape != (h, width):
            raise RuntimeError(f"stale halo exchange, layer {call.layer}: the previous epoch's halo rows are "
                               f"{tuple(halo.shape)}, this layer needs {(h, width)}")
        bufs = (empty((h, width), x.dtype, x.device), x.new_empty((h, e)) if e else None)
        slot.pending_fwd = (post(call, x.detach(), extra.detach() if e else None, "fwd"), bufs)
        ctx.call, ctx.e = call, e
        # fresh tensors that nothing else writes (the slot only replaces its reference): no copy needed
        return halo.view_as(halo), (halo_e.view_as(halo_e) if e else x.new_zeros((h, 0)))

    @staticmethod
    def backward(ctx, g_halo, g_extra):
        call, e = ctx.call, ctx.e
        slot = call.slot
        buf, buf_e = slot.take_grad()
        g_halo = g_halo.contiguous()
        new = _gradient_buffers(call, g_halo, g_halo.shape[1], e)
        slot.pending_bwd = (post(call, g_halo, g_extra.contiguous() if e else None, "bwd"), new)
        grad_x = _owned_gradient(call, g_halo, buf)
        grad_e = _owned_gradient(call, g_halo, buf_e) if e else g_halo.new_zeros((call.plan.num_owned, 0))
        return grad_x, grad_e, None


def quant_halo(x: torch.Tensor, extra: torch.Tensor | None, call: ExchangeCall, *, stale: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Halo rows of ``x`` float[n, F] (and of ``extra`` float[n, E]) through a quantised exchange.

    ``stale=False``: synchronous (:class:`QuantHaloExchange`); ``stale=True``: one epoch stale,
    pipelined (:class:`StaleHaloExchange`; ``call.slot`` must hold the previous epoch's data).
    Returns ``(float[h, F], float[h, E] or None)``.
    """
    e = _empty_extra(x) if extra is None else extra
    op = StaleHaloExchange if stale else QuantHaloExchange
    halo, halo_e = op.apply(x, e, call)
    return halo, (None if extra is None else halo_e)
