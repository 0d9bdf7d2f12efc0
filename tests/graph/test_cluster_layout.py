"""The cluster-sparse layout (exact against plain pattern attention, every entry covered once) and the
beta tuner (scripted loss/time sequences give the expected beta trajectory)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.graph.attention_pattern import (BetaTuner, ClusterLayoutControl, attend, attend_layout,
                                               build_cluster_layout, build_pattern, pattern_density,
                                               sequence_clusters)


def _graph(n=120, m=500, seed=0):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    o = np.lexsort((src, dst))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[o], minlength=n), out=indptr[1:])
    return indptr, src[o].astype(np.int64), n


@pytest.fixture(scope="module")
def pattern():
    indptr, indices, n = _graph()
    order, cp = sequence_clusters(indptr, indices, n, "metis", cluster_size=16)
    return build_pattern(indptr, indices, n, global_token=True, order=order), cp


@pytest.mark.parametrize("rel", [0.0, 1.0, 5.0, None])
def test_layout_covers_every_entry_once(pattern, rel):
    pat, cp = pattern
    beta = 1.0 if rel is None else rel * pattern_density(pat)
    lay = build_cluster_layout(pat, cp, beta)
    ids = [lay.sparse_ids] + [b[4] for b in lay.blocks]
    allids = torch.cat(ids).sort().values
    assert torch.equal(allids, torch.arange(pat.csr.num_edges))  # each entry exactly once
    rows = torch.repeat_interleave(torch.arange(pat.num_tokens), pat.csr.in_degree())
    for rid, cid, r, c, e in lay.blocks:  # a block's local positions are its entries
        assert torch.equal(rid[r], rows[e]) and torch.equal(cid[c], pat.csr.indices[e])
        assert e.numel() / (rid.numel() * cid.numel()) > beta
    srows = torch.repeat_interleave(torch.arange(pat.num_tokens), lay.sparse.in_degree())
    assert torch.equal(srows, rows[lay.sparse_ids]) and torch.equal(lay.sparse.indices, pat.csr.indices[lay.sparse_ids])
    if rel == 0.0:
        assert lay.sparse.num_edges == pat.num_nodes * 2 + 1  # only the global token's entries stay CSR
    if rel is None:
        assert not lay.blocks


@pytest.mark.parametrize("rel", [0.0, 1.0, 3.0])
def test_layout_attention_equals_pattern_attention(pattern, rel):
    pat, cp = pattern
    lay = build_cluster_layout(pat, cp, rel * pattern_density(pat))
    assert lay.blocks
    gen = torch.Generator().manual_seed(1)
    T, H = pat.num_tokens, 3
    q, k, v = (torch.randn(T, H, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    bias = torch.randn(6, H, dtype=torch.float64, generator=gen, requires_grad=True)
    ref = attend(pat, q, k, v, bias=bias)
    out = attend_layout(lay, pat.codes_for(2), q, k, v, bias)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)
    w = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v, bias)),
                    torch.autograd.grad((ref * w).sum(), (q, k, v, bias))):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def _feed(tuner, losses, seconds):
    out = []
    for e, (loss, s) in enumerate(zip(losses, seconds), 1):
        out.append(tuner.update(e, loss, s))
    return out


def _losses(smoothed):
    """Per-epoch losses whose running average F_t = 0.9 F_{t-1} + 0.1 L_t is exactly ``smoothed``."""
    out = [smoothed[0]]
    for a, b in zip(smoothed[:-1], smoothed[1:]):
        out.append(10 * b - 9 * a)
    return out


# with window 3 the tuner decides at epochs 4, 7, 10, 13 (the first rate is at epoch 2; the first rate of
# every later window is left out): betas[3], betas[6], ... are the values chosen there
def test_tuner_walks_on_while_the_descent_rate_improves():
    t = BetaTuner(0.01, window=3)
    L = t.ladder
    assert L == sorted(set(L)) and L[0] == 0.0 and L[-1] == 1.0 and 0.01 in L and t.beta == 1.0  # starts at CSR
    betas = _feed(t, _losses([100.0 - e for e in range(13)]), [1.0] * 4 + [0.5] * 3 + [0.25] * 3 + [0.1] * 3)
    top = len(L) - 1
    assert [betas[3], betas[6], betas[9], betas[12]] == [L[top - 1], L[top - 2], L[top - 3], L[top - 4]]
    assert [b for _, b in t.history][:5] == [1.0] * 4 + [L[top - 1]]


def test_tuner_turns_back_then_settles_and_hysteresis_holds():
    t = BetaTuner(0.01, window=3)
    L = t.ladder
    top = len(L) - 1
    # LDR 1 -> next value; LDR 0.5 there: worse, back; LDR 0.25: worse right after turning back: settles;
    # LDR 0.25 again: within the hysteresis band, stays
    betas = _feed(t, _losses([100.0 - e for e in range(13)]), [1.0] * 4 + [2.0] * 3 + [4.0] * 6)
    assert [betas[3], betas[6], betas[9], betas[12]] == [L[top - 1], L[top], L[top], L[top]]
    t = BetaTuner(0.01, window=3, hysteresis=0.2)
    betas = _feed(t, _losses([100.0 - e for e in range(7)]), [1.0] * 4 + [1.1] * 3)  # 9 % slower: in the band
    assert [betas[3], betas[6]] == [L[top - 1], L[top - 1]]


def test_tuner_bounces_at_the_end_of_the_ladder_and_round_trips():
    t = BetaTuner(0.01, window=2, start=0)
    assert t.beta == 0.0
    betas = _feed(t, [10, 9, 8], [1.0, 1.0, 1.0])
    assert betas[-1] == t.ladder[1]  # could not go further down: walked up
    state = t.state_dict()
    t2 = BetaTuner(0.5, window=2)
    t2.load_state_dict(state)
    assert t2.beta == t.beta and t2.ladder == t.ladder and t2.history == t.history
    assert _feed(t, [7, 6, 5], [1, 1, 1]) == _feed(t2, [7, 6, 5], [1, 1, 1])


def test_non_finite_loss_is_ignored():
    t = BetaTuner(0.01, window=2)
    assert _feed(t, [float("nan"), float("inf")], [1.0, 1.0]) == [1.0] * 2 and t.F is None


def test_bad_settings():
    with pytest.raises(ValueError, match="engine.cluster_beta"):
        ClusterLayoutControl(1.5)
    with pytest.raises(ValueError, match="engine.cluster_beta"):
        ClusterLayoutControl("fast")
    with pytest.raises(ValueError, match="engine.cluster_size"):
        ClusterLayoutControl(0.1, cluster_size=0)
    with pytest.raises(ValueError, match="engine.tuner_window"):
        BetaTuner(0.1, window=1)
    indptr, indices, n = _graph(20, 40)
    pat = build_pattern(indptr, indices, n)
    with pytest.raises(ValueError, match="cluster boundaries"):
        build_cluster_layout(pat, np.array([0, 5, 19]), 0.1)
