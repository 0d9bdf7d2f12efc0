"""``dp`` on a graph-level dataset (data parallel over batches of graphs) reproduces ``single`` on 4
ranks (real MPI; see scripts/graph_dp_checks.py)."""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [4])  # the checks hold for any count; 4 ranks have more peers than 2
def test_graph_level_dp_matches_single(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "graph_dp_checks.py", tmp_path / "work"], nprocs, timeout=240)
    assert f"graph_dp_checks: {nprocs} ranks, 4 cases OK" in proc.stdout, proc.stdout
