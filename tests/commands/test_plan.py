"""`hpc-graph plan`: the apt engine's predictions without training; bad configs as one line, exit 2."""
import json

import yaml

from data_io.generators.csbm import write_csbm
from hpc_graph.cli import main


def _cfg(tmp_path, **sections):
    path = tmp_path / "g.h5"
    write_csbm(path, num_nodes=150, num_classes=3, avg_degree=5.0, feat_dim=8, seed=2)
    raw = {"data": {"path": str(path)}, "engine": {"name": "apt", "dry_run_batches": 4, "profile_mb": 0.01},
           "sampler": {"fanouts": [3, 2], "batch_size": 16}, "model": {"name": "sage", "hidden": 8},
           "train": {"epochs": 2, "progress": False, "run_dir": str(tmp_path / "run")}}
    for k, v in sections.items():
        raw[k] = v
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_plan_prints_the_table_and_writes_json(tmp_path, capsys):
    out_json = tmp_path / "plan.json"
    rc = main(["-q", "plan", "--config", _cfg(tmp_path), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    plan = json.loads(out_json.read_text())
    assert set(plan["strategies"]) == {"gdp", "nfp", "snp", "dnp"}
    fitting = {s: v["epoch_seconds"] for s, v in plan["strategies"].items() if v["fits"]}
    assert plan["choice"] == min(fitting, key=fitting.get)
    assert out.count("<- chosen") == 1 and f"choice: {plan['choice']}" in out
    assert not (tmp_path / "run").exists()  # nothing trained


def test_plan_refuses_other_engines(tmp_path, capsys):
    rc = main(["-q", "plan", "--config", _cfg(tmp_path, engine={"name": "dp"}, sampler={})])
    err = capsys.readouterr().err
    assert rc == 2 and "engine.name" in err and err.count("\n") == 1
