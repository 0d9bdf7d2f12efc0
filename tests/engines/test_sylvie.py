"""sylvie's policy pieces on one process: loss-descent-rate bit policy, node importance, bit assignment, options."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpc_graph.engines.sylvie import BitPolicy, SylvieEngine, assign_bits, node_importance


def _run(policy, losses, seconds=1.0):
    return [policy.update(loss, seconds) for loss in losses]


def test_warmup_until_delta_epochs_of_rates_exist():
    p = BitPolicy(smoothing=0.0, window=3)
    out = _run(p, [10, 9, 8, 7])
    assert [d.branch for d in out] == ["warmup"] * 4 and p.bits == 1  # LDR from epoch 2; compare from 5


def test_up_when_the_loss_falls_more_slowly_than_delta_epochs_ago():
    p = BitPolicy(smoothing=0.0, window=2)
    # with lambda = 0 the smoothed loss is the loss; LDR_t = L_(t-1) - L_t (1 s epochs)
    out = _run(p, [100, 90, 81, 75, 71])  # LDR: -, 10, 9, 6, 4: epoch 4 compares 6 with LDR_2 = 10
    assert out[3].branch == "up" and out[3].bits == 2 and out[3].sync
    assert out[4].branch == "cooldown" and out[4].bits == 2  # held for delta epochs after a change


def test_down_when_the_loss_falls_at_least_as_fast():
    p = BitPolicy(smoothing=0.0, window=1)
    p.bits = 8
    out = _run(p, [100, 99, 97, 94])  # LDR 1, 2, 3: speeding up -> fewer bits
    assert [d.branch for d in out] == ["warmup", "warmup", "down", "cooldown"]
    assert p.bits == 4 and not out[2].sync


def test_hold_at_the_ends_of_the_range():
    p = BitPolicy(smoothing=0.0, window=1)
    out = _run(p, [100, 99, 97, 94])
    assert out[2].branch == "hold" and p.bits == 1  # would go down, already at 1 bit
    p = BitPolicy(smoothing=0.0, window=1)
    p.bits = 8
    out = _run(p, [100, 90, 85, 84])
    assert out[2].branch == "hold" and out[2].sync and p.bits == 8  # would go up, already at 8 bits


def test_the_sign_of_the_rate_a_rising_loss_asks_for_more_bits():
    p = BitPolicy(smoothing=0.0, window=1)
    out = _run(p, [10, 9, 9.5])  # LDR 1 then -0.5: the loss turned up
    assert out[2].branch == "up" and p.bits == 2


def test_smoothing_and_epoch_time_enter_the_rate():
    p = BitPolicy(smoothing=0.5, window=1)
    p.update(10.0, 2.0)
    d = p.update(6.0, 2.0)  # F: 10 -> 8, LDR = (10 - 8) / 2
    assert d.ldr == pytest.approx(1.0)


def test_non_finite_loss_holds_and_is_not_remembered_as_a_rate():
    p = BitPolicy(smoothing=0.0, window=1)
    out = _run(p, [10, math.nan, 9])
    assert out[1].branch == "hold" and p.ldr[1] is None and p.smoothed == 9


def test_scripted_sequence_takes_up_down_hold_and_sync_branches():
    p = BitPolicy(smoothing=0.0, window=1)
    # rates: 4, 2 (slower: up), 2 (cooldown), 3 (faster: down), 3 (cooldown),
    # 3 (equal counts as faster: hold, already at 1 bit)
    out = _run(p, [20, 16, 14, 12, 9, 6, 3])
    assert [d.branch for d in out] == ["warmup", "warmup", "up", "cooldown", "down", "cooldown", "hold"]
    assert [d.bits for d in out] == [1, 1, 2, 2, 1, 1, 1]
    assert [d.sync for d in out] == [False, False, True, False, False, False, False]


def test_state_round_trip():
    p = BitPolicy(smoothing=0.9, window=2)
    _run(p, [5, 4, 3.5, 3.4, 3.39, 3.2])
    q = BitPolicy(smoothing=0.9, window=2)
    q.load_state_dict(p.state_dict())
    assert [d.bits for d in _run(p, [3.1, 3.0, 2.99])] == [d.bits for d in _run(q, [3.1, 3.0, 2.99])]


def _naive_importance(deg, boundary):
    d = [deg[v] for v in boundary]
    if len(d) == 1:
        return np.ones(1)
    return np.array([(sum(1 for u in d if u <= dv) - 1) / (len(d) - 1) for dv in d])


@pytest.mark.parametrize("seed", range(10))
def test_node_importance_matches_a_naive_ranking(seed):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 20, 60)
    boundary = np.sort(rng.choice(60, int(rng.integers(1, 40)), replace=False))
    p = node_importance(deg, boundary)
    np.testing.assert_allclose(p, _naive_importance(deg, boundary))
    assert p.max() == 1.0 and (p >= 0).all()


@pytest.mark.parametrize("base", [1, 2, 4, 8])
def test_assign_bits_follows_the_candidate_rule(base):
    p = np.linspace(0, 1, 101)
    got = assign_bits(p, base)
    cand = [b for b in (1, 2, 4, 8) if b >= base]
    want = [cand[min(len(cand) - 1, int(np.floor(v * len(cand))))] for v in p]
    assert got.tolist() == want and got.dtype == np.int8
    assert got[-1] == 8 and got[0] == base  # hubs get 8 bits, the least important the base width


@pytest.mark.parametrize("options,named", [({"bits": 3}, "engine.bits"), ({"bits": "16"}, "engine.bits"),
                                           ({"pipeline": "sometimes"}, "engine.pipeline"),
                                           ({"scale_dtype": "bfloat16"}, "engine.scale_dtype"),
                                           ({"ldr_smoothing": 1.5}, "engine.ldr_smoothing"),
                                           ({"ldr_window": 0}, "engine.ldr_window"),
                                           ({"speed": 1}, "not an option of engine 'sylvie'")])
def test_bad_options_are_refused_before_any_data_is_read(options, named):
    from hpc_graph.comm import get_communicator

    with pytest.raises(ValueError, match=named):
        SylvieEngine("/nonexistent/partition", get_communicator("local"), torch.device("cpu"), torch.float32,
                     options)
