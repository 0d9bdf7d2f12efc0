"""Split a dataset file into a partitioned dataset directory (METIS or random).

``partition_dataset`` reads the CSR of a dataset file, assigns every node to a
part, relabels the nodes so that each part owns a contiguous range of new
global ids, and writes ``DIR/partition.json`` plus one ``part-XXXXX.h5`` per
part (format in :mod:`data_io.partition`). The directory appears only when
complete (written under a temporary name, then renamed).

Memory: the CSR of the source (plus one relabelled copy and the symmetrised
graph METIS needs) and at most a bounded block of feature rows (features are
streamed from the source once per group of up to ``_MAX_OPEN`` parts and
scattered to the parts' files by contiguous row ranges).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import h5py
import numpy as np

from data_io.dataset import MASKS, Dataset, open_dataset
from data_io.errors import DataError, atomic_output, check_output
from data_io.integrity import DIGEST_ATTR, FILE_DIGEST_ATTR, Digest, seal
from data_io.partition import FORMAT, META_NAME, VERSION, Partition, _write_part_h5, part_file_name

log = logging.getLogger(__name__)

METHODS = ("metis", "random")
# feature bytes read from the source per step
_FEAT_BLOCK_BYTES = 64 << 20
# part files open at once while scattering features (one pass over the features per group)
_MAX_OPEN = 64


def file_sha256(path: str | os.PathLike, block: int = 8 << 20) -> str:
    """Hex sha256 of a whole file, read in ``block``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                return h.hexdigest()
            h.update(b)


def _symmetrise(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Undirected simple graph of a destination-major CSR: ``(xadj int64[N+1], adjncy int64[2M])``.

    Every edge ``j -> i`` with ``i != j`` becomes ``{i, j}`` (stored both ways);
    self loops and duplicate edges are dropped, as METIS requires.
    """
    import scipy.sparse as sp

    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=indices.dtype), np.diff(indptr))
    data = indices != dst
    del dst
    a = sp.csr_matrix((data, indices.copy(), indptr.copy()), shape=(n, n))
    del data
    a.eliminate_zeros()  # drop self loops
    s = (a + a.T).tocsr()
    del a
    s.sum_duplicates()
    return s.indptr.astype(np.int64), s.indices.astype(np.int64)


def _random_parts(num_nodes: int, num_parts: int, seed: int, train: np.ndarray | None) -> np.ndarray:
    """Seeded random assignment, balanced in nodes and in training nodes (int64[N])."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_nodes)
    if train is not None:  # training nodes first (in random order), then dealt round robin
        order = order[np.argsort(~train[order], kind="stable")]
    parts = np.empty(num_nodes, dtype=np.int64)
    parts[order] = np.arange(num_nodes, dtype=np.int64) % num_parts
    return parts


def assign_parts(indptr: np.ndarray, indices: np.ndarray, num_parts: int, method: str = "metis",
                 seed: int = 0, train_mask: np.ndarray | None = None,
                 timings: dict | None = None, balance_edges: bool = False) -> np.ndarray:
    """Assign each node of a destination-major CSR graph to a part.

    Args:
        indptr: int64[N+1]; indices: int32|int64[E] (sources of the edges into each row).
        num_parts: number of parts P, ``1 <= P <= N``.
        method: ``"metis"`` (METIS from pymetis' library on the symmetrised graph without
            self loops: recursive bisection up to 8 parts, k-way above; two balance
            constraints, nodes and training nodes, when ``train_mask`` has any) or
            ``"random"`` (seeded baseline, balanced in nodes and training nodes).
        seed: METIS / random seed.
        train_mask: bool[N] or None.
        timings: optional dict receiving ``symmetrise`` and ``metis`` seconds.
        balance_edges: METIS only: one more balance constraint, each node weighted by its
            in-degree + 1, so that every part gets about the same number of in-edges (the
            aggregation work and graph memory of its rank). On power-law graphs this costs
            edge cut: R-MAT scale 16 into 4 parts, edges max/mean 3.39 -> 1.02, cut 2.5x.
    Returns:
        int64[N] part of each node, in ``[0, P)``.
    """
    n = len(indptr) - 1
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if not 1 <= num_parts <= n:
        raise ValueError(f"num_parts: must be in [1, {n}] (number of nodes), got {num_parts}")
    train = None if train_mask is None or not np.any(train_mask) else np.asarray(train_mask, dtype=bool)
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    if method == "random":
        return _random_parts(n, num_parts, seed, train)
    import pymetis

    t0 = time.perf_counter()
    log.info("symmetrising %d nodes, %d edges for METIS", n, len(indices))
    xadj, adjncy = _symmetrise(indptr, indices)
    t1 = time.perf_counter()
    if timings is not None:
        timings["symmetrise"] = t1 - t0
    if len(adjncy) == 0:
        log.warning("graph has no edges between distinct nodes: using a balanced random assignment")
        return _random_parts(n, num_parts, seed, train)
    columns = [np.ones(n, dtype=np.int64)]  # nodes
    if train is not None:
        columns.append(train.astype(np.int64))
    if balance_edges:
        columns.append(np.diff(np.asarray(indptr, dtype=np.int64)) + 1)  # in-edges (+1: no zero weights)
    ncon = len(columns)
    log.info("METIS: %d parts, %d nodes, %d undirected edges, %d balance constraint(s)%s",
             num_parts, n, len(adjncy) // 2, ncon, " (incl. in-edges)" if balance_edges else "")
    vw = np.stack(columns, axis=1)
    del columns
    try:
        cut, parts = _metis(xadj, adjncy, vw, num_parts, seed)
    except _NoMetisABI as exc:  # pymetis without the C entry points: one constraint only
        if balance_edges:
            raise DataError(f"balance_edges: needs METIS' multi-constraint entry point, which this "
                            f"pymetis does not expose ({exc})") from None
        log.warning("METIS multi-constraint call unavailable (%s): balancing nodes only", exc)
        res = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), options=pymetis.Options(seed=int(seed)))
        cut, parts = res.edge_cuts, np.asarray(res.vertex_part, dtype=np.int64)
    del xadj, adjncy
    if timings is not None:
        timings["metis"] = time.perf_counter() - t1
    log.info("METIS done in %.1f s (its edge cut, undirected: %d)", time.perf_counter() - t1, cut)
    return parts


