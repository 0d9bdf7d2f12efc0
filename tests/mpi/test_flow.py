"""The ``flow`` engine on 4 ranks (real MPI) against the ``single`` engine and itself on one process.

See ``scripts/flow_checks.py``: GPipe passes of 8-layer GCN, SAGE, GAT and RevGCN with one and three
micro-batches (``exact``) equal ``single`` step by step; ``drop`` equals ``single`` without the cut
edges; ``stale`` on P ranks equals ``stale`` on one process; disjoint stage parameters; exact bytes
at every stage boundary; checkpoint and resume; too few layers refused on every rank.
"""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [4])  # the checks hold for any count; 4 ranks have more peers than 2
def test_flow_pipeline_matches_single(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "flow_checks.py", tmp_path / "work"], nprocs, timeout=280)
    assert f"flow_checks: {nprocs} ranks OK" in proc.stdout, proc.stdout


@pytest.mark.timeout(120)
def test_stages_unlike_the_ranks_is_one_error_line(tmp_path):
    """``engine.stages`` that cannot work on this job's ranks is refused before anything loads: exit status 2,
    one line naming the option (printed once: every rank refused alike), not a traceback and an abort."""
    from data_io.generators import write_csbm

    data = tmp_path / "g.h5"
    write_csbm(data, 300, seed=1)
    config = tmp_path / "flow.yaml"
    config.write_text(f"data: {{path: {data}}}\nengine: {{name: flow, stages: 3}}\n"
                      f"model: {{name: gcn, num_layers: 4}}\ntrain: {{epochs: 1, run_dir: {tmp_path / 'run'}}}\n")
    proc = run_mpi(["-m", "hpc_graph.cli", "-q", "train", "--config", str(config)], 2, timeout=100, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("error:") == 1 and "engine.stages" in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr
