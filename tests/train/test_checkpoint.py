"""Checkpoints, resume, preemption and non-finite losses on one process (single engine).

Multi-rank resume/preemption is in tests/mpi/test_restart.py, failures in tests/mpi/test_failures.py.
"""
import json
import logging
import os
import signal

import pytest
import torch

from data_io.generators.csbm import write_csbm
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.config import ConfigError, config_from_dict
from hpc_graph.train.metrics import MERGED_METRICS, metrics_path
from hpc_graph.train.signals import EXIT_PREEMPTED, Preempted, StopSignal
from hpc_graph.train.trainer import NonFiniteLossError, Trainer

TIMING = {"epoch_seconds", "compute_seconds", "comm_seconds", "eval_seconds", "peak_rss_mb", "engine_stats"}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    a, b = d / "a.h5", d / "b.h5"
    write_csbm(a, num_nodes=200, num_classes=3, avg_degree=5.0, feat_dim=10, seed=4)
    write_csbm(b, num_nodes=200, num_classes=3, avg_degree=5.0, feat_dim=10, seed=5)
    return str(a), str(b)


def _config(path, run_dir, **train):
    return config_from_dict({
        "data": {"path": path},
        "model": {"name": "gcn", "hidden": 8, "dropout": 0.5},
        "optim": {"lr": 0.05, "schedule": "step", "step_size": 2, "gamma": 0.9},
        "train": {"epochs": 7, "seed": 3, "dtype": "float64", "progress": False, "eval_every": 2,
                  "run_dir": str(run_dir), **train},
    })


def _stop_at(trainer, epoch):
    """Make ``trainer`` receive a real SIGUSR1 during epoch ``epoch``."""
    step = trainer.step

    def wrapped():
        if trainer.epoch + 1 == epoch:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step()
    trainer.step = wrapped


def _lines(run_dir):
    rows = [json.loads(x) for x in metrics_path(run_dir, 0).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_save_load_keep_two_and_fall_back_on_corruption(tmp_path, caplog):
    for epoch in (2, 4, 6):
        ckpt.save_checkpoint(tmp_path, epoch, {"epoch": epoch, "w": torch.full((3,), float(epoch)),
                                               "rng": (3, (1, 2), None)})
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path)] == [4, 6]
    assert not [p for p in ckpt.checkpoint_dir(tmp_path).iterdir() if "tmp" in p.name]
    state = ckpt.load_checkpoint(ckpt.checkpoint_path(tmp_path, 6))
    assert state["epoch"] == 6 and torch.equal(state["w"], torch.full((3,), 6.0))

    newest = ckpt.checkpoint_path(tmp_path, 6)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated by a crash
    with caplog.at_level(logging.WARNING):
        path, state = ckpt.latest_checkpoint(tmp_path)
    assert path == ckpt.checkpoint_path(tmp_path, 4) and state["epoch"] == 4
    assert "ckpt-6.pt" in caplog.text

    # a readable file whose payload does not match its digest
    env = torch.load(ckpt.checkpoint_path(tmp_path, 4), weights_only=True)
    env["payload"] = env["payload"][:-1] + bytes([env["payload"][-1] ^ 1])
    torch.save(env, ckpt.checkpoint_path(tmp_path, 4))
    with pytest.raises(ckpt.CheckpointError, match="ckpt-4.pt: payload does not match its sha256"):
        ckpt.load_checkpoint(ckpt.checkpoint_path(tmp_path, 4))
    with pytest.raises(ckpt.CheckpointError, match="no usable checkpoint"):
        ckpt.latest_checkpoint(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint to resume from"):
        ckpt.latest_checkpoint(tmp_path / "elsewhere")


def test_preempt_and_resume_equals_uninterrupted_run(graphs, tmp_path):
    full = Trainer(_config(graphs[0], tmp_path / "full", checkpoint_every=3))
    summary_full = full.fit()
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path / "full")] == [6, 7]

    part = Trainer(_config(graphs[0], tmp_path / "part", checkpoint_every=3))
    _stop_at(part, 4)
    with pytest.raises(Preempted) as info:
        part.fit()
    assert info.value.epoch == 4 and info.value.signal_name == "SIGUSR1" and EXIT_PREEMPTED == 75
    assert info.value.checkpoint == ckpt.checkpoint_path(tmp_path / "part", 4)
    assert [e for e, _ in ckpt.list_checkpoints(tmp_path / "part")] == [3, 4]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored
    assert not (tmp_path / "part" / MERGED_METRICS).exists()
    # a later crash would have left lines after the checkpoint: they are dropped on resume
    with open(metrics_path(tmp_path / "part", 0), "a") as fh:
        fh.write(json.dumps({"rank": 0, "epoch": 5, "loss": 123.0}) + "\n")

    resumed = Trainer(_config(graphs[0], tmp_path / "ignored"), resume=tmp_path / "part")
    assert resumed.epoch == 4 and resumed.run_dir == tmp_path / "part"
    summary = resumed.fit()
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    assert _lines(tmp_path / "part") == _lines(tmp_path / "full")
    for key in ("best_val_acc", "test_acc", "best_epoch", "final", "epochs"):
        assert summary[key] == summary_full[key], key
    merged = [json.loads(x) for x in (tmp_path / "part" / MERGED_METRICS).read_text().splitlines()]
    assert [r["epoch"] for r in merged] == list(range(1, 8))
    assert not (tmp_path / "ignored").exists()


