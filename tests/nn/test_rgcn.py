"""R-GCN (``rgcn``) and relation-wise aggregation against a plain-torch per-relation reference."""
import numpy as np
import pytest
import torch

from data_io.dataset import GraphData, write_dataset
from hpc_graph.engines import create_engine
from hpc_graph.nn import build_model
from hpc_graph.nn.rgcn import RGCN, RGCNConv
from hpc_graph.ops.csr import relational_csr


def _typed_graph(n=30, e=160, r=4, seed=0):
    """Random typed multigraph (duplicates and self loops allowed; the last 3 nodes have no in-edges)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n - 3, e)
    typ = rng.integers(0, r, e)
    typ[0] = r - 1  # every type present at least once
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order], dst[order], typ[order]


def _relation_means(x, src, dst, typ, n, r):
    """[n, r, F]: per-relation mean over in-edges, with dense per-relation adjacency matrices."""
    out = []
    for t in range(r):
        a = torch.zeros(n, n, dtype=x.dtype)
        sel = typ == t
        a.index_put_((torch.as_tensor(dst[sel]), torch.as_tensor(src[sel])),
                     torch.ones(int(sel.sum()), dtype=x.dtype), accumulate=True)
        out.append((a @ x) / a.sum(1).clamp_min(1)[:, None])
    return torch.stack(out, 1)


@pytest.fixture
def engine(tmp_path):
    n, r = 30, 4
    indptr, src, dst, typ = _typed_graph(n=n, r=r)
    rng = np.random.default_rng(1)
    g = GraphData(indptr=indptr, indices=src.astype(np.int64), edge_type=typ.astype(np.int16),
                  feat=rng.standard_normal((n, 11)).astype(np.float32), label=rng.integers(0, 3, n),
                  num_classes=3, train_mask=np.ones(n, bool))
    write_dataset(tmp_path / "typed.h5", g)
    eng = create_engine("single", str(tmp_path / "typed.h5"), None, torch.device("cpu"), torch.float64, {})
    return eng, (src, dst, typ, n, r)


def test_relational_csr_rows_are_node_type_pairs():
    indptr, src, dst, typ = _typed_graph(n=25, e=120, r=3, seed=4)
    rel = relational_csr(indptr, src, typ, 3)
    assert rel.num_dst == 25 * 3 and rel.num_src == 25 and rel.num_edges == len(src)
    for row in range(rel.num_dst):
        node, t = divmod(row, 3)
        got = rel.indices[rel.indptr[row]:rel.indptr[row + 1]].numpy()
        want = src[(dst == node) & (typ == t)]  # edges keep their order within a row
        np.testing.assert_array_equal(got, want)


def test_relational_csr_rejects_bad_types():
    indptr, src, _, typ = _typed_graph()
    with pytest.raises(ValueError, match="edge_type"):
        relational_csr(indptr, src, typ, 2)  # types up to 3
    with pytest.raises(ValueError, match="edge_type"):
        relational_csr(indptr, src, typ[:-1], 4)
    with pytest.raises(ValueError, match="num_relations"):
        relational_csr(indptr, src, typ, 0)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_single_aggregate_relations(engine, reduce):
    eng, (src, dst, typ, n, r) = engine
    assert eng.graph.num_relations == r
    x = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
    out = eng.graph.aggregate_relations(x, reduce)
    ref = _relation_means(x, src, dst, typ, n, r)
    if reduce == "sum":
        counts = torch.stack([torch.as_tensor(np.bincount(dst[typ == t], minlength=n)) for t in range(r)], 1)
        ref = ref * counts.clamp_min(1)[:, :, None]
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, g)
    (gr,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(gx, gr)


def _reference_conv(conv: RGCNConv, x, src, dst, typ, n):
    """The layer from its definition: root term + bias + sum over relations of mean_r(x) @ W_r."""
    means = _relation_means(x, src, dst, typ, n, conv.num_relations)
    if conv.comp is None:
        weights = [conv.weight[t] for t in range(conv.num_relations)]
    else:
        weights = [sum(conv.comp[t, b] * conv.weight[b] for b in range(conv.num_bases))
                   for t in range(conv.num_relations)]
    out = x @ conv.root + conv.bias
    for t, w in enumerate(weights):
        out = out + means[:, t] @ w
    return out


@pytest.mark.parametrize("bases,out_ch", [(None, 5), (2, 5), (1, 3), (3, 8)])
def test_conv_matches_per_relation_reference(engine, bases, out_ch):
    # (1, 3) and (2, 5) on 11 input features take the project-first path (B * F_out < F_in)
    eng, (src, dst, typ, n, r) = engine
    torch.manual_seed(0)
    conv = RGCNConv(11, out_ch, r, num_bases=bases).double()
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(n, 11, dtype=torch.float64, requires_grad=True)
    out = conv(eng.graph, x)
    ref = _reference_conv(conv, x, src, dst, typ, n)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    params = [x] + list(conv.parameters())
    for a, b in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, b)


def test_model_matches_reference_and_trains(engine):
    eng, (src, dst, typ, n, r) = engine
    torch.manual_seed(1)
    model = build_model("rgcn", 11, 7, 3, num_layers=2, dropout=0.0, num_bases=2, num_relations=r).double()
    assert isinstance(model, RGCN) and model.message_passing_layers == 2
    x = eng.feat
    h = torch.relu(_reference_conv(model.convs[0], x, src, dst, typ, n))
    ref = _reference_conv(model.convs[1], h, src, dst, typ, n)
    torch.testing.assert_close(model(eng.graph, x), ref)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(eng.graph, x), eng.label)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_bad_options_and_mismatches(engine):
    eng, (_, _, _, n, r) = engine
    with pytest.raises(ValueError, match="model.num_bases"):
        build_model("rgcn", 11, 7, 3, num_bases=0, num_relations=r)
    with pytest.raises(ValueError, match="model.num_bases"):
        build_model("gcn", 11, 7, 3, num_bases=2)
    with pytest.raises(ValueError, match="model.num_relations"):
        build_model("rgcn", 11, 7, 3, num_relations=0)
    model = build_model("rgcn", 11, 7, 3, num_relations=r + 1).double()
    with pytest.raises(ValueError, match="edge types"):
        model(eng.graph, eng.feat)


def test_refuses_sampled_blocks(engine):
    eng, (_, _, _, n, r) = engine

    class Blocks(type(eng.graph)):
        def layer(self, index):
            return object.__new__(type(eng.graph))

    g = object.__new__(Blocks)
    g.__dict__.update(eng.graph.__dict__)
    model = build_model("rgcn", 11, 7, 3, num_relations=r).double()
    with pytest.raises(ValueError, match="full-graph engine"):
        model(g, eng.feat)


def test_trainer_runs_rgcn_and_config_refuses_minibatch(tmp_path):
    from hpc_graph.train.config import ConfigError, config_from_dict
    from hpc_graph.train.trainer import Trainer

    n = 60
    indptr, src, dst, typ = _typed_graph(n=n, e=400, r=3, seed=5)
    rng = np.random.default_rng(2)
    g = GraphData(indptr=indptr, indices=src.astype(np.int64), edge_type=typ.astype(np.int16),
                  feat=rng.standard_normal((n, 4)).astype(np.float32), label=rng.integers(0, 3, n),
                  num_classes=3, train_mask=rng.random(n) < 0.5, val_mask=rng.random(n) < 0.3)
    write_dataset(tmp_path / "t.h5", g)
    base = {"data": {"path": str(tmp_path / "t.h5")}, "model": {"name": "rgcn", "hidden": 8, "num_bases": 2},
            "train": {"epochs": 3, "progress": False, "run_dir": str(tmp_path / "run")}}
    trainer = Trainer(config_from_dict(base))
    assert trainer.model.convs[0].num_relations == 3  # from the data, not the config
    summary = trainer.fit()
    assert summary["epochs"] == 3
    with pytest.raises(ConfigError, match="model.name.*full-graph"):
        config_from_dict({**base, "engine": {"name": "minibatch"}, "sampler": {"fanouts": [5, 5]}})
    with pytest.raises(ConfigError, match="model.num_bases"):
        config_from_dict({**base, "model": {"name": "gcn", "num_bases": 2}})
