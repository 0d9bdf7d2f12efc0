"""LM co-training parts on one process: lazy-tuner groups, the collaborator's dt rule, the bubble interleaver's
cooperative wait, the LM trainer's schedule, and the trainer with ``lm.enabled`` (input width, resume)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hpc_graph.comm.local import LocalCommunicator
from hpc_graph.nn.text_encoder import EarlyExitLM, load_text_encoder
from hpc_graph.train.cotrain import BubbleInterleaver, Collaborator, LMTrainer, exit_groups


# -- lazy tuner groups ----------------------------------------------------------------------------------
def test_centrality_groups_leave_low_degree_nodes_first():
    rng = np.random.default_rng(0)
    degree = rng.integers(0, 12, 1003)
    g = exit_groups(degree, 4, "centrality", seed=1)
    sizes = np.bincount(g, minlength=4)
    assert sizes.max() - sizes.min() <= 1
    for a in range(3):  # every node of an earlier exit has a degree <= every node of a later one
        assert degree[g == a].max() <= degree[g == a + 1].min()
    r = exit_groups(degree, 4, "reversed", seed=1)
    for a in range(3):
        assert degree[r == a].min() >= degree[r == a + 1].max()
    rand = exit_groups(degree, 4, "random", seed=1)
    assert np.bincount(rand, minlength=4).max() - np.bincount(rand, minlength=4).min() <= 1
    assert abs(np.corrcoef(rand, degree)[0, 1]) < 0.15
    assert (exit_groups(degree, 4, "none") == 3).all()
    with pytest.raises(ValueError, match="lm.grouping"):
        exit_groups(degree, 4, "pagerank")


# -- collaborator ---------------------------------------------------------------------------------------
def _syncs(losses, epochs):
    c = Collaborator(epochs)
    return [j for j, loss in enumerate(losses, 1) if c.observe(j, loss)], c


def test_collaborator_steps_dt_down_after_20_falling_epochs():
    # F falls every epoch from epoch 2 on: the 20th fall is at epoch 21 (dt 30 -> 20: due at once, 21 >= 20),
    # the next 20 falls end at epoch 41 (dt 10), then at 61 (dt 2)
    syncs, c = _syncs([10.0 / j for j in range(1, 101)], 100)
    assert syncs == [21, 41, 51, 61] + list(range(63, 101, 2))
    assert c.interval == 2


def test_collaborator_keeps_dt_while_the_loss_oscillates():
    syncs, c = _syncs([1.0 + 0.5 * (j % 2) for j in range(100)], 100)
    assert syncs == [30, 60, 90] and c.interval == 30


def test_collaborator_nan_breaks_the_streak():
    losses = [10.0 / j for j in range(1, 101)]
    losses[15] = float("nan")  # epoch 16: the run of falls restarts at epoch 17
    syncs, _ = _syncs(losses, 100)
    # dt 30 until the 20th fall at epoch 36 (dt 20; last sync 30, so next at 50), dt 10 from epoch 56 (syncs 60,
    # 70), dt 2 from epoch 76
    assert syncs == [30, 50, 60, 70, 76] + list(range(78, 101, 2))


def test_collaborator_state_round_trip():
    a = Collaborator(50)
    for j in range(1, 30):
        a.observe(j, 5.0 / j)
    b = Collaborator(50)
    b.load_state_dict(a.state_dict())
    assert [a.observe(j, 1.0 / j) for j in range(30, 50)] == [b.observe(j, 1.0 / j) for j in range(30, 50)]


# -- bubble interleaver ---------------------------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-4  # every look at the clock (a poll) takes a little time
        return self.t


class _FakeLM:
    """Chunks of fixed length on the fake clock; ``ready`` can be scripted."""

    def __init__(self, clock, chunk, work=100, not_ready=0):
        self.clock, self.chunk_s, self.work, self.not_ready = clock, chunk, work, not_ready
        self.started_at: list[float] = []
        self.stats = {"bubble_chunks": 0, "bubble_seconds": 0.0, "max_delay_seconds": 0.0}

    def has_work(self):
        return self.work > 0

    def ready(self):
        self.not_ready -= 1
        return self.not_ready < 0

    def next_chunk_estimate(self):
        return self.chunk_s

    def chunk(self):
        self.started_at.append(self.clock.t)
        self.clock.t += self.chunk_s
        self.work -= 1


@pytest.mark.parametrize("arrival", [0.0005, 0.0031, 0.0100, 0.0234])
def test_interleaver_delays_a_message_by_at_most_one_chunk(arrival):
    clock = _Clock()
    lm = _FakeLM(clock, chunk=0.002)
    il = BubbleInterleaver(lm, clock=clock, floor=1.0)  # room for chunks in every wait
    t0 = clock.t
    il.wait(lambda: clock.t - t0 >= arrival, "k")
    after = [s for s in lm.started_at if s - t0 >= arrival]
    assert after == []  # no chunk starts once the message is there
    assert clock.t - t0 - arrival <= 0.002 + 1e-3  # the wait ended within one chunk (+ a few polls) of arrival
    assert il.max_delay <= 0.002 + 2e-4  # one chunk, as the (fake) clock saw it
    assert lm.stats["bubble_chunks"] == len(lm.started_at)
    assert (len(lm.started_at) > 0) == (arrival > 0.0002)  # chunks fill the bubble while the message is away


def test_interleaver_learns_the_bubble_and_keeps_inside_it():
    clock = _Clock()
    lm = _FakeLM(clock, chunk=0.003)
    il = BubbleInterleaver(lm, clock=clock)
    t0 = clock.t
    il.wait(lambda: clock.t - t0 >= 0.010, "fwd")  # never seen: no prediction, no chunk
    assert lm.started_at == [] and 0.009 <= il.predicted["fwd"] <= 0.010
    t0 = clock.t
    il.wait(lambda: clock.t - t0 >= 0.010, "fwd")  # predicted 10 ms: three 3 ms chunks fit, a fourth does not
    assert len(lm.started_at) == 3 and il.max_delay == 0.0


def test_interleaver_polls_while_the_lm_reduce_is_in_flight_and_without_work():
    clock = _Clock()
    lm = _FakeLM(clock, chunk=0.001, work=2, not_ready=5)
    il = BubbleInterleaver(lm, clock=clock, floor=1.0)
    t0 = clock.t
    il.wait(lambda: clock.t - t0 >= 0.050, "k")
    assert len(lm.started_at) == 2 and lm.started_at[0] - t0 >= 5e-4  # waited for ready, then ran the work
    assert 0.050 <= clock.t - t0 <= 0.0502  # no work left: polled until the message came
    assert 0.0498 <= il.predicted["k"] <= 0.050


# -- LM trainer -----------------------------------------------------------------------------------------
TEXTS = [f"{a} {b} word{i % 7}" for i, (a, b) in enumerate(zip(["red", "blue", "green"] * 40, ["x", "y"] * 60))]


def _lm_trainer(seed=0, batch=8, epochs=2.0, dropout=0.1, staleness=0):
    enc, tok = load_text_encoder("tiny", TEXTS, dropout=dropout, seed=seed)
    torch.manual_seed(seed + 1)
    lm = EarlyExitLM(enc, 4, 3).double()
    ids, mask = tok.encode(TEXTS, 16)
    label = torch.tensor([i % 3 for i in range(len(TEXTS))])
    groups = exit_groups(np.arange(len(TEXTS)) % 10, 4, "centrality", seed)
    t = LMTrainer(lm, ids, mask, groups, label, np.arange(0, len(TEXTS), 2), LocalCommunicator(), epochs=epochs,
                  batch_size=batch, lr=1e-3, seed=seed, staleness=staleness)
    t.plan(5)
    return t


def test_lm_steps_are_spread_over_the_gnn_epochs_and_batches_hold_one_exit():
    t = _lm_trainer()
    assert t.steps_per_lm_epoch == sum(math.ceil(k / 8) for k in np.bincount(t.groups[t.train]))
    assert t.total_steps == 2 * t.steps_per_lm_epoch
    done = []
    for _ in range(5):
        t.begin_epoch()
        t.finish_epoch()
        done.append(t.applied)
    per = math.ceil(t.total_steps / 5)
    assert done == [min(per * (k + 1), t.total_steps) for k in range(5)]
    for exit_, nodes in t._epoch_batches(0):
        assert (t.groups[nodes] == exit_).all() and len(nodes) <= 8
    assert sorted(np.concatenate([n for _, n in t._epoch_batches(1)]).tolist()) == t.train.tolist()


@pytest.mark.parametrize("staleness", [0, 2])
def test_interleaving_lm_chunks_changes_neither_the_lm_nor_the_callers_random_stream(staleness):
    a, b = _lm_trainer(staleness=staleness), _lm_trainer(staleness=staleness)
    torch.manual_seed(123)
    for _ in range(3):  # a: all chunks after the epoch
        torch.rand(5)
        a.begin_epoch()
        a.finish_epoch()
    ref_after = torch.rand(3)
    torch.manual_seed(123)
    for _ in range(3):  # b: a chunk between the caller's draws, the rest after
        b.begin_epoch()
        b.chunk()
        torch.rand(5)
        if b.ready():
            b.chunk()
        b.finish_epoch()
    assert torch.equal(torch.rand(3), ref_after)
    for (n, p), q in zip(a.lm.named_parameters(), b.lm.parameters()):
        assert torch.equal(p, q), n


def test_head_lr_applies_to_the_exit_heads_and_classifier_only():
    enc, tok = load_text_encoder("tiny", TEXTS, seed=0)
    lm = EarlyExitLM(enc, 2, 3)
    ids, mask = tok.encode(TEXTS, 16)
    t = LMTrainer(lm, ids, mask, np.zeros(len(TEXTS), dtype=np.int64), torch.zeros(len(TEXTS), dtype=torch.int64),
                  np.arange(10), LocalCommunicator(), epochs=1.0, batch_size=4, lr=1e-4, head_lr=3e-3)
    lrs = {id(p): g["lr"] for g in t.optimizer.param_groups for p in g["params"]}
    heads = {id(p) for p in list(lm.heads.parameters()) + list(lm.classifier.parameters())}
    assert all(lrs[k] == 3e-3 for k in heads)
    assert all(lr == 1e-4 for k, lr in lrs.items() if k not in heads) and len(lrs) > len(heads)
    assert id(lm.encoder.embeddings.word_embeddings.weight) not in lrs  # frozen


def test_stale_steps_take_the_gradient_on_older_parameters():
    t = _lm_trainer(dropout=0.0, staleness=1)
    t.plan(1)
    t.begin_epoch()
    theta0 = [p.detach().clone() for p in t.lm.parameters()]
    t.chunk()
    t.chunk()  # staleness 1: step 1's gradient is taken on the initial parameters too
    assert t.applied == 0 and len(t._pending) == 2
    t.chunk()  # step 2 needs step 0 applied, not step 1
    assert t.applied == 1
    ref = _lm_trainer(dropout=0.0)
    with torch.no_grad():
        for p, q in zip(ref.lm.parameters(), theta0):
            p.copy_(q)
    exit_, nodes = ref._batch(1)
    ref.lm.train()
    loss = F.cross_entropy(ref.lm(ref.ids[nodes][:, :16], ref.mask[nodes][:, :16], exit_), ref.label[nodes],
                           reduction="sum") / len(nodes)
    active = [p for p in ref.lm.exit_parameters(exit_) if p.requires_grad]
    grads = torch.autograd.grad(loss, active, allow_unused=True)
    want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, active)])
    torch.testing.assert_close(t._pending[0][1], want)


def test_a_step_leaves_the_parameters_its_exit_does_not_use_alone():
    # AdamW would move a parameter with a zero gradient (momentum of earlier steps, weight decay): a step of an
    # early exit must leave the deeper layers and the other heads exactly as they were
    t = _lm_trainer(dropout=0.0, epochs=4.0)
    t.optimizer.param_groups[0]["weight_decay"] = 0.01
    t.plan(1)
    t.begin_epoch()
    deepest = len(t.lm.heads) - 1
    seen_deep = False
    for _ in range(t.total_steps):
        exit_, _ = t._batch(t.started)
        seen_deep |= exit_ == deepest
        before = {n: p.detach().clone() for n, p in t.lm.named_parameters()}
        t.chunk()
        t._apply_pending()
        used = {id(p) for p in t.lm.exit_parameters(exit_)}
        for n, p in t.lm.named_parameters():
            if id(p) not in used:
                assert torch.equal(p, before[n]), (exit_, n)
        assert all(p.grad is None for p in t.lm.parameters())
    assert seen_deep and t.applied == t.total_steps


def test_lm_learns_its_labels():
    t = _lm_trainer(epochs=30.0, dropout=0.0)
    t.plan(1)
    with torch.no_grad():
        before = _accuracy(t)
    t.begin_epoch()
    t.finish_epoch()
    assert t.applied == t.total_steps
    assert _accuracy(t) > max(before, 0.9)


def _accuracy(t):
    t.lm.eval()
    emb_ok = 0
    for g in range(4):
        nodes = np.nonzero(t.groups == g)[0]
        logits = t.lm(t.ids[nodes], t.mask[nodes], g)
        emb_ok += int((logits.argmax(1) == t.label[nodes]).sum())
    return emb_ok / len(t.groups)


# -- the trainer with lm.enabled --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tag_file(tmp_path_factory):
    from data_io.generators import write_tag

    path = tmp_path_factory.mktemp("tag") / "tag.h5"
    write_tag(path, num_nodes=240, communities=2, topics=3, seed=4)
    return path


def _config(path, run_dir, **lm):
    from hpc_graph.train.config import config_from_dict

    return config_from_dict({
        "data": {"path": str(path)}, "engine": {"name": "single"},
        "model": {"name": "sage", "hidden": 8, "num_layers": 2, "dropout": 0.2},
        "optim": {"lr": 0.01}, "train": {"epochs": 6, "eval_every": 3, "progress": False, "run_dir": str(run_dir),
                                         "dtype": "float64"},
        "lm": {"enabled": True, "model": "tiny", "epochs": 2.0, "lr": 1e-3, "batch_size": 16, **lm}})


def test_trainer_input_is_features_embedding_and_flag(tag_file, tmp_path):
    from hpc_graph.train.trainer import Trainer

    t = Trainer(_config(tag_file, tmp_path / "a", encode_at_start=False, sync="every", sync_every=2),
                LocalCommunicator())
    f = t.engine.num_features
    assert t.feat.shape[1] == f + 32 + 1  # the tiny LM's hidden size 32, and the flag
    assert (t.feat[:, f:] == 0).all()  # nothing encoded before the first sync
    t.step()
    assert (t.feat[:, f:] == 0).all()
    t.step()  # epoch 2: sync
    assert (t.feat[:, -1] == 1).all() and t.feat[:, f:-1].abs().sum() > 0
    want = t.cotrain.trainer.encode().double()
    for g in range(4):  # lm.standardize: each exit's columns standardised over its nodes
        rows = torch.from_numpy(np.nonzero(t.cotrain.groups == g)[0])
        want[rows] = (want[rows] - want[rows].mean(0)) / want[rows].std(0, unbiased=False)
    torch.testing.assert_close(t.feat[:, f:-1], want[t.cotrain.node_ids], rtol=1e-5, atol=1e-5)
    raw = Trainer(_config(tag_file, tmp_path / "b", standardize=False), LocalCommunicator())
    torch.testing.assert_close(raw.feat[:, f:-1], raw.cotrain.trainer.encode().double()[raw.cotrain.node_ids])


def test_trainer_resume_continues_the_lm(tag_file, tmp_path):
    from hpc_graph.train.trainer import Trainer

    full = Trainer(_config(tag_file, tmp_path / "full", sync="every", sync_every=2), LocalCommunicator())
    want = [full.step() for _ in range(6)]
    half = Trainer(_config(tag_file, tmp_path / "half", sync="every", sync_every=2), LocalCommunicator())
    for _ in range(3):
        half.step()
    half.run_dir.mkdir(parents=True, exist_ok=True)
    half.save_checkpoint()  # after epoch 3 of 6 (the LM's steps are planned over all 6)
    resumed = Trainer(_config(tag_file, tmp_path / "half", sync="every", sync_every=2), LocalCommunicator(),
                      resume=tmp_path / "half")
    got = [resumed.step() for _ in range(3)]
    assert got == pytest.approx(want[3:], rel=1e-12, abs=1e-12)
    for p, q in zip(full.cotrain.trainer.lm.parameters(), resumed.cotrain.trainer.lm.parameters()):
        assert torch.equal(p, q)


def test_lm_on_a_dataset_without_text_is_refused(tmp_path):
    from data_io.generators import write_csbm
    from hpc_graph.train.config import ConfigError
    from hpc_graph.train.trainer import Trainer

    write_csbm(tmp_path / "c.h5", 100, 2, feat_dim=4)
    with pytest.raises(ConfigError, match="/node/text"):
        Trainer(_config(tmp_path / "c.h5", tmp_path / "r"), LocalCommunicator())
