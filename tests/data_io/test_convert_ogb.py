"""OGB converter on tiny folders in the OGB node-property layout, against a NumPy reference."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from data_io.converters import convert_ogb
from data_io.dataset import open_dataset
from data_io.errors import DataError
from hpc_graph.cli import main


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def _make_ogb(root: Path, seed: int = 0, n: int = 40, e: int = 150, f: int = 5, c: int = 4,
              splits=("time",), nan_labels: int = 2):
    """A tiny ogbn-arxiv-like folder: directed edges, float features, labels with NaN, one split."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[0], dst[1] = n - 1, n - 1
    feat = rng.standard_normal((n, f)).astype(np.float32)
    label = rng.integers(0, c, n).astype(np.float64)
    label[rng.choice(n, nan_labels, replace=False)] = np.nan
    raw = root / "raw"
    _gz(raw / "edge.csv.gz", [f"{a},{b}" for a, b in zip(src, dst)])
    # 9 significant digits round-trip float32 exactly
    _gz(raw / "node-feat.csv.gz", [",".join(f"{v:.9g}" for v in row) for row in feat])
    _gz(raw / "node-label.csv.gz", ["nan" if np.isnan(v) else str(int(v)) for v in label])
    _gz(raw / "num-node-list.csv.gz", [str(n)])
    _gz(raw / "num-edge-list.csv.gz", [str(e)])
    perm = rng.permutation(n)
    parts = np.split(perm, [n // 2, 3 * n // 4])
    for name in splits:
        for stem, ids in zip(("train", "valid", "test"), parts):
            _gz(root / "split" / name / f"{stem}.csv.gz", [str(i) for i in ids])
    lab = np.where(np.isnan(label), -1, label).astype(np.int64)
    return dict(src=src, dst=dst, feat=feat, label=lab, parts=parts, n=n)


def _reference_csr(src, dst, n, symmetrize=False, dedup=False):
    s, d = (np.concatenate([src, dst]), np.concatenate([dst, src])) if symmetrize else (src, dst)
    pairs = list(zip(d.tolist(), s.tolist()))
    if dedup:
        pairs = list(dict.fromkeys(pairs))
    pairs.sort()
    indptr = np.searchsorted(np.array([p[0] for p in pairs]), np.arange(n + 1))
    return indptr, np.array([p[1] for p in pairs])


@pytest.mark.parametrize("symmetrize,dedup,chunk", [(False, False, 1 << 20), (True, True, 37)])
def test_tiny_folder(tmp_path, symmetrize, dedup, chunk):
    ref = _make_ogb(tmp_path / "ogbn_tiny", seed=1)
    out = tmp_path / "t.h5"
    convert_ogb(tmp_path / "ogbn_tiny", out, symmetrize=symmetrize, dedup=dedup, chunk_bytes=chunk)
    with open_dataset(out) as ds:
        g = ds.load()
        attrs = ds.attrs()
    n = ref["n"]
    indptr, indices = _reference_csr(ref["src"], ref["dst"], n, symmetrize, dedup)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    np.testing.assert_array_equal(g.feat, ref["feat"])
    np.testing.assert_array_equal(g.label, ref["label"])
    for mask, ids in zip((g.train_mask, g.val_mask, g.test_mask), ref["parts"]):
        np.testing.assert_array_equal(np.flatnonzero(mask), np.sort(ids))
    assert attrs["num_classes"] == int(ref["label"].max()) + 1
    assert bool(attrs["directed"]) == (not symmetrize)
    assert attrs["name"] == "ogbn_tiny"


def test_optional_files_and_split_choice(tmp_path):
    root = tmp_path / "d"
    ref = _make_ogb(root, seed=2, splits=("a", "b"))
    with pytest.raises(DataError, match="several splits"):
        convert_ogb(root, tmp_path / "o.h5")
    with pytest.raises(DataError, match="missing split folder"):
        convert_ogb(root, tmp_path / "o.h5", split="zzz")
    convert_ogb(root, tmp_path / "o.h5", split="b")
    # no features, labels or node count: N = max id + 1, structure only
    for name in ("node-feat", "node-label", "num-node-list"):
        (root / "raw" / f"{name}.csv.gz").unlink()
    convert_ogb(root, tmp_path / "p.h5", split="a")
    with open_dataset(tmp_path / "p.h5") as ds:
        g = ds.load()
    n = int(max(ref["src"].max(), ref["dst"].max())) + 1
    assert g.num_nodes == n and g.feat is None and g.label is None
    np.testing.assert_array_equal(g.indices, _reference_csr(ref["src"], ref["dst"], n)[1])
    # plain .csv instead of .csv.gz
    with gzip.open(root / "raw" / "edge.csv.gz", "rb") as fi:
        (root / "raw" / "edge.csv").write_bytes(fi.read())
    (root / "raw" / "edge.csv.gz").unlink()
    convert_ogb(root, tmp_path / "q.h5", split="a")
    with open_dataset(tmp_path / "q.h5") as ds:
        np.testing.assert_array_equal(ds.indices(), g.indices)


def _expect_error(root, out, match, **kw):
    with pytest.raises(DataError) as err:
        convert_ogb(root, out, **kw)
    assert match in str(err.value), str(err.value)
    assert not out.exists()
    assert not list(out.parent.glob(".*tmp*"))
    return str(err.value)


def test_bad_folders(tmp_path):
    root = tmp_path / "d"
    out = tmp_path / "o.h5"
    _make_ogb(root, seed=3)
    raw = root / "raw"
    msg = _expect_error(tmp_path / "nope", out, "no such directory")
    # missing edge file
    (raw / "edge.csv.gz").rename(raw / "edge.bak")
    msg = _expect_error(root, out, "missing")
    assert str(raw / "edge.csv.gz") in msg
    (raw / "edge.bak").rename(raw / "edge.csv.gz")
    # missing split file
    (root / "split" / "time" / "valid.csv.gz").unlink()
    msg = _expect_error(root, out, "valid.csv.gz: missing")
    _gz(root / "split" / "time" / "valid.csv.gz", ["0", "40"])
    msg = _expect_error(root, out, "out of range")
    assert msg.startswith(f"{root / 'split' / 'time' / 'valid.csv.gz'}: line 2:")
    _gz(root / "split" / "time" / "valid.csv.gz", ["0", "", "1", "1.5"])  # blank line counted
    msg = _expect_error(root, out, "not an integer")
    assert ": line 4:" in msg
    _gz(root / "split" / "time" / "valid.csv.gz", ["0", "1"])
    _gz(raw / "node-label.csv.gz", ["1"] * 20 + ["-4"] + ["1"] * 19)
    msg = _expect_error(root, out, "negative label", chunk_bytes=8)
    assert msg.startswith(f"{raw / 'node-label.csv.gz'}: line 21:")
    _gz(raw / "node-label.csv.gz", ["1", "2.5"] + ["1"] * 38)
    _expect_error(root, out, "line 2: label 2.5 is not an integer")
    _gz(raw / "node-label.csv.gz", ["1"] * 40)
    # malformed edge line
    _gz(raw / "edge.csv.gz", ["0,1", "2,3", "4;5"])
    msg = _expect_error(root, out, "line 3", chunk_bytes=4)
    assert msg.startswith(str(raw / "edge.csv.gz"))
    _gz(raw / "edge.csv.gz", ["0,1", "2,-3"])
    _expect_error(root, out, "negative")
    _gz(raw / "edge.csv.gz", ["0,1", "2,40"])
    _expect_error(root, out, "out of range")
    _gz(raw / "edge.csv.gz", ["0,1", "2,3"])
    # label / feature counts that disagree with num-node-list
    _gz(raw / "node-label.csv.gz", ["1"] * 39)
    _expect_error(root, out, "39 labels for 40 nodes")
    _gz(raw / "node-label.csv.gz", ["1"] * 40)
    _gz(raw / "node-feat.csv.gz", ["0.5,1"] * 39)
    _expect_error(root, out, "39 feature rows for 40 nodes")
    _gz(raw / "node-feat.csv.gz", ["0.5,1"] * 41)
    _expect_error(root, out, "more feature rows", chunk_bytes=16)
    _gz(raw / "node-feat.csv.gz", ["0.5,1"] * 20 + ["0.5"] + ["0.5,1"] * 19)
    msg = _expect_error(root, out, "line 21")
    _gz(raw / "node-feat.csv.gz", ["0.5,1"] * 40)
    _gz(raw / "num-node-list.csv.gz", ["40", "12"])
    _expect_error(root, out, "graph-property")
    _gz(raw / "num-node-list.csv.gz", ["40"])
    (root / "raw" / "edge.csv.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    _expect_error(root, out, "read failed")


def test_cli(tmp_path, capsys):
    root = tmp_path / "ogbn_x"
    ref = _make_ogb(root, seed=4)
    out = tmp_path / "x.h5"
    assert main(["convert", "ogb", str(root), "-o", str(out), "--symmetrize", "--split", "time"]) == 0
    assert f"{ref['n']} nodes" in capsys.readouterr().out
    (root / "raw" / "edge.csv.gz").unlink()
    rc = main(["convert", "ogb", str(root), "-o", str(tmp_path / "y.h5")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "edge.csv.gz: missing" in err[0]
    assert not (tmp_path / "y.h5").exists()


def test_memory_check_refuses_then_force(tmp_path, capsys, monkeypatch):
    root = tmp_path / "ogbn_tiny"
    _make_ogb(root, seed=5)
    out = tmp_path / "o.h5"
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "1MB")
    rc = main(["convert", "ogb", str(root), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "convert ogb" in err[0] and "--force" in err[0]
    assert not out.exists()
    assert main(["convert", "ogb", str(root), "-o", str(out), "--force"]) == 0
    with open_dataset(out) as ds:
        assert ds.num_nodes == 40
