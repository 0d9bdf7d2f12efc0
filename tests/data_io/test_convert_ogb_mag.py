"""OGB-MAG-style converter on a tiny heterogeneous folder, against a per-edge NumPy reference."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from data_io.converters import convert_ogb_mag
from data_io.dataset import open_dataset
from data_io.errors import DataError, FormatError
from hpc_graph.cli import main


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def _make_mag(root: Path, seed: int = 0) -> dict:
    """author/field/paper nodes, three relations, paper features (F=3), labels and a 'time' split."""
    rng = np.random.default_rng(seed)
    names, counts = ["author", "field_of_study", "paper"], [7, 4, 12]
    raw = root / "raw"
    _gz(raw / "num-node-dict.csv.gz", [",".join(names), ",".join(map(str, counts))])
    rels = {"author___writes___paper": (0, 2, 20), "paper___cites___paper": (2, 2, 25),
            "paper___has_topic___field_of_study": (2, 1, 15)}
    edges = {}
    for rel, (ts, td, e) in rels.items():
        s, d = rng.integers(0, counts[ts], e), rng.integers(0, counts[td], e)
        _gz(raw / "relations" / rel / "edge.csv.gz", [f"{a},{b}" for a, b in zip(s, d)])
        edges[rel] = (s, d, ts, td)
    feat = rng.standard_normal((counts[2], 3)).astype(np.float32)
    _gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", [",".join(f"{v:.9g}" for v in row) for row in feat])
    label = rng.integers(0, 5, counts[2])
    _gz(raw / "node-label" / "paper" / "node-label.csv.gz", [str(v) for v in label])
    perm = rng.permutation(counts[2])
    parts = np.split(perm, [6, 9])
    for stem, ids in zip(("train", "valid", "test"), parts):
        _gz(root / "split" / "time" / "paper" / f"{stem}.csv.gz", [str(i) for i in ids])
    return dict(names=names, counts=counts, edges=edges, feat=feat, label=label, parts=parts)


def _reference_edges(ref, reverse=True):
    """Sorted (dst, src, type) triples of the homogeneous typed graph."""
    offsets = np.concatenate([[0], np.cumsum(ref["counts"])])
    triples = []
    for k, rel in enumerate(sorted(ref["edges"])):
        s, d, ts, td = ref["edges"][rel]
        gs, gd = s + offsets[ts], d + offsets[td]
        triples += [(b, a, 2 * k if reverse else k) for a, b in zip(gs, gd)]
        if reverse:
            triples += [(a, b, 2 * k + 1) for a, b in zip(gs, gd)]
    return sorted(triples), offsets


@pytest.mark.parametrize("reverse", [True, False])
def test_converts_to_typed_graph(tmp_path, reverse):
    ref = _make_mag(tmp_path / "mag")
    out = convert_ogb_mag(tmp_path / "mag", tmp_path / "mag.h5", reverse=reverse)
    want, offsets = _reference_edges(ref, reverse)
    with open_dataset(out) as ds:
        g = ds.load()
        attrs = ds.attrs()
    src, dst = g.edge_sources_destinations()
    got = sorted(zip(dst.tolist(), src.tolist(), g.edge_type.tolist()))
    assert got == [tuple(map(int, t)) for t in want]
    n = int(offsets[-1])
    assert g.num_nodes == n and g.feat.shape == (n, 3 + 3)
    p0 = offsets[2]
    np.testing.assert_array_equal(g.feat[p0:, :3], ref["feat"])
    assert not g.feat[:p0, :3].any()
    for t in range(3):  # one-hot node type
        np.testing.assert_array_equal(g.feat[offsets[t]:offsets[t + 1], 3 + t], 1.0)
    assert g.feat[:, 3:].sum() == n
    np.testing.assert_array_equal(g.label[p0:], ref["label"])
    assert (g.label[:p0] == -1).all()
    for field, ids in zip(("train_mask", "val_mask", "test_mask"), ref["parts"]):
        mask = getattr(g, field)
        assert mask.sum() == len(ids) and mask[p0 + ids].all()
    assert json.loads(attrs["node_type_names"]) == ref["names"]
    names = json.loads(attrs["edge_type_names"])
    assert len(names) == (6 if reverse else 3) and names[0] == "author___writes___paper"


def test_cli_and_trains_rgcn(tmp_path, capsys):
    _make_mag(tmp_path / "mag")
    assert main(["-q", "convert", "ogb-mag", str(tmp_path / "mag"), "-o", str(tmp_path / "m.h5")]) == 0
    assert "wrote" in capsys.readouterr().out
    with open_dataset(tmp_path / "m.h5") as ds:
        assert ds.edge_type().max() == 5


def test_bad_inputs_leave_nothing(tmp_path):
    ref = _make_mag(tmp_path / "mag")
    with pytest.raises(DataError, match="--target"):
        convert_ogb_mag(tmp_path / "mag", tmp_path / "a.h5", target="venue")
    # an id beyond its node type's count names the file
    s, d, ts, td = ref["edges"]["paper___cites___paper"]
    _gz(tmp_path / "mag" / "raw" / "relations" / "paper___cites___paper" / "edge.csv.gz", ["0,12"])
    with pytest.raises(FormatError, match="paper___cites___paper"):
        convert_ogb_mag(tmp_path / "mag", tmp_path / "b.h5")
    (tmp_path / "mag" / "raw" / "relations" / "venue___x___paper").mkdir()
    with pytest.raises(DataError, match="venue___x___paper"):
        convert_ogb_mag(tmp_path / "mag", tmp_path / "c.h5")
    assert not any(tmp_path.glob("*.h5"))
    with pytest.raises(DataError, match="no such directory"):
        convert_ogb_mag(tmp_path / "nothing", tmp_path / "d.h5")


def test_memory_check_refuses_then_force(tmp_path, capsys, monkeypatch):
    ref = _make_mag(tmp_path / "mag", seed=3)
    out = tmp_path / "m.h5"
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "1MB")
    rc = main(["convert", "ogb-mag", str(tmp_path / "mag"), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "convert ogb-mag" in err[0] and "--force" in err[0]
    assert not out.exists()
    assert main(["convert", "ogb-mag", str(tmp_path / "mag"), "-o", str(out), "--force"]) == 0
    with open_dataset(out) as ds:
        assert ds.num_nodes == sum(ref["counts"])
