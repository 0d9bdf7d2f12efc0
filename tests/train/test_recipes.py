"""Accuracy recipes (hpc_graph.train.recipes): Correct & Smooth against a dense reference of the paper's
equations, label augmentation's inputs, mask and loss, poisoned validation/test labels, config errors."""
import contextlib
import math
import warnings

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from data_io.dataset import GraphData, write_dataset
from hpc_graph.graph.base import GraphContext
from hpc_graph.train.config import ConfigError, config_from_dict, load_config
from hpc_graph.train.recipes import (CorrectAndSmooth, LabelAugmentation, append_columns, check_recipes,
                                     node_uniforms, sym_propagate, train_onehot)
from hpc_graph.train.trainer import Trainer

CLASSES = 4


@contextlib.contextmanager
def _quiet():
    """Silence torch's one-time "sparse CSR support is in beta" notice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


# -- references -----------------------------------------------------------------------------------
def _edges(n, e, seed, isolated=3):
    """Distinct random directed edges src -> dst without self loops; the last ``isolated`` nodes have none."""
    rng = np.random.default_rng(seed)
    active = n - isolated
    src, dst = rng.integers(0, active, e), rng.integers(0, active, e)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
    return pairs[:, 1], pairs[:, 0]


def _dense_s(src, dst, n):
    """S = D^-1/2 A D^-1/2 as a dense float64 matrix, A[i, j] = 1 for j -> i, D = in-degree (0 stays 0)."""
    a = torch.zeros(n, n, dtype=torch.float64)
    a[torch.as_tensor(dst), torch.as_tensor(src)] = 1.0
    d = a.sum(1)
    dinv = torch.tensor([1.0 / math.sqrt(v) if v > 0 else 0.0 for v in d.tolist()], dtype=torch.float64)
    return dinv[:, None] * a * dinv[None, :]


def _reference_cs(s, probs, label, train, a1, k1, a2, k2, autoscale, scale):
    """The C&S equations (Huang et al. 2021, as in the module docstring) with dense matrices, loop by loop."""
    n, c = probs.shape
    y = torch.zeros(n, c, dtype=torch.float64)
    for i in range(n):
        if train[i]:
            y[i, int(label[i])] = 1.0
    e0 = torch.zeros(n, c, dtype=torch.float64)
    e0[train] = y[train] - probs[train]
    e = e0.clone()
    for _ in range(k1):
        e = (1 - a1) * e0 + a1 * (s @ e)
        if autoscale:
            e = e.clamp(-1, 1)
        else:
            e[train] = e0[train]
    if autoscale:
        sigma = e0[train].abs().sum() / int(train.sum())
        zc = probs.clone()
        for i in range(n):
            norm = float(e[i].abs().sum())
            f = sigma / norm if norm > 0 else 1.0
            f = 1.0 if (math.isinf(f) or f > 1000) else f
            zc[i] = probs[i] + f * e[i]
    else:
        zc = probs + scale * e
    g0 = zc.clone()
    g0[train] = y[train]
    g = g0.clone()
    for _ in range(k2):
        g = ((1 - a2) * g0 + a2 * (s @ g)).clamp(0, 1)
    return g


class _Graph(GraphContext):
    """A whole graph from an edge list, aggregation by index_add (independent of the engines' kernels)."""

    def __init__(self, src, dst, n):
        self.num_nodes = self.global_num_nodes = n
        self.src, self.dst = torch.as_tensor(src), torch.as_tensor(dst)

    def aggregate(self, x, reduce="sum"):
        assert reduce == "sum"
        return torch.zeros_like(x).index_add_(0, self.dst, x[self.src])

    def gat(self, *args, **kwargs):
        raise NotImplementedError

    def in_degree(self):
        return torch.bincount(self.dst, minlength=self.num_nodes)

    def global_ids(self):
        return torch.arange(self.num_nodes)

    def all_reduce_sum(self, t):
        return t


def _write(path, n=80, e=400, feat_dim=9, seed=0, poison=False, sparse=False):
    """A random directed dataset; ``poison`` replaces every val/test label by a random value (nothing else)."""
    rng = np.random.default_rng(seed)
    src, dst = _edges(n, e, seed)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    feat = rng.standard_normal((n, feat_dim)).astype(np.float32)
    if sparse:
        feat *= rng.random((n, feat_dim)) < 0.08
        feat[np.arange(n), rng.integers(0, feat_dim, n)] = 1.0
    label = rng.integers(0, CLASSES, n).astype(np.int64)
    split = rng.random(n)
    train, val, test = split < 0.5, (split >= 0.5) & (split < 0.75), split >= 0.75
    if poison:
        other = np.random.default_rng(seed + 1000)
        label = label.copy()
        label[val | test] = other.integers(0, CLASSES, int((val | test).sum()))
    write_dataset(path, GraphData(indptr=indptr, indices=src.astype(np.int64), feat=feat, label=label,
                                  train_mask=train, val_mask=val, test_mask=test, name="rand",
                                  num_classes=CLASSES, directed=True))
    return src, dst


def _config(path, run_dir, recipes=None, model=None, train=None, engine="single", data=None):
    extra = {"sampler": {"fanouts": [5, 5]}} if engine in ("minibatch", "apt") else {}
    return config_from_dict({
        **extra,
        "data": {"path": str(path), **(data or {})},
        "engine": {"name": engine},
        "model": {"name": "gcn", "hidden": 8, "dropout": 0.3, **(model or {})},
        "optim": {"lr": 0.05},
        "train": {"epochs": 4, "seed": 5, "progress": False, "run_dir": str(run_dir), "dtype": "float64",
                  **(train or {})},
        "recipes": recipes or {},
    })


# -- Correct & Smooth -----------------------------------------------------------------------------
def test_sym_propagate_equals_dense():
    n = 40
    src, dst = _edges(n, 200, seed=1)
    x = torch.randn(n, 5, dtype=torch.float64)
    got = sym_propagate(_Graph(src, dst, n), x)
    torch.testing.assert_close(got, _dense_s(src, dst, n) @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("autoscale,scale,a1,a2", [(True, 1.0, 0.5, 0.8), (False, 3.0, 0.9, 0.6),
                                                   (True, 1.0, 1.0, 1.0), (False, 0.0, 0.0, 0.0)])
def test_correct_and_smooth_equals_dense_reference(autoscale, scale, a1, a2):
    n = 50
    src, dst = _edges(n, 220, seed=2)
    gen = torch.Generator().manual_seed(3)
    probs = torch.randn(n, CLASSES, dtype=torch.float64, generator=gen).softmax(1)
    label = torch.randint(0, CLASSES, (n,), generator=gen)
    train = torch.rand(n, generator=gen) < 0.4
    cs = CorrectAndSmooth(7, a1, 6, a2, autoscale=autoscale, scale=scale)
    got = cs(_Graph(src, dst, n), probs, label, train)
    want = _reference_cs(_dense_s(src, dst, n), probs, label, train, a1, 7, a2, 6, autoscale, scale)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # the two stages separately
    zc = cs.correct(_Graph(src, dst, n), probs, label, train)
    want_smooth_of_zc = _reference_cs(_dense_s(src, dst, n), zc, label, train, 0.0, 1, a2, 6, False, 0.0)
    torch.testing.assert_close(cs.smooth(_Graph(src, dst, n), zc, label, train), want_smooth_of_zc,
                               rtol=1e-10, atol=1e-12)


def test_trainer_cs_on_the_single_engine_equals_dense_reference(tmp_path):
    path = tmp_path / "g.h5"
    src, dst = _write(path, seed=4)
    rec = {"correct_smooth": True, "cs_correct_layers": 5, "cs_smooth_layers": 4, "cs_correct_alpha": 0.7,
           "cs_smooth_alpha": 0.9}
    tr = Trainer(_config(path, tmp_path / "run", rec))
    for _ in range(3):
        tr.step()
    result = tr.correct_and_smooth(use_best=False)
    tr.model.eval()
    with torch.no_grad():
        probs = tr.model(tr.graph, tr.feat).softmax(1)
    want = _reference_cs(_dense_s(src, dst, tr.graph.num_nodes), probs, tr.label, tr.masks["train"],
                         0.7, 5, 0.9, 4, True, 1.0)
    torch.testing.assert_close(tr.cs_probs, want, rtol=1e-10, atol=1e-12)
    for stage, scores in (("before", probs), ("after", want)):
        pred = scores.argmax(1)
        for split in ("train", "val", "test"):
            m = tr.masks[split]
            assert result[stage][f"{split}_acc"] == pytest.approx(float((pred[m] == tr.label[m]).double().mean()))


def test_fit_reports_accuracy_before_and_after(tmp_path):
    path = tmp_path / "g.h5"
    _write(path, seed=6)
    tr = Trainer(_config(path, tmp_path / "run", {"correct_smooth": True}, train={"epochs": 6}))
    summary = tr.fit()
    cs = summary["correct_smooth"]
    # "before" is the best-validation model: its accuracies are the summary's best ones
    assert cs["before"]["val_acc"] == pytest.approx(summary["best_val_acc"])
    assert cs["before"]["test_acc"] == pytest.approx(summary["test_acc"])
    assert set(cs["after"]) == {"train_acc", "val_acc", "test_acc"}
    # the current (last-epoch) parameters are restored after C&S ran on the best ones
    last = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.correct_and_smooth()
    assert all(torch.equal(last[k], v) for k, v in tr.model.state_dict().items())


# -- label augmentation ---------------------------------------------------------------------------
def test_node_uniforms_depend_on_seed_epoch_and_id_only():
    ids = torch.arange(200_000, dtype=torch.int64)
    u = node_uniforms(ids, seed=3, epoch=7)
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float((u < 0.3).double().mean()) - 0.3) < 0.005
    perm = torch.randperm(ids.numel())
    assert torch.equal(node_uniforms(ids[perm], 3, 7), u[perm])  # keyed by id, not position
    assert not torch.equal(node_uniforms(ids, 3, 8), u) and not torch.equal(node_uniforms(ids, 4, 7), u)
    # consecutive epochs are not correlated
    v = node_uniforms(ids, 3, 8)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.01


def test_append_columns_dense_and_sparse_csr():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 11, dtype=torch.float64, generator=gen) * (torch.rand(30, 11, generator=gen) < 0.2)
    x[5] = 0.0  # an empty row
    extra = F.one_hot(torch.randint(0, 3, (30,), generator=gen), 3).double() * (torch.rand(30, 1, generator=gen) < 0.5)
    want = torch.cat([x, extra], 1)
    assert torch.equal(append_columns(x, extra), want)
    with _quiet():
        got = append_columns(x.to_sparse_csr(), extra)
    assert got.layout == torch.sparse_csr and torch.equal(got.to_dense(), want)
    assert got._nnz() == int((x != 0).sum() + (extra != 0).sum())
    cols = got.col_indices()
    crow = got.crow_indices()
    for r in range(30):  # columns sorted within every row
        row = cols[crow[r]:crow[r + 1]]
        assert torch.equal(row, row.sort().values)


