"""``apt`` on one process: every strategy reproduces the full graph with all neighbours sampled; the options
are checked; the dry run's table and choice; the alpha-beta fit. Multi-rank behaviour (equal gradients of
the four strategies, bytes per operation, cache, dry-run predictions) is in tests/mpi/test_apt.py."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, write_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.engines.apt import SETTLE, TUNE_PAIR, TUNE_ROUNDS, _rounds_mean
from hpc_graph.nn import build_model
from hpc_graph.plan.profile import fit_alpha_beta

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    rng = np.random.default_rng(1)
    n, e = 150, 900
    w = 1.0 / np.arange(1, n + 1) ** 0.7
    src = rng.choice(n, e, p=w / w.sum())
    dst = rng.integers(0, n, e)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    split = rng.random(n)
    path = tmp_path_factory.mktemp("apt") / "g.h5"
    write_dataset(path, GraphData(indptr=indptr, indices=pairs[:, 1].astype(np.int64),
                                  feat=rng.standard_normal((n, 7)).astype(np.float32),
                                  label=rng.integers(0, 3, n).astype(np.int64), train_mask=split < 0.6,
                                  val_mask=split >= 0.6, test_mask=split >= 0.8, name="apt", num_classes=3,
                                  directed=True))
    return str(path)


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.layout == torch.strided else t.to_dense()


def _apt(path, strategy, **opts):
    o = {"fanouts": (-1, -1), "batch_size": 20, "strategy": strategy, "model": "sage", "hidden": 5}
    o.update(opts)
    return create_engine("apt", path, get_communicator("local"), CPU, torch.float64, o)


@pytest.mark.parametrize("model_name, strategy", [(m, s) for m in ("gcn", "sage", "gat")
                                                    for s in ("gdp", "nfp", "snp", "dnp") if (m, s) != ("gat", "nfp")])
def test_all_neighbours_give_the_full_graph(graph_file, model_name, strategy):
    """With every neighbour sampled, a batch's output rows, loss and gradients are the full graph's (GAT on
    NFP is refused: test_nfp_refuses_attention)."""
    single = create_engine("single", graph_file, get_communicator("local"), CPU, torch.float64)
    eng = _apt(graph_file, strategy, model=model_name)
    torch.manual_seed(3)
    model = build_model(model_name, 7, 5, 3, num_layers=2, dropout=0.0, heads=2).double()
    full = model(single.graph, single.feat)
    batch = eng.batch(1, 0)
    out = model(batch.graph, batch.feat)
    torch.testing.assert_close(out, full[batch.seeds], rtol=1e-10, atol=1e-10)
    loss = F.cross_entropy(out, batch.label)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    ref = torch.autograd.grad(F.cross_entropy(full[batch.seeds], single.label[batch.seeds]),
                              list(model.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


def test_strategies_sample_the_same_blocks(graph_file):
    """Sampled (fan-outs 3, 2): every strategy's batch gives GDP's output rows (same keyed samples)."""
    torch.manual_seed(5)
    model = build_model("sage", 7, 5, 3, num_layers=2, dropout=0.0).double()
    outs = {}
    for s in ("gdp", "nfp", "snp", "dnp"):
        eng = _apt(graph_file, s, fanouts=(3, 2))
        batch = eng.batch(2, 1)
        outs[s] = model(batch.graph, batch.feat)
    for s in ("nfp", "snp", "dnp"):
        torch.testing.assert_close(outs[s], outs["gdp"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("opts, match", [
    ({"strategy": "p3"}, "engine.strategy"),
    ({"cache_mb": -1}, "engine.cache_mb"),
    ({"cache_mb": "big"}, "engine.cache_mb"),
    ({"dry_run_batches": 0}, "engine.dry_run_batches"),
    ({"strategy": "auto", "plan_timing": "later"}, "engine.plan_timing"),
    ({"fanouts": (5,)}, "sampler.fanouts"),
    ({"batch_size": 0}, "sampler.batch_size"),
    ({"strategy": "nfp", "model": "gat"}, "engine.strategy: nfp"),
    ({"strategy": "nfp", "model": "sage", "model_flags": ("residual",)}, "engine.strategy: nfp"),
    ({"strategy": "dnp", "model_flags": ("batchnorm",)}, "batch statistics"),
])
def test_bad_options_are_refused(graph_file, opts, match):
    with pytest.raises(ValueError, match=match):
        _apt(graph_file, opts.pop("strategy", "gdp"), **opts)


@pytest.mark.parametrize("strategy", ["nfp", "snp", "dnp"])
def test_layer1_shuffles_are_refused_on_a_gpu(graph_file, strategy):
    """The layer-1 shuffles run on the host: on a GPU only gdp (or auto, which then runs gdp) is taken."""
    o = {"fanouts": (-1, -1), "batch_size": 20, "strategy": strategy, "model": "sage", "hidden": 5}
    with pytest.raises(ValueError, match=f"engine.strategy: {strategy} .*use gdp"):
        create_engine("apt", graph_file, get_communicator("local"), torch.device("cuda"), torch.float64, o)


def test_nfp_refuses_attention(graph_file):
    """An NFP block refuses GAT itself (the engine cannot see a model built by hand)."""
    eng = _apt(graph_file, "nfp", model="sage")
    model = build_model("gat", 7, 5, 3, num_layers=2, dropout=0.0, heads=2).double()
    batch = eng.batch(1, 0)
    with pytest.raises(ValueError, match="attention models"):
        model(batch.graph, batch.feat)


def test_auto_runs_the_dry_run_and_logs_the_table(graph_file, caplog):
    with caplog.at_level(logging.INFO, logger="hpc_graph.engines.apt.dry_run"):
        eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, plan_timing="dry_run")
    plan = eng.plan
    assert eng.strategy == plan.choice and plan.tuned and not eng.tuning
    assert plan.choice == min((s for s in plan.costs if plan.costs[s].fits), key=plan.predicted)
    table = plan.table()
    for s in ("gdp", "nfp", "snp", "dnp"):
        assert s in table
    assert "<- chosen" in caplog.text
    # one process: nothing to send, so no strategy moves bytes
    for s in plan.costs:
        assert sum(v for op, v in plan.predicted_bytes(s).items() if op != "allreduce") == 0


def test_memory_limit_rules_strategies_out(graph_file, caplog):
    eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=2, memory_mb=1e-6, model="gat")
    table = eng.plan.table()
    assert table.count("ruled out") == 4 and "MB per rank" in table
    assert "nfp splits the input features" in eng.plan.costs["nfp"].reason or "MB" in eng.plan.costs["nfp"].reason
    assert eng.strategy == "gdp"  # nothing fits: the plan falls back to gdp (with a warning)


def test_cache_holds_the_hottest_remote_rows_only():
    """hot_rows: most-read first, then any other remote row; never more than asked."""
    from hpc_graph.engines.apt.dry_run import Plan

    gids = np.array([10, 11, 12, 13])
    counts = np.array([1, 5, 3, 5])
    plan = Plan({}, "gdp", None, 1, 1, 0.0, {"gdp": (gids, counts)}, np.array([10, 11, 12, 13, 14, 15]), 1.0)
    assert plan.hot_rows("gdp", 3).tolist() == [11, 13, 12]
    assert sorted(plan.hot_rows("gdp", 10).tolist()) == [10, 11, 12, 13, 14, 15]


def test_alpha_beta_fit_recovers_a_line():
    rng = np.random.default_rng(0)
    alpha, beta = rng.uniform(1e-6, 1e-4), rng.uniform(1e8, 1e10)
    sizes = np.array([2.0 ** k for k in range(10, 27, 3)])
    a, b = fit_alpha_beta(sizes, alpha + sizes / beta)
    assert abs(a - alpha) < 1e-3 * alpha + 1e-12 and abs(b - beta) < 1e-6 * beta


def test_checkpoint_keeps_the_strategy(graph_file):
    eng = _apt(graph_file, "snp", fanouts=(3, 2))
    other = _apt(graph_file, "gdp", fanouts=(3, 2))
    other.load_state_dict(eng.state_dict())
    assert other.strategy == "snp" and other.stats()["strategy"] == "snp"


def test_profile_file_is_written_and_reused(graph_file, tmp_path):
    """The machine profile is kept in engine.profile_file between jobs of the same launch; a file measured for
    another launch (or a broken one) is measured again and overwritten."""
    import json

    from hpc_graph.plan import profile as prof_mod

    path = tmp_path / "profile.json"
    prof_mod._CACHE.clear()
    first = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=2, profile_mb=0.01, profile_file=str(path))
    saved = json.loads(path.read_text())
    assert first.plan.profile.seconds > 0 and saved["key"].startswith("ranks=1 ")
    prof_mod._CACHE.clear()  # a new job
    second = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=2, profile_mb=0.01, profile_file=str(path))
    assert second.plan.profile.seconds == 0
    assert second.plan.profile.gemm_flops == pytest.approx(first.plan.profile.gemm_flops)
    saved["key"] = "ranks=64 dtype=torch.float32 max_bytes=1 reps=3 width=5"
    path.write_text(json.dumps(saved))
    prof_mod._CACHE.clear()
    third = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=2, profile_mb=0.01, profile_file=str(path))
    assert third.plan.profile.seconds > 0 and json.loads(path.read_text())["key"].startswith("ranks=1 ")
    path.write_text("{not json")
    prof_mod._CACHE.clear()
    assert _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=2, profile_mb=0.01,
                profile_file=str(path)).plan.profile.seconds > 0


def _input_gids(block):
    """A layer's input rows' global ids (SNP's block 0 names them ``gids``)."""
    return block.src_gid if hasattr(block, "src_gid") else block.gids


def test_training_takes_the_dry_runs_samples(graph_file):
    """The dry run samples the first epochs' own batches; training takes them instead of sampling again and
    gets the batches a fresh engine samples."""
    kept = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=12, plan_timing="dry_run")
    fresh = _apt(graph_file, kept.strategy, fanouts=(3, 2))
    keys = sorted(kept._presampled)
    assert keys and all(1 <= e <= 8 for e, _ in keys)
    assert not fresh._presampled
    for epoch, it in [k for k in keys if k[0] == 1]:
        a, b = kept.batch(epoch, it), fresh.batch(epoch, it)
        for ba, bb in zip(a.graph.blocks, b.graph.blocks):
            assert torch.equal(ba.csr.indptr, bb.csr.indptr) and torch.equal(ba.csr.indices, bb.csr.indices)
            assert torch.equal(_input_gids(ba), _input_gids(bb))
        # NFP's batch features are a CSR column slice (auto picks NFP when it times fastest): compare values
        assert torch.equal(_dense(a.feat), _dense(b.feat)) and torch.equal(a.label, b.label)
    n1 = sum(1 for e, _ in keys if e == 1)
    assert kept.stats()["batches_reused"] == n1 and fresh.stats()["batches_reused"] == 0
    kept.begin_epoch(3)  # the batches of epochs already past are dropped
    assert kept._presampled and all(e >= 3 for e, _ in kept._presampled)
    kept.discard_samples()
    kept.batch(3, 0)
    assert kept.stats()["batches_reused"] == n1