class _NoMetisABI(Exception):
    """The METIS C entry points cannot be reached through pymetis' extension module."""


def _metis(xadj: np.ndarray, adjncy: np.ndarray, vwgt: np.ndarray, num_parts: int,
           seed: int) -> tuple[int, np.ndarray]:
    """Call METIS with ``ncon = vwgt.shape[1]`` balance constraints; return ``(edge_cut, part int64[N])``.

    pymetis' ``part_graph`` always passes ``ncon=1`` to METIS, so the library
    statically linked into its extension module is called directly through
    ctypes (recursive bisection up to 8 parts, k-way above, as pymetis does).
    ``tpwgts``/``ubvec`` are left NULL (METIS defaults), so only ``idx_t``
    arrays cross the boundary.
    """
    import ctypes

    import pymetis
    import pymetis._internal as ext

    try:
        width = ext._idx_type_width()
        lib = ctypes.CDLL(ext.__file__)
        fn = lib.METIS_PartGraphRecursive if num_parts <= 8 else lib.METIS_PartGraphKway
        set_defaults = lib.METIS_SetDefaultOptions
        seed_index = int(ext.options_indices.SEED)
    except (AttributeError, OSError) as exc:
        raise _NoMetisABI(str(exc)) from None
    idx = {32: np.int32, 64: np.int64}[width]
    n, ncon = vwgt.shape
    if n > np.iinfo(idx).max or len(adjncy) > np.iinfo(idx).max:
        raise DataError(f"graph too large for METIS built with {width}-bit indices")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 13
    set_defaults.argtypes = [ctypes.c_void_p]
    options = np.zeros(64, dtype=idx)  # METIS_NOPTIONS is 40
    set_defaults(options.ctypes.data)
    options[seed_index] = int(seed)
    arrays = dict(nvtxs=np.array([n], idx), ncon=np.array([ncon], idx), xadj=xadj.astype(idx, copy=False),
                  adjncy=adjncy.astype(idx, copy=False), vwgt=np.ascontiguousarray(vwgt, dtype=idx).ravel(),
                  nparts=np.array([num_parts], idx), edgecut=np.zeros(1, idx), part=np.zeros(n, idx))
    a = {k: v.ctypes.data for k, v in arrays.items()}
    status = fn(a["nvtxs"], a["ncon"], a["xadj"], a["adjncy"], a["vwgt"], None, None, a["nparts"],
                None, None, options.ctypes.data, a["edgecut"], a["part"])
    if status != 1:  # METIS_OK
        kind = {-2: "input error", -3: "out of memory", -4: "error"}.get(status, f"status {status}")
        raise DataError(f"METIS failed ({kind}) on a graph of {n} nodes, {len(adjncy) // 2} edges, "
                        f"{num_parts} parts (pymetis {getattr(pymetis, '__version__', '?')})")
    return int(arrays["edgecut"][0]), arrays["part"].astype(np.int64, copy=False)


