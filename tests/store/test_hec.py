"""Historical embedding cache: store/overwrite/evict order, purge by age, served staleness, memory bound."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.store.hec import HistoricalEmbeddingCache
from numba_kernels.cpu.hec import _set_of


def _same_set(cache: HistoricalEmbeddingCache, count: int, start: int = 1) -> list[int]:
    """``count`` node ids that all map to one set of ``cache``."""
    sets = cache.lines // cache.ways
    target = _set_of(start, sets)
    out, g = [], start
    while len(out) < count:
        if _set_of(g, sets) == target:
            out.append(g)
        g += 1
    return out


def _rows(ids, dim=3, value=None):
    return torch.tensor([[float(i if value is None else value)] * dim for i in ids])


def test_store_then_lookup_and_overwrite():
    c = HistoricalEmbeddingCache(64, 3, lifespan=2)
    c.store(torch.tensor([5, 9]), _rows([5, 9]), now=0)
    rows, hit, age = c.lookup(torch.tensor([9, 5, 7]), now=1)
    assert hit.tolist() == [True, True, False] and age.tolist() == [1, 1, -1]
    assert torch.equal(rows[:2], _rows([9, 5])) and torch.equal(rows[2], torch.zeros(3))
    c.store(torch.tensor([5]), _rows([5], value=-1.0), now=2)  # same tag: overwritten, age restarts
    rows, hit, age = c.lookup(torch.tensor([5]), now=2)
    assert hit.item() and age.item() == 0 and torch.equal(rows[0], torch.full((3,), -1.0))
    assert int((c.tags == 5).sum()) == 1


def test_entries_older_than_the_lifespan_are_never_served_and_are_purged():
    c = HistoricalEmbeddingCache(64, 2, lifespan=2)
    c.store(torch.tensor([1, 2, 3]), _rows([1, 2, 3], 2), now=10)
    assert c.lookup(torch.tensor([1, 2, 3]), now=12)[1].all()  # age 2 = lifespan: still served
    assert not c.lookup(torch.tensor([1, 2, 3]), now=13)[1].any()  # age 3: expired
    assert c.purge(now=13) == 0 and (c.tags == -1).all()


def test_a_full_set_takes_an_expired_line_first_then_evicts_the_oldest():
    c = HistoricalEmbeddingCache(16, 1, lifespan=5, ways=4)
    ids = _same_set(c, 7)
    for t, g in enumerate(ids[:4]):  # fill the set at iterations 0..3
        c.store(torch.tensor([g]), _rows([g], 1), now=t)
    c.store(torch.tensor([ids[4]]), _rows([ids[4]], 1), now=4)  # full, nothing expired: oldest (ids[0]) goes
    assert not c.lookup(torch.tensor([ids[0]]), now=4)[1].item()
    assert c.lookup(torch.tensor(ids[1:5]), now=4)[1].all() and c.evictions == 1
    c.store(torch.tensor([ids[5]]), _rows([ids[5]], 1), now=7)  # ids[1] (stored at 1) has expired at 7
    assert not c.lookup(torch.tensor([ids[1]]), now=7)[1].item()
    assert c.lookup(torch.tensor([ids[2], ids[3], ids[4], ids[5]]), now=7)[1].all()
    assert c.evictions == 1  # an expired line is not an eviction
    c.store(torch.tensor([ids[6]]), _rows([ids[6]], 1), now=7)  # full again: the oldest valid one (ids[2]) goes
    assert not c.lookup(torch.tensor([ids[2]]), now=7)[1].item() and c.evictions == 2


@pytest.mark.parametrize("lifespan,delay", [(0, 1), (2, 1), (3, 2)])
def test_served_staleness_is_at_most_lifespan_plus_delay(lifespan, delay):
    """Pushes made at iteration k are stored at k + delay; what a lookup serves is then at most
    lifespan + delay iterations old (checked against an independent record of push times)."""
    rng = np.random.default_rng(lifespan * 10 + delay)
    c = HistoricalEmbeddingCache(256, 1, lifespan=lifespan)
    pushed_at: dict[int, int] = {}
    in_flight = []
    worst = 0
    for k in range(40):
        arriving = [(g, t) for g, t in in_flight if t + delay == k]
        in_flight = [(g, t) for g, t in in_flight if t + delay != k]
        for g, t in arriving:
            c.store(torch.tensor([g]), torch.tensor([[float(t)]]), now=k)  # the row carries its push time
        ids = rng.choice(60, 20, replace=False)
        rows, hit, age = c.lookup(torch.from_numpy(ids), now=k)
        for row, h in zip(rows, hit):
            if h:
                worst = max(worst, k - int(row.item()))
        for g in rng.choice(60, 15, replace=False):
            in_flight.append((int(g), k))
            pushed_at[int(g)] = k
    assert worst <= lifespan + delay and worst >= delay


@pytest.mark.parametrize("dim", [1, 16, 256])
def test_memory_is_at_most_size_times_4dim_plus_16_bytes(dim):
    c = HistoricalEmbeddingCache(10_000, dim, lifespan=2)
    assert c.lines >= 10_000 and c.nbytes <= c.lines * (4 * dim + 16)
    assert c.nbytes <= 10_000 * (4 * dim + 16) + c.ways * (4 * dim + 16)  # rounding up to whole sets


def test_bad_arguments():
    with pytest.raises(ValueError):
        HistoricalEmbeddingCache(0, 4)
    c = HistoricalEmbeddingCache(8, 4)
    with pytest.raises(ValueError, match="rows"):
        c.store(torch.tensor([1, 2]), torch.zeros(2, 3), now=0)
