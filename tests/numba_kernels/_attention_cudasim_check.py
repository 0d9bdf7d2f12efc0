"""Run the CUDA attention twins under NUMBA_ENABLE_CUDASIM=1 on tiny inputs and compare them
with the torch references (and the CPU twins).  Started by test_attention_cuda.py in a
subprocess so the simulator setting never leaks into the CPU tests.  Exits non-zero on a mismatch.

The simulator runs every GPU thread of every block as a Python thread, so the cost is the number
of threads launched times their work: the graphs are small (every awkward feature still present),
each kernel layout / dtype / option is run once rather than as a cross product, and under the
simulator the checks after the first two launch one-warp blocks (:func:`small_blocks`; the same
kernels, only fewer idle threads).  On a real GPU (``HPC_GRAPH_REAL_GPU=1``) every launch keeps the
production configuration.
"""
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("HPC_GRAPH_REAL_GPU") == "1", \
    "run with NUMBA_ENABLE_CUDASIM=1 (or HPC_GRAPH_REAL_GPU=1 on a machine with a GPU: tests/gpu)"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _attention_ref import awkward_graph, dot_reference, edge_dst, gat_reference, split_blocks  # noqa: E402
from numba import cuda  # noqa: E402

from numba_kernels import get_kernel  # noqa: E402

