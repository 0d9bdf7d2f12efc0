"""Distributed multilevel partitioning around the ParMETIS API: coarsen in parallel, partition, refine.

PT-Scotch's ParMETIS API partitions R-MAT graphs about as well as serial METIS, but its time grows far
faster than the graph (80-92 s at R-MAT scale 18 where scale 16 takes 5 s; scale 20 on 2 ranks did not
finish in 25 minutes; docs/benchmarks.md, history §11). So the distributed partitioner hands it a small
graph instead: the multilevel scheme of ParHIP (Meyerhenke, Sanders and Schulz, "Parallel graph
partitioning for complex networks"), with the ParMETIS API as its initial partitioner:

1. **coarsen**: size-constrained label propagation clusters the nodes (each node joins the cluster its
   edges weigh most towards, no cluster heavier than ``U`` nodes; on power-law graphs this shrinks the
   graph far faster than the matchings of METIS-style coarsening, which stall around hubs); each cluster
   becomes one node of the next level, with the summed node weights and the summed weights of the edges
   between clusters. Repeated until the graph has at most ``coarsen_to`` nodes or stops shrinking;
2. **partition** the coarsest graph with ``ParMETIS_V3_PartKway`` (node and edge weights);
3. **uncoarsen**: project the parts level by level back to the input graph and refine at each level by
   label propagation over the parts (a node moves to the part it has most edge weight to, if that part
   has room under ``imbalance`` x the mean weight; overloaded parts give up boundary nodes first).

Every level's graph is distributed over the ranks by even ranges of its node ids; each rank only ever
holds its slice and the labels of its halo, so memory per rank falls with R as in the rest of the
distributed partitioner. The size and balance bounds hold exactly across ranks: in each sweep a rank may
fill only its share of a cluster's or part's remaining room (the kernels' ``cap``,
:mod:`numba_kernels.cpu.label_propagation`).

Beyond ParHIP: node weights carry every balance constraint the caller gives (the first is balanced by the
refinement, all of them by a multi-constraint library at the coarsest level), and the coarsest level is any
ParMETIS-API library. Deterministic for a given graph, rank count and seed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from data_io._arrays import _lookup, _sorted_unique, _unique_inverse, alltoallv

log = logging.getLogger(__name__)

#: default node count below which the graph goes to the library as it is
COARSEN_TO = 20_000
#: label-propagation sweeps per coarsening level and per refinement level
CLUSTER_SWEEPS = 4
REFINE_SWEEPS = 12
#: sweeps refining the random start (it begins far from a good cut)
RANDOM_SWEEPS = 30
#: the largest cluster, as a fraction of the mean part weight
CLUSTER_FRACTION = 1 / 24
#: a level's clusters weigh at most this many times the level's mean node weight (gradual coarsening:
#: many levels, each refined on the way back); doubled whenever a level shrinks the graph by less than
#: 1 - MIN_SHRINK, until clusters reach the bound
CLUSTER_GROWTH = 3
#: stop coarsening when a level keeps more than this fraction of its nodes
MIN_SHRINK = 0.9
MAX_LEVELS = 24


def _peak(tag: str) -> None:
    """Log this process's peak RSS so far (debug level: where the memory goes)."""
    if log.isEnabledFor(logging.DEBUG):
        from data_io.memory import peak_rss_mb

        log.debug("peak RSS after %s: %.0f MiB", tag, peak_rss_mb())


