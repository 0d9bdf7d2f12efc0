"""The planner against real multi-rank runs, and the training refusal under ``mpiexec``.

* ``scripts/plan_components.py``: on 2 and 4 ranks, the predicted memory components (graph,
  features, parameters + optimiser, saved activations, halo receive buffers) of ``dp`` and ``sar``
  (with and without prefetch) for GCN, SAGE and GAT equal the tensors of a real step on every rank;
* ``hpc-graph train`` on 2 ranks with ``HPC_GRAPH_MEMORY_LIMIT`` far too small: every rank refuses with
  the same one-line error and exit status 2 (no rank left waiting), and ``--force`` trains anyway;
* ``mpiexec -n 2 hpc-graph plan --profile FILE``: the links are measured on the two ranks, written,
  and read back by a one-process plan.
"""
from __future__ import annotations

import json

import pytest
import yaml

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_predicted_components_equal_real_dp_and_sar_steps(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "plan_components.py", tmp_path / "work"], nprocs, timeout=360)
    assert f"plan_components: {nprocs} ranks, 42 cases per rank OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def parted(tmp_path_factory):
    from data_io.generators.rmat import write_rmat
    from data_io.partitioner import partition_dataset

    d = tmp_path_factory.mktemp("refuse")
    write_rmat(d / "g.h5", 9, 8, feat_dim=8, num_classes=3, seed=0)
    partition_dataset(str(d / "g.h5"), str(d / "p2"), 2)
    cfg = d / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": str(d / "p2")}, "engine": {"name": "sar"},
                                   "model": {"name": "sage", "hidden": 8},
                                   "train": {"epochs": 2, "progress": False, "run_dir": str(d / "run")}}))
    return d


@pytest.mark.timeout(200)
def test_train_refusal_is_collective_and_force_bypasses_it(parted):
    cmd = ["-m", "hpc_graph.cli", "-q", "train", "--config", parted / "cfg.yaml"]
    proc = run_mpi(cmd, 2, timeout=120, env={"HPC_GRAPH_MEMORY_LIMIT": "50MB"}, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpc-graph train: error:")]
    assert len(lines) == 2, proc.stderr
    assert all("2 ranks on host" in ln and "pass --force to try anyway" in ln and "HPC_GRAPH_MEMORY_LIMIT" in ln
               for ln in lines), proc.stderr
    assert not (parted / "run" / "summary.json").exists()
    proc = run_mpi(cmd + ["--force"], 2, timeout=120, env={"HPC_GRAPH_MEMORY_LIMIT": "50MB"})
    assert json.loads((parted / "run" / "summary.json").read_text())["world_size"] == 2
    assert "going on because of --force" in proc.stderr


@pytest.mark.timeout(200)
def test_plan_measures_the_links_on_two_ranks(parted, tmp_path):
    prof = tmp_path / "links.json"
    cmd = ["-m", "hpc_graph.cli", "-q", "plan", "--config", parted / "cfg.yaml", "--engines", "dp,sar",
           "--ranks", "2", "--floor", "450MiB", "--rates", "synthetic", "--calibration", "none", "--profile", prof]
    proc = run_mpi(cmd, 2, timeout=150)
    assert proc.stdout.count("links: alpha-beta fits measured now on 2 ranks") == 1, proc.stdout
    saved = json.loads(prof.read_text())
    assert saved["key"].startswith("ranks=2") and saved["alpha"]["exchange"] >= 0
    one = run_mpi(cmd, 1, timeout=150)
    assert f"read from {prof} (measured for ranks=2" in one.stdout, one.stdout
