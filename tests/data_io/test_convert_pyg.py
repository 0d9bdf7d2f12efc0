"""from_pyg: a torch_geometric Data round-trips through a dataset file."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from data_io.converters import from_pyg
from data_io.dataset import open_dataset, write_dataset
from data_io.errors import FormatError


def _random_data(seed, n=40, e=200, f=6, c=5, weight="edge_weight"):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[:, :10] = ei[:, 10:20]  # duplicates are kept
    kw = dict(x=torch.randn(n, f, generator=g), y=torch.randint(0, c, (n,), generator=g),
              train_mask=torch.rand(n, generator=g) < 0.5, val_mask=torch.rand(n, generator=g) < 0.3,
              test_mask=torch.rand(n, generator=g) < 0.3)
    if weight == "edge_weight":
        kw["edge_weight"] = torch.rand(e, generator=g)
    elif weight == "edge_attr":
        kw["edge_attr"] = torch.rand(e, 1, generator=g)
    return Data(edge_index=ei, num_nodes=n, **kw)


@pytest.mark.parametrize("seed,weight", [(0, "edge_weight"), (1, "edge_attr"), (2, None)])
def test_round_trip(tmp_path, seed, weight):
    data = _random_data(seed, weight=weight)
    graph = from_pyg(data, name="rnd")
    write_dataset(tmp_path / "g.h5", graph)
    with open_dataset(tmp_path / "g.h5") as ds:
        g = ds.load()
        assert ds.name == "rnd" and ds.num_classes == int(data.y.max()) + 1
    ei = data.edge_index.numpy()
    order = np.lexsort((ei[0], ei[1]))  # CSR over destinations, stable within equal edges
    src, dst = g.edge_sources_destinations()
    np.testing.assert_array_equal(src, ei[0][order])
    np.testing.assert_array_equal(dst, ei[1][order])
    w = {"edge_weight": data.get("edge_weight"), "edge_attr": data.get("edge_attr")}.get(weight)
    if w is None:
        assert g.edge_weight is None
    else:
        np.testing.assert_array_equal(g.edge_weight, w.reshape(-1).numpy()[order])
    np.testing.assert_array_equal(g.feat, data.x.numpy())
    np.testing.assert_array_equal(g.label, data.y.numpy())
    for m in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(g, m), data[m].numpy())
    assert g.directed  # random edges are not symmetric


def test_symmetric_column_labels_and_num_classes():
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    data = Data(edge_index=ei, y=torch.tensor([[0], [2], [1]]), num_nodes=3)
    g = from_pyg(data, num_classes=6)
    assert not g.directed and g.num_classes == 6 and g.feat is None
    np.testing.assert_array_equal(g.label, [0, 2, 1])
    np.testing.assert_array_equal(g.indptr, [0, 1, 3, 4])
    np.testing.assert_array_equal(g.indices, [1, 0, 2, 1])


@pytest.mark.parametrize("field,value,what", [
    ("y", torch.rand(40), "integer"),
    ("y", torch.zeros(40, 3, dtype=torch.long), "shape"),
    ("x", torch.rand(39, 3), "shape"),
    ("train_mask", torch.zeros(40, dtype=torch.long), "bool"),
    ("edge_weight", torch.rand(7), "shape"),
])
def test_bad_fields(field, value, what):
    data = _random_data(3)
    data[field] = value
    with pytest.raises(FormatError) as err:
        from_pyg(data)
    assert f": {field}: " in str(err.value) and what in str(err.value)


def test_bad_edges_and_type():
    data = _random_data(4)
    data.edge_index = data.edge_index.clone()
    data.edge_index[1, 3] = 40
    with pytest.raises(FormatError, match="edge_index"):
        from_pyg(data)
    with pytest.raises(TypeError, match="torch_geometric.data.Data"):
        from_pyg({"edge_index": data.edge_index})


def test_import_error_without_torch_geometric(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric.data", None)  # import now fails
    with pytest.raises(ImportError, match="pip install torch_geometric"):
        from_pyg(object())


def test_edge_types_follow_their_edges_both_ways():
    from data_io.converters import to_pyg

    data = _random_data(5)
    data.edge_type = torch.randint(0, 4, (data.edge_index.shape[1],), generator=torch.Generator().manual_seed(5))
    graph = from_pyg(data)
    ei = data.edge_index.numpy()
    order = np.lexsort((ei[0], ei[1]))
    np.testing.assert_array_equal(graph.edge_type, data.edge_type.numpy()[order])
    np.testing.assert_array_equal(graph.edge_weight, data.edge_weight.numpy()[order])
    back = to_pyg(graph)
    np.testing.assert_array_equal(back.edge_type.numpy(), data.edge_type.numpy()[order])
    data.edge_type = torch.rand(data.edge_index.shape[1])
    with pytest.raises(FormatError, match=": edge_type: expected integer"):
        from_pyg(data)
