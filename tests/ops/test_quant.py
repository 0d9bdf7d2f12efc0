"""Quantised messages (hpc_graph.ops.quant): layout sizes, encode/decode round trips, float16 parameters, NaN rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.ops.quant import EncodeStats, decode, encode, message_layout

BIT_CHOICES = np.array([1, 2, 4, 8, 32], np.int8)


def _analytic_bytes(bits, width, extra, itemsize, pitem):
    """Message size from the bit table, written out independently of the layout code."""
    total = 0
    for b in (1, 2, 4, 8):
        n = int((bits == b).sum())
        total += 2 * n * pitem + (n * width * b + 7) // 8
    total += int((bits == 32).sum()) * width * itemsize + len(bits) * extra * itemsize
    return total


def _message(seed, m=40, width=13, extra=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    x = torch.randn(m + 7, width, generator=g, dtype=dtype) * 3
    ex = torch.randn(m + 7, extra, generator=g, dtype=dtype)
    rows = torch.from_numpy(rng.permutation(m + 7)[:m].astype(np.int64))
    bits = rng.choice(BIT_CHOICES, m).astype(np.int8)
    return x, ex, rows, bits


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("width,extra", [(1, 0), (7, 2), (13, 0), (64, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pdt", [torch.float32, torch.float16])
def test_round_trip_within_one_step_and_sizes_from_the_bit_table(seed, width, extra, dtype, pdt):
    x, ex, rows, bits = _message(seed, width=width, extra=extra, dtype=dtype)
    layout = message_layout(bits, width, extra, dtype, pdt)
    itemsize, pitem = x.element_size(), (2 if pdt == torch.float16 else 4)
    assert layout.nbytes == _analytic_bytes(bits, width, extra, itemsize, pitem)
    buf = encode(x, rows, layout, extra=ex if extra else None, ids=rows, key=seed, param_dtype=pdt)
    assert buf.dtype == torch.uint8 and buf.numel() == layout.nbytes
    out = torch.full((60, width), float("nan"), dtype=dtype)
    out_e = torch.full((60, extra), float("nan"), dtype=dtype)
    where = torch.arange(10, 10 + len(rows))
    decode(buf, layout, out, where, out_extra=out_e if extra else None, param_dtype=pdt)
    got, want = out[where].double(), x[rows].double()
    b = torch.from_numpy(bits.astype(np.int64))
    full = b == 32
    assert torch.equal(got[full], want[full])  # full precision rows: bit for bit
    if extra:
        assert torch.equal(out_e[where], ex[rows])
    lo, hi = want.min(1).values, want.max(1).values
    step = ((hi - lo) / (2.0 ** b.double() - 1)).unsqueeze(1)
    # float16 parameters: the zero point is rounded down and the scale up (to float16 precision)
    slack, rel = (1e-3, 2e-3) if pdt == torch.float16 else (1e-5, 1e-6)
    err = (got - want).abs()[~full]
    assert (err <= step[~full] * (1 + slack) + rel * want.abs()[~full] + 1e-12).all()
    assert torch.isnan(out[:10]).all() and torch.isnan(out[10 + len(rows):]).all()  # other rows untouched


def test_constant_rows_come_back_exactly():
    x = torch.tensor([[2.5] * 9, [-1.25] * 9, [0.0] * 9])
    for b in (1, 2, 4, 8):
        layout = message_layout(np.full(3, b, np.int8), 9)
        out = torch.zeros(3, 9)
        decode(encode(x, torch.arange(3), layout, ids=torch.arange(3), key=1), layout, out, torch.arange(3))
        assert torch.equal(out, x)


def test_mean_of_many_encodings_is_the_row():
    torch.manual_seed(0)
    x = torch.randn(1, 24, dtype=torch.float64)
    layout = message_layout(np.array([1], np.int8), 24, dtype=torch.float64)
    n = 3000
    acc = torch.zeros(24, dtype=torch.float64)
    for k in range(n):
        out = torch.zeros(1, 24, dtype=torch.float64)
        decode(encode(x, torch.tensor([0]), layout, ids=torch.tensor([0]), key=k), layout, out, torch.tensor([0]))
        acc += out[0]
    s = float(x.max() - x.min())
    sigma = s / 2 / np.sqrt(n)  # a 1-bit code is a Bernoulli between z and z + s: sd <= s/2
    assert ((acc / n - x[0]).abs() <= 4 * sigma).all()


def test_nan_row_travels_as_a_nan_row_and_is_counted():
    x = torch.randn(4, 5)
    x[2, 3] = float("nan")
    x[3, 0] = float("inf")
    layout = message_layout(np.array([4, 4, 8, 32], np.int8), 5)
    stats = EncodeStats()
    buf = encode(x, torch.arange(4), layout, ids=torch.arange(4), key=3, stats=stats)
    out = torch.zeros(4, 5)
    decode(buf, layout, out, torch.arange(4))
    assert stats.nonfinite == 1  # row 3 goes at full precision: its Inf arrives as it is
    assert torch.isnan(out[2]).all() and torch.isfinite(out[:2]).all() and out[3, 0] == float("inf")


def test_float16_parameters_refuse_values_they_cannot_hold():
    x = torch.tensor([[-1e6, 1e6]])  # the zero point itself is beyond float16
    layout = message_layout(np.array([8], np.int8), 2, param_dtype=torch.float16)
    with pytest.raises(OverflowError, match="float16"):
        encode(x, torch.tensor([0]), layout, ids=torch.tensor([0]), key=0, param_dtype=torch.float16)


def test_bad_bit_width_and_wrong_sizes_are_refused():
    with pytest.raises(ValueError, match="bit widths"):
        message_layout(np.array([3], np.int8), 4)
    layout = message_layout(np.array([2, 2], np.int8), 4)
    with pytest.raises(ValueError, match="do not fit"):
        encode(torch.zeros(5, 3), torch.arange(2), layout, ids=torch.arange(2), key=0)
    with pytest.raises(ValueError, match="bytes"):
        decode(torch.zeros(layout.nbytes + 1, dtype=torch.uint8), layout, torch.zeros(2, 4), torch.arange(2))


def test_groups_are_padded_per_group_not_per_row():
    # 5 rows of width 3 at 1 bit: 15 bits -> 2 bytes of codes (per-row padding would need 5)
    layout = message_layout(np.full(5, 1, np.int8), 3)
    assert layout.nbytes - 2 * 5 * 4 == 2


@pytest.mark.parametrize("bits", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("dtype,pdt", [(torch.float32, torch.float32), (torch.float64, torch.float16)])
def test_shape_only_layout_has_the_sizes_of_the_real_one(bits, dtype, pdt):
    """The planner's layout (``shape_only``, one width for every row): the offsets, byte count and histogram of
    the layout built from the rows, and an encode on ``meta`` tensors allocates exactly that message."""
    rng = np.random.default_rng(bits)
    for m in (0, 1, int(rng.integers(2, 300))):
        width, extra = int(rng.integers(1, 40)), int(rng.integers(0, 3))
        table = np.full(m, bits, np.int8)
        real = message_layout(table, width, extra, dtype, pdt)
        shape = message_layout(table, width, extra, dtype, pdt, shape_only=True)
        assert shape.offsets == real.offsets and shape.nbytes == real.nbytes and shape.histogram == real.histogram
        assert (len(shape.raw_rows), len(shape.q_rows)) == (len(real.raw_rows), len(real.q_rows))
        assert np.array_equal(shape.group_start, real.group_start) and np.array_equal(shape.code_start, real.code_start)
        x = torch.empty(m + 3, width, dtype=dtype, device="meta")
        rows = torch.empty(m, dtype=torch.int64, device="meta")
        ext = torch.empty(m + 3, extra, dtype=dtype, device="meta") if extra else None
        buf = encode(x, rows, shape, extra=ext, ids=rows, key=1, param_dtype=pdt)
        assert buf.is_meta and tuple(buf.shape) == (real.nbytes,)
    mixed = np.array([1, 8, 32, 8], np.int8)  # not one width: the layout from the rows
    assert np.array_equal(message_layout(mixed, 5, shape_only=True).q_rows, message_layout(mixed, 5).q_rows)
