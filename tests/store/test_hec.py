"""Historical embedding cache: store/overwrite/evict order (oldest cache-line first against a naive reference;
set-associative by construction), purge by age, served staleness, memory bound, checkpoint state."""
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


class _NaiveOCF:
    """Oldest cache-line first as the paper states it, by brute force: a matching tag is overwritten, else an
    empty line is taken, else the line with the oldest stamp (an expired one first: they are the oldest;
    among equal stamps the one stored first)."""

    def __init__(self, lines: int, lifespan: int):
        self.lines, self.lifespan, self.seq = lines, lifespan, 0
        self.data: dict[int, tuple[int, int, np.ndarray]] = {}  # node -> (stamp, store order, row)
        self.evictions = 0

    def store(self, gids, rows, now):
        for g, r in zip(gids.tolist(), rows.numpy()):
            if g not in self.data and len(self.data) == self.lines:
                victim = min(self.data, key=lambda k: self.data[k][:2])
                if now - self.data[victim][0] <= self.lifespan:
                    self.evictions += 1
                del self.data[victim]
            self.seq += 1
            self.data[g] = (now, self.seq, r.copy())

    def lookup(self, gids, now):
        hit = [g in self.data and now - self.data[g][0] <= self.lifespan for g in gids.tolist()]
        rows = [self.data[g][2] if h else None for g, h in zip(gids.tolist(), hit)]
        return rows, hit

    def purge(self, now):
        for g in [g for g, v in self.data.items() if now - v[0] > self.lifespan]:
            del self.data[g]
        return len(self.data)


@pytest.mark.parametrize("lines,lifespan,nodes", [(1, 0, 3), (7, 2, 30), (64, 3, 100), (200, 1, 150)])
def test_oldest_cache_line_first_equals_the_naive_policy(lines, lifespan, nodes):
    rng = np.random.default_rng(lines * 7 + lifespan)
    c, ref = HistoricalEmbeddingCache(lines, 3, lifespan=lifespan, dtype=torch.float64), _NaiveOCF(lines, lifespan)
    for now in range(300):
        m = int(rng.integers(0, 2 * lines + 3))
        gids = torch.from_numpy(rng.integers(0, nodes, m))  # duplicates within a call too
        rows = torch.from_numpy(rng.standard_normal((m, 3)))
        c.store(gids, rows, now)
        ref.store(gids, rows, now)
        assert c.evictions == ref.evictions
        probe = torch.from_numpy(rng.integers(0, nodes, 40))
        later = int(rng.integers(0, lifespan + 2))
        got, hit, age = c.lookup(probe, now + later)
        want_rows, want_hit = ref.lookup(probe, now + later)
        assert hit.tolist() == want_hit
        for i in np.flatnonzero(want_hit):
            assert torch.equal(got[i], torch.from_numpy(want_rows[i]))
            assert age[i].item() == now + later - ref.data[int(probe[i])][0]
        if rng.random() < 0.1:
            assert c.purge(now) == ref.purge(now)


@pytest.mark.parametrize("policy", ["ocf", "set"])
def test_checkpoint_state_restores_the_same_hits_and_evictions(policy):
    rng = np.random.default_rng(5)
    a = HistoricalEmbeddingCache(48, 2, lifespan=3, ways=4, dtype=torch.float64, policy=policy)
    for now in range(20):
        g = torch.from_numpy(rng.integers(0, 90, 30))
        a.store(g, torch.from_numpy(rng.standard_normal((30, 2))), now)
    b = HistoricalEmbeddingCache(48, 2, lifespan=3, ways=4, dtype=torch.float64, policy=policy)
    b.load_state_dict(a.state_dict(19))
    a0 = a.evictions
    for now in range(20, 40):
        probe = torch.arange(90)
        ra, ha, aa = a.lookup(probe, now)
        rb, hb, ab = b.lookup(probe, now)
        assert torch.equal(ha, hb) and torch.equal(ra, rb) and torch.equal(aa, ab)
        g = torch.from_numpy(rng.integers(0, 90, 30))
        rows = torch.from_numpy(rng.standard_normal((30, 2)))
        a.store(g, rows, now)
        b.store(g, rows, now)
    assert a.evictions - a0 == b.evictions


def test_bad_policy():
    with pytest.raises(ValueError, match="policy must be one of"):
        HistoricalEmbeddingCache(8, 2, policy="lru")


@pytest.mark.parametrize("policy", ["ocf", "set"])
def test_store_then_lookup_and_overwrite(policy):
    c = HistoricalEmbeddingCache(64, 3, lifespan=2, policy=policy)
    c.store(torch.tensor([5, 9]), _rows([5, 9]), now=0)
    rows, hit, age = c.lookup(torch.tensor([9, 5, 7]), now=1)
    assert hit.tolist() == [True, True, False] and age.tolist() == [1, 1, -1]
    assert torch.equal(rows[:2], _rows([9, 5])) and torch.equal(rows[2], torch.zeros(3))
    c.store(torch.tensor([5]), _rows([5], value=-1.0), now=2)  # same tag: overwritten, age restarts
    rows, hit, age = c.lookup(torch.tensor([5]), now=2)
    assert hit.item() and age.item() == 0 and torch.equal(rows[0], torch.full((3,), -1.0))
    assert int((c.tags == 5).sum()) == 1


@pytest.mark.parametrize("policy", ["ocf", "set"])
def test_entries_older_than_the_lifespan_are_never_served_and_are_purged(policy):
    c = HistoricalEmbeddingCache(64, 2, lifespan=2, policy=policy)
    c.store(torch.tensor([1, 2, 3]), _rows([1, 2, 3], 2), now=10)
    assert c.lookup(torch.tensor([1, 2, 3]), now=12)[1].all()  # age 2 = lifespan: still served
    assert not c.lookup(torch.tensor([1, 2, 3]), now=13)[1].any()  # age 3: expired
    assert c.purge(now=13) == 0 and (c.tags == -1).all()


def test_a_full_set_takes_an_expired_line_first_then_evicts_the_oldest():
    c = HistoricalEmbeddingCache(16, 1, lifespan=5, ways=4, policy="set")
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


@pytest.mark.parametrize("policy", ["ocf", "set"])
@pytest.mark.parametrize("lifespan,delay", [(0, 1), (2, 1), (3, 2)])
def test_served_staleness_is_at_most_lifespan_plus_delay(lifespan, delay, policy):
    """Pushes made at iteration k are stored at k + delay; what a lookup serves is then at most
    lifespan + delay iterations old (checked against an independent record of push times)."""
    rng = np.random.default_rng(lifespan * 10 + delay)
    c = HistoricalEmbeddingCache(256, 1, lifespan=lifespan, policy=policy)
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
def test_memory_bound_of_each_policy(dim):
    c = HistoricalEmbeddingCache(10_000, dim, lifespan=2, policy="set")
    assert c.lines >= 10_000 and c.nbytes <= c.lines * (4 * dim + 16)
    assert c.nbytes <= 10_000 * (4 * dim + 16) + c.ways * (4 * dim + 16)  # rounding up to whole sets
    c = HistoricalEmbeddingCache(10_000, dim, lifespan=2)
    assert c.lines == 10_000 and c.nbytes <= 10_000 * (4 * dim + 44 + 4 * 16)  # rows, list, hash slots


def test_bad_arguments():
    with pytest.raises(ValueError):
        HistoricalEmbeddingCache(0, 4)
    c = HistoricalEmbeddingCache(8, 4)
    with pytest.raises(ValueError, match="rows"):
        c.store(torch.tensor([1, 2]), torch.zeros(2, 3), now=0)
