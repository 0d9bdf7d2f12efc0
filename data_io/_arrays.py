"""Array helpers of the distributed partitioners (:mod:`data_io.dist_partitioner`, :mod:`data_io.multilevel`).

* :func:`alltoallv`: every rank sends each peer its group of items (rows), in rounds of at most
  ``_MAX_CALL_BYTES`` per peer (collective over an mpi4py communicator);
* :func:`_lookup`: table entries of global ids, each answered by the rank whose slice holds it (collective);
* :func:`_sorted_unique`, :func:`_unique_inverse`: distinct values of integer arrays by sorting.
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: bytes sent to one peer in one MPI call (counts stay far below 2^31)
_MAX_CALL_BYTES = 1 << 30


def alltoallv(comm: Any, data: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send ``data`` (grouped by destination, ``counts[q]`` items to rank q); return (received, counts).

    Items may be rows (a 2-D array moves whole rows). Large payloads go in rounds of at most
    ``_MAX_CALL_BYTES`` per peer, so no MPI count overflows.
    """
    from mpi4py import MPI

    data = np.ascontiguousarray(data)
    counts = np.asarray(counts, dtype=np.int64)
    recv_counts = np.asarray(comm.alltoall([int(c) for c in counts]), dtype=np.int64)
    item = data.dtype.itemsize * (int(np.prod(data.shape[1:])) if data.ndim > 1 else 1)
    out = np.empty((int(recv_counts.sum()),) + data.shape[1:], dtype=data.dtype)
    if item == 0:
        return out, recv_counts
    sb = data.view(np.uint8).reshape(-1) if data.size else np.zeros(0, np.uint8)
    rb = out.view(np.uint8).reshape(-1) if out.size else np.zeros(0, np.uint8)
    s_off = np.concatenate([[0], np.cumsum(counts)]) * item
    r_off = np.concatenate([[0], np.cumsum(recv_counts)]) * item
    per_round = max(1, _MAX_CALL_BYTES // item) * item
    rounds = int(comm.allreduce(int(max(counts.max(initial=0), recv_counts.max(initial=0)) * item
                                    // per_round + 1), op=MPI.MAX))
    if rounds == 1 and max(s_off[-1], r_off[-1]) < 2**31:
        # one call, with offsets that fit MPI's int: straight from the data into the result, no staging
        # copies (a rank may take this path while another stages: either makes the same single call)
        sc, rc = counts * item, recv_counts * item
        sbuf = sb if len(sb) else np.zeros(1, np.uint8)
        rbuf = rb if len(rb) else np.zeros(1, np.uint8)
        comm.Alltoallv([sbuf, (sc, s_off[:-1]), MPI.BYTE], [rbuf, (rc, r_off[:-1]), MPI.BYTE])
        return out, recv_counts
    for k in range(rounds):
        lo = k * per_round
        sc = np.clip(counts * item - lo, 0, per_round)
        rc = np.clip(recv_counts * item - lo, 0, per_round)
        sbuf = np.concatenate([sb[s_off[q] + lo:s_off[q] + lo + sc[q]] for q in range(len(sc))]) if sc.sum() \
            else np.zeros(1, np.uint8)
        rbuf = np.empty(max(1, int(rc.sum())), np.uint8)
        comm.Alltoallv([sbuf, (sc, np.concatenate([[0], np.cumsum(sc)[:-1]])), MPI.BYTE],
                       [rbuf, (rc, np.concatenate([[0], np.cumsum(rc)[:-1]])), MPI.BYTE])
        pos = 0
        for q in range(len(rc)):
            rb[r_off[q] + lo:r_off[q] + lo + rc[q]] = rbuf[pos:pos + rc[q]]
            pos += int(rc[q])
    return out, recv_counts


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an integer array (sort + compare: NumPy 2's hashing ``unique`` is ~10x
    slower on millions of int64 keys)."""
    a = np.sort(a)
    if len(a) == 0:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted distinct values, index of each item of a among them)`` by one stable argsort."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.empty(len(s), dtype=bool)
    if len(s):
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return s[first].astype(np.int64, copy=False), inv


def _lookup(comm: Any, vtx: np.ndarray, lo: int, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table`` entries of global ids ``ids``, each answered by the rank whose slice holds it (collective).

    ``vtx`` int64[R+1]: rank r holds ids ``[vtx[r], vtx[r+1])`` and ``table`` has one entry per id of this
    rank's slice (starting at ``lo``). Each distinct id is asked once.
    """
    uniq, inv = _unique_inverse(ids)
    owner = np.searchsorted(vtx, uniq, side="right") - 1  # uniq is sorted, so grouped by owner already
    asked, asked_counts = alltoallv(comm, uniq, np.bincount(owner, minlength=comm.size).astype(np.int64))
    answer, _ = alltoallv(comm, table[asked - lo], asked_counts)
    return answer[inv]
