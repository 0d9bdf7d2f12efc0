"""Label-propagation kernels (numba_kernels/cpu/label_propagation.py) against plain-Python references of
the same rules, on random graphs with own and halo nodes, unit and integer edge weights."""
from __future__ import annotations

import numpy as np
import pytest

from numba_kernels.cpu.label_propagation import best_moves, cluster_sweep, pair_moves


def _graph(rng, k, h, m):
    """A random local CSR of k own rows whose columns index [0, k + h) (no self loops)."""
    rows = np.sort(rng.integers(0, k, m))
    cols = rng.integers(0, k + h, m)
    keep = cols != rows
    rows, cols = rows[keep], cols[keep]
    xadj = np.zeros(k + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=k), out=xadj[1:])
    return xadj, cols.astype(np.int64)


def _cluster_ref(xadj, adj, adjwgt, vwgt, order, lab, cur, cap):
    lab, cur, moved = lab.copy(), cur.copy(), 0
    for u in order:
        score: dict[int, int] = {}
        for e in range(xadj[u], xadj[u + 1]):
            t = int(lab[adj[e]])
            score[t] = score.get(t, 0) + (1 if len(adjwgt) == 0 else int(adjwgt[e]))
        a, w = int(lab[u]), int(vwgt[u])
        best, best_s = a, score.get(a, 0)
        for t, s in score.items():
            if t == a or cur[t] + w > cap[t]:
                continue
            better = s > best_s or (s == best_s and best != a and (cur[t], t) < (cur[best], best))
            if better:
                best, best_s = t, s
        if best != a:
            cur[a] -= w
            cur[best] += w
            lab[u] = best
            moved += 1
    return lab, cur, moved


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("unit", [True, False])
def test_cluster_sweep_matches_reference(seed, unit):
    rng = np.random.default_rng(seed)
    k, h = int(rng.integers(20, 200)), int(rng.integers(0, 40))
    xadj, adj = _graph(rng, k, h, int(rng.integers(50, 1500)))
    adjwgt = np.zeros(0, np.int64) if unit else rng.integers(1, 5, len(adj)).astype(np.int64)
    vwgt = rng.integers(1, 4, k).astype(np.int64)
    T = int(rng.integers(5, k + h))
    lab = rng.integers(0, T, k + h).astype(np.int64)
    cur = np.bincount(lab[:k], weights=vwgt, minlength=T).astype(np.int64) + rng.integers(0, 3, T)
    cap = cur + rng.integers(0, 6, T)
    order = rng.permutation(k).astype(np.int64)
    cur0 = cur.copy()
    ref_lab, ref_cur, ref_moved = _cluster_ref(xadj, adj, adjwgt, vwgt, order, lab, cur, cap)
    moved = cluster_sweep(xadj, adj, adjwgt, vwgt, order, lab, cur, cap)
    assert moved == ref_moved
    assert np.array_equal(lab, ref_lab) and np.array_equal(cur, ref_cur)
    assert np.all(cur <= np.maximum(cap, cur0))  # a cluster grows only within its cap


def test_cluster_sweep_finds_two_cliques():
    """Two 6-cliques joined by one edge, singleton clusters, room for 6: two clusters, one per clique."""
    n = 12
    pairs = [(i, j) for c in (0, 6) for i in range(c, c + 6) for j in range(c, c + 6) if i != j] + [(5, 6), (6, 5)]
    pairs.sort()
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount([p[0] for p in pairs], minlength=n), out=xadj[1:])
    adj = np.array([p[1] for p in pairs], np.int64)
    lab = np.arange(n, dtype=np.int64)
    cur, cap = np.ones(n, np.int64), np.full(n, 6, np.int64)
    for _ in range(3):
        cluster_sweep(xadj, adj, np.zeros(0, np.int64), np.ones(n, np.int64), np.arange(n, dtype=np.int64), lab,
                      cur, cap)
    assert len(set(lab[:6])) == 1 and len(set(lab[6:])) == 1 and lab[0] != lab[6]


