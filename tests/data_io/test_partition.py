"""Partition format: PartitionBook, read_partition / read_partition_meta validation, write_partition."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from _part_graphs import random_graph, write

from data_io.errors import DataError, FormatError
from data_io.partition import (Partition, PartitionBook, read_partition, read_partition_meta,
                               write_partition)
from data_io.partitioner import partition_dataset


@pytest.fixture(scope="module")
def parted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parted")
    g = random_graph(200, 900, seed=11, types=True)
    partition_dataset(write(tmp, g), tmp / "p", 3, method="metis")
    return tmp / "p"


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _replace(path, field, value):
    with h5py.File(path, "r+") as h5:
        del h5[field]
        h5.create_dataset(field, data=value)


# -- PartitionBook ------------------------------------------------------------------------------

def test_partition_book_matches_linear_scan():
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 5, 7)  # some empty parts
    sizes[0] = 3
    ranges = np.concatenate([[0], np.cumsum(sizes)])
    book = PartitionBook(ranges)
    gids = rng.integers(0, ranges[-1], 50)
    owner_ref = np.array([next(p for p in range(7) if ranges[p] <= g < ranges[p + 1]) for g in gids])
    assert np.array_equal(book.owner(gids), owner_ref)
    assert np.array_equal(book.to_local(gids), gids - ranges[owner_ref])
    assert book.num_parts == 7 and book.num_nodes == ranges[-1]
    assert book.part_range(3) == (ranges[3], ranges[4])


def test_partition_book_rejects_bad_input():
    with pytest.raises(ValueError, match="node_ranges"):
        PartitionBook(np.array([0, 5, 3]))
    with pytest.raises(ValueError, match="out of range"):
        PartitionBook(np.array([0, 2, 4])).owner(np.array([4]))
    with pytest.raises(ValueError, match="out of range"):
        PartitionBook(np.array([0, 2, 4])).to_local(np.array([-1]))


def test_partition_book_from_dir(parted):
    book = PartitionBook.from_dir(parted)
    assert book.node_ranges.tolist() == read_partition_meta(parted)["node_ranges"]


# -- reading ------------------------------------------------------------------------------------

def test_read_partition_fields(parted):
    meta = read_partition_meta(parted)
    for p in range(3):
        q = read_partition(parted, p)
        assert isinstance(q, Partition) and q.part_id == p and q.num_parts == 3
        assert q.num_owned == meta["parts"][p]["num_nodes"]
        assert q.indptr.dtype == q.indices.dtype == q.halo_gid.dtype == q.send_lid.dtype == np.int64
        assert q.feat.dtype == np.float32 and q.feat.shape == (q.num_owned, 5)
        assert q.edge_type.dtype == np.int16 and q.edge_weight.dtype == np.float32
        assert q.global_num_nodes == 200 and q.global_num_edges == 900 and q.num_classes == 4
        l2g = q.local_to_global()
        assert np.array_equal(l2g[:q.num_owned], np.arange(q.first_gid, q.first_gid + q.num_owned))
        assert read_partition(parted, p, features=False).feat is None


def test_write_partition_round_trip(tmp_path, parted):
    q = read_partition(parted, 1)
    path = tmp_path / "one.h5"
    write_partition(path, q)
    with pytest.raises(DataError, match="exists"):
        write_partition(path, q)
    d = _copy(parted, tmp_path / "copy")
    write_partition(d / "part-00001.h5", q, force=True)
    r = read_partition(d, 1)
    for f in ("orig_id", "halo_gid", "halo_offsets", "indptr", "indices", "send_offsets", "send_lid",
              "edge_weight", "edge_type", "feat", "label", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(q, f), getattr(r, f)), f


@pytest.mark.parametrize("part_id", [-1, 3, "1"])
def test_bad_part_id(parted, part_id):
    with pytest.raises(DataError, match="part_id"):
        read_partition(parted, part_id)


def test_not_a_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_partition(tmp_path / "nope", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="partition.json: missing"):
        read_partition_meta(tmp_path / "empty")


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(version=2), "version"),
    (lambda m: m.update(format="other"), "format"),
    (lambda m: m.update(num_parts="3"), "num_parts"),
    (lambda m: m["node_ranges"].__setitem__(1, 10**6), "node_ranges"),
    (lambda m: m["node_ranges"].pop(), "node_ranges"),
    (lambda m: m["parts"][2].update(num_edges=1), "parts"),
    (lambda m: m["parts"][0].update(file="x.h5"), "parts[0].file"),
])
def test_bad_meta_names_field(tmp_path, parted, edit, field):
    d = _copy(parted, tmp_path / "c")
    meta = json.loads((d / "partition.json").read_text())
    edit(meta)
    (d / "partition.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError) as err:
        read_partition(d, 0)
    assert err.value.field.startswith(field) and "partition.json" in err.value.path


def test_meta_not_json(tmp_path, parted):
    d = _copy(parted, tmp_path / "c")
    (d / "partition.json").write_text("{not json")
    with pytest.raises(FormatError, match="not readable JSON"):
        read_partition_meta(d)


def test_missing_part_file(tmp_path, parted):
    d = _copy(parted, tmp_path / "c")
    (d / "part-00002.h5").unlink()
    with pytest.raises(FormatError, match="part-00002.h5: missing part file"):
        read_partition(d, 2)
    read_partition(d, 1)  # the others still read


def test_truncated_part_file(tmp_path, parted):
    d = _copy(parted, tmp_path / "c")
    f = d / "part-00001.h5"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(FormatError, match="part-00001.h5: not a readable HDF5 file"):
        read_partition(d, 1)


def _first_halo_part(d):
    return next(p for p in range(3) if read_partition(d, p).num_halo)


def _with_owned_halo(q):
    """halo_gid with one owned node put in, still strictly ascending."""
    hg = q.halo_gid.copy()
    hg[min(int(np.searchsorted(hg, q.first_gid)), len(hg) - 1)] = q.first_gid
    return hg


@pytest.mark.parametrize("field, corrupt, message", [
    ("/graph/indices", lambda q: np.where(np.arange(q.num_edges) == 0, q.num_owned + q.num_halo, q.indices),
     "out of range"),
    ("/graph/indices", lambda q: q.indices.astype(np.int32), "expected int64"),
    ("/graph/indptr", lambda q: q.indptr[:-1], "expected shape"),
    ("/graph/indptr", lambda q: q.indptr[::-1].copy(), "must run from 0"),
    ("/halo/gid", lambda q: q.halo_gid[::-1].copy(), "ascending"),
    ("/halo/gid", lambda q: _with_owned_halo(q), "owned by this part"),
    ("/halo/offsets", lambda q: np.zeros_like(q.halo_offsets), "does not match"),
    ("/send/lid", lambda q: np.full_like(q.send_lid, q.num_owned), "out of range"),
    ("/send/offsets", lambda q: q.send_offsets + 1, "non-decreasing from 0"),
    ("/node/orig_id", lambda q: q.orig_id + 10**6, "out of range"),
    ("/node/label", lambda q: q.label + 100, "out of range"),
    ("/node/feat", lambda q: q.feat[:, :2], "expected shape"),
    ("/node/train_mask", lambda q: q.train_mask.astype(np.int8), "expected bool"),
    ("/graph/edge_weight", lambda q: np.full_like(q.edge_weight, np.nan), "NaN"),
    ("/node_ranges", lambda q: q.node_ranges[::-1].copy(), "does not match partition.json"),
])
def test_corrupt_field_named(tmp_path, parted, field, corrupt, message):
    d = _copy(parted, tmp_path / "c")
    p = _first_halo_part(d)
    f = d / f"part-{p:05d}.h5"
    _replace(f, field, corrupt(read_partition(d, p)))
    with pytest.raises(FormatError) as err:
        read_partition(d, p)
    assert err.value.field == field and err.value.path == str(f) and message in err.value.message


def test_missing_dataset_and_bad_attrs(tmp_path, parted):
    d = _copy(parted, tmp_path / "c")
    f = d / "part-00000.h5"
    with h5py.File(f, "r+") as h5:
        del h5["/send/lid"]
    with pytest.raises(FormatError, match="/send/lid: missing"):
        read_partition(d, 0)
    f = d / "part-00001.h5"
    with h5py.File(f, "r+") as h5:
        h5.attrs["part_id"] = 2
    with pytest.raises(FormatError, match="part-00001.h5: /@part_id: expected 1"):
        read_partition(d, 1)
    with h5py.File(d / "part-00002.h5", "r+") as h5:
        h5.attrs["version"] = 9
    with pytest.raises(FormatError, match="/@version: unsupported version 9"):
        read_partition(d, 2)
