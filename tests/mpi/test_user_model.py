"""A model of one's own on 2 ranks (real MPI): through ``Trainer(config, model=...)`` on ``dp`` and ``sar``
(scripts/user_model_checks.py) and through ``mpiexec -n 2 hpc-graph train --model module:Factory``, the numbers of
one process in float64 with dropout on."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from _run import REPO, SCRIPTS, run_mpi

PLUGINS = REPO / "tests" / "plugins"


@pytest.mark.timeout(300)
def test_user_model_through_the_trainer_matches_single(tmp_path):
    proc = run_mpi([SCRIPTS / "user_model_checks.py", tmp_path / "work"], 2, timeout=280)
    assert "user_model_checks: 2 ranks, 4 cases OK" in proc.stdout, proc.stdout


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["epoch"]) if r["rank"] == 0]


@pytest.mark.timeout(300)
def test_cli_model_option_on_two_ranks_matches_one_process(tmp_path):
    import subprocess

    from data_io.converters.npz import convert_npz
    from data_io.partitioner import partition_dataset

    data, parts = tmp_path / "cora.h5", tmp_path / "cora-2"
    convert_npz(REPO / "tests" / "data" / "cora.npz", data)
    partition_dataset(data, parts, 2, "metis", seed=0)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name: gcn, hidden: 16, dropout: 0.5}\noptim: {lr: 0.05}\n"
                   "train: {epochs: 4, dtype: float64, seed: 3, progress: false}\n")
    cli = ["-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--model", "user_model:MeanSAGE"]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS)])}
    one = subprocess.run([sys.executable, *cli, "--set", f"data.path={data}", "--run-dir", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=200, env={**os.environ, **env})
    assert one.returncode == 0, one.stderr[-3000:]
    run_mpi([sys.executable, *cli, "--set", f"data.path={parts}", "--set", "engine.name=sar", "--run-dir",
             str(tmp_path / "two")], 2, timeout=250, env=env)
    want, got = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(got) == len(want) == 4
    assert all(abs(g - w) <= 1e-10 * max(1.0, abs(w)) for g, w in zip(got, want)), (got, want)


@pytest.mark.timeout(300)
def test_custom_loop_example_reproduces_the_trainer_bit_for_bit(tmp_path):
    proc = run_mpi([SCRIPTS / "custom_loop_checks.py", tmp_path / "work"], 2, timeout=280)
    assert "custom_loop_checks: 2 ranks OK" in proc.stdout, proc.stdout
