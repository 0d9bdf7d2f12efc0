"""Graph-level datasets: the /graphs fields (round trip, every check), the REG3-CC and PATH-SPD generators
(against networkx-free references: union-find components, BFS distances), per-graph Laplacian PE, the CLI."""
from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, shortest_path

from data_io.dataset import GraphData, dataset_task, open_dataset, write_dataset
from data_io.errors import FormatError
from data_io.generators import GeneratorParamError, generate_pathspd, generate_reg3cc
from data_io.preprocess import laplacian_pe


def _graphs(data: GraphData):
    """(adjacency of graph g as a scipy matrix, its node slice) for every graph."""
    ptr = data.graph_ptr
    a = csr_matrix((np.ones(data.num_edges), data.indices, data.indptr), shape=(data.num_nodes,) * 2)
    return [(a[ptr[g]:ptr[g + 1], ptr[g]:ptr[g + 1]], slice(ptr[g], ptr[g + 1])) for g in range(len(ptr) - 1)]


def _tiny(task="graph", **over) -> GraphData:
    fields = dict(indptr=np.array([0, 1, 2, 2, 3, 4]), indices=np.array([1, 0, 4, 3]),
                  feat=np.ones((5, 2), np.float32), task=task, num_classes=3,
                  graph_ptr=np.array([0, 2, 3, 5]), graph_label=np.array([0, 2, 1]),
                  graph_train_mask=np.array([True, False, True]), graph_test_mask=np.array([False, True, False]))
    fields.update(over)
    return GraphData(**fields)


def test_round_trip_and_reader(tmp_path):
    data = _tiny()
    write_dataset(tmp_path / "g.h5", data)
    assert dataset_task(tmp_path / "g.h5") == "graph"
    with open_dataset(tmp_path / "g.h5") as ds:
        np.testing.assert_array_equal(ds.graph_ptr(), data.graph_ptr)
        np.testing.assert_array_equal(ds.graph_label(), data.graph_label)
        np.testing.assert_array_equal(ds.graph_mask("train_mask"), data.graph_train_mask)
        np.testing.assert_array_equal(ds.graph_mask("val_mask"), np.zeros(3, bool))  # absent: all False
        back = ds.load()
    np.testing.assert_array_equal(back.graph_test_mask, data.graph_test_mask)
    assert back.task == "graph" and back.graph_val_mask is None


@pytest.mark.parametrize("over, field, words", [
    (dict(graph_ptr=np.array([0, 1, 3, 5])), "/graph/indices", "joins graphs"),
    (dict(graph_ptr=np.array([0, 2, 2, 5])), "/graphs/ptr", "empty"),
    (dict(graph_ptr=np.array([0, 2, 3, 4])), "/graphs/ptr", "num_nodes=5"),
    (dict(graph_ptr=np.array([0, 2, 3, 5], np.int32)), "/graphs/ptr", "int64"),
    (dict(graph_ptr=None, graph_label=None, graph_train_mask=None, graph_test_mask=None), "/graphs/ptr",
     "task is 'graph'"),
    (dict(graph_label=None), "/graphs/label", "missing"),
    (dict(graph_label=np.array([0, 1])), "/graphs/label", "int64[3]"),
    (dict(graph_label=np.array([0, 3, 1])), "/graphs/label", "num_classes"),
    (dict(graph_train_mask=np.array([1, 0, 1])), "/graphs/train_mask", "bool[3]"),
    (dict(task="node"), "/@task", "must be 'graph'"),
    (dict(), None, None),
])
def test_graph_field_checks(tmp_path, over, field, words):
    data = _tiny(**over)
    if field is None:
        write_dataset(tmp_path / "ok.h5", data)
        return
    with pytest.raises(FormatError) as err:
        write_dataset(tmp_path / "bad.h5", data)
    assert field in str(err.value) and words in str(err.value)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_reader_names_a_corrupted_field(tmp_path):
    write_dataset(tmp_path / "g.h5", _tiny())
    with h5py.File(tmp_path / "g.h5", "r+") as h5:
        del h5["graphs/label"]
    with pytest.raises(FormatError, match="/graphs/label"):
        open_dataset(tmp_path / "g.h5")


