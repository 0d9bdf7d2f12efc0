"""Threads per rank under ``mpiexec``: what a plain ``mpiexec -n R hpc-graph train`` decides and applies.

Behavioural checks (no timings): every rank's numba pool, numba and torch thread
counts equal the decided value; settings win in the documented order; a bad
value (on all ranks or on one) ends the job with one line naming the setting,
never a hang.
"""
from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from _run import _launcher, run_mpi

THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "HPC_GRAPH_EXPORTED_THREADS", "OMP_WAIT_POLICY")
NO_THREAD_VARS = {k: None for k in THREAD_VARS}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A small CSBM graph partitioned into 2 and 4 parts."""
    from hpc_graph.cli import main

    root = tmp_path_factory.mktemp("threads")
    graph = root / "g.h5"
    assert main(["-q", "generate", "csbm", "-o", str(graph), "--num-nodes", "600", "--feat-dim", "16"]) == 0
    out = {}
    for n in (2, 4):
        out[n] = root / f"parts-{n}"
        assert main(["-q", "partition", str(graph), "-o", str(out[n]), "-n", str(n)]) == 0
    return root, out


def _train(root, part_dir, n, *extra, env=None, check=True):
    run_dir = root / f"run-{n}-{abs(hash(extra + tuple(sorted((env or {}).items(), key=str)))) % 10**8}"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["-m", "hpc_graph.cli", "-q", "train", "--config", os.devnull, "--set", f"data.path={part_dir}",
            "--set", "engine.name=dp", "--set", "train.epochs=2", "--set", "train.progress=false",
            "--set", "model.hidden=8", "--run-dir", str(run_dir), *extra]
    proc = run_mpi(args, n, timeout=240, env={**NO_THREAD_VARS, **(env or {})}, check=check)
    if not check:
        return proc
    return json.loads((run_dir / "summary.json").read_text())["threads_per_rank"]


def _fair_share(n):
    """Unbound ranks (mpiexec's default) share this process's CPUs evenly; at least one thread each."""
    return max(1, len(os.sched_getaffinity(0)) // n)


@pytest.mark.parametrize("n", [4])  # 2 ranks: the other tests here
def test_plain_mpiexec_gives_every_rank_its_share(parts, n):
    root, dirs = parts
    ranks = _train(root, dirs[n], n)
    assert len(ranks) == n
    for r in ranks:
        assert r["source"] == "affinity"
        assert r["threads"] == _fair_share(n)
        assert r["numba"] == r["numba_pool"] == r["torch"] == r["threads"]
        assert r["node_ranks"] == n


def test_numba_variable_beats_omp_variable_on_every_rank(parts):
    root, dirs = parts
    for r in _train(root, dirs[2], 2, env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "2"}):
        assert (r["source"], r["threads"], r["numba"], r["torch"]) == ("NUMBA_NUM_THREADS", 1, 1, 1)


def test_config_beats_environment_and_flag_beats_config(parts):
    root, dirs = parts
    for r in _train(root, dirs[2], 2, "--set", "train.threads=2", env={"NUMBA_NUM_THREADS": "1"}):
        assert (r["source"], r["threads"], r["numba"], r["torch"]) == ("train.threads", 2, 2, 2)
        assert r["oversubscribed"] == (4 > len(os.sched_getaffinity(0)))
    for r in _train(root, dirs[2], 2, "--set", "train.threads=2", "--threads", "1"):
        assert (r["source"], r["threads"], r["numba"], r["torch"]) == ("--threads", 1, 1, 1)


BAD_SETTINGS = [
    (("--threads", "0"), {}, "--threads: must be a positive integer, got '0'"),
    (("--set", "train.threads=-2"), {}, "train.threads: must be a positive integer, got -2"),
    (("--set", "train.threads=1.5"), {}, "train.threads: must be a positive integer, got 1.5"),
    ((), {"NUMBA_NUM_THREADS": "abc"}, "NUMBA_NUM_THREADS: must be a positive integer, got 'abc'"),
    ((), {"OMP_NUM_THREADS": "-1"}, "OMP_NUM_THREADS: must be a positive integer, got '-1'"),
]


@pytest.fixture(scope="module")
def bad_jobs(parts):
    """``{named: CompletedProcess}``: every :data:`BAD_SETTINGS` job (2 ranks), all launched at once.

    Each job ends before its ranks import torch (mostly interpreter start-up and waiting on the launcher),
    so the jobs overlap well on the test box's cores; each keeps its own run directory and timeout."""
    root, dirs = parts
    with ThreadPoolExecutor(len(BAD_SETTINGS)) as pool:
        jobs = {named: pool.submit(_train, root, dirs[2], 2, *extra, env=env, check=False)
                for extra, env, named in BAD_SETTINGS}
        return {named: job.result() for named, job in jobs.items()}


@pytest.mark.parametrize("extra,env,named", BAD_SETTINGS)
def test_bad_thread_setting_ends_the_job_naming_it(bad_jobs, extra, env, named):
    proc = bad_jobs[named]
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr


def test_bad_thread_variable_on_one_rank_fails_every_rank_without_a_hang(parts):
    launcher = _launcher()
    if os.path.basename(launcher[0]) not in ("mpiexec", "mpiexec.hydra") or "--oversubscribe" in launcher:
        pytest.skip("MPMD with per-rank -env needs MPICH's Hydra mpiexec")  # the suite's launcher is Hydra
    root, dirs = parts
    import subprocess
    import sys

    from _run import REPO
    train = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", os.devnull,
             "--set", f"data.path={dirs[2]}", "--set", "engine.name=dp", "--set", "train.epochs=1",
             "--set", "train.progress=false", "--run-dir", str(root / "one-bad")]
    cmd = launcher + ["-n", "1", "-env", "NUMBA_NUM_THREADS", "zero", *train, ":", "-n", "1", *train]
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 2, proc.stderr
    assert "NUMBA_NUM_THREADS: must be a positive integer, got 'zero'" in proc.stderr
    assert "node-local rank 0: NUMBA_NUM_THREADS" in proc.stderr  # rank 1 names the rank that failed