def even_ranges(n: int, R: int) -> np.ndarray:
    """int64[R+1]: rank r holds ids ``[n r / R, n (r + 1) / R)``."""
    return np.array([n * r // R for r in range(R + 1)], dtype=np.int64)


@dataclass
class Level:
    """This rank's slice of one level's undirected weighted graph.

    ``vtx`` int64[R+1] ranges of node ids per rank; ``xadj`` int64[k+1]; ``adj`` int64[m] global neighbour
    ids (None once the level's :class:`Halo` holds its local columns and the library will not need it);
    ``adjwgt`` int32 or int64[m], or int64[0] for unit weights (the input graph); ``vwgt`` int64[k, ncon] node
    weights (column 0 is balanced by refinement).
    """

    vtx: np.ndarray
    xadj: np.ndarray
    adj: np.ndarray | None
    adjwgt: np.ndarray
    vwgt: np.ndarray

    def num_nodes(self) -> int:
        return int(self.vtx[-1])


class Halo:
    """The halo of a rank's slice: local column indices and the plan to exchange per-node values.

    ``local`` int32[m] (int64 past 2^31 nodes): each adjacency entry as an index into ``[own nodes | halo
    nodes]``; ``ids`` int64[h] the halo's global ids (sorted). :meth:`exchange` sends each rank the values of the
    own nodes it holds as halo and returns this rank's halo values (two alltoallv per call, fixed pattern).
    """

    def __init__(self, comm: Any, vtx: np.ndarray, adj: np.ndarray):
        from numba_kernels.cpu.label_propagation import local_columns

        rank = comm.rank
        lo, hi = int(vtx[rank]), int(vtx[rank + 1])
        self.ids = _sorted_unique(adj[(adj < lo) | (adj >= hi)])
        k = hi - lo
        self.local = np.empty(len(adj), dtype=np.int32 if k + len(self.ids) < 2**31 else np.int64)
        local_columns(adj, lo, hi, self.ids, self.local)
        owner = np.searchsorted(vtx, self.ids, side="right") - 1
        self.ask_counts = np.bincount(owner, minlength=comm.size).astype(np.int64)
        asked, self.send_counts = alltoallv(comm, self.ids, self.ask_counts)
        self.send_idx = asked - lo
        self.comm = comm

    def exchange(self, own_values: np.ndarray) -> np.ndarray:
        """Values of the halo nodes, given this rank's values of its own nodes."""
        return alltoallv(self.comm, own_values[self.send_idx], self.send_counts)[0]


def _share(room: np.ndarray, keys: np.ndarray, R: int, turn: int) -> np.ndarray:
    """This rank's share of each item's ``room``: ``room // R``, plus one for ``room % R`` of the ranks
    (which ones rotates with the item's key and ``turn``), so the shares of all ranks sum to ``room``."""
    return room // R + (((keys + turn) % R) < (room % R))


def _cluster(comm: Any, g: Level, halo: Halo, bound: int, sweeps: int, order: np.ndarray) -> np.ndarray:
    """Size-constrained label propagation: int64[k] cluster label (a global node id) of each own node."""
    from numba_kernels.cpu.label_propagation import cluster_sweep

    R, rank = comm.size, comm.rank
    lo = int(g.vtx[rank])
    k = len(g.xadj) - 1
    w = np.ascontiguousarray(g.vwgt[:, 0], dtype=np.int64)
    own = np.arange(lo, lo + k, dtype=np.int64)
    labels = np.concatenate([own, halo.ids])  # global label of every own and halo node
    for sweep in range(sweeps):
        table, lab = _unique_inverse(labels)  # labels seen here -> [0, T)
        # the global weight of each label: own nodes' weights summed at the label's owner, read back
        sums = np.bincount(lab[:k], weights=w, minlength=len(table)).astype(np.int64)
        nz = np.flatnonzero(sums)
        owner = np.searchsorted(g.vtx, table[nz], side="right") - 1  # table sorted: grouped by owner
        counts = np.bincount(owner, minlength=R).astype(np.int64)
        got_l, _ = alltoallv(comm, table[nz], counts)
        got_w, _ = alltoallv(comm, sums[nz], counts)
        weight = np.bincount(got_l - lo, weights=got_w, minlength=k).astype(np.int64)
        cur = _lookup(comm, g.vtx, lo, table, weight)
        cap = cur + _share(np.maximum(bound - cur, 0), table, R, rank + sweep)
        moved = cluster_sweep(g.xadj, halo.local, g.adjwgt, w, order, lab, cur, cap)
        labels[:k] = table[lab[:k]]
        labels[k:] = halo.exchange(labels[:k])
        total = comm.allreduce(int(moved))
        if total == 0:
            break
    return labels[:k]


def _sum_by_key(key: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted distinct keys, summed weight of each)``; ``w`` None counts each key once per occurrence.
    Sorts ``key`` in place when ``w`` is None (no second copy of the largest array)."""
    if w is None:
        key.sort()
        s = key
    else:
        order = np.argsort(key, kind="stable")
        s, w = key[order], w[order]
        del order
    first = np.empty(len(s), dtype=bool)
    if len(s):
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    if w is None:
        sums = np.diff(np.append(starts, len(s))).astype(np.int64)
    else:
        sums = np.add.reduceat(w, starts).astype(np.int64) if len(s) else np.zeros(0, np.int64)
    return s[starts], sums


def _contract(comm: Any, g: Level, halo: Halo, labels: np.ndarray) -> tuple[Level, np.ndarray]:
    """The graph of clusters (next level, even ranges) and each own node's coarse id."""
    R, rank = comm.size, comm.rank
    lo = int(g.vtx[rank])
    k = len(g.xadj) - 1
    # number the clusters: every label's owner numbers the labels used anywhere, in id order
    used = _sorted_unique(labels)
    owner = np.searchsorted(g.vtx, used, side="right") - 1
    got, _ = alltoallv(comm, used, np.bincount(owner, minlength=R).astype(np.int64))
    mine = _sorted_unique(got)
    first = comm.exscan(len(mine)) or 0
    nc = comm.allreduce(len(mine))
    number = np.full(k, -1, dtype=np.int64)
    number[mine - lo] = first + np.arange(len(mine), dtype=np.int64)
    cid = _lookup(comm, g.vtx, lo, labels, number)
    vtx_c = even_ranges(nc, R)
    # coarse edges as one int64 key each (row * nc + column), summed here, then at the coarse row's owner
    cid_all = np.concatenate([cid, halo.exchange(cid)])
    key = np.repeat(cid, np.diff(g.xadj))
    cols = cid_all[halo.local]
    keep = key != cols
    key *= nc
    key += cols
    del cols, cid_all
    key = key[keep]
    key, wts = _sum_by_key(key, None if len(g.adjwgt) == 0 else g.adjwgt[keep])
    del keep
    counts = np.diff(np.searchsorted(key, vtx_c * nc)).astype(np.int64)  # sorted keys: grouped by owner
    k_in, _ = alltoallv(comm, key, counts)
    w_in, _ = alltoallv(comm, wts, counts)
    del key, wts
    lo_c, hi_c = int(vtx_c[rank]), int(vtx_c[rank + 1])
    k_in -= lo_c * nc
    if R == 1:  # one run, already sorted and summed
        key, adjwgt = k_in, w_in
    else:
        key, adjwgt = _sum_by_key(k_in, w_in)
    del k_in, w_in
    dest = np.searchsorted(vtx_c, cid, side="right") - 1
    order = np.argsort(dest, kind="stable")
    v_in, _ = alltoallv(comm, np.concatenate([cid[order, None], g.vwgt[order]], 1),
                        np.bincount(dest, minlength=R).astype(np.int64))
    kc = hi_c - lo_c
    ncon = g.vwgt.shape[1]
    vwgt = np.zeros((kc, ncon), dtype=np.int64)
    for c in range(ncon):
        vwgt[:, c] = np.bincount(v_in[:, 0] - lo_c, weights=v_in[:, 1 + c], minlength=kc)
    if len(adjwgt) and int(adjwgt.max()) < 2**31:
        adjwgt = adjwgt.astype(np.int32)  # stored per level: half the bytes
    r_local = key // nc
    xadj = np.zeros(kc + 1, dtype=np.int64)
    np.cumsum(np.bincount(r_local, minlength=kc), out=xadj[1:])
    r_local *= nc
    np.subtract(key, r_local, out=key)
    return Level(vtx_c, xadj, key, adjwgt, vwgt), cid


def _visit_order(g: Level) -> np.ndarray:
    """Own nodes by increasing degree (light nodes settle first; hubs last, when clusters have formed)."""
    return np.argsort(np.diff(g.xadj), kind="stable").astype(np.int64)


def _refine(comm: Any, g: Level, halo: Halo, part: np.ndarray, num_parts: int, limit: int,
            sweeps: int) -> np.ndarray:
    """Refine the parts of this rank's nodes: paired label-propagation moves, within ``limit`` weight per
    part (exact across ranks: each rank fills only its share of a part's room)."""
    from mpi4py import MPI

    from numba_kernels.cpu.label_propagation import best_moves, pair_moves

    R = comm.size
    k = len(g.xadj) - 1
    w = np.ascontiguousarray(g.vwgt[:, 0], dtype=np.int64)
    both = np.concatenate([part, halo.exchange(part)]).astype(np.int64)
    total = comm.allreduce(k)
    for sweep in range(sweeps):
        load = np.bincount(both[:k], weights=w, minlength=num_parts).astype(np.int64)
        comm.Allreduce(MPI.IN_PLACE, load, op=MPI.SUM)
        parts = np.arange(num_parts, dtype=np.int64)
        cap = load + _share(np.maximum(limit - load, 0), parts, R, comm.rank + sweep)
        excess = -(-np.maximum(load - limit, 0) // R)
        target, gain = best_moves(g.xadj, halo.local, g.adjwgt, both, num_parts)
        cand = np.flatnonzero(target >= 0)
        src, dst = both[cand], target[cand]
        order = np.lexsort((-gain[cand], dst, src))
        cand, src, dst = cand[order], src[order], dst[order]
        take = pair_moves(src, dst, gain[cand], w[cand], num_parts, load, cap, excess)
        both[cand[take]] = dst[take]
        both[k:] = halo.exchange(both[:k])
        moved = comm.allreduce(int(take.sum()))
        if comm.rank == 0:
            log.debug("refinement sweep %d: %d node(s) moved", sweep, moved)
        if moved <= 1e-4 * total:
            break
    return both[:k]


def _cut(comm: Any, g: Level, halo: Halo, part: np.ndarray) -> int:
    """Total weight of the edges whose ends lie in different parts (each edge counted from both ends)."""
    from numba_kernels.cpu.label_propagation import cut_weight

    both = np.concatenate([part, halo.exchange(part)]).astype(np.int64)
    return int(comm.allreduce(int(cut_weight(g.xadj, halo.local, g.adjwgt, both))))


def _random_start(comm: Any, k: int, num_parts: int, seed: int) -> np.ndarray:
    """Parts dealt round robin over a seeded shuffle of the nodes (node counts balanced to one)."""
    rng = np.random.default_rng([int(seed), comm.rank, 7])
    first = comm.exscan(k) or 0
    part = np.empty(k, dtype=np.int64)
    part[rng.permutation(k)] = (first + np.arange(k, dtype=np.int64)) % num_parts
    return part


def multilevel_part_kway(lib: Any, comm: Any, vtxdist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                         vwgt: np.ndarray, num_parts: int, *, seed: int = 0, imbalance: float = 1.05,
                         coarsen_to: int = COARSEN_TO, info: dict | None = None) -> np.ndarray:
    """Parts of this rank's nodes of a distributed undirected graph (collective; same arguments as
    :func:`data_io.parmetis.part_kway`, whose library partitions the coarsest level).

    Two candidates are refined on the input graph and the one with the smaller cut is kept: the library's
    partition of the coarsest graph, projected and refined level by level, and a random balanced start
    refined on the input graph alone (on R-MAT graphs, which have no communities for the coarsening to
    find, the second cuts about half as many edges as the first or as serial METIS; on graphs with
    structure the first wins).

    Args:
        coarsen_to: coarsen until the graph has at most this many nodes (a graph already that small goes
            to the library as it is, and is refined); 0: only the library's partition of the input graph,
            nothing else.
        info: if given, gets ``levels`` (node and edge counts per level), ``cut`` of each candidate,
            ``chosen`` and ``seconds`` per phase.
    Returns:
        int64[k] part of each local node.
    """
    from mpi4py import MPI

    from data_io.parmetis import part_kway

    rank = comm.rank
    vwgt = np.asarray(vwgt, dtype=np.int64)
    if vwgt.ndim == 1:
        vwgt = vwgt[:, None]
    n = int(vtxdist[-1])
    info = {} if info is None else info
    if not coarsen_to:
        info["levels"] = [{"nodes": n, "adjacency": int(comm.allreduce(len(adjncy)))}]
        return part_kway(lib, comm, vtxdist, xadj, adjncy, vwgt, num_parts, seed=seed, imbalance=imbalance)
    t0 = time.perf_counter()
    g = Level(np.asarray(vtxdist, dtype=np.int64), np.asarray(xadj, dtype=np.int64),
              np.asarray(adjncy, dtype=np.int64), np.zeros(0, dtype=np.int64), vwgt)
    k = len(g.xadj) - 1
    total = int(comm.allreduce(int(vwgt[:, 0].sum())))
    bound = max(1, int(total / num_parts * CLUSTER_FRACTION))
    limit = int(imbalance * total / num_parts)
    levels = [g]
    _peak("input")
    halos = [Halo(comm, g.vtx, g.adj)]
    _peak("halo of the input")
    maps: list[np.ndarray] = []
    stats = [(n, int(comm.allreduce(len(g.adj))))]
    growth = CLUSTER_GROWTH
    while stats[-1][0] > coarsen_to and len(levels) <= MAX_LEVELS:
        step = min(bound, max(2, int(growth * total / stats[-1][0])))
        labels = _cluster(comm, g, halos[-1], step, CLUSTER_SWEEPS, _visit_order(g))
        _peak(f"clustering level {len(levels)}")
        coarse, cid = _contract(comm, g, halos[-1], labels)
        _peak(f"contracting level {len(levels)}")
        nc = coarse.num_nodes()
        if min(np.diff(coarse.vtx)) < 1:
            break
        if nc > MIN_SHRINK * stats[-1][0]:  # clusters full: let them grow more, up to the bound
            if step >= bound:
                break
            growth *= 2
            continue
        maps.append(cid)
        levels.append(coarse)
        halos.append(Halo(comm, coarse.vtx, coarse.adj))
        if len(levels) > 2:  # an intermediate level: its halo's local columns are all that is used now
            levels[-2].adj = None
        stats.append((nc, int(comm.allreduce(len(coarse.adj)))))
        g = coarse
        if rank == 0:
            log.info("coarsening level %d: %d nodes, %d adjacency entries", len(levels) - 1, *stats[-1])
    t1 = time.perf_counter()
    g = levels[-1]
    if rank == 0:
        log.info("ParMETIS API on the coarsest graph: %d nodes, %d adjacency entries, %d parts", *stats[-1],
                 num_parts)
    part = part_kway(lib, comm, g.vtx, g.xadj, g.adj, g.vwgt, num_parts, seed=seed, imbalance=imbalance,
                     adjwgt=None if len(levels) == 1 else g.adjwgt)
    t2 = time.perf_counter()
    part = _refine(comm, g, halos[-1], part, num_parts, limit, REFINE_SWEEPS)
    for lvl in range(len(levels) - 2, -1, -1):
        fine, coarse = levels[lvl], levels[lvl + 1]
        part = _lookup(comm, coarse.vtx, int(coarse.vtx[rank]), maps[lvl], part)
        part = _refine(comm, fine, halos[lvl], part, num_parts, limit, REFINE_SWEEPS)
    t3 = time.perf_counter()
    _peak("refinement")
    other = _refine(comm, levels[0], halos[0], _random_start(comm, k, num_parts, seed), num_parts, limit,
                    RANDOM_SWEEPS)
    t4 = time.perf_counter()
    _peak("random start")
    cuts = {"multilevel": _cut(comm, levels[0], halos[0], part), "random_start": _cut(comm, levels[0], halos[0],
                                                                                       other)}
    loads = {}
    for name, p in (("multilevel", part), ("random_start", other)):
        load = np.bincount(p, weights=vwgt[:, 0], minlength=num_parts)
        comm.Allreduce(MPI.IN_PLACE, load, op=MPI.SUM)
        loads[name] = float(load.max()) * num_parts / max(total, 1)
    ok = {name: loads[name] <= imbalance + 1e-9 for name in cuts}
    chosen = min(cuts, key=lambda c: (not ok[c], cuts[c]))
    info["levels"] = [{"nodes": a, "adjacency": b} for a, b in stats]
    info["cut"] = {name: c // 2 for name, c in cuts.items()}
    info["chosen"] = chosen
    info["seconds"] = {"coarsen": round(t1 - t0, 3), "library": round(t2 - t1, 3), "refine": round(t3 - t2, 3),
                       "random_start": round(t4 - t3, 3)}
    if rank == 0:
        log.info("multilevel: %d level(s), coarsest %d nodes; coarsen %.1f s, library %.1f s, refine %.1f s, "
                 "random start %.1f s; cut %d (multilevel, heaviest part %.3f x the mean) vs %d (random start, "
                 "%.3f): keeping the %s partition", len(levels), stats[-1][0], t1 - t0, t2 - t1, t3 - t2,
                 t4 - t3, cuts["multilevel"] // 2, loads["multilevel"], cuts["random_start"] // 2,
                 loads["random_start"], chosen.replace("_", " "))
    return part if chosen == "multilevel" else other
