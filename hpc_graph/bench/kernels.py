"""Kernel benchmark (``hpc-graph bench kernels``): hpc_graph ops vs torch and PyG on an R-MAT graph.

Measurements (each one JSON record, see :data:`RECORD_FIELDS`):

* ``memcpy``   — copy bandwidth of a large array (NumPy ``copyto``, one thread;
  torch ``copy_``, all threads); ``gb_per_s`` counts bytes read + written.
* ``spmm``     — sum aggregation ``[N, F]``: hpc_graph ``spmm`` vs
  ``torch.sparse.mm`` (CSR tensor) vs PyG-style gather + ``index_add_``.
  ``bound_fraction`` of the hpc_graph record = (E*F*itemsize / bandwidth) / seconds.
* ``sage``     — SAGE layer (mean aggregation + Linear F->F, root weight),
  forward + backward: hpc_graph ``spmm`` vs PyG ``SAGEConv`` (same weights).
* ``gat``      — GAT layer (``heads`` x F/heads, self-loops in the graph for
  both), forward + backward: hpc_graph ``gat_attention`` vs PyG ``GATConv``.
  Skipped (logged) if :mod:`hpc_graph.ops.gat_attention` is absent.
* ``locality`` — the same forward SpMM after relabelling the nodes in reverse
  Cuthill-McKee order and in a random order; ``speedup_vs_random``.
* ``compile``  — in a fresh Python process, the time of the first call of every
  kernel (float32; sum/mean/max with weights + backward, SDDMM, edge softmax),
  with an empty numba cache (compiles) and again with the cache it just filled
  (loads from disk); ``import_seconds`` is the torch + ops import before it.
* ``attention`` — graph-masked softmax attention (a transformer layer's
  attention over a random graph of S nodes, ``avg_degree`` neighbours plus a
  self loop, ``attn_heads`` x ``attn_dim``), forward + backward: hpc_graph's
  fused ``dot_attention`` (memory linear in the edges) vs
  ``torch.nn.functional.scaled_dot_product_attention`` with the dense boolean
  mask (memory quadratic in S: skipped, with the reason, where it does not fit),
  at every ``seq_lens`` value; the maximum difference of the two outputs is
  recorded where both ran.

``device="cuda"`` runs every measurement on the GPU (``memcpy`` is then a
device-to-device copy, the bandwidth bound of SpMM; ``locality`` and
``compile`` are CPU-only and skipped): inputs live on the GPU, each timed call
is bracketed by ``torch.cuda.synchronize()``, and ``peak_mb`` is the extra
peak of torch's allocator during the call (``max_memory_allocated`` over what
was allocated before). Baselines are skipped when their estimate exceeds
``memory_fraction`` of the free GPU memory.

The input features are a NumPy array wrapped by ``torch.from_numpy``, as the
dataset reader provides them (NumPy backs large arrays with transparent huge
pages, torch only with ``THP_MEM_ALLOC_ENABLE=1``; random row gathers are up to
~1.7x faster on huge pages, for every implementation).
Every comparison uses the same inputs, thread count and autograd setting:
``requires_grad=False`` (input features, as in a first layer) and ``True``
(hidden layer: the backward also produces the input gradient). ``seconds`` is
the median over ``repeat`` timed calls after one untimed warm-up call (which
compiles kernels and builds the cached transposed graph); ``peak_mb`` the
largest extra peak RSS of a timed call (:class:`~hpc_graph.bench.memory.PeakRSS`).
A baseline whose estimated memory exceeds ``memory_fraction`` of the available
RAM is not run; its record carries ``skipped`` with the reason.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch

from hpc_graph.bench import KERNEL_OPS
from hpc_graph.bench.memory import PeakRSS
from hpc_graph.ops.csr import CSR, column_dtype
from hpc_graph.ops.spmm import spmm

log = logging.getLogger(__name__)

OPS = KERNEL_OPS
RECORD_FIELDS = ("op", "impl", "scale", "feat", "heads", "seconds", "peak_mb", "threads", "requires_grad", "device")
#: measurements that run only on the CPU
CPU_ONLY = ("locality", "compile")
#: measurements run when ``ops`` is not given: all but ``attention`` on the CPU, all but the CPU-only on a GPU
DEFAULT_OPS = {"cpu": tuple(o for o in OPS if o != "attention"), "cuda": tuple(o for o in OPS if o not in CPU_ONLY)}
HPC = "hpc_graph"


@dataclass
class KernelBenchConfig:
    """Options of the kernel benchmark (validated by :meth:`validate`, messages name the option).

    Attributes:
        scale: R-MAT scale, N = 2**scale nodes.
        feat: feature width F.
        heads: attention heads of the GAT layer (F must be divisible by it).
        edge_factor: generated edges per node (before duplicate removal).
        symmetrize: add reverse edges (default: directed graph).
        repeat: timed calls per measurement (the median is reported).
        threads: torch and numba threads (default: as :mod:`hpc_graph.comm.threads` decides:
            ``NUMBA_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the CPUs of the affinity mask).
        ops: which measurements to run, a subset of :data:`OPS`.
        grad: the ``requires_grad`` settings of the input features to run.
        memory_fraction: skip a baseline whose estimate exceeds this share of available RAM.
        seed: graph and feature seed.
        device: ``"cpu"`` or ``"cuda"`` (the current GPU).
        seq_lens: sequence lengths S of the ``attention`` measurement.
        attn_heads, attn_dim: heads and features per head of the ``attention`` measurement.
        avg_degree: random neighbours per node of the ``attention`` graph (plus a self loop).
    """

    scale: int = 20
    feat: int = 128
    heads: int = 4
    edge_factor: int = 16
    symmetrize: bool = False
    repeat: int = 3
    threads: int | None = None
    ops: tuple[str, ...] = OPS
    grad: tuple[bool, ...] = (False, True)
    memory_fraction: float = 0.6
    seed: int = 0
    device: str = "cpu"
    seq_lens: tuple[int, ...] = (65536, 262144, 1048576)
    attn_heads: int = 8
    attn_dim: int = 32
    avg_degree: int = 16

    def validate(self) -> None:
        def bad(name, msg):
            raise ValueError(f"--{name.replace('_', '-')}: {msg}")

        if not 1 <= self.scale <= 30:
            bad("scale", f"must be in 1..30, got {self.scale}")
        if self.feat < 1:
            bad("feat", f"must be >= 1, got {self.feat}")
        if self.heads < 1 or self.feat % self.heads:
            bad("heads", f"must be >= 1 and divide --feat={self.feat}, got {self.heads}")
        if self.edge_factor < 1:
            bad("edge_factor", f"must be >= 1, got {self.edge_factor}")
        if self.repeat < 1:
            bad("repeat", f"must be >= 1, got {self.repeat}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            bad("threads", f"must be a positive integer, got {self.threads!r}")
        unknown = [o for o in self.ops if o not in OPS]
        if unknown or not self.ops:
            bad("ops", f"unknown {unknown}; choose from {', '.join(OPS)}")
        if not 0 < self.memory_fraction <= 1:
            bad("memory_fraction", f"must be in (0, 1], got {self.memory_fraction}")
        if self.device not in ("cpu", "cuda"):
            bad("device", f"must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            bad("device", "cuda requested but torch sees no CUDA device (torch.cuda.is_available() is False)")
        if self.device == "cuda" and any(o in CPU_ONLY for o in self.ops):
            bad("ops", f"{', '.join(o for o in self.ops if o in CPU_ONLY)} run on the CPU only (--device cpu)")
        if not self.seq_lens or any(int(n) < 2 for n in self.seq_lens):
            bad("seq_lens", f"must be integers >= 2, got {list(self.seq_lens)}")
        if self.attn_heads < 1 or self.attn_dim < 1 or self.avg_degree < 1:
            bad("attn_heads", f"attention heads, dim and degree must be >= 1, got {self.attn_heads}, "
                              f"{self.attn_dim}, {self.avg_degree}")


@dataclass
class _Ctx:
    cfg: KernelBenchConfig
    threads: int
    indptr: np.ndarray
    indices: np.ndarray
    base: dict = field(default_factory=dict)
    bandwidth: float | None = None  # bytes/s, from the memcpy measurement

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    @property
    def gpu(self) -> bool:
        return self.cfg.device == "cuda"

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])


# ----------------------------------------------------------------------------- helpers

def _measure(fn, repeat: int, gpu: bool = False) -> dict:
    """Warm-up call, then ``repeat`` timed calls; median seconds and the largest extra peak memory
    (RSS on the CPU; torch's allocator on the GPU, each call bracketed by synchronisations)."""
    if not gpu:
        fn()
        runs, peaks = [], []
        for _ in range(repeat):
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t0)
            peaks.append(mem.extra_mb)
        return {"seconds": statistics.median(runs), "seconds_min": min(runs), "runs": runs,
                "peak_mb": max(peaks)}
    fn()
    torch.cuda.synchronize()
    runs, peaks = [], []
    for _ in range(repeat):
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
        peaks.append((torch.cuda.max_memory_allocated() - base) / 2**20)
    return {"seconds": statistics.median(runs), "seconds_min": min(runs), "runs": runs, "peak_mb": max(peaks)}