def _max_over_mean(x: np.ndarray) -> float:
    m = float(np.mean(x)) if len(x) else 0.0
    return float(np.max(x) / m) if m > 0 else 1.0


def _check_memory(src: Path, num_parts, method: str, force: bool) -> None:
    """Refuse (MemoryRefusal) when the estimated peak memory exceeds what is available; reads the header only."""
    from data_io.memory import estimate_partition_bytes, require_memory

    with open_dataset(src, check_values=False) as hdr:
        parts = int(num_parts) if isinstance(num_parts, (int, np.integer)) and not isinstance(num_parts, bool) else 1
        need = estimate_partition_bytes(hdr.num_nodes, hdr.num_edges, hdr.feat_dim, parts, method=method,
                                        directed=hdr.directed, index_bytes=hdr._fields["indices"].dtype.itemsize,
                                        edge_weight=hdr.has("edge_weight"), edge_type=hdr.has("edge_type"))
    require_memory(need, f"partition {src} into {num_parts} parts", force=force,
                   hint="partition it with --distributed over several nodes")


def partition_dataset(src_h5: str | os.PathLike, out_dir: str | os.PathLike, num_parts: int,
                      method: str = "metis", seed: int = 0, force: bool = False,
                      balance_edges: bool = False) -> dict:
    """Partition the dataset file ``src_h5`` into the directory ``out_dir``.

    Args:
        src_h5: dataset file (format ``hpc_graph.dataset`` v1).
        out_dir: output directory (must not exist unless ``force``).
        num_parts: number of parts, ``1 <= num_parts <= num_nodes``.
        method: ``"metis"`` or ``"random"``.
        seed: seed of METIS or of the random assignment.
        force: replace an existing ``out_dir``, and start even when the estimated peak memory
            (:func:`data_io.memory.estimate_partition_bytes`, from the file's header) exceeds
            :func:`data_io.memory.available_bytes` (then only a warning is logged); without
            ``force`` that raises :class:`data_io.memory.MemoryRefusal` before any array is read.
        balance_edges: METIS only: also balance in-edges per part (see :func:`assign_parts`).
    Returns:
        The statistics written to ``partition.json`` (edge cut, replication factor,
        balance, per-part counts, ``timings_s`` per phase in seconds, ...).
    Raises:
        DataError: bad input, bad ``num_parts``/``method``, existing output, write failure.
    """
    src = Path(src_h5)
    out = Path(out_dir)
    if method not in METHODS:
        raise DataError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if balance_edges and method != "metis":
        raise DataError(f"balance_edges: only with method 'metis', not {method!r}")
    check_output(out, force)
    _check_memory(src, num_parts, method, force)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    with open_dataset(src) as ds:
        n, e = ds.num_nodes, ds.num_edges
        if ds.task != "node":
            raise DataError(f"{src}: task={ds.task!r}: only node-level datasets can be partitioned")
        if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) \
                or not 1 <= num_parts <= n:
            raise DataError(f"{src}: num_parts must be in [1, {n}] (number of nodes), got {num_parts!r}")
        num_parts = int(num_parts)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            digest = pool.submit(file_sha256, src)  # runs beside METIS (hashlib releases the GIL)
            t = time.perf_counter()
            log.info("reading %s: %d nodes, %d edges", src, n, e)
            indptr, indices = ds.indptr(), ds.indices()
            edge_weight, edge_type = ds.edge_weight(), ds.edge_type()
            node = {f: ds.label() if f == "label" else ds.mask(f) for f in ("label",) + MASKS if ds.has(f)}
            timings["read"] = time.perf_counter() - t
            parts = assign_parts(indptr, indices, num_parts, method, seed, node.get("train_mask"), timings,
                                 balance_edges=balance_edges)
            t = time.perf_counter()
            plan = _Plan(parts, num_parts, indptr, indices, edge_weight, edge_type)
            del indptr, indices, edge_weight, edge_type
            timings["relabel"] = time.perf_counter() - t
            t = time.perf_counter()
            meta = _meta(ds, src, plan, node, method, seed)
            meta["balance_edges"] = bool(balance_edges)
            with atomic_output(out, force, directory=True) as tmp:
                _write_parts(tmp, ds, plan, node, meta)
                timings["write"] = time.perf_counter() - t
                t = time.perf_counter()
                meta["source"]["sha256"] = digest.result()
                timings["checksum_wait"] = time.perf_counter() - t
                timings["total"] = time.perf_counter() - t_start
                meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
                (tmp / META_NAME).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    log.info("wrote %s: %d parts, edge cut %d (%.2f%%), replication factor %.3f, node balance %.3f",
             out, num_parts, meta["edge_cut"], 100 * meta["edge_cut_fraction"],
             meta["replication_factor"], meta["balance"]["nodes"])
    return meta