@pytest.mark.parametrize("sparse", [False, True])
def test_label_augmentation_inputs_and_loss(tmp_path, sparse):
    path = tmp_path / "g.h5"
    _write(path, n=120, feat_dim=30, seed=7, sparse=sparse)
    layout = {"feature_layout": "sparse" if sparse else "dense"}
    tr = Trainer(_config(path, tmp_path / "run", {"label_aug": 0.4}, model={"dropout": 0.0}, data=layout))
    n, f = tr.feat.shape
    assert any(p.dim() == 2 and f + CLASSES in p.shape for p in tr.model.parameters())  # in_dim = F + C
    train = tr.masks["train"]
    onehot = F.one_hot(tr.label, CLASSES).double()
    feat = tr.feat.to_dense() if sparse else tr.feat
    ids = torch.arange(n)
    for epoch in (1, 2):
        x, idx, count = tr.train_inputs(epoch)
        assert (x.layout == torch.sparse_csr) == sparse
        rows = train & (node_uniforms(ids, 5, epoch) < 0.4)
        want = torch.cat([feat, onehot * rows[:, None]], 1)
        assert torch.equal(x.to_dense() if sparse else x, want)
        assert torch.equal(idx, (train & ~rows).nonzero().squeeze(1)) and count == float((train & ~rows).sum())
        assert 0 < int(rows.sum()) < int(train.sum())
    masks = [tr.label_aug.input_mask(e) for e in (1, 2)]
    assert not torch.equal(masks[0], masks[1])  # re-drawn every epoch
    # the loss of a step: CE over the nodes whose label was not an input, from a model fed x
    with torch.no_grad():
        x, idx, count = tr.train_inputs(1)
        tr.model.train()
        want_loss = float(F.cross_entropy(tr.model(tr.graph, x)[idx], tr.label[idx], reduction="sum") / count)
    assert tr.step() == pytest.approx(want_loss, rel=1e-12)
    # evaluation: every training label, nothing else
    ev = tr.eval_inputs()
    ev = ev.to_dense() if sparse else ev
    assert torch.equal(ev, torch.cat([feat, onehot * train[:, None]], 1))