def _fits(ctx: _Ctx, nbytes: float) -> str | None:
    """``None`` when ``nbytes`` fits the memory budget (RAM, or the GPU's free memory), else the reason."""
    if ctx.gpu:
        avail, where = torch.cuda.mem_get_info()[0], "free GPU memory"
    else:
        avail, where = psutil.virtual_memory().available, "available"
    if nbytes <= ctx.cfg.memory_fraction * avail:
        return None
    return (f"needs ~{nbytes / 2**30:.1f} GiB, more than {ctx.cfg.memory_fraction:g} of the "
            f"{avail / 2**30:.1f} GiB {where}")


def _record(ctx: _Ctx, op: str, impl: str, requires_grad: bool | None, result: dict | None = None,
            skipped: str | None = None, **extra) -> dict:
    rec = dict(op=op, impl=impl, **ctx.base, requires_grad=requires_grad, seconds=None, peak_mb=None)
    if result is not None:
        rec.update(result)
    if skipped is not None:
        rec["skipped"] = skipped
        log.warning("%s/%s skipped: %s", op, impl, skipped)
    rec.update(extra)
    if rec["seconds"] is not None:
        log.info("%-8s %-18s grad=%-5s %8.3f s  peak %+8.1f MB", op, impl, requires_grad, rec["seconds"],
                 rec["peak_mb"] or 0.0)
    return rec