def test_resume_refuses_a_different_run(graphs, tmp_path):
    Trainer(_config(graphs[0], tmp_path / "run", epochs=2)).fit()
    with pytest.raises(ConfigError, match=r"model.hidden: 8 in the checkpoint, 16 now"):
        cfg = _config(graphs[0], tmp_path / "run")
        cfg.model.hidden = 16
        Trainer(cfg, resume=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data.path: different dataset file \(sha256 "):
        Trainer(_config(graphs[1], tmp_path / "run"), resume=tmp_path / "run")
    # allowed differences: more epochs, other eval/checkpoint settings
    t = Trainer(_config(graphs[0], tmp_path / "run", epochs=3, eval_every=1, checkpoint_every=1),
                resume=tmp_path / "run")
    assert t.epoch == 2 and t.fit()["epochs"] == 3
    assert ckpt.checkpoint_config(tmp_path / "run", ["train.epochs=9"]).train.epochs == 9


def test_stored_shapes_are_checked(graphs, tmp_path):
    t = Trainer(_config(graphs[0], tmp_path / "run", epochs=1))
    t.fit()
    path, state = ckpt.latest_checkpoint(tmp_path / "run")
    state["param_shapes"] = {**state["param_shapes"], "convs.0.lin.weight": [99, 10]}
    path.unlink()
    ckpt.save_checkpoint(tmp_path / "run", 1, state)
    with pytest.raises(ConfigError, match=r"shape \(99, 10\) in the checkpoint"):
        Trainer(_config(graphs[0], tmp_path / "run"), resume=tmp_path / "run")


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nonfinite_loss(graphs, tmp_path, monkeypatch, caplog, policy):
    monkeypatch.setenv("HPC_GRAPH_DEBUG_FAIL", "rank=0,epoch=2,kind=nan")
    t = Trainer(_config(graphs[0], tmp_path, on_nonfinite=policy))
    t.step()
    before = [p.detach().clone() for p in t.model.parameters()]
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match="non-finite loss in epoch 2 on rank 0"):
            t.step()
        return
    with caplog.at_level(logging.WARNING):
        loss = t.step()
    assert loss != loss and "optimiser step skipped" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    t.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))


