"""``GraphContext.message_passing`` (hpc_graph.ops.message) on a whole graph against a plain torch reference that
materialises every edge: random directed graphs with repeated edges and isolated nodes, float64, forward and the
gradients of every input and parameter, in one chunk and in many; the sampled block's semantics; bad inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import hpc_graph.ops.message as message_op
from hpc_graph.graph.block import Block
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.ops.csr import CSR

TOL = 1e-12


def _graph(seed: int, n: int = 40, e: int = 260, relations: int = 3, weights: bool = True):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n - 4, e)  # the last 4 nodes have no in- or out-edges
    dst = rng.integers(0, n - 4, e)
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    w = rng.uniform(0.1, 2.0, e).astype(np.float32) if weights else None
    t = rng.integers(0, relations, e).astype(np.int16)
    g = WholeGraph(CSR(indptr, src.astype(np.int32), n, edge_weight=w), edge_type=t)
    return g, torch.from_numpy(src), torch.from_numpy(dst), (None if w is None else torch.from_numpy(w).double()), \
        torch.from_numpy(t.astype(np.int64))


def _close(got, want, tol=TOL):
    got, want = got.detach(), want.detach()
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


@pytest.fixture(params=[7, 1 << 17, None], ids=["chunks-of-7-edges", "one-chunk", "chunks-by-bytes"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(message_op, "CHUNK_EDGES", request.param)
    return request.param


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("self_loops", [False, True])
def test_softmax_attention_from_both_ends_equals_a_dense_reference(seed, self_loops, chunk):
    g, s, d, _, _ = _graph(seed)
    n, heads, dim = g.num_nodes, 3, 4
    gen = torch.Generator().manual_seed(seed)
    xl, xr = (torch.randn(n, heads, dim, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    att = torch.randn(heads, dim, generator=gen, dtype=torch.float64, requires_grad=True)

    def message(edges):
        return (F.leaky_relu(edges.src["l"] + edges.dst["r"], 0.2) * att).sum(-1), edges.src["l"]

    out = g.message_passing(message, {"l": xl}, {"r": xr}, reduce="softmax", self_loops=self_loops, params=[att])
    ss, dd = (torch.cat([s, torch.arange(n)]), torch.cat([d, torch.arange(n)])) if self_loops else (s, d)
    score = (F.leaky_relu(xl[ss] + xr[dd], 0.2) * att).sum(-1)
    want = torch.zeros(n, heads, dim, dtype=torch.float64)
    for i in range(n):
        sel = dd == i
        if sel.any():
            want[i] = (torch.softmax(score[sel], 0).unsqueeze(-1) * xl[ss[sel]]).sum(0)
    _close(out, want)
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, [xl, xr, att], go), torch.autograd.grad(want, [xl, xr, att], go)):
        _close(a, b)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("self_loops", [False, True])
def test_relational_edge_weighted_messages_equal_a_dense_reference(reduce, self_loops, chunk):
    g, s, d, w, t = _graph(3)
    n, width, relations = g.num_nodes, 5, 3
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, width, generator=gen, dtype=torch.float64, requires_grad=True)
    lin = torch.nn.Linear(width, relations * width, dtype=torch.float64)

    class Rel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def message(self, edges):  # a bound method: the module's parameters get their gradients
            h = self.lin(edges.src["x"]).view(-1, relations, width)
            if edges.loop:
                return h[:, 0] * edges.weight.unsqueeze(1)
            return h.gather(1, edges.type.view(-1, 1, 1).expand(-1, 1, width)).squeeze(1) * edges.weight.unsqueeze(1)

    out = g.message_passing(Rel().message, x, reduce=reduce, self_loops=self_loops)
    msg = lin(x[s]).view(-1, relations, width)[torch.arange(len(s)), t] * w.unsqueeze(1)
    want = torch.zeros(n, width, dtype=torch.float64).index_add(0, d, msg)
    deg = torch.bincount(d, minlength=n).double()
    if self_loops:
        want = want + lin(x).view(-1, relations, width)[:, 0]
        deg = deg + 1
    if reduce == "mean":
        want = want / deg.clamp(min=1).unsqueeze(1)
    _close(out, want)
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ins = [x, lin.weight, lin.bias]
    for a, b in zip(torch.autograd.grad(out, ins, go), torch.autograd.grad(want, ins, go)):
        _close(a, b)


def test_dst_defaults_to_the_source_tensors_output_rows_and_float32_runs(chunk):
    g, s, d, _, _ = _graph(4, weights=False)
    x = torch.randn(g.num_nodes, 3, requires_grad=True)
    out = g.message_passing(lambda e: e.src["x"] * e.dst["x"], x, reduce="sum")
    want = torch.zeros(g.num_nodes, 3).index_add(0, d, x[s] * x[d])
    assert out.dtype == torch.float32
    _close(out, want, 1e-5)
    _close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0], 1e-5)


def test_a_sampled_block_scales_its_sum_and_averages_its_sampled_edges():
    # 3 destinations (the first 3 of 5 sources); full in-degrees 4, 2, 1, sampled 2, 1, 0
    csr = CSR(torch.tensor([0, 2, 3, 3]), torch.tensor([3, 4, 0]), 5)
    block = Block(csr, torch.arange(5), torch.arange(5), torch.tensor([4, 2, 1, 1, 1]), comm=None)
    x = torch.randn(5, 2, dtype=torch.float64)
    total = block.message_passing(lambda e: e.src["x"], x, reduce="sum")
    mean = block.message_passing(lambda e: e.src["x"], x, reduce="mean", self_loops=True)
    _close(total, torch.stack([(x[3] + x[4]) * 2, x[0] * 2, torch.zeros(2, dtype=torch.float64)]))
    _close(mean, torch.stack([(x[3] + x[4] + x[0]) / 3, (x[0] + x[1]) / 2, x[2]]))
    with pytest.raises(ValueError, match="edge_fields = \\('weight',\\)"):
        block.missing = {"weight": "message function: the sampled blocks carry no edge weights; declare "
                                   "edge_fields = ('weight',) on the model"}
        block.message_passing(lambda e: e.src["x"] * e.weight.unsqueeze(1), x)


@pytest.mark.parametrize("call,match", [
    (lambda g, x: g.message_passing(lambda e: e.src["x"], x, reduce="max"), "reduce must be one of"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"], x[:5]), r"src\['x'\] has 5 rows, expected 40"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"], {"a": x, "b": x.long()}), r"src\['b'\] must be a float"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"], x, dst={"r": x[:3]}), r"dst\['r'\] has 3 rows"),
    (lambda g, x: g.message_passing(lambda e: (e.src["x"], e.src["x"]), x), "needs reduce='softmax'"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"], x, reduce="softmax"), "must return \\(score"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"] * e.weight.unsqueeze(1), x), "no edge weights"),
    (lambda g, x: g.message_passing(lambda e: e.src["x"] * e.type.unsqueeze(1), x, self_loops=True),
     "self loops have no edge type"),
    (lambda g, x: g.message_passing(3, x), "message must be callable"),
])
def test_bad_calls_are_refused_in_one_line(call, match):
    g, *_ = _graph(5, weights=False)
    x = torch.randn(g.num_nodes, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=match):
        call(g, x)


def test_an_engine_without_edges_names_the_primitive_and_the_engines_that_have_it():
    from hpc_graph.graph.block import BlockStack

    csr = CSR(torch.tensor([0, 1]), torch.tensor([0]), 1)
    stack = BlockStack([Block(csr, torch.arange(1), torch.arange(1), torch.tensor([1]), comm=None)])
    with pytest.raises(RuntimeError, match="BlockStack.message_passing: a sampled mini-batch has one graph per layer"):
        stack.message_passing(lambda e: e.src["x"], torch.zeros(1, 2))
