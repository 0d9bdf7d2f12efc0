"""Distributed partitioning: every rank reads a slice of the dataset, partitions in parallel, writes its parts.

``partition_distributed(src, out, num_parts, comm)`` is collective over the mpi4py communicator ``comm``
(R ranks; ``num_parts`` need not equal R). It writes the same partition format as the serial
:func:`data_io.partitioner.partition_dataset` (``DIR/partition.json`` + ``part-XXXXX.h5``), so every
reader, ``hpc-graph check`` and the engines accept it unchanged. Phases (each rank):

1. **read** rows ``[N r / R, N (r+1) / R)`` of the CSR (in-edges of those destinations), their labels
   and masks — nothing else of the graph;
2. **assign** a part to each of its rows: ``metis`` symmetrises the graph across ranks (every edge
   ``j -> i`` becomes ``{i, j}`` at the owners of both ends; self loops and duplicates dropped) and
   calls ``ParMETIS_V3_PartKway`` through :mod:`data_io.parmetis` with vertex weights (nodes, and
   training nodes where the library honours a second constraint; PT-Scotch does not, so training-node
   balance is then restored afterwards by swapping training nodes against non-training nodes between
   parts, lowest degree first, which keeps node counts unchanged); ``random`` deals training nodes,
   then the others, round robin after a seeded shuffle (exactly balanced in both, no library);
3. **relabel**: part ``p`` owns new ids ``[node_ranges[p], node_ranges[p+1])`` in ascending original
   id order (the serial partitioner's order, so a serial and a distributed run with the same parts
   write the same files); sources are translated by asking the ranks that read them;
4. **ship** rows (ids, in-edges, edge data, labels, masks) to the rank writing their part (part ``p``
   is written by rank ``p mod R``), which builds the halo, the send lists (halo blocks exchanged
   between writers) and writes the part file; features follow in bounded blocks (at most
   ``feat_block_bytes`` read per rank and round) straight into the writers' files.

Memory per rank is proportional to the rank's share of edges (its slice, the symmetrised slice, the
rows of the parts it writes) and falls with R; no rank ever holds the whole graph. Output appears
only when complete: a temporary directory renamed by rank 0 once every rank has succeeded; on an
error on any rank every rank raises the same :class:`~data_io.errors.DataError` and nothing is left.
The directory must be on a file system every rank sees.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from data_io._arrays import _lookup, _sorted_unique, alltoallv
from data_io.dataset import MASKS, open_dataset
from data_io.errors import DataError, _remove, check_output
from data_io.memory import peak_rss_mb, require_memory
from data_io.integrity import FILE_DIGEST_ATTR, seal
from data_io.partition import META_NAME, Partition, _write_part_h5, part_file_name

log = logging.getLogger(__name__)

METHODS = ("metis", "random")
_FEAT_BLOCK_BYTES = 16 << 20


# -- collective helpers --------------------------------------------------------------------------------

def _agree(comm: Any, fn: Callable[[], Any], what: str) -> Any:
    """Run ``fn`` on every rank; if it raised anywhere, raise one DataError on every rank (no hang)."""
    try:
        value, err = fn(), None
    except DataError as exc:
        value, err = None, str(exc)
    except (OSError, ValueError, MemoryError, KeyError) as exc:
        value, err = None, f"{what}: {type(exc).__name__}: {exc}"
    errors = comm.allgather(err)
    bad = [(r, e) for r, e in enumerate(errors) if e is not None]
    if bad:
        r, e = bad[0]
        if comm.size == 1 or (len(bad) == comm.size and all(x == e for _, x in bad)):
            text = e  # the same on every rank
        else:
            more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
            text = f"rank {r}: {e}{more}"
        err = DataError(text)
        err.collective = True  # the same error on every rank: the CLI prints it once (rank 0)
        raise err
    return value


def _group(dest: np.ndarray, nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable order grouping items by destination rank, and the counts per rank."""
    order = np.argsort(dest, kind="stable")
    return order, np.bincount(dest, minlength=nranks).astype(np.int64)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every (s, l), vectorised (int64)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.repeat(np.asarray(starts, dtype=np.int64) - first, lengths) + np.arange(total, dtype=np.int64)


