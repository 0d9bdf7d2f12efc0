"""The `single` engine: data loading, and every GraphContext method against plain-torch references."""
import types

import numpy as np
import pytest
import torch

from data_io.dataset import GraphData, write_dataset
from data_io.errors import FormatError
from hpc_graph.engines import create_engine
from hpc_graph.engines.single import SingleEngine


def _random_graph(n=40, e=150, f=5, c=3, seed=0, masks=True, unlabelled=(), feat=True):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n - 3, e)  # the last 3 nodes have no in-edges; duplicates and self loops allowed
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    label = rng.integers(0, c, n).astype(np.int64)
    label[list(unlabelled)] = -1
    split = rng.integers(0, 3, n)
    g = GraphData(indptr=indptr, indices=src[order].astype(np.int32),
                  feat=rng.standard_normal((n, f)).astype(np.float32) if feat else None,
                  label=label, num_classes=c, name="rand")
    if masks:
        g.train_mask, g.val_mask, g.test_mask = split == 0, split == 1, None  # test mask absent
    return g, src[order], dst[order]


def _dense(src, dst, n):
    a = torch.zeros(n, n, dtype=torch.float64)
    a.index_put_((torch.as_tensor(dst), torch.as_tensor(src)), torch.ones(len(src), dtype=torch.float64),
                 accumulate=True)
    return a


@pytest.fixture
def dataset(tmp_path):
    g, src, dst = _random_graph(unlabelled=(4, 9))
    path = tmp_path / "g.h5"
    write_dataset(path, g)
    return path, g, src, dst


def test_loads_data(dataset):
    path, g, _, _ = dataset
    eng = create_engine("single", str(path), None, torch.device("cpu"), torch.float64, {"sequence_order": "id"})
    assert isinstance(eng, SingleEngine) and eng.name == "single"
    assert eng.num_classes == 3 and eng.num_features == 5
    assert eng.feat.dtype == torch.float64
    torch.testing.assert_close(eng.feat, torch.from_numpy(g.feat).double())
    assert eng.label.tolist() == g.label.tolist() and eng.label[4] == -1
    assert eng.masks["train"].tolist() == g.train_mask.tolist()
    assert eng.masks["val"].tolist() == g.val_mask.tolist()
    assert not eng.masks["test"].any()  # absent mask -> all False
    assert eng.graph.num_nodes == eng.graph.global_num_nodes == g.num_nodes
    assert eng.graph.global_ids().tolist() == list(range(g.num_nodes))
    assert eng.graph.in_degree().tolist() == np.diff(g.indptr).tolist()
    assert eng.graph.csr.indices.dtype == torch.int32  # node ids fit: 4 bytes per edge
    assert eng.stats() == {"bytes_sent": 0.0, "comm_seconds": 0.0}
    eng.reset_stats()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_aggregate_matches_dense(dataset, reduce):
    path, g, src, dst = dataset
    eng = SingleEngine(str(path), None, torch.device("cpu"), torch.float64)
    a = _dense(src, dst, g.num_nodes)
    x = torch.randn(g.num_nodes, 4, dtype=torch.float64, requires_grad=True)
    out = eng.graph.aggregate(x, reduce)
    mat = a / a.sum(1, keepdim=True).clamp_min(1) if reduce == "mean" else a
    ref = mat @ x.detach()
    torch.testing.assert_close(out, ref)
    r = torch.randn_like(out)
    (out * r).sum().backward()
    torch.testing.assert_close(x.grad, mat.t() @ r)
    with pytest.raises(ValueError, match="reduce"):
        eng.graph.aggregate(x, "max")


@pytest.mark.parametrize("self_loops", [True, False])
def test_gat_matches_materialised_attention(dataset, self_loops):
    path, g, src, dst = dataset
    eng = SingleEngine(str(path), None, torch.device("cpu"), torch.float64)
    n, h, d = g.num_nodes, 2, 3
    a = _dense(src, dst, n) + (torch.eye(n, dtype=torch.float64) if self_loops else 0)
    z = torch.randn(n, h, d, dtype=torch.float64, requires_grad=True)
    ss = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    sd = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    out = eng.graph.gat(z, ss, sd, negative_slope=0.2, add_self_loops=self_loops)
    zr, ssr, sdr = (t.detach().clone().requires_grad_() for t in (z, ss, sd))
    e = torch.nn.functional.leaky_relu(sdr[:, None, :] + ssr[None, :, :], 0.2)
    e = e.masked_fill((a == 0)[:, :, None], float("-inf"))
    w = torch.exp(e - e.amax(1, keepdim=True).nan_to_num(neginf=0.0)) * a[:, :, None]  # multi-edges count twice
    alpha = torch.nan_to_num(w / w.sum(1, keepdim=True), nan=0.0)
    ref = torch.einsum("ijh,jhd->ihd", alpha, zr)
    torch.testing.assert_close(out, ref)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    for got, exp in ((z, zr), (ss, ssr), (sd, sdr)):
        torch.testing.assert_close(got.grad, exp.grad)


def test_gat_attention_dropout_is_seeded(dataset):
    path, g, _, _ = dataset
    eng = SingleEngine(str(path), None, torch.device("cpu"), torch.float64)
    n = g.num_nodes
    z, ss, sd = torch.randn(n, 2, 3, dtype=torch.float64), torch.randn(n, 2, dtype=torch.float64), \
        torch.randn(n, 2, dtype=torch.float64)
    full = eng.graph.gat(z, ss, sd)
    a = eng.graph.gat(z, ss, sd, attn_dropout=0.5, seed=11)
    b = eng.graph.gat(z, ss, sd, attn_dropout=0.5, seed=11)
    c = eng.graph.gat(z, ss, sd, attn_dropout=0.5, seed=12)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, full) and not torch.allclose(a, c)


def test_all_reduce_is_identity_and_differentiable(dataset):
    eng = SingleEngine(str(dataset[0]), None, torch.device("cpu"), torch.float32)
    t = torch.randn(5, requires_grad=True)
    out = eng.graph.all_reduce_sum(t)
    out.sum().backward()
    assert torch.equal(out, t) and torch.equal(t.grad, torch.ones(5))


def test_errors(tmp_path, dataset):
    path = str(dataset[0])
    with pytest.raises(ValueError, match="engine: 'single' runs on one process but this job has 2 ranks"):
        SingleEngine(path, types.SimpleNamespace(rank=0, size=2), torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match=r"engine options: .bogus. not an option of engine .single."):
        SingleEngine(path, None, torch.device("cpu"), torch.float32, {"bogus": 1})
    g, _, _ = _random_graph(feat=False)
    write_dataset(tmp_path / "nofeat.h5", g)
    with pytest.raises(FormatError, match="/node/feat: missing"):
        SingleEngine(str(tmp_path / "nofeat.h5"), None, torch.device("cpu"), torch.float32)