def _best_ref(xadj, adj, adjwgt, part, P):
    k = len(xadj) - 1
    target, gain = np.full(k, -1, np.int64), np.zeros(k, np.int64)
    for u in range(k):
        conn = np.zeros(P, np.int64)
        for e in range(xadj[u], xadj[u + 1]):
            conn[part[adj[e]]] += 1 if len(adjwgt) == 0 else adjwgt[e]
        others = [q for q in range(P) if q != part[u] and conn[q] > 0]
        if others:
            b = max(others, key=lambda q: (conn[q], -q))
            target[u], gain[u] = b, conn[b] - conn[part[u]]
    return target, gain


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("unit", [True, False])
def test_best_moves_matches_reference(seed, unit):
    rng = np.random.default_rng(100 + seed)
    k, h, P = int(rng.integers(10, 150)), int(rng.integers(0, 30)), int(rng.integers(2, 7))
    xadj, adj = _graph(rng, k, h, int(rng.integers(20, 1000)))
    adjwgt = np.zeros(0, np.int64) if unit else rng.integers(1, 9, len(adj)).astype(np.int64)
    part = rng.integers(0, P, k + h).astype(np.int64)
    t, g = best_moves(xadj, adj, adjwgt, part, P)
    rt, rg = _best_ref(xadj, adj, adjwgt, part, P)
    assert np.array_equal(t, rt) and np.array_equal(g, rg)


def _pair_ref(src, dst, gain, wgt, P, load, cap, excess):
    take = np.zeros(len(src), bool)
    load, excess = load.copy(), excess.copy()
    for a in range(P):
        for b in range(a + 1, P):
            ab = [i for i in range(len(src)) if src[i] == a and dst[i] == b]
            ba = [i for i in range(len(src)) if src[i] == b and dst[i] == a]
            i = j = 0
            while True:
                if i < len(ab) and gain[ab[i]] > 0 and load[b] + wgt[ab[i]] <= cap[b]:
                    x = ab[i]
                    take[x], i = True, i + 1
                    load[a] -= wgt[x]
                    load[b] += wgt[x]
                elif j < len(ba) and gain[ba[j]] > 0 and load[a] + wgt[ba[j]] <= cap[a]:
                    y = ba[j]
                    take[y], j = True, j + 1
                    load[b] -= wgt[y]
                    load[a] += wgt[y]
                elif (i < len(ab) and j < len(ba) and gain[ab[i]] + gain[ba[j]] > 0
                      and load[a] - wgt[ab[i]] + wgt[ba[j]] <= max(cap[a], load[a])
                      and load[b] + wgt[ab[i]] - wgt[ba[j]] <= max(cap[b], load[b])):
                    x, y = ab[i], ba[j]
                    take[x] = take[y] = True
                    load[a] += wgt[y] - wgt[x]
                    load[b] += wgt[x] - wgt[y]
                    i, j = i + 1, j + 1
                else:
                    break
    for i in range(len(src)):
        a, b = src[i], dst[i]
        if not take[i] and excess[a] > 0 and load[b] + wgt[i] <= cap[b]:
            take[i] = True
            load[a] -= wgt[i]
            load[b] += wgt[i]
            excess[a] -= min(wgt[i], excess[a])
    return take, load, excess


@pytest.mark.parametrize("seed", range(8))
def test_pair_moves_matches_reference_and_keeps_caps(seed):
    rng = np.random.default_rng(200 + seed)
    P, n = int(rng.integers(2, 6)), int(rng.integers(0, 300))
    src = rng.integers(0, P, n)
    dst = (src + rng.integers(1, P, n)) % P
    gain = rng.integers(-5, 6, n)
    wgt = rng.integers(1, 4, n) if seed % 2 else np.ones(n, np.int64)
    order = np.lexsort((-gain, dst, src))
    src, dst, gain, wgt = (x[order].astype(np.int64) for x in (src, dst, gain, wgt))
    load = rng.integers(50, 100, P).astype(np.int64)
    cap = np.maximum(load + rng.integers(-10, 10, P), 60).astype(np.int64)
    excess = np.where(load > cap, load - cap, 0).astype(np.int64)
    ref_take, ref_load, ref_excess = _pair_ref(src, dst, gain, wgt, P, load, cap, excess)
    got_load, got_excess = load.copy(), excess.copy()
    take = pair_moves(src, dst, gain, wgt, P, got_load, cap, got_excess)
    assert np.array_equal(take, ref_take)
    assert np.array_equal(got_load, ref_load) and np.array_equal(got_excess, ref_excess)
    # the loads are what the chosen moves make of them, and no part ends above both its cap and its start
    moved = load - np.bincount(src[take], weights=wgt[take], minlength=P) + np.bincount(dst[take], weights=wgt[take],
                                                                                        minlength=P)
    assert np.array_equal(moved.astype(np.int64), got_load)
    assert np.all(got_load <= np.maximum(cap, load))