def estimate_rank_bytes(local_nodes: int, local_edges: int, feat_dim: int, method: str = "metis") -> int:
    """Peak memory of one rank of :func:`partition_distributed`, in bytes.

    With k = its rows and e = their in-edges: ``m e + 200 k + 5 min(16 MiB, 4 F k) + 64 MiB``, where
    m = 240 bytes per edge with ``metis`` (the symmetrised slice as int64 pairs, sent and received,
    sorted and deduplicated, then the library's distributed graph) and 100 with ``random`` (source
    translation and the rows shipped to the writers); 5 copies of a feature block (read, reordered,
    send and receive buffers, the received rows); 64 MiB for the interpreter, NumPy, h5py and MPI.
    Measured on R-MAT scale 16 (1.82 M edges, 4 parts; peak RSS of the rank with the most edges):
    metis 1 rank 354 MB (model 534), 2 ranks 276 MB (model 346); random 1 rank 318 MB with 64 MiB
    blocks (model 367). It errs high; it is meant to stop a job that cannot fit, not to pack one.
    """
    per_edge = 240 if method == "metis" else 100
    feat = 5 * min(_FEAT_BLOCK_BYTES, 4 * int(feat_dim) * int(local_nodes))
    return int(per_edge * local_edges + 200 * local_nodes + feat + (64 << 20))


def _slice(n: int, r: int, R: int) -> tuple[int, int]:
    return n * r // R, n * (r + 1) // R


# -- part assignment -----------------------------------------------------------------------------------