def _run_step(forward, x: torch.Tensor, gout: torch.Tensor | None, params=()):
    """Forward, and backward with ``gout`` when given; frees everything before returning."""
    def step():
        out = forward(x)
        if gout is not None:
            out.backward(gout)
            x.grad = None
            for p in params:
                p.grad = None
        del out
    return step


def _edge_index(ctx: _Ctx) -> torch.Tensor:
    dst = np.repeat(np.arange(ctx.num_nodes, dtype=np.int64), np.diff(ctx.indptr))
    return torch.stack([torch.from_numpy(ctx.indices.astype(np.int64)), torch.from_numpy(dst)]).to(ctx.device)


def _randn(ctx: _Ctx, *shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(ctx.device)


# ----------------------------------------------------------------------------- measurements

def _bench_memcpy(ctx: _Ctx) -> list[dict]:
    n = 1 << 27  # 512 MiB of float32 per array
    if ctx.gpu:  # device-to-device copy: the bandwidth bound of the GPU kernels
        n = 1 << 28  # 1 GiB per array, far beyond the L2
        ts = torch.rand(n, device=ctx.device)
        td = torch.empty_like(ts)
        res = _measure(lambda: td.copy_(ts), max(5, ctx.cfg.repeat), gpu=True)
        ctx.bandwidth = 2 * ts.numel() * 4 / res["seconds_min"]
        return [_record(ctx, "memcpy", "torch.copy_", None, res, gb_per_s=ctx.bandwidth / 1e9,
                        bytes=2 * ts.numel() * 4)]
    src = np.random.default_rng(0).random(n, dtype=np.float32)
    dst = np.empty_like(src)
    recs = []
    res = _measure(lambda: np.copyto(dst, src), max(3, ctx.cfg.repeat))
    bw_np = 2 * src.nbytes / res["seconds_min"]
    recs.append(_record(ctx, "memcpy", "numpy.copyto", None, res, gb_per_s=bw_np / 1e9, bytes=2 * src.nbytes,
                        threads_used=1))
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    res = _measure(lambda: td.copy_(ts), max(3, ctx.cfg.repeat))
    bw_t = 2 * src.nbytes / res["seconds_min"]
    recs.append(_record(ctx, "memcpy", "torch.copy_", None, res, gb_per_s=bw_t / 1e9, bytes=2 * src.nbytes))
    ctx.bandwidth = max(bw_np, bw_t)
    return recs


def _bench_sddmm(ctx: _Ctx, g: CSR, x0: torch.Tensor) -> list[dict]:
    """Per-edge dot products ``a[dst] . b[src]`` over ``heads`` heads of ``feat / heads`` features
    (GAT-style scores; DGL's ``gsddmm(g, "dot", A, B, "u", "v")`` in ``dgl_baseline.py kernels``),
    ours against a torch gather-multiply-sum reference, forward and forward + backward."""
    N, E, F, H = ctx.num_nodes, ctx.num_edges, ctx.cfg.feat, ctx.cfg.heads
    from hpc_graph.ops.sddmm import sddmm

    ei = _edge_index(ctx)
    src, dst = ei[0], ei[1]
    del ei
    b0 = x0.view(N, H, F // H)
    a0 = torch.roll(x0, 1, dims=0).view(N, H, F // H).contiguous()

    def gather_dot(ab):
        a, b = ab
        return (a[dst] * b[src]).sum(-1)

    recs = []
    for rg in ctx.cfg.grad:
        a, b = a0.detach().requires_grad_(rg), b0.detach().requires_grad_(rg)
        gout = _randn(ctx, E, H, seed=1) if rg else None

        def step(fn):
            def run():
                out = fn((a, b))
                if gout is not None:
                    out.backward(gout)
                    a.grad = b.grad = None
                del out
            return run
        res = _measure(step(lambda ab: sddmm(g, ab[0], ab[1])), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "sddmm", HPC, rg, res))
        need = E * F * 4 * (3 if rg else 2)
        why = _fits(ctx, need)
        res = None if why else _measure(step(gather_dot), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "sddmm", "gather_mul_sum", rg, res, skipped=why))
    return recs


def _bench_spmm(ctx: _Ctx, g: CSR, x0: torch.Tensor) -> list[dict]:
    N, E, F = ctx.num_nodes, ctx.num_edges, ctx.cfg.feat
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        A = torch.sparse_csr_tensor(g.indptr, g.indices.to(g.indptr.dtype), torch.ones(E, device=ctx.device),
                                    size=(N, N), check_invariants=False)
    ei = _edge_index(ctx)
    src, dst = ei[0], ei[1]
    del ei

    def gather_scatter(x):
        return torch.zeros(N, F, device=x.device).index_add_(0, dst, x[src])

    recs = []
    for rg in ctx.cfg.grad:
        x = x0.detach().requires_grad_(rg)
        gout = _randn(ctx, N, F, seed=1) if rg else None
        res = _measure(_run_step(lambda x: spmm(g, x, "sum"), x, gout), ctx.cfg.repeat, ctx.gpu)
        extra = {}
        if ctx.bandwidth and not rg:
            bound = E * F * x.element_size() / ctx.bandwidth
            extra = dict(bound_seconds=bound, bound_fraction=bound / res["seconds"])
        recs.append(_record(ctx, "spmm", HPC, rg, res, **extra))
        res = _measure(_run_step(lambda x: torch.sparse.mm(A, x), x, gout), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "spmm", "torch.sparse.mm", rg, res))
        need = E * F * 4 * (2 if rg else 1) + 2 * N * F * 4
        why = _fits(ctx, need)
        res = None if why else _measure(_run_step(gather_scatter, x, gout), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "spmm", "gather_index_add", rg, res, skipped=why))
    return recs


