"""The ``flow`` engine on one process: stage splitting, options, config checks, the CLI."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import yaml

from data_io.generators.csbm import write_csbm
from hpc_graph.cli import main
from hpc_graph.comm.local import LocalCommunicator
from hpc_graph.engines.flow import FlowEngine, split_stages
from hpc_graph.train.config import ConfigError, config_from_dict
from hpc_graph.train.trainer import Trainer


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "g.h5"
    write_csbm(path, num_nodes=150, num_classes=3, avg_degree=5.0, feat_dim=8, seed=1)
    return str(path)


@pytest.mark.parametrize("seed", range(5))
def test_split_stages_is_the_best_contiguous_cut(seed):
    rng = np.random.default_rng(seed)
    costs = rng.random(9).tolist()
    for stages in (1, 2, 3, 4):
        bounds = split_stages(costs, stages)
        assert bounds[0] == 0 and bounds[-1] == 9 and all(a < b for a, b in zip(bounds, bounds[1:]))
        got = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = min(max(sum(costs[a:b]) for a, b in zip((0,) + cut, cut + (9,)))
                   for cut in itertools.combinations(range(1, 9), stages - 1))
        assert got == pytest.approx(best)
    with pytest.raises(ValueError, match="5 stages need 1 to 4 units"):
        split_stages([1.0] * 4, 5)


@pytest.mark.parametrize("options,message", [
    ({"stages": 2}, "engine.stages: the flow engine runs one stage per rank; this job has 1 rank"),
    ({"stages": -1}, "engine.stages: must be a non-negative integer"),
    ({"microbatches": 0}, "engine.microbatches: must be a positive integer"),
    ({"microbatches": 151}, "engine.microbatches: 151 micro-batches but"),
    ({"cross_edges": "some"}, "engine.cross_edges: must be one of"),
    ({"stage_split": "size"}, "engine.stage_split: must be one of 'cost', 'count', got 'size'"),
    ({"bits": 4},
     "'bits' not an option of engine 'flow' (its options: cross_edges, microbatches, stage_split, stages)"),
])
def test_bad_options_name_the_option(graph_file, options, message):
    with pytest.raises(ValueError) as info:
        FlowEngine(graph_file, LocalCommunicator(), torch.device("cpu"), torch.float32, options)
    assert message in str(info.value)


def _config(graph_file, tmp_path, model=None, **engine):
    return config_from_dict({"data": {"path": graph_file}, "engine": {"name": "flow", **engine},
                             "model": model or {"name": "gcn", "hidden": 8, "num_layers": 4},
                             "train": {"epochs": 2, "progress": False, "run_dir": str(tmp_path / "run")}})


@pytest.mark.parametrize("model,engine,message", [
    ({"name": "gcn2", "hidden": 8}, {}, "engine 'flow' pipelines the layer chains"),
    ({"name": "revgcn", "hidden": 8, "num_layers": 3}, {"microbatches": 3, "cross_edges": "stale"},
     r"'stale' appends halo rows to every layer, which a reversible chain \(RevGCN\) cannot take"),
])
def test_models_the_flow_engine_cannot_run(graph_file, tmp_path, model, engine, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(_config(graph_file, tmp_path, model, **engine), LocalCommunicator())


def test_flow_options_belong_to_the_flow_engine(graph_file):
    with pytest.raises(ConfigError, match="engine.microbatches: only used by engine 'flow'"):
        config_from_dict({"data": {"path": graph_file}, "engine": {"name": "single", "microbatches": 2}})
    with pytest.raises(ConfigError, match="recipes: label_aug and correct_smooth are not available on engine 'flow'"):
        config_from_dict({"data": {"path": graph_file}, "engine": {"name": "flow"}, "recipes": {"label_aug": 0.5}})


def test_micro_batches_cover_every_node_once_and_keep_the_data(graph_file, tmp_path):
    from data_io.dataset import open_dataset

    eng = FlowEngine(graph_file, LocalCommunicator(), torch.device("cpu"), torch.float32,
                     {"microbatches": 4, "cross_edges": "stale"})
    order = eng.order.numpy()
    assert sorted(order.tolist()) == list(range(150)) and eng.offsets.tolist()[0] == 0 and eng.offsets[-1] == 150
    with open_dataset(graph_file) as ds:
        feat, label = ds.feat_rows(0, 150), ds.label()
    np.testing.assert_array_equal(eng.feat.numpy(), feat[order])
    np.testing.assert_array_equal(eng.label.numpy(), label[order])
    assert 0 < eng.cut_edges < eng.graph.csr.num_edges


def test_cli_trains_a_pipeline_and_reports_idle_time(graph_file, tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": graph_file},
                                   "model": {"name": "gcn", "hidden": 8, "num_layers": 6, "residual": True},
                                   "train": {"epochs": 3, "progress": False}}))
    run = tmp_path / "run"
    rc = main(["-q", "train", "--config", str(cfg), "--set", "engine.name=flow", "--set", "engine.microbatches=3",
               "--set", "engine.cross_edges=stale", "--run-dir", str(run)])
    assert rc == 0 and capsys.readouterr().out.startswith("best val acc ")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine"] == "flow" and summary["parameters_per_rank"] == [summary["num_parameters"]]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stats = rows[-1]["engine_stats"]
    assert 0.0 <= stats["idle_fraction"] <= 1.0 and stats["history_bytes"] > 0


def test_identical_units_get_one_cost():
    from torch import nn

    from hpc_graph.engines.flow import _same_units_same_cost

    units = [[nn.Linear(4, 8)], [nn.Linear(8, 8)], [nn.Linear(8, 8)], [nn.Linear(8, 8)], [nn.Linear(8, 2)]]
    costs = [5.0, 1.0, 3.0, 2.0, 0.5]
    assert _same_units_same_cost(units, costs) == [5.0, 2.0, 2.0, 2.0, 0.5]
