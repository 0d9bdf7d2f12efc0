"""``hpc_graph.graph.sampler.SeedSchedule``: every rank agrees on the iterations of an epoch once, when the
schedule is made, so asking for them later is not collective (one rank alone may ask); every training node is
a seed exactly once per epoch, in batches of at most ``batch_size`` spread evenly over the iterations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.graph.sampler import SeedSchedule


class _TwoRanks:
    """Rank 0 of a two-rank job whose other rank has ``other`` iterations: counts the all-reduces."""

    size, rank = 2, 0

    def __init__(self, other: int):
        self.other, self.calls = other, 0

    def allreduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self.calls += 1
        if op == "max":
            t.clamp_(min=float(self.other))
        else:
            assert op == "sum"
            t.add_(1.0)  # the other rank's batches: one seed each
        return t


def test_iterations_are_agreed_once_and_are_the_largest():
    rng = np.random.default_rng(0)
    for n, batch, other in ((100, 10, 3), (95, 10, 40), (7, 3, 5), (0, 4, 2)):
        comm = _TwoRanks(other)
        sched = SeedSchedule(torch.from_numpy(rng.permutation(1000)[:n]), batch, 0, comm)
        assert comm.calls == 1
        want = max(-(-n // batch), other)
        assert [sched.iterations() for _ in range(4)] == [want] * 4
        assert comm.calls == 1  # not collective after the schedule is made


def test_every_training_node_is_a_seed_once_per_epoch_in_even_batches():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n, batch, other = int(rng.integers(0, 300)), int(rng.integers(1, 40)), int(rng.integers(0, 30))
        idx = torch.from_numpy(rng.permutation(5000)[:n])
        sched = SeedSchedule(idx, batch, int(rng.integers(0, 9)), _TwoRanks(other))
        iters = sched.iterations()
        epoch = int(rng.integers(0, 5))
        order = sched.order(epoch)
        spans = [sched.span(i) for i in range(iters)]
        seeds = torch.cat([order[a:b] for a, b in spans]) if spans else torch.zeros(0, dtype=torch.int64)
        assert torch.equal(torch.sort(seeds).values, torch.sort(idx).values)  # each once, none left out
        sizes = [b - a for a, b in spans]
        assert sizes == sched.sizes()
        assert not sizes or (max(sizes) <= batch and max(sizes) - min(sizes) <= 1
                             and sizes == sorted(sizes, reverse=True))
        mine, total = sched.batch_sizes(iters)
        assert mine == sizes and total == [s + 1.0 for s in sizes]


def test_a_rank_without_training_nodes_runs_the_agreed_iterations_with_empty_batches():
    sched = SeedSchedule(torch.zeros(0, dtype=torch.int64), 8, 0, _TwoRanks(3))
    assert sched.iterations() == 3 and sched.sizes() == [0, 0, 0]
    assert [sched.span(i) for i in range(3)] == [(0, 0)] * 3
    with pytest.raises(IndexError, match="iteration 3 of an epoch of 3"):
        sched.span(3)
    with pytest.raises(ValueError, match="has 3 iterations, not 2"):
        sched.batch_sizes(2)


def test_order_is_a_permutation_fixed_by_seed_and_epoch():
    idx = torch.arange(50, 80)
    comm = _TwoRanks(100)
    a, b = SeedSchedule(idx, 8, 3, comm), SeedSchedule(idx, 8, 3, comm)
    assert torch.equal(a.order(2), b.order(2))
    assert torch.equal(torch.sort(a.order(2)).values, idx)
    assert not torch.equal(a.order(2), a.order(3))
