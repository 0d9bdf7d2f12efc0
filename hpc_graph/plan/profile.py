"""``profile_machine``: alpha-beta fits of the communication operations and compute rates, measured here.

For each operation (``alltoallv``: ``n`` bytes to every peer; ``exchange``: ``n`` bytes point-to-point
to every peer; ``allreduce``: ``n`` bytes) the median time of a few calls at sizes from 1 KiB to
``max_bytes`` is fitted by least squares to ``t(n) = alpha + n / beta`` (per call; ``n`` the bytes a
rank sends; sizes 1 KiB, 16 KiB, ... up to ``max_bytes``). Compute rates: dense GEMM (flop/s), a CSR-input
projection (flop/s over the stored entries, what NFP's column slices cost) and SpMM (edge x feature products per
second), each from one timed call of a representative size after a warm-up. Collective: every rank takes part; the
result (the slowest rank's times) is the same on every rank.

The full-batch planner's kernel rates (:class:`KernelRates`, one process, not collective): the probes of
:class:`KernelProbes` (SpMM, fused attention, GEMM, elementwise, dropout and codec kernels on a given graph),
timed in rounds; :func:`kernel_rates` for one graph, :func:`paired_kernel_rates` for several whose rates must
err alike (their rounds alternate). :func:`time_layer`: one message-passing layer at a batch's real shapes.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

OPS = ("alltoallv", "exchange", "allreduce")


@dataclasses.dataclass
class Profile:
    """``alpha`` (seconds per call) and ``beta`` (bytes per second) per operation, compute rates, and the
    seconds the profile took."""

    alpha: dict[str, float]
    beta: dict[str, float]
    gemm_flops: float
    csr_flops: float
    spmm_rate: float
    seconds: float
    samples: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)

    def comm_time(self, op: str, calls: float, nbytes: float) -> float:
        """Predicted seconds of ``calls`` calls of ``op`` moving ``nbytes`` in all (per rank)."""
        if calls <= 0 and nbytes <= 0:
            return 0.0
        return calls * self.alpha[op] + nbytes / self.beta[op]

    def as_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta, "gemm_flops": self.gemm_flops, "csr_flops": self.csr_flops,
                "spmm_rate": self.spmm_rate, "seconds": self.seconds}


def fit_alpha_beta(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Least-squares ``t = alpha + n / beta`` (alpha >= 0; beta > 0)."""
    A = np.stack([np.ones_like(sizes, dtype=np.float64), sizes.astype(np.float64)], 1)
    (a, b), *_ = np.linalg.lstsq(A, times.astype(np.float64), rcond=None)
    if b <= 0:  # flat or noisy: bandwidth from the largest message
        b = max(float(times[-1]) / float(sizes[-1]), 1e-15)
    return max(float(a), 0.0), 1.0 / float(b)


def _time(fn, reps: int, best: bool = False) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(min(ts) if best else np.median(ts))


def _slowest(comm: Any, value: float) -> float:
    if comm.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    comm.allreduce_(t, "max")
    return float(t.item())


_CACHE: dict[tuple, Profile] = {}


def _key_text(key: tuple) -> str:
    return "ranks={} dtype={} max_bytes={} reps={} width={}".format(*key)


