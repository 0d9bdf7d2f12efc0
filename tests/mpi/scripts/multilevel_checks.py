"""Checks of data_io.multilevel's distributed steps on R ranks, against NumPy on the gathered graph.

Run by tests/mpi/test_dist_partition.py (2 and 4 ranks, MPICH: these steps need no ParMETIS library).
Every rank builds the same random graph (communities joined by random edges, plus a few hubs), keeps
its even slice of the nodes, and checks:

* the halo exchange gives each rank the values its halo nodes have on their owners;
* clustering never lets a cluster pass the size bound (the ranks' shares of the room add up exactly);
* contraction equals the contraction of the gathered graph by the gathered labels (nodes numbered in
  label order; node weights and edge weights summed; edges inside a cluster dropped), and the coarse
  ids of the nodes point at the clusters they joined;
* refinement keeps every part within the weight limit, lowers the cut of a random start, and its
  result's cut is what NumPy counts on the gathered graph.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from data_io import multilevel as ml


def graph(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric simple graph as (xadj, adj) of all n nodes, the same on every rank."""
    rng = np.random.default_rng(seed)
    comm_of = rng.integers(0, 12, n)
    src, dst = [], []
    for c in range(12):
        members = np.flatnonzero(comm_of == c)
        m = 4 * len(members)
        src.append(rng.choice(members, m))
        dst.append(rng.choice(members, m))
    src.append(rng.integers(0, n, n // 2))  # noise between communities
    dst.append(rng.integers(0, n, n // 2))
    hubs = rng.integers(0, n, 3)
    src.append(np.repeat(hubs, n // 10))
    dst.append(rng.integers(0, n, 3 * (n // 10)))
    s, d = np.concatenate(src), np.concatenate(dst)
    keep = s != d
    key = np.unique(np.concatenate([s[keep] * n + d[keep], d[keep] * n + s[keep]]))
    r = key // n
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=n), out=xadj[1:])
    return xadj, (key % n).astype(np.int64)


def gather(comm, a: np.ndarray) -> np.ndarray:
    return np.concatenate(comm.allgather(a))


def main() -> int:
    comm = MPI.COMM_WORLD
    R, rank = comm.size, comm.rank
    n = 900
    X, A = graph(n, 5)
    vtx = ml.even_ranges(n, R)
    lo, hi = int(vtx[rank]), int(vtx[rank + 1])
    xadj = X[lo:hi + 1] - X[lo]
    adj = A[X[lo]:X[hi]]
    rng = np.random.default_rng([7, rank])
    vw = rng.integers(1, 4, hi - lo).astype(np.int64)
    g = ml.Level(vtx, xadj, adj, np.zeros(0, np.int64), vw[:, None])
    halo = ml.Halo(comm, vtx, adj)

    # halo exchange
    values = np.arange(lo, hi, dtype=np.int64) * 3 + 1
    assert np.array_equal(halo.exchange(values), halo.ids * 3 + 1)
    assert np.array_equal(np.concatenate([np.arange(lo, hi), halo.ids])[halo.local], adj)

    # clustering within the bound
    W = gather(comm, vw)
    bound = 9
    labels = ml._cluster(comm, g, halo, bound, 4, ml._visit_order(g))
    L = gather(comm, labels)
    sizes = np.bincount(L, weights=W, minlength=n)
    assert sizes.max() <= bound, sizes.max()
    assert len(np.unique(L)) < 0.8 * n  # it did cluster

    # contraction against NumPy on the gathered graph
    coarse, cid = ml._contract(comm, g, halo, labels)
    uniq, ref_cid = np.unique(L, return_inverse=True)
    nc = len(uniq)
    assert coarse.num_nodes() == nc and np.array_equal(gather(comm, cid), ref_cid)
    rows = ref_cid[np.repeat(np.arange(n), np.diff(X))]
    cols = ref_cid[A]
    inter = rows != cols
    key, inv = np.unique(rows[inter] * nc + cols[inter], return_inverse=True)
    ref_w = np.bincount(inv).astype(np.int64)
    ref_x = np.zeros(nc + 1, np.int64)
    np.cumsum(np.bincount(key // nc, minlength=nc), out=ref_x[1:])
    cl, ch = int(coarse.vtx[rank]), int(coarse.vtx[rank + 1])
    assert np.array_equal(coarse.xadj, ref_x[cl:ch + 1] - ref_x[cl])
    assert np.array_equal(coarse.adj, (key % nc)[ref_x[cl]:ref_x[ch]])
    assert np.array_equal(coarse.adjwgt, ref_w[ref_x[cl]:ref_x[ch]])
    assert np.array_equal(coarse.vwgt[:, 0], np.bincount(ref_cid, weights=W, minlength=nc)[cl:ch].astype(np.int64))

    # refinement of a random start: within the limit, fewer cut edges, the cut NumPy counts
    P = 4
    limit = int(1.05 * W.sum() / P)
    start = ml._random_start(comm, hi - lo, P, seed=3)
    before = ml._cut(comm, g, halo, start)
    part = ml._refine(comm, g, halo, start, P, limit, 20)
    Pg = gather(comm, part)
    load = np.bincount(Pg, weights=W, minlength=P)
    src_rows = np.repeat(np.arange(n), np.diff(X))
    ref_cut = int((Pg[src_rows] != Pg[A]).sum())
    assert load.max() <= limit or load.max() <= np.bincount(gather(comm, start), weights=W, minlength=P).max()
    after = ml._cut(comm, g, halo, part)
    assert after == ref_cut and after < 0.8 * before, (before, after)
    if rank == 0:
        print(f"multilevel checks OK on {R} ranks: {nc} clusters of {n} nodes, cut {before} -> {after}")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception:  # one rank failing must not leave the others waiting
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(rc)
