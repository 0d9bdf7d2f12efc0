"""``seqpar`` reproduces ``single`` for GT and Graphormer on 1, 2 and 4 ranks (real MPI; see
scripts/seqpar_checks.py)."""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_seqpar_matches_single(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "seqpar_checks.py", tmp_path / "work"], nprocs, timeout=240)
    # per model (GT, Graphormer): 3 attention kinds + the orders + the cluster betas the rank count runs
    # (2 + 2 on 2 ranks, 1 + 1 on 4, none on 1); the tuner; the Trainer against single; the heads refusals (the
    # model's, and the Trainer's before loading) on more than one rank
    variants = {1: 0, 2: 4, 4: 2}[nprocs]
    want = 2 * (3 + variants) + 1 + 1 + (2 if nprocs > 1 else 0)
    assert f"seqpar_checks: {nprocs} ranks, {want} cases per rank OK" in proc.stdout, proc.stdout
