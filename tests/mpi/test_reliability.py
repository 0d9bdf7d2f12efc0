"""Faults injected for real into 2-rank jobs of ``hpc-graph train``: each ends with its documented exit status
and a line naming the cause, never a traceback or a hang.

* a flipped byte in a feature chunk of one rank's part file (the value decodes finite; only the Fletcher32
  checksum tells): exit 2, the part file and field named, no run folder;
* NaN features in one rank's part: exit 2, file, field and row named;
* a damaged dataset file that every rank reads (``flow``): exit 2;
* a rank stopped with SIGSTOP mid-training: the stall watchdog (``comm.timeout``) ends the job within the
  timeout and a few seconds, naming the waiting rank and the operation;
* SIGTERM to every process while the job is still starting: exit 75 and one line, nothing to resume from;
  also when it arrives at the console script's first line, before the command is known (the CLI holds it for
  ``train``; any other command is ended by it as without the hold);
* a run folder that is a file: exit 2 before anything is loaded, the file untouched;
* a SIGTERM while a finished rank tears its interpreter down (where Python has given the signal its default
  action back): the job still exits with the status it finished with.

The full-disk case is tested on one process (tests/train/test_checkpoint.py); the fault matrix
(benchmarks/fault_matrix.py) runs every case on every engine, a full tmpfs included.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import yaml

from _run import _command, run_mpi, REPO, SCRIPTS
from data_io.generators.csbm import write_csbm
from data_io.partitioner import partition_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("reliability")
    write_csbm(d / "g.h5", num_nodes=240, num_classes=3, avg_degree=5.0, feat_dim=10, seed=3)
    partition_dataset(d / "g.h5", d / "p2", 2, method="random")
    return d


def _config(data, tmp_path, engine, path, **train):
    cfg = tmp_path / "cfg.yaml"
    sampled = {"sampler": {"fanouts": [4, 4], "batch_size": 16}} if engine == "minibatch" else {}
    cfg.write_text(yaml.safe_dump({"data": {"path": str(path)}, "engine": {"name": engine},
                                   "model": {"name": "gcn", "hidden": 8},
                                   "train": {"epochs": 20, "progress": False, **train}, **sampled}))
    return ["-m", "hpc_graph.cli", "-q", "train", "--config", cfg, "--run-dir", tmp_path / "run"]


def _flip_low_byte_of_a_feature(path):
    """Flip the lowest byte of one float32 inside the first chunk of /node/feat: the value stays finite."""
    with h5py.File(path, "r") as f:
        off = f["node/feat"].id.get_chunk_info(0).byte_offset + 4 * 3
    with open(path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x01]))


def _one_line_error(proc, *needles):
    """The error is one line, printed once (also when every rank meets it), and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sum(all(n in line for n in needles) for line in proc.stderr.splitlines()) == 1, proc.stderr


def _nan_at_row_5(path):
    with h5py.File(path, "r+") as f:
        f["node/feat"][5, 2] = np.nan


