"""Micro-batch contexts of the flow engine against whole-graph references on random graphs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.graph.microbatch import History, MicroBatchGraph, MicroBatchPlan
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.sage_conv import SAGEConv
from hpc_graph.ops.csr import CSR


def _graph(n=40, e=200, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    pairs = np.unique(np.stack([dst, src], 1), axis=0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    return indptr, pairs[:, 1].astype(np.int64)


OFFSETS = np.array([0, 9, 23, 40])


def _edges(indptr, indices):
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


def test_plan_structure_matches_brute_force():
    indptr, indices = _graph()
    plan = MicroBatchPlan(indptr, indices, OFFSETS, np.arange(40))
    edges = _edges(indptr, indices)
    part = np.repeat(np.arange(3), np.diff(OFFSETS))
    assert plan.cut_edges == sum(part[s] != part[d] for s, d in edges)
    for m, p in enumerate(plan.parts):
        lo, hi = OFFSETS[m], OFFSETS[m + 1]
        inner = _edges(p.inner.indptr.numpy(), p.inner.indices.numpy())
        assert inner == {(s - lo, d - lo) for s, d in edges if lo <= d < hi and lo <= s < hi}
        halo = np.asarray(p.halo)
        cols = np.concatenate([np.arange(lo, hi), halo])
        full = {(int(cols[s]), d + lo) for s, d in _edges(p.full.indptr.numpy(), p.full.indices.numpy())}
        assert full == {(s, d) for s, d in edges if lo <= d < hi}
        assert np.all((halo < lo) | (halo >= hi)) and np.all(np.diff(halo) > 0)


@pytest.mark.parametrize("make", [lambda: GCNConv(5, 4), lambda: SAGEConv(5, 4),
                                  lambda: GATConv(5, 2, heads=2, concat=True)])
@pytest.mark.parametrize("layer", [0, 2])
def test_stale_with_true_history_equals_the_whole_graph(make, layer):
    torch.manual_seed(0)
    indptr, indices = _graph(seed=1)
    plan = MicroBatchPlan(indptr, indices, OFFSETS, np.arange(40))
    conv = make().double()
    h = torch.randn(40, 5, dtype=torch.float64)
    want = conv(WholeGraph(CSR(indptr, indices, 40)), h)
    hist = History(40)
    hist.inputs = h
    if layer:
        hist.layers[layer] = h.clone()  # the rows of the other micro-batches, as a finished epoch left them
    for m in range(3):
        lo, hi = OFFSETS[m], OFFSETS[m + 1]
        g = MicroBatchGraph(plan, m, "stale", hist).layer(layer)
        x = g.layer_input(h[lo:hi])
        assert x.shape[0] == hi - lo + len(plan.parts[m].halo)
        torch.testing.assert_close(conv(g, x), want[lo:hi])


def test_stale_history_gets_the_rows_and_no_gradient():
    indptr, indices = _graph(seed=2)
    plan = MicroBatchPlan(indptr, indices, OFFSETS, np.arange(40))
    hist = History(40)
    g = MicroBatchGraph(plan, 1, "stale", hist).layer(1)
    h = torch.randn(14, 3, requires_grad=True)
    x = g.layer_input(h)
    torch.testing.assert_close(hist.layers[1][9:23], h.detach())
    assert torch.all(hist.layers[1][:9] == 0) and hist.nbytes() == 40 * 3 * 4
    x.sum().backward()
    assert torch.all(h.grad == 1)  # the halo rows appended carry no gradient anywhere


def test_drop_equals_the_whole_graph_without_cut_edges():
    torch.manual_seed(3)
    indptr, indices = _graph(seed=3)
    plan = MicroBatchPlan(indptr, indices, OFFSETS, np.arange(40))
    part = np.repeat(np.arange(3), np.diff(OFFSETS))
    dst = np.repeat(np.arange(40), np.diff(indptr))
    keep = part[dst] == part[indices]
    cut = CSR(np.concatenate(([0], np.cumsum(np.bincount(dst[keep], minlength=40)))), indices[keep], 40)
    conv = GCNConv(5, 3).double()
    h = torch.randn(40, 5, dtype=torch.float64)
    want = conv(WholeGraph(cut), h)
    for m in range(3):
        lo, hi = OFFSETS[m], OFFSETS[m + 1]
        g = MicroBatchGraph(plan, m, "drop")
        assert g.layer(0) is g.layer(5)
        torch.testing.assert_close(conv(g.layer(0), h[lo:hi]), want[lo:hi])


def test_bad_inputs():
    indptr, indices = _graph()
    with pytest.raises(ValueError, match="offsets must rise strictly from 0 to 40"):
        MicroBatchPlan(indptr, indices, np.array([0, 10, 10, 40]), np.arange(40))
    plan = MicroBatchPlan(indptr, indices, OFFSETS, np.arange(40))
    with pytest.raises(ValueError, match="mode 'stale' needs a History"):
        MicroBatchGraph(plan, 0, "stale")
    with pytest.raises(ValueError, match="mode must be 'drop' or 'stale'"):
        MicroBatchGraph(plan, 0, "exact")
    g = MicroBatchGraph(plan, 0, "stale", History(40))
    with pytest.raises(RuntimeError, match="must call graph.layer"):
        g.aggregate(torch.zeros(9, 2))
    with pytest.raises(ValueError, match="the input has 5 rows, the micro-batch 9"):
        g.layer(1).layer_input(torch.zeros(5, 2))
