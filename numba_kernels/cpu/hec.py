"""Set-associative cache of embedding rows keyed by global node id (DistGNN-MB's historical embedding cache).

Arrays only (no torch, no MPI); :class:`hpc_graph.store.hec.HistoricalEmbeddingCache`
owns them. The cache has ``sets x ways`` lines; line ``l`` holds
``tags[l]`` (a node id, -1 when empty), ``stamps[l]`` (the iteration it was
stored at) and ``rows[l, :]``. Node ``g`` can live only in set
``hash(g) % sets``, in any of its ``ways`` lines.

* A line is *valid* at iteration ``now`` when ``tags >= 0`` and
  ``now - stamps <= lifespan``; older lines are expired: never served, and
  reused first (purged lazily; :func:`hec_purge` clears them for good).
* ``hec_store``: a node already in its set is overwritten (row and stamp);
  else it takes an empty or expired line of its set; else the oldest line of
  the set (smallest stamp, lowest way on ties) is evicted.
* ``hec_lookup``: the row of every valid line whose tag matches, with its age.

Stores and lookups of one call are processed in order (serial: a store of
one row may evict the line of another node of the same call); lookups are
thread-parallel.

Memory: ``sets * ways * (8 + 4 + itemsize * dim)`` bytes: 12 bytes of tag
and stamp per line besides the row.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_SPLIT = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _set_of(gid, sets):
    z = np.uint64(gid) + _SPLIT
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z % np.uint64(sets))


@njit(cache=True, nogil=True)
def hec_store(tags, stamps, rows, ways, gids, new_rows, now, lifespan):
    """Store ``new_rows[i]`` under ``gids[i]`` (in order) at iteration ``now``; returns evictions of
    valid lines (int64). ``tags`` int64[L], ``stamps`` int32[L], ``rows`` float[L, D], ``ways`` int,
    ``gids`` int64[m], ``new_rows`` float[m, D]."""
    sets = tags.shape[0] // ways
    evicted = 0
    for i in range(gids.shape[0]):
        g = gids[i]
        base = _set_of(g, sets) * ways
        line = -1
        free = -1
        oldest = -1
        for w in range(ways):
            slot = base + w
            if tags[slot] == g:
                line = slot
                break
            if free < 0 and (tags[slot] < 0 or now - stamps[slot] > lifespan):
                free = slot
            if oldest < 0 or stamps[slot] < stamps[oldest]:
                oldest = slot
        if line < 0:
            if free >= 0:
                line = free
            else:
                line = oldest
                evicted += 1
        tags[line] = g
        stamps[line] = now
        for j in range(rows.shape[1]):
            rows[line, j] = new_rows[i, j]
    return evicted


@njit(cache=True, nogil=True, parallel=True)
def hec_lookup(tags, stamps, rows, ways, gids, now, lifespan, out, hit, age):
    """For each ``gids[i]``: ``hit[i]`` (bool) and on a hit ``out[i] = row``, ``age[i] = now - stamp``
    (int64; -1 on a miss). ``out`` rows of misses are left untouched."""
    sets = tags.shape[0] // ways
    for i in prange(gids.shape[0]):
        g = gids[i]
        base = _set_of(g, sets) * ways
        hit[i] = False
        age[i] = -1
        for w in range(ways):
            slot = base + w
            if tags[slot] == g:
                if now - stamps[slot] <= lifespan:
                    hit[i] = True
                    age[i] = now - stamps[slot]
                    for j in range(rows.shape[1]):
                        out[i, j] = rows[slot, j]
                break


@njit(cache=True, nogil=True)
def hec_purge(tags, stamps, now, lifespan):
    """Empty every expired line; returns how many valid lines remain."""
    valid = 0
    for slot in range(tags.shape[0]):
        if tags[slot] >= 0:
            if now - stamps[slot] > lifespan:
                tags[slot] = -1
            else:
                valid += 1
    return valid