def test_debug_failure_variable(graphs, tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_GRAPH_DEBUG_FAIL", "rank=0,epoch=2,kind=exception")
    t = Trainer(_config(graphs[0], tmp_path))
    t.step()
    with pytest.raises(RuntimeError, match="rank 0: injected failure in epoch 2"):
        t.step()
    monkeypatch.setenv("HPC_GRAPH_DEBUG_FAIL", "rank=0,when=2")
    with pytest.raises(ConfigError, match="HPC_GRAPH_DEBUG_FAIL: expected rank=R"):
        Trainer(_config(graphs[0], tmp_path))


def test_stop_signal_records_and_restores():
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested and stop.name is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.name == "SIGTERM"  # the first one is kept
    assert signal.getsignal(signal.SIGTERM) == previous


def test_second_ctrl_c_interrupts():
    previous = signal.getsignal(signal.SIGINT)  # Python's default handler; ignored in a shell's background job
    with StopSignal((signal.SIGINT,)) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is previous


def test_config_problems_fill_fields_a_checkpoint_predates_with_defaults():
    from hpc_graph.train.config import Config, config_to_dict
    defaults = config_to_dict(Config())
    current = config_to_dict(Config())
    old = {k: v for k, v in config_to_dict(Config()).items() if k != "recipes"}  # written before `recipes`
    del old["model"]["num_bases"]
    assert ckpt.config_problems(old, current, defaults=defaults) == []
    current["recipes"]["label_aug"] = 0.5  # changes what is trained: refused
    assert ckpt.config_problems(old, current, defaults=defaults) == [
        "recipes.label_aug: 0.0 in the checkpoint, 0.5 now"]
    # without defaults the missing section is a difference
    assert "recipes.label_aug: None in the checkpoint, 0.5 now" in ckpt.config_problems(old, current)


def test_correct_and_smooth_settings_may_change_on_resume():
    from hpc_graph.train.config import Config, config_to_dict
    saved, current = config_to_dict(Config()), config_to_dict(Config())
    current["recipes"].update(correct_smooth=True, cs_smooth_alpha=0.7, cs_correct_layers=10)
    assert ckpt.config_problems(saved, current) == []


def test_a_blown_up_loss_stops_the_run_naming_epoch_and_loss(graphs, tmp_path):
    from hpc_graph.train.loops import DivergedError

    cfg = _config(graphs[0], tmp_path / "lr", diverge_factor=50.0)
    cfg.optim.lr, cfg.optim.schedule = 1e6, "none"  # Adam at lr 1e6: the logits explode after the first step
    t = Trainer(cfg)
    first = t.step()
    with pytest.raises(DivergedError, match=r"^diverged: epoch \d+: loss \S+ is more than 50x the first step's"):
        for _ in range(5):
            assert t.step() <= 50 * first
    calm = Trainer(_config(graphs[0], tmp_path / "calm", diverge_factor=50.0))
    for _ in range(7):  # a run that learns never comes near the factor
        calm.step()


def test_a_streak_of_skipped_steps_stops_the_run(graphs, tmp_path, monkeypatch):
    from hpc_graph.train.loops import DivergedError, DivergenceWatch

    watch = DivergenceWatch(factor=0.0, streak=3)
    for epoch, ok in enumerate((True, False, False, True, False, False), start=1):  # a finite step resets it
        watch.update(epoch, 1.0 if ok else float("nan"), ok)
    with pytest.raises(DivergedError, match="epoch 7: 3 optimiser steps in a row skipped"):
        watch.update(7, float("nan"), False)
    off = DivergenceWatch(factor=0.0, streak=0)
    for epoch in range(1, 50):
        off.update(epoch, 1e30 * epoch, epoch % 2 == 0)


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_exit_2(graphs, tmp_path, monkeypatch, capsys):
    import errno
    import io

    import yaml

    from hpc_graph.cli import main

    class FullDisk(io.BytesIO):  # the file system takes the first 100 bytes, then has no room left
        def __init__(self, path):
            super().__init__()
            self.path = path
            open(path, "wb").close()

        def write(self, data):
            if self.tell() + len(data) > 100:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
            return super().write(data)

        def fileno(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(ckpt, "open", lambda path, mode="r": FullDisk(path), raising=False)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": graphs[0]}, "model": {"name": "gcn", "hidden": 8},
                                   "train": {"epochs": 3, "checkpoint_every": 1, "progress": False}}))
    rc = main(["-q", "train", "--config", str(cfg), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("hpc-graph train: error: ") and err.endswith("ckpt-1.pt: write failed: disk full"), err
    assert "\n" not in err
    assert not list((tmp_path / "run" / "checkpoints").iterdir())  # no half-written checkpoint left


def test_the_cli_leaves_no_startup_signal_handler_behind(graphs, tmp_path):
    from hpc_graph.cli import main

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    assert main(["-q", "train", "--config", "/nonexistent.yaml"]) == 2
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_sampled_run_blown_up_within_its_first_epoch_is_stopped(graphs, tmp_path):
    """A sampled epoch takes many optimiser steps: Adam at lr 1e6 blows the model up inside the first, so the
    reference is the first step's loss (the untrained model's), not the first epoch's."""
    from hpc_graph.train.loops import DivergedError

    cfg = config_from_dict({
        "data": {"path": graphs[0]}, "engine": {"name": "minibatch"},
        "sampler": {"fanouts": [4, 4], "batch_size": 16},
        "model": {"name": "sage", "hidden": 8, "dropout": 0.0},
        "optim": {"lr": 1e6},
        "train": {"epochs": 6, "seed": 3, "progress": False, "run_dir": str(tmp_path / "run")}})
    t = Trainer(cfg)
    with pytest.raises(DivergedError, match=r"^diverged: epoch 1: loss \S+ is more than 1000x the first step's"):
        for _ in range(6):
            t.step()
