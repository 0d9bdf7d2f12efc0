"""npz converter: Cora and random archives round-trip exactly; bad archives fail cleanly."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from data_io.converters import convert_npz, read_npz
from data_io.dataset import MASKS, open_dataset
from data_io.errors import DataError, FormatError
from hpc_graph.cli import main

REPO = Path(__file__).resolve().parents[2]
DATASETS = Path(os.environ.get("HPC_GRAPH_DATASETS", REPO / "tests" / "data"))


def _edges_in_csr_order(edge_index, weight=None):
    """Reference: edges sorted by (dst, src), ties in input order (stable)."""
    order = np.lexsort((edge_index[0], edge_index[1]))
    return edge_index[0][order], edge_index[1][order], None if weight is None else weight[order]


def _check_round_trip(npz_path: Path, out: Path):
    ref = dict(np.load(npz_path))
    convert_npz(npz_path, out)
    with open_dataset(out) as ds:
        g = ds.load()
        attrs = ds.attrs()
    n = ref["x"].shape[0]
    src, dst = g.edge_sources_destinations()
    rs, rd, rw = _edges_in_csr_order(ref["edge_index"], ref.get("edge_weight"))
    np.testing.assert_array_equal(src, rs)
    np.testing.assert_array_equal(dst, rd)
    assert g.num_nodes == n and g.num_edges == ref["edge_index"].shape[1]
    if rw is None:
        assert g.edge_weight is None
    else:
        np.testing.assert_array_equal(g.edge_weight, rw.astype(np.float32))
    np.testing.assert_array_equal(g.feat, ref["x"].astype(np.float32))
    np.testing.assert_array_equal(g.label, ref["y"])
    for m in MASKS:
        np.testing.assert_array_equal(getattr(g, m), ref[m])
    assert attrs["num_classes"] == int(ref["y"].max()) + 1
    pairs = set(zip(*ref["edge_index"].tolist()))
    assert bool(attrs["directed"]) == (pairs != {(b, a) for a, b in pairs})
    return g


def test_cora_round_trip(tmp_path):
    cora = DATASETS / "cora.npz"
    assert cora.is_file(), f"{cora} missing: set HPC_GRAPH_DATASETS to a folder holding cora.npz"
    g = _check_round_trip(cora, tmp_path / "cora.h5")
    assert g.name == "cora" and not g.directed


def _random_npz(path: Path, seed: int, n=50, e=300, f=7, c=4, weighted=True, **override):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, e))
    ei[:, :20] = ei[:, 20:40]  # duplicate edges: kept as given
    arrays = dict(edge_index=ei, x=rng.standard_normal((n, f)).astype(np.float32),
                  y=rng.integers(0, c, n), train_mask=rng.random(n) < 0.3,
                  val_mask=rng.random(n) < 0.3, test_mask=rng.random(n) < 0.3)
    if weighted:
        arrays["edge_weight"] = rng.random(e)
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(path, **arrays)
    return arrays


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_round_trip(tmp_path, seed):
    _random_npz(tmp_path / "r.npz", seed, weighted=seed != 2)
    g = _check_round_trip(tmp_path / "r.npz", tmp_path / "r.h5")
    assert g.directed


def test_symmetric_undirected_and_inferred_nodes(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 30, size=(2, 60))
    ei = np.concatenate([a, a[::-1]], axis=1)
    np.savez(tmp_path / "s.npz", edge_index=ei, num_nodes=np.int64(40))  # no x/y: structure only
    g = read_npz(tmp_path / "s.npz")
    assert g.num_nodes == 40 and not g.directed and g.feat is None and g.num_classes == 0
    np.savez(tmp_path / "t.npz", edge_index=ei)
    assert read_npz(tmp_path / "t.npz").num_nodes == int(ei.max()) + 1


def test_features_unchanged_and_int_masks(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 5, size=(50, 3)).astype(np.float64)  # not row-normalised on conversion
    arrays = _random_npz(tmp_path / "r.npz", 4, x=x, train_mask=(rng.random(50) < 0.5).astype(np.int8))
    g = read_npz(tmp_path / "r.npz")
    np.testing.assert_array_equal(g.feat, x.astype(np.float32))
    np.testing.assert_array_equal(g.train_mask, arrays["train_mask"].astype(bool))


@pytest.mark.parametrize("override,key,what", [
    (dict(edge_index=None), "edge_index", "missing key"),
    (dict(edge_index=np.zeros((3, 5), np.int64)), "edge_index", "shape"),
    (dict(edge_index=np.zeros((2, 5), np.float32)), "edge_index", "integer"),
    (dict(edge_index=np.array([[0, 1, -2], [1, 2, 3]]), edge_weight=None), "edge_index", "negative"),
    (dict(edge_index=np.array([[0, 1, 50], [1, 2, 3]]), edge_weight=None), "edge_index", "out of range"),
    (dict(x=np.zeros((49, 7), np.float32)), "y", "N from x"),
    (dict(x=np.zeros(50, np.float32)), "x", "shape"),
    (dict(x=np.full((50, 7), np.nan, np.float32)), "x", "NaN"),
    (dict(y=np.zeros(50, np.float32)), "y", "integer"),
    (dict(y=np.zeros(51, np.int64)), "y", "shape"),
    (dict(y=np.full(50, -3)), "y", "-3"),
    (dict(val_mask=np.zeros(49, bool)), "val_mask", "shape"),
    (dict(test_mask=np.full(50, 2)), "test_mask", "bool"),
    (dict(edge_weight=np.ones(299)), "edge_weight", "shape"),
])
def test_bad_archives(tmp_path, override, key, what):
    _random_npz(tmp_path / "bad.npz", 5, **override)
    out = tmp_path / "out.h5"
    with pytest.raises(FormatError) as err:
        convert_npz(tmp_path / "bad.npz", out)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'bad.npz'}: {key}: ") and what in msg, msg
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


def test_not_an_archive(tmp_path):
    (tmp_path / "junk.npz").write_text("not a zip file")
    with pytest.raises(DataError, match="junk.npz: not a readable .npz"):
        convert_npz(tmp_path / "junk.npz", tmp_path / "o.h5")
    with pytest.raises(DataError, match="no such file"):
        convert_npz(tmp_path / "missing.npz", tmp_path / "o.h5")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(DataError, match="not an .npz archive"):
        convert_npz(tmp_path / "single.npy", tmp_path / "o.h5")
    assert not (tmp_path / "o.h5").exists()


def test_force_and_cli(tmp_path, capsys):
    _random_npz(tmp_path / "r.npz", 6)
    out = tmp_path / "r.h5"
    assert main(["convert", "npz", str(tmp_path / "r.npz"), "-o", str(out)]) == 0
    assert "50 nodes" in capsys.readouterr().out
    before = out.stat().st_mtime_ns
    rc = main(["convert", "npz", str(tmp_path / "r.npz"), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "output exists" in err[0]
    assert out.stat().st_mtime_ns == before
    _random_npz(tmp_path / "r.npz", 7, n=60)
    assert main(["convert", "npz", str(tmp_path / "r.npz"), "-o", str(out), "--force"]) == 0
    with open_dataset(out) as ds:
        assert ds.num_nodes == 60
    # a bad archive through the CLI: one line naming file and key, no output
    _random_npz(tmp_path / "bad.npz", 8, y=np.zeros(3, np.int64))
    rc = main(["convert", "npz", str(tmp_path / "bad.npz"), "-o", str(tmp_path / "bad.h5")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "bad.npz: y:" in err[0]
    assert not (tmp_path / "bad.h5").exists()


def test_memory_check_refuses_then_force(tmp_path, capsys, monkeypatch):
    _random_npz(tmp_path / "r.npz", 9)
    out = tmp_path / "r.h5"
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "1MB")
    rc = main(["convert", "npz", str(tmp_path / "r.npz"), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "convert npz" in err[0] and "needs about" in err[0] and "--force" in err[0]
    assert not out.exists()
    assert main(["convert", "npz", str(tmp_path / "r.npz"), "-o", str(out), "--force"]) == 0
    with open_dataset(out) as ds:
        assert ds.num_nodes == 50
