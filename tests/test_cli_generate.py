"""``hpc-graph generate``: round trips through open_dataset, --force, and one-line errors that leave no file."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from data_io.dataset import open_dataset, validate_dataset
from data_io.generators import generate_csbm, generate_rmat
from hpc_graph.cli import main


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_rmat_round_trip(tmp_path, capsys):
    path = tmp_path / "r.h5"
    rc, out, _ = _run(["generate", "rmat", "-o", str(path), "--scale", "9", "--edge-factor", "4",
                       "--feat-dim", "8", "--num-classes", "3", "--seed", "5"], capsys)
    assert rc == 0
    assert validate_dataset(path) == []
    ref = generate_rmat(9, 4, feat_dim=8, num_classes=3, seed=5)
    with open_dataset(path) as ds:
        assert (ds.num_nodes, ds.num_edges, ds.feat_dim, ds.num_classes) == (512, ref.num_edges, 8, 3)
        np.testing.assert_array_equal(ds.indices(), ref.indices)
        np.testing.assert_array_equal(ds.feat_rows(0, 512), ref.feat)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "512 nodes" in lines[0] and f"{ref.num_edges} edges" in lines[0]
    assert lines[0].rstrip().endswith(" s")


def test_rmat_flags_turn_cleaning_off(tmp_path, capsys):
    path = tmp_path / "d.h5"
    rc, _, _ = _run(["generate", "rmat", "-o", str(path), "--scale", "7", "--edge-factor", "3", "--feat-dim", "0",
                     "--no-symmetrize", "--no-remove-self-loops", "--no-remove-duplicates"], capsys)
    assert rc == 0
    with open_dataset(path) as ds:
        assert ds.directed and ds.num_edges == 3 * 128 and ds.feat_dim == 0


def test_csbm_round_trip(tmp_path, capsys):
    path = tmp_path / "c.h5"
    rc, out, _ = _run(["generate", "csbm", "-o", str(path), "--num-nodes", "400", "--num-classes", "4",
                       "--avg-degree", "6", "--homophily", "0.7", "--feat-dim", "12", "--snr", "2",
                       "--power-law", "2.5", "--train-frac", "0.5", "--val-frac", "0.1", "--test-frac", "0.4",
                       "--seed", "3"], capsys)
    assert rc == 0
    assert validate_dataset(path) == []
    ref = generate_csbm(400, 4, avg_degree=6, homophily=0.7, feat_dim=12, snr=2, power_law=2.5,
                        train_frac=0.5, val_frac=0.1, test_frac=0.4, seed=3)
    with open_dataset(path) as ds:
        d = ds.load()
    for f in ("indptr", "indices", "feat", "label", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(d, f), getattr(ref, f))
    assert "400 nodes" in out and f"{ref.num_edges} edges" in out


def test_existing_output_needs_force(tmp_path, capsys):
    path = tmp_path / "c.h5"
    assert _run(["generate", "csbm", "-o", str(path), "--num-nodes", "50", "--feat-dim", "2"], capsys)[0] == 0
    before = path.read_bytes()
    rc, out, err = _run(["generate", "csbm", "-o", str(path), "--num-nodes", "60", "--feat-dim", "2"], capsys)
    assert rc != 0 and "--force" in err and out == ""
    assert path.read_bytes() == before
    rc, _, _ = _run(["generate", "csbm", "-o", str(path), "--num-nodes", "60", "--feat-dim", "2", "--force"], capsys)
    assert rc == 0 and open_dataset(path).num_nodes == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]


@pytest.mark.parametrize("argv, option", [
    (["rmat", "--scale", "0"], "--scale"),
    (["rmat", "--scale", "41"], "--scale"),
    (["rmat", "--scale", "5", "--edge-factor", "-2"], "--edge-factor"),
    (["rmat", "--scale", "3", "--num-classes", "9"], "--num-classes"),
    (["rmat", "--scale", "5", "--train-frac", "0.9", "--val-frac", "0.2"], "--train-frac"),
    (["csbm", "--avg-degree", "-1"], "--avg-degree"),
    (["csbm", "--homophily", "1.5"], "--homophily"),
    (["csbm", "--num-nodes", "5", "--num-classes", "6"], "--num-classes"),
    (["csbm", "--power-law", "1.5"], "--power-law"),
    (["csbm", "--test-frac", "-0.1"], "--test-frac"),
    (["csbm", "--feat-dim", "-3"], "--feat-dim"),
])
def test_bad_option_is_one_line_error_and_no_file(tmp_path, capsys, argv, option):
    path = tmp_path / "bad.h5"
    rc, out, err = _run(["generate", argv[0], "-o", str(path), *argv[1:]], capsys)
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "error" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_missing_output_folder_is_an_error(tmp_path, capsys):
    rc, _, err = _run(["generate", "rmat", "-o", str(tmp_path / "no" / "x.h5"), "--scale", "4"], capsys)
    assert rc != 0 and "does not exist" in err


def test_console_exit_status(tmp_path):
    path = tmp_path / "x.h5"
    res = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "generate", "rmat", "-o", str(path),
                          "--scale", "-1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--scale" in res.stderr and not path.exists()


# -- memory check before starting ----------------------------------------------------------------

def test_impossible_size_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HPC_GRAPH_MEMORY_LIMIT", raising=False)
    path = tmp_path / "x.h5"
    rc, out, err = _run(["generate", "rmat", "--scale", "40", "-o", str(path)], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1
    assert "generate rmat --scale 40" in lines[0] and "needs about" in lines[0] and "--force" in lines[0]
    assert "TiB" in lines[0] and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_impossible_size_console(tmp_path):
    path = tmp_path / "x.h5"
    res = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "rmat", "--scale", "40",
                          "-o", str(path)], capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "--force" in lines[0] and "Traceback" not in res.stderr
    assert not path.exists()


@pytest.mark.parametrize("argv", [
    ["rmat", "--scale", "6", "--edge-factor", "4", "--feat-dim", "4"],
    ["csbm", "--num-nodes", "200", "--feat-dim", "4", "--edge-types", "2"],
    ["reg3cc", "--num-graphs", "20"],
    ["pathspd", "--num-graphs", "20"],
])
def test_low_memory_limit_refuses_then_force_runs(tmp_path, capsys, monkeypatch, caplog, argv):
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "1MB")
    path = tmp_path / "g.h5"
    rc, out, err = _run(["generate", argv[0], "-o", str(path), *argv[1:]], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1
    assert f"generate {argv[0]}" in lines[0] and "HPC_GRAPH_MEMORY_LIMIT" in lines[0] and "--force" in lines[0]
    assert list(tmp_path.iterdir()) == []
    with caplog.at_level("WARNING", logger="data_io.memory"):
        rc, out, _ = _run(["generate", argv[0], "-o", str(path), *argv[1:], "--force"], capsys)
    assert rc == 0 and validate_dataset(path) == []
    assert any("going on because of --force" in r.getMessage() for r in caplog.records)
