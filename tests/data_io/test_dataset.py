"""Dataset format v1 (data_io/dataset.py): round trips on random graphs and every validation error."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from data_io.dataset import (FORMAT, MASKS, VERSION, DatasetWriter, GraphData, open_dataset,
                             validate_dataset, write_dataset)
from data_io.errors import DataError, FormatError, OutputExistsError


def _random_graph(seed: int, n: int = 50, e: int = 300, f: int = 6, c: int = 4, optional: bool = True,
                  index_dtype=np.int32) -> GraphData:
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    indptr = np.searchsorted(dst, np.arange(n + 1)).astype(np.int64)
    indices = rng.integers(0, n, e).astype(index_dtype)
    g = GraphData(indptr=indptr, indices=indices, name=f"g{seed}", num_classes=c if optional else 0,
                  directed=bool(seed % 2))
    if optional:
        g.feat = rng.standard_normal((n, f)).astype(np.float32)
        g.label = rng.integers(-1, c, n)
        for m in MASKS:
            setattr(g, m, rng.random(n) < 0.3)
        g.edge_weight = rng.random(e).astype(np.float32)
        g.edge_type = rng.integers(0, 3, e).astype(np.int16)
    return g


def _assert_same(a: GraphData, b: GraphData) -> None:
    for field in ("indptr", "indices", "feat", "label", *MASKS, "edge_weight", "edge_type"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        if x is not None:
            assert x.dtype == y.dtype, field
            np.testing.assert_array_equal(x, y, err_msg=field)
    assert (a.name, a.num_classes, bool(a.directed), a.task) == (b.name, b.num_classes, bool(b.directed), b.task)


# -- round trips ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,optional,index_dtype", [(0, True, np.int32), (1, True, np.int64),
                                                       (2, False, np.int32), (3, True, np.int32)])
def test_round_trip(tmp_path, seed, optional, index_dtype):
    g = _random_graph(seed, optional=optional, index_dtype=index_dtype)
    write_dataset(tmp_path / "g.h5", g)
    assert validate_dataset(tmp_path / "g.h5") == []
    with open_dataset(tmp_path / "g.h5") as ds:
        assert (ds.num_nodes, ds.num_edges, ds.feat_dim) == (g.num_nodes, g.num_edges, g.feat_dim)
        _assert_same(ds.load(), g)
        attrs = ds.attrs()
        assert attrs["format"] == FORMAT and attrs["version"] == VERSION
        assert attrs["num_nodes"] == g.num_nodes and attrs["num_edges"] == g.num_edges
        if optional:
            ids = np.random.default_rng(seed).integers(0, g.num_nodes, 40)
            np.testing.assert_array_equal(ds.feat_take(ids), g.feat[ids])
            np.testing.assert_array_equal(ds.feat_rows(5, 17), g.feat[5:17])
            assert ds.load(features=False).feat is None
        else:
            assert not ds.has("feat") and ds.edge_weight() is None
            with pytest.raises(FormatError, match="/node/label: missing"):
                ds.label()
    src, dst = g.edge_sources_destinations()
    np.testing.assert_array_equal(dst, np.repeat(np.arange(g.num_nodes), np.diff(g.indptr)))
    np.testing.assert_array_equal(src, g.indices)


def test_writer_in_row_blocks(tmp_path):
    g = _random_graph(4, n=97, f=5)
    with DatasetWriter(tmp_path / "g.h5", num_nodes=97, feat_dim=5, name=g.name, num_classes=4,
                       directed=g.directed) as w:
        w.write_graph(g.indptr, g.indices, g.edge_weight, g.edge_type)
        for start in range(0, 97, 10):  # features in blocks, last one short
            w.write_feat(start, g.feat[start:start + 10])
        w.write_node("label", g.label)
        for m in MASKS:
            w.write_node(m, getattr(g, m))
        assert not (tmp_path / "g.h5").exists()  # appears only on success
    with open_dataset(tmp_path / "g.h5") as ds:
        _assert_same(ds.load(), g)


# -- validation errors, in memory and on disk ---------------------------------------------------

def _h5_paths(g: GraphData) -> dict[str, np.ndarray]:
    out = {"graph/indptr": g.indptr, "graph/indices": g.indices}
    for k, p in (("edge_weight", "graph/edge_weight"), ("edge_type", "graph/edge_type"), ("feat", "node/feat"),
                 ("label", "node/label"), *((m, f"node/{m}") for m in MASKS)):
        if getattr(g, k) is not None:
            out[p] = getattr(g, k)
    return out


def _write_raw(path: Path, arrays: dict[str, np.ndarray], attrs: dict) -> None:
    """Write an HDF5 file directly (bypassing all checks) to fake a broken dataset."""
    with h5py.File(path, "w") as h5:
        for p, a in arrays.items():
            h5.create_dataset(p, data=a)
        for k, v in attrs.items():
            h5.attrs[k] = v


def _attrs(g: GraphData) -> dict:
    return dict(format=FORMAT, version=VERSION, name=g.name, task="node", num_nodes=g.num_nodes,
                num_edges=g.num_edges, num_classes=g.num_classes, directed=g.directed)


def _bad_indptr_drop(g):
    g.indptr = g.indptr.copy()
    g.indptr[10], g.indptr[11] = g.indptr[11] + 1, g.indptr[11]  # a drop after row 10


CASES = {
    # name: (mutation of a valid GraphData, field named, words in the message)
    "indptr_dtype": (lambda g: setattr(g, "indptr", g.indptr.astype(np.int32)), "/graph/indptr", "int64"),
    "indices_dtype": (lambda g: setattr(g, "indices", g.indices.astype(np.float32)), "/graph/indices",
                      "int32 or int64"),
    "feat_dtype": (lambda g: setattr(g, "feat", g.feat.astype(np.float64)), "/node/feat", "float32"),
    "label_dtype": (lambda g: setattr(g, "label", g.label.astype(np.int32)), "/node/label", "int64"),
    "mask_dtype": (lambda g: setattr(g, "val_mask", g.val_mask.astype(np.uint8)), "/node/val_mask", "bool"),
    "weight_dtype": (lambda g: setattr(g, "edge_weight", g.edge_weight.astype(np.float64)), "/graph/edge_weight",
                     "float32"),
    "type_dtype": (lambda g: setattr(g, "edge_type", g.edge_type.astype(np.int32)), "/graph/edge_type", "int16"),
    "index_out_of_range": (lambda g: g.indices.__setitem__(7, g.num_nodes), "/graph/indices", "out of range"),
    "negative_index": (lambda g: g.indices.__setitem__(3, -2), "/graph/indices", "negative index -2"),
    "indptr_not_monotone": (_bad_indptr_drop, "/graph/indptr", "first drop at row 10"),
    "indptr_start": (lambda g: setattr(g, "indptr", g.indptr + 1), "/graph/indptr", "indptr[0] must be 0"),
    "indptr_end": (lambda g: setattr(g, "indices", g.indices[:-1]), "/graph/indptr", "does not match"),
    "indptr_2d": (lambda g: setattr(g, "indptr", g.indptr[:, None]), "/graph/indptr", "1-D"),
    "feat_rows": (lambda g: setattr(g, "feat", g.feat[:-1]), "/node/feat", "expected shape"),
    "label_len": (lambda g: setattr(g, "label", g.label[1:]), "/node/label", "expected shape"),
    "mask_len": (lambda g: setattr(g, "test_mask", g.test_mask[1:]), "/node/test_mask", "expected shape"),
    "weight_len": (lambda g: setattr(g, "edge_weight", g.edge_weight[1:]), "/graph/edge_weight", "expected shape"),
    "type_len": (lambda g: setattr(g, "edge_type", g.edge_type[1:]), "/graph/edge_type", "expected shape"),
    "weight_nan": (lambda g: g.edge_weight.__setitem__(0, np.nan), "/graph/edge_weight", "NaN"),
    "type_negative": (lambda g: g.edge_type.__setitem__(5, -1), "/graph/edge_type", "negative"),
    "label_too_big": (lambda g: g.label.__setitem__(2, g.num_classes), "/node/label", ">= num_classes"),
    "label_below_minus_one": (lambda g: g.label.__setitem__(2, -2), "/node/label", "< -1"),
    "empty_graph": (lambda g: (setattr(g, "indptr", np.zeros(1, np.int64)),
                               setattr(g, "indices", np.zeros(0, np.int32))), "/graph/indptr", "empty graph"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validation_errors(tmp_path, case):
    mutate, field, words = CASES[case]
    g = _random_graph(5)
    mutate(g)
    # in memory: validate() and write_dataset() refuse, nothing is written
    with pytest.raises(FormatError) as err:
        g.validate("mem")
    assert err.value.field == field and words in err.value.message, str(err.value)
    with pytest.raises(FormatError) as err:
        write_dataset(tmp_path / "w.h5", g)
    assert err.value.field == field and err.value.path == str(tmp_path / "w.h5")
    assert list(tmp_path.iterdir()) == []
    # on disk (a broken file written behind the library's back): the reader names file and field
    bad = tmp_path / "bad.h5"
    _write_raw(bad, _h5_paths(g), _attrs(g))
    with pytest.raises(FormatError) as err:
        open_dataset(bad)
    assert err.value.field == field and err.value.path == str(bad) and words in err.value.message
    probs = validate_dataset(bad)
    assert probs and probs[0].startswith(f"{bad}: {field}: ")


def test_value_errors_skipped_without_check_values(tmp_path):
    g = _random_graph(6)
    g.indices[0] = g.num_nodes + 5
    _write_raw(tmp_path / "bad.h5", _h5_paths(g), _attrs(g))
    with open_dataset(tmp_path / "bad.h5", check_values=False) as ds:  # cheap open: only shapes/dtypes
        assert ds.num_edges == g.num_edges
    with pytest.raises(FormatError, match="out of range"):
        open_dataset(tmp_path / "bad.h5")


@pytest.mark.parametrize("drop,field", [("graph/indices", "/graph/indices"), ("graph/indptr", "/graph/indptr")])
def test_missing_dataset(tmp_path, drop, field):
    g = _random_graph(7)
    arrays = _h5_paths(g)
    del arrays[drop]
    _write_raw(tmp_path / "m.h5", arrays, _attrs(g))
    with pytest.raises(FormatError) as err:
        open_dataset(tmp_path / "m.h5")
    assert err.value.field == field and "missing" in err.value.message


@pytest.mark.parametrize("key,value,field,words", [
    ("format", "something.else", "/@format", "expected"),
    ("version", 2, "/@version", "unsupported version"),
    ("num_nodes", None, "/@num_nodes", "missing attribute"),
    ("num_edges", None, "/@num_edges", "missing attribute"),
    ("num_classes", None, "/@num_classes", "missing attribute"),
    ("num_nodes", 7, "/@num_nodes", "attribute says 7"),
    ("num_edges", 7, "/@num_edges", "attribute says 7"),
])
def test_bad_attributes(tmp_path, key, value, field, words):
    g = _random_graph(8)
    attrs = _attrs(g)
    if value is None:
        del attrs[key]
    else:
        attrs[key] = value
    _write_raw(tmp_path / "a.h5", _h5_paths(g), attrs)
    with pytest.raises(FormatError) as err:
        open_dataset(tmp_path / "a.h5")
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_missing_field_reads(tmp_path):
    g = _random_graph(9, optional=False)
    write_dataset(tmp_path / "g.h5", g)
    with open_dataset(tmp_path / "g.h5") as ds:
        for call, field in ((lambda: ds.feat, "/node/feat"), (lambda: ds.mask("train_mask"), "/node/train_mask"),
                            (ds.label, "/node/label")):
            with pytest.raises(FormatError) as err:
                call()
            assert err.value.field == field and "missing" in err.value.message
        with pytest.raises(ValueError, match="unknown mask"):
            ds.mask("dev_mask")


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_truncated_file(tmp_path, fraction):
    g = _random_graph(10, n=400, e=5000, f=32)
    write_dataset(tmp_path / "g.h5", g)
    data = (tmp_path / "g.h5").read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[:int(len(data) * fraction)])
    probs = validate_dataset(cut)
    assert probs and probs[0].startswith(str(cut))
    with pytest.raises(DataError) as err:
        with open_dataset(cut) as ds:
            ds.load()
    assert str(err.value).startswith(str(cut))


def test_not_a_dataset(tmp_path):
    (tmp_path / "t.h5").write_text("hello")
    with pytest.raises(FormatError, match="not a readable HDF5 file"):
        open_dataset(tmp_path / "t.h5")
    with pytest.raises(DataError, match="no such file"):
        open_dataset(tmp_path / "none.h5")
    with pytest.raises(DataError, match="is a directory"):
        open_dataset(tmp_path)
    with h5py.File(tmp_path / "other.h5", "w") as h5:
        h5.create_dataset("x", data=np.zeros(3))
    assert "/@format" in validate_dataset(tmp_path / "other.h5")[0]


def test_output_exists_and_force(tmp_path):
    a, b = _random_graph(11, n=30), _random_graph(12, n=40)
    write_dataset(tmp_path / "g.h5", a)
    with pytest.raises(OutputExistsError, match="--force"):
        write_dataset(tmp_path / "g.h5", b)
    with pytest.raises(OutputExistsError):
        DatasetWriter(tmp_path / "g.h5", num_nodes=40)
    with open_dataset(tmp_path / "g.h5") as ds:
        assert ds.num_nodes == 30
    write_dataset(tmp_path / "g.h5", b, force=True)
    with open_dataset(tmp_path / "g.h5") as ds:
        _assert_same(ds.load(), b)
    with pytest.raises(DataError, match="does not exist"):
        write_dataset(tmp_path / "nodir" / "g.h5", a)


def test_empty_writer_refused(tmp_path):
    with pytest.raises(DataError, match="empty graph"):
        DatasetWriter(tmp_path / "e.h5", num_nodes=0)


def _leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_writer_exception_leaves_nothing(tmp_path):
    g = _random_graph(13)
    out = tmp_path / "g.h5"
    with pytest.raises(RuntimeError, match="boom"):
        with DatasetWriter(out, num_nodes=g.num_nodes, feat_dim=g.feat_dim) as w:
            w.write_graph(g.indptr, g.indices)
            w.write_feat(0, g.feat[:10])
            raise RuntimeError("boom")
    assert _leftovers(tmp_path) == []
    # incomplete content is refused on exit, also without an exception in the block
    with pytest.raises(FormatError, match="only 10 of 50 rows"):
        with DatasetWriter(out, num_nodes=g.num_nodes, feat_dim=g.feat_dim) as w:
            w.write_graph(g.indptr, g.indices)
            w.write_feat(0, g.feat[:10])
    with pytest.raises(FormatError, match="write_graph"):
        with DatasetWriter(out, num_nodes=g.num_nodes):
            pass
    with pytest.raises(FormatError, match="/node/label"):
        with DatasetWriter(out, num_nodes=g.num_nodes, num_classes=2) as w:
            w.write_graph(g.indptr, g.indices)
            w.write_node("label", np.full(g.num_nodes, 5))
    with pytest.raises(FormatError, match="/graph/indptr"):
        with DatasetWriter(out, num_nodes=g.num_nodes) as w:
            w.write_graph(g.indptr[:-1], g.indices)
    with pytest.raises(FormatError, match="/node/feat"):
        with DatasetWriter(out, num_nodes=g.num_nodes, feat_dim=g.feat_dim) as w:
            w.write_feat(45, g.feat[:10])  # rows past the end
    assert _leftovers(tmp_path) == []
    # an exception while replacing an existing file keeps the old one intact
    write_dataset(out, g)
    before = out.read_bytes()
    with pytest.raises(KeyError):
        with DatasetWriter(out, num_nodes=g.num_nodes, force=True) as w:
            w.write_graph(g.indptr, g.indices)
            raise KeyError("late")
    assert out.read_bytes() == before and _leftovers(tmp_path) == ["g.h5"]


def test_nan_edge_weight_found_beyond_first_chunk(tmp_path, monkeypatch):
    """A NaN in a later chunk must not be lost when chunk minima/maxima are combined."""
    import data_io.dataset as dataset_mod

    monkeypatch.setattr(dataset_mod, "_CHUNK_BYTES", 8)  # two float32 per chunk
    g = _random_graph(3)
    w = np.random.default_rng(0).random(g.num_edges).astype(np.float32)
    w[-1] = np.nan
    g.edge_weight = w
    with pytest.raises(FormatError, match="edge_weight.*NaN"):
        dataset_mod.write_dataset(tmp_path / "g.h5", g)
    assert not (tmp_path / "g.h5").exists()


def test_zero_width_features_write_no_feature_field(tmp_path):
    g = _random_graph(4)
    g.feat = np.zeros((g.num_nodes, 0), dtype=np.float32)
    from data_io.dataset import write_dataset
    write_dataset(tmp_path / "g.h5", g)
    with open_dataset(tmp_path / "g.h5") as ds:
        assert not ds.has("feat") and ds.feat_dim == 0