class _SageLayer(torch.nn.Module):
    """SAGE layer on hpc_graph's spmm: ``lin_l(mean_{j->i} x_j) + lin_r(x_i)`` (PyG SAGEConv's formula)."""

    def __init__(self, g: CSR, fin: int, fout: int):
        super().__init__()
        self.g = g
        self.lin_l = torch.nn.Linear(fin, fout)
        self.lin_r = torch.nn.Linear(fin, fout, bias=False)

    def forward(self, x):
        return self.lin_l(spmm(self.g, x, "mean")) + self.lin_r(x)


class _GatLayer(torch.nn.Module):
    """GATv1 layer on hpc_graph's fused ``gat_attention`` (PyG GATConv's formula, concat heads)."""

    def __init__(self, g: CSR, fin: int, heads: int, dim: int):
        super().__init__()
        from hpc_graph.ops.gat_attention import gat_attention

        self._attn = gat_attention
        self.g, self.heads, self.dim = g, heads, dim
        self.lin = torch.nn.Linear(fin, heads * dim, bias=False)
        self.att_src = torch.nn.Parameter(torch.randn(1, heads, dim) * 0.1)
        self.att_dst = torch.nn.Parameter(torch.randn(1, heads, dim) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(heads * dim))

    def forward(self, x):
        z = self.lin(x).view(-1, self.heads, self.dim)
        s_src = (z * self.att_src).sum(-1)
        s_dst = (z * self.att_dst).sum(-1)
        out = self._attn(self.g, z, s_src, s_dst, negative_slope=0.2)
        return out.reshape(-1, self.heads * self.dim) + self.bias


