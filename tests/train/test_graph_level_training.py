"""Graph-level training on engine ``single``: batches of whole graphs, the trainer's step against a manual
one, the message-passing leak check on REG3-CC, and the errors for what does not apply to graph-level data.
Also the pieces of ``dp`` over batches of graphs that need no MPI (its ranks' shares, an empty share through
every model, the refusals); tests/mpi/test_graph_dp.py runs it on 2 and 4 ranks against ``single``."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from data_io.dataset import open_dataset, write_dataset
from data_io.generators import generate_pathspd, generate_reg3cc
from hpc_graph.comm import get_communicator
from hpc_graph.engines import engine_class
from hpc_graph.engines.graph_batches import GraphBatches
from hpc_graph.engines.single import SingleEngine
from hpc_graph.train.config import MODEL_NAMES, ConfigError, config_from_dict, load_config
from hpc_graph.train.trainer import Trainer, choose_engine

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reg3cc(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "reg3cc.h5"
    write_dataset(path, generate_reg3cc(60, 8, 16, seed=5))
    return path


def _config(data, name="single_graphormer_reg3cc.yaml", *over):
    return load_config(REPO / "configs" / name, [f"data.path={data}", "train.progress=false", "train.run_dir=",
                                                 "model.num_layers=2", "model.hidden=16", *over])


def test_batches_cover_every_training_graph_once_with_its_own_structure(reg3cc):
    eng = SingleEngine(str(reg3cc), get_communicator("local"), torch.device("cpu"), torch.float32,
                       {"graph_batch_size": 7, "seed": 3})
    with open_dataset(reg3cc) as ds:
        ptr, indptr, indices = ds.graph_ptr(), ds.indptr(), ds.indices()
        train = np.flatnonzero(ds.graph_mask("train_mask"))
    assert eng.kind == "sampled" and eng.iterations(1) == -(-train.size // 7)
    seen = []
    for it in range(eng.iterations(1)):
        b = eng.batch(1, it)
        g = b.seeds.numpy()
        seen += g.tolist()
        assert b.graph.num_graphs == g.size and b.label.tolist() == eng.label[b.seeds].tolist()
        sub_ptr = b.graph.graph_ptr.numpy()
        for k, x in enumerate(g):  # graph x, renumbered: the same edges, the same features
            lo, hi = ptr[x], ptr[x + 1]
            assert sub_ptr[k + 1] - sub_ptr[k] == hi - lo
            want = sorted((int(s) - lo, int(d) - lo) for d in range(lo, hi) for s in indices[indptr[d]:indptr[d + 1]])
            c = b.graph.csr
            got = sorted((int(s) - sub_ptr[k], int(d) - sub_ptr[k]) for d in range(sub_ptr[k], sub_ptr[k + 1])
                         for s in c.indices[c.indptr[d]:c.indptr[d + 1]].tolist())
            assert got == want
            torch.testing.assert_close(b.feat[sub_ptr[k]:sub_ptr[k + 1]], eng.feat[lo:hi])
    assert sorted(seen) == train.tolist()  # every training graph once per epoch
    first2 = [eng.batch(2, it).seeds.tolist() for it in range(eng.iterations(2))]
    assert sum(first2, []) != seen or len(seen) < 3  # reshuffled every epoch


def test_trainer_step_equals_a_manual_step(reg3cc):
    cfg = _config(reg3cc, "single_graphormer_reg3cc.yaml", "engine.graph_batch_size=1000", "train.dtype=float64",
                  "model.max_spd=4")
    trainer = Trainer(cfg)
    model = copy.deepcopy(trainer.model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    batch = trainer.engine.batch(1, 0)  # all training graphs
    assert batch.label.numel() == int(trainer.engine.masks["train"].sum())
    loss = F.cross_entropy(model(batch.graph, batch.feat), batch.label)
    loss.backward()
    opt.step()
    got = trainer.step()
    assert got == pytest.approx(loss.item(), rel=1e-12)
    for (name, a), b in zip(trainer.model.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)
    acc = trainer.evaluate()
    assert set(acc) == {"train_acc", "val_acc", "test_acc"} and all(0 <= v <= 1 for v in acc.values())


def test_message_passing_without_pe_is_at_chance_on_reg3cc(reg3cc):
    """Leak check: GCN + mean readout sees every REG3-CC graph alike (degree 3, constant features)."""
    cfg = _config(reg3cc, "single_gcn.yaml", "train.epochs=15", "train.eval_every=5", "data.feature_norm=none")
    summary = Trainer(cfg).fit()
    assert summary["best_val_acc"] <= 0.55 and summary["test_acc"] <= 0.55


def test_gt_reads_pe_per_graph(tmp_path):
    data = generate_pathspd(30, 6, 10, max_dist=4, seed=1)
    write_dataset(tmp_path / "p.h5", data)
    from data_io.preprocess import add_node_field, laplacian_pe

    add_node_field(tmp_path / "p.h5", "lap_pe", laplacian_pe(data.indptr, data.indices, data.num_nodes, 3,
                                                             graph_ptr=data.graph_ptr))
    cfg = _config(tmp_path / "p.h5", "single_gt_reg3cc.yaml", "model.pe_dim=3", "train.epochs=2")
    summary = Trainer(cfg).fit()
    assert summary["epochs"] == 2


@pytest.mark.parametrize("over, words", [
    (("engine.name=seqpar",), "graph-level dataset"),
    (("engine.name=sar",), "or 'dp' \\(data parallel over the batches of graphs\\)"),
    (("recipes.label_aug=0.5",), "one label per graph"),
    (("engine.name=dp", "recipes.correct_smooth=true"), "one label per graph"),
    (("engine.graph_batch_size=0",), "engine.graph_batch_size"),
])
def test_graph_level_config_errors(reg3cc, over, words):
    with pytest.raises(ConfigError, match=words):
        Trainer(_config(reg3cc, "single_graphormer_reg3cc.yaml", *over))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_dp_shares_of_every_step_are_disjoint_and_make_the_step(reg3cc, size):
    eng = SingleEngine(str(reg3cc), get_communicator("local"), torch.device("cpu"), torch.float32,
                       {"graph_batch_size": 5, "seed": 2})
    g = eng.graphs
    ranks = [GraphBatches(g.indptr, g.indices, g.graph_ptr, g.feat, g.label, eng.masks["train"], 5, 2, rank=r,
                          size=size) for r in range(size)]
    for epoch in (1, 2):
        iters = eng.iterations(epoch)
        sizes = [rb.batch_sizes(epoch, iters) for rb in ranks]
        for it in range(iters):
            want = eng.batch(epoch, it).seeds.tolist()
            shares = [rb.step_graphs(epoch, it).tolist() for rb in ranks]
            assert sum(shares, []) == want  # consecutive slices, in rank order
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
            assert [s[0][it] for s in sizes] == list(map(len, shares))
            assert all(s[1][it] == len(want) for s in sizes)


def test_dp_engine_on_graph_level_data_and_its_refusals(reg3cc, tmp_path):
    assert (engine_class("dp", reg3cc).__name__ == "GraphDPEngine"
            and engine_class("dp", tmp_path).__name__ == "DPEngine")
    assert choose_engine("auto", 2, str(reg3cc), "gt") == "dp" and choose_engine("auto", 1, str(reg3cc)) == "single"
    with pytest.raises(ConfigError, match="use 'dp' \\(data parallel over the batches of graphs\\)"):
        choose_engine("single", 2, str(reg3cc))
    few = tmp_path / "three.h5"
    write_dataset(few, generate_reg3cc(3, 8, 8, seed=1))
    fake = type("Comm", (), {"rank": 0, "size": 4})()
    with pytest.raises(ValueError, match=f"{few}: 3 graph\\(s\\) cannot be shared by 4 ranks"):
        engine_class("dp", few)(str(few), fake, torch.device("cpu"), torch.float32, {})
    # one rank of two: it evaluates the first half of the graphs, trains on its share of every batch
    half = engine_class("dp", reg3cc)(str(reg3cc), type("Comm", (), {"rank": 0, "size": 2})(), torch.device("cpu"),
                                      torch.float32, {"graph_batch_size": 4})
    with open_dataset(reg3cc) as ds:
        num_graphs, label = ds.graph_ptr().shape[0] - 1, ds.graph_label()
    assert (half.graph.num_graphs == -(-num_graphs // 2)
            and half.label.tolist() == label[:half.graph.num_graphs].tolist())
    # the transformers run on dp over graphs with their global tokens (refused on dp over a partition)
    cfg = {"data": {"path": str(reg3cc)}, "engine": {"name": "dp"},
           "model": {"name": "gt", "global_token": True, "pe_dim": 0}}
    assert config_from_dict(cfg).engine.name == "dp"
    with pytest.raises(ConfigError, match="global_token: false"):
        config_from_dict({**cfg, "data": {"path": str(tmp_path)}})


@pytest.mark.parametrize("name", [m for m in MODEL_NAMES if m != "revgat"])
def test_every_model_takes_a_batch_of_no_graphs(tmp_path, name):
    """A ``dp`` rank whose share of a short last step is empty still runs the model (its gradient: zeros)."""
    data = generate_pathspd(12, 6, 9, max_dist=3, seed=1)
    write_dataset(tmp_path / "p.h5", data)
    model = {"name": name, "hidden": 8, **({"global_token": True, "pe_dim": 0} if name == "gt" else {})}
    trainer = Trainer(config_from_dict({"data": {"path": str(tmp_path / "p.h5")}, "engine": {"name": "single"},
                                        "model": model, "train": {"progress": False, "run_dir": str(tmp_path / "r")}}))
    empty = trainer.engine.graph_subset(torch.empty(0, dtype=torch.int64))
    out = trainer.model(empty.graph, empty.feat)
    assert tuple(out.shape) == (0, trainer.engine.num_classes)
    F.cross_entropy(out, empty.label, reduction="sum").backward()
    assert all(p.grad is None or not p.grad.any() for p in trainer.model.parameters())


@pytest.mark.parametrize("engine", ["single", "dp"])
def test_batches_get_the_features_evaluation_gets(tmp_path, engine):
    """``data.feature_norm: row``: the trainer normalises ``feat`` for evaluation; the batches must be normalised
    too."""
    data = generate_pathspd(10, 6, 9, max_dist=3, seed=1)
    rng = np.random.default_rng(0)
    data.feat = (rng.random((data.num_nodes, 5)) * rng.integers(1, 9, (data.num_nodes, 1))).astype(np.float32)
    data.feat[3] = 0.0  # a row summing to 0 stays as it is
    write_dataset(tmp_path / "p.h5", data)
    cfg = config_from_dict({"data": {"path": str(tmp_path / "p.h5"), "feature_norm": "row"},
                            "engine": {"name": engine, "graph_batch_size": 100},
                            "model": {"name": "gcn", "hidden": 4, "dropout": 0.0},
                            "train": {"progress": False, "run_dir": str(tmp_path / "r"), "dtype": "float64"}})
    trainer = Trainer(cfg)
    batch = trainer.engine.batch(1, 0)  # every training graph
    sums = data.feat.astype(np.float64).sum(1, keepdims=True)
    want = data.feat / np.where(sums == 0, 1.0, sums)
    nodes = np.concatenate([np.arange(data.graph_ptr[g], data.graph_ptr[g + 1]) for g in batch.seeds.tolist()])
    np.testing.assert_allclose(batch.feat.numpy(), want[nodes], rtol=1e-6)
    np.testing.assert_allclose(trainer.feat.numpy(), want, rtol=1e-6)  # what evaluation reads
