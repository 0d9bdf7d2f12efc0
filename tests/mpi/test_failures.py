"""Failure behaviour of ``hpc-graph train`` under mpiexec: nothing hangs, the log names rank and reason.

* ``HPC_GRAPH_DEBUG_FAIL`` makes one rank raise (rank 2 of 4) or exit abruptly (rank 1 of 2) in
  epoch 1: mpiexec must return non-zero within 30 s of training starting, the log naming the rank
  (one launch per kind; between them they cover 2 and 4 ranks);
* a NaN loss on rank 1 of 2 stops every rank (exit 1) naming the epoch and rank 1;
* inputs checked before training, each a one-line error and exit status 2 on
  every rank: a part file missing for one rank (names it and the rank), a rank
  count that does not match the partitions, an unreadable dataset file.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
import yaml

from _run import REPO, _command, run_mpi
from data_io.generators.csbm import write_csbm
from data_io.partitioner import partition_dataset
from hpc_graph.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("failures")
    write_csbm(d / "g.h5", num_nodes=240, num_classes=3, avg_degree=5.0, feat_dim=10, seed=2)
    partition_dataset(d / "g.h5", d / "p2", 2, method="random")
    partition_dataset(d / "g.h5", d / "p4", 4, method="random")
    cfg = d / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": str(d / "p2")}, "engine": {"name": "dp"},
                                   "model": {"name": "gcn", "hidden": 8},
                                   "train": {"epochs": 50, "progress": False}}))
    return d


def _train(data, run_dir, *args):
    return ["-m", "hpc_graph.cli", "-q", "train", "--config", data / "cfg.yaml", "--run-dir", run_dir, *args]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kind,nprocs,rank", [("exception", 4, 2), ("exit", 2, 1)])
def test_failure_on_one_rank_ends_the_job_quickly(data, tmp_path, kind, nprocs, rank):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "HPC_GRAPH_DEBUG_FAIL": f"rank={rank},epoch=1,kind={kind}",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = _command(_train(data, run_dir, "--set", f"data.path={data / f'p{nprocs}'}"), nprocs)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    first_start = []

    def started():
        """Wall time the first rank entered the training loop (its pid file), or None. Remembered once
        seen: a rank removes its pid file when it leaves the loop, the failing rank even while we look."""
        if not first_start:
            pids = run_dir / "pids"
            times = []
            for entry in (pids.iterdir() if pids.is_dir() else ()):
                try:
                    times.append(entry.stat().st_mtime)
                except FileNotFoundError:  # removed between listing and stat
                    pass
            if times:
                first_start.append(min(times))
        return first_start[0] if first_start else None

    try:
        deadline = time.time() + 150
        while proc.poll() is None and time.time() < deadline:
            if started() is not None and time.time() - started() > 30:
                break
            time.sleep(0.05)
        ended = time.time()
        assert proc.poll() is not None, "job still running 30 s after training started (or never started)"
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert started() is not None, err
    assert proc.returncode != 0
    assert ended - started() < 30
    assert f"rank {rank}: " in err and f"injected failure in epoch 1 (HPC_GRAPH_DEBUG_FAIL={kind})" in err, err


@pytest.mark.timeout(200)
def test_nan_loss_on_one_rank_stops_every_rank(data, tmp_path):
    proc = run_mpi(_train(data, tmp_path / "run", "--set", "train.epochs=5"), 2, timeout=150, check=False,
                   env={"HPC_GRAPH_DEBUG_FAIL": "rank=1,epoch=2,kind=nan"})
    assert proc.returncode == 3, (proc.stdout, proc.stderr)  # diverged
    assert "non-finite loss in epoch 2 on rank 1 (train.on_nonfinite: stop" in proc.stderr, proc.stderr


@pytest.mark.timeout(200)
def test_part_file_missing_on_one_rank(data, tmp_path):
    broken = tmp_path / "p2"
    shutil.copytree(data / "p2", broken)
    (broken / "part-00001.h5").unlink()
    proc = run_mpi(_train(data, tmp_path / "run", "--set", f"data.path={broken}"), 2, timeout=150, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("hpc-graph train: error: ")]
    assert len(lines) == 2, proc.stderr  # every rank: one line
    assert all("part-00001.h5" in x for x in lines) and any(x.count("rank 1") for x in lines), lines
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(200)
def test_rank_count_mismatch(data, tmp_path):
    proc = run_mpi(_train(data, tmp_path / "run"), 3, timeout=150, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"{data / 'p2'}: partitioned into 2 parts but the job runs 3 ranks" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_unreadable_dataset_file(data, tmp_path, capsys):
    bad = tmp_path / "bad.h5"
    bad.write_bytes((data / "g.h5").read_bytes()[:2000])  # truncated copy
    rc = main(["train", "--config", str(data / "cfg.yaml"), "--set", f"data.path={bad}",
               "--set", "engine.name=single", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("hpc-graph train: error: ") and str(bad) in err and "\n" not in err, err
