"""partition_dataset: round trip, halo / send lists against a plain reference, METIS quality, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
from _part_graphs import planted_graph, random_graph, write

import data_io.partitioner as partitioner
from data_io.errors import DataError, OutputExistsError
from data_io.partition import read_partition, read_partition_meta, reassemble
from data_io.partitioner import assign_parts, partition_dataset


def _assert_same_graph(a, b):
    assert np.array_equal(a.indptr, b.indptr)
    assert np.array_equal(a.indices.astype(np.int64), b.indices.astype(np.int64))
    for f in ("feat", "label", "train_mask", "val_mask", "test_mask", "edge_weight", "edge_type"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert a.num_classes == b.num_classes and a.name == b.name


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
def test_round_trip_and_halo_send_reference(tmp_path, method, num_parts):
    g = random_graph(300, 1500, seed=num_parts, types=True)
    src = write(tmp_path, g)
    out = tmp_path / "parts"
    meta = partition_dataset(src, out, num_parts, method=method, seed=3)
    _assert_same_graph(reassemble(out), g)

    parts = [read_partition(out, p) for p in range(num_parts)]
    ranges = np.asarray(meta["node_ranges"])
    new_of_orig = np.empty(g.num_nodes, dtype=np.int64)
    new_of_orig[np.concatenate([q.orig_id for q in parts])] = np.arange(g.num_nodes)
    owner = lambda gid: int(np.searchsorted(ranges, gid, side="right") - 1)  # noqa: E731
    # plain-Python reference of halos: sources of edges into p owned by other parts
    halo_ref = [set() for _ in range(num_parts)]
    cut = 0
    for i in range(g.num_nodes):
        for j in g.indices[g.indptr[i]:g.indptr[i + 1]]:
            gi, gj = new_of_orig[i], new_of_orig[j]
            if owner(gi) != owner(gj):
                halo_ref[owner(gi)].add(int(gj))
                cut += 1
    assert meta["edge_cut"] == cut
    assert meta["replication_factor"] == pytest.approx(sum(map(len, halo_ref)) / g.num_nodes, abs=1e-6)
    for p, q in enumerate(parts):
        lo, hi = ranges[p], ranges[p + 1]
        assert np.array_equal(q.halo_gid, sorted(halo_ref[p]))
        assert all(owner(x) != p for x in q.halo_gid)
        for r in range(num_parts):
            assert np.array_equal(q.halo_from(r), [x for x in sorted(halo_ref[p]) if owner(x) == r])
            # what p sends to r: r's halo nodes owned by p, in r's halo order, as p-local ids
            assert np.array_equal(q.send_to(r) + lo, [x for x in sorted(halo_ref[r]) if lo <= x < hi])
        e = meta["parts"][p]
        assert (e["num_nodes"], e["num_edges"], e["num_halo"], e["num_train"]) == (
            q.num_owned, q.num_edges, q.num_halo, int(q.train_mask.sum()))
    assert sorted(np.concatenate([q.orig_id for q in parts]).tolist()) == list(range(g.num_nodes))
    on_disk = json.loads((out / "partition.json").read_text())
    assert on_disk == read_partition_meta(out) and on_disk["edge_cut"] == cut


def test_minimal_dataset_without_optional_fields(tmp_path):
    g = random_graph(50, 120, seed=7, feat_dim=0, num_classes=0, weights=False, masks=False)
    src = write(tmp_path, g)
    meta = partition_dataset(src, tmp_path / "p", 3, method="metis")
    assert meta["fields"] == [] and meta["num_train"] == 0
    _assert_same_graph(reassemble(tmp_path / "p"), g)


def test_empty_part_is_written_and_read(tmp_path, monkeypatch):
    g = random_graph(40, 100, seed=2)
    src = write(tmp_path, g)
    rng = np.random.default_rng(0)
    fixed = rng.choice([0, 2, 3], size=g.num_nodes)  # part 1 owns nothing
    monkeypatch.setattr(partitioner, "assign_parts", lambda *a, **k: fixed)
    meta = partition_dataset(src, tmp_path / "p", 4)
    assert meta["parts"][1]["num_nodes"] == 0
    q = read_partition(tmp_path / "p", 1)
    assert q.num_owned == 0 and q.feat.shape == (0, g.feat_dim) and q.num_edges == 0
    _assert_same_graph(reassemble(tmp_path / "p"), g)
    for p in range(4):  # the relabelling follows the given assignment
        assert (fixed[read_partition(tmp_path / "p", p).orig_id] == p).all()


def test_features_streamed_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(partitioner, "_FEAT_BLOCK_BYTES", 4 * 5 * 7)  # 7 rows per block
    monkeypatch.setattr(partitioner, "_MAX_OPEN", 2)  # 2 passes for 4 parts
    g = random_graph(101, 300, seed=4)
    src = write(tmp_path, g)
    partition_dataset(src, tmp_path / "p", 4, method="random")
    _assert_same_graph(reassemble(tmp_path / "p"), g)


def test_metis_balances_train_nodes_and_beats_random(tmp_path):
    g, comm = planted_graph(1600, 4, deg_in=10, deg_out=1, seed=0, train_skew=True)
    src = write(tmp_path, g)
    m = partition_dataset(src, tmp_path / "m", 4, method="metis")
    r = partition_dataset(src, tmp_path / "r", 4, method="random")
    train = np.array([e["num_train"] for e in m["parts"]])
    nodes = np.array([e["num_nodes"] for e in m["parts"]])
    assert train.max() / train.mean() <= 1.1, train
    assert nodes.max() / nodes.mean() <= 1.1, nodes
    # following the communities would put ~12x more training nodes in half of the parts
    comm_train = np.bincount(comm[g.train_mask], minlength=4)
    assert comm_train.max() / comm_train.mean() > 1.5
    assert m["edge_cut"] < 0.5 * r["edge_cut"], (m["edge_cut"], r["edge_cut"])
    assert m["balance"]["train"] == pytest.approx(train.max() / train.mean(), abs=1e-5)


def test_random_is_seeded_and_balanced():
    indptr = np.zeros(101, dtype=np.int64)
    indices = np.zeros(0, dtype=np.int64)
    train = np.arange(100) < 30
    a = assign_parts(indptr, indices, 4, "random", seed=5, train_mask=train)
    b = assign_parts(indptr, indices, 4, "random", seed=5, train_mask=train)
    c = assign_parts(indptr, indices, 4, "random", seed=6, train_mask=train)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.bincount(a, minlength=4).tolist() == [25, 25, 25, 25]
    assert np.bincount(a[train], minlength=4).max() - np.bincount(a[train], minlength=4).min() <= 1


def test_metis_on_graph_without_edges_falls_back():
    parts = assign_parts(np.zeros(10, dtype=np.int64), np.zeros(0, dtype=np.int64), 3, "metis")
    assert np.bincount(parts, minlength=3).tolist() == [3, 3, 3]


@pytest.mark.parametrize("num_parts", [0, -1, 301])
def test_bad_num_parts(tmp_path, num_parts):
    src = write(tmp_path, random_graph(300, 600, seed=1))
    with pytest.raises(DataError, match="num_parts"):
        partition_dataset(src, tmp_path / "p", num_parts)
    assert not (tmp_path / "p").exists()


def test_bad_method(tmp_path):
    src = write(tmp_path, random_graph(30, 60, seed=1))
    with pytest.raises(DataError, match="method"):
        partition_dataset(src, tmp_path / "p", 2, method="spectral")


def test_existing_output_needs_force(tmp_path):
    src = write(tmp_path, random_graph(60, 200, seed=1))
    out = tmp_path / "p"
    partition_dataset(src, out, 2, method="random")
    before = (out / "partition.json").read_text()
    with pytest.raises(OutputExistsError, match="--force"):
        partition_dataset(src, out, 3)
    assert (out / "partition.json").read_text() == before
    meta = partition_dataset(src, out, 3, force=True)
    assert read_partition_meta(out)["num_parts"] == 3 == meta["num_parts"]
    assert sorted(x.name for x in out.iterdir()) == ["part-00000.h5", "part-00001.h5", "part-00002.h5",
                                                     "partition.json"]


def test_failure_leaves_no_partial_output(tmp_path, monkeypatch):
    src = write(tmp_path, random_graph(60, 200, seed=1))

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(partitioner, "_scatter_features", boom)
    with pytest.raises(DataError, match="disk full"):
        partition_dataset(src, tmp_path / "p", 2)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["g.h5"]


def test_missing_source(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        partition_dataset(tmp_path / "nope.h5", tmp_path / "p", 2)


def test_graph_level_dataset_refused(tmp_path):
    from data_io.generators import generate_reg3cc

    src = write(tmp_path, generate_reg3cc(8, 8, 12, seed=1))
    with pytest.raises(DataError, match="task='graph'"):
        partition_dataset(src, tmp_path / "p", 2)
    assert not (tmp_path / "p").exists()


def test_metis_balance_edges_on_power_law_graph(tmp_path):
    from data_io.generators.rmat import generate_rmat

    g = generate_rmat(11, 16, feat_dim=4, num_classes=3, seed=2)
    src = write(tmp_path, g)
    plain = partition_dataset(src, tmp_path / "plain", 4, method="metis")
    bal = partition_dataset(src, tmp_path / "bal", 4, method="metis", balance_edges=True)
    indeg = np.diff(g.indptr)
    for meta, d in ((plain, tmp_path / "plain"), (bal, tmp_path / "bal")):
        # per-part in-edges counted from what each part file holds, against the source degrees
        edges = np.array([read_partition(d, p).num_edges for p in range(4)])
        assert edges.sum() == len(g.indices)
        owned = [np.asarray(read_partition(d, p).orig_id) for p in range(4)]
        assert [int(indeg[o].sum()) for o in owned] == edges.tolist()
        assert meta["balance"]["edges"] == pytest.approx(edges.max() / edges.mean(), abs=1e-5)
    assert bal["balance_edges"] is True and plain["balance_edges"] is False
    assert plain["balance"]["edges"] > 1.5  # hubs cluster: the reason for the option
    assert bal["balance"]["edges"] <= 1.1
    assert bal["balance"]["nodes"] <= 1.1 and bal["balance"]["train"] <= 1.1
    r = reassemble(tmp_path / "bal")
    assert np.array_equal(r.indptr, g.indptr) and np.array_equal(r.indices, g.indices)


def test_balance_edges_needs_metis(tmp_path):
    src = write(tmp_path, random_graph(100, 300, seed=1))
    with pytest.raises(DataError, match="balance_edges"):
        partition_dataset(src, tmp_path / "r", 2, method="random", balance_edges=True)
    assert not (tmp_path / "r").exists()


def test_balance_edges_without_multi_constraint_metis_is_an_error(monkeypatch):
    def no_abi(*args, **kwargs):
        raise partitioner._NoMetisABI("test: no entry point")

    monkeypatch.setattr(partitioner, "_metis", no_abi)
    g = random_graph(80, 400, seed=4)
    with pytest.raises(DataError, match="balance_edges: needs METIS' multi-constraint"):
        assign_parts(g.indptr, g.indices, 2, "metis", balance_edges=True)
    parts = assign_parts(g.indptr, g.indices, 2, "metis")  # without it: pymetis' one-constraint fallback
    assert sorted(np.unique(parts).tolist()) == [0, 1]