warnings.simplefilter("ignore", RuntimeWarning)  # uint64 hash arithmetic wraps on purpose
TOL = {np.float32: dict(rtol=3e-4, atol=3e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}
SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIM:  # simulated threads hand the GIL over at every syncthreads and poll: a short switch interval
    sys.setswitchinterval(3e-5)
#: awkward_graph(rng, num_dst, num_src, num_edges): 24-27 edges; hub row 1 with 13-16 of them, rows of 1-5
#: edges, empty rows 0 and 5, isolated sources 5-7 (so split_blocks(g, 3)'s last block has no edges: the early
#: return), self-loops, duplicate edges
GRAPH = (8, 8, 16)


@contextmanager
def small_blocks():
    """Under the simulator: 32-thread blocks for the attention launches (one warp: a chunk of the chunked
    kernels; the thread-per-(row, head) kernels stride the same way), instead of 128 threads of which most
    idle on these tiny inputs. A no-op on a real GPU."""
    import numba_kernels.cuda._attention_common as common
    import numba_kernels.cuda.gat_attention as cuda_gat

    old = cuda_gat._THREADS, common.THREADS_PER_BLOCK
    if SIM:
        cuda_gat._THREADS = common.THREADS_PER_BLOCK = 32
    try:
        yield
    finally:
        cuda_gat._THREADS, common.THREADS_PER_BLOCK = old


@contextmanager
def edges_per_chunk(T):
    """Chunks of ``T`` CSR positions in the chunked GAT kernels (rows across chunks, chunks of short rows)."""
    import numba_kernels.cuda.gat_attention as cuda_gat

    old = cuda_gat.EDGES_PER_CHUNK
    cuda_gat.EDGES_PER_CHUNK = T
    try:
        yield
    finally:
        cuda_gat.EDGES_PER_CHUNK = old


def csc(g):
    """``g.csc()``, the transpose ``(indptr_t, indices_t, perm)``, built with torch here (on the CPU ``CSR.csc``
    runs numba kernels whose cache loads cost more than these tiny transposes)."""
    perm = torch.argsort(g.indices, stable=True)
    indptr_t = torch.zeros(g.num_src + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(g.indices, minlength=g.num_src), 0, out=indptr_t[1:])
    return indptr_t, edge_dst(g)[perm], perm


def K(name, device):
    return get_kernel(name, device)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def check_gat(dtype, p, num_blocks, H=2, D=3):
    """Blocked forward + backward against the float64 torch reference; (H, D) picks the kernel layout:
    F = H * D <= 32 takes one slot per lane, up to 256 several (heads spanning slots when D does not
    divide 32), wider rows the thread-per-(row, head) fallback."""
    rng = np.random.default_rng(7)
    g = awkward_graph(rng, *GRAPH)
    slope, seed = 0.2, 5
    z = rng.standard_normal((g.num_src, H, D)).astype(dtype)
    s_src = (rng.standard_normal((g.num_src, H)) + np.linspace(0, 4, g.num_src)[:, None]).astype(dtype)
    s_dst = rng.standard_normal((g.num_dst, H)).astype(dtype)
    grad_out = rng.standard_normal((g.num_dst, H, D)).astype(dtype)
    blocks = split_blocks(g, num_blocks)
    dst_ids = None  # local ids: exercises the "global id = local id" path
    m, l, acc = K("gat_attention.init_state", "cuda")(g.num_dst, H, D, dtype)
    d_sdst = dev(s_dst)
    for blk, lo, hi, _ in blocks:
        K("gat_attention.accumulate", "cuda")(
            dev(blk.indptr.numpy()), dev(blk.indices.numpy()), dev(z[lo:hi]), dev(s_src[lo:hi]), d_sdst,
            dev(np.arange(lo, hi, dtype=np.int64)), dst_ids, slope, p, seed, m, l, acc)
    K("gat_attention.finalize", "cuda")(m, l, acc)
    delta = cuda.device_array(m.shape, dtype)
    K("gat_attention.output_delta", "cuda")(dev(grad_out), acc, delta)
    gz, gs, gd = np.zeros_like(z), np.zeros_like(s_src), cuda.to_device(np.zeros_like(s_dst))
    for blk, lo, hi, _ in blocks:
        args = (dev(z[lo:hi]), dev(s_src[lo:hi]), d_sdst, dev(np.arange(lo, hi, dtype=np.int64)), dst_ids,
                slope, p, seed, m, l, dev(grad_out), delta)
        K("gat_attention.backward_dst", "cuda")(dev(blk.indptr.numpy()), dev(blk.indices.numpy()), *args, gd)
        indptr_t, indices_t, _ = csc(blk)
        bz, bs = cuda.to_device(np.zeros_like(z[lo:hi])), cuda.to_device(np.zeros_like(s_src[lo:hi]))
        K("gat_attention.backward_src", "cuda")(dev(indptr_t.numpy()), dev(indices_t.numpy()), *args, bz, bs)
        gz[lo:hi] += bz.copy_to_host()
        gs[lo:hi] += bs.copy_to_host()

    tz, ts, td = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (z, s_src, s_dst))
    ref = gat_reference(g, tz, ts, td, slope, p, seed)
    (ref * torch.from_numpy(grad_out).double()).sum().backward()  # d/d ref = grad_out (a scalar backward:
    # ref.backward(grad) would import sympy through torch's shape checks, ~2 s)
    np.testing.assert_allclose(acc.copy_to_host(), ref.detach().numpy(), **TOL[dtype])
    for got, want in ((gz, tz), (gs, ts), (gd.copy_to_host(), td)):
        np.testing.assert_allclose(got, want.grad.numpy(), **TOL[dtype])