def test_cost_model_times_the_models_step(graph_file, monkeypatch):
    """The compute term is the model's step timed on each strategy's own batch: a step one second longer makes
    that strategy's epoch one second per iteration longer; without the model (a name the options cannot
    build) the kernels' probes stand in."""
    import hpc_graph.engines.apt.dry_run as dr

    eng = _apt(graph_file, "gdp", fanouts=(3, 2), dry_run_batches=4)
    state = torch.random.get_rng_state()
    built, steps = dr.time_builds(eng, ["gdp", "dnp"], eng.iterations(1), 1)
    assert set(built) == set(steps) == {"gdp", "dnp"} and all(fb > 0 and opt > 0 for fb, opt in steps.values())
    assert torch.equal(torch.random.get_rng_state(), state) and eng.strategy == "gdp"
    eng.model_name = "no-such-model"
    assert dr.time_builds(eng, ["gdp", "dnp"], eng.iterations(1), 1)[1] == {}
    plan_k = eng.run_dry_run("gdp")
    assert all(plan_k.costs[s].seconds["compute"] > 0 for s in dr.STRATEGIES)
    eng.model_name = "sage"
    totals = []
    for t in (1.0, 2.0):
        monkeypatch.setattr(dr, "_stepper", lambda engine, t=t: (lambda batch: t + dr.STRATEGIES.index(engine.strategy),
                                                                   0.25))
        plan = eng.run_dry_run("gdp")
        totals.append({s: plan.costs[s].total - plan.costs[s].seconds["build"] - plan.costs[s].seconds["load"]
                       for s in dr.STRATEGIES})
    iters = eng.iterations(1)
    for i, s in enumerate(dr.STRATEGIES):  # one process: no all-reduce, no shuffle
        assert totals[0][s] == pytest.approx(iters * (1.0 + i + 0.25), rel=1e-9)
        assert totals[1][s] - totals[0][s] == pytest.approx(iters * 1.0, rel=1e-9)