class _Plan:
    """Relabelled graph and per-part halo / send structure (everything but features).

    ``orig_of_new`` int64[N], ``new_of_orig`` int64[N], ``node_ranges`` int64[P+1],
    ``indptr`` int64[N+1] / ``indices`` int64[E] (new ids, rows in new id order,
    edges in source order within a row), ``halos[p]`` int64[h_p] sorted new gids.
    """

    def __init__(self, parts: np.ndarray, num_parts: int, indptr: np.ndarray, indices: np.ndarray,
                 edge_weight: np.ndarray | None, edge_type: np.ndarray | None):
        n = len(parts)
        self.num_parts = num_parts
        self.parts = parts
        self.orig_of_new = np.argsort(parts, kind="stable").astype(np.int64)  # ascending orig in a part
        self.new_of_orig = np.empty(n, dtype=np.int64)
        self.new_of_orig[self.orig_of_new] = np.arange(n, dtype=np.int64)
        counts = np.bincount(parts, minlength=num_parts)
        self.node_ranges = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(counts, out=self.node_ranges[1:])
        empty = np.flatnonzero(counts == 0)
        if len(empty):
            log.warning("%d part(s) own no node: %s", len(empty), empty[:10].tolist())
        # relabelled CSR: row g is source row orig_of_new[g]
        deg = np.diff(indptr)[self.orig_of_new]
        self.indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=self.indptr[1:])
        pos = np.repeat(indptr[:-1][self.orig_of_new] - self.indptr[:-1], deg)
        del deg
        pos += np.arange(len(pos), dtype=np.int64)
        self.indices = self.new_of_orig[indices[pos]]
        self.edge_weight = None if edge_weight is None else edge_weight[pos]
        self.edge_type = None if edge_type is None else edge_type[pos]
        del pos
        self.halos: list[np.ndarray] = []
        self.cut = np.zeros(num_parts, dtype=np.int64)
        seen = np.zeros(n, dtype=bool)  # bitmap instead of a sort: O(N + E_p) per part
        for p in range(num_parts):
            lo, hi = self.range(p)
            src = self.indices[self.indptr[lo]:self.indptr[hi]]
            remote = src[(src < lo) | (src >= hi)]
            self.cut[p] = len(remote)
            seen[remote] = True
            self.halos.append(np.flatnonzero(seen).astype(np.int64))
            seen[self.halos[-1]] = False
        self.halo_offsets = [np.searchsorted(h, self.node_ranges).astype(np.int64) for h in self.halos]
        self._lid = np.empty(n, dtype=np.int64)

    def range(self, p: int) -> tuple[int, int]:
        return int(self.node_ranges[p]), int(self.node_ranges[p + 1])

    def send(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """``(send_offsets int64[P+1], send_lid int64[S])`` of part ``p``: q's halo block owned by p."""
        lo = self.node_ranges[p]
        blocks = [self.halos[q][self.halo_offsets[q][p]:self.halo_offsets[q][p + 1]] - lo
                  for q in range(self.num_parts)]
        offsets = np.zeros(self.num_parts + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blocks], out=offsets[1:])
        return offsets, np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, np.int64)

    def part(self, p: int, node: dict[str, np.ndarray], meta: dict) -> Partition:
        """Part ``p`` without features."""
        lo, hi = self.range(p)
        e0, e1 = int(self.indptr[lo]), int(self.indptr[hi])
        halo = self.halos[p]
        lid = self._lid  # new gid -> local id of part p, valid on [lo, hi) and on the halo
        lid[lo:hi] = np.arange(hi - lo, dtype=np.int64)
        lid[halo] = np.arange(hi - lo, hi - lo + len(halo), dtype=np.int64)
        local = lid[self.indices[e0:e1]]
        send_offsets, send_lid = self.send(p)
        orig = self.orig_of_new[lo:hi]
        return Partition(
            part_id=p, num_parts=self.num_parts, node_ranges=self.node_ranges, orig_id=orig,
            halo_gid=halo, halo_offsets=self.halo_offsets[p], indptr=self.indptr[lo:hi + 1] - e0,
            indices=local, send_offsets=send_offsets, send_lid=send_lid,
            edge_weight=None if self.edge_weight is None else self.edge_weight[e0:e1],
            edge_type=None if self.edge_type is None else self.edge_type[e0:e1],
            num_classes=meta["num_classes"], global_num_nodes=meta["global_num_nodes"],
            global_num_edges=meta["global_num_edges"], name=meta["name"],
            **{f: v[orig] for f, v in node.items()})


