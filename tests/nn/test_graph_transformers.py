"""GT and Graphormer: the same model on the single engine's attention and on a dense SDPA reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hpc_graph.graph.whole_graph import WholeGraph as _SingleGraph
from hpc_graph.graph.attention_pattern import FAR, build_pattern
from hpc_graph.graph.base import GraphContext
from hpc_graph.nn import build_model
from hpc_graph.nn._transformer import AttentionSchedule
from hpc_graph.ops import CSR


def _graph(n=23, m=30, seed=0):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, m), rng.integers(0, n, m)
    src, dst = np.concatenate([s, d]), np.concatenate([d, s])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(np.int64), n


class _DenseRef(GraphContext):
    """Reference context: attention as torch SDPA with a float mask built from the same pattern."""

    def __init__(self, indptr, indices, n, fields):
        self.num_nodes = self.global_num_nodes = n
        self.indptr, self.indices, self.fields = indptr, indices, fields
        self.modes = []

    def attention(self, q, k, v, *, bias=None, mode="sparse", global_token=False, far_prior=True):
        self.modes.append(mode)
        pat = build_pattern(self.indptr, self.indices, self.num_nodes, global_token=global_token)
        T, H = q.shape[0], q.shape[1]
        mask = torch.full((H, T, T), float("-inf"), dtype=q.dtype)
        if mode == "dense":
            far = torch.zeros(H, dtype=q.dtype) if bias is None else bias[FAR]
            if far_prior:  # the far pairs' count prior: -ln((n - e) / e), e = pattern entries per token
                e = pat.csr.num_edges / T
                far = far - math.log((self.num_nodes - e) / e)
            mask[:, :self.num_nodes, :self.num_nodes] = far.view(-1, 1, 1)
        rows = torch.repeat_interleave(torch.arange(T), pat.csr.in_degree())
        mask[:, rows, pat.csr.indices] = 0.0 if bias is None else bias[pat.codes.long()].t()
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        return out.transpose(0, 1)

    def aggregate(self, x, reduce="sum"):
        raise AssertionError("not used by transformers")

    def gat(self, *a, **kw):
        raise AssertionError("not used by transformers")

    def in_degree(self):
        return torch.from_numpy(np.diff(self.indptr))

    def out_degree(self):
        return torch.bincount(torch.from_numpy(self.indices), minlength=self.num_nodes)

    def node_field(self, name):
        return self.fields[name]

    def global_ids(self):
        return torch.arange(self.num_nodes)

    def all_reduce_sum(self, t):
        return t


def _pair(seed=0):
    indptr, indices, n = _graph(seed=seed)
    pe = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    single = _SingleGraph(CSR(indptr, indices, n))
    single.node_fields["lap_pe"] = pe
    return single, _DenseRef(indptr, indices, n, {"lap_pe": pe}), n


@pytest.mark.parametrize("name, extra", [("gt", dict(pe_dim=4, global_token=True)), ("gt", dict(pe_dim=0)),
                                         ("graphormer", dict(max_degree=3))])
@pytest.mark.parametrize("attention, far_prior", [("sparse", True), ("dense", True), ("dense", False),
                                                  ("dense_layers", True)])
def test_model_on_single_engine_equals_dense_reference(name, extra, attention, far_prior):
    single, ref, n = _pair(1)
    torch.manual_seed(3)
    sched = dict(attention=attention, dense_layers=(1,) if attention == "dense_layers" else (), far_prior=far_prior)
    model = build_model(name, 6, 8, 3, num_layers=2, heads=2, dropout=0.0, **sched, **extra).double()
    with torch.no_grad():  # non-zero structural bias and token, so that both matter
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(n, 6, dtype=torch.float64)
    model.eval()  # no sign flips: both runs see the same encodings
    outs, grads = [], []
    for g in (single, ref):
        model.zero_grad()
        out = model(g, x)
        out.pow(2).sum().backward()
        outs.append(out.detach())
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outs[0], outs[1])
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], msg=k)
    if name == "graphormer":
        assert grads[0]["bias"].abs().sum() > 0  # the structural bias is trained
    want = {"sparse": ["sparse"] * 2, "dense": ["dense"] * 2, "dense_layers": ["sparse", "dense"]}[attention]
    assert ref.modes == want


def test_every_k_steps_switches_on_the_global_step():
    _, ref, n = _pair(2)
    model = build_model("graphormer", 6, 8, 3, num_layers=2, heads=2, attention="every_k_steps", dense_every=3)
    x = torch.randn(n, 6)
    model.train()
    for _ in range(6):
        model(ref, x)
    assert ref.modes == ["dense", "dense", "sparse", "sparse", "sparse", "sparse"] * 2
    assert int(model.step) == 6
    ref.modes.clear()
    model.eval()
    model(ref, x)
    assert ref.modes == ["sparse", "sparse"]  # evaluation: the sparse steps' mode
    assert int(model.step) == 6


def test_gt_flips_pe_signs_only_in_training():
    single, _, n = _pair(3)
    model = build_model("gt", 6, 8, 3, num_layers=1, heads=2, dropout=0.0, pe_dim=4).double()
    x = torch.randn(n, 6, dtype=torch.float64)
    model.eval()
    a, b = model(single, x), model(single, x)
    torch.testing.assert_close(a, b)
    model.train()
    torch.manual_seed(0)
    outs = {tuple(model(single, x).detach().flatten()[:5].tolist()) for _ in range(6)}
    assert len(outs) > 1  # different sign patterns give different outputs


def test_bad_options_and_missing_fields():
    single, _, n = _pair(4)
    with pytest.raises(ValueError, match="model.dense_layers"):
        build_model("gt", 6, 8, 3, num_layers=2, heads=2, attention="dense_layers", dense_layers=(2,))
    with pytest.raises(ValueError, match="model.heads"):
        build_model("gt", 6, 8, 3, heads=3)
    with pytest.raises(ValueError, match="model.attention"):
        build_model("graphormer", 6, 8, 3, heads=2, attention="sometimes")
    with pytest.raises(ValueError, match="model.pe_dim"):
        build_model("gcn", 6, 8, 3, pe_dim=4)
    with pytest.raises(ValueError, match="model.far_prior: only used by model 'gt' or 'graphormer'"):
        build_model("gat", 6, 8, 3, far_prior=False)
    with pytest.raises(ValueError, match="model.far_prior: must be true or false"):
        build_model("gt", 6, 8, 3, heads=2, far_prior="yes")
    with pytest.raises(ValueError, match="model.pe_dim"):
        build_model("gt", 6, 8, 3, heads=2, pe_dim=9)(single, torch.randn(n, 6))
    bare = _SingleGraph(single.csr)
    with pytest.raises(ValueError, match="preprocess lap-pe"):
        build_model("gt", 6, 8, 3, heads=2)(bare, torch.randn(n, 6))
    with pytest.raises(ValueError, match="rows"):
        single.attention(*(torch.randn(n, 2, 4) for _ in range(3)), global_token=True)
    assert AttentionSchedule("dense").mode(0, 0, False) == "dense"