def test_dry_run_times_nfp_on_zero_slices_and_training_gets_the_real_ones(graph_file, monkeypatch):
    """The dry run times NFP on zero column slices of the right shape (no feature exchange: only the degrees
    travel); the layout is undone after the plan, and switching to NFP makes the real one."""
    eng = _apt(graph_file, "gdp", fanouts=(3, 2), dry_run_batches=4)
    assert eng._nfp is None  # the plan's layout is not kept for gdp
    sent = []
    real_alltoallv = eng.comm.alltoallv  # (the process's one local communicator: patched for this test only)

    def counting(buf, counts, *a, **k):
        sent.append(buf.numel())
        return real_alltoallv(buf, counts, *a, **k)

    monkeypatch.setattr(eng.comm, "alltoallv", counting)
    eng.prepare("nfp", timing=True)
    lay = eng._nfp
    n, f = eng.host_feat.shape
    assert lay["timing"] and lay["cols"].shape == (n, f) and not lay["cols"].any()
    assert sent == [eng.num_owned]  # the in-degrees only
    eng.prepare("nfp", timing=True)
    assert eng._nfp is lay  # kept as it is for more timing
    eng.strategy = "nfp"
    timed = eng.batch(1, 0)
    assert not timed.feat.to_dense().any()
    eng.use_strategy("nfp")  # training: the real slices (one process: every column)
    assert not eng._nfp["timing"] and torch.equal(eng._nfp["cols"], eng.host_feat)
    real = eng.batch(1, 0)
    for a, b in zip(timed.graph.blocks, real.graph.blocks):
        assert torch.equal(a.csr.indptr, b.csr.indptr) and torch.equal(a.csr.indices, b.csr.indices)
    assert real.feat.to_dense().abs().sum() > 0


