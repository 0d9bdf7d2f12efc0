"""Layers written from the public API alone (GIN, GATv2, a relational edge-weighted mean) on ``dp``, ``sar``,
``sylvie`` and ``minibatch`` across real MPI ranks equal one process holding the whole graph
(scripts/user_layers_checks.py): every layer and engine on 2 ranks, the message functions on ``sar`` and
``minibatch`` on 4."""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks,args,cases", [(2, [], 15), (4, ["--short"], 4)])
def test_user_layers_on_every_engine_match_single(ranks, args, cases, tmp_path):
    proc = run_mpi([SCRIPTS / "user_layers_checks.py", tmp_path / "work", *args], ranks, timeout=280)
    assert f"user_layers_checks: {ranks} ranks, {cases} cases OK" in proc.stdout, proc.stdout
