"""The Trainer on small generated graphs (single engine, one process)."""
import copy
import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from data_io.generators.csbm import write_csbm
from hpc_graph.nn import optim
from hpc_graph.train.config import ConfigError, config_from_dict
from hpc_graph.train.metrics import metrics_path, read_metrics
from hpc_graph.train.trainer import Trainer, choose_engine, row_normalize, to_layout

METRIC_FIELDS = {"rank", "epoch", "loss", "train_acc", "val_acc", "test_acc", "lr", "epoch_seconds",
                 "compute_seconds", "comm_seconds", "bytes_sent", "modeled_comm_seconds", "modeled_wait_seconds",
                 "eval_seconds", "eval_bytes_sent",
                 "peak_rss_mb", "engine_stats"}
SUMMARY_FIELDS = {"best_val_acc", "test_acc", "best_epoch", "final", "epochs", "median_epoch_seconds",
                  "peak_rss_mb", "bytes_per_epoch", "bytes_per_epoch_per_rank", "world_size", "threads_per_rank",
                  "malloc_per_rank", "engine",
                  "num_parameters", "parameters_per_rank", "run_dir", "config"}


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "csbm.h5"
    write_csbm(path, num_nodes=300, num_classes=4, avg_degree=6.0, homophily=0.85, feat_dim=12, snr=1.5,
               train_frac=0.3, val_frac=0.3, test_frac=0.4, seed=3)
    return str(path)


def _config(path, run_dir, model=None, optim=None, train=None, data=None):
    return config_from_dict({
        "data": {"path": path, **(data or {})},
        "model": {"name": "gcn", "hidden": 16, **(model or {})},
        "optim": {"lr": 0.02, **(optim or {})},
        "train": {"epochs": 20, "seed": 0, "progress": False, "run_dir": str(run_dir), **(train or {})},
    })


def test_fit_writes_metrics_and_summary(graph_file, tmp_path):
    cfg = _config(graph_file, tmp_path / "run", train={"epochs": 24, "eval_every": 4})
    trainer = Trainer(cfg)
    assert trainer.engine_name == "single" and trainer.size == 1
    summary = trainer.fit()
    rows = read_metrics(tmp_path / "run")
    assert metrics_path(tmp_path / "run", 0).exists()
    assert [r["epoch"] for r in rows] == list(range(1, 25))
    for r in rows:
        assert set(r) == METRIC_FIELDS and r["rank"] == 0
        assert r["epoch_seconds"] > 0 and r["compute_seconds"] >= 0 and r["peak_rss_mb"] > 0
        assert r["bytes_sent"] == 0 and r["comm_seconds"] == 0  # one process: no traffic
        assert (r["val_acc"] is None) == (r["epoch"] % 4 != 0)
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"]
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(on_disk) == SUMMARY_FIELDS and on_disk == json.loads(json.dumps(summary))
    evaluated = [r for r in rows if r["val_acc"] is not None]
    best = max(evaluated, key=lambda r: r["val_acc"])  # first epoch reaching the maximum
    assert summary["best_val_acc"] == best["val_acc"] and summary["best_epoch"] == best["epoch"]
    assert summary["test_acc"] == best["test_acc"]
    assert summary["median_epoch_seconds"] == pytest.approx(float(np.median([r["epoch_seconds"] for r in rows])))
    assert summary["epochs"] == 24 and summary["world_size"] == 1 and len(summary["peak_rss_mb"]) == 1
    assert summary["config"]["model"]["name"] == "gcn" and summary["final"]["loss"] == rows[-1]["loss"]
    assert summary["best_val_acc"] > 0.5  # 4 balanced classes: chance is 0.25
    trainer.load_best()


def test_step_loss_gradient_and_update_match_reference(graph_file, tmp_path):
    cfg = _config(graph_file, tmp_path, model={"dropout": 0.0},
                  optim={"name": "sgd", "lr": 0.3, "weight_decay": 0.0, "momentum": 0.0})
    trainer = Trainer(cfg)
    ref = copy.deepcopy(trainer.model)
    mask = trainer.engine.masks["train"]
    logits = ref(trainer.graph, trainer.feat)
    loss = F.cross_entropy(logits[mask], trainer.label[mask])  # mean over training nodes
    loss.backward()
    got = trainer.step()
    assert got == pytest.approx(loss.item(), rel=1e-6)
    for (name, p), q in zip(trainer.model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), (q - 0.3 * q.grad).detach(), msg=name)


def test_evaluate_counts_match_manual_accuracy(graph_file, tmp_path):
    trainer = Trainer(_config(graph_file, tmp_path))
    for _ in range(5):
        trainer.step()
    acc = trainer.evaluate()
    trainer.model.eval()
    with torch.no_grad():
        pred = trainer.model(trainer.graph, trainer.feat).argmax(1)
    for split in ("train", "val", "test"):
        m = trainer.engine.masks[split]
        assert acc[f"{split}_acc"] == pytest.approx((pred[m] == trainer.label[m]).double().mean().item())


