"""An engine and a model defined outside the package (tests/plugins/toy_plugins.py) train through the registries:
in-process (register_engine / register_model) and through ``hpc-graph train`` via the entry-point groups, with
the same numbers as the built-in ``single`` engine on the same model; their options are checked by name."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_graph.engines import engine_names, register_engine, unregister_engine
from hpc_graph.nn.models import model_names, register_model, unregister_model
from hpc_graph.train.config import ConfigError, config_from_dict

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
sys.path.insert(0, str(PLUGINS))
from toy_plugins import TOY_MODEL, ToyEngine  # noqa: E402


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from data_io.converters.npz import convert_npz

    path = tmp_path_factory.mktemp("cora") / "cora.h5"
    convert_npz(ROOT / "tests" / "data" / "cora.npz", path)
    return path


@pytest.fixture
def registered():
    register_engine(ToyEngine)
    register_model(TOY_MODEL)
    try:
        yield
    finally:
        unregister_engine("toy")
        unregister_model("toymean")


def _raw(data, engine, run_dir, epochs=4, **engine_opts):
    return {"data": {"path": str(data), "feature_norm": "row"}, "engine": {"name": engine, **engine_opts},
            "model": {"name": "toymean", "hidden": 16, "dropout": 0.0},
            "optim": {"lr": 0.05}, "train": {"epochs": epochs, "dtype": "float64", "progress": False,
                                              "run_dir": str(run_dir), "seed": 3}}


def _losses(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["epoch"])]


def test_a_registered_engine_and_model_train_as_single_does(cora, tmp_path, registered):
    from hpc_graph.train.trainer import Trainer

    assert "toy" in engine_names() and "toymean" in model_names()
    toy = Trainer(config_from_dict(_raw(cora, "toy", tmp_path / "toy"))).fit()
    ref = Trainer(config_from_dict(_raw(cora, "single", tmp_path / "single"))).fit()
    assert toy["engine"] == "toy" and ref["engine"] == "single"
    a, b = _losses(tmp_path / "toy"), _losses(tmp_path / "single")
    assert len(a) == 4 and a[-1] < a[0]
    assert a == pytest.approx(b, rel=1e-10, abs=1e-12)


def test_an_engines_options_are_its_own(cora, tmp_path, registered):
    config_from_dict(_raw(cora, "toy", tmp_path, toy_log_every=2))  # its own option
    with pytest.raises(ConfigError, match=r"engine\.toy_log_every: only used by engine 'toy', but engine\.name is "
                                          r"'single'"):
        config_from_dict(_raw(cora, "single", tmp_path, toy_log_every=2))
    with pytest.raises(ConfigError, match=r"engine\.prefetch: only used by engine 'sar', but engine\.name is 'toy'"):
        config_from_dict(_raw(cora, "toy", tmp_path, prefetch=False))
    with pytest.raises(ConfigError, match=r"engine\.toy_log_every: must be a non-negative integer, got -1"):
        config_from_dict(_raw(cora, "toy", tmp_path, toy_log_every=-1))
    with pytest.raises(ValueError, match=r"'bogus' not an option of engine 'toy' \(its options: toy_log_every\)"):
        ToyEngine(str(cora), None, "cpu", None, {"bogus": 1})


def _dist_info(where: Path) -> dict:
    """A dist-info directory declaring the toy plug-ins' entry points, as `pip install` of a package would."""
    info = where / "toy_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hpc_graph.engines]\ntoy = toy_plugins:ToyEngine\n\n"
                                           "[hpc_graph.models]\ntoymean = toy_plugins:TOY_MODEL\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(where), str(PLUGINS), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_entry_points_bring_them_to_the_cli(cora, tmp_path, registered):
    """`hpc-graph train` finds the engine and the model through the entry-point groups of an installed package
    (a dist-info on the path), and trains them to the same losses as `single` in this process."""
    import yaml

    from hpc_graph.train.trainer import Trainer

    env = _dist_info(tmp_path / "site")
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(yaml.safe_dump(_raw(cora, "toy", tmp_path / "cli", epochs=3)))
    proc = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = tmp_path / "single"
    Trainer(config_from_dict(_raw(cora, "single", ref, epochs=3))).fit()
    assert _losses(tmp_path / "cli") == pytest.approx(_losses(ref), rel=1e-10, abs=1e-12)
    bad = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--set",
                          "engine.toy_log_every=-3"], env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "engine.toy_log_every: must be a non-negative integer, got -3" in bad.stderr


@pytest.mark.parametrize("engine", ["toy", "single"])
def test_the_planner_runs_a_registered_engine_and_model_on_shapes(cora, tmp_path, registered, engine):
    """The toy engine (its plan_graph) and the toy model are planned with nothing of theirs in hpc_graph/plan: the
    memory components of the step run on shapes equal the tensors of a real step, tensor by tensor."""
    from hpc_graph.engines import plannable_engines
    from hpc_graph.train.trainer import Trainer

    sys.path.insert(0, str(ROOT / "tests" / "plan"))
    from _measure import measure, mismatches, predict

    assert "toy" in plannable_engines()
    raw = _raw(cora, engine, tmp_path / "run", epochs=1)
    raw["data"]["feature_layout"] = "dense"  # the planner plans features dense (Cora's would go sparse)
    tr = Trainer(config_from_dict(raw))
    got, want = measure(tr), predict(tr)
    assert mismatches(got, want, 1) == [] and got["saved"] > 0 and got["graph"] > 0


def test_entry_points_bring_them_to_the_planner(cora, tmp_path):
    import yaml

    env = _dist_info(tmp_path / "site")
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(yaml.safe_dump(_raw(cora, "toy", tmp_path / "cli")))
    proc = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "plan", "--config", str(cfg), "--engines",
                           "toy,single", "--rates", "none", "--floor", "400MiB", "--json", str(tmp_path / "p.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(p["engine"], p["ranks"]): p for p in json.loads((tmp_path / "p.json").read_text())["predictions"]}
    toy, single = rows["toy", 1], rows["single", 1]
    # the same model and data: the same features and parameters; the toy engine's edge list is not a CSR
    assert toy["memory"]["features"] == single["memory"]["features"] > 0
    assert toy["memory"]["params"] == single["memory"]["params"] > 0
    assert toy["memory"]["graph"] != single["memory"]["graph"]