@pytest.mark.timeout(200)
@pytest.mark.parametrize("engine,rank,damage,says", [
    ("sar", 1, _flip_low_byte_of_a_feature, "/node/feat: unreadable"),
    ("minibatch", 0, _nan_at_row_5, "/node/feat: NaN or Inf in row 5 "),
])
def test_damaged_features_in_one_part_exit_2_naming_file_and_field(data, tmp_path, engine, rank, damage, says):
    parts = tmp_path / "p2"
    shutil.copytree(data / "p2", parts)
    damage(parts / f"part-0000{rank}.h5")
    proc = run_mpi(_config(data, tmp_path, engine, parts), 2, timeout=150, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    _one_line_error(proc, f"rank {rank}", f"part-0000{rank}.h5: {says}")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(200)
def test_a_damaged_dataset_file_read_by_every_rank_exits_2(data, tmp_path):
    g = tmp_path / "g.h5"
    shutil.copy(data / "g.h5", g)
    _flip_low_byte_of_a_feature(g)
    proc = run_mpi(_config(data, tmp_path, "flow", g), 2, timeout=150, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    _one_line_error(proc, "g.h5: /node/feat: unreadable")


def _popen(args, nprocs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.Popen(_command(args, nprocs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


@pytest.mark.timeout(200)
def test_a_stopped_rank_ends_the_job_within_the_timeout(data, tmp_path):
    timeout = 4.0
    proc = _popen(_config(data, tmp_path, "dp", data / "p2", epochs=100000) + ["--set", f"comm.timeout={timeout}"],
                  2)
    pid_file = tmp_path / "run" / "pids" / "rank1"
    try:
        deadline = time.time() + 150
        while not pid_file.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert pid_file.is_file(), proc.communicate()
        time.sleep(0.5)  # in the training loop
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)  # a frozen node: no error, no exit, no progress
        stopped = time.time()
        out, err = proc.communicate(timeout=60)
        ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # the stopped rank must not outlive the job
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1, (out, err)
    assert timeout <= ended - stopped < timeout + 15, (ended - stopped, err)
    assert "rank 0: " in err and "made no progress for" in err and "comm.timeout" in err, err


def _both_ranks_catch_sigterm(proc) -> bool:
    """Whether both ranks of the job ``proc`` launched have a handler for SIGTERM and SIGUSR1 installed (the
    kernel's caught-signals mask, /proc/PID/status)."""
    import psutil

    try:
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if "hpc_graph.cli" in p.cmdline()]
        masks = []
        for p in ranks:
            with open(f"/proc/{p.pid}/status") as fh:
                masks += [int(x.split()[1], 16) for x in fh if x.startswith("SigCgt:")]
    except (psutil.Error, OSError):
        return False
    want = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGUSR1 - 1))
    return len(masks) == 2 and all(m & want == want for m in masks)


@pytest.mark.timeout(200)
def test_sigterm_while_starting_exits_75_with_one_line(data, tmp_path):
    proc = _popen(_config(data, tmp_path, "sar", data / "p2"), 2)
    try:
        deadline = time.time() + 60
        while not _both_ranks_catch_sigterm(proc) and time.time() < deadline:  # then torch loads, for seconds
            time.sleep(0.01)
        assert proc.poll() is None and not (tmp_path / "run" / "pids").exists()  # not training yet
        os.killpg(proc.pid, signal.SIGTERM)  # as a batch system does: every process of the job
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, (out, err)
    lines = [x for x in err.splitlines() if "preempted by SIGTERM before training started" in x]
    assert len(lines) == 1, err
    assert not (tmp_path / "run" / "checkpoints").exists()


#: the console script with a SIGTERM to its own process between its first line and the command's start
_SIGTERM_AT_FIRST_LINE = """
import os, signal, sys
from hpc_graph import cli
sys.argv = ["hpc-graph"] + sys.argv[1:]
start = cli.main
cli.main = lambda argv=None: (os.kill(os.getpid(), signal.SIGTERM), start(argv))[1]
cli.run()
"""


@pytest.mark.timeout(200)
@pytest.mark.parametrize("ranks", [1, 2])
def test_sigterm_at_the_first_line_of_train_exits_75_with_one_line(data, tmp_path, ranks):
    argv = [str(a) for a in _config(data, tmp_path, "sar" if ranks > 1 else "single",
                                    data / ("p2" if ranks > 1 else "g.h5"))[2:]]
    cmd = _command(["-c", _SIGTERM_AT_FIRST_LINE, *argv], ranks) if ranks > 1 else \
        [sys.executable, "-c", _SIGTERM_AT_FIRST_LINE, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 75, (proc.stdout, proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if "preempted by SIGTERM before training started" in x]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_sigterm_at_the_first_line_of_another_command_ends_it_by_the_signal(data):
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_AT_FIRST_LINE, "info",
                           str(data / "g.h5")], capture_output=True, text=True, timeout=150, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGTERM, (proc.stdout, proc.stderr)
    assert proc.stdout == ""  # ended before the command ran


@pytest.mark.timeout(120)
def test_sigterm_during_a_finished_ranks_teardown_keeps_its_exit_status():
    proc = subprocess.run(_command([SCRIPTS / "stop_in_teardown.py"], 2), capture_output=True, text=True,
                          timeout=100, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.timeout(200)
def test_a_run_folder_that_is_a_file_exits_2_before_loading(data, tmp_path):
    (tmp_path / "run").write_text("a file\n")
    proc = run_mpi(_config(data, tmp_path, "sar", data / "p2"), 2, timeout=150, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    _one_line_error(proc, "hpc-graph train: error: train.run_dir: ", "is a file, not a directory")
    assert (tmp_path / "run").read_text() == "a file\n"