def _meta(ds: Dataset, src: Path, plan: _Plan, node: dict[str, np.ndarray], method: str, seed: int) -> dict:
    """The content of ``partition.json`` (without the checksum and timings)."""
    P = plan.num_parts
    edges = np.array([plan.indptr[hi] - plan.indptr[lo] for lo, hi in map(plan.range, range(P))], dtype=np.int64)
    halo = np.array([len(h) for h in plan.halos], dtype=np.int64)
    so = plan.halo_offsets  # send count of p = sum over q of q's halo block for p
    send = np.array([sum(so[q][p + 1] - so[q][p] for q in range(P)) for p in range(P)], dtype=np.int64)
    train_mask = node.get("train_mask")
    train = (np.bincount(plan.parts[train_mask], minlength=P) if train_mask is not None
             else np.zeros(P, dtype=np.int64))
    return build_meta(ds, src, plan.node_ranges, edges, halo, send, train, plan.cut, method, seed)


def build_meta(ds: Dataset, src: Path, node_ranges: np.ndarray, edges: np.ndarray, halo: np.ndarray,
               send: np.ndarray, train: np.ndarray, cut: np.ndarray, method: str, seed: int) -> dict:
    """``partition.json`` from per-part counts (int64[P] each: in-edges, halo rows, rows sent, training
    nodes, in-edges from other parts); shared by the serial and the distributed partitioner."""
    P = len(node_ranges) - 1
    nodes = np.diff(node_ranges)
    fields = [f for f in ("edge_weight", "edge_type", "feat", "label") + MASKS if ds.has(f)]
    parts = []
    for p in range(P):
        parts.append(dict(part_id=p, file=part_file_name(p), num_nodes=int(nodes[p]), num_edges=int(edges[p]),
                          num_halo=int(halo[p]), num_send=int(send[p]),
                          num_train=int(train[p]), cut_edges=int(cut[p]),
                          replication=round(float(halo[p] / nodes[p]), 6) if nodes[p] else 0.0))
    e = max(1, ds.num_edges)
    return {
        "format": FORMAT, "version": VERSION, "name": ds.name, "task": ds.task, "directed": ds.directed,
        "num_parts": P, "method": method, "seed": int(seed),
        "global_num_nodes": ds.num_nodes, "global_num_edges": ds.num_edges,
        "feat_dim": ds.feat_dim, "num_classes": ds.num_classes, "fields": fields,
        "num_train": int(train.sum()),
        "edge_cut": int(cut.sum()), "edge_cut_fraction": round(float(cut.sum() / e), 6),
        "replication_factor": round(float(halo.sum() / ds.num_nodes), 6),
        "balance": {"nodes": round(_max_over_mean(nodes), 6), "edges": round(_max_over_mean(edges), 6),
                    "train": round(_max_over_mean(train), 6)},
        "node_ranges": [int(x) for x in node_ranges],
        "parts": parts,
        "source": {"path": str(src.resolve()), "size_bytes": src.stat().st_size, "sha256": None},  # set once read
    }