@pytest.mark.parametrize("seed", [0, 1])
def test_reg3cc_classes(seed):
    data = generate_reg3cc(40, 8, 20, seed=seed)
    assert data.task == "graph" and data.num_classes == 2 and data.feat_dim == 1
    assert np.all(data.feat == 1.0)
    assert np.all(np.diff(data.indptr) == 3)  # every node of every graph has degree 3
    sizes = {0: [], 1: []}
    for (adj, _), label in zip(_graphs(data), data.graph_label):
        n = adj.shape[0]
        assert (adj != adj.T).nnz == 0 and adj.diagonal().sum() == 0 and adj.max() == 1  # simple, undirected
        count, comp = connected_components(adj, directed=False)
        if label == 1:
            assert count == 1
        else:
            assert count == 2 and np.bincount(comp).tolist() == [n // 2, n // 2]
        sizes[int(label)].append(n)
    assert np.bincount(data.graph_label).tolist() == [20, 20]
    for m in ("graph_train_mask", "graph_val_mask", "graph_test_mask"):  # stratified splits
        counts = np.bincount(data.graph_label[getattr(data, m)], minlength=2)
        assert counts[0] == counts[1]
    assert not np.any(data.graph_train_mask & data.graph_test_mask)


def test_reg3cc_halves_are_not_id_blocks():
    data = generate_reg3cc(20, 16, 16, seed=3)
    firsts = []
    for (adj, _), label in zip(_graphs(data), data.graph_label):
        if label == 0:
            comp = connected_components(adj, directed=False)[1]
            firsts.append(bool(np.all(comp[:8] == comp[0])))
    assert not all(firsts)


def test_pathspd_labels_are_distances():
    data = generate_pathspd(60, 7, 15, max_dist=5, seed=2)
    assert data.num_classes == 5 and data.feat_dim == 2
    for (adj, nodes), label in zip(_graphs(data), data.graph_label):
        n = adj.shape[0]
        assert adj.nnz == 2 * (n - 1) and connected_components(adj, directed=False)[0] == 1  # a tree
        marked = np.flatnonzero(data.feat[nodes, 1] == 1.0)
        assert marked.shape == (2,) and np.all(data.feat[nodes, 0] == 1.0)
        assert shortest_path(adj, unweighted=True)[marked[0], marked[1]] == label + 1
    assert set(np.unique(data.graph_label)) == set(range(5))


def test_generator_errors():
    with pytest.raises(GeneratorParamError, match="multiple of 4"):
        generate_reg3cc(10, 10, 20)
    with pytest.raises(GeneratorParamError, match="min_nodes"):
        generate_pathspd(10, 3, 10, max_dist=5)
    with pytest.raises(GeneratorParamError, match="num_graphs"):
        generate_reg3cc(1)


def test_lap_pe_per_graph_equals_each_graph_alone():
    data = generate_reg3cc(6, 8, 12, seed=4)
    pe = laplacian_pe(data.indptr, data.indices, data.num_nodes, 3, graph_ptr=data.graph_ptr)
    for adj, nodes in _graphs(data):
        n = adj.shape[0]
        sub = adj.tocsr()
        alone = laplacian_pe(sub.indptr.astype(np.int64), sub.indices.astype(np.int64), n, 3)
        # eigenvectors of a repeated eigenvalue are not unique: compare the spanned projections
        np.testing.assert_allclose(pe[nodes] @ pe[nodes].T, alone @ alone.T, atol=1e-5)


def test_cli_generate_and_preprocess(tmp_path):
    out = tmp_path / "r.h5"

    def run(*a):
        return subprocess.run([sys.executable, "-m", "hpc_graph.cli", *a], capture_output=True, text=True)

    proc = run("generate", "reg3cc", "-o", str(out), "--num-graphs", "12", "--min-nodes", "8", "--max-nodes", "12")
    assert proc.returncode == 0, proc.stderr
    assert "12 graphs" in proc.stdout
    proc = run("preprocess", "lap-pe", str(out), "--k", "2")
    assert proc.returncode == 0 and "each on its own" in proc.stdout, proc.stderr
    proc = run("generate", "reg3cc", "-o", str(tmp_path / "x.h5"), "--min-nodes", "10")
    assert proc.returncode != 0 and "--min-nodes" in proc.stderr
    assert not (tmp_path / "x.h5").exists()
    proc = run("generate", "pathspd", "-o", str(tmp_path / "p.h5"), "--num-graphs", "8", "--max-dist", "3")
    assert proc.returncode == 0, proc.stderr
