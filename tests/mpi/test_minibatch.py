"""``minibatch`` under real MPI (4 ranks): exact mode equals one process, sampling does not depend on
placement, bytes per iteration follow from the blocks, and hec/drop train with every rank in step.
See ``scripts/minibatch_checks.py``. A hang is a failure (timeout)."""
from __future__ import annotations

import pytest
from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nprocs", [4])  # the checks hold for any count; 4 ranks have more peers than 2
def test_minibatch_across_ranks(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "minibatch_checks.py", tmp_path / "work"], nprocs, timeout=360)
    assert f"minibatch_checks: {nprocs} ranks OK" in proc.stdout, proc.stdout + proc.stderr
