"""CUDA twins vs NumPy references, run in a subprocess under ``NUMBA_ENABLE_CUDASIM=1``.

Usage: ``NUMBA_ENABLE_CUDASIM=1 python _cudasim_check.py FAMILY`` with FAMILY
one of ``spmm``, ``sddmm``, ``edge_softmax``; exits non-zero (with the failing
comparison) on a mismatch. Kept out of the pytest process because the
simulator must be chosen before ``numba.cuda`` is first imported.

The simulator runs every GPU thread of every block as a Python thread, so the
cost is the number of threads launched times their work: each kernel layout,
dtype and option runs once rather than as a cross product, and under the
simulator the spmm checks after the first one launch 32-thread
blocks (:func:`spmm_launch`; the same kernels, only fewer idle threads). On a
real GPU (``HPC_GRAPH_REAL_GPU=1``) every launch keeps the production configuration.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS.parent))  # the repo root, for numba_kernels


def _load_awkward_graph():
    """``awkward_graph`` from tests/conftest.py, loaded by path (other conftest.py files may be on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_hpc_graph_tests_conftest", _TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.awkward_graph


awkward_graph = _load_awkward_graph()

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("HPC_GRAPH_REAL_GPU") == "1", \
    "run with NUMBA_ENABLE_CUDASIM=1 (or HPC_GRAPH_REAL_GPU=1 on a machine with a GPU: tests/gpu)"
from numba import cuda  # noqa: E402

from numba_kernels import get_kernel  # noqa: E402

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIM:  # simulated threads hand the GIL over at every syncthreads and poll: a short switch interval
    sys.setswitchinterval(5e-4)


@contextmanager
def spmm_launch(edges_per_chunk=None):
    """``EDGES_PER_CHUNK = edges_per_chunk`` (if given) for the edge-balanced sum, and under the simulator
    32-thread blocks for every spmm launch (4 groups of 8 lanes, or one warp, per block) instead of 128
    threads of which most idle on these tiny inputs."""
    import numba_kernels.cuda.spmm as cuda_spmm

    old = cuda_spmm.EDGES_PER_CHUNK, cuda_spmm._THREADS
    if edges_per_chunk is not None:
        cuda_spmm.EDGES_PER_CHUNK = edges_per_chunk
    if SIM:
        cuda_spmm._THREADS = 32
    try:
        yield
    finally:
        cuda_spmm.EDGES_PER_CHUNK, cuda_spmm._THREADS = old


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


def _run(name, *args):
    """Call CUDA kernel ``name`` on device copies of ``args``; return the host copies."""
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    get_kernel(name, "cuda")(*dev)
    return [d.copy_to_host() if isinstance(a, np.ndarray) else a for a, d in zip(args, dev)]


def _graph(seed, nd=8, ns=None, edges=24):
    indptr, indices = awkward_graph(seed, num_dst=nd, num_src=ns, num_edges=edges)
    return indptr, indices, np.repeat(np.arange(nd), np.diff(indptr))


def _transpose(indptr, indices, num_src):
    """``(indptr_t, indices_t, perm)`` of the CSR's transpose in NumPy (rows ascending within each column;
    ``perm[p]`` the CSR position of transposed edge ``p``), as ``numba_kernels.cpu._transpose.csr_transpose``
    without starting numba's CPU target in this process."""
    perm = np.argsort(indices, kind="stable").astype(np.int64)
    indptr_t = np.zeros(num_src + 1, np.int64)
    np.cumsum(np.bincount(indices, minlength=num_src), out=indptr_t[1:])
    return indptr_t, np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))[perm], perm


