"""Checksums end to end: Fletcher32 on every dataset the writers create, sha256 digests recorded and
checked, byte flips in a feature chunk found at load (finite ones included), metadata changes and
swapped part files refused, files without checksums still loaded, NaN features named at load."""
from __future__ import annotations

import hashlib
import json
import shutil

import h5py
import numpy as np
import pytest
from _part_graphs import random_graph, write

from data_io.dataset import open_dataset
from data_io.errors import FormatError
from data_io.inspect import check
from data_io.integrity import DIGEST_ATTR, FILE_DIGEST_ATTR, file_digest, verify
from data_io.partition import read_partition
from data_io.partitioner import partition_dataset


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("integrity")
    g = random_graph(400, 2000, seed=11, feat_dim=48, types=True)
    src = write(tmp, g)
    partition_dataset(src, tmp / "p", 2, method="random", seed=1)
    partition_dataset(src, tmp / "q", 2, method="random", seed=2)
    return g, src, tmp


def _datasets(f):
    out = []
    f.visititems(lambda _n, o: out.append(o) if isinstance(o, h5py.Dataset) else None)
    return out


def _sha(arr):
    """The digest's definition, from NumPy: dtype and shape, then the elements in C order."""
    arr = np.ascontiguousarray(arr)
    return hashlib.sha256(f"{arr.dtype.str}{tuple(arr.shape)}".encode() + arr.tobytes()).hexdigest()


@pytest.mark.parametrize("which", ["dataset", "part"])
def test_every_dataset_is_checksummed_and_its_digest_is_the_content(setup, which):
    _, src, tmp = setup
    path = src if which == "dataset" else tmp / "p" / "part-00001.h5"
    with h5py.File(path, "r") as f:
        sets = _datasets(f)
        assert len(sets) >= 6
        for ds in sets:
            assert ds.fletcher32, ds.name
            assert ds.attrs[DIGEST_ATTR] == _sha(ds[...]), ds.name
        assert f.attrs[FILE_DIGEST_ATTR] == file_digest(f)
        assert verify(f, path) == (True, [])
    if which == "part":
        meta = json.loads((tmp / "p" / "partition.json").read_text())
        assert meta["parts"][1][FILE_DIGEST_ATTR] == h5py.File(path, "r").attrs[FILE_DIGEST_ATTR]


def _flip_in_chunk(path, name, low_byte: bool):
    """Flip one byte inside the first stored chunk of dataset ``name``: the lowest byte of a float32
    (the value stays finite: exponent untouched) or a byte in the middle of the chunk."""
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(0)
        off = info.byte_offset + (4 * 7 if low_byte else info.size // 2)
        before = f[name][0:1].copy()
    with open(path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x01]))
    return before


@pytest.mark.parametrize("low_byte", [True, False])
def test_a_flipped_byte_in_a_feature_chunk_is_found_at_load(setup, tmp_path, low_byte):
    _, src, tmp = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    _flip_in_chunk(f, "node/feat", low_byte)
    if low_byte:  # decoded without the checksum the value is finite: only the checksum can tell
        with h5py.File(f, "r") as h5:
            raw = h5["node/feat"].id.read_direct_chunk((0, 0))[1]
        vals = np.frombuffer(raw[:-4], dtype=np.float32)
        assert np.isfinite(vals).all()
    with open_dataset(f) as ds, pytest.raises(FormatError, match=r"g\.h5: /node/feat: unreadable"):
        ds.feat_rows(0, ds.num_nodes)
    res = check(f)
    assert not res["valid"] and any("/node/feat" in p and str(f) in p for p in res["problems"])

    d = tmp_path / "p"
    shutil.copytree(tmp / "p", d)
    _flip_in_chunk(d / "part-00000.h5", "node/feat", low_byte)
    with pytest.raises(FormatError, match=r"part-00000\.h5: /node/feat: unreadable"):
        read_partition(d, 0)
    read_partition(d, 1)  # the other part is intact
    res = check(d)
    assert not res["valid"] and any("part-00000.h5: /node/feat" in p for p in res["problems"])


