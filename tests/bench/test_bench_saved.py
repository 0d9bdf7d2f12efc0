"""benchmarks/bench_saved.py runs on one process and counts what a GAT keeps for backward."""
import importlib.util
import json
from pathlib import Path

import yaml

from data_io.dataset import open_dataset
from data_io.generators.csbm import write_csbm

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_saved.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_saved", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_saved_counts_a_gat_forward(tmp_path, capsys):
    data = tmp_path / "g.h5"
    write_csbm(data, num_nodes=90, num_classes=3, avg_degree=4.0, feat_dim=6, seed=2)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"path": str(data)},
                                   "model": {"name": "gat", "hidden": 4, "heads": 2, "num_layers": 2,
                                             "dropout": 0.0},
                                   "train": {"run_dir": str(tmp_path / "run")}}))
    out_json = tmp_path / "saved.json"
    assert _load().main(["--config", str(cfg), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    (rec,) = json.loads(out_json.read_text())
    with open_dataset(data) as ds:
        n, e = ds.num_nodes, ds.num_edges
    assert rec["engine"] == "single" and rec["owned"] == n and rec["edges"] == e
    # at least the first layer's input (the features, n x 6 float32) and the final output's z
    assert rec["saved_bytes"] >= n * 6 * 4 + n * 3 * 4
    assert f"kept for backward {rec['saved_bytes'] / 2**20:.1f} MiB" in text