def make_sage_pair(g: CSR, edge_index: torch.Tensor, fin: int, fout: int, seed: int = 0):
    """``(hpc_graph SAGE layer, PyG SAGEConv)`` with identical weights; both map ``x [N, fin]`` to ``[N, fout]``."""
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(seed)
    ours = _SageLayer(g, fin, fout)
    theirs = SAGEConv(fin, fout)
    with torch.no_grad():
        theirs.lin_l.weight.copy_(ours.lin_l.weight)
        theirs.lin_l.bias.copy_(ours.lin_l.bias)
        theirs.lin_r.weight.copy_(ours.lin_r.weight)
    return ours, (lambda x: theirs(x, edge_index)), theirs


def make_gat_pair(g: CSR, edge_index: torch.Tensor, fin: int, heads: int, dim: int, seed: int = 0):
    """``(hpc_graph GAT layer, PyG GATConv)`` with identical weights (graphs must already hold self-loops)."""
    from torch_geometric.nn import GATConv

    torch.manual_seed(seed)
    ours = _GatLayer(g, fin, heads, dim)
    theirs = GATConv(fin, dim, heads=heads, add_self_loops=False)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.lin.weight)
        theirs.att_src.copy_(ours.att_src)
        theirs.att_dst.copy_(ours.att_dst)
        theirs.bias.copy_(ours.bias)
    return ours, (lambda x: theirs(x, edge_index)), theirs


def _bench_sage(ctx: _Ctx, g: CSR, x0: torch.Tensor) -> list[dict]:
    N, E, F = ctx.num_nodes, ctx.num_edges, ctx.cfg.feat
    ours, theirs_fn, theirs = make_sage_pair(g, _edge_index(ctx), F, F, ctx.cfg.seed)
    ours.to(ctx.device)
    theirs.to(ctx.device)
    recs = []
    for rg in ctx.cfg.grad:
        x = x0.detach().requires_grad_(rg)
        gout = _randn(ctx, N, F, seed=2)
        res = _measure(_run_step(ours, x, gout, list(ours.parameters())), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "sage", HPC, rg, res))
        why = _fits(ctx, E * F * 4 * (2 if rg else 1) + 4 * N * F * 4)
        res = None if why else _measure(_run_step(theirs_fn, x, gout, list(theirs.parameters())), ctx.cfg.repeat,
                                        ctx.gpu)
        recs.append(_record(ctx, "sage", "pyg.SAGEConv", rg, res, skipped=why))
    return recs


def _bench_gat(ctx: _Ctx, x0: torch.Tensor) -> list[dict]:
    try:
        import hpc_graph.ops.gat_attention  # noqa: F401
    except ImportError as exc:
        log.warning("gat skipped: hpc_graph.ops.gat_attention not available (%s)", exc)
        return [_record(ctx, "gat", HPC, None, skipped=f"hpc_graph.ops.gat_attention not available: {exc}")]
    N, F, H = ctx.num_nodes, ctx.cfg.feat, ctx.cfg.heads
    D = F // H
    # the same graph plus one self-loop per node, for both implementations
    src = np.concatenate([ctx.indices.astype(np.int64), np.arange(N, dtype=np.int64)])
    dst = np.concatenate([np.repeat(np.arange(N, dtype=np.int64), np.diff(ctx.indptr)), np.arange(N)])
    g = CSR.from_edges(src, dst, N).to(ctx.device)
    E = g.num_edges
    edge_index = torch.stack([torch.from_numpy(src), torch.from_numpy(dst)]).to(ctx.device)
    ours, theirs_fn, theirs = make_gat_pair(g, edge_index, F, H, D, ctx.cfg.seed)
    ours.to(ctx.device)
    theirs.to(ctx.device)
    recs = []
    for rg in ctx.cfg.grad:
        x = x0.detach().requires_grad_(rg)
        gout = _randn(ctx, N, H * D, seed=3)
        res = _measure(_run_step(ours, x, gout, list(ours.parameters())), ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "gat", HPC, rg, res, num_edges_with_loops=E))
        why = _fits(ctx, E * H * D * 4 * 3 + E * H * 4 * 6)
        res = None if why else _measure(_run_step(theirs_fn, x, gout, list(theirs.parameters())), ctx.cfg.repeat,
                                        ctx.gpu)
        recs.append(_record(ctx, "gat", "pyg.GATConv", rg, res, skipped=why, num_edges_with_loops=E))
    return recs