def test_changed_metadata_and_swapped_parts_are_refused(setup, tmp_path):
    _, src, tmp = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    with h5py.File(f, "r+") as h5:
        h5.attrs["num_classes"] = 7  # a plausible value: only the digest can tell
    with pytest.raises(FormatError, match=r"g\.h5: /@content_sha256: does not match"):
        open_dataset(f)
    assert any("content_sha256" in p for p in check(f)["problems"])

    d = tmp_path / "p"
    shutil.copytree(tmp / "p", d)
    shutil.copy(tmp / "q" / "part-00001.h5", d / "part-00001.h5")  # same graph, another partitioning
    with pytest.raises(FormatError, match=r"part-00001\.h5: /@content_sha256: differs from the digest "
                                          r"partition\.json records"):
        read_partition(d, 1)
    read_partition(d, 0)


def test_content_rewritten_after_sealing_is_reported_by_check(setup, tmp_path):
    _, src, _ = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    with h5py.File(f, "r+") as h5:  # HDF5 writes valid chunk checksums: only the digest differs
        lab = h5["node/label"][...]
        lab[3] = (lab[3] + 1) % 4
        h5["node/label"][...] = lab
    res = check(f)
    assert any("/node/label: content differs from its recorded sha256" in p for p in res["problems"])


def test_files_without_checksums_load_and_check_says_unprotected(setup, tmp_path):
    g, src, tmp = setup
    f = tmp_path / "old.h5"
    with h5py.File(src, "r") as a, h5py.File(f, "w") as b:  # as an older writer made it: no filter, no digests
        for k, v in a.attrs.items():
            if k != FILE_DIGEST_ATTR:
                b.attrs[k] = v
        for ds in _datasets(a):
            b.create_dataset(ds.name, data=ds[...])
    with open_dataset(f) as ds:
        np.testing.assert_array_equal(ds.feat_rows(0, ds.num_nodes), g.feat)
    res = check(f)
    assert res["valid"] and any("unprotected" in n for n in res["notes"])


def test_nan_features_are_named_with_file_and_row_at_load(setup, tmp_path):
    _, src, tmp = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    with h5py.File(f, "r+") as h5:
        h5["node/feat"][123, 5] = np.nan
    with open_dataset(f) as ds:
        with pytest.raises(FormatError, match=r"g\.h5: /node/feat: NaN or Inf in row 123 "):
            ds.load()
        with pytest.raises(FormatError, match=r"NaN or Inf in row 123 "):
            ds.feat_rows(100, 200)
        ds.feat_rows(124, 400)  # rows without it load
    d = tmp_path / "p"
    shutil.copytree(tmp / "p", d)
    with h5py.File(d / "part-00001.h5", "r+") as h5:
        h5["node/feat"][17, 0] = np.inf
    with pytest.raises(FormatError, match=r"part-00001\.h5: /node/feat: NaN or Inf in row 17 "):
        read_partition(d, 1)


def test_adding_a_field_keeps_the_file_sealed(setup, tmp_path):
    from data_io.preprocess import add_node_field

    _, src, _ = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    pe = np.random.default_rng(0).standard_normal((400, 3)).astype(np.float32)
    add_node_field(f, "lap_pe", pe)
    with h5py.File(f, "r") as h5:
        assert h5["node/lap_pe"].fletcher32 and h5["node/lap_pe"].attrs[DIGEST_ATTR] == _sha(pe)
        assert verify(h5, f) == (True, [])
    open_dataset(f).close()


def test_a_damaged_file_is_named_as_such_not_sent_to_preprocess(setup, tmp_path):
    """A graph transformer asks for /node/lap_pe; a file whose header is damaged must be reported as damaged,
    not as one missing the field (the advice would write into a damaged file)."""
    from hpc_graph.train.config import config_from_dict

    _, src, _ = setup
    f = tmp_path / "g.h5"
    shutil.copy(src, f)
    with h5py.File(f, "r+") as h5:
        h5.attrs["num_classes"] = 9
    with pytest.raises(FormatError, match=r"g\.h5: /@content_sha256: does not match") as err:
        config_from_dict({"data": {"path": str(f)}, "engine": {"name": "seqpar"},
                          "model": {"name": "gt", "pe_dim": 4, "heads": 2, "hidden": 8}})
    assert "preprocess" not in str(err.value)
