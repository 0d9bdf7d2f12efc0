"""CUDA twins vs NumPy references, run in a subprocess under ``NUMBA_ENABLE_CUDASIM=1``.

Usage: ``NUMBA_ENABLE_CUDASIM=1 python _cudasim_check.py FAMILY`` with FAMILY
one of ``spmm``, ``sddmm``, ``edge_softmax``; exits non-zero (with the failing
comparison) on a mismatch. Kept out of the pytest process because the
simulator must be chosen before ``numba.cuda`` is first imported.
"""
from __future__ import annotations

import os
import sys
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


def check_spmm(dtype, full=True, H=2, D=3):
    """Every spmm kernel against NumPy; (H, D) picks the row-group layout of the sum kernel (F = H * D:
    8 lanes per row for F <= 8, a warp with several slots per lane for F > 32)."""
    from numba_kernels.cpu._transpose import csr_transpose

    rng = np.random.default_rng(0)
    indptr, indices, dst = _graph(1, 8, 6)
    E = indices.shape[0]
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
                ref /= np.maximum(np.diff(indptr), 1)[:, None, None]
            np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg=f"spmm_sum mean={mean}")
        # max + argmax
        out = np.full((8, H, D), np.nan, dtype)
        am = np.full((8, H, D), -5, np.int64)
        out, am = _run("spmm.spmm_max", indptr, indices, no_e, w, x, out, am)[5:7]
        ref = np.full(out.shape, -np.inf)
        np.maximum.at(ref, dst, msg)
        empty = np.diff(indptr) == 0
        ref[empty] = 0
        np.testing.assert_allclose(out, ref, **_tol(dtype), err_msg="spmm_max")
        assert (am[empty] == -1).all()
        r, h, d = np.nonzero(~empty[:, None, None] & np.ones(out.shape, bool))
        np.testing.assert_allclose(msg[am[r, h, d], h, d], ref[r, h, d], **_tol(dtype))
        # backward through the transpose, and the weight gradient
        g = rng.standard_normal(out.shape).astype(dtype)
        indptr_t, indices_t, perm = csr_transpose(indptr, indices, 6)
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
    indptr_t, indices_t, perm = csr_transpose(indptr, indices, 6)
    gx = np.full((6, H, D), np.nan, dtype)
    (gx,) = _run("spmm.spmm_sum", indptr_t, indices_t, perm, w, scale, g, gx, False)[6:7]
    ref = np.zeros(gx.shape)
    np.add.at(ref, indices, w[:, :, None] * scale[dst][:, None, None] * g[dst])
    np.testing.assert_allclose(gx, ref, **_tol(dtype), err_msg="spmm_sum transposed")
    # fused epilogue: out = agg * rs + ss * sx (rows < len(sx)) + bias
    rs = rng.uniform(0.5, 2, 8).astype(dtype)
    sx = rng.standard_normal((5, H, D)).astype(dtype)
    ss = rng.uniform(0.5, 2, 5).astype(dtype)
    bias = rng.standard_normal(H * D).astype(dtype)
    for mean in (False, True):
        plain = np.zeros((8, H, D), dtype)
        (plain,) = _run("spmm.spmm_sum", indptr, indices, no_e, np.empty((0, 1), dtype), np.empty(0, dtype), x,
                        plain, mean)[6:7]
        out = cuda.to_device(np.full((8, H, D), np.nan, dtype))
        epi = tuple(cuda.to_device(a) for a in (rs, sx, ss, bias))
        get_kernel("spmm.spmm_sum", "cuda")(cuda.to_device(indptr), cuda.to_device(indices), cuda.to_device(no_e),
                                            cuda.to_device(np.empty((0, 1), dtype)),
                                            cuda.to_device(np.empty(0, dtype)), cuda.to_device(x), out, mean, epi)
        ref = plain.astype(np.float64) * rs[:, None, None] + bias.reshape(H, D)
        ref[:5] += ss[:, None, None] * sx
        np.testing.assert_allclose(out.copy_to_host(), ref, **_tol(dtype), err_msg=f"spmm_sum epilogue mean={mean}")


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
    rng = np.random.default_rng(2)
    indptr, _, _ = _graph(3, 6, None, 30)
    E = int(indptr[-1])
    for H in (1, 3) if full else (3,):
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
    check = {"spmm": check_spmm, "sddmm": check_sddmm, "edge_softmax": check_edge_softmax}[family]
    check(np.float32, full=True)  # every variant in float32; the simulator is slow
    check(np.float64, full=False)  # one variant in float64
    if family == "spmm":
        check(np.float32, full=False, H=2, D=20)  # a warp per chunk, two feature slots per lane
        import numba_kernels.cuda.spmm as cuda_spmm

        for T in (3, 1, 5):  # small chunks: hub rows across many chunks, chunks full of short or empty rows
            cuda_spmm.EDGES_PER_CHUNK = T
            check(np.float32, full=T == 3)
            check(np.float64, full=False, H=1, D=40)
    print(f"OK {family}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
