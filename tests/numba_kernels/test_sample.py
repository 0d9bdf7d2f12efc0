"""CPU sampling kernels (numba_kernels/cpu/sample.py) against the Python reference in _sample_ref.py.

Exact samples against an independent Python-integer reference, structural
properties checked on their own (counts, distinct real neighbours in position
order, untouched slot tails), uniformity by chi-square tests with fixed keys,
independence of threads, chunking, frontier order and CSR placement, the hub
cost bound, and ``unique_relabel`` against NumPy.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sample_ref as R  # noqa: E402

from numba_kernels import get_kernel  # noqa: E402
from numba_kernels.cpu import sample as S  # noqa: E402
from numba_kernels.cpu._attention_common import SMALL_WORK  # noqa: E402

FILL = -7
#: chi-square tests fail with probability 1e-4 for a correct sampler (the keys are fixed, so never flaky)
ALPHA = 1e-4


def _run(indptr, nbrs, rows, ids, fanout, key):
    F = S.sample_width(indptr, rows, fanout)
    cnt = np.full(rows.shape[0], FILL, np.int64)
    out = np.full(rows.shape[0] * F, FILL, np.int64)
    S.sample_neighbors(indptr, nbrs, rows, ids, fanout, key, cnt, out)
    return cnt, out, F


def _slots(cnt, out, F):
    return [out[r * F:r * F + cnt[r]] for r in range(cnt.shape[0])]


@pytest.fixture(scope="module")
def graph():
    """Power-law CSR with empty rows, a few hubs and ids beyond 2**40."""
    rng = np.random.default_rng(7)
    indptr, nbrs = R.powerlaw_graph(rng, 400, avg=10.0, id_offset=2**40)
    deg = np.diff(indptr)
    assert (deg == 0).any() and deg.max() > 100
    rows = np.concatenate([np.arange(400), rng.integers(0, 400, 100)]).astype(np.int64)
    ids = rows * 3 + 1
    return indptr, nbrs, rows, ids


# ---------------------------------------------------------------------------
# exact samples and structure


@pytest.mark.parametrize("fanout", [1, 2, 5, 10, 25, 1000, -1])
def test_samples_match_reference_and_are_valid(graph, fanout):
    indptr, nbrs, rows, ids = graph
    cnt, out, F = _run(indptr, nbrs, rows, ids, fanout, key=12345)
    deg = indptr[rows + 1] - indptr[rows]
    want_cnt = deg if fanout < 0 else np.minimum(deg, fanout)
    np.testing.assert_array_equal(cnt, want_cnt)
    assert F == (fanout if fanout > 0 else deg.max())
    for r, smp in enumerate(_slots(cnt, out, F)):
        row = nbrs[indptr[rows[r]]:indptr[rows[r] + 1]]
        assert np.isin(smp, row).all()  # real neighbours
        assert (np.diff(smp) > 0).all()  # distinct, in position order (rows strictly ascending)
        assert (out[r * F + cnt[r]:(r + 1) * F] == FILL).all()  # slot tail untouched
        if cnt[r] == deg[r]:
            np.testing.assert_array_equal(smp, row)
    cnt_ref, out_ref = R.sample(indptr, nbrs, rows, ids, fanout, 12345, fill=FILL)
    np.testing.assert_array_equal(cnt, cnt_ref)
    np.testing.assert_array_equal(out, out_ref)


@pytest.mark.parametrize("fanout", [129, 200, 300, 700, 1000])
def test_large_selections_match_reference(fanout):
    """Scan and hash-set selections (SCAN_MAX), direct and complement, against the reference."""
    degs = [1000, 300, 500, 129, 2000, 0, 1]
    indptr = np.zeros(len(degs) + 1, np.int64)
    np.cumsum(degs, out=indptr[1:])
    nbrs = np.concatenate([np.arange(d, dtype=np.int64) * 5 + 2 for d in degs])
    rows = np.arange(len(degs), dtype=np.int64)
    ids = rows + 2**40
    s = [min(min(fanout, d), d - min(fanout, d)) for d in degs]
    if fanout >= 300:
        assert max(s) > S.SCAN_MAX  # and the hash-set path
    cnt, out, F = _run(indptr, nbrs, rows, ids, fanout, key=np.uint64(2**63 + 1))
    cnt_ref, out_ref = R.sample(indptr, nbrs, rows, ids, fanout, 2**63 + 1, fill=FILL)
    np.testing.assert_array_equal(cnt, cnt_ref)
    np.testing.assert_array_equal(out, out_ref)
    for r, smp in enumerate(_slots(cnt, out, F)):
        assert (np.diff(smp) > 0).all() and np.isin(smp, nbrs[indptr[r]:indptr[r + 1]]).all()


def test_whole_rows_and_width():
    indptr = np.array([0, 3, 3, 8, 9], np.int64)
    nbrs = np.array([1, 4, 9, 0, 2, 3, 5, 8, 6], np.int64)
    rows = np.array([2, 1, 0, 3, 2], np.int64)
    ids = np.arange(5, dtype=np.int64)
    assert S.sample_width(indptr, rows, -1) == 5
    assert S.sample_width(indptr, rows, 3) == 3
    assert S.sample_width(indptr, np.array([1], np.int64), -1) == 0
    assert S.sample_width(indptr, np.zeros(0, np.int64), -1) == 0
    for fanout in (-1, 5, 6, 100):
        cnt, out, F = _run(indptr, nbrs, rows, ids, fanout, key=3)
        np.testing.assert_array_equal(cnt, [5, 0, 3, 1, 5])
        for r, smp in enumerate(_slots(cnt, out, F)):
            np.testing.assert_array_equal(smp, nbrs[indptr[rows[r]]:indptr[rows[r] + 1]])
    # only empty rows with fanout -1: zero-width output
    cnt, out, F = _run(indptr, nbrs, np.array([1, 1], np.int64), ids[:2], -1, key=3)
    assert F == 0 and out.size == 0 and (cnt == 0).all()
    cnt, out, F = _run(indptr, nbrs, np.zeros(0, np.int64), np.zeros(0, np.int64), 4, key=3)
    assert cnt.size == 0 and out.size == 0


def test_draw_matches_exact_integer_reference():
    """Lemire draw incl. 128-bit products and the rejection path (n near 2**63 rejects often)."""
    rng = np.random.default_rng(0)
    rejected = 0
    for n in (1, 2, 3, 7, 30, 2**32 - 1, 2**32 + 1, 3 * 2**61, 2**63 - 1):
        for rh in rng.integers(0, 2**63, 40, dtype=np.int64):
            v, t = S._below(np.uint64(rh), 0, n)
            hashes = R.stream_from(int(rh))
            want = R.below(hashes, n)
            used = R.consumed(hashes)
            assert (int(v), int(t)) == (want, used), (n, int(rh))
            assert 0 <= v < n
            rejected += used - 1
    assert rejected > 0  # the rejection branch ran


# ---------------------------------------------------------------------------
# uniformity


def test_inclusion_frequencies_are_uniform():
    """deg 30, k 5, 3000 keys: each position included with probability 1/6 (chi-square, 29 df)."""
    deg, k, T = 30, 5, 3000
    indptr = np.array([0, deg], np.int64)
    nbrs = np.arange(deg, dtype=np.int64)
    rows = np.zeros(1, np.int64)
    ids = np.array([987654321], np.int64)
    counts = np.zeros(deg)
    cnt = np.empty(1, np.int64)
    out = np.empty(k, np.int64)
    for key in range(T):
        S.sample_neighbors(indptr, nbrs, rows, ids, k, key, cnt, out)
        counts[out] += 1
    assert counts.sum() == T * k
    p = k / deg
    # inclusion counts are negatively correlated; this normalisation makes the statistic chi2(deg - 1)
    stat = (deg - 1) / deg * ((counts - T * p) ** 2).sum() / (T * p * (1 - p))
    assert stat < chi2.ppf(1 - ALPHA, deg - 1), (stat, counts)


@pytest.mark.parametrize("deg,k", [(6, 2), (6, 4), (5, 3), (4, 1)])
def test_subsets_are_equally_likely(deg, k):
    """Every k-subset of a small row equally likely over 3000 counter ids (direct and complement paths)."""
    from itertools import combinations

    T = 3000
    indptr = np.array([0, deg], np.int64)
    nbrs = np.arange(deg, dtype=np.int64)
    rows = np.zeros(T, np.int64)
    ids = np.arange(T, dtype=np.int64) * 7919 + 11
    cnt, out, F = _run(indptr, nbrs, rows, ids, k, key=2024)
    subsets = {c: i for i, c in enumerate(combinations(range(deg), k))}
    hist = np.zeros(len(subsets))
    for smp in out.reshape(T, k):
        hist[subsets[tuple(smp.tolist())]] += 1
    e = T / len(subsets)
    stat = ((hist - e) ** 2 / e).sum()
    assert stat < chi2.ppf(1 - ALPHA, len(subsets) - 1), (stat, hist)


# ---------------------------------------------------------------------------
# determinism and independence


@pytest.fixture(scope="module")
def big():
    """A call large enough for the parallel kernel."""
    rng = np.random.default_rng(21)
    indptr, nbrs = R.powerlaw_graph(rng, 2000, avg=10.0)
    rows = rng.integers(0, 2000, 20000).astype(np.int64)
    ids = rows + 5
    deg = indptr[rows + 1] - indptr[rows]
    assert (np.minimum(deg, 10) + 1).sum() >= SMALL_WORK
    return indptr, nbrs, rows, ids


def test_independent_of_thread_count_and_chunking(big):
    indptr, nbrs, rows, ids = big
    before = numba.get_num_threads()
    results = []
    try:
        for threads in sorted({1, 2, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            results.append(_run(indptr, nbrs, rows, ids, 10, key=99))
            assert numba.get_num_threads() == threads  # the kernel leaves the thread count alone
    finally:
        numba.set_num_threads(before)
    for cnt, out, F in results[1:]:
        np.testing.assert_array_equal(cnt, results[0][0])
        np.testing.assert_array_equal(out, results[0][1])
    # small serial calls over pieces of the frontier give the same slots
    cnt0, out0, _ = results[0]
    for a, b in ((0, 1), (1, 500), (500, 7000), (7000, 20000)):
        cnt, out, _ = _run(indptr, nbrs, rows[a:b], ids[a:b], 10, key=99)
        np.testing.assert_array_equal(cnt, cnt0[a:b])
        np.testing.assert_array_equal(out, out0[a * 10:b * 10])


def test_independent_of_frontier_order(big):
    indptr, nbrs, rows, ids = big
    cnt, out, F = _run(indptr, nbrs, rows, ids, 10, key=5)
    perm = np.random.default_rng(1).permutation(rows.shape[0])
    cnt_p, out_p, _ = _run(indptr, nbrs, rows[perm], ids[perm], 10, key=5)
    np.testing.assert_array_equal(cnt_p, cnt[perm])
    np.testing.assert_array_equal(out_p.reshape(-1, F), out.reshape(-1, F)[perm])
    # repeated rows with the same id get the same sample
    first = {}
    for r in range(rows.shape[0]):
        smp = out[r * F:r * F + cnt[r]].tolist()
        assert first.setdefault(int(ids[r]), smp) == smp


def test_independent_of_graph_storage():
    """The same row stored at another CSR index, among different rows, gives the same sample for its id."""
    rng = np.random.default_rng(3)
    ia, na = R.powerlaw_graph(rng, 200, avg=12.0)
    ib, nb = R.powerlaw_graph(rng, 80, avg=5.0)  # another graph, other rows
    deg_a = np.diff(ia)
    rows_a = np.flatnonzero(deg_a > 10)[:10].astype(np.int64)
    assert rows_a.size == 10
    # graph c: graph b with the rows of graph a spliced in at other positions
    place = np.sort(rng.choice(80, rows_a.size, replace=False))
    parts, at = [], {}
    for i in range(80):
        if i in place:
            src = rows_a[list(place).index(i)]
            at[int(src)] = i
            parts.append(na[ia[src]:ia[src + 1]])
        else:
            parts.append(nb[ib[i]:ib[i + 1]])
    ic = np.zeros(81, np.int64)
    np.cumsum([p.size for p in parts], out=ic[1:])
    nc = np.concatenate(parts)
    rows_c = np.array([at[int(r)] for r in rows_a], np.int64)
    assert (rows_c != rows_a).any()
    ids = rows_a * 1000 + 17  # the nodes' global ids
    for fanout in (3, 8):
        cnt_a, out_a, _ = _run(ia, na, rows_a, ids, fanout, key=77)
        cnt_c, out_c, _ = _run(ic, nc, rows_c, ids, fanout, key=77)
        np.testing.assert_array_equal(cnt_c, cnt_a)
        np.testing.assert_array_equal(out_c, out_a)
        # the id, not the CSR row, drives the stream: other ids give other samples
        _, out_d, _ = _run(ia, na, rows_a, ids + 1, fanout, key=77)
        assert (out_d.reshape(-1, fanout) != out_a.reshape(-1, fanout)).any(1).mean() > 0.5


def test_keys_reproducible_and_distinct(big):
    indptr, nbrs, rows, ids = big
    rows, ids = rows[:2000], ids[:2000]
    a = _run(indptr, nbrs, rows, ids, 5, key=42)[1].reshape(-1, 5)
    b = _run(indptr, nbrs, rows, ids, 5, key=np.uint64(42))[1].reshape(-1, 5)
    c = _run(indptr, nbrs, rows, ids, 5, key=43)[1].reshape(-1, 5)
    np.testing.assert_array_equal(a, b)
    deg = indptr[rows + 1] - indptr[rows]
    sampled = deg >= 8  # rows with a real choice
    assert sampled.sum() > 100
    assert (a != c).any(1)[sampled].mean() > 0.8
    # keys are taken modulo 2**64
    e = _run(indptr, nbrs, rows, ids, 5, key=np.uint64(2**64 - 1))[1]
    f = _run(indptr, nbrs, rows, ids, 5, key=-1)[1]
    g = _run(indptr, nbrs, rows, ids, 5, key=2**64 - 1)[1]
    np.testing.assert_array_equal(e, f)
    np.testing.assert_array_equal(e, g)


def test_hub_row_costs_its_fanout_not_its_degree():
    """Sampling a degree-10**6 row 10**4 times with fanout 10 (10**10 edge visits if O(deg))."""
    deg, m = 10**6, 10**4
    indptr = np.array([0, deg], np.int64)
    nbrs = np.arange(deg, dtype=np.int64) * 2
    rows = np.zeros(m, np.int64)
    ids = np.arange(m, dtype=np.int64)
    cnt = np.empty(m, np.int64)
    out = np.empty(m * 10, np.int64)
    S.sample_neighbors(indptr, nbrs, rows, ids, 10, 2, cnt, out)  # compile (this call takes the parallel path)
    t0 = time.perf_counter()
    S.sample_neighbors(indptr, nbrs, rows, ids, 10, 1, cnt, out)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed
    assert (cnt == 10).all()
    out = out.reshape(m, 10)
    assert (np.diff(out, axis=1) > 0).all() and (out % 2 == 0).all()
    assert np.unique(out[:, 0]).size > m // 2  # samples spread over the row


# ---------------------------------------------------------------------------
# validation


def test_invalid_arguments_are_rejected():
    indptr = np.array([0, 2, 3], np.int64)
    nbrs = np.array([0, 1, 0], np.int64)
    rows = np.array([0, 1], np.int64)
    ids = np.array([0, 1], np.int64)
    cnt = np.empty(2, np.int64)
    for bad in (0, -2, 2.5):
        with pytest.raises(ValueError, match="fanout"):
            S.sample_neighbors(indptr, nbrs, rows, ids, bad, 1, cnt, np.empty(4, np.int64))
        with pytest.raises(ValueError, match="fanout"):
            S.sample_width(indptr, rows, bad)
    with pytest.raises(ValueError, match="ids"):
        S.sample_neighbors(indptr, nbrs, rows, ids[:1], 2, 1, cnt, np.empty(4, np.int64))
    with pytest.raises(ValueError, match="out_count"):
        S.sample_neighbors(indptr, nbrs, rows, ids, 2, 1, cnt[:1], np.empty(4, np.int64))
    with pytest.raises(ValueError, match="out_nbrs"):
        S.sample_neighbors(indptr, nbrs, rows, ids, 2, 1, cnt, np.empty(3, np.int64))
    with pytest.raises(ValueError, match="out_nbrs"):  # fanout -1: F = max degree = 2
        S.sample_neighbors(indptr, nbrs, rows, ids, -1, 1, cnt, np.empty(6, np.int64))
    with pytest.raises(ValueError, match="rows"):
        S.sample_neighbors(indptr, nbrs, rows.astype(np.int32), ids, 2, 1, cnt, np.empty(4, np.int64))
    S.sample_neighbors(indptr, nbrs, rows, ids, np.int64(2), 1, cnt, np.empty(4, np.int64))  # numpy ints are fine


def test_get_kernel_dispatches_to_cpu_twin():
    assert get_kernel("sample.sample_neighbors", "cpu") is S.sample_neighbors
    assert get_kernel("sample.unique_relabel", "cpu") is S.unique_relabel


# ---------------------------------------------------------------------------
# unique_relabel


def _relabel(dst, cand):
    src = np.full(dst.shape[0] + cand.shape[0] + 2, FILL, np.int64)
    col = np.full(cand.shape[0], FILL, np.int64)
    n = S.unique_relabel(dst, cand, src, col)
    assert (src[n:] == FILL).all()
    return src[:n], col


@pytest.mark.parametrize("nd,c,pool", [(5, 40, 30), (100, 2000, 900), (0, 50, 10), (30, 0, 1), (0, 0, 1),
                                       (64, 300, 64)])
def test_unique_relabel_matches_reference(nd, c, pool):
    rng = np.random.default_rng(nd * 7 + c)
    ids = rng.choice(2**40, pool + nd, replace=False).astype(np.int64) + 2**40
    ids[0] = 2**62 + 3  # much larger than any graph
    dst = ids[:nd].copy()
    cand = rng.choice(ids[max(nd - 20, 0):], c).astype(np.int64)  # some dst ids among the candidates
    src, col = _relabel(dst, cand)
    want_src, want_col = R.relabel(dst, cand)
    np.testing.assert_array_equal(src, want_src)
    np.testing.assert_array_equal(col, want_col)
    np.testing.assert_array_equal(src[:nd], dst)
    np.testing.assert_array_equal(src[col], cand)
    assert np.unique(src).size == src.size
    # first appearance order of the new ids
    new = [v for v in dict.fromkeys(cand.tolist()) if v not in set(dst.tolist())]
    assert src[nd:].tolist() == new


def test_unique_relabel_rejects_bad_input():
    dst = np.array([5, 9], np.int64)
    cand = np.array([9, 1], np.int64)
    with pytest.raises(ValueError, match="distinct"):
        S.unique_relabel(np.array([5, 5], np.int64), cand, np.empty(4, np.int64), np.empty(2, np.int64))
    with pytest.raises(ValueError, match=">= 0"):
        S.unique_relabel(dst, np.array([3, -1], np.int64), np.empty(4, np.int64), np.empty(2, np.int64))
    with pytest.raises(ValueError, match="out_src"):
        S.unique_relabel(dst, cand, np.empty(3, np.int64), np.empty(2, np.int64))
    with pytest.raises(ValueError, match="out_col"):
        S.unique_relabel(dst, cand, np.empty(4, np.int64), np.empty(1, np.int64))
    src = np.empty(4, np.int64)
    col = np.empty(2, np.int64)
    assert S.unique_relabel(dst, cand, src, col) == 3
    assert src[:3].tolist() == [5, 9, 1] and col.tolist() == [1, 2]