def check_dot(dtype, with_bias, num_blocks):
    rng = np.random.default_rng(8)
    g = awkward_graph(rng, *GRAPH)
    H, Dk, Dv, scale = 2, 3, 2, 0.7
    q = rng.standard_normal((g.num_dst, H, Dk)).astype(dtype)
    k = rng.standard_normal((g.num_src, H, Dk)).astype(dtype) * 2
    v = rng.standard_normal((g.num_src, H, Dv)).astype(dtype)
    bias = rng.standard_normal((g.num_edges, H)).astype(dtype) if with_bias else None
    grad_out = rng.standard_normal((g.num_dst, H, Dv)).astype(dtype)
    blocks = split_blocks(g, num_blocks)
    m, l, acc = K("dot_attention.init_state", "cuda")(g.num_dst, H, Dv, dtype)
    d_q = dev(q)
    for blk, lo, hi, mask in blocks:
        b = dev(bias[mask.numpy()]) if with_bias else None
        K("dot_attention.accumulate", "cuda")(dev(blk.indptr.numpy()), dev(blk.indices.numpy()), d_q,
                                             dev(k[lo:hi]), dev(v[lo:hi]), b, scale, m, l, acc)
    K("dot_attention.finalize", "cuda")(m, l, acc)
    delta = cuda.device_array(m.shape, dtype)
    K("dot_attention.output_delta", "cuda")(dev(grad_out), acc, delta)
    gq = cuda.to_device(np.zeros_like(q))
    gk, gv = np.zeros_like(k), np.zeros_like(v)
    gb = np.zeros_like(bias) if with_bias else None
    for blk, lo, hi, mask in blocks:
        b = bias[mask.numpy()] if with_bias else None
        args = (d_q, dev(k[lo:hi]), dev(v[lo:hi]), None if b is None else dev(b), scale, m, l, dev(grad_out), delta)
        bb = None if b is None else cuda.to_device(np.zeros_like(b))
        K("dot_attention.backward_dst", "cuda")(dev(blk.indptr.numpy()), dev(blk.indices.numpy()), *args, gq, bb)
        indptr_t, indices_t, perm = csc(blk)
        bk, bv = cuda.to_device(np.zeros_like(k[lo:hi])), cuda.to_device(np.zeros_like(v[lo:hi]))
        K("dot_attention.backward_src", "cuda")(dev(indptr_t.numpy()), dev(indices_t.numpy()), dev(perm.numpy()),
                                               *args, bk, bv)
        gk[lo:hi] += bk.copy_to_host()
        gv[lo:hi] += bv.copy_to_host()
        if with_bias:
            gb[mask.numpy()] = bb.copy_to_host()

    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    tb = torch.tensor(bias, dtype=torch.float64, requires_grad=True) if with_bias else None
    ref = dot_reference(g, tq, tk, tv, tb, scale)
    (ref * torch.from_numpy(grad_out).double()).sum().backward()  # d/d ref = grad_out
    np.testing.assert_allclose(acc.copy_to_host(), ref.detach().numpy(), **TOL[dtype])
    pairs = [(gq.copy_to_host(), tq), (gk, tk), (gv, tv)] + ([(gb, tb)] if with_bias else [])
    for got, want in pairs:
        np.testing.assert_allclose(got, want.grad.numpy(), **TOL[dtype])


def check_dot_codes(dtype):
    """Code-indexed bias (uint8 codes into a [C, H] table) against the CPU twin, forward and backward."""
    from numba_kernels.cpu import dot_attention as cpu

    rng = np.random.default_rng(10)
    g = awkward_graph(rng, *GRAPH)
    H, Dk, Dv, scale, C = 2, 3, 2, 0.7, 4
    q = rng.standard_normal((g.num_dst, H, Dk)).astype(dtype)
    k = rng.standard_normal((g.num_src, H, Dk)).astype(dtype)
    v = rng.standard_normal((g.num_src, H, Dv)).astype(dtype)
    table = rng.standard_normal((C, H)).astype(dtype)
    codes = rng.integers(0, C, g.num_edges).astype(np.uint8)
    grad_out = rng.standard_normal((g.num_dst, H, Dv)).astype(dtype)
    indptr, indices = g.indptr.numpy(), g.indices.numpy()
    indptr_t, indices_t, perm = (a.numpy() for a in csc(g))
    # CPU twin
    m, l, out = cpu.init_state(g.num_dst, H, Dv, dtype)
    cpu.accumulate(indptr, indices, q, k, v, table, scale, m, l, out, codes=codes)
    cpu.finalize(m, l, out)
    delta = np.empty_like(m)
    cpu.output_delta(grad_out, out, delta)
    want = [out, np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros_like(table)]
    args = (q, k, v, table, scale, m, l, grad_out, delta)
    cpu.backward_dst(indptr, indices, *args, want[1], want[4], codes=codes)
    cpu.backward_src(indptr_t, indices_t, perm, *args, want[2], want[3], codes=codes)
    # CUDA twin
    dm, dl, dacc = K("dot_attention.init_state", "cuda")(g.num_dst, H, Dv, dtype)
    dq, dk, dv, dt, dc = dev(q), dev(k), dev(v), dev(table), dev(codes)
    K("dot_attention.accumulate", "cuda")(dev(indptr), dev(indices), dq, dk, dv, dt, scale, dm, dl, dacc, codes=dc)
    K("dot_attention.finalize", "cuda")(dm, dl, dacc)
    ddelta = cuda.device_array(dm.shape, dtype)
    K("dot_attention.output_delta", "cuda")(dev(grad_out), dacc, ddelta)
    gq, gk, gv, gt = (cuda.to_device(np.zeros_like(a)) for a in (q, k, v, table))
    dargs = (dq, dk, dv, dt, scale, dm, dl, dev(grad_out), ddelta)
    K("dot_attention.backward_dst", "cuda")(dev(indptr), dev(indices), *dargs, gq, gt, codes=dc)
    K("dot_attention.backward_src", "cuda")(dev(indptr_t), dev(indices_t), dev(perm), *dargs, gk, gv, codes=dc)
    got = [dacc.copy_to_host(), gq.copy_to_host(), gk.copy_to_host(), gv.copy_to_host(), gt.copy_to_host()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **TOL[dtype])