def test_label_augmentation_mask_does_not_depend_on_node_order():
    n = 500
    gen = torch.Generator().manual_seed(1)
    label = torch.randint(0, 3, (n,), generator=gen)
    train = torch.rand(n, generator=gen) < 0.6
    ids = torch.randperm(n, generator=gen)
    la = LabelAugmentation(0.5, 9, label, train, ids, 3)
    perm = torch.randperm(n, generator=gen)
    lb = LabelAugmentation(0.5, 9, label[perm], train[perm], ids[perm], 3)
    for epoch in (1, 5):
        assert torch.equal(la.input_mask(epoch)[perm], lb.input_mask(epoch))


# -- validation and test labels are never read ---------------------------------------------------
@pytest.mark.parametrize("model", [{"name": "gcn"}, {"name": "mlp", "num_layers": 2}])
def test_poisoned_val_and_test_labels_change_nothing(tmp_path, model):
    clean, poisoned = tmp_path / "clean.h5", tmp_path / "poisoned.h5"
    _write(clean, seed=11)
    _write(poisoned, seed=11, poison=True)
    rec = {"label_aug": 0.5, "correct_smooth": True, "cs_correct_layers": 6, "cs_smooth_layers": 6}
    runs = []
    for k, path in enumerate((clean, poisoned)):
        tr = Trainer(_config(path, tmp_path / f"run{k}", rec, model=model))
        assert not torch.equal(tr.label, runs[0]["trainer"].label) if runs else True
        losses, grads, inputs = [], [], []
        for epoch in range(1, 4):
            x, idx, count = tr.train_inputs(epoch)
            inputs.append((x.clone(), idx.clone(), count))
            losses.append(tr.step())
            grads.append([p.grad.clone() for p in tr.params])
        tr.correct_and_smooth(use_best=False)
        runs.append({"trainer": tr, "losses": losses, "grads": grads, "inputs": inputs,
                     "eval": tr.eval_inputs().clone(), "cs": tr.cs_probs.clone(),
                     "state": {k: v.clone() for k, v in tr.model.state_dict().items()}})
    a, b = runs
    assert a["losses"] == b["losses"]  # bitwise
    for ga, gb in zip(a["grads"], b["grads"]):
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
    for (xa, ia, ca), (xb, ib, cb) in zip(a["inputs"], b["inputs"]):
        assert torch.equal(xa, xb) and torch.equal(ia, ib) and ca == cb
    assert torch.equal(a["eval"], b["eval"])
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert torch.equal(a["cs"], b["cs"])  # every node, bitwise
    # and the poisoning did change the val/test labels
    ta, tb = a["trainer"], b["trainer"]
    held_out = ta.masks["val"] | ta.masks["test"]
    assert torch.equal(ta.label[~held_out], tb.label[~held_out]) and not torch.equal(ta.label, tb.label)


