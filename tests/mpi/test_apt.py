"""``apt`` under real MPI (4 ranks; the checks hold for any rank count, 4 has more peers): the four strategies give
GDP's gradients and weights, bytes per operation equal the analytic counts, the cache extremes, and the dry run's
byte predictions against a real epoch. See ``scripts/apt_checks.py``. A hang is a failure (timeout)."""
from __future__ import annotations

import pytest
from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nprocs", [4])
def test_apt_across_ranks(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "apt_checks.py", tmp_path / "work"], nprocs, timeout=560)
    assert f"apt_checks: {nprocs} ranks OK" in proc.stdout, proc.stdout + proc.stderr