def _train_epoch(eng, model, opt, epoch, slow=None, after=None):
    """Every iteration of ``epoch`` (forward, backward, Adam); ``slow``: {strategy: seconds} slept after a batch of
    that strategy (a slower step); ``after``: called after the epoch ended (evaluation, say)."""
    import time

    iters = eng.iterations(epoch)
    _, sizes = eng.batch_sizes(epoch, iters)
    for it in range(iters):
        opt.zero_grad()
        batch = eng.batch(epoch, it)
        F.cross_entropy(model(batch.graph, batch.feat), batch.label, reduction="sum").div(sizes[it]).backward()
        opt.step()
        if slow and eng.strategy in slow:
            time.sleep(slow[eng.strategy])
    eng.end_epoch(epoch, 0.0, 0.0)
    if after is not None:
        after()


def test_auto_times_gdp_snp_dnp_on_trainings_first_iterations(graph_file, caplog):
    """plan_timing training: the plan is provisional until training's first iterations (an eighth of the epoch of
    GDP, a warm-up of each, then two rounds of two timed batches of GDP, SNP and DNP in turn, an eighth of the epoch
    of the fastest so far between them, across the epoch's end) have timed them; the next batch finalizes it
    (a step 0.2 s slower shows in that strategy's prediction, which then loses) and training goes on with the
    choice. The model trains exactly as with GDP all along (the same samples, equal gradients)."""
    import time

    with caplog.at_level(logging.INFO, logger="hpc_graph.engines.apt.dry_run"):
        eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, batch_size=10)
        ref = _apt(graph_file, "gdp", fanouts=(3, 2), batch_size=10)
        plan = eng.plan
        leader, picks = eng._leader, []
        eng._leader = lambda: picks.append(leader()) or picks[-1]
        assert eng.tuning and not plan.tuned and plan.timing == "training" and "provisional" in plan.table()
        assert "<- chosen" not in caplog.text
        # NFP was timed in the dry run; the iterations training times are not kept (they sample as training does)
        assert not any(k[0] == 1 and k[1] < 9 for k in eng._presampled)
        models, opts = [], []
        for _ in range(2):
            torch.manual_seed(4)
            models.append(build_model("sage", 7, 5, 3, num_layers=2, dropout=0.0).double())
            opts.append(torch.optim.Adam(models[-1].parameters(), lr=0.01))
        iters = eng.iterations(1)
        eighth = min(iters // 8, SETTLE)  # GDP untimed first, and the gap between the rounds
        timing = eighth + 3 + TUNE_ROUNDS * TUNE_PAIR * 3 + (TUNE_ROUNDS - 1) * eighth
        assert eighth >= 1 and iters < timing < 2 * iters  # the timing runs over the first epoch's end
        seen = []
        _train_epoch(eng, models[0], opts[0], 1, slow={"dnp": 0.2},
                     after=lambda: (seen.append(dict(eng._tune["iteration"])), time.sleep(1.5)))
        # the epoch's last step was recorded when it ended, not after the pause that followed
        last = eng._tune["order"][iters - 1][0]
        times = sum(1 for s, timed in eng._tune["order"][:iters] if timed and s == last)
        assert len(seen[0][last]) == times and seen[0][last][-1] < 1.0  # (DNP's steps sleep 0.2 s)
        _train_epoch(eng, models[0], opts[0], 2, slow={"dnp": 0.2})
        assert not eng.tuning and plan.tuned and eng.strategy == plan.choice != "dnp"
        assert eng.state_dict() == {"strategy": plan.choice}
        assert plan.costs["dnp"].seconds["compute"] >= 0.2 * iters
        assert plan.choice == min((s for s in plan.costs if plan.costs[s].fits), key=plan.predicted)
        assert "<- chosen" in caplog.text and "provisional" not in plan.table()
        assert eng.stats()["tuning_iterations"] == timing
        # the gap trained the strategy fastest in the first round (never the slowed DNP), chosen once
        assert len(picks) == (TUNE_ROUNDS - 1) * eighth and len(set(picks)) == 1 and picks[0] in ("gdp", "snp")
    for epoch in (1, 2):
        _train_epoch(ref, models[1], opts[1], epoch)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_nfp_leading_the_first_round_trains_for_real_from_the_gap_on(graph_file):
    """NFP, timed on lost work after the first round, leads it (GDP, SNP and DNP slowed by 0.15 s a step): its real
    column layout is made, the gap trains NFP (its first TUNE_PAIR iterations timed), as many NFP iterations after
    the last round are timed, no lost work times NFP again; the plan takes NFP's real iterations (build and step)
    and chooses it. The model trains exactly as with GDP all along."""
    slow = dict.fromkeys(("gdp", "snp", "dnp"), 0.15)  # well above a loaded machine's real step (~0.05 s)
    eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, batch_size=4)
    ref = _apt(graph_file, "gdp", fanouts=(3, 2), batch_size=4)
    assert eng.tuning and eng._tune["nfp"] and eng._nfp["timing"]
    order = eng._tune["order"]
    # the dry run's first-epoch batches are the ones right past the timing (at most TUNE_PAIR more with NFP leading)
    iters, tune = eng.iterations(1), len(order) + TUNE_PAIR
    assert sorted(i for e, i in eng._presampled if e == 1) == list(range(tune, min(tune + 1, iters)))
    leader, picks = eng._leader, []
    eng._leader = lambda: picks.append(leader()) or picks[-1]
    time_nfp, lost = eng._time_nfp, []
    eng._time_nfp = lambda: lost.append(1) or time_nfp()
    models, opts = [], []
    for _ in range(2):
        torch.manual_seed(4)
        models.append(build_model("sage", 7, 5, 3, num_layers=2, dropout=0.0).double())
        opts.append(torch.optim.Adam(models[-1].parameters(), lr=0.01))
    eighth = min(iters // 8, SETTLE)
    assert eighth >= TUNE_PAIR
    for epoch in (1, 2, 3):
        _train_epoch(eng, models[0], opts[0], epoch, slow=slow)
        _train_epoch(ref, models[1], opts[1], epoch)
    plan = eng.plan
    assert not eng.tuning and plan.tuned and picks == ["nfp"] and len(lost) == 1
    assert order.count(("nfp", True)) == TUNE_ROUNDS * TUNE_PAIR and not any(s == "*" for s, _ in order)
    assert order[-TUNE_PAIR:] == [("nfp", True)] * TUNE_PAIR
    assert (eng.stats()["tuning_iterations"] == len(order)
            == eighth + 3 + TUNE_ROUNDS * TUNE_PAIR * 3 + eighth + TUNE_PAIR)
    assert plan.choice == eng.strategy == "nfp" and not eng._nfp["timing"] and eng.layout_seconds > 0
    # GDP's prediction holds its slowed steps; NFP's (trained for real) does not
    assert plan.costs["gdp"].seconds["compute"] >= 0.15 * iters > plan.costs["nfp"].seconds["compute"]
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_choosing_a_strategy_stops_the_timing_and_a_cache_waits_for_the_choice(graph_file):
    """use_strategy during the timing stops it; with a cache, the timed batches run without it and the
    choice's hottest rows are cached once the plan is final (one process: no remote rows, so an empty cache
    both times: checked on more ranks in tests/mpi/scripts/apt_checks.py)."""
    eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4)
    eng.batch(1, 0)
    eng.use_strategy("snp")
    assert not eng.tuning and eng.strategy == "snp" and not eng.plan.tuned
    eng.batch(1, 1)
    assert eng.strategy == "snp"
    with pytest.raises(RuntimeError, match="nothing left to finalize"):
        _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, plan_timing="dry_run").plan.finalize({}, {})


