"""``hpc_graph.graph.sampler.SeedSchedule``: every rank agrees on the iterations of an epoch once, when the
schedule is made, so asking for them later is not collective (one rank alone may ask)."""
from __future__ import annotations

import numpy as np
import torch

from hpc_graph.graph.sampler import SeedSchedule


class _TwoRanks:
    """Rank 0 of a two-rank job whose other rank has ``other`` iterations: counts the all-reduces."""

    size, rank = 2, 0

    def __init__(self, other: int):
        self.other, self.calls = other, 0

    def allreduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        assert op == "min"
        self.calls += 1
        t.clamp_(max=float(self.other))
        return t


def test_iterations_are_agreed_once_and_are_the_smallest():
    rng = np.random.default_rng(0)
    for n, batch, other in ((100, 10, 3), (95, 10, 40), (7, 3, 5)):
        comm = _TwoRanks(other)
        sched = SeedSchedule(torch.from_numpy(rng.permutation(1000)[:n]), batch, 0, comm)
        assert comm.calls == 1
        want = min(-(-n // batch), other)
        assert [sched.iterations() for _ in range(4)] == [want] * 4
        assert comm.calls == 1  # not collective after the schedule is made


def test_order_is_a_permutation_fixed_by_seed_and_epoch():
    idx = torch.arange(50, 80)
    comm = _TwoRanks(100)
    a, b = SeedSchedule(idx, 8, 3, comm), SeedSchedule(idx, 8, 3, comm)
    assert torch.equal(a.order(2), b.order(2))
    assert torch.equal(torch.sort(a.order(2)).values, idx)
    assert not torch.equal(a.order(2), a.order(3))
