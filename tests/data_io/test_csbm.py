"""Contextual SBM generator: structure, homophily, degree tail, features, determinism, and a GCN-vs-MLP check."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from data_io.dataset import MASKS, open_dataset, validate_dataset
from data_io.generators import GeneratorParamError, generate_csbm, write_csbm
from data_io.generators import _common


def _edges(g):
    src, dst = g.edge_sources_destinations()
    return src, dst


def test_graph_is_valid_undirected_simple_with_exact_edge_count():
    n, d = 1200, 7.5
    g = generate_csbm(n, 4, avg_degree=d, feat_dim=16, seed=1)
    g.validate()
    assert g.num_nodes == n and not g.directed and g.num_classes == 4
    src, dst = _edges(g)
    assert not np.any(src == dst)
    key = dst * n + src
    assert len(np.unique(key)) == len(key)
    np.testing.assert_array_equal(np.sort(key), np.sort(src * n + dst))
    assert g.num_edges == 2 * round(n * d / 2)
    counts = np.bincount(g.label, minlength=4)
    assert counts.max() - counts.min() <= 1
    sizes = [int(getattr(g, m).sum()) for m in MASKS]
    assert sizes == [round(0.6 * n), round(0.2 * n), round(0.2 * n)]
    assert int((g.train_mask.astype(int) + g.val_mask + g.test_mask).max()) == 1


@pytest.mark.parametrize("homophily", [0.0, 0.3, 0.75, 1.0])
def test_homophily_matches_request(homophily):
    g = generate_csbm(1500, 6, avg_degree=8, homophily=homophily, feat_dim=0, seed=2)
    src, dst = _edges(g)
    measured = np.mean(g.label[src] == g.label[dst])
    assert abs(measured - homophily) < 0.01


def test_power_law_gives_heavier_degree_tail():
    kw = dict(num_nodes=4000, num_classes=4, avg_degree=10, feat_dim=0, seed=3)
    flat = np.diff(generate_csbm(**kw).indptr)
    heavy = np.diff(generate_csbm(power_law=2.3, **kw).indptr)
    assert abs(flat.mean() - heavy.mean()) < 1e-9  # same edge count
    assert heavy.max() > 4 * flat.max()
    assert np.percentile(heavy, 99.9) > 2 * np.percentile(flat, 99.9)
    assert heavy.std() > 3 * flat.std()
    # a steeper exponent gives a lighter tail than a shallow one
    assert np.diff(generate_csbm(power_law=4.0, **kw).indptr).max() < heavy.max()


def test_features_are_class_means_plus_unit_noise():
    n, c, f, snr = 3000, 3, 64, 2.0
    g = generate_csbm(n, c, feat_dim=f, snr=snr, avg_degree=2, seed=4)
    assert g.feat.dtype == np.float32 and g.feat.shape == (n, f)
    means = np.stack([g.feat[g.label == k].mean(0) for k in range(c)])
    size = n / c
    # |sample mean|^2 = |mu|^2 + F/size on average (noise of the mean); tolerance ~ 5 sd
    assert np.allclose((means ** 2).sum(1) - f / size, snr ** 2, atol=0.5)
    resid = g.feat - means[g.label]
    assert abs(resid.var() - 1.0) < 0.03
    assert np.all(np.abs(np.corrcoef(resid[:, :4].T) - np.eye(4)) < 0.1)
    no_signal = generate_csbm(n, c, feat_dim=f, snr=0.0, avg_degree=2, seed=4)
    assert np.abs(np.stack([no_signal.feat[no_signal.label == k].mean(0) for k in range(c)])).max() < 0.2


def test_same_seed_same_graph_different_seed_different_graph():
    kw = dict(num_nodes=500, num_classes=3, feat_dim=8, power_law=2.5)
    g1, g2, g3 = generate_csbm(seed=5, **kw), generate_csbm(seed=5, **kw), generate_csbm(seed=6, **kw)
    for f in ("indptr", "indices", "feat", "label", *MASKS):
        np.testing.assert_array_equal(getattr(g1, f), getattr(g2, f))
    for f in ("indices", "feat", "label", "train_mask"):
        assert not np.array_equal(getattr(g1, f), getattr(g3, f)), f


def test_write_csbm_streams_same_arrays_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "_FEAT_BLOCK_BYTES", 512)
    path = tmp_path / "c.h5"
    info = write_csbm(path, 700, 4, feat_dim=5, seed=7)
    g = generate_csbm(700, 4, feat_dim=5, seed=7)
    assert validate_dataset(path) == []
    assert info["num_edges"] == g.num_edges
    with open_dataset(path) as ds:
        assert ds.num_classes == 4 and not ds.directed
        d = ds.load()
    for f in ("indptr", "indices", "feat", "label", *MASKS):
        np.testing.assert_array_equal(getattr(d, f), getattr(g, f))


@pytest.mark.parametrize("kwargs, param", [
    (dict(num_nodes=0), "num_nodes"), (dict(num_classes=0), "num_classes"),
    (dict(num_nodes=10, num_classes=11), "num_classes"), (dict(avg_degree=-1.0), "avg_degree"),
    (dict(avg_degree=100.0), "avg_degree"), (dict(homophily=1.2), "homophily"), (dict(homophily=-0.1), "homophily"),
    (dict(snr=-1.0), "snr"), (dict(power_law=2.0), "power_law"), (dict(feat_dim=-1), "feat_dim"),
    (dict(train_frac=0.5, val_frac=0.5, test_frac=0.1), "train_frac"), (dict(test_frac=1.5), "test_frac"),
    (dict(num_classes=1, homophily=0.5), "homophily"), (dict(avg_degree=float("nan")), "avg_degree"),
    # 30 nodes in 3 classes have 135 same-class pairs; 28 * 30 / 2 * 0.9 = 378 needed
    (dict(num_nodes=30, num_classes=3, avg_degree=28, homophily=0.9), "avg_degree"),
])
def test_bad_arguments_name_the_parameter_and_write_nothing(tmp_path, kwargs, param):
    args = dict(num_nodes=60, num_classes=3, avg_degree=4.0)
    args.update(kwargs)
    with pytest.raises(GeneratorParamError) as err:
        generate_csbm(**args)
    assert err.value.param == param
    with pytest.raises(GeneratorParamError):
        write_csbm(tmp_path / "x.h5", **args)
    assert list(tmp_path.iterdir()) == []


# -- the graph must carry signal at the default settings ------------------------------------------

def _train_eval(g, use_graph: bool, seed: int, epochs: int = 100) -> float:
    """Test accuracy of a 2-layer GCN (Kipf & Welling normalisation) or of the same MLP without A."""
    n = g.num_nodes
    src, dst = _edges(g)
    loop = np.arange(n)
    rows, cols = np.concatenate([dst, loop]), np.concatenate([src, loop])
    deg = np.bincount(rows, minlength=n).astype(np.float64)
    vals = torch.tensor(1.0 / np.sqrt(deg[rows] * deg[cols]), dtype=torch.float32)
    # D^-1/2 (A + I) D^-1/2 as a torch.sparse COO matrix
    adj = torch.sparse_coo_tensor(torch.from_numpy(np.stack([rows, cols])), vals, (n, n),
                                  check_invariants=False).coalesce()
    x, y = torch.from_numpy(g.feat), torch.from_numpy(g.label)
    train, test = torch.from_numpy(g.train_mask), torch.from_numpy(g.test_mask)
    torch.manual_seed(seed)
    lin1, lin2 = torch.nn.Linear(g.feat_dim, 16), torch.nn.Linear(16, g.num_classes)
    params = list(lin1.parameters()) + list(lin2.parameters())
    moments = [(torch.zeros_like(q), torch.zeros_like(q)) for q in params]

    def adam_step(t: int, lr: float = 0.01, wd: float = 5e-4, b1: float = 0.9, b2: float = 0.999) -> None:
        # plain Adam with L2 weight decay (torch.optim's first step imports torch._dynamo: seconds)
        with torch.no_grad():
            for q, (m, v) in zip(params, moments):
                grad = q.grad + wd * q
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                q -= lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + 1e-8)
                q.grad = None

    def prop(h):
        return torch.sparse.mm(adj, h) if use_graph else h

    def forward(training: bool):
        h = torch.relu(prop(lin1(x)))
        return prop(lin2(torch.nn.functional.dropout(h, 0.5, training)))

    for t in range(1, epochs + 1):
        torch.nn.functional.cross_entropy(forward(True)[train], y[train]).backward()
        adam_step(t)
    with torch.no_grad():
        return float((forward(False).argmax(1)[test] == y[test]).float().mean())


def test_gcn_beats_feature_only_mlp_at_default_settings():
    # only the size is changed (small graph, fast test); every other argument keeps its default
    defaults = {k: p.default for k, p in inspect.signature(generate_csbm).parameters.items()}
    assert defaults["num_nodes"] >= 1000
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = generate_csbm(1000, seed=0)
        gcn, mlp = _train_eval(g, True, seed=0), _train_eval(g, False, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert gcn >= mlp + 0.10, f"GCN {gcn:.3f} vs MLP {mlp:.3f}"
    assert mlp > 1.5 / g.num_classes  # features are weak but not useless: the MLP does learn