def check_spmm(dtype, full=True, H=2, D=3, max_kernels=True):
    """Every spmm kernel against NumPy; (H, D) picks the row-group layout of the sum kernel (F = H * D:
    8 lanes per row for F <= 8, a warp with several slots per lane for F > 32).

    ``full``: the sum with every weight variant (none, per head, shared), else the per-head weight only;
    ``max_kernels``: also spmm_max, its backward and its weight gradient (for the same weights; their
    layout does not depend on the chunk size, so the chunk-size variants skip them).
    """
    rng = np.random.default_rng(0)
    indptr, indices, dst = _graph(1, 8, 6)
    E = indices.shape[0]
    deg = np.diff(indptr)
    x = rng.standard_normal((6, H, D)).astype(dtype)
    no_e = np.empty(0, np.int64)
    weights = [np.empty((0, 1), dtype), rng.uniform(0.5, 2, (E, H)).astype(dtype),
               rng.uniform(0.5, 2, (E, 1)).astype(dtype)]
    for w in weights if full else weights[1:2]:
        wf = np.ones((E, 1)) if w.shape[0] == 0 else w.astype(np.float64)
        msg = x[indices] * wf[:, :, None]
        for mean in (False, True):
            out = np.full((8, H, D), np.nan, dtype)
            (out,) = _run("spmm.spmm_sum", indptr, indices, no_e, w, np.empty(0, dtype), x, out, mean)[6:7]
            ref = np.zeros(out.shape)
            np.add.at(ref, dst, msg)
            if mean:
                ref /= np.maximum(deg, 1)[:, None, None]
            np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg=f"spmm_sum mean={mean}")
        if not max_kernels:
            continue
        # max + argmax
        out = np.full((8, H, D), np.nan, dtype)
        am = np.full((8, H, D), -5, np.int64)
        out, am = _run("spmm.spmm_max", indptr, indices, no_e, w, x, out, am)[5:7]
        ref = np.full(out.shape, -np.inf)
        np.maximum.at(ref, dst, msg)
        empty = deg == 0
        ref[empty] = 0
        np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg="spmm_max")
        assert (am[empty] == -1).all()
        r, h, d = np.nonzero(~empty[:, None, None] & np.ones(out.shape, bool))
        np.testing.assert_allclose(msg[am[r, h, d], h, d], ref[r, h, d], **_tol(dtype))
        # backward through the transpose, and the weight gradient
        g = rng.standard_normal(out.shape).astype(dtype)
        indptr_t, indices_t, perm = _transpose(indptr, indices, 6)
        gx = np.full(x.shape, np.nan, dtype)
        (gx,) = _run("spmm.spmm_max_backward", indptr_t, indices_t, perm, w, am, g, gx)[6:7]
        ok = am >= 0
        r, h, d = np.nonzero(ok)
        e = am[r, h, d]
        ref_gx = np.zeros(x.shape)
        np.add.at(ref_gx, (indices[e], h, d), wf[e, h if wf.shape[1] > 1 else 0] * g[r, h, d])
        np.testing.assert_allclose(gx, ref_gx, **_tol(dtype), err_msg="spmm_max_backward")
        if w.shape[0]:
            gw = np.full(w.shape, np.nan, dtype)
            (gw,) = _run("spmm.spmm_max_weight_grad", indptr, indices, am, x, g, gw)[5:6]
            ref_gw = np.zeros(w.shape)
            np.add.at(ref_gw, (e, h if w.shape[1] > 1 else 0), g[r, h, d] * x[indices[e], h, d])
            np.testing.assert_allclose(gw, ref_gw, **_tol(dtype), err_msg="spmm_max_weight_grad")
    # transposed form: eids + col_scale
    w = rng.uniform(0.5, 2, (E, H)).astype(dtype)
    g = rng.standard_normal((8, H, D)).astype(dtype)
    scale = rng.uniform(0.5, 2, 8).astype(dtype)
    indptr_t, indices_t, perm = _transpose(indptr, indices, 6)
    gx = np.full((6, H, D), np.nan, dtype)
    (gx,) = _run("spmm.spmm_sum", indptr_t, indices_t, perm, w, scale, g, gx, False)[6:7]
    ref = np.zeros(gx.shape)
    np.add.at(ref, indices, w[:, :, None] * scale[dst][:, None, None] * g[dst])
    np.testing.assert_allclose(gx, ref, **_tol(dtype), err_msg="spmm_sum transposed")
    # fused epilogue of the mean: out = mean * rs + ss * sx (rows < len(sx)) + bias
    rs = rng.uniform(0.5, 2, 8).astype(dtype)
    sx = rng.standard_normal((5, H, D)).astype(dtype)
    ss = rng.uniform(0.5, 2, 5).astype(dtype)
    bias = rng.standard_normal(H * D).astype(dtype)
    out = cuda.to_device(np.full((8, H, D), np.nan, dtype))
    epi = tuple(cuda.to_device(a) for a in (rs, sx, ss, bias))
    get_kernel("spmm.spmm_sum", "cuda")(cuda.to_device(indptr), cuda.to_device(indices), cuda.to_device(no_e),
                                        cuda.to_device(np.empty((0, 1), dtype)),
                                        cuda.to_device(np.empty(0, dtype)), cuda.to_device(x), out, True, epi)
    ref = np.zeros((8, H, D))
    np.add.at(ref, dst, x[indices].astype(np.float64))
    ref = ref / np.maximum(deg, 1)[:, None, None] * rs[:, None, None] + bias.reshape(H, D)
    ref[:5] += ss[:, None, None] * sx
    np.testing.assert_allclose(out.copy_to_host(), ref, **_tol(dtype), err_msg="spmm_sum epilogue")


