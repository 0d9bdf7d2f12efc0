"""Graph-level models: per-graph global tokens, exact SPD bias, readout; each graph of a batch is computed as if
it were alone, and the batch attention equals torch SDPA with the block-diagonal mask and bias (float64)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path
from torch.nn import functional as F

from hpc_graph.graph.whole_graph import WholeGraph as _SingleGraph
from hpc_graph.graph.attention_pattern import far_code, global_code, num_codes, unreachable_code
from hpc_graph.nn import build_model
from hpc_graph.ops import CSR


def _batch(sizes, seed=0, p=0.3):
    rng = np.random.default_rng(seed)
    ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    src, dst = [], []
    for g, n in enumerate(sizes):
        a = rng.random((n, n)) < p
        np.fill_diagonal(a, False)
        a = a | a.T
        s, d = np.nonzero(a)
        src.append(s + ptr[g])
        dst.append(d + ptr[g])
    src, dst = np.concatenate(src), np.concatenate(dst)
    order = np.lexsort((src, dst))
    n = int(ptr[-1])
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[order], minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int64), ptr


def _ctx(indptr, indices, ptr, pe=None):
    g = _SingleGraph(CSR(indptr, indices, int(ptr[-1])), graph_ptr=ptr)
    if pe is not None:
        g.node_fields["lap_pe"] = pe
    return g


def _one(indptr, indices, ptr, g, pe=None):
    lo, hi = int(ptr[g]), int(ptr[g + 1])
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    sub = _ctx(indptr[lo:hi + 1] - e0, indices[e0:e1] - lo, np.array([0, hi - lo]),
               None if pe is None else pe[lo:hi])
    return sub, slice(lo, hi)


@pytest.mark.parametrize("max_dist", [1, 4])
def test_dense_batch_attention_equals_sdpa_with_block_mask_and_spd_bias(max_dist):
    indptr, indices, ptr = _batch([4, 7, 1, 6], seed=max_dist)
    n, G, H, d = int(ptr[-1]), 4, 2, 3
    T = n + G
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(T, H, d, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    bias = torch.randn(num_codes(max_dist), H, dtype=torch.float64, generator=gen, requires_grad=True)
    out = _ctx(indptr, indices, ptr).attention(q, k, v, bias=bias, mode="dense", global_token=True)
    # reference: every pair inside a graph (+ its token), bias by exact distance bucket
    spd = shortest_path(csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n)), unweighted=True)
    code = np.full((T, T), -1)
    graph_of = np.repeat(np.arange(G), np.diff(ptr))
    for i in range(n):
        for j in range(n):
            if graph_of[i] == graph_of[j]:
                s = spd[i, j]
                code[i, j] = unreachable_code(max_dist) if np.isinf(s) else far_code(max_dist) if s > max_dist else s
        code[i, n + graph_of[i]] = code[n + graph_of[i], i] = global_code(max_dist)
    code[np.arange(n, T), np.arange(n, T)] = global_code(max_dist)
    code_t = torch.from_numpy(code)
    mask = torch.where(code_t >= 0, bias[code_t.clamp(min=0)].permute(2, 0, 1),
                       torch.tensor(float("-inf"), dtype=torch.float64))
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask).transpose(0, 1)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v, bias))
    grads_ref = torch.autograd.grad((ref * w).sum(), (q, k, v, bias))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name, extra, mode", [
    ("graphormer", dict(max_spd=3), "dense"), ("graphormer", dict(max_spd=3), "sparse"),
    ("gt", dict(pe_dim=3), "dense"), ("gt", dict(pe_dim=3, global_token=True), "sparse"),
    ("gcn", {}, None), ("sage", {}, None),
])
def test_each_graph_of_a_batch_is_computed_as_if_alone(name, extra, mode):
    indptr, indices, ptr = _batch([5, 1, 8, 6], seed=3)
    n = int(ptr[-1])
    torch.manual_seed(0)
    x = torch.randn(n, 4, dtype=torch.float64)
    pe = torch.randn(n, 3, dtype=torch.float64)
    kw = dict(num_layers=2, dropout=0.0, **extra)
    if mode is not None:
        kw.update(heads=2, attention=mode)
    model = build_model(name, 4, 8, 3, graph_level=True, **kw).double().eval()
    out = model(_ctx(indptr, indices, ptr, pe), x)
    assert out.shape == (4, 3)
    for g in range(4):
        sub, rows = _one(indptr, indices, ptr, g, pe)
        torch.testing.assert_close(out[g:g + 1], model(sub, x[rows]), rtol=1e-10, atol=1e-12)


def test_readout_is_the_mean_of_node_outputs():
    indptr, indices, ptr = _batch([3, 5, 2], seed=1)
    x = torch.randn(int(ptr[-1]), 4, dtype=torch.float64)
    model = build_model("gcn", 4, 8, 3, num_layers=2, dropout=0.0, graph_level=True).double().eval()
    ctx = _ctx(indptr, indices, ptr)
    nodes = model.model(ctx, x)
    want = torch.stack([nodes[ptr[g]:ptr[g + 1]].mean(0) for g in range(3)])
    torch.testing.assert_close(model(ctx, x), want)
    torch.testing.assert_close(ctx.readout(nodes, "sum"), want * torch.tensor([[3.0], [5.0], [2.0]],
                                                                             dtype=torch.float64))


def test_graph_level_errors():
    indptr, indices, ptr = _batch([3, 4], seed=2)
    ctx = _ctx(indptr, indices, ptr)
    q = torch.randn(9, 2, 3)
    with pytest.raises(ValueError, match="global tokens"):
        ctx.attention(q, q, q, mode="sparse", global_token=False)
    with pytest.raises(ValueError, match="q has 8 rows, the batch has 9 tokens"):
        ctx.attention(q[:8], q[:8], q[:8], mode="sparse", global_token=True)
    with pytest.raises(ValueError, match="max_dist \\+ 4"):
        ctx.attention(q, q, q, bias=torch.zeros(3, 2), mode="dense", global_token=True)
    single = _SingleGraph(CSR(indptr, indices, 7))
    with pytest.raises(ValueError, match="graph-level"):
        single.readout(torch.zeros(7, 2))
    with pytest.raises(ValueError, match="max_spd"):
        build_model("graphormer", 4, 8, 2, max_spd=0)
    with pytest.raises(ValueError, match="max_spd"):
        build_model("gt", 4, 8, 2, max_spd=3)
