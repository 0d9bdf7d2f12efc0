"""The dry run's cross-validated cache estimate against a naive reference (the sets built one fold at a time)."""
from __future__ import annotations

import numpy as np
import pytest

from hpc_graph.engines.apt.dry_run import FOLDS, cross_validated_fetches


def _naive(reads, folds, owner_of, cache_rows, remote_nodes, P):
    """For each fold: cache the most-read rows of the other folds (count desc, id asc), count the misses."""
    out = np.zeros(P)
    for f in range(FOLDS):
        score = reads[folds == f]
        if score.size == 0:
            continue
        g, c = np.unique(reads[folds != f], return_counts=True)
        cached = g[np.lexsort((g, -c))][:cache_rows] if cache_rows < remote_nodes.size else remote_nodes
        miss = score[~np.isin(score, cached)]
        out += np.bincount(owner_of(miss), minlength=P)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_cross_validated_fetches_match_a_naive_count(seed):
    rng = np.random.default_rng(seed)
    P, N = int(rng.integers(1, 5)), int(rng.integers(20, 400))
    bounds = np.sort(rng.choice(np.arange(1, N), P - 1, replace=False)) if P > 1 else np.zeros(0, np.int64)
    owner_of = lambda g: np.searchsorted(bounds, g, side="right")  # noqa: E731
    remote = np.arange(N // 2, N)  # this rank's remote rows (any set will do)
    w = 1.0 / np.arange(1, remote.size + 1) ** 0.8  # skewed: ties and a clear head
    reads = rng.choice(remote, int(rng.integers(0, 3000)), p=w / w.sum())
    folds = rng.integers(0, FOLDS - int(rng.integers(0, 3)), reads.size)  # some folds may be empty
    gids, inv = np.unique(reads, return_inverse=True)
    for cache_rows in (0, 1, 5, int(rng.integers(1, remote.size)), remote.size - 1, remote.size, 10 * N):
        got = cross_validated_fetches(gids, owner_of(gids), inv, folds, cache_rows, remote.size, P)
        np.testing.assert_array_equal(got, _naive(reads, folds, owner_of, cache_rows, remote, P))
