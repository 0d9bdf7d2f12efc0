"""Kernel benchmark: the compared layers compute the same function, records are complete, memory sampler works."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch

from hpc_graph.bench.kernels import (RECORD_FIELDS, KernelBenchConfig, make_gat_pair, make_sage_pair,
                                     run_kernel_bench, summarize)
from hpc_graph.bench.memory import PeakRSS
from hpc_graph.ops import CSR


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Keep the objects that exist before a test out of the collector's reach while it runs.

    ``PeakRSS`` starts every measurement with ``gc.collect()``; in a pytest process holding torch,
    torch_geometric and every earlier test's objects each collection walks the whole heap (about a
    second on a loaded 2-core box, 20 measurements in a small run). Frozen objects are not garbage the
    benchmark made, so what it collects and measures is unchanged; the freeze ends with the test.
    """
    gc.freeze()
    yield
    gc.unfreeze()


def _graph(awkward_graph, loops=False):
    indptr, indices = awkward_graph(3, num_dst=30, num_edges=150)
    dst = np.repeat(np.arange(30), np.diff(indptr))
    src = indices
    if loops:  # GAT comparison: exactly one self-loop per node, as the benchmark builds it
        keep = src != dst
        src = np.concatenate([src[keep], np.arange(30)])
        dst = np.concatenate([dst[keep], np.arange(30)])
    g = CSR.from_edges(src, dst, 30)
    return g, torch.stack([torch.from_numpy(src), torch.from_numpy(dst)])


def _compare(ours, theirs_fn, x):
    xo = x.clone().requires_grad_()
    xt = x.clone().requires_grad_()
    out_o, out_t = ours(xo), theirs_fn(xt)
    torch.testing.assert_close(out_o, out_t, rtol=1e-4, atol=1e-5)
    gout = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(9))
    out_o.backward(gout)
    out_t.backward(gout)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-4, atol=1e-5)


def test_sage_layer_matches_pyg_sageconv(awkward_graph):
    g, ei = _graph(awkward_graph)
    ours, theirs_fn, theirs = make_sage_pair(g, ei, 12, 7, seed=1)
    _compare(ours, theirs_fn, torch.randn(30, 12, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(ours.lin_l.weight.grad, theirs.lin_l.weight.grad, rtol=1e-4, atol=1e-5)


def test_gat_layer_matches_pyg_gatconv(awkward_graph):
    g, ei = _graph(awkward_graph, loops=True)
    ours, theirs_fn, theirs = make_gat_pair(g, ei, 12, heads=2, dim=5, seed=2)
    _compare(ours, theirs_fn, torch.randn(30, 12, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(ours.att_src.grad, theirs.att_src.grad, rtol=1e-4, atol=1e-5)


def test_peak_rss_sees_a_large_allocation():
    with PeakRSS() as mem:
        a = np.ones(40 << 20, dtype=np.uint8)  # 40 MiB, touched
        time.sleep(0.5)  # long enough for the sampler thread to run even on a loaded machine
        del a
    assert mem.extra_mb > 30
    assert mem.samples >= 1


def test_small_run_gives_complete_records():
    cfg = KernelBenchConfig(scale=6, feat=8, heads=2, repeat=1, ops=("spmm", "sddmm", "sage", "gat", "locality"))
    recs = run_kernel_bench(cfg)
    impls = {(r["op"], r["impl"], r["requires_grad"]) for r in recs}
    for grad in (False, True):
        for op, impl in (("spmm", "hpc_graph"), ("spmm", "torch.sparse.mm"), ("spmm", "gather_index_add"),
                         ("sddmm", "hpc_graph"), ("sddmm", "gather_mul_sum"),
                         ("sage", "hpc_graph"), ("sage", "pyg.SAGEConv"), ("gat", "hpc_graph"),
                         ("gat", "pyg.GATConv")):
            assert (op, impl, grad) in impls
    assert ("locality", "hpc_graph/rcm", False) in impls
    for r in recs:
        assert set(RECORD_FIELDS) <= set(r)
        assert r["scale"] == 6 and r["feat"] == 8 and r["num_nodes"] == 64
        assert r["seconds"] > 0 and r["peak_mb"] >= 0
    rcm = next(r for r in recs if r["impl"] == "hpc_graph/rcm")
    rnd = next(r for r in recs if r["impl"] == "hpc_graph/random")
    assert rcm["speedup_vs_random"] == pytest.approx(rnd["seconds"] / rcm["seconds"])
    lines = summarize(recs)
    assert any("vs pyg.SAGEConv" in line for line in lines)


def test_baselines_over_the_memory_budget_are_skipped_not_run():
    cfg = KernelBenchConfig(scale=6, feat=8, heads=2, repeat=1, ops=("spmm",), grad=(False,),
                            memory_fraction=1e-12)
    recs = run_kernel_bench(cfg)
    gather = next(r for r in recs if r["impl"] == "gather_index_add")
    assert gather["seconds"] is None and "GiB" in gather["skipped"]
    assert next(r for r in recs if r["impl"] == "hpc_graph")["seconds"] > 0
    assert any("skipped" in line for line in summarize(recs))


@pytest.mark.parametrize("field,kwargs", [("--scale", dict(scale=0)), ("--heads", dict(heads=3)),
                                          ("--ops", dict(ops=("spmm", "nope"))), ("--repeat", dict(repeat=0))])
def test_config_errors_name_the_option(field, kwargs):
    with pytest.raises(ValueError, match=field):
        KernelBenchConfig(**kwargs).validate()