def check_dropout_bits_match_cpu():
    """The CUDA hash keeps exactly the coefficients the CPU hash keeps."""
    rng = np.random.default_rng(9)
    n, H, p, seed = 32, 3, 0.4, 2 ** 40 + 17
    src = rng.integers(0, n, n).astype(np.int64)
    src_gid = rng.integers(0, 2 ** 40, n).astype(np.int64)
    dst_gid = rng.integers(0, 2 ** 40, n).astype(np.int64)
    indptr = np.arange(n + 1, dtype=np.int64)
    z, s = np.ones((n, H, 1)), np.zeros((n, H))
    outs = []
    for device in ("cpu", "cuda"):
        m, l, acc = K("gat_attention.init_state", device)(n, H, 1, np.float64)
        K("gat_attention.accumulate", device)(indptr, src, z, s, s, src_gid, dst_gid, 0.2, p, seed, m, l, acc)
        K("gat_attention.finalize", device)(m, l, acc)
        outs.append(acc if device == "cpu" else acc.copy_to_host())
    np.testing.assert_array_equal(outs[0], outs[1])
    assert 0.4 < (outs[0] > 0).mean() < 0.8


if __name__ == "__main__":
    # the production launch configuration (128-thread blocks, 256-edge chunks) for each kernel
    check_gat(np.float64, 0.0, 1)  # one slot per lane (F = 6)
    check_dot(np.float32, False, 1)
    with small_blocks():  # the rest under the simulator with one-warp blocks
        check_dot(np.float64, False, 1)
        for dtype in (np.float32, np.float64):
            check_dot(dtype, True, 3)  # bias; blocks merged into the state, an empty block
        check_dot_codes(np.float64)  # the code-indexed bias reads the same table either dtype
        check_gat(np.float32, 0.3, 3, H=3, D=20)  # dropout; two slots per lane, heads straddling slots
        check_gat(np.float32, 0.0, 2, H=2, D=130)  # wider than 256: the thread-per-(row, head) kernels
        # small chunks, one per dtype: the hub across many chunks (leading/trailing parts, the fix-up merges of
        # every slot), chunks holding several short and empty rows, rows ending on a chunk's last edge or crossing it
        with edges_per_chunk(3):
            check_gat(np.float64, 0.3, 3, H=3, D=20)  # dropout, blocks merged; two slots per lane, idle lanes
        with edges_per_chunk(2):
            check_gat(np.float32, 0.0, 1, H=2, D=3)  # one slot per lane
        check_dropout_bits_match_cpu()
    print("cudasim attention OK")
