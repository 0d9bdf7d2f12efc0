"""Layers written from the public API alone (GIN, GATv2, a relational edge-weighted mean) on ``dp``, ``sar`` and
``minibatch`` across real MPI ranks equal one process holding the whole graph (scripts/user_layers_checks.py)."""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_user_layers_on_every_engine_match_single(ranks, tmp_path):
    proc = run_mpi([SCRIPTS / "user_layers_checks.py", tmp_path / "work"], ranks, timeout=280)
    assert f"user_layers_checks: {ranks} ranks, 12 cases OK" in proc.stdout, proc.stdout