def attention_graph(n: int, degree: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr int64[n+1], indices int64[E])``: every node attends to itself and ``degree`` distinct random
    others (columns ascending, no duplicates, so a dense boolean mask holds the same pattern)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, (n, degree), dtype=np.int64)
    pairs = np.unique(np.concatenate([np.arange(n, dtype=np.int64) * n + np.arange(n, dtype=np.int64),
                                      (np.arange(n, dtype=np.int64)[:, None] * n + src).ravel()]))
    dst, cols = np.divmod(pairs, n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, cols


def _bench_attention(ctx: _Ctx) -> list[dict]:
    """Graph-masked attention, forward + backward: fused ``dot_attention`` vs SDPA with a dense boolean mask."""
    from hpc_graph.ops.dot_attention import dot_attention

    H, D, recs = ctx.cfg.attn_heads, ctx.cfg.attn_dim, []
    for S in ctx.cfg.seq_lens:
        S = int(S)
        indptr, cols = attention_graph(S, ctx.cfg.avg_degree, ctx.cfg.seed)
        E = int(cols.shape[0])
        g = CSR(indptr, cols.astype(column_dtype(S)), S).to(ctx.device)
        q0, k0, v0 = (_randn(ctx, S, H, D, seed=s) for s in (11, 12, 13))
        gout = _randn(ctx, S, H, D, seed=14)
        qkv = [t.requires_grad_(True) for t in (q0, k0, v0)]
        extra = dict(seq_len=S, num_edges=E, attn_heads=H, attn_dim=D)

        def ours():
            out = dot_attention(g, *qkv)
            out.backward(gout)
            for t in qkv:
                t.grad = None
            return out

        res = _measure(ours, ctx.cfg.repeat, ctx.gpu)
        recs.append(_record(ctx, "attention", HPC, True, res, **extra))
        # SDPA: the [S, S] mask, the float bias some backends make of it, scores of the math fallback
        need = S * S * (1 + 4) + 6 * S * H * D * 4
        why = _fits(ctx, need)
        if why is None:
            mask = torch.zeros(S, S, dtype=torch.bool, device=ctx.device)
            rows = torch.repeat_interleave(torch.arange(S, device=ctx.device), g.in_degree())
            mask[rows, g.indices.long()] = True
            del rows

            def sdpa():
                out = sdpa_forward(qkv, mask)
                out.backward(gout)
                for t in qkv:
                    t.grad = None
                return out

            try:
                res = _measure(sdpa, ctx.cfg.repeat, ctx.gpu)
                with torch.no_grad():
                    diff = float((dot_attention(g, *qkv) - sdpa_forward(qkv, mask)).abs().max())
                recs.append(_record(ctx, "attention", "torch.sdpa_mask", True, res, max_abs_diff=diff, **extra))
            except torch.OutOfMemoryError as exc:
                recs.append(_record(ctx, "attention", "torch.sdpa_mask", True, skipped=f"out of memory: {exc}"[:200],
                                    **extra))
            del mask
        else:
            recs.append(_record(ctx, "attention", "torch.sdpa_mask", True, skipped=why, **extra))
        g = qkv = gout = None  # ours and sdpa are done: their inputs are released
        if ctx.gpu:
            torch.cuda.empty_cache()
    return recs


def sdpa_forward(qkv, mask: torch.Tensor) -> torch.Tensor:
    """SDPA over ``q, k, v`` float[S, H, D] with a boolean [S, S] mask, as float[S, H, D]."""
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).squeeze(0).transpose(0, 1)


