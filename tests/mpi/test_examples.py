"""The scripts of examples/ run as their docstrings say, on Cora, each checked against one process (``single``):
a layer of one's own (GIN) and a message function of one's own (GATv2) on ``sar`` over 2 ranks, a PyG ``Data``
partitioned and trained with ``dp``, predictions written by 2 ranks into one file. examples/custom_loop.py:
tests/mpi/test_user_model.py."""
from __future__ import annotations

import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

from _run import REPO, run_mpi

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    from data_io.converters.npz import convert_npz
    from data_io.partitioner import partition_dataset

    work = tmp_path_factory.mktemp("cora")
    convert_npz(REPO / "tests" / "data" / "cora.npz", work / "cora.h5")
    partition_dataset(work / "cora.h5", work / "cora-2parts", 2, "metis", seed=0)
    return work


def _one(args, cwd, timeout=240):
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _losses(text):
    return [float(x) for x in re.findall(r"^epoch \d+: loss (\S+)$", text, re.M)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("script,epochs", [("custom_layer.py", 6), ("message_passing.py", 4)])
def test_layer_of_ones_own_on_sar_matches_single(cora, tmp_path, script, epochs):
    args = ["--epochs", str(epochs)]
    one = _one([EXAMPLES / script, cora / "cora.h5", "--engine", "single", *args], tmp_path)
    two = run_mpi([EXAMPLES / script, cora / "cora-2parts", "--engine", "sar", *args], 2, timeout=300,
                  cwd=tmp_path).stdout
    want, got = _losses(one), _losses(two)
    assert len(want) == len(got) == epochs
    assert all(abs(g - w) <= 1e-10 * max(1.0, abs(w)) for g, w in zip(got, want)), (got, want)


@pytest.mark.timeout(400)
def test_from_pyg_trains_as_single_on_the_same_file(tmp_path):
    out = tmp_path / "pyg"
    _one([EXAMPLES / "from_pyg.py", "--out", out], tmp_path)
    two = run_mpi([EXAMPLES / "from_pyg.py", "--out", out, "--train", "--epochs", "10"], 2, timeout=300,
                  cwd=tmp_path).stdout
    got = float(re.search(r"test accuracy (\S+)", two).group(1))
    import hpc_graph as hg
    config = hg.load_config(REPO / "configs" / "dp_gcn.yaml", [
        f"data.path={out / 'graph.h5'}", "engine.name=single", "train.epochs=10", "train.progress=false",
        f"train.run_dir={tmp_path / 'ref'}"])
    want = hg.Trainer(config, hg.init("local")).fit()["test_acc"]
    assert f"{got:.4f}" == f"{want:.4f}"
    assert "rank 0 holds" in two


@pytest.mark.timeout(400)
def test_predictions_from_two_ranks_match_one_process(cora, tmp_path):
    args = ["--epochs", "5", "--dtype", "float64", "--engine"]
    _one([EXAMPLES / "predictions.py", cora / "cora.h5", "--out", tmp_path / "one.h5", *args, "single"], tmp_path)
    run_mpi([EXAMPLES / "predictions.py", cora / "cora-2parts", "--out", tmp_path / "two.h5", *args, "sar"], 2,
            timeout=300, cwd=tmp_path)
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        want, got = a["node/output"][:], b["node/output"][:]
        assert b["node/output"].attrs["engine"] == "sar" and a["node/output"].attrs["epoch"] == \
            b["node/output"].attrs["epoch"]
    assert want.shape == got.shape == (2708, 7) and not np.isnan(got).any()
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
