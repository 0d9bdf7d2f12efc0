"""Label augmentation and Correct & Smooth on ``dp``, ``sar``, ``sylvie`` and ``minibatch`` (4 ranks,
real MPI) reproduce the ``single`` engine.

See ``scripts/recipes_checks.py``: on a randomly partitioned random graph (relabelled ids), float64,
the label-augmentation mask of every epoch and the epoch's inputs equal single's, so do the first
epoch's loss and all-reduced gradients with the augmentation on, and Correct & Smooth's output on
every owned node (given the same probabilities, and through the Trainer) with the same accuracies
before and after; ``recipes.label_aug`` on ``minibatch`` is a ConfigError naming it.
"""
from __future__ import annotations

import pytest

from _run import SCRIPTS, run_mpi


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [4])  # the checks hold for any count; 4 ranks have more peers than 2
def test_recipes_match_single(tmp_path, nprocs):
    proc = run_mpi([SCRIPTS / "recipes_checks.py", tmp_path / "work"], nprocs, timeout=240)
    assert f"recipes_checks: {nprocs} ranks, 4 cases OK" in proc.stdout, proc.stdout
