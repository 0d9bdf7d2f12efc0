"""Checkpoint/restart and preemption on 2 ranks (real MPI).

* ``scripts/restart.py``: for ``dp`` and ``sar``, a run stopped after epoch 3
  (the stop request reaches rank 1 only) and resumed ends with bitwise the same
  parameters and metric lines as an uninterrupted run; resumes with another
  hidden size or another partitioning are refused.
* ``hpc-graph train`` under ``mpiexec``: SIGUSR1 sent to rank 1's process only
  (pid from ``RUN_DIR/pids/rank1``) stops both ranks with exit status 75 and a
  checkpoint; ``--resume RUN_DIR`` finishes the run (metrics appended,
  ``metrics.jsonl`` merged); resuming it on one process is refused (rank count).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from _run import REPO, SCRIPTS, _command, run_mpi
from data_io.generators.csbm import write_csbm
from data_io.partitioner import partition_dataset
from hpc_graph.cli import main
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.signals import EXIT_PREEMPTED


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("restart")
    write_csbm(d / "g.h5", num_nodes=240, num_classes=3, avg_degree=5.0, feat_dim=10, seed=7)
    partition_dataset(d / "g.h5", d / "metis2", 2, method="metis")
    partition_dataset(d / "g.h5", d / "random2", 2, method="random")
    return d


@pytest.mark.timeout(240)
def test_resumed_run_equals_uninterrupted_run(data, tmp_path):
    proc = run_mpi([SCRIPTS / "restart.py", data / "metis2", data / "random2", tmp_path], 2, timeout=200)
    assert "restart: OK" in proc.stdout, proc.stdout
    for engine in ("dp", "sar", "sylvie", "minibatch"):
        assert f"restart[{engine}] rank 1: resumed run equals uninterrupted run" in proc.stdout


def _wait_for(pred, timeout, proc, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"job ended (status {proc.returncode}) before {what}\n{out}\n{err}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(240)
def test_sigusr1_to_one_rank_checkpoints_exits_75_and_resumes(data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"path": str(data / "metis2")}, "engine": {"name": "dp"},
        "model": {"name": "gcn", "hidden": 8}, "train": {"epochs": 100000, "eval_every": 5, "progress": False}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = _command(["-m", "hpc_graph.cli", "-q", "train", "--config", cfg, "--run-dir", run_dir], 2)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        pid_file = run_dir / "pids" / "rank1"
        metrics = run_dir / "metrics.rank1.jsonl"
        _wait_for(lambda: pid_file.exists() and metrics.exists() and metrics.read_text().count("\n") >= 1,
                  150, proc, "training to start")
        os.kill(int(pid_file.read_text()), signal.SIGUSR1)  # rank 1 only; rank 0 learns it from the all-reduce
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_PREEMPTED, (out, err)
    assert "preempted" in err and f"--resume {run_dir}" in err
    (epoch, path), = ckpt.list_checkpoints(run_dir)[-1:]
    assert 1 <= epoch < 100000 and ckpt.load_checkpoint(path)["world_size"] == 2
    for rank in (0, 1):  # both ranks stopped after the same epoch
        rows = (run_dir / f"metrics.rank{rank}.jsonl").read_text().splitlines()
        assert json.loads(rows[-1])["epoch"] == epoch
    assert not (run_dir / "pids" / "rank0").exists()

    final = epoch + 3
    proc = run_mpi(["-m", "hpc_graph.cli", "-q", "train", "--resume", run_dir, "--set", f"train.epochs={final}"],
                   2, timeout=150)
    assert proc.stdout.startswith("best val acc"), proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == final and summary["world_size"] == 2
    merged = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["rank"]) for r in merged] == [(e, r) for e in range(1, final + 1) for r in (0, 1)]
    assert [e for e, _ in ckpt.list_checkpoints(run_dir)] == [epoch, final]

    # the same run on one process is refused before training, naming the rank counts
    assert main(["-q", "train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "number of ranks: the checkpoint was written by 2 rank(s), this job has 1" in err, err
