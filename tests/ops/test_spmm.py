"""``hpc_graph.ops.spmm``: forward vs a torch reference, gradcheck on awkward graphs, input checks."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hpc_graph.ops._kernel_args as kargs
from hpc_graph.ops import CSR, spmm


def _graph(awkward_graph, seed=0, num_dst=19, num_src=None, num_edges=90, index_dtype=np.int64) -> CSR:
    indptr, indices = awkward_graph(seed, num_dst=num_dst, num_src=num_src, num_edges=num_edges)
    g = CSR(indptr, indices.astype(index_dtype), num_src=num_src)
    assert g.indices.dtype == torch.from_numpy(np.zeros(1, index_dtype)).dtype  # int32 is kept as given
    return g


def _reference(g: CSR, x, reduce, w=None):
    dst = torch.repeat_interleave(torch.arange(g.num_dst), g.in_degree())
    msg = x[g.indices]
    if w is not None:
        msg = msg * (w.reshape(w.shape + (1,) * (msg.dim() - w.dim())))
    out = torch.zeros((g.num_dst,) + tuple(x.shape[1:]), dtype=x.dtype)
    if reduce == "max":
        idx = dst.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
        out = out.scatter_reduce(0, idx, msg, "amax", include_self=False)
        return out
    out = out.index_add(0, dst, msg)
    if reduce == "mean":
        out = out / g.in_degree().clamp(min=1).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_spmm_forward_backward_match_torch(awkward_graph, dtype, reduce, weighted, index_dtype):
    g = _graph(awkward_graph, 1, num_dst=21, num_src=17, index_dtype=index_dtype)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(17, 6, dtype=dtype, generator=gen, requires_grad=True)
    w = (torch.rand(g.num_edges, dtype=dtype, generator=gen) + 0.5).requires_grad_() if weighted else None
    out = spmm(g, x, reduce, w)
    xr = x.detach().clone().requires_grad_()
    wr = None if w is None else w.detach().clone().requires_grad_()
    ref = _reference(g, xr, reduce, wr)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    gout = torch.randn(out.shape, dtype=dtype, generator=gen)
    out.backward(gout)
    ref.backward(gout)
    torch.testing.assert_close(x.grad, xr.grad, **tol)
    if weighted:
        torch.testing.assert_close(w.grad, wr.grad, **tol)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weights", [None, "edge", "head"])
def test_spmm_gradcheck_awkward_graph(awkward_graph, reduce, weights):
    """float64 gradcheck; the graph has empty rows, isolated nodes, self-loops, duplicates and a hub row."""
    g = _graph(awkward_graph, 2, num_dst=13, num_edges=50)
    gen = torch.Generator().manual_seed(5)
    heads = 2 if weights == "head" else 1
    x = torch.randn(13, heads, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    inputs = [x]
    if weights is not None:
        w = torch.rand((g.num_edges, heads) if weights == "head" else (g.num_edges,), dtype=torch.float64,
                       generator=gen) + 0.5
        inputs.append(w.requires_grad_())
    fn = lambda x, w=None: spmm(g, x, reduce, w)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


def test_spmm_multihead_shared_weight_and_2d(awkward_graph):
    g = _graph(awkward_graph, 3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(19, 3, 4, dtype=torch.float64, generator=gen)
    w = torch.rand(g.num_edges, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(spmm(g, x, "sum", w), _reference(g, x, "sum", w))
    torch.testing.assert_close(spmm(g, x.reshape(19, 12), "mean"), _reference(g, x.reshape(19, 12), "mean"))


def test_spmm_noncontiguous_input(awkward_graph):
    g = _graph(awkward_graph, 4)
    x = torch.randn(8, 19, dtype=torch.float64).t()
    torch.testing.assert_close(spmm(g, x, "sum"), _reference(g, x.contiguous(), "sum"))


def test_spmm_bad_inputs_raise_before_kernels(awkward_graph, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("a kernel ran before the inputs were checked")

    monkeypatch.setattr(kargs, "get_kernel", no_kernel)
    g = _graph(awkward_graph, 5)
    x = torch.randn(19, 4)
    with pytest.raises(ValueError, match="reduce"):
        spmm(g, x, "min")
    with pytest.raises(ValueError, match="x has 18 rows, expected 19"):
        spmm(g, x[:18])
    with pytest.raises(ValueError, match="float32 or float64"):
        spmm(g, x.to(torch.int64))
    with pytest.raises(ValueError, match="edge_weight"):
        spmm(g, x, "sum", torch.ones(g.num_edges + 1))
    with pytest.raises(ValueError, match="dtype"):
        spmm(g, x, "sum", torch.ones(g.num_edges, dtype=torch.float64))
    with pytest.raises(ValueError, match="edge_weight shape"):
        spmm(g, x.view(19, 2, 2), "sum", torch.ones(g.num_edges, 3))
    bad = CSR(g.indptr, g.indices.clone(), validate=False)
    bad.indices[3] = 19
    with pytest.raises(ValueError, match="out of range"):
        spmm(bad, x)
    with pytest.raises(ValueError, match="CSR"):
        spmm((g.indptr, g.indices), x)


def test_spmm_caches_transpose_once(awkward_graph):
    g = _graph(awkward_graph, 6)
    x = torch.randn(19, 3, requires_grad=True)
    spmm(g, x, "mean").sum().backward()
    first = g._csc
    assert first is not None
    assert first[2] is None  # unweighted backward: no 8-byte-per-edge permutation kept
    ref = torch.argsort(g.indices, stable=True)
    dst = torch.repeat_interleave(torch.arange(g.num_dst), g.indptr[1:] - g.indptr[:-1])
    torch.testing.assert_close(first[1], dst[ref])
    spmm(g, x, "sum").sum().backward()
    assert g._csc is first
    # a weighted backward needs the permutation: built then, and kept
    w = torch.rand(g.num_edges, requires_grad=True)
    spmm(g, x, "sum", w).sum().backward()
    torch.testing.assert_close(g._csc[2], ref)
    with_perm = g._csc
    spmm(g, x, "sum").sum().backward()
    assert g._csc is with_perm


def test_spmm_empty_graph():
    g = CSR(np.zeros(4, np.int64), np.zeros(0, np.int64), num_src=2)
    x = torch.randn(2, 3, requires_grad=True)
    for reduce in ("sum", "mean", "max"):
        out = spmm(g, x, reduce)
        assert out.shape == (3, 3) and not out.any()
        out.sum().backward()
        assert not x.grad.any()


def test_spmm_large_outputs_use_numpy_memory_and_stay_correct():
    """Outputs >= 4 MiB come from NumPy (huge pages): same values, usable by autograd."""
    rng = np.random.default_rng(0)
    n, F = 1 << 14, 64  # 4 MiB of float32 output
    dst = rng.integers(0, n, 4 * n)
    g = CSR.from_edges(rng.integers(0, n, 4 * n), dst, n)
    x = torch.from_numpy(rng.standard_normal((n, F), dtype=np.float32)).requires_grad_()
    out = spmm(g, x, "mean")
    assert out.shape == (n, F) and out.dtype == torch.float32
    ref = _reference(g, x.detach(), "mean")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.pow(2).sum().backward()
    xr = x.detach().clone().requires_grad_()
    _reference(g, xr, "mean").pow(2).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    big = kargs.empty((n, F), torch.float32, torch.device("cpu"))
    assert big.shape == (n, F) and big.dtype == torch.float32 and big.is_contiguous()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("block_bytes", [24, 200])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_column_blocked_path_matches_torch(awkward_graph, monkeypatch, reduce, weighted, heads, block_bytes,
                                           index_dtype):
    """A tiny ``BLOCK_BYTES`` forces the column-blocked CPU kernel (several source ranges, forward and backward)."""
    import sys

    spmm_mod = sys.modules["hpc_graph.ops.spmm"]
    monkeypatch.setattr(spmm_mod, "BLOCK_BYTES", block_bytes)
    g = _graph(awkward_graph, 5, num_dst=23, num_src=31, num_edges=150, index_dtype=index_dtype)
    gen = torch.Generator().manual_seed(4)
    shape = (31, 4) if heads is None else (31, heads, 2)
    x = torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)
    w = None
    if weighted:
        w = (torch.rand(g.num_edges, *(() if heads is None else (heads,)), dtype=torch.float64, generator=gen)
             + 0.5).requires_grad_()
    assert spmm_mod._num_blocks(g.num_src, x[0].numel() * 8) >= 2
    out = spmm(g, x, reduce, edge_weight=w)
    ref = _reference(g, x, reduce, w)
    torch.testing.assert_close(out, ref)
    gout = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(out, [x] + ([w] if weighted else []), gout)
    want = torch.autograd.grad(ref, [x] + ([w] if weighted else []), gout)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert any(k[0] == "spmm.blocked" for k in g._cache if isinstance(k, tuple))


def _symmetric_graph(seed: int, n: int = 29, m: int = 70, dup: bool = False) -> CSR:
    """A random undirected multigraph (both directions of every edge; ``dup``: one edge added in one direction)."""
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])
    if dup:
        src, dst = np.append(src, s[0]), np.append(dst, d[0] if d[0] != s[0] else (d[0] + 1) % n)
    order = np.lexsort((src, dst))  # rows ascending, as the transpose lists them
    return CSR.from_edges(src[order], dst[order], n)


@pytest.mark.parametrize("seed, dup, sort_rows", [(0, False, True), (1, False, True), (2, True, True),
                                                   (3, False, False)])
def test_is_symmetric_matches_the_transpose(seed, dup, sort_rows):
    g = _symmetric_graph(seed, dup=dup)
    if not sort_rows:  # a symmetric edge set whose rows are not ascending: the transpose differs
        idx = g.indices.clone()
        for i in range(g.num_dst):
            a, b = int(g.indptr[i]), int(g.indptr[i + 1])
            if b - a >= 2 and idx[a] != idx[b - 1]:
                idx[a:b] = idx[a:b].flip(0)
                break
        g = CSR(g.indptr, idx, g.num_src)
    from numba_kernels.cpu._transpose import csr_transpose

    t = csr_transpose(g.indptr.numpy(), g.indices.numpy(), g.num_src, False)
    want = bool(np.array_equal(t[0], g.indptr.numpy()) and np.array_equal(t[1], g.indices.numpy()))
    assert want == (not dup and sort_rows)  # the cases really are what they claim
    assert g.is_symmetric() == want


@pytest.mark.parametrize("block_bytes", [0, 24])
@pytest.mark.parametrize("weighted", [False, True])
def test_symmetric_graph_shares_its_transpose(monkeypatch, block_bytes, weighted):
    """A symmetric CSR is its own CSC: no second copy of the arrays (nor of the blocked order), same results."""
    import sys

    spmm_mod = sys.modules["hpc_graph.ops.spmm"]
    monkeypatch.setattr(spmm_mod, "BLOCK_BYTES", block_bytes)
    g = _symmetric_graph(4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(g.num_src, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w = (torch.rand(g.num_edges, dtype=torch.float64, generator=gen) + 0.5).requires_grad_() if weighted else None
    out = spmm(g, x, "mean", edge_weight=w)
    ref = _reference(g, x, "mean", w)
    torch.testing.assert_close(out, ref)
    gout = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    inputs = [x] + ([w] if weighted else [])
    for a, b in zip(torch.autograd.grad(out, inputs, gout), torch.autograd.grad(ref, inputs, gout)):
        torch.testing.assert_close(a, b)
    indptr_t, indices_t, perm = g.csc()
    assert indptr_t is g.indptr and indices_t is g.indices
    if weighted:  # per-edge values still need the permutation, built by the general transpose
        from numba_kernels.cpu._transpose import csr_transpose

        assert np.array_equal(perm.numpy(), csr_transpose(g.indptr.numpy(), g.indices.numpy(), g.num_src, True)[2])
    blocked = [k for k in g._cache if isinstance(k, tuple) and k[0] == "spmm.blocked"]
    if block_bytes and not weighted:
        assert [k[1] for k in blocked] == ["csr"]  # one blocked copy for both directions


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("self_term", ["loop", "rows", None])
@pytest.mark.parametrize("heads", [None, 2])
@pytest.mark.parametrize("block_bytes", [0, 24])
def test_spmm_fused_matches_composed_torch(awkward_graph, monkeypatch, reduce, self_term, heads, block_bytes):
    """``scale * reduce(x) + self_scale * S + bias`` against the same value composed from torch ops, and its
    gradients w.r.t. x, the self rows and the bias (float64, plain and column-blocked kernels)."""
    import sys

    from hpc_graph.ops import spmm_fused

    monkeypatch.setattr(sys.modules["hpc_graph.ops.spmm"], "BLOCK_BYTES", block_bytes)
    g = _graph(awkward_graph, 8, num_dst=21, num_src=30, num_edges=140)
    gen = torch.Generator().manual_seed(3)
    tail = (4,) if heads is None else (heads, 3)
    x = torch.randn(30, *tail, dtype=torch.float64, generator=gen, requires_grad=True)
    rows = torch.randn(21, *tail, dtype=torch.float64, generator=gen, requires_grad=True)
    scale = torch.rand(21, dtype=torch.float64, generator=gen) + 0.5
    self_scale = torch.rand(21, dtype=torch.float64, generator=gen) + 0.5
    bias = torch.randn(int(np.prod(tail)), dtype=torch.float64, generator=gen, requires_grad=True)
    out = spmm_fused(g, x, reduce, scale=scale, self_loop=self_term == "loop",
                     self_rows=rows if self_term == "rows" else None, self_scale=self_scale, bias=bias)
    col = (-1,) + (1,) * len(tail)
    ref = _reference(g, x, reduce) * scale.view(col) + bias.view(tail)
    if self_term is not None:
        ref = ref + self_scale.view(col) * (x[:21] if self_term == "loop" else rows)
    torch.testing.assert_close(out, ref)
    gout = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    inputs = [x, bias] + ([rows] if self_term == "rows" else [])
    for a, b in zip(torch.autograd.grad(out, inputs, gout), torch.autograd.grad(ref, inputs, gout)):
        torch.testing.assert_close(a, b)


def test_spmm_fused_bad_inputs(awkward_graph):
    from hpc_graph.ops import spmm_fused

    g = _graph(awkward_graph, 2, num_dst=19, num_src=25, num_edges=60)
    x = torch.randn(25, 4)
    with pytest.raises(ValueError, match="reduce"):
        spmm_fused(g, x, "max")
    with pytest.raises(ValueError, match="not both"):
        spmm_fused(g, x, self_loop=True, self_rows=torch.randn(19, 4))
    with pytest.raises(ValueError, match="scale"):
        spmm_fused(g, x, scale=torch.rand(18))
    with pytest.raises(ValueError, match="dtype"):
        spmm_fused(g, x, scale=torch.rand(19, dtype=torch.float64))
    with pytest.raises(ValueError, match="self_rows"):
        spmm_fused(g, x, self_rows=torch.randn(19, 5))
    with pytest.raises(ValueError, match="bias"):
        spmm_fused(g, x, bias=torch.randn(5))
    narrow = _graph(awkward_graph, 2, num_dst=19, num_src=12, num_edges=40)
    with pytest.raises(ValueError, match="self_loop"):
        spmm_fused(narrow, torch.randn(12, 4), self_loop=True)


BLOCK_ENVS = [
    ({"HPC_GRAPH_SPMM_BLOCK_BYTES": "256MiB", "HPC_GRAPH_SPMM_MAX_BLOCKS": "2"}, "268435456 2"),
    ({"HPC_GRAPH_SPMM_BLOCK_BYTES": "0"}, "0 8"),
    ({}, f"{32 << 20} 8"),
]


@pytest.fixture(scope="module")
def block_settings_seen():
    """What a fresh process reads for each environment of ``BLOCK_ENVS``: one subprocess imports the module
    under the first and re-imports it (``importlib.reload``) under each of the others."""
    import json
    import subprocess
    import sys

    code = ("import importlib, json, os, sys\n"
            "envs = json.loads(sys.argv[1])\n"
            "for i, env in enumerate(envs):\n"
            "    for k in [k for k in os.environ if k.startswith('HPC_GRAPH_SPMM_')]:\n"
            "        del os.environ[k]\n"
            "    os.environ.update(env)\n"
            "    if i == 0:\n"
            "        import hpc_graph.ops.spmm, hpc_graph.plan.predict\n"
            "    else:\n"
            "        importlib.reload(sys.modules['hpc_graph.ops.spmm'])\n"
            "    s = sys.modules['hpc_graph.ops.spmm']\n"
            "    print('SEEN', s.BLOCK_BYTES, s.MAX_BLOCKS)\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("HPC_GRAPH_SPMM_")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps([env for env, _ in BLOCK_ENVS])], env=full,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("SEEN ")]


@pytest.mark.parametrize("case", range(len(BLOCK_ENVS)))
def test_block_settings_from_the_environment(block_settings_seen, case):
    """The column-range settings are read when the module is imported."""
    assert len(block_settings_seen) == len(BLOCK_ENVS)
    assert block_settings_seen[case] == BLOCK_ENVS[case][1].split()


@pytest.mark.parametrize("name,value,message", [
    ("HPC_GRAPH_SPMM_BLOCK_BYTES", "lots", "not a size"),
    ("HPC_GRAPH_SPMM_MAX_BLOCKS", "0", "at least 1"),
])
def test_bad_block_settings_name_the_variable(monkeypatch, name, value, message):
    from data_io.memory import env_bytes

    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}=.*{message}"):
        env_bytes(name, 8, 1 if "MAX" in name else 0)


def test_bad_block_setting_is_one_cli_error_line():
    import subprocess
    import sys

    env = {**os.environ, "HPC_GRAPH_SPMM_MAX_BLOCKS": "-3"}
    out = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "bench", "kernels", "--scale", "6", "--ops",
                          "spmm"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "HPC_GRAPH_SPMM_MAX_BLOCKS='-3'" in errors[0], out.stderr
    assert "Traceback" not in out.stderr
