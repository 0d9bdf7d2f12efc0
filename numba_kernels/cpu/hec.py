"""Caches of embedding rows keyed by global node id (DistGNN-MB's historical embedding cache).

Arrays only (no torch, no MPI); :class:`hpc_graph.store.hec.HistoricalEmbeddingCache`
owns them. Two organisations of the same lines (``tags``, ``stamps``, ``rows``):

**Oldest cache-line first** (``ocf_*``, the paper's policy): a store of node
``g`` overwrites ``g``'s line if it has one (a matching tag), else takes an
empty line, else the oldest line of the whole cache (an expired one when any
has expired: they are older than every valid line). The lines in use form a
doubly linked list from oldest to newest stamp (a stored line moves to its
end), the empty ones a stack; a hash table (open addressing, linear probing,
backward-shift deletion; ``keys`` int64[T] with -1 empty, ``slots`` int64[T],
T a power of two >= 2 lines) maps a node to its line. Every store and lookup
is O(1). Memory: ``lines * (44 + itemsize * dim) + 16 T`` bytes.

**Set-associative** (``hec_*``): the cache has ``sets x ways`` lines; line ``l`` holds
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


@njit(cache=True, inline="always")
def _slot_of(gid, mask):
    return _set_of(gid, mask + 1)


@njit(cache=True, nogil=True)
def _ocf_find(keys, gid):
    mask = keys.shape[0] - 1
    i = _slot_of(gid, mask)
    while True:
        k = keys[i]
        if k == gid:
            return i
        if k < 0:
            return -1
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _ocf_insert(keys, slots, gid, line):
    mask = keys.shape[0] - 1
    i = _slot_of(gid, mask)
    while keys[i] >= 0 and keys[i] != gid:
        i = (i + 1) & mask
    keys[i] = gid
    slots[i] = line


@njit(cache=True, nogil=True)
def _ocf_delete(keys, slots, i):
    """Remove table entry ``i``; later entries of its probe run shift back so every key stays reachable."""
    mask = keys.shape[0] - 1
    j = i
    while True:
        keys[i] = -1
        while True:
            j = (j + 1) & mask
            if keys[j] < 0:
                return
            home = _slot_of(keys[j], mask)
            # keys[j] may move to i only if its home is not cyclically within (i, j]
            if i <= j:
                stays = i < home <= j
            else:
                stays = home > i or home <= j
            if not stays:
                break
        keys[i] = keys[j]
        slots[i] = slots[j]
        i = j


@njit(cache=True, nogil=True)
def _ocf_unlink(order, line):
    """Take ``line`` out of the age list (``order``: prev int64[L], next int64[L], ends int64[3] = first,
    last, free lines)."""
    prev, nxt, ends = order[0], order[1], order[2]
    p, n = prev[line], nxt[line]
    if p >= 0:
        nxt[p] = n
    else:
        ends[0] = n
    if n >= 0:
        prev[n] = p
    else:
        ends[1] = p
    prev[line] = -1
    nxt[line] = -1


@njit(cache=True, nogil=True)
def _ocf_append(order, line):
    prev, nxt, ends = order[0], order[1], order[2]
    last = ends[1]
    prev[line] = last
    nxt[line] = -1
    if last >= 0:
        nxt[last] = line
    else:
        ends[0] = line
    ends[1] = line


@njit(cache=True, nogil=True)
def ocf_store(tags, stamps, rows, order, free, keys, slots, gids, new_rows, now, lifespan):
    """Store ``new_rows[i]`` under ``gids[i]`` (in order) at iteration ``now``, oldest cache-line first (module
    docstring); returns evictions of valid lines (int64). ``order`` int64[3, L]: the age list (``order[0]``
    previous line, ``order[1]`` next line, ``order[2, :3]`` first line, last line, number of free lines);
    ``free`` int64[L]: a stack of empty lines."""
    ends = order[2]
    evicted = 0
    for i in range(gids.shape[0]):
        g = gids[i]
        e = _ocf_find(keys, g)
        if e >= 0:  # matching tag: the line is refreshed and becomes the newest
            line = slots[e]
            _ocf_unlink(order, line)
        else:
            if ends[2] > 0:  # an empty line
                ends[2] -= 1
                line = free[ends[2]]
            else:  # the oldest line: an expired one if any has expired, else the oldest valid one
                line = ends[0]
                if now - stamps[line] <= lifespan:
                    evicted += 1
                _ocf_unlink(order, line)
                _ocf_delete(keys, slots, _ocf_find(keys, tags[line]))
            _ocf_insert(keys, slots, g, line)
        tags[line] = g
        stamps[line] = now
        for j in range(rows.shape[1]):
            rows[line, j] = new_rows[i, j]
        _ocf_append(order, line)
    return evicted


@njit(cache=True, nogil=True, parallel=True)
def ocf_lookup(tags, stamps, rows, keys, slots, gids, now, lifespan, out, hit, age):
    """As :func:`hec_lookup`, on the oldest-cache-line-first organisation."""
    for i in prange(gids.shape[0]):
        hit[i] = False
        age[i] = -1
        e = _ocf_find(keys, gids[i])
        if e >= 0:
            line = slots[e]
            if now - stamps[line] <= lifespan:
                hit[i] = True
                age[i] = now - stamps[line]
                for j in range(rows.shape[1]):
                    out[i, j] = rows[line, j]


@njit(cache=True, nogil=True)
def ocf_purge(tags, stamps, order, free, keys, slots, now, lifespan):
    """Empty every expired line of the oldest-cache-line-first organisation (they are the oldest: the front
    of the age list); returns the valid lines left."""
    ends = order[2]
    while ends[0] >= 0 and now - stamps[ends[0]] > lifespan:
        line = ends[0]
        _ocf_unlink(order, line)
        _ocf_delete(keys, slots, _ocf_find(keys, tags[line]))
        tags[line] = -1
        free[ends[2]] = line
        ends[2] += 1
    return tags.shape[0] - ends[2]


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
