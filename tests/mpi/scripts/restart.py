"""Run under ``mpiexec -n 2``: a run stopped at epoch k and resumed equals an uninterrupted run.

For ``dp``, ``sar``, ``sylvie`` (the shipped config's ``bits: auto`` and ``pipeline: adaptive``, a one-epoch
LDR window so that the bit policy's state matters, stale epochs after the resume) and ``minibatch`` (``hec``;
float64, dropout on, Adam + step schedule): an uninterrupted 6-epoch run; a run where only rank 1 asks to stop
during epoch 3 (both ranks must stop after epoch 3 with a checkpoint); that run resumed to the
end. Final parameters must be bitwise equal on every rank, and the metric lines
of epochs 4..6 equal except timings. Then resumes that must be refused: another
hidden size, another partition directory (same source, other partitioning). ``apt`` choosing its
strategy by timing (``auto``): a run resumed from the checkpoint of epoch 4 of a 6-epoch run ends with that
run's weights (two runs may time, and so choose, differently).

Usage: restart.py PART_DIR OTHER_PART_DIR WORKDIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hpc_graph.comm import get_communicator
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.config import ConfigError, config_from_dict
from hpc_graph.train.metrics import metrics_path
from hpc_graph.train.signals import Preempted
from hpc_graph.train.trainer import Trainer

TIMING = {"epoch_seconds", "compute_seconds", "comm_seconds", "eval_seconds", "peak_rss_mb", "engine_stats",
          "bytes_sent", "eval_bytes_sent"}
EPOCHS, STOP = 6, 3


ENGINE = {  # the shipped sylvie config's policy and pipeline (a one-epoch window, so that its state matters),
    # and an always-stale pipeline: the resumed epochs run on the checkpoint's halo rows
    "sylvie": {"bits": "auto", "pipeline": "adaptive", "ldr_window": 1, "ldr_smoothing": 0.3},
    "sylvie-on": {"bits": "auto", "pipeline": "on", "ldr_window": 1, "ldr_smoothing": 0.3},
    "apt": {"strategy": "auto", "dry_run_batches": 4},
}


def config(part_dir, label, run_dir, **model):
    engine = label.split("-")[0]
    extra = {}
    if engine == "minibatch":  # hec: pushes in flight between iterations, caches kept across epochs
        extra = {"hec": {"mode": "hec", "size": 256, "push_limit": 8}}
    if engine in ("minibatch", "apt"):
        extra["sampler"] = {"fanouts": [4, 3], "batch_size": 16}
    return config_from_dict({
        **extra,
        "data": {"path": str(part_dir)},
        "engine": {"name": engine, **ENGINE.get(label, {})},
        "model": {"name": "sage", "hidden": 8, "dropout": 0.5, **model},
        "optim": {"lr": 0.05, "schedule": "step", "step_size": 2, "gamma": 0.8},
        "train": {"epochs": EPOCHS, "seed": 1, "dtype": "float64", "progress": False, "eval_every": 2,
                  "checkpoint_every": 2, "run_dir": str(run_dir)}})


def lines(run_dir, rank):
    rows = [json.loads(x) for x in metrics_path(run_dir, rank).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def expect_refused(make, needle):
    try:
        make()
    except ConfigError as exc:
        assert needle in str(exc), (needle, str(exc))
        return
    raise AssertionError(f"resume was not refused ({needle})")


def main() -> int:
    part, other, work = map(Path, sys.argv[1:4])
    comm = get_communicator()
    rank = comm.rank
    for engine in ("dp", "sar", "sylvie", "sylvie-on", "minibatch"):
        full = Trainer(config(part, engine, work / engine / "full"), comm)
        full.fit()

        stopped = Trainer(config(part, engine, work / engine / "part"), comm)
        step = stopped.step

        def step_and_ask(step=step, t=stopped):
            if rank == 1 and t.epoch + 1 == STOP:  # the "signal" reaches rank 1 only
                t.request_stop()
            return step()
        stopped.step = step_and_ask
        try:
            stopped.fit()
            raise AssertionError("no Preempted")
        except Preempted as exc:
            assert exc.epoch == STOP, exc
        assert [e for e, _ in ckpt.list_checkpoints(work / engine / "part")] == [2, 3]

        resumed = Trainer(config(part, engine, "unused"), comm, resume=work / engine / "part")
        assert resumed.epoch == STOP
        resumed.fit()
        for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
            assert torch.equal(p, q), (engine, rank, name, (p - q).abs().max().item())
        a, b = lines(work / engine / "full", rank), lines(work / engine / "part", rank)
        assert [r["epoch"] for r in b] == list(range(1, EPOCHS + 1))
        assert a == b, (engine, rank, a, b)
        if engine == "sylvie-on":  # the resumed epochs ran on the checkpoint's stale halo rows
            assert any(h["mode"] == "async" for h in resumed.engine.history), resumed.engine.history
        print(f"restart[{engine}] rank {rank}: resumed run equals uninterrupted run", flush=True)

    # apt choosing its strategy by timing training's first iterations: two runs may choose differently, but a run
    # resumed from a checkpoint continues exactly as the run that wrote it (the choice is recorded)
    full = Trainer(config(part, "apt", work / "apt" / "full"), comm)
    full.fit()
    comm.barrier()
    mid = work / "apt" / "mid"
    if rank == 0:
        import shutil

        shutil.copytree(work / "apt" / "full", mid)
        (mid / "checkpoints" / f"ckpt-{EPOCHS}.pt").unlink()  # the newest left: epoch EPOCHS - 2
    comm.barrier()
    resumed = Trainer(config(part, "apt", "unused"), comm, resume=mid)
    assert resumed.epoch == EPOCHS - 2 and not resumed.engine.tuning
    resumed.fit()
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), ("apt", rank, name, (p - q).abs().max().item())
    print(f"restart[apt] rank {rank}: run resumed from a checkpoint equals the run that wrote it", flush=True)

    run = work / "dp" / "part"
    expect_refused(lambda: Trainer(config(part, "dp", run, hidden=16), comm, resume=run),
                   "model.hidden: 8 in the checkpoint, 16 now")
    expect_refused(lambda: Trainer(config(other, "dp", run), comm, resume=run),
                   "data.path: different partition directory")
    comm.barrier()
    if rank == 0:
        print("restart: OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run

    run(main)