def test_rounds_mean_is_the_mean_of_each_rounds_fastest():
    """A strategy's timed seconds: the fastest of each round's TUNE_PAIR batches, averaged over the rounds (against
    a naive loop on random times)."""
    rng = np.random.default_rng(3)
    for rounds in (1, 2, 3):
        xs = list(rng.random(rounds * TUNE_PAIR))
        want = sum(min(xs[r * TUNE_PAIR + j] for j in range(TUNE_PAIR)) for r in range(rounds)) / rounds
        assert _rounds_mean(xs) == pytest.approx(want, rel=1e-12)


def test_a_checkpoint_while_training_times_the_strategies_records_a_choice(graph_file):
    """A checkpoint cannot hold timings a resumed run would repeat: the state is the choice made from the
    iterations timed so far (the plan finalized then), and training goes on with it, as a run resumed from
    that checkpoint will."""
    eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, batch_size=10)
    assert eng.tuning
    assert eng.state_dict() == {"strategy": "gdp"} and not eng.tuning  # nothing timed yet: GDP goes on

    eng = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, batch_size=10)
    torch.manual_seed(4)
    model = build_model("sage", 7, 5, 3, num_layers=2, dropout=0.0).double()
    _train_epoch(eng, model, torch.optim.Adam(model.parameters(), lr=0.01), 1)
    assert eng.tuning and eng._tune["build"]  # some strategies timed, the timing not over
    timed = set(eng._tune["build"])
    state = eng.state_dict()
    assert not eng.tuning and eng.plan.tuned and state == {"strategy": eng.strategy}
    assert eng.strategy == eng.plan.choice
    assert eng.plan.choice in timed or eng.plan.choice == "nfp"
    other = _apt(graph_file, "auto", fanouts=(3, 2), dry_run_batches=4, batch_size=10)
    other.load_state_dict(state)  # a resumed run times nothing again
    assert not other.tuning and other.strategy == state["strategy"]
