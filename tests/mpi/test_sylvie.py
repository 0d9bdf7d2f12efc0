"""The ``sylvie`` engine under real MPI (2 and 4 ranks): exact message sizes from an independently built
bit table, the stale pipeline against ``dp``, and every rank agreeing on the bit policy while widths change
with messages in flight (a hang is a failure: the timeout). See ``scripts/sylvie_checks.py``."""
from __future__ import annotations

import pytest
from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_sylvie_messages_pipeline_and_policy(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "sylvie_checks.py", tmp_path / "work"], nprocs, timeout=240)
    cases = 16 if nprocs == 2 else 8  # 8 bit settings x (GCN, GAT); every other setting on 4 ranks
    assert f"sylvie_checks: {nprocs} ranks, {cases} byte cases, pipeline, policy OK" in proc.stdout, \
        proc.stdout + proc.stderr