def test_train_onehot_reads_only_training_rows():
    label = torch.tensor([2, 10**9, -5, 1])  # out-of-range values outside the training mask
    train = torch.tensor([True, False, False, True])
    want = torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 0, 0], [0, 1.0, 0]], dtype=torch.float64)
    assert torch.equal(train_onehot(label, train, 3, torch.float64), want)


# -- configuration --------------------------------------------------------------------------------
@pytest.mark.parametrize("recipes,field", [
    ({"label_aug": 1.0}, "recipes.label_aug"), ({"label_aug": -0.1}, "recipes.label_aug"),
    ({"label_aug": "half"}, "recipes.label_aug"), ({"correct_smooth": "yes"}, "recipes.correct_smooth"),
    ({"correct_smooth": True, "cs_correct_layers": 0}, "recipes.cs_correct_layers"),
    ({"correct_smooth": True, "cs_smooth_alpha": 1.5}, "recipes.cs_smooth_alpha"),
    ({"correct_smooth": True, "cs_autoscale": False, "cs_scale": -1.0}, "recipes.cs_scale"),
    ({"label_smoothing": 0.1}, "recipes.label_smoothing"),
])
def test_bad_values_name_the_field(recipes, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        config_from_dict({"data": {"path": "x.h5"}, "recipes": recipes})


@pytest.mark.parametrize("recipes,engine,field", [
    ({"cs_smooth_layers": 10}, "single", "recipes.cs_smooth_layers"),  # C&S is off
    ({"correct_smooth": True, "cs_scale": 2.0}, "single", "recipes.cs_scale"),  # autoscale computes it
    ({"label_aug": 0.5}, "minibatch", "recipes.label_aug"),
    ({"label_aug": 0.5}, "apt", "recipes.label_aug"),
])
def test_cross_field_errors(tmp_path, recipes, engine, field):
    path = tmp_path / "g.h5"
    _write(path, seed=12)
    config = _config(path, tmp_path / "run", recipes, engine=engine)
    with pytest.raises(ConfigError, match=f"^{field}:"):
        check_recipes(config, engine)
    with pytest.raises(ConfigError, match=f"^{field}:"):
        Trainer(config)


def test_cli_overrides(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {path: x.h5}\nrecipes: {correct_smooth: true}\n")
    config = load_config(cfg, ["recipes.label_aug=0.25", "recipes.cs_correct_alpha=0.9"])
    assert config.recipes.label_aug == 0.25 and config.recipes.cs_correct_alpha == 0.9
    with pytest.raises(ConfigError, match=r"^recipes\.label_aug:"):
        load_config(cfg, ["recipes.label_aug=2"])


def test_correct_and_smooth_constructor_checks():
    with pytest.raises(ConfigError, match=r"^recipes\.cs_correct_layers:"):
        CorrectAndSmooth(correct_layers=0)
    with pytest.raises(ConfigError, match=r"^recipes\.cs_correct_alpha:"):
        CorrectAndSmooth(correct_alpha=-0.5)
    with pytest.raises(ConfigError, match=r"^recipes\.label_aug:"):
        LabelAugmentation(1.0, 0, torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool),
                          torch.arange(3), 2)


# -- command line ---------------------------------------------------------------------------------
def test_cli_prints_accuracy_after_correct_and_smooth(tmp_path, capsys):
    import json

    from hpc_graph.cli import main

    path = tmp_path / "g.h5"
    _write(path, seed=13)
    run_dir = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{path: {path}}}\nmodel: {{name: mlp, hidden: 8}}\ntrain: {{epochs: 3, progress: false}}\n")
    rc = main(["-q", "train", "--config", str(cfg), "--run-dir", str(run_dir), "--set", "recipes.correct_smooth=true",
               "--set", "recipes.label_aug=0.3", "--set", "recipes.cs_smooth_alpha=0.9"])
    out = capsys.readouterr().out
    assert rc == 0
    cs = json.loads((run_dir / "summary.json").read_text())["correct_smooth"]
    assert out.count("\n") == 1 and out.startswith("best val acc ")
    assert (f"after C&S: val acc {cs['after']['val_acc']:.4f}, test acc {cs['after']['test_acc']:.4f}" in out), out


def test_cli_bad_recipe_value_is_one_line_naming_the_field(tmp_path, capsys):
    from hpc_graph.cli import main

    path = tmp_path / "g.h5"
    _write(path, seed=14)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{path: {path}}}\ntrain: {{epochs: 2, progress: false}}\n")
    rc = main(["-q", "train", "--config", str(cfg), "--run-dir", str(tmp_path / "run"),
               "--set", "recipes.label_aug=1.5"])
    err = capsys.readouterr().err
    assert rc == 2 and "recipes.label_aug: must be a number in [0, 1), got 1.5" in err, err
