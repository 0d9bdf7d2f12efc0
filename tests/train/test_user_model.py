"""A model of one's own (tests/plugins/user_model.py, public API only) trains through ``Trainer(config, model=...)``
as a factory, a module or a ModelSpec, through ``hpc-graph train --model module:Factory``, and is planned by
``hpc-graph plan --model``; the same seed gives the same numbers every way. Bad models are refused in one line that
names them. Across ranks: tests/mpi/test_user_model.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hpc_graph as hg

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
sys.path.insert(0, str(PLUGINS))
from user_model import MeanSAGE, NoGraph  # noqa: E402


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from data_io.converters.npz import convert_npz

    path = tmp_path_factory.mktemp("cora") / "cora.h5"
    convert_npz(ROOT / "tests" / "data" / "cora.npz", path)
    return path


def _config(data, run_dir, name="gcn", epochs=3):
    from hpc_graph.train.config import config_from_dict

    return config_from_dict({"data": {"path": str(data), "feature_norm": "row"}, "engine": {"name": "single"},
                             "model": {"name": name, "hidden": 16, "dropout": 0.5},
                             "optim": {"lr": 0.05}, "train": {"epochs": epochs, "dtype": "float64", "seed": 3,
                                                              "progress": False, "run_dir": str(run_dir)}})


def _losses(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["epoch"])]


def test_factory_module_and_spec_train_the_same(cora, tmp_path):
    by_factory = hg.Trainer(_config(cora, tmp_path / "f"), model=MeanSAGE)
    assert isinstance(by_factory.model, MeanSAGE) and by_factory.config.model.name == "<user_model.MeanSAGE>"
    initial = {k: v.clone() for k, v in by_factory.model.state_dict().items()}
    by_factory.fit()
    torch.manual_seed(3)  # the seed the Trainer draws the factory's weights with
    module = MeanSAGE(1433, 7, _config(cora, tmp_path / "m").model).double()
    by_module = hg.Trainer(_config(cora, tmp_path / "m"), model=module)
    assert by_module.model is module
    assert all(torch.equal(module.state_dict()[k], v) for k, v in initial.items())
    by_module.fit()
    assert not all(torch.equal(module.state_dict()[k], v) for k, v in initial.items())  # trained in place
    spec = hg.ModelSpec(name="mine", build=MeanSAGE, sampled=True)
    by_spec = hg.Trainer(_config(cora, tmp_path / "s"), model=spec)
    assert by_spec.config.model.name == "mine"
    by_spec.fit()
    assert _losses(tmp_path / "f") == _losses(tmp_path / "s")


def test_cli_model_option_trains_and_plans(cora, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{path: {cora}, feature_norm: row}}\nmodel: {{name: gcn, hidden: 16, dropout: 0.5}}\n"
                   f"optim: {{lr: 0.05}}\ntrain: {{epochs: 3, dtype: float64, seed: 3, progress: false}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS)])}
    cli = [sys.executable, "-m", "hpc_graph.cli", "-q"]
    run = subprocess.run(cli + ["train", "--config", str(cfg), "--model", "user_model:MeanSAGE", "--run-dir",
                                str(tmp_path / "cli")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    hg.Trainer(_config(cora, tmp_path / "api"), model=MeanSAGE).fit()
    assert _losses(tmp_path / "cli") == _losses(tmp_path / "api")
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["config"]["model"]["name"] == "user_model:MeanSAGE"
    plan = subprocess.run(cli + ["plan", "--config", str(cfg), "--model", "user_model:MeanSAGE", "--engines",
                                 "single,dp", "--ranks", "1,2", "--rates", "none", "--json", str(tmp_path / "p.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    rows = json.loads((tmp_path / "p.json").read_text())
    assert "user_model:MeanSAGE" in json.dumps(rows)


@pytest.mark.parametrize("model, message", [
    (NoGraph, "NoGraph.forward(x) cannot be called as forward(graph, x)"),
    (3, "must be a factory (in_dim, out_dim, model_section) -> nn.Module or a ModelSpec, got int"),
])
def test_bad_models_are_refused_in_one_line(cora, tmp_path, model, message):
    from hpc_graph.train.config import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hg.Trainer(_config(cora, tmp_path / "r"), model=model)


@pytest.mark.parametrize("path, message", [
    ("no_such_module_x:F", "cannot import module 'no_such_module_x' of 'no_such_module_x:F': ModuleNotFoundError"),
    ("user_model:Missing", "module 'user_model' has no attribute 'Missing'"),
    ("user_model:NOT_A_FACTORY", "must be a factory"),
    ("user_model:", "is not 'package.module:Factory'"),
])
def test_bad_model_paths_name_the_option(cora, tmp_path, path, message):
    from hpc_graph.train.config import ConfigError

    with pytest.raises(ConfigError, match=f"^model.name: .*{message}"):
        _config(cora, tmp_path / "r", name=path)


def test_cli_bad_model_path_is_one_line(cora, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{path: {cora}}}\ntrain: {{epochs: 1, progress: false}}\n")
    run = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--model",
                          "nowhere_pkg.mod:Net", "--run-dir", str(tmp_path / "x")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == ["hpc-graph train: error: model.name: cannot import module 'nowhere_pkg.mod' of "
                     "'nowhere_pkg.mod:Net': ModuleNotFoundError: No module named 'nowhere_pkg'"], run.stderr
    assert not (tmp_path / "x").exists()


def test_a_primitive_the_engine_lacks_is_one_line_naming_engine_model_and_primitive(cora, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{path: {cora}}}\nengine: {{name: minibatch}}\nmodel: {{num_layers: 1}}\n"
                   "sampler: {fanouts: [5]}\ntrain: {epochs: 1, progress: false}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS)])}
    run = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--model",
                          "user_model:OutDegreeScaled", "--run-dir", str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "hpc-graph train: error: engine.name: 'minibatch' cannot run model 'user_model:OutDegreeScaled': Block: "
        "out_degree is not available on this engine"), run.stderr
    assert "Traceback" not in run.stderr


def test_predict_and_write_predictions(cora, tmp_path):
    import h5py
    import numpy as np

    trainer = hg.Trainer(_config(cora, tmp_path / "t", epochs=4), model=MeanSAGE)
    trainer.fit()
    ids, out = trainer.predict(use_best=False)
    trainer.model.eval()
    with torch.no_grad():
        want = trainer.model(trainer.graph, trainer.feat)
    assert torch.equal(ids, torch.arange(2708)) and torch.equal(out, want)
    best_ids, best = trainer.predict()  # the best-validation weights, the current ones back afterwards
    assert trainer.best["epoch"] is not None
    with torch.no_grad():
        assert torch.equal(trainer.model(trainer.graph, trainer.feat), want)
    path = trainer.write_predictions(tmp_path / "out" / "pred.h5")
    with h5py.File(path, "r") as f:
        got = f["node/output"][:]
        assert f["node/output"].attrs["epoch"] == trainer.best["epoch"]
    assert np.array_equal(got, best.float().numpy())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["pred.h5"]


def test_a_spec_named_like_a_built_in_model_is_refused(cora, tmp_path):
    from hpc_graph.train.config import ConfigError

    with pytest.raises(ConfigError, match="Trainer\\(model=...\\): register_model: 'gcn' is a built-in model name"):
        hg.Trainer(_config(cora, tmp_path / "r"), model=hg.ModelSpec(name="gcn", build=MeanSAGE))
