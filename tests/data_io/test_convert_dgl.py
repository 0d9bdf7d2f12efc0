"""from_dgl / to_dgl: a graph with DGL's interface (``num_nodes()``, ``edges(order="eid")``, ``ndata``, ``edata``)
round-trips through a dataset file with its structure, features, labels, masks, edge weights and edge types exactly;
bad fields are named as DGL names them. CI has no dgl: ``to_dgl`` builds through a module standing in for dgl's
``graph`` constructor, and tests/data_io/dgl_round_trip.py runs the same round trip with the real dgl where it is
installed."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from data_io.converters import from_dgl, to_dgl
from data_io.dataset import open_dataset, write_dataset
from data_io.errors import FormatError


class _Graph:
    """DGL's graph interface, as much of it as the converters use."""

    def __init__(self, edges, num_nodes):
        self._u, self._v = (torch.as_tensor(t) for t in edges)
        self._n = int(num_nodes)
        self.ndata, self.edata = {}, {}
        self.is_homogeneous = True

    def num_nodes(self):
        return self._n

    def edges(self, order="eid"):
        assert order == "eid"
        return self._u, self._v


def _random(seed, n=40, e=220, etype_key="etype"):
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    u[:10], v[:10] = u[10:20], v[10:20]  # repeated edges are kept
    graph = _Graph((u, v), n)
    graph.ndata.update(feat=torch.randn(n, 5, generator=g), label=torch.randint(0, 4, (n,), generator=g),
                       train_mask=torch.rand(n, generator=g) < 0.5, val_mask=torch.rand(n, generator=g) < 0.3,
                       test_mask=torch.rand(n, generator=g) < 0.3)
    graph.edata["weight"] = torch.rand(e, 1, generator=g)
    graph.edata[etype_key] = torch.randint(0, 5, (e,), generator=g)
    return graph


@pytest.fixture
def fake_dgl(monkeypatch):
    module = types.ModuleType("dgl")
    module.graph = lambda edges, num_nodes: _Graph(edges, num_nodes)
    monkeypatch.setitem(sys.modules, "dgl", module)


@pytest.mark.parametrize("seed,etype_key", [(0, "etype"), (1, "_TYPE")])
def test_round_trip_through_a_file(tmp_path, seed, etype_key, fake_dgl):
    g = _random(seed, etype_key=etype_key)
    write_dataset(tmp_path / "g.h5", from_dgl(g, name="rnd"))
    with open_dataset(tmp_path / "g.h5") as ds:
        assert ds.name == "rnd" and ds.num_classes == int(g.ndata["label"].max()) + 1
        back = to_dgl(ds.load())
    u, v = g.edges()
    order = np.lexsort((u.numpy(), v.numpy()))  # grouped by destination, stable among equal edges
    u2, v2 = back.edges()
    np.testing.assert_array_equal(u2.numpy(), u.numpy()[order])
    np.testing.assert_array_equal(v2.numpy(), v.numpy()[order])
    np.testing.assert_array_equal(back.edata["weight"].numpy(), g.edata["weight"].numpy()[:, 0][order])
    np.testing.assert_array_equal(back.edata["etype"].numpy(), g.edata[etype_key].numpy()[order])
    for key, values in g.ndata.items():
        np.testing.assert_array_equal(back.ndata[key].numpy(), values.numpy())
        assert back.ndata[key].dtype == values.dtype
    assert back.num_nodes() == g.num_nodes()


def test_other_keys_and_a_bare_graph():
    g = _Graph((torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0, 2, 1])), 3)
    g.ndata["x"] = torch.ones(3, 2)
    g.edata["w"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    data = from_dgl(g, feat="x", weight="w", num_classes=6)
    assert not data.directed and data.num_classes == 6 and data.label is None and data.edge_type is None
    np.testing.assert_array_equal(data.indptr, [0, 1, 3, 4])
    np.testing.assert_array_equal(data.indices, [1, 0, 2, 1])
    np.testing.assert_array_equal(data.edge_weight, [2.0, 1.0, 4.0, 3.0])


@pytest.mark.parametrize("where,key,value,what", [
    ("ndata", "label", torch.rand(40), "integer"),
    ("ndata", "feat", torch.rand(39, 3), "shape"),
    ("ndata", "train_mask", torch.zeros(40, dtype=torch.long), "bool"),
    ("edata", "weight", torch.rand(7), "shape"),
    ("edata", "etype", torch.full((220,), -1), "outside"),
])
def test_bad_fields_are_named_as_dgl_names_them(where, key, value, what):
    g = _random(3)
    getattr(g, where)[key] = value
    with pytest.raises(FormatError) as err:
        from_dgl(g)
    assert f"{where}[{key!r}]" in str(err.value) and what in str(err.value)


def test_bad_graphs():
    g = _random(4)
    g._v = g._v.clone()
    g._v[3] = 40
    with pytest.raises(FormatError, match="edges\\(\\): node ids 0..40 outside"):
        from_dgl(g)
    g = _random(5)
    g.is_homogeneous = False
    with pytest.raises(ValueError, match="dgl.to_homogeneous"):
        from_dgl(g)
    with pytest.raises(TypeError, match="dgl.DGLGraph"):
        from_dgl({"edges": None})


def test_to_dgl_without_dgl_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dgl", None)  # import now fails
    with pytest.raises(ImportError, match="needs dgl"):
        to_dgl(None)