def _symmetrise(comm: Any, lo: int, hi: int, n: int, indptr: np.ndarray,
                indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the undirected simple graph: ``(xadj int64[k+1], adjncy int64)`` global ids.

    Every edge ``j -> i`` is kept as ``i``'s entry ``j`` and sent, as one int64 key ``j n + i``, to the
    owner of ``j``; the keys are sorted in place, which also groups them by owner (about 40 bytes per edge
    at the peak).
    """
    R = comm.size
    vtx = np.array([_slice(n, r, R)[0] for r in range(R + 1)], dtype=np.int64)
    dst = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr))
    src = indices.astype(np.int64)
    keep = src != dst
    dst, src = dst[keep], src[keep]
    del keep
    out_key = src * n
    out_key += dst  # (j, i) for the owner of j
    dst -= lo
    dst *= n
    dst += src  # this rank's entry (i, j) as (i - lo) n + j
    own, src = dst, None
    out_key.sort()
    counts = np.diff(np.searchsorted(out_key, vtx * n)).astype(np.int64)
    recv, _ = alltoallv(comm, out_key, counts)
    del out_key
    recv -= lo * n
    key = np.concatenate([own, recv])
    del own, recv
    key.sort()
    first = np.empty(len(key), dtype=bool)
    if len(key):
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
    key = key[first]  # sorted by row, then column; duplicates gone
    del first
    r_local = key // n
    xadj = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(r_local, minlength=hi - lo), out=xadj[1:])
    r_local *= n
    np.subtract(key, r_local, out=key)
    return xadj, key


def _library_parts(comm: Any, lib: Any, n: int, vtx: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                   vw: np.ndarray, num_parts: int, seed: int, imbalance: float, info: dict,
                   coarsen_to: int = 0) -> np.ndarray:
    """Parts of this rank's nodes from the ParMETIS API, with nodes without edges left out of the call.

    A node with no edge cannot be cut, so it need not enter the library: the connected nodes are
    relabelled contiguously (ranks keep their order) and split into the fewest parts that can hold them at
    an equal share of ``n / num_parts`` nodes each, ``ceil(c * num_parts / n)`` for ``c`` connected
    nodes; the nodes without edges then fill every part up to ``ceil(n / num_parts)`` nodes, in part
    order. The node balance stays within ``imbalance``; the cut only counts the connected graph, split
    into fewer parts. METIS' recursive bisection finds the same trade on its own (on R-MAT graphs,
    where 29-34 % of the nodes have no edge, this is what puts serial METIS' cut far below a k-way
    partitioner's). Parts past the first ``ceil(c * num_parts / n)`` hold no edges: like serial METIS'
    partitions of such graphs they balance nodes, not work. Falls back to one call on the whole graph
    when every node has an edge, when the connected nodes need all parts, or when some rank holds no
    connected node (the API needs >= 1 node per rank).
    With ``coarsen_to`` > 0 the call goes through :func:`data_io.multilevel.multilevel_part_kway`: the
    graph is coarsened in parallel to at most that many nodes before the library sees it.
    ``info`` gets ``isolated_nodes``, ``library_parts`` and, with coarsening, ``multilevel``.
    """
    from mpi4py import MPI

    from data_io.multilevel import multilevel_part_kway

    def part_kway(lib, comm, vtx, xadj, adjncy, vw, parts, seed, imbalance):
        ml: dict = {}
        out = multilevel_part_kway(lib, comm, vtx, xadj, adjncy, vw, parts, seed=seed, imbalance=imbalance,
                                   coarsen_to=coarsen_to, info=ml)
        info["multilevel"] = ml
        return out

    isolated = np.diff(xadj) == 0
    keep = np.flatnonzero(~isolated)
    counts = np.asarray(comm.allgather(len(keep)), dtype=np.int64)
    c = int(counts.sum())
    info["isolated_nodes"] = n - c
    lib_parts = min(num_parts, max(1, -(-c * num_parts // n)))
    if c == n or c == 0 or counts.min() == 0 or lib_parts == num_parts:
        info["library_parts"] = num_parts
        return part_kway(lib, comm, vtx, xadj, adjncy, vw, num_parts, seed, imbalance)
    info["library_parts"] = lib_parts
    if comm.rank == 0:
        log.info("%d of %d nodes have no edge: the library splits the other %d into %d part(s); they fill the "
                 "parts up to %d nodes", n - c, n, c, lib_parts, -(-n // num_parts))
    rank = comm.rank
    off = int(counts[:rank].sum())
    new_id = np.full(len(isolated), -1, dtype=np.int64)
    new_id[keep] = off + np.arange(len(keep), dtype=np.int64)
    sub_adj = _lookup(comm, vtx, int(vtx[rank]), adjncy, new_id)
    _mark({}, "connected subgraph")
    sub_xadj = np.concatenate([xadj[keep], xadj[-1:]])
    sub_vtx = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if lib_parts == 1:
        sub = np.zeros(len(keep), dtype=np.int64)
    else:
        sub = part_kway(lib, comm, sub_vtx, sub_xadj, sub_adj, vw[keep], lib_parts, seed, imbalance)
    del sub_adj, sub_xadj
    parts = np.empty(len(isolated), dtype=np.int64)
    parts[keep] = sub
    load = np.bincount(sub, minlength=num_parts).astype(np.int64)
    comm.Allreduce(MPI.IN_PLACE, load, op=MPI.SUM)
    room = np.maximum(-(-n // num_parts) - load, 0)  # sums to >= n - c: every part may hold ceil(n/P)
    lonely = np.flatnonzero(isolated)
    first = comm.exscan(len(lonely), op=MPI.SUM) or 0
    parts[lonely] = np.searchsorted(np.cumsum(room), first + np.arange(len(lonely)), side="right")
    return parts


def _random_parts(comm: Any, num_parts: int, seed: int, train: np.ndarray) -> np.ndarray:
    """Seeded round-robin deal after a shuffle: training nodes first, then the rest (exact balance)."""
    from mpi4py import MPI

    k = len(train)
    rng = np.random.default_rng([int(seed), comm.rank])
    parts = np.empty(k, dtype=np.int64)
    total_train = comm.allreduce(int(train.sum()), op=MPI.SUM)
    for flag, base in ((True, 0), (False, total_train)):
        ids = np.flatnonzero(train == flag)
        ids = ids[rng.permutation(len(ids))]
        before = comm.exscan(len(ids), op=MPI.SUM) or 0
        parts[ids] = (base + before + np.arange(len(ids))) % num_parts
    return parts


def _take_in_order(comm: Any, parts: np.ndarray, eligible: np.ndarray, degree: np.ndarray,
                   moves: list[tuple[int, int, int]]) -> np.ndarray:
    """Apply ``moves`` (from part a, to part b, k nodes) to eligible nodes of part a, lowest degree first
    within a rank and ranks in order; returns the new parts."""
    from mpi4py import MPI

    out = parts.copy()
    for a in sorted({m[0] for m in moves}):
        cand = np.flatnonzero(eligible & (parts == a))
        cand = cand[np.argsort(degree[cand], kind="stable")]
        start = comm.exscan(len(cand), op=MPI.SUM) or 0
        pos = 0
        for (src, dst, k) in moves:
            if src != a:
                continue
            lo_, hi_ = max(pos, start), min(pos + k, start + len(cand))
            if hi_ > lo_:
                out[cand[lo_ - start:hi_ - start]] = dst
            pos += k
    return out


def _repair_train(comm: Any, parts: np.ndarray, train: np.ndarray, degree: np.ndarray, num_parts: int,
                  tol: float) -> tuple[np.ndarray, int]:
    """Bring every part's training nodes to at most ``tol`` x the mean by swapping training nodes of full
    parts with non-training nodes of parts short of them (node counts unchanged); returns (parts, swaps)."""
    from mpi4py import MPI

    t = np.bincount(parts[train], minlength=num_parts).astype(np.int64)
    comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)
    nodes = np.bincount(parts, minlength=num_parts).astype(np.int64)
    comm.Allreduce(MPI.IN_PLACE, nodes, op=MPI.SUM)
    total = int(t.sum())
    if total == 0:
        return parts, 0
    cap = max(int(np.floor(tol * total / num_parts)), -(-total // num_parts))
    excess = np.maximum(t - cap, 0)
    room = np.minimum(np.maximum(cap - t, 0), nodes - t)  # non-training nodes available to swap out
    moves, give = [], []
    for a in np.argsort(-excess, kind="stable"):
        left = int(excess[a])
        for b in np.argsort(t, kind="stable"):  # fewest training nodes first
            if left == 0:
                break
            k = int(min(left, room[b]))
            if b == a or k <= 0:
                continue
            moves.append((int(a), int(b), k))
            give.append((int(b), int(a), k))
            room[b] -= k
            left -= k
    if not moves:
        return parts, 0
    new = _take_in_order(comm, parts, train, degree, moves)
    new = _take_in_order(comm, new, ~train, degree, give)
    return new, sum(m[2] for m in moves)


# -- the partitioner -----------------------------------------------------------------------------------

def partition_distributed(src_h5: str | os.PathLike, out_dir: str | os.PathLike, num_parts: int, comm: Any = None,
                          method: str = "metis", seed: int = 0, force: bool = False,
                          imbalance: float = 1.05, feat_block_bytes: int = _FEAT_BLOCK_BYTES,
                          coarsen_to: int | None = None) -> dict:
    """Partition ``src_h5`` into ``out_dir`` with every rank of ``comm`` taking part (collective).

    Args:
        src_h5: dataset file (format ``hpc_graph.dataset`` v1), on a file system every rank reads.
        out_dir: partition directory to write (must not exist unless ``force``).
        num_parts: number of parts, ``1 <= num_parts <= num_nodes`` (any number of ranks).
        comm: mpi4py communicator (default ``MPI.COMM_WORLD``); needs ``num_nodes >= comm.size``.
        method: ``"metis"`` (the ParMETIS API, :mod:`data_io.parmetis`) or ``"random"``.
        seed: partitioner seed.
        force: replace an existing ``out_dir`` and skip the memory check (each rank's estimate,
            :func:`estimate_rank_bytes`, times the ranks on its node, against the node's memory).
        imbalance: allowed max/mean of nodes and training nodes per part (ParMETIS' ``ubvec``).
        feat_block_bytes: feature bytes a rank reads per round.
        coarsen_to: ``metis``: coarsen the graph in parallel to at most this many nodes before the library
            partitions it (:mod:`data_io.multilevel`; None: its default, 0: the library gets the whole graph).
    Returns:
        the statistics written to ``partition.json`` (same keys as the serial partitioner's, plus
        ``distributed``: ranks, library, training-node swaps, peak memory per rank).
    Raises:
        DataError: on every rank, when any rank fails (bad input, no library, write failure).
    """
    from mpi4py import MPI

    from data_io.multilevel import COARSEN_TO
    from data_io.partitioner import build_meta, file_sha256

    comm = MPI.COMM_WORLD if comm is None else comm
    R, rank = comm.size, comm.rank
    src, out = Path(src_h5), Path(out_dir)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def check_inputs():
        if method not in METHODS:
            raise DataError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
        if not 1.0 < float(imbalance) < 2.0:
            raise DataError(f"imbalance: expected a number in (1, 2), got {imbalance!r}")
        if coarsen_to is not None and (isinstance(coarsen_to, bool) or not isinstance(coarsen_to, (int, np.integer))
                                       or coarsen_to < 0):
            raise DataError(f"coarsen_to: expected a node count >= 0, got {coarsen_to!r}")
        check_output(out, force)
        ds = open_dataset(src, check_values=False)
        if ds.task != "node":
            ds.close()
            raise DataError(f"{src}: task={ds.task!r}: only node-level datasets can be partitioned")
        n = ds.num_nodes
        if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) or not 1 <= num_parts <= n:
            ds.close()
            raise DataError(f"{src}: num_parts must be in [1, {n}] (number of nodes), got {num_parts!r}")
        if n < R:
            ds.close()
            raise DataError(f"{src}: {n} nodes for {R} ranks: run with at most {n} ranks")
        lo_, hi_ = _slice(n, rank, R)
        need = estimate_rank_bytes(hi_ - lo_, ds.edges_in_rows(lo_, hi_), ds.feat_dim, method) * local_ranks
        try:
            require_memory(need, f"partition --distributed on {R} rank(s) ({local_ranks} on this node)",
                           force=force, hint="use more ranks (or nodes)")
        except DataError:
            ds.close()
            raise
        lib = None
        if method == "metis" and num_parts > 1:
            from data_io.parmetis import load_library

            lib = load_library()
        return ds, lib

    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_ranks = node_comm.Get_size()  # ranks sharing this node's memory
    node_comm.Free()
    ds, lib = _agree(comm, check_inputs, str(src))
    P = int(num_parts)
    try:
        n = ds.num_nodes
        lo, hi = _slice(n, rank, R)
        tmp = None
        if rank == 0:
            tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
            _remove(tmp)
        tmp = Path(comm.bcast(str(tmp) if tmp else None, root=0))
        digest: dict[str, str] = {}
        hasher = None
        if rank == 0:  # the checksum of the source runs beside the partitioning (hashlib drops the GIL)
            hasher = threading.Thread(target=lambda: digest.__setitem__("sha", file_sha256(src)), daemon=True)
            hasher.start()
        try:
            meta = _run(comm, ds, src, tmp, lo, hi, P, method, seed, lib, imbalance, feat_block_bytes, timings,
                        build_meta, COARSEN_TO if coarsen_to is None else int(coarsen_to))
            if rank == 0:
                t = time.perf_counter()
                hasher.join()
                timings["checksum_wait"] = time.perf_counter() - t
                meta["source"]["sha256"] = digest.get("sha")
                timings["total"] = time.perf_counter() - t_start
                meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}

            def finish():
                if rank == 0:
                    (tmp / META_NAME).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
                    if out.exists():
                        if not force:
                            raise DataError(f"{out}: output exists (use --force to overwrite)")
                        _remove(out)
                    os.replace(tmp, out)

            _agree(comm, finish, str(out))
        except BaseException:
            if rank == 0:
                _remove(tmp)
            raise
    finally:
        ds.close()
    meta = comm.bcast(meta if rank == 0 else None, root=0)
    if rank == 0:
        log.info("wrote %s: %d parts on %d ranks, edge cut %d (%.2f%%), node balance %.3f, train balance %.3f",
                 out, P, R, meta["edge_cut"], 100 * meta["edge_cut_fraction"], meta["balance"]["nodes"],
                 meta["balance"]["train"])
    return meta


def _mark(peaks: dict, phase: str) -> None:
    """Record this rank's peak RSS so far after ``phase`` (where the memory goes, in the log)."""
    peaks[phase] = round(peak_rss_mb(), 1)
    log.debug("peak RSS after %s: %.0f MB", phase, peaks[phase])


def _run(comm, ds, src, tmp, lo, hi, P, method, seed, lib, imbalance, feat_block_bytes, timings, build_meta,
         coarsen_to):
    from mpi4py import MPI

    peaks: dict[str, float] = {}

    R, rank = comm.size, comm.rank
    n = ds.num_nodes
    k = hi - lo
    vtx = np.array([_slice(n, r, R)[0] for r in range(R + 1)], dtype=np.int64)

    # 1. read this rank's slice
    t = time.perf_counter()
    log.info("rank %d: reading rows %d..%d of %s", rank, lo, hi, src)

    def read():
        ptr, idx, ew, et = ds.graph_rows(lo, hi)
        node = {f: ds.node_rows(f, lo, hi) for f in ("label",) + MASKS if ds.has(f)}
        return ptr, idx, ew, et, node

    indptr, indices, ew, et, node = _agree(comm, read, str(src))
    train = node["train_mask"].astype(bool) if "train_mask" in node else np.zeros(k, dtype=bool)
    timings["read"] = time.perf_counter() - t
    _mark(peaks, "read")

    # 2. assign parts
    t = time.perf_counter()
    swaps = 0
    lib_info: dict = {}
    degree = np.diff(indptr)
    if P == 1:
        parts = np.zeros(k, dtype=np.int64)
    elif method == "random":
        parts = _random_parts(comm, P, seed, train)
    else:
        xadj, adjncy = _symmetrise(comm, lo, hi, n, indptr, indices)
        timings["symmetrise"] = time.perf_counter() - t
        _mark(peaks, "symmetrise")
        t1 = time.perf_counter()
        has_train = comm.allreduce(bool(train.any()), op=MPI.LOR)
        vw = np.stack([np.ones(k, np.int64)] + ([train.astype(np.int64)] if has_train else []), 1)
        log.info("rank %d: ParMETIS_V3_PartKway on %d of %d vertices, %d adjacency entries, %d parts",
                 rank, k, n, len(adjncy), P)
        parts = _agree(comm, lambda: _library_parts(comm, lib, n, vtx, xadj, adjncy, vw, P, seed, imbalance,
                                                    lib_info, coarsen_to), "ParMETIS")
        del xadj, adjncy
        timings["parmetis"] = time.perf_counter() - t1
        _mark(peaks, "parmetis")
        if has_train:
            parts, swaps = _repair_train(comm, parts, train, degree, P, imbalance)
            if swaps and rank == 0:
                log.info("training-node balance: %d swap(s) between parts (the library balanced nodes only)", swaps)
    timings["assign"] = time.perf_counter() - t
    _mark(peaks, "assign")

    # 3. relabel: new id = node_ranges[p] + (part-p nodes on lower ranks) + order among mine
    t = time.perf_counter()
    counts = np.bincount(parts, minlength=P).astype(np.int64)
    all_counts = np.empty((R, P), dtype=np.int64)
    comm.Allgather(counts, all_counts)
    node_ranges = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(all_counts.sum(0), out=node_ranges[1:])
    base = node_ranges[:-1] + all_counts[:rank].sum(0)
    order = np.argsort(parts, kind="stable")  # ascending original id within a part
    new_id = np.empty(k, dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(counts)])
    for p in np.flatnonzero(counts):
        new_id[order[offs[p]:offs[p + 1]]] = base[p] + np.arange(counts[p])
    src_new = _lookup(comm, vtx, lo, indices, new_id)  # translate sources: ask the ranks that read them
    timings["relabel"] = time.perf_counter() - t
    _mark(peaks, "relabel")

    # 4. ship rows to the writers of their parts; writer of part p is rank p % R
    t = time.perf_counter()
    row_part = parts
    writer = row_part % R
    rorder, rcounts = _group(writer, R)
    deg = degree[rorder]
    eorder = _ranges(indptr[rorder], deg)
    ecounts = np.bincount(writer, weights=degree, minlength=R).astype(np.int64)
    rows = np.stack([new_id[rorder], np.arange(lo, hi, dtype=np.int64)[rorder], deg], 1)
    recv_rows, _ = alltoallv(comm, rows, rcounts)
    recv_src, _ = alltoallv(comm, src_new[eorder], ecounts)
    recv_ew = alltoallv(comm, ew[eorder], ecounts)[0] if ew is not None else None
    recv_et = alltoallv(comm, et[eorder], ecounts)[0] if et is not None else None
    recv_node = {f: alltoallv(comm, v[rorder], rcounts)[0] for f, v in node.items()}
    del rows, src_new, eorder, indices, ew, et
    timings["ship"] = time.perf_counter() - t
    _mark(peaks, "ship")

    # 5. writers build their parts: halo, local CSR; halo blocks exchanged for the send lists
    t = time.perf_counter()
    mine = [p for p in range(P) if p % R == rank]
    order = np.argsort(recv_rows[:, 0], kind="stable")
    gid = recv_rows[order, 0]
    eptr = np.zeros(len(recv_rows) + 1, dtype=np.int64)
    np.cumsum(recv_rows[:, 2], out=eptr[1:])
    parts_out: dict[int, dict] = {}
    halo_blocks, halo_dest, halo_key = [], [], []
    for p in mine:
        g0, g1 = int(node_ranges[p]), int(node_ranges[p + 1])
        a, b = np.searchsorted(gid, [g0, g1])
        rows_p = order[a:b]  # received rows of part p, by new id
        if len(rows_p) != g1 - g0 or (len(rows_p) and not np.array_equal(gid[a:b], np.arange(g0, g1))):
            raise DataError(f"internal: part {p} received {len(rows_p)} rows for {g1 - g0} ids")
        sel = _ranges(eptr[rows_p], recv_rows[rows_p, 2])
        srcs = recv_src[sel]
        remote = (srcs < g0) | (srcs >= g1)
        halo = _sorted_unique(srcs[remote])
        local = np.empty(len(srcs), dtype=np.int64)
        local[~remote] = srcs[~remote] - g0
        local[remote] = (g1 - g0) + np.searchsorted(halo, srcs[remote])
        ptr = np.zeros(len(rows_p) + 1, dtype=np.int64)
        np.cumsum(recv_rows[rows_p, 2], out=ptr[1:])
        halo_offsets = np.searchsorted(halo, node_ranges).astype(np.int64)
        parts_out[p] = dict(
            orig=recv_rows[rows_p, 1], halo=halo, halo_offsets=halo_offsets, indptr=ptr, indices=local,
            edge_weight=None if recv_ew is None else recv_ew[sel],
            edge_type=None if recv_et is None else recv_et[sel],
            node={f: v[rows_p] for f, v in recv_node.items()}, cut=int(remote.sum()))
        for q in np.flatnonzero(np.diff(halo_offsets)):
            blk = halo[halo_offsets[q]:halo_offsets[q + 1]]
            halo_blocks.append(blk - node_ranges[q])  # as q's local ids
            halo_dest.append(np.full(len(blk), q % R, dtype=np.int64))
            halo_key.append(np.stack([np.full(len(blk), q), np.full(len(blk), p)], 1))
    del recv_src, recv_ew, recv_et, recv_rows
    if halo_blocks:
        hb, hd, hk = np.concatenate(halo_blocks), np.concatenate(halo_dest), np.concatenate(halo_key)
    else:
        hb, hd, hk = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    horder, hcounts = _group(hd, R)
    payload = np.concatenate([hk[horder], hb[horder, None]], 1)
    got, _ = alltoallv(comm, payload, hcounts)  # (owner part q, asking part p, q-local id)
    timings["halo"] = time.perf_counter() - t
    _mark(peaks, "halo")

    # 6. write the part files (features filled in the next phase)
    t = time.perf_counter()
    files: dict[int, h5py.File] = {}
    stats: dict[int, dict] = {}

    def write_parts():
        for p in mine:
            d = parts_out[p]
            sel = got[got[:, 0] == p]
            sel = sel[np.lexsort((sel[:, 2], sel[:, 1]))]  # by asking part, then gid (ascending = halo order)
            send_offsets = np.searchsorted(sel[:, 1], np.arange(P + 1)).astype(np.int64)
            part = Partition(
                part_id=p, num_parts=P, node_ranges=node_ranges, orig_id=d["orig"], halo_gid=d["halo"],
                halo_offsets=d["halo_offsets"], indptr=d["indptr"], indices=d["indices"],
                send_offsets=send_offsets, send_lid=sel[:, 2].copy(), edge_weight=d["edge_weight"],
                edge_type=d["edge_type"], num_classes=ds.num_classes, global_num_nodes=n,
                global_num_edges=ds.num_edges, name=ds.name, **d["node"])
            log.info("rank %d: writing part %d/%d (%d nodes, %d edges, %d halo nodes)", rank, p + 1, P,
                     part.num_owned, part.num_edges, part.num_halo)
            files[p] = h5py.File(tmp / part_file_name(p), "w")
            _write_part_h5(files[p], part, ds.feat_dim)
            tr = d["node"].get("train_mask")
            stats[p] = dict(edges=part.num_edges, halo=part.num_halo, send=len(sel), cut=d["cut"],
                            train=int(tr.sum()) if tr is not None else 0)

    try:
        if rank == 0:
            _agree(comm, lambda: tmp.mkdir(), str(tmp))
        else:
            _agree(comm, lambda: None, str(tmp))
        _agree(comm, write_parts, str(tmp))
        parts_out = None  # write_parts is done: the parts' arrays are released
        timings["write"] = time.perf_counter() - t
        _mark(peaks, "write")

        # 7. features: each rank reads its rows in blocks and sends them to the writers
        t = time.perf_counter()
        if ds.feat_dim:
            _agree(comm, lambda: _scatter_features(comm, ds, lo, hi, new_id, writer, node_ranges, files,
                                                   feat_block_bytes), "features")
        timings["features"] = time.perf_counter() - t
        _mark(peaks, "features")
        t = time.perf_counter()

        def seal_parts():  # digests last: every part's content is final
            for p, f in files.items():
                stats[p]["digest"] = seal(f)

        _agree(comm, seal_parts, "checksums")
        timings["checksums"] = time.perf_counter() - t
    finally:
        for f in files.values():
            f.close()

    # 8. statistics to rank 0 -> partition.json
    every = comm.gather(stats, root=0)
    peak = comm.gather(peak_rss_mb(), root=0)
    phase_peaks = comm.gather(peaks, root=0)
    if rank != 0:
        return None
    st = {p: s for d in every for p, s in d.items()}
    arr = {key: np.array([st[p][key] for p in range(P)], dtype=np.int64) for key in ("edges", "halo", "send", "cut",
                                                                                      "train")}
    lib_name = None if lib is None else lib.path
    meta = build_meta(ds, src, node_ranges, arr["edges"], arr["halo"], arr["send"], arr["train"], arr["cut"],
                      method, seed)
    for p in range(P):
        meta["parts"][p][FILE_DIGEST_ATTR] = st[p]["digest"]
    meta["balance_edges"] = False
    meta["distributed"] = {"ranks": R, "library": lib_name, "train_swaps": int(swaps), **lib_info,
                           "peak_rss_mb_per_rank": [round(x, 1) for x in peak],
                           "peak_rss_mb_after_phase": phase_peaks}
    return meta


def _scatter_features(comm, ds, lo, hi, new_id, writer, node_ranges, files, block_bytes) -> None:
    """Rows of this rank's slice, in blocks, to the ranks writing their parts (rows of one sending rank
    for one part are consecutive new ids, so each lands as one contiguous write)."""
    from mpi4py import MPI

    R = comm.size
    F = ds.feat_dim
    step = max(1, block_bytes // (4 * F))
    rounds = comm.allreduce(-(-(hi - lo) // step), op=MPI.MAX)
    for i in range(rounds):
        s, e = min(hi, lo + i * step), min(hi, lo + (i + 1) * step)
        block = ds.feat_rows(s, e) if e > s else np.zeros((0, F), np.float32)
        ids = new_id[s - lo:e - lo]
        order, counts = _group(writer[s - lo:e - lo], R)
        rows, _ = alltoallv(comm, np.ascontiguousarray(block[order], dtype=np.float32), counts)
        gids, _ = alltoallv(comm, ids[order], counts)
        if len(gids):
            o = np.argsort(gids, kind="stable")
            gids, rows = gids[o], rows[o]
            p_of = np.searchsorted(node_ranges, gids, side="right") - 1
            breaks = np.flatnonzero((np.diff(gids) != 1) | (np.diff(p_of) != 0)) + 1
            for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [len(gids)]])):
                p = int(p_of[a])
                l0 = int(gids[a] - node_ranges[p])
                files[p]["/node/feat"][l0:l0 + (b - a)] = rows[a:b]
        if comm.rank == 0:
            log.debug("features: round %d/%d", i + 1, rounds)
