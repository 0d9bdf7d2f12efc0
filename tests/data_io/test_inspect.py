"""info / check of dataset files and partition directories against plain NumPy references."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from _part_graphs import random_graph, write

from data_io.errors import DataError
from data_io.inspect import check, dataset_info, info
from data_io.partition import read_partition
from data_io.partitioner import partition_dataset


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("insp")
    g = random_graph(150, 700, seed=5, types=True)
    src = write(tmp, g)
    partition_dataset(src, tmp / "p", 3, method="metis")
    return g, src, tmp / "p"


def _copy(parted, dst):
    shutil.copytree(parted, dst)
    return dst


def _stats(x):
    return {"min": int(x.min()), "mean": round(float(x.mean()), 4), "max": int(x.max()), "median": float(np.median(x))}


def test_dataset_info_matches_reference(setup):
    g, src, _ = setup
    res = dataset_info(src)
    indeg = np.diff(g.indptr)
    outdeg = np.bincount(g.indices, minlength=g.num_nodes)
    dst = np.repeat(np.arange(g.num_nodes), indeg)
    assert res["kind"] == "dataset" and res["num_nodes"] == 150 and res["num_edges"] == 700
    assert res["in_degree"] == _stats(indeg) and res["out_degree"] == _stats(outdeg)
    assert res["self_loops"] == int((g.indices == dst).sum())
    assert res["isolated_nodes"] == int(((indeg == 0) & (outdeg == 0)).sum())
    assert res["splits"] == {"train": int(g.train_mask.sum()), "val": int(g.val_mask.sum()),
                             "test": int(g.test_mask.sum())}
    assert res["class_counts"] == np.bincount(g.label[g.label >= 0], minlength=4).tolist()
    assert res["labelled_nodes"] == int((g.label >= 0).sum())
    assert set(res["fields"]) == {"edge_weight", "edge_type", "feat", "label", "train_mask", "val_mask", "test_mask"}
    assert res["feat_dim"] == 5 and res["num_classes"] == 4
    json.dumps(res)


def test_graph_level_dataset_info_matches_reference(tmp_path, capsys):
    from data_io.dataset import write_dataset
    from data_io.generators.graph_tasks import generate_pathspd
    from data_io.preprocess import add_node_field, laplacian_pe
    from hpc_graph.cli import main

    g = generate_pathspd(23, 6, 12, max_dist=3, seed=4)
    write_dataset(tmp_path / "g.h5", g)
    add_node_field(tmp_path / "g.h5", "lap_pe",
                   laplacian_pe(g.indptr, g.indices, g.num_nodes, 2, graph_ptr=g.graph_ptr))
    res = dataset_info(tmp_path / "g.h5")
    sizes = np.diff(g.graph_ptr)
    assert res["task"] == "graph" and res["num_graphs"] == 23 and res["graph_nodes"] == _stats(sizes)
    assert res["graph_splits"] == {"train": int(g.graph_train_mask.sum()), "val": int(g.graph_val_mask.sum()),
                                   "test": int(g.graph_test_mask.sum())}
    assert res["graph_class_counts"] == np.bincount(g.graph_label, minlength=3).tolist()
    assert res["labelled_graphs"] == 23 and "lap_pe" in res["fields"]
    json.dumps(res)
    assert main(["-q", "info", str(tmp_path / "g.h5")]) == 0
    out = capsys.readouterr().out
    assert f"graphs 23, nodes per graph: min {sizes.min()}," in out and "dp over the batches of graphs" in out


def test_partition_info(setup):
    _, _, parted = setup
    res = info(parted)
    assert res["kind"] == "partition" and res["num_parts"] == 3
    assert [e["num_nodes"] for e in res["parts"]] == [read_partition(parted, p, features=False).num_owned
                                                      for p in range(3)]
    with pytest.raises(DataError, match="no such file"):
        info(parted.parent / "nope")


def test_check_valid(setup):
    _, src, parted = setup
    res = check(src)
    assert res["valid"] and res["problems"] == []
    res = check(parted)
    assert res["valid"], res["problems"]
    assert any("sha256 matches" in n for n in res["notes"])


def test_check_without_source_checks_internal_consistency(tmp_path, setup):
    g, _, _ = setup
    src = write(tmp_path, g, "moved.h5")
    partition_dataset(src, tmp_path / "p", 2, method="random")
    src.unlink()
    res = check(tmp_path / "p")
    assert res["valid"], res["problems"]
    assert any("not found" in n for n in res["notes"])


def _assert_problem(res, *needles):
    assert not res["valid"]
    assert any(all(n in p for n in needles) for p in res["problems"]), res["problems"]


def test_check_deleted_part(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    (d / "part-00001.h5").unlink()
    _assert_problem(check(d), "part-00001.h5", "missing part file")


def test_check_truncated_part(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    f = d / "part-00002.h5"
    f.write_bytes(f.read_bytes()[:4096])
    _assert_problem(check(d), "part-00002.h5", "not a readable HDF5 file")


def _edit(f, field, fn):
    with h5py.File(f, "r+") as h5:
        v = fn(h5[field][...])
        del h5[field]
        h5.create_dataset(field, data=v)


def _parts_with_sends(d):
    for p in range(3):
        q = read_partition(d, p, features=False)
        for r in range(3):
            if len(q.send_to(r)) >= 2:
                return p, r, q
    raise AssertionError("no send list of length >= 2")


def test_check_modified_send_list(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    p, r, q = _parts_with_sends(d)
    # replace one entry by another owned node not in the list, keeping the block ascending
    blk = q.send_to(r)
    free = np.setdiff1d(np.arange(q.num_owned), blk)
    new = q.send_lid.copy()
    s = q.send_offsets[r]
    cand = free[(free > (blk[-2] if len(blk) > 1 else -1))]
    new[s + len(blk) - 1] = cand[0] if len(cand) else blk[-1]
    assert not np.array_equal(new, q.send_lid)
    _edit(d / f"part-{p:05d}.h5", "/send/lid", lambda _: new)
    _assert_problem(check(d), f"part-{p:05d}.h5", "/send/lid", f"send list to part {r}")


def test_check_out_of_range_index(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    q = read_partition(d, 0, features=False)
    bad = q.num_owned + q.num_halo
    _edit(d / "part-00000.h5", "/graph/indices", lambda v: np.where(np.arange(len(v)) == 3, bad, v))
    _assert_problem(check(d), "part-00000.h5", "/graph/indices", "out of range")


def test_check_edge_moved_is_caught_against_source(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    q = read_partition(d, 1, features=False)
    # point one edge at another (valid) local source: structure stays valid, edges differ
    k = int(np.argmax(q.indices != 0))
    _edit(d / "part-00001.h5", "/graph/indices", lambda v: np.where(np.arange(len(v)) == k, 0, v))
    _assert_problem(check(d), "part-00001.h5", "/graph/indices", "differ from")


def test_check_feature_and_label_changes_against_source(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    _edit(d / "part-00002.h5", "/node/feat", lambda v: v + np.float32(1))
    _edit(d / "part-00000.h5", "/node/label", lambda v: np.where(v == 0, 1, 0))
    res = check(d)
    _assert_problem(res, "part-00002.h5", "/node/feat", "differ")
    _assert_problem(res, "part-00000.h5", "/node/label", "differs")


def test_check_orig_id_not_permutation(tmp_path, setup):
    d = _copy(setup[2], tmp_path / "c")
    first = int(read_partition(d, 0, features=False).orig_id[0])
    _edit(d / "part-00002.h5", "/node/orig_id", lambda v: np.where(np.arange(len(v)) == 0, first, v))
    _assert_problem(check(d), "part-00002.h5", "/node/orig_id", "not a permutation")


def test_check_meta_counts_and_stale_source(tmp_path, setup):
    g, _, _ = setup
    src = write(tmp_path, g, "s.h5")
    partition_dataset(src, tmp_path / "p", 3, method="random")
    meta = json.loads((tmp_path / "p" / "partition.json").read_text())
    meta["parts"][1]["num_halo"] += 1
    meta["edge_cut"] += 1
    (tmp_path / "p" / "partition.json").write_text(json.dumps(meta))
    res = check(tmp_path / "p")
    _assert_problem(res, "part-00001.h5", "num_halo")
    _assert_problem(res, "partition.json", "edge_cut")
    # the source changes after partitioning: reported as stale
    g2 = random_graph(150, 700, seed=6)
    src.unlink()
    write(tmp_path, g2, "s.h5")
    meta["parts"][1]["num_halo"] -= 1
    meta["edge_cut"] -= 1
    (tmp_path / "p" / "partition.json").write_text(json.dumps(meta))
    _assert_problem(check(tmp_path / "p"), "source.sha256", "changed")


def test_check_bad_dataset_and_missing_path(tmp_path, setup):
    g, _, _ = setup
    src = write(tmp_path, g)
    with h5py.File(src, "r+") as h5:
        h5["/graph/indices"][0] = 10**6
    _assert_problem(check(src), "/graph/indices", "out of range")
    _assert_problem(check(tmp_path / "nope"), "no such file")