def check_sddmm(dtype, full=True):
    rng = np.random.default_rng(1)
    indptr, indices, dst = _graph(2, 8, 7)
    a = rng.standard_normal((8, 3, 5)).astype(dtype)
    b = rng.standard_normal((7, 3, 5)).astype(dtype)
    out = np.full((indices.shape[0], 3), np.nan, dtype)
    (out,) = _run("sddmm.sddmm", indptr, indices, a, b, out)[4:5]
    ref = np.einsum("ehd,ehd->eh", a[dst], b[indices])
    np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg="sddmm")


def check_edge_softmax(dtype, full=True):
    """3 heads (not dividing the block's 128 threads: idle lanes; 1 head reaches nothing more); ``full`` unused.

    The kernels read only ``indptr`` (a block per row): the awkward graph's rows with edges (the hub first),
    one of its empty rows between them and its last (empty) row; its other empty rows would add nothing.
    """
    rng = np.random.default_rng(2)
    full_indptr, _, _ = _graph(3, 6, None, 30)
    deg = np.diff(full_indptr)
    keep = np.unique(np.concatenate([np.flatnonzero(deg), np.flatnonzero(deg == 0)[:1], [deg.shape[0] - 1]]))
    deg = deg[keep]  # [23, 0, 13, 0]
    assert deg.max() > 20 and deg[-1] == 0 and (deg[:-1] == 0).any()
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    E = int(indptr[-1])
    H = 3
    s = (rng.standard_normal((E, H)) * 4).astype(dtype)
    s[0] += 300
    out = np.full(s.shape, np.nan, dtype)
    (out,) = _run("edge_softmax.edge_softmax", indptr, s, out)[2:3]
    ref = np.zeros(s.shape)
    g = rng.standard_normal((E, H)).astype(dtype)
    ref_g = np.zeros(s.shape)
    for i in range(indptr.shape[0] - 1):
        sl = slice(indptr[i], indptr[i + 1])
        if indptr[i + 1] > indptr[i]:
            ex = np.exp(s[sl].astype(np.float64) - s[sl].max(0))
            ref[sl] = ex / ex.sum(0)
            ref_g[sl] = ref[sl] * (g[sl] - (ref[sl] * g[sl]).sum(0))
    np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg=f"edge_softmax H={H}")
    grad = np.full(s.shape, np.nan, dtype)
    (grad,) = _run("edge_softmax.edge_softmax_backward", indptr, out, g, grad)[3:4]
    np.testing.assert_allclose(grad, ref_g, **_tol(dtype), err_msg=f"edge_softmax_backward H={H}")


def main(family: str) -> int:
    if family != "spmm":
        check = {"sddmm": check_sddmm, "edge_softmax": check_edge_softmax}[family]
        check(np.float32, full=True)  # every variant in float32
        check(np.float64, full=False)  # one variant in float64
    else:
        check_spmm(np.float64, full=False)  # the production launch configuration
        with spmm_launch():  # the rest under the simulator with 32-thread blocks
            check_spmm(np.float32, full=True)  # every variant
            check_spmm(np.float32, full=False, H=2, D=20, max_kernels=False)  # a warp per chunk, two slots per lane
        # small chunks: the hub across many chunks (leading/trailing parts, fix-up merges), chunks holding
        # several short and empty rows (T = 3, 5), chunks of one edge each (T = 1)
        with spmm_launch(3):
            check_spmm(np.float32, full=True, max_kernels=False)
        with spmm_launch(5):
            check_spmm(np.float64, full=False, H=1, D=40, max_kernels=False)
        with spmm_launch(1):
            check_spmm(np.float32, full=False, max_kernels=False)
    print(f"OK {family}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
