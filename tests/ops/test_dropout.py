"""``hpc_graph.ops.dropout``'s key draws: recorded in order, replayed exactly (the generator ends where the draws
left it), and draws on a stream of the caller's own left out."""
from __future__ import annotations

import random

import torch

from hpc_graph.ops.dropout import KEY_HIGH, draw_key, own_key_stream, record_key_draws, skip_key_draws


def test_skipping_recorded_draws_leaves_the_generator_where_drawing_them_does():
    rng = random.Random(1)
    for trial in range(20):
        highs = [rng.choice([KEY_HIGH, 2**31 - 1, 7, 2**40]) for _ in range(rng.randint(0, 12))]
        torch.manual_seed(trial)
        with record_key_draws() as rec:
            keys = [draw_key(h) for h in highs]
        drawn = torch.get_rng_state()
        assert rec == highs and all(0 <= k < h for k, h in zip(keys, highs))
        torch.manual_seed(trial)
        skip_key_draws(rec)
        assert torch.equal(torch.get_rng_state(), drawn)


def test_draws_on_an_own_stream_are_not_recorded_and_nesting_records_in_every_level():
    torch.manual_seed(0)
    with record_key_draws() as outer:
        draw_key()
        with torch.random.fork_rng(devices=[]), own_key_stream():
            torch.manual_seed(123)
            draw_key(2**20)
        with record_key_draws() as inner:
            draw_key(99)
    assert outer == [KEY_HIGH, 99] and inner == [99]
    draw_key()  # no record open: nothing noted, nothing fails
    assert outer == [KEY_HIGH, 99]
