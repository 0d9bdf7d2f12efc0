"""LM co-training on 4 ranks (real MPI): see ``scripts/cotrain_checks.py`` -- the data-parallel LM equals
one process, the bubble interleaver changes times but no result, a dataset without text is refused everywhere."""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [4])  # the checks hold for any count; 4 ranks have more peers than 2
def test_cotraining_across_ranks(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "cotrain_checks.py", tmp_path / "work"], nprocs, timeout=280)
    assert f"cotrain_checks: {nprocs} ranks OK" in proc.stdout, proc.stdout
