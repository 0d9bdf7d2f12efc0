"""configs/*.yaml: one valid example per engine x model, each saying how to make its data; one runs."""
import json
import os
from pathlib import Path

import pytest

from data_io.converters import convert_npz
from hpc_graph.train.config import load_config
from hpc_graph.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
DATASETS = Path(os.environ.get("HPC_GRAPH_DATASETS", REPO / "tests" / "data"))


def test_one_config_per_engine_and_model():
    names = {p.stem for p in CONFIGS}
    assert names >= {f"{e}_{m}" for e in ("single", "dp", "sar") for m in ("gcn", "sage", "gat")}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid_and_documents_its_data(path):
    cfg = load_config(path)
    engine, model = path.stem.split("_")[:2]  # ENGINE_MODEL[_DATA].yaml
    assert cfg.engine.name == engine and cfg.model.name == model
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    text = "\n".join(header)
    assert ("hpc-graph convert" in text or "hpc-graph generate" in text) and cfg.data.path in text
    if engine == "single":
        assert "hpc-graph train --config configs/" + path.name in text
    elif engine == "flow":  # every rank reads the dataset file: nothing to partition
        assert f"mpiexec -n 4 hpc-graph train --config configs/{path.name}" in text
    else:
        assert "hpc-graph partition" in text and f"mpiexec -n 4 hpc-graph train --config configs/{path.name}" in text


def test_single_gcn_config_trains_on_cora(tmp_path):
    cora = convert_npz(DATASETS / "cora.npz", tmp_path / "cora.h5")
    cfg = load_config(REPO / "configs" / "single_gcn.yaml",
                      [f"data.path={cora}", "train.epochs=15", "train.progress=false",
                       f"train.run_dir={tmp_path / 'run'}"])
    summary = Trainer(cfg).fit()
    assert summary["engine"] == "single" and summary["epochs"] == 15
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["best_val_acc"] == summary["best_val_acc"]
    assert summary["best_val_acc"] > 0.5  # 7 classes; a working GCN passes 0.5 within 15 epochs
