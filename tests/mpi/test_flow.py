"""The ``flow`` engine on 2 and 4 ranks (real MPI) against the ``single`` engine and itself on one process.

See ``scripts/flow_checks.py``: GPipe passes of 8-layer GCN, SAGE, GAT and RevGCN with one and three
micro-batches (``exact``) equal ``single`` step by step; ``drop`` equals ``single`` without the cut
edges; ``stale`` on P ranks equals ``stale`` on one process; disjoint stage parameters; exact bytes
at every stage boundary; checkpoint and resume; too few layers refused on every rank.
"""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_flow_pipeline_matches_single(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "flow_checks.py", tmp_path / "work"], nprocs, timeout=280)
    assert f"flow_checks: {nprocs} ranks OK" in proc.stdout, proc.stdout
