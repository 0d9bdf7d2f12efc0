"""Quantised halo exchange ops on one process: a loopback plan (this rank is its own peer).

With ``send_lid = {0: rows}`` and ``recv_count = {0: len(rows)}`` the halo is a
copy of ``x[rows]`` sent through the whole encode / exchange / decode path, so
the synchronous and the stale pipelined op can be compared with plain torch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.comm import get_communicator
from hpc_graph.ops.quant_exchange import (BitTable, ExchangeCall, ExchangeStats, HaloPlan, HaloSlot, noise_key,
                                          quant_halo)

N, F, E = 12, 6, 2


def _plan(rows: list[int]) -> HaloPlan:
    lid = torch.tensor(rows, dtype=torch.int64)
    return HaloPlan(send_lid={0: lid}, send_gid={0: lid + 100}, recv_count={0: len(rows)}, halo_lo={0: 0},
                    halo_gid=lid + 100, send_all=lid, num_owned=N, num_halo=len(rows))


def _call(plan, bits, *, epoch=1, slot=None, stats=None):
    table = bits if isinstance(bits, BitTable) else BitTable.uniform(plan, bits)
    keys = {d: noise_key(0, epoch, 0, 0, d) for d in ("fwd", "bwd")}
    return ExchangeCall(plan, get_communicator("local"), table, keys, torch.float32,
                        stats or ExchangeStats(), slot, 0)


ROWS = [3, 0, 7, 7, 11, 5]  # row 7 goes twice: its gradients add up


def _reference_grad(rows, g_halo):
    grad = torch.zeros(N, g_halo.shape[1], dtype=g_halo.dtype)
    grad.index_add_(0, torch.tensor(rows), g_halo)
    return grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_is_an_exact_copy_with_exact_gradients(dtype):
    plan = _plan(ROWS)
    x = torch.randn(N, F, dtype=dtype, requires_grad=True)
    ex = torch.randn(N, E, dtype=dtype, requires_grad=True)
    halo, halo_e = quant_halo(x, ex, _call(plan, 32))
    assert torch.equal(halo, x[ROWS]) and torch.equal(halo_e, ex[ROWS])
    g, ge = torch.randn_like(halo), torch.randn_like(halo_e)
    (halo * g).sum().add_((halo_e * ge).sum()).backward()
    assert torch.equal(x.grad, _reference_grad(ROWS, g)) and torch.equal(ex.grad, _reference_grad(ROWS, ge))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantised_halo_within_a_step_and_gradient_straight_through(bits):
    plan = _plan(ROWS)
    x = torch.randn(N, F, requires_grad=True)
    stats = ExchangeStats()
    halo, _ = quant_halo(x, None, _call(plan, bits, stats=stats))
    want = x.detach()[ROWS]
    step = (want.max(1).values - want.min(1).values) / (2 ** bits - 1)
    assert ((halo - want).abs() <= step.unsqueeze(1) * (1 + 1e-5) + 1e-6).all()
    g = torch.randn_like(halo)
    (halo * g).sum().backward()
    gstep = (g.max(1).values - g.min(1).values) / (2 ** bits - 1)
    # each owned row gets the (dequantised) gradients of its halo copies: within one step per copy
    bound = _reference_grad(ROWS, gstep.unsqueeze(1).expand(-1, F).contiguous())
    assert ((x.grad - _reference_grad(ROWS, g)).abs() <= bound * (1 + 1e-5) + 1e-6).all()
    assert stats.rows == {bits: 2 * len(ROWS)} and stats.bytes["fwd"] > 0 and stats.bytes["bwd"] > 0


def test_stale_exchange_returns_the_previous_epoch_and_sends_this_one():
    plan = _plan(ROWS)
    slot = HaloSlot()
    xs = [torch.randn(N, F, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    gs = [torch.randn(len(ROWS), F, dtype=torch.float64) for _ in range(3)]
    # epoch 1: synchronous (fills the slot), epochs 2 and 3: one epoch stale
    halo, _ = quant_halo(xs[0], None, _call(plan, 32, epoch=1, slot=slot))
    (halo * gs[0]).sum().backward()
    assert torch.equal(halo, xs[0][ROWS])
    for t in (1, 2):
        halo, _ = quant_halo(xs[t], None, _call(plan, 32, epoch=t + 1, slot=slot), stale=True)
        assert torch.equal(halo, xs[t - 1].detach()[ROWS])  # what was sent one epoch before
        assert slot.in_flight == t  # this forward, and from epoch 3 on the previous backward
        (halo * gs[t]).sum().backward()
        # the gradient of the owned rows is the one returned in the previous epoch
        assert torch.equal(xs[t].grad, _reference_grad(ROWS, gs[t - 1]))
        assert slot.in_flight == 2
    slot.drain()
    assert slot.in_flight == 0
    assert torch.equal(slot.halo[0], xs[2].detach()[ROWS]) and torch.equal(slot.grad[0], gs[2])


def test_bits_change_while_messages_are_in_flight():
    """A message in flight is decoded with the table it was sent with, whatever the next epoch uses."""
    plan = _plan(ROWS)
    slot = HaloSlot()
    x0, x1, x2 = (torch.randn(N, F) for _ in range(3))
    quant_halo(x0, None, _call(plan, 32, epoch=1, slot=slot))
    quant_halo(x1, None, _call(plan, 32, epoch=2, slot=slot), stale=True)  # x1 in flight at 32 bits
    halo, _ = quant_halo(x2, None, _call(plan, 1, epoch=3, slot=slot), stale=True)  # x2 in flight at 1 bit
    assert torch.equal(halo, x1[ROWS])  # decoded with the 32-bit table it was sent with
    table = BitTable({0: np.array([1, 2, 4, 8, 32, 1], np.int8)}, {0: np.array([1, 2, 4, 8, 32, 1], np.int8)})
    halo, _ = quant_halo(x0, None, _call(plan, table, epoch=4, slot=slot), stale=True)
    want = x2[ROWS]
    step = (want.max(1).values - want.min(1).values)  # 1 bit: one step is the row's range
    assert ((halo - want).abs() <= step.unsqueeze(1) * (1 + 1e-5) + 1e-6).all()
    slot.drain()
    assert torch.equal(slot.halo[0][4], x0[ROWS[4]])  # the 32-bit row of the mixed table


def test_stale_exchange_needs_a_previous_epoch():
    plan = _plan(ROWS)
    with pytest.raises(RuntimeError, match="previous epoch"):
        quant_halo(torch.randn(N, F), None, _call(plan, 8, slot=HaloSlot()), stale=True)


def test_noise_key_depends_on_every_part():
    base = noise_key(1, 2, 3, 4, "fwd")
    others = {noise_key(2, 2, 3, 4, "fwd"), noise_key(1, 3, 3, 4, "fwd"), noise_key(1, 2, 4, 4, "fwd"),
              noise_key(1, 2, 3, 5, "fwd"), noise_key(1, 2, 3, 4, "bwd")}
    assert base not in others and len(others) == 5 and base == noise_key(1, 2, 3, 4, "fwd")