def _write_parts(tmp: Path, ds: Dataset, plan: _Plan, node: dict[str, np.ndarray], meta: dict) -> None:
    """Write every part file into ``tmp``; features streamed once per group of open files."""
    P = plan.num_parts
    F = ds.feat_dim
    for g0 in range(0, P, _MAX_OPEN):
        group = range(g0, min(P, g0 + _MAX_OPEN))
        files: dict[int, h5py.File] = {}
        try:
            for p in group:
                lo, hi = plan.range(p)
                log.info("writing part %d/%d (%d nodes, %d halo nodes)", p + 1, P, hi - lo, len(plan.halos[p]))
                files[p] = h5py.File(tmp / part_file_name(p), "w")
                _write_part_h5(files[p], plan.part(p, node, meta), F)
            if F:
                digests = _scatter_features(ds, plan, files)
                for p, (d, done) in digests.items():  # rows written in order: no read-back when sealing
                    if d is not None and done == files[p]["/node/feat"].shape[0]:
                        files[p]["/node/feat"].attrs[DIGEST_ATTR] = d.hexdigest()
            for p in group:  # digests last: every part's content is final
                meta["parts"][p][FILE_DIGEST_ATTR] = seal(files[p])
        finally:
            for f in files.values():
                f.close()


def _scatter_features(ds: Dataset, plan: _Plan, files: dict[int, h5py.File]) -> dict[int, list]:
    """Copy feature rows from the source to the parts in ``files`` in one sorted pass.

    Inside a part, owned nodes are in ascending source id order, so the rows of a
    source block that belong to part p fill a contiguous range of p's rows, and
    the blocks come in order: each part's content digest is fed as its rows are
    written. Returns ``{p: [Digest or None, rows digested]}``.
    """
    n, F = ds.num_nodes, ds.feat_dim
    step = max(1, _FEAT_BLOCK_BYTES // (4 * F))
    lo_p, hi_p = min(files), max(files) + 1
    digests = {p: [Digest(np.float32, f["/node/feat"].shape), 0] for p, f in files.items()}
    # only read blocks holding rows of this group
    for s in range(0, n, step):
        stop = min(n, s + step)
        pb = plan.parts[s:stop]
        sel = np.flatnonzero((pb >= lo_p) & (pb < hi_p))
        if not len(sel):
            continue
        block = ds.feat_rows(s, stop)
        order = sel[np.argsort(pb[sel], kind="stable")]
        counts = np.bincount(pb[sel] - lo_p, minlength=hi_p - lo_p)
        pos = 0
        for i, c in enumerate(counts):
            if not c:
                continue
            p = lo_p + i
            rows = order[pos:pos + c]
            l0 = int(plan.new_of_orig[s + rows[0]] - plan.node_ranges[p])
            files[p]["/node/feat"][l0:l0 + c] = block[rows]
            d = digests[p]
            if d[0] is not None and d[1] == l0:
                d[0].update(block[rows])
                d[1] += c
            else:
                d[0] = None
            pos += c
        log.debug("features: rows %d..%d of %d copied", s, stop, n)
    return digests
