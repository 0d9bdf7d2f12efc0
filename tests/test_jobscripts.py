"""Job scripts: every file in jobscripts/ is valid bash and shellcheck-clean; local.sh runs (and resumes) a tiny job."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from data_io.generators.csbm import write_csbm
from data_io.partitioner import partition_dataset

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (REPO / "jobscripts").iterdir() if p.is_file())


def test_there_are_job_scripts():
    names = {p.name for p in SCRIPTS}
    assert "local.sh" in names and any(n.endswith(".sbatch") for n in names) and any(n.endswith(".pbs") for n in names)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    proc = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(300)
def test_local_sh_runs_and_resumes_a_tiny_job(tmp_path):
    write_csbm(tmp_path / "g.h5", num_nodes=120, num_classes=3, avg_degree=4.0, feat_dim=6, seed=0)
    partition_dataset(tmp_path / "g.h5", tmp_path / "parts", 2, method="random")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": str(tmp_path / "parts")}, "engine": {"name": "dp"},
                                   "model": {"name": "gcn", "hidden": 4}, "train": {"progress": False}}))
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def local(epochs):
        return subprocess.run(["bash", str(REPO / "jobscripts" / "local.sh"), "2", str(cfg), str(run_dir),
                               "--set", f"train.epochs={epochs}"], capture_output=True, text=True, env=env,
                              timeout=240, cwd=tmp_path)

    # what a job killed while writing its first checkpoint leaves: no checkpoint, a temporary file, a pid file
    orphan = run_dir / "checkpoints" / ".ckpt-1.pt.tmp-99999999"  # above any pid_max: not running
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"partial")
    (run_dir / "pids").mkdir()
    (run_dir / "pids" / "rank7").write_text("4194303\n")
    first = local(2)  # --resume-if-possible: nothing to resume, a fresh start
    assert first.returncode == 0, first.stdout + first.stderr
    assert not orphan.exists() and not (run_dir / "pids" / "rank7").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["world_size"] == 2 and summary["engine"] == "dp"
    assert first.stdout.startswith("best val acc") and (run_dir / "checkpoints" / "ckpt-2.pt").exists()

    again = local(3)  # a checkpoint now: --resume-if-possible continues from it; one more epoch
    assert again.returncode == 0, again.stdout + again.stderr
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["rank"]) for r in rows] == [(e, r) for e in (1, 2, 3) for r in (0, 1)]
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 3
