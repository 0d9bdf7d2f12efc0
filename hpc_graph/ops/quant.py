"""Low-bit messages of rows: the byte layout, encoding and decoding (any engine that sends rows).

A message carries ``m`` rows of width ``F``; row ``r`` travels with its own
bit width ``bits[r]``:

* 1, 2, 4 or 8: stochastic rounding ``q = floor((h - z)/s + u)`` with the
  row's zero point ``z = min(h)`` and scale ``s = (max(h) - min(h)) / (2^b - 1)``,
  ``u`` a counter-based uniform keyed by (key, node id, feature): unbiased,
  ``E[z + s q] = h``, reproducible for a given key;
* 32: the row itself, in the training dtype ("full precision": float64 in a
  float64 run), bit for bit.

Both ends know every row's bit width (the sender's bit table is computed the
same way on the receiving rank), so a message is payload only, no header::

    [full-precision rows][extra columns of every row][zero points][scales][codes]

Full-precision rows come first (aligned), then ``E`` "extra" columns sent
unquantised for every row (GAT's attention scores), then one zero point and
one scale per quantised row (``float32``, or ``float16`` with ``z`` rounded
down and ``s`` rounded up so that the row's range stays covered), then the
codes: quantised rows grouped by bit width (1, 2, 4, 8; rows keep their order
within a group), ``8/b`` codes per byte, padded only at the end of a group
(:func:`numba_kernels.cpu.quant.group_layout`). A constant row (``s = 0``)
comes back exactly (as its ``float32``/``float16`` zero point). A row holding
NaN or Inf is sent as a NaN row (``s`` = NaN), so the receiver's loss turns
non-finite and the trainer's ``on_nonfinite`` decides; :func:`encode` reports
how many there were.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from hpc_graph.ops._bridge import as_array
from hpc_graph.ops._kernel_args import empty, kernel
from numba_kernels.cpu.quant import group_layout

#: bit widths that are quantised; 32 means full precision
QUANT_BITS = (1, 2, 4, 8)
FULL_BITS = 32
PARAM_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class MessageLayout:
    """Where everything lies in one message (see the module docstring).

    Attributes:
        m, width, extra: rows, quantised width F, extra columns E.
        raw_rows: int64[n_raw] message rows sent at full precision (ascending).
        q_rows: int64[n_q] message rows quantised, in group order (bit width 1, 2, 4, 8).
        group_start: int64[5] group boundaries within ``q_rows``.
        code_start: int64[5] byte offsets of the groups within the code section.
        offsets: dict of byte offsets: ``raw``, ``extra``, ``zero``, ``scale``, ``codes``, ``end``.
        histogram: {bit width: rows} of this message.
    """

    m: int
    width: int
    extra: int
    itemsize: int
    param_itemsize: int
    raw_rows: np.ndarray
    q_rows: np.ndarray
    group_start: np.ndarray
    code_start: np.ndarray
    offsets: dict
    histogram: dict
    raw_index: torch.Tensor  # raw_rows as an int64 tensor (CPU)
    q_index: torch.Tensor  # q_rows as an int64 tensor (CPU)

    @property
    def nbytes(self) -> int:
        return int(self.offsets["end"])


@functools.lru_cache(maxsize=4096)
def _layout_cached(bits_bytes: bytes, width: int, extra: int, itemsize: int, param_itemsize: int) -> MessageLayout:
    bits = np.frombuffer(bits_bytes, dtype=np.int8)
    m = int(bits.shape[0])
    order = np.argsort(bits, kind="stable").astype(np.int64)
    sorted_bits = bits[order]
    n_q = int(np.searchsorted(sorted_bits, FULL_BITS))
    q_rows, raw_rows = order[:n_q], np.sort(order[n_q:])
    group_start = np.zeros(5, np.int64)
    for g, b in enumerate(QUANT_BITS):
        group_start[g + 1] = group_start[g] + int(np.count_nonzero(sorted_bits[:n_q] == b))
    if group_start[4] != n_q:
        bad = sorted(set(np.unique(bits).tolist()) - set(QUANT_BITS) - {FULL_BITS})
        raise ValueError(f"message layout: bit widths must be in {QUANT_BITS + (FULL_BITS,)}, got {bad}")
    raw_index, q_index = torch.from_numpy(raw_rows.copy()), torch.from_numpy(q_rows.copy())
    for a in (order, q_rows, raw_rows):
        a.setflags(write=False)
    return _assemble(m, width, extra, itemsize, param_itemsize, raw_rows, q_rows, group_start, raw_index, q_index)


@functools.lru_cache(maxsize=256)
def _shape_layout(m: int, bits: int, width: int, extra: int, itemsize: int, param_itemsize: int) -> MessageLayout:
    """The layout of ``m`` rows all at ``bits`` for a shape-only (``meta``) message: its sizes and offsets are
    those of :func:`message_layout`; its row lists hold no data (nothing reads them on ``meta``)."""
    n_q = 0 if bits == FULL_BITS else m
    group_start = np.zeros(5, np.int64)
    for g, b in enumerate(QUANT_BITS):
        group_start[g + 1] = group_start[g] + (n_q if b == bits else 0)
    nothing = lambda k: np.broadcast_to(np.zeros(1, np.int64), (k,))  # noqa: E731  (a length, no storage)
    meta = lambda k: torch.empty(k, dtype=torch.int64, device="meta")  # noqa: E731
    return _assemble(m, width, extra, itemsize, param_itemsize, nothing(m - n_q), nothing(n_q), group_start,
                     meta(m - n_q), meta(n_q))


def _assemble(m: int, width: int, extra: int, itemsize: int, param_itemsize: int, raw_rows: np.ndarray,
              q_rows: np.ndarray, group_start: np.ndarray, raw_index: torch.Tensor,
              q_index: torch.Tensor) -> MessageLayout:
    n_q = int(group_start[4])
    code_start = group_layout(group_start, width)
    off = {"raw": 0}
    off["extra"] = off["raw"] + len(raw_rows) * width * itemsize
    off["zero"] = off["extra"] + m * extra * itemsize
    off["scale"] = off["zero"] + n_q * param_itemsize
    off["codes"] = off["scale"] + n_q * param_itemsize
    off["end"] = off["codes"] + int(code_start[4])
    hist = {b: int(group_start[g + 1] - group_start[g]) for g, b in enumerate(QUANT_BITS)}
    hist[FULL_BITS] = len(raw_rows)
    for a in (group_start, code_start):
        a.setflags(write=False)
    return MessageLayout(m, width, extra, itemsize, param_itemsize, raw_rows, q_rows, group_start, code_start,
                         off, {b: c for b, c in hist.items() if c}, raw_index, q_index)


def message_layout(bits: np.ndarray, width: int, extra: int = 0, dtype: torch.dtype = torch.float32,
                   param_dtype: torch.dtype = torch.float32, *, shape_only: bool = False) -> MessageLayout:
    """Layout of a message whose rows have bit widths ``bits`` (int8[m], values 1, 2, 4, 8, 32).

    ``width``: quantised columns F; ``extra``: unquantised columns E; ``dtype``: the
    training dtype (full-precision rows and extra columns); ``param_dtype``: zero points
    and scales. Layouts are cached (the same bit table serves every layer of an epoch).
    ``shape_only``: for a message of ``meta`` tensors (the planner's): one width for every row gives the
    same sizes and offsets without the row lists.
    """
    bits = np.ascontiguousarray(bits, dtype=np.int8)
    itemsize = torch.empty((), dtype=dtype).element_size()
    pitem = torch.empty((), dtype=param_dtype).element_size()
    if shape_only and bits.size and int(bits.min()) == int(bits.max()) and int(bits[0]) in QUANT_BITS + (FULL_BITS,):
        return _shape_layout(int(bits.size), int(bits[0]), int(width), int(extra), itemsize, pitem)
    return _layout_cached(bits.tobytes(), int(width), int(extra), itemsize, pitem)


def _section(buf: torch.Tensor, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    part = buf[lo:hi]
    return part if dtype == torch.uint8 else part.view(dtype)


def _params(lo: np.ndarray, hi: np.ndarray, bits: np.ndarray, param_dtype: torch.dtype
            ) -> tuple[np.ndarray, np.ndarray]:
    """Zero points and scales (float32 arrays holding values exact in ``param_dtype``).

    float16: ``z`` rounded down and ``s`` rounded up, so ``z + s (2^b - 1)`` still reaches the
    row's maximum; a range float16 cannot hold raises ``OverflowError``.
    """
    levels = (np.left_shift(1, bits.astype(np.int64)) - 1).astype(np.float32)
    if param_dtype == torch.float32:
        return lo, (hi - lo) / levels
    with np.errstate(over="ignore", invalid="ignore"):
        z = lo.astype(np.float16)
        down = z.astype(np.float32) > lo
        z[down] = np.nextafter(z[down], np.float16(-np.inf))
        z32 = z.astype(np.float32)
        s = ((hi - z32) / levels).astype(np.float16)
        up = z32 + s.astype(np.float32) * levels < hi
        s[up] = np.nextafter(s[up], np.float16(np.inf))
    z32, s32 = z.astype(np.float32), s.astype(np.float32)
    finite_in = np.isfinite(lo)
    if not (np.isfinite(z32[finite_in]).all() and np.isfinite(s32[finite_in]).all()):
        raise OverflowError("values beyond float16's range (|h| > 65504): use scale_dtype float32")
    return z32, s32


@dataclasses.dataclass
class EncodeStats:
    """What :func:`encode` saw: ``nonfinite`` rows (sent as NaN rows)."""

    nonfinite: int = 0


def row_ranges(x: torch.Tensor, rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` float32[m]: minimum and maximum of each row ``x[rows]`` (NaN for a non-finite row).

    Compute them once for rows that go to several peers and pass them to :func:`encode` (``ranges``).
    """
    lo = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    hi = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        kernel("quant.row_range", x)(as_array(x), as_array(rows.contiguous()), as_array(lo), as_array(hi))
    if x.is_meta:  # sizes only (the planner): ranges that make finite scales, nothing more is known
        return np.zeros(rows.shape[0], np.float32), np.ones(rows.shape[0], np.float32)
    return lo.cpu().numpy(), hi.cpu().numpy()


def encode(x: torch.Tensor, rows: torch.Tensor, layout: MessageLayout, *, extra: torch.Tensor | None = None,
           ids: torch.Tensor, key: int, param_dtype: torch.dtype = torch.float32,
           stats: EncodeStats | None = None, ranges: tuple[np.ndarray, np.ndarray] | None = None) -> torch.Tensor:
    """One message (uint8[layout.nbytes], on ``x``'s device) holding rows ``x[rows]``.

    Args:
        x: float[N, F] (F = ``layout.width``); extra: float[N, E] sent unquantised, or None.
        rows: int64[m] rows of ``x`` (and ``extra``) in message order.
        ids: int64[m] counter ids of the rows for the rounding noise (global node ids).
        key: 64-bit key of this message's noise (seed, epoch, layer, rank, direction).
        param_dtype: float32 or float16 zero points and scales.
        ranges: ``(lo, hi)`` float32[m] of the rows in message order, when already known
            (:func:`row_ranges`); computed here otherwise.
    """
    m, width = layout.m, layout.width
    if rows.shape[0] != m or x.shape[1] != width:
        raise ValueError(f"encode: {rows.shape[0]} rows of width {x.shape[1]} do not fit a layout of "
                         f"{m} rows of width {width}")
    buf = empty((layout.nbytes,), torch.uint8, x.device)  # huge pages when large: fewer page faults
    off = layout.offsets
    dev = x.device
    if len(layout.raw_rows):
        raw = layout.raw_index.to(dev)
        _section(buf, off["raw"], off["extra"], x.dtype).view(-1, width).copy_(x.index_select(0, rows[raw]))
    if layout.extra:
        _section(buf, off["extra"], off["zero"], x.dtype).view(m, layout.extra).copy_(extra.index_select(0, rows))
    n_q = len(layout.q_rows)
    if n_q:
        qsel = layout.q_index.to(dev)
        xrows = rows[qsel].contiguous()
        xa = as_array(x)
        if x.is_meta:  # sizes only (the planner): room for the parameters, no values to compute them from
            z_t = torch.empty(n_q, dtype=torch.float32, device=dev)
            s_t = torch.empty(n_q, dtype=torch.float32, device=dev)
        else:
            if ranges is None:
                lo, hi = row_ranges(x, xrows)
            else:
                lo, hi = ranges[0][layout.q_rows], ranges[1][layout.q_rows]
            bits_q = np.repeat(np.array(QUANT_BITS, np.int8), np.diff(layout.group_start))
            z, s = _params(lo, hi, bits_q, param_dtype)
            bad = ~np.isfinite(z)
            if bad.any():
                s = s.copy()
                s[bad] = np.nan  # decoded as a NaN row
                if stats is not None:
                    stats.nonfinite += int(bad.sum())
            z_t, s_t = torch.from_numpy(z).to(dev), torch.from_numpy(s).to(dev)
        _section(buf, off["zero"], off["scale"], param_dtype).copy_(z_t)
        _section(buf, off["scale"], off["codes"], param_dtype).copy_(s_t)
        codes = buf[off["codes"]:off["end"]]
        kernel("quant.quantize_pack", x)(xa, as_array(xrows), as_array(z_t), as_array(s_t),
                                          as_array(ids[qsel].contiguous()), np.uint64(key & (2**64 - 1)),
                                          layout.group_start, layout.code_start, as_array(codes))
    return buf


def decode(buf: torch.Tensor, layout: MessageLayout, out: torch.Tensor, out_rows: torch.Tensor, *,
           out_extra: torch.Tensor | None = None, param_dtype: torch.dtype = torch.float32) -> None:
    """Write the rows of message ``buf`` into ``out[out_rows]`` (and the extra columns into ``out_extra``).

    Args:
        buf: uint8[layout.nbytes] as :func:`encode` made it.
        out: float[N_out, F] destination; out_rows: int64[m] its row for each message row.
        out_extra: float[N_out, E] destination of the extra columns (when ``layout.extra``).
    """
    if buf.numel() != layout.nbytes:
        raise ValueError(f"decode: message of {buf.numel()} bytes, the bit table says {layout.nbytes}")
    off, width, m = layout.offsets, layout.width, layout.m
    dev = out.device
    if len(layout.raw_rows):
        raw = layout.raw_index.to(dev)
        out.index_copy_(0, out_rows[raw], _section(buf, off["raw"], off["extra"], out.dtype).view(-1, width))
    if layout.extra:
        out_extra.index_copy_(0, out_rows, _section(buf, off["extra"], off["zero"], out.dtype).view(m, layout.extra))
    if len(layout.q_rows):
        qsel = layout.q_index.to(dev)
        z = _section(buf, off["zero"], off["scale"], param_dtype).to(torch.float32)
        s = _section(buf, off["scale"], off["codes"], param_dtype).to(torch.float32)
        kernel("quant.unpack_dequantize", out)(as_array(buf[off["codes"]:off["end"]]), as_array(z), as_array(s),
                                               layout.group_start, layout.code_start,
                                               as_array(out_rows[qsel].contiguous()), as_array(out))
