"""The planner against real multi-rank runs, and the training refusal under ``mpiexec``.

* ``scripts/plan_components.py``: on 2 ranks (both graphs) and 4 (the directed one), the predicted memory
  components (graph, features, parameters + optimiser, saved activations, halo receive buffers) of ``dp`` and
  ``sar`` (with and without prefetch) for GCN, SAGE and GAT equal the tensors of a real step on every rank;
* ``hpc-graph train`` on 2 ranks with ``HPC_GRAPH_MEMORY_LIMIT`` far too small: every rank refuses with
  the same one-line error and exit status 2 (no rank left waiting), and ``--force`` trains anyway;
* ``hpc-graph plan --profile FILE`` on 2 ranks: the links are measured on the two ranks, written, and
  read back by a one-process plan (this one).

Two launches in all (each rank of a launch spends seconds importing torch): the 2-rank one runs the
component checks, then ``train`` (refused), ``train --force`` and ``plan --profile`` through the
commands' ``main`` in the same ranks (``plan_components.py --cli``); each test checks its part of it.
The graphs of the component checks are written here, once for both rank counts.
"""
from __future__ import annotations

import json

import pytest
import yaml

from _run import SCRIPTS, run_mpi


@pytest.fixture(scope="module")
def component_graphs(tmp_path_factory):
    """The script's two graphs and their 2- and 4-part partitions (written here: its ranks need not wait)."""
    from plan_components import prepare

    d = tmp_path_factory.mktemp("components")
    for P in (2, 4):
        prepare(d, P)
    return d


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


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, component_graphs, parted):
    """``(work dir, completed process)`` of the 2-rank launch: the component checks, then the commands."""
    work = tmp_path_factory.mktemp("two_ranks")
    proc = run_mpi([SCRIPTS / "plan_components.py", work, component_graphs, "--cli", parted / "cfg.yaml"], 2,
                   timeout=420, check=False)
    return work, proc


def _cli_statuses(proc) -> list:
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("plan_components: cli exit statuses ")),
                None)
    assert line is not None, proc.stdout + proc.stderr
    return json.loads(line.rsplit("statuses ", 1)[1])


@pytest.mark.timeout(480)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_predicted_components_equal_real_dp_and_sar_steps(tmp_path, nprocs, component_graphs, request):
    if nprocs == 2:
        _, proc = request.getfixturevalue("two_ranks")
    else:  # the directed graph only (asymmetric blocks; the undirected one's symmetric CSR path runs on 2 ranks)
        proc = run_mpi([SCRIPTS / "plan_components.py", tmp_path / "work", component_graphs, "--graphs", "d"],
                       nprocs, timeout=360)
    cases = 42 if nprocs == 2 else 21
    assert f"plan_components: {nprocs} ranks, {cases} cases per rank OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.timeout(480)
def test_train_refusal_is_collective_and_force_bypasses_it(two_ranks):
    work, proc = two_ranks
    statuses = _cli_statuses(proc)
    assert [s[:2] for s in statuses] == [[2, 0], [2, 0]], proc.stdout + proc.stderr  # refused, then forced
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpc-graph train: error:")]
    assert len(lines) == 1, proc.stderr  # every rank refuses; the refusal is printed once
    assert all("2 ranks on host" in ln and "pass --force to try anyway" in ln and "HPC_GRAPH_MEMORY_LIMIT" in ln
               for ln in lines), proc.stderr
    assert not (work / "refused" / "summary.json").exists()
    assert json.loads((work / "forced" / "summary.json").read_text())["world_size"] == 2
    assert "going on because of --force" in proc.stderr


@pytest.mark.timeout(480)
def test_plan_measures_the_links_on_two_ranks(two_ranks, parted, capsys, monkeypatch):
    from hpc_graph.cli import main
    from hpc_graph.plan import profile

    work, proc = two_ranks
    prof = work / "links.json"
    assert [s[2] for s in _cli_statuses(proc)] == [0, 0], proc.stdout + proc.stderr
    assert proc.stdout.count("links: alpha-beta fits measured now on 2 ranks") == 1, proc.stdout
    assert f"(written to {prof})" in proc.stdout, proc.stdout
    saved = json.loads(prof.read_text())
    assert saved["key"].startswith("ranks=2") and saved["alpha"]["exchange"] >= 0
    # read back by a plan of one process (this one), which measures no links: the file's fits are used
    real_rates, real_graph = profile.kernel_rates, profile.synthetic_graph
    monkeypatch.setattr(profile, "FRESH_CALLS", 1)
    monkeypatch.setattr(profile, "STREAM_ELEMENTS", 1 << 18)
    monkeypatch.setattr(profile, "kernel_rates", lambda *a, **k: real_rates(*a, **{"reps": 1, **k}))
    monkeypatch.setattr(profile, "synthetic_graph", lambda scale=16, edge_factor=16: real_graph(10, 8))
    monkeypatch.setattr(profile, "profile_machine", lambda *a, **k: pytest.fail("measured the links again"))
    out_json = work / "one.json"
    assert main(["-q", "plan", "--config", str(parted / "cfg.yaml"), "--engines", "dp,sar", "--ranks", "2",
                 "--floor", "450MiB", "--rates", "synthetic", "--calibration", "none", "--profile", str(prof),
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert f"read from {prof} (measured for ranks=2" in out, out
    rates = json.loads(out_json.read_text())["rates"]
    assert rates["exchange"] == pytest.approx([saved["alpha"]["exchange"], saved["beta"]["exchange"]])
    assert rates["allreduce"] == pytest.approx([saved["alpha"]["allreduce"], saved["beta"]["allreduce"]])