def _bench_locality(ctx: _Ctx, x0: torch.Tensor) -> list[dict]:
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n = ctx.num_nodes
    a = sp.csr_matrix((np.ones(ctx.num_edges, np.float32), ctx.indices, ctx.indptr), shape=(n, n))
    t0 = time.perf_counter()
    rcm = np.asarray(reverse_cuthill_mckee(a, symmetric_mode=ctx.cfg.symmetrize), dtype=np.int64)
    t_rcm = time.perf_counter() - t0
    del a
    rnd = np.random.default_rng(ctx.cfg.seed + 7).permutation(n)
    recs, times = [], {}
    for name, order in (("random", rnd), ("rcm", rcm)):
        g = CSR.permuted(ctx.indptr, ctx.indices, order)
        x = x0[torch.from_numpy(order)].contiguous()
        res = _measure(_run_step(lambda x: spmm(g, x, "sum"), x, None), ctx.cfg.repeat)
        times[name] = res["seconds"]
        extra = dict(order=name)
        if name == "rcm":
            extra.update(reorder_seconds=t_rcm, speedup_vs_random=times["random"] / res["seconds"])
        recs.append(_record(ctx, "locality", f"{HPC}/{name}", False, res, **extra))
        g = x = None
    return recs


_COMPILE_SNIPPET = r"""
import time
t_start = time.perf_counter()
import torch
from hpc_graph.ops import CSR, spmm, sddmm, edge_softmax
t0 = time.perf_counter()
g = CSR([0, 2, 3, 3], [1, 2, 0])
x = torch.randn(3, 4, requires_grad=True)
w = torch.rand(3, requires_grad=True)
for red in ("sum", "mean", "max"):
    spmm(g, x, red, w).sum().backward()
a = torch.randn(3, 2, 4, requires_grad=True)
s = sddmm(g, a, a)
edge_softmax(g, s).sum().backward()
print(t0 - t_start, time.perf_counter() - t0)
"""


def _bench_compile(ctx: _Ctx) -> list[dict]:
    """First-call time of every kernel (float32) in a fresh process: empty cache, then the filled cache."""
    recs = []
    repo = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="hpc-graph-numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        for impl in ("cold_cache", "warm_cache"):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _COMPILE_SNIPPET], env=env, capture_output=True,
                                  text=True, timeout=900)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise RuntimeError(f"compile benchmark failed: {proc.stderr.strip()[-500:]}")
            import_s, first_calls = map(float, proc.stdout.strip().splitlines()[-1].split())
            recs.append(_record(ctx, "compile", impl, None, {"seconds": first_calls, "peak_mb": None},
                                import_seconds=import_s, process_seconds=wall))
    return recs


# ----------------------------------------------------------------------------- driver

def _set_threads(threads: int | None) -> int:
    import numba

    from hpc_graph.comm.threads import configure_threads

    configure_threads(threads, explicit_name="threads")
    return numba.get_num_threads()