def _load_file(path: str, key: tuple) -> Profile | None:
    """The profile saved in ``path`` for ``key`` (None when the file is missing, unreadable or for another
    launch: other ranks, dtype or sizes)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return None
    if raw.get("key") != _key_text(key):
        log.info("profile: %s was measured for %s, not %s: measuring again", path, raw.get("key"), _key_text(key))
        return None
    try:
        return Profile(alpha=dict(raw["alpha"]), beta=dict(raw["beta"]), gemm_flops=float(raw["gemm_flops"]),
                       csr_flops=float(raw["csr_flops"]), spmm_rate=float(raw["spmm_rate"]), seconds=0.0)
    except (KeyError, TypeError, ValueError):
        return None


def _save_file(path: str, key: tuple, prof: Profile) -> None:
    """Write ``prof`` to ``path`` atomically (a temporary file renamed over it)."""
    import json
    import os

    data = {**prof.as_dict(), "key": _key_text(key)}
    data["beta"] = {k: (v if v != float("inf") else 1e300) for k, v in data["beta"].items()}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


def profile_machine(comm: Any, dtype: torch.dtype = torch.float32, max_bytes: int = 64 << 20, reps: int = 3,
                    width: int = 64, reuse: bool = True, path: str | None = None) -> Profile:
    """Measure the alpha-beta fits and compute rates (collective; see the module docstring).

    ``reuse``: a process measures once per (ranks, dtype, sizes, width); later calls return that
    profile (with ``seconds`` 0: it cost nothing this time). ``path``: a JSON file that keeps the profile
    between jobs: read when it was measured for the same launch (ranks, dtype, sizes, width; rank 0 reads
    and broadcasts), else measured and written there by rank 0.
    """
    key = (int(comm.size), str(dtype), int(max_bytes), int(reps), int(width))
    if reuse and key in _CACHE:
        return dataclasses.replace(_CACHE[key], seconds=0.0)
    if path:
        loaded = _load_file(path, key) if comm.rank == 0 else None
        loaded = comm.bcast_object(loaded, 0) if comm.size > 1 else loaded
        if loaded is not None:
            _CACHE[key] = loaded
            log.info("profile: read from %s", path)
            return loaded
    t_start = time.perf_counter()
    P = int(comm.size)
    sizes = [1 << 10]
    while sizes[-1] * 16 <= max_bytes:
        sizes.append(sizes[-1] * 16)
    if sizes[-1] != max_bytes and max_bytes > sizes[-1]:
        sizes.append(max_bytes)
    alpha, beta, samples = {}, {}, {}
    for op in OPS:
        pts = []
        for n in sizes:
            if P == 1:
                pts.append((n, 0.0))
                continue
            buf = torch.zeros(max(n // 8, 1), dtype=torch.float64)
            if op == "alltoallv":
                send = buf.repeat(P)
                counts = np.full(P, buf.numel(), dtype=np.int64)
                fn = lambda: comm.alltoallv(send, counts)  # noqa: E731
            elif op == "exchange":
                peers = [q for q in range(P) if q != comm.rank]
                fn = lambda: comm.exchange({q: buf for q in peers},  # noqa: E731
                                           {q: ((buf.numel(),), torch.float64) for q in peers})
            else:
                fn = lambda: comm.allreduce_(buf)  # noqa: E731
            fn()
            comm.barrier()
            pts.append((n, _slowest(comm, _time(fn, reps))))
        s, t = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        alpha[op], beta[op] = (0.0, float("inf")) if P == 1 else fit_alpha_beta(s, t)
        samples[op] = pts
    # compute rates (this rank's cores; every rank measures at once, as in training)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8192, 256, generator=gen, dtype=dtype)
    w = torch.randn(width, 256, generator=gen, dtype=dtype)
    torch.nn.functional.linear(a, w)
    t = _slowest(comm, _time(lambda: torch.nn.functional.linear(a, w), reps))
    gemm = 2.0 * a.shape[0] * a.shape[1] * width / max(t, 1e-9)
    cols = 256 // max(P, 1)
    crow = torch.arange(a.shape[0] + 1, dtype=torch.int64) * cols
    col = torch.arange(cols, dtype=torch.int64).repeat(a.shape[0])
    with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
        warnings.simplefilter("ignore", UserWarning)
        xs = torch.sparse_csr_tensor(crow, col, a[:, :cols].reshape(-1), (a.shape[0], 256), check_invariants=False)
    torch.sparse.mm(xs, w.t())
    t = _slowest(comm, _time(lambda: torch.sparse.mm(xs, w.t()), reps))
    csr = 2.0 * a.shape[0] * cols * width / max(t, 1e-9)
    from hpc_graph.ops.csr import CSR
    from hpc_graph.ops.spmm import spmm

    n, deg = 50_000, 10
    g = CSR(torch.arange(n + 1, dtype=torch.int64) * deg, torch.randint(0, n, (n * deg,), generator=gen), n)
    x = torch.randn(n, width, generator=gen, dtype=dtype)
    spmm(g, x, "sum")
    t = _slowest(comm, _time(lambda: spmm(g, x, "sum"), reps))
    rate = n * deg * width / max(t, 1e-9)
    prof = Profile(alpha, beta, gemm, csr, rate, 0.0, samples)
    prof.seconds = _slowest(comm, time.perf_counter() - t_start)
    _CACHE[key] = prof
    if path and comm.rank == 0:
        try:
            _save_file(path, key, prof)
        except OSError as exc:
            log.warning("profile: could not write %s (%s); it will be measured again next time", path, exc)
    log.info("profile: %s", {k: (f"{alpha[k] * 1e6:.0f} us", f"{beta[k] / 1e9:.2f} GB/s") for k in OPS})
    return prof


# time_layer times the projections on at most this many multiply-adds (x rows x fin x fout): so large, they are
# compute-bound and their time is linear in the rows (measured here at 512 x 256: 16k and 56k rows within 2 %
# per row; narrow ones are memory-bound and slower per row when larger, so they are timed whole)
GEMM_MACS = 1 << 31


def time_layer(csr: Any, fin: int, fout: int, dtype: torch.dtype = torch.float32, reps: int = 3,
               aggregate_first: bool = False) -> tuple[float, float]:
    """Seconds of one forward + backward of a message-passing layer's two parts at a batch's real shapes:
    ``(projections, aggregation)``. Project first (``fin -> fout`` on every input row and on the
    destination rows, then a sum aggregation over ``csr`` at width ``fout``), or with
    ``aggregate_first`` (GraphSAGE when ``fout > fin``) aggregate at width ``fin``, then project the
    aggregated and the destination rows. The median of ``reps`` after a warm-up (an epoch pays the typical
    call, page faults of its fresh outputs included, not the fastest). The projections are timed on at most
    :data:`GEMM_MACS` multiply-adds' worth of rows and scaled to all of them."""
    from hpc_graph.ops.spmm import spmm

    gen = torch.Generator().manual_seed(1)
    n_src, n_dst = int(csr.num_src), int(csr.num_dst)
    rows = 2 * n_dst if aggregate_first else n_src + n_dst
    timed_rows = max(min(rows, GEMM_MACS // max(int(fin) * int(fout), 1)), 1)
    x = torch.randn(timed_rows, int(fin), generator=gen, dtype=dtype)
    w = torch.randn(int(fout), int(fin), generator=gen, dtype=dtype, requires_grad=True)

    def gemm():
        torch.nn.functional.linear(x, w).sum().backward()

    t = torch.randn(n_src, int(fin if aggregate_first else fout), generator=gen, dtype=dtype, requires_grad=True)

    def agg():
        spmm(csr, t, "sum").sum().backward()

    gemm()
    agg()
    return _time(gemm, reps) * rows / timed_rows, _time(agg, reps)


# -- kernel rates of the planner (hpc_graph.plan.predict) -----------------------------------------------
@dataclasses.dataclass
class KernelRates:
    """Per-edge costs of the aggregation kernels, GEMM and memory rates, measured on one graph (medians).

    ``spmm_fwd``/``spmm_bwd`` and ``gat_fwd``/``gat_bwd``: ``(a, b)`` such that one call over E
    edges at width w (GAT: ``w = H x D``) takes ``E (a + b w)`` seconds (least squares over the
    widths measured; forward over the CSR, backward over its transpose). ``gemm_flops``: flop/s of the
    layers' GEMMs (the mean of ``x W^T`` and of the weight gradient ``g^T x`` at ``[65536, 128] x
    [128, 128]``). ``stream``: bytes/s of an elementwise add (two reads, one write). ``mask``: elements/s
    of the counter-based dropout kernel (``hpc_graph.ops.dropout``: a hash per element). ``score``:
    elements/s of a GAT layer's score ``(z * att).sum(-1)``, forward and backward, per element of ``z``. ``codec``: row
    elements/s through sylvie's message codec (``hpc_graph.ops.quant``: encode at 8 bits, then decode; per element
    of each). ``threads``: the
    threads they were measured with; ``parallel``: the fraction of the kernels' time that scales with
    threads (Amdahl), from the median speed-up of SpMM forward, backward and the GEMMs measured again at
    a second thread count (:class:`KernelProbes`). ``graph``: what they were measured on.
    """

    spmm_fwd: tuple[float, float]
    spmm_bwd: tuple[float, float]
    gat_fwd: tuple[float, float]
    gat_bwd: tuple[float, float]
    gemm_flops: float
    stream: float
    mask: float
    score: float
    codec: float
    threads: int
    parallel: float
    graph: str
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fit_per_edge(points: list[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``t / E = a + b w`` from ``(w, t / E)`` points (a, b >= 0)."""
    w = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    if len(points) == 1 or np.ptp(w) == 0:
        return 0.0, float(y.mean() / max(w.mean(), 1e-12))
    b, a = np.polyfit(w, y, 1)
    if b < 0:
        return float(y.mean()), 0.0
    if a < 0:
        return 0.0, float(np.sum(w * y) / np.sum(w * w))
    return float(a), float(b)


def synthetic_graph(scale: int = 16, edge_factor: int = 16) -> Any:
    """An undirected R-MAT graph (Graph500 parameters) as a :class:`~hpc_graph.ops.csr.CSR`, for kernel rates
    when no real graph is at hand."""
    from data_io.generators.rmat import generate_rmat
    from hpc_graph.ops.csr import CSR, column_dtype

    g = generate_rmat(scale, edge_factor, feat_dim=0, num_classes=2)
    return CSR(torch.from_numpy(np.asarray(g.indptr, dtype=np.int64)),
               torch.from_numpy(np.asarray(g.indices, dtype=column_dtype(g.num_nodes))), int(g.num_nodes),
               validate=False)


def _set_threads(n: int) -> tuple[int, int]:
    """Use ``n`` threads in numba and torch on this thread; returns the previous (numba, torch) counts."""
    import numba

    before = (numba.get_num_threads(), torch.get_num_threads())
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    torch.set_num_threads(max(1, n))
    return before


def _restore_threads(before: tuple[int, int]) -> None:
    import numba

    numba.set_num_threads(before[0])
    torch.set_num_threads(before[1])


#: calls per round of the probes that write fresh tensors (stream, mask): their median is over reps x this
FRESH_CALLS = 3
#: elements of each of the two tensors the stream and mask probes pass over (float32: 64 MiB each, past the caches)
STREAM_ELEMENTS = 1 << 24


def amdahl_fraction(ratio: float, k_a: int, k_b: int) -> float:
    """The fraction ``f`` of a kernel's one-thread time that scales with threads (Amdahl: ``t(k) = 1 - f + f / k``)
    from ``ratio = t(k_a) / t(k_b)``, its times measured at ``k_a`` and ``k_b`` threads; clipped to [0, 1]."""
    lo, hi = (k_a, k_b) if k_a < k_b else (k_b, k_a)
    s = ratio if k_a < k_b else 1.0 / max(ratio, 1e-12)  # t(lo) / t(hi): the speed-up
    if lo == hi:
        return 1.0
    den = s * (1.0 - 1.0 / hi) - (1.0 - 1.0 / lo)
    if den <= 0:
        return 0.0
    return min(1.0, max(0.0, (s - 1.0) / den))


class KernelProbes:
    """The probes behind :class:`KernelRates`, timed in rounds: ``run_round()`` runs every probe once (round-robin:
    a slow phase of a shared machine spreads over all probes), :meth:`rates` gives the rates from the medians
    over all rounds or over some of them. Building the probes runs one untimed round (it warms up their
    transposes, caches and compiled kernels).

    ``csr``: a :class:`~hpc_graph.ops.csr.CSR` (None: an R-MAT scale-16 graph); graphs with more than
    ``max_edges`` edges are cut to their first rows holding about that many (all source columns kept: the
    same rows of ``x`` are gathered as in the whole graph). The probes run at ``threads`` threads (default:
    torch's thread count when they are built): the planner passes the count its ranks will run, so that their
    kernels are measured, not extrapolated. ``speedup``: also time SpMM forward, backward and the GEMMs at a
    reference count (one thread, or torch's count when ``threads`` is 1), for the Amdahl fraction that
    extrapolates to other thread counts (the fraction is 1 when the two counts are the same). Not collective:
    one process measures, and its thread counts are restored after each round. ``seconds``: the time spent
    building and running these probes (other probes' rounds in between not counted)."""

    def __init__(self, csr: Any = None, dtype: torch.dtype = torch.float32, *,
                 widths: tuple[int, ...] = (16, 64, 128), gat_shapes: tuple[tuple[int, int], ...] = ((1, 16), (4, 32)),
                 gat: bool = True, max_edges: int = 4_000_000, label: str = "", speedup: bool = True,
                 threads: int | None = None):
        from hpc_graph.ops.csr import CSR
        from hpc_graph.ops.gat_attention import gat_attention
        from hpc_graph.ops.spmm import spmm_fused

        t_start = time.perf_counter()
        if csr is None:
            csr = synthetic_graph()
            label = label or "synthetic R-MAT scale 16 (edge factor 16, undirected)"
        indptr, indices = csr.indptr, csr.indices
        if csr.num_edges > max_edges:
            rows = int(np.searchsorted(indptr.numpy(), max_edges, side="right")) - 1
            rows = max(rows, 1)
            indptr = indptr[:rows + 1].clone()
            indices = indices[:int(indptr[-1])].clone()
            csr = CSR(indptr, indices, csr.num_src, validate=False)
            label = f"{label}, first {rows} rows ({csr.num_edges} edges)"
        E, n_src, n_dst = csr.num_edges, csr.num_src, csr.num_dst
        self.label = label or repr(csr)
        self.edges, self.dst_rows = int(E), int(n_dst)
        self.widths, self.gat_shapes, self.gat = tuple(int(w) for w in widths), tuple(gat_shapes), bool(gat)
        gen = torch.Generator().manual_seed(2)
        here = int(torch.get_num_threads())
        self.threads = threads = max(1, int(threads)) if threads else here
        # the Amdahl fraction's second thread count: one thread, or this process's count for probes at one
        self.ref_threads = ref = 1 if threads > 1 else here
        # every probe: (name, threads, fn); the median per probe over the rounds
        probes: list[tuple[str, int, Any]] = []

        def spmm_probes(width: int, nthreads: int) -> None:
            x = torch.randn(n_src, width, generator=gen, dtype=dtype, requires_grad=True)
            g = torch.randn(n_dst, width, generator=gen, dtype=dtype)
            held = {"out": spmm_fused(csr, x, "sum")}

            def fwd():
                held["out"] = spmm_fused(csr, x, "sum")

            def bwd():
                torch.autograd.backward(held["out"], g, retain_graph=True)
                x.grad = None

            probes.append((f"spmm_fwd {width}", nthreads, fwd))
            probes.append((f"spmm_bwd {width}", nthreads, bwd))

        for w in self.widths:
            spmm_probes(w, threads)
        rows = 65536
        a = torch.randn(rows, 128, generator=gen, dtype=dtype)
        w = torch.randn(128, 128, generator=gen, dtype=dtype)
        g = torch.randn(rows, 128, generator=gen, dtype=dtype)
        self._flops = 2.0 * rows * 128 * 128
        probes += [("gemm_fwd", threads, lambda: a @ w.t()), ("gemm_wg", threads, lambda: g.t() @ a)]
        self.speedup = bool(speedup) and ref != threads
        if self.speedup:  # the speed-up between ``ref`` and ``threads`` threads: SpMM forward, backward, GEMMs
            spmm_probes(self.widths[-1], ref)
            probes += [("gemm_fwd", ref, lambda: a @ w.t()), ("gemm_wg", ref, lambda: g.t() @ a)]
        if gat:
            ar = torch.arange(n_dst + 1, dtype=torch.int64)
            deg = csr.indptr[1:] - csr.indptr[:-1]
            loops = torch.empty(E + n_dst, dtype=csr.indices.dtype)  # int32 columns, as the engines hold them
            pos = torch.arange(E, dtype=torch.int64) + torch.repeat_interleave(ar[:-1], deg)
            loops[pos] = csr.indices
            loops[csr.indptr[1:] + ar[:-1]] = (torch.arange(n_dst, dtype=torch.int64) % max(n_src, 1)).to(loops.dtype)
            g_loops = CSR(csr.indptr + ar, loops, n_src, validate=False)
            del pos, loops
            for heads, dim in self.gat_shapes:
                z = torch.randn(n_src, heads, dim, generator=gen, dtype=dtype, requires_grad=True)
                s_src = torch.randn(n_src, heads, generator=gen, dtype=dtype, requires_grad=True)
                s_dst = torch.randn(n_dst, heads, generator=gen, dtype=dtype, requires_grad=True)
                go = torch.randn(n_dst, heads, dim, generator=gen, dtype=dtype)
                held = {"out": gat_attention(g_loops, z, s_src, s_dst)}

                def gfwd(z=z, s_src=s_src, s_dst=s_dst, held=held):
                    held["out"] = gat_attention(g_loops, z, s_src, s_dst)

                def gbwd(z=z, s_src=s_src, s_dst=s_dst, held=held, go=go):
                    torch.autograd.backward(held["out"], go, retain_graph=True)
                    z.grad = s_src.grad = s_dst.grad = None

                probes += [(f"gat_fwd {heads * dim}", threads, gfwd), (f"gat_bwd {heads * dim}", threads, gbwd)]
        big = torch.randn(STREAM_ELEMENTS, generator=gen, dtype=dtype)
        other = torch.randn(STREAM_ELEMENTS, generator=gen, dtype=dtype)
        self._stream_bytes = 3.0 * big.numel() * big.element_size()
        self._mask_elements = big.numel()
        # a step's elementwise passes and dropouts write fresh tensors (as the SpMM, GEMM and attention probes
        # above do): each call here allocates its output and frees it, so the rates carry the first touch of
        # new pages. That cost is erratic on some machines (a fill now and then takes several times longer while
        # the kernel compacts memory for huge pages), so these two probes run ``FRESH_CALLS`` times a round and
        # the median over all of them is kept
        probes += [("stream", threads, lambda: torch.add(big, other))] * FRESH_CALLS
        from hpc_graph.ops._bridge import as_array
        from hpc_graph.ops._kernel_args import kernel

        drop = kernel("dropout.dropout_apply", big)
        src = as_array(big)

        def mask_fresh():
            out = torch.empty_like(big)
            drop(src, 7, 1 << 15, 2.0, as_array(out))

        probes += [("mask", threads, mask_fresh)] * FRESH_CALLS
        zs = torch.randn(rows, 4, 32, generator=gen, dtype=dtype, requires_grad=True)
        att = torch.randn(1, 4, 32, generator=gen, dtype=dtype, requires_grad=True)
        gs = torch.randn(rows, 4, generator=gen, dtype=dtype)
        self._score_elements = zs.numel()

        def score():
            (zs * att).sum(-1).backward(gs)
            zs.grad = att.grad = None

        probes.append(("score", threads, score))
        from hpc_graph.ops.quant import decode, encode, message_layout

        qx = torch.randn(rows, 128, generator=gen, dtype=dtype)
        q_rows = torch.arange(rows, dtype=torch.int64)
        q_layout = message_layout(np.full(rows, 8, np.int8), 128, 0, dtype)
        q_out = torch.empty_like(qx)
        self._codec_elements = 2 * qx.numel()

        def codec():
            decode(encode(qx, q_rows, q_layout, ids=q_rows, key=5), q_layout, q_out, q_rows)

        probes.append(("codec", threads, codec))
        self._probes = probes
        self._rounds: list[dict[tuple[str, int], list[float]]] = []
        self.seconds = time.perf_counter() - t_start  # this object's own time: building, then its rounds
        self._run(record=False)  # warms up (transposes, caches, compiled kernels)

    def run_round(self) -> None:
        """Run every probe once, timed."""
        self._run(record=True)

    def _run(self, record: bool) -> None:
        t_start = time.perf_counter()
        times: dict[tuple[str, int], list[float]] = {(name, k): [] for name, k, _ in self._probes}
        before = _set_threads(self.threads)
        try:
            for name, k, fn in self._probes:
                _set_threads(k)
                t0 = time.perf_counter()
                fn()
                times[name, k].append(time.perf_counter() - t0)
        finally:
            _restore_threads(before)
            self.seconds += time.perf_counter() - t_start
        if record:
            self._rounds.append(times)

    def rates(self, rounds: Any = None) -> KernelRates:
        """:class:`KernelRates` from the medians over the timed rounds (``rounds``: their indices; default all)."""
        picked = [self._rounds[i] for i in (range(len(self._rounds)) if rounds is None else rounds)]
        if not picked:
            raise ValueError("KernelProbes.rates: no timed round (call run_round first)")
        med = {key: float(np.median([t for rnd in picked for t in rnd[key]])) for key in picked[0]}
        threads, widths, E = self.threads, self.widths, self.edges
        fwd_pts = [(w, med[f"spmm_fwd {w}", threads] / E) for w in widths]
        bwd_pts = [(w, med[f"spmm_bwd {w}", threads] / E) for w in widths]
        e_loops = E + self.dst_rows
        gat_f = [(h * d, med[f"gat_fwd {h * d}", threads] / e_loops) for h, d in self.gat_shapes] if self.gat else []
        gat_b = [(h * d, med[f"gat_bwd {h * d}", threads] / e_loops) for h, d in self.gat_shapes] if self.gat else []
        t_gemm = med["gemm_fwd", threads] + med["gemm_wg", threads]
        gemm = 2.0 * self._flops / t_gemm
        parallel = 1.0
        if self.speedup:
            w_last, ref = widths[-1], self.ref_threads
            ratios = [med[f"spmm_fwd {w_last}", ref] / med[f"spmm_fwd {w_last}", threads],
                      med[f"spmm_bwd {w_last}", ref] / med[f"spmm_bwd {w_last}", threads],
                      (med["gemm_fwd", ref] + med["gemm_wg", ref]) / t_gemm]
            parallel = amdahl_fraction(float(np.median(ratios)), ref, threads)
        stream = self._stream_bytes / max(med["stream", threads], 1e-9)
        mask = self._mask_elements / max(med["mask", threads], 1e-9)
        score_rate = self._score_elements / max(med["score", threads], 1e-9)
        codec_rate = self._codec_elements / max(med["codec", threads], 1e-9)
        return KernelRates(spmm_fwd=_fit_per_edge(fwd_pts), spmm_bwd=_fit_per_edge(bwd_pts),
                           gat_fwd=_fit_per_edge(gat_f) if gat_f else (0.0, 0.0),
                           gat_bwd=_fit_per_edge(gat_b) if gat_b else (0.0, 0.0), gemm_flops=gemm, stream=stream,
                           mask=mask, score=score_rate, codec=codec_rate, threads=threads, parallel=parallel,
                           graph=self.label, seconds=self.seconds)


def kernel_rates(csr: Any = None, dtype: torch.dtype = torch.float32, *, widths: tuple[int, ...] = (16, 64, 128),
                 gat_shapes: tuple[tuple[int, int], ...] = ((1, 16), (4, 32)), gat: bool = True,
                 reps: int = 5, max_edges: int = 4_000_000, label: str = "", threads: int | None = None
                 ) -> KernelRates:
    """Measure :class:`KernelRates` on ``csr`` (see :class:`KernelProbes`): a warm-up round, then ``reps`` timed
    rounds of every probe; the median per probe is kept. Not collective: one process measures, at ``threads``
    threads (default: its own count)."""
    probes = KernelProbes(csr, dtype, widths=widths, gat_shapes=gat_shapes, gat=gat, max_edges=max_edges, label=label,
                          threads=threads)
    for _ in range(reps):
        probes.run_round()
    rates = probes.rates()
    log.info("kernel rates (%s, %d threads): spmm %.3g+%.3g w ns/edge, gemm %.3g GFLOP/s, stream %.3g GB/s, "
             "mask %.3g G/s, codec %.3g G/s, parallel fraction %.2f", rates.graph, rates.threads,
             rates.spmm_fwd[0] * 1e9, rates.spmm_fwd[1] * 1e9, rates.gemm_flops / 1e9, rates.stream / 1e9,
             rates.mask / 1e9, rates.codec / 1e9, rates.parallel)
    return rates


def paired_kernel_rates(graphs: list[tuple[Any, str]], dtype: torch.dtype = torch.float32, *, gat: bool = True,
                        reps: int = 5, max_edges: int = 4_000_000, threads: int | None = None) -> list[KernelRates]:
    """:class:`KernelRates` of several graphs (``(csr, label)``; csr None: the synthetic graph), their probes timed
    in alternating rounds (a round of the first graph's, then of the second's, ...; ``reps`` each) so that a
    shared machine's speed, which drifts over seconds, is seen alike by all of them: predictions made from them
    err together, and a difference of two (the planner's calibration: an epoch's overhead is its time less what
    the rates predict for it, and that overhead is added to what they predict for a rank) is not that drift.
    The first graph's probes also measure the Amdahl fraction (``parallel``), which the others' rates take. All
    run at ``threads`` threads (default: this process's count)."""
    if not graphs:
        return []
    probes = [KernelProbes(csr, dtype, gat=gat, max_edges=max_edges, label=label, speedup=i == 0, threads=threads)
              for i, (csr, label) in enumerate(graphs)]
    for _ in range(reps):
        for p in probes:
            p.run_round()
    rates = [p.rates() for p in probes]
    return [rates[0]] + [dataclasses.replace(r, parallel=rates[0].parallel) for r in rates[1:]]


def load_profile(path: str) -> tuple[Profile, str] | None:
    """A profile written by :func:`profile_machine` (``path=``) and the launch it was measured for
    (``ranks=... dtype=...``), whatever that launch was; None when the file is missing or unreadable."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        prof = Profile(alpha=dict(raw["alpha"]), beta={k: float(v) for k, v in raw["beta"].items()},
                       gemm_flops=float(raw["gemm_flops"]), csr_flops=float(raw["csr_flops"]),
                       spmm_rate=float(raw["spmm_rate"]), seconds=0.0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return prof, str(raw.get("key", "unknown launch"))


def save_profile(path: str, prof: Profile, comm_size: int, dtype: torch.dtype = torch.float32,
                 max_bytes: int = 64 << 20, reps: int = 3, width: int = 64) -> None:
    """Write ``prof`` to ``path`` in :func:`profile_machine`'s format (readable by :func:`load_profile`)."""
    _save_file(path, (int(comm_size), str(dtype), int(max_bytes), int(reps), int(width)), prof)