@pytest.mark.parametrize("model", [
    {"name": "sage", "num_layers": 3, "residual": True, "batchnorm": True},
    {"name": "gat", "hidden": 4, "heads": 2, "out_heads": 2, "attn_dropout": 0.3, "dropout": 0.2},
    {"name": "gcn", "num_layers": 1},
])
def test_every_model_trains(graph_file, tmp_path, model):
    cfg = _config(graph_file, tmp_path, model=model, train={"epochs": 12, "dtype": "float64", "eval_every": 6},
                  optim={"schedule": "cosine"})
    trainer = Trainer(cfg)
    assert all(p.dtype == torch.float64 for p in trainer.model.parameters())
    summary = trainer.fit()
    rows = read_metrics(tmp_path)
    assert math.isfinite(rows[-1]["loss"]) and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["lr"] < rows[0]["lr"]  # cosine schedule
    assert summary["best_epoch"] in (6, 12)


def test_step_schedule_and_sgd(graph_file, tmp_path):
    cfg = _config(graph_file, tmp_path, optim={"name": "sgd", "lr": 0.1, "momentum": 0.9, "schedule": "step",
                                               "step_size": 3, "gamma": 0.5})
    trainer = Trainer(cfg)
    assert isinstance(trainer.optimizer, optim.SGD) and trainer.optimizer.param_groups[0]["momentum"] == 0.9
    lrs = []
    for _ in range(7):
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.step()
    assert lrs == pytest.approx([0.1] * 3 + [0.05] * 3 + [0.025])


def test_row_normalisation(graph_file, tmp_path):
    x = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, 2.0]])
    torch.testing.assert_close(row_normalize(x), torch.tensor([[0.25, 0.75], [0.0, 0.0], [0.5, 0.5]]))
    trainer = Trainer(_config(graph_file, tmp_path, data={"feature_norm": "row"}))
    torch.testing.assert_close(trainer.feat, row_normalize(trainer.engine.feat))
    plain = Trainer(_config(graph_file, tmp_path))
    assert plain.feat is plain.engine.feat


def test_same_seed_same_run_different_seed_differs(graph_file, tmp_path):
    def run(seed):
        t = Trainer(_config(graph_file, tmp_path, train={"seed": seed}))
        return [t.step() for _ in range(3)]
    first = run(5)
    assert run(5) == first
    assert run(6) != first


def test_engine_choice_and_config_errors(graph_file, tmp_path, monkeypatch):
    assert choose_engine("auto", 1, graph_file) == "single"
    assert choose_engine("auto", 2, graph_file) == "dp"
    assert choose_engine("sar", 1, graph_file) == "sar"
    assert choose_engine("auto", 1, graph_file, "gt") == "single"
    assert choose_engine("auto", 4, graph_file, "graphormer") == "seqpar"
    with pytest.raises(ConfigError, match="engine.name: 'single' runs on one process, but this job has 4 ranks"):
        choose_engine("single", 4, graph_file)
    with pytest.raises(ConfigError, match="data.path: no such file or directory"):
        Trainer(_config(str(tmp_path / "missing.h5"), tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="train.device: 'cuda' requested"):
        Trainer(_config(graph_file, tmp_path, train={"device": "cuda"}))


def test_feature_layouts_give_the_same_training(graph_file, tmp_path):
    x = torch.zeros(3, 10)
    x[0, 1], x[2, 0] = 2.0, 1.0
    assert to_layout(x, "auto").layout == torch.sparse_csr  # 2 of 30 entries non-zero
    assert to_layout(x, "auto", max_density=0.05) is x
    assert to_layout(torch.ones(3, 4), "auto").layout == torch.strided
    assert to_layout(torch.ones(3, 4), "sparse").layout == torch.sparse_csr
    assert to_layout(x, "dense") is x
    torch.testing.assert_close(to_layout(x, "sparse").to_dense(), x)

    def run(layout, model):
        t = Trainer(_config(graph_file, tmp_path, data={"feature_layout": layout},
                            model={"dropout": 0.0, **model}, train={"dtype": "float64"}))
        assert t.feat.layout == (torch.sparse_csr if layout == "sparse" else torch.strided)
        return [t.step() for _ in range(3)] + [t.evaluate()["val_acc"]]
    for model in ({"name": "gcn"}, {"name": "sage", "residual": True}, {"name": "gat", "heads": 2, "hidden": 4}):
        assert run("sparse", model) == pytest.approx(run("dense", model), rel=1e-9)