def run_kernel_bench(cfg: KernelBenchConfig) -> list[dict]:
    """Run the selected measurements; return one record (dict) per measurement.

    Every record has the keys of :data:`RECORD_FIELDS` plus ``num_nodes``,
    ``num_edges``, ``edge_factor``, ``seconds_min``, ``runs`` and op-specific
    extras; ``seconds``/``peak_mb`` are ``None`` for skipped measurements.
    """
    from data_io.generators.rmat import generate_rmat

    cfg.validate()
    threads = _set_threads(cfg.threads)
    if cfg.device == "cuda":
        from numba import cuda as numba_cuda

        numba_cuda.select_device(torch.cuda.current_device())
    t0 = time.perf_counter()
    data = generate_rmat(cfg.scale, cfg.edge_factor, symmetrize=cfg.symmetrize, feat_dim=0, seed=cfg.seed)
    log.info("R-MAT scale %d: %d nodes, %d edges (%.1f s)", cfg.scale, data.num_nodes, data.num_edges,
             time.perf_counter() - t0)
    ctx = _Ctx(cfg, threads, data.indptr.astype(np.int64), data.indices)
    ctx.base = dict(scale=cfg.scale, feat=cfg.feat, heads=cfg.heads, threads=threads,
                    num_nodes=ctx.num_nodes, num_edges=ctx.num_edges, edge_factor=cfg.edge_factor,
                    device=(torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu"))
    del data
    # features as the dataset loader hands them over: a NumPy array (huge pages), wrapped zero-copy
    x0 = torch.from_numpy(np.random.default_rng(cfg.seed).standard_normal((ctx.num_nodes, cfg.feat),
                                                                          dtype=np.float32)).to(ctx.device)
    records: list[dict] = []
    g = None
    for op in OPS:  # fixed order: memcpy first, so SpMM gets its bandwidth bound
        if op not in cfg.ops:
            continue
        if op in ("spmm", "sddmm", "sage") and g is None:
            g = CSR(ctx.indptr, ctx.indices.astype(column_dtype(ctx.num_nodes))).to(ctx.device)  # as engines load it
        if op == "memcpy":
            records += _bench_memcpy(ctx)
        elif op == "spmm":
            records += _bench_spmm(ctx, g, x0)
        elif op == "sddmm":
            records += _bench_sddmm(ctx, g, x0)
        elif op == "sage":
            records += _bench_sage(ctx, g, x0)
        elif op == "gat":
            records += _bench_gat(ctx, x0)
        elif op == "locality":
            records += _bench_locality(ctx, x0)
        elif op == "compile":
            records += _bench_compile(ctx)
        elif op == "attention":
            records += _bench_attention(ctx)
    return records


def summarize(records: list[dict]) -> list[str]:
    """Human-readable lines: hpc_graph vs every baseline per (op, requires_grad): speed-up and memory ratio."""
    lines = []
    def key_of(r):
        return r["op"], r["requires_grad"], r.get("seq_len")

    ours = {key_of(r): r for r in records if r["impl"] == HPC and r["seconds"]}
    for r in records:
        key = key_of(r)
        if r["op"] == "memcpy" and r["seconds"]:
            lines.append(f"memcpy {r['impl']}: {r['gb_per_s']:.1f} GB/s (read+write)")
        elif r["op"] == "compile":
            lines.append(f"compile {r['impl']}: first call of all kernels {r['seconds']:.2f} s in a fresh process "
                         f"(after {r['import_seconds']:.2f} s of imports)")
        elif r["op"] == "locality" and "speedup_vs_random" in r:
            lines.append(f"locality: SpMM after RCM {r['seconds']:.3f} s, {r['speedup_vs_random']:.2f}x "
                         f"vs random order")
        elif r["impl"] == HPC and r["seconds"]:
            extra = f", {100 * r['bound_fraction']:.0f}% of the bandwidth bound" if "bound_fraction" in r else ""
            what = f"{r['op']} S={r['seq_len']}" if r.get("seq_len") else r["op"]
            lines.append(f"{what} grad={r['requires_grad']}: {HPC} {r['seconds']:.4f} s, "
                         f"peak +{r['peak_mb']:.0f} MB{extra}")
        elif key in ours and r["impl"] != HPC:
            if r["seconds"] is None:
                lines.append(f"  vs {r['impl']}: skipped ({r.get('skipped', '')})")
                continue
            o = ours[key]
            mem = (f", memory {o['peak_mb'] / r['peak_mb']:.2f}x" if r["peak_mb"] and r["peak_mb"] > 1 else "")
            lines.append(f"  vs {r['impl']}: {r['seconds']:.4f} s -> {r['seconds'] / o['seconds']:.2f}x faster"
                         f"{mem} (peak +{r['peak_mb']:.0f} MB)")
    return lines


def write_json(records: list[dict], path, force: bool = False) -> None:
    """Write the records as JSON Lines (one record per line), atomically."""
    from data_io.errors import atomic_output

    with atomic_output(path, force) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")


def write_plot(records: list[dict], path, force: bool = False) -> None:
    """Bar plot (PNG): seconds and extra peak MB per (op, autograd setting), one bar per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from data_io.errors import atomic_output

    rows = [r for r in records if r["op"] in ("spmm", "sage", "gat", "locality") and r["seconds"]]
    def group(r):
        kind = "fwd" if r["op"] in ("spmm", "locality") and not r["requires_grad"] else "fwd+bwd"
        return f"{r['op']}\n{kind}" + ("\nx.requires_grad" if r["requires_grad"] else "")

    groups = list(dict.fromkeys(group(r) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) + 4), 4.5))
    width = 0.8 / max(1, len(impls))
    for ax, key, label in ((axes[0], "seconds", "seconds (median)"), (axes[1], "peak_mb", "extra peak RSS (MB)")):
        for k, impl in enumerate(impls):
            xs, ys = [], []
            for r in rows:
                if r["impl"] == impl and r[key] is not None:
                    xs.append(groups.index(group(r)) + (k - (len(impls) - 1) / 2) * width)
                    ys.append(r[key])
            ax.bar(xs, ys, width, label=impl)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8)
        ax.set_ylabel(label)
    meta = rows[0] if rows else {}
    fig.suptitle(f"kernels: R-MAT scale {meta.get('scale')}, {meta.get('num_edges')} edges, F={meta.get('feat')}, "
                 f"{meta.get('threads')} threads", fontsize=10)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(path, force) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
