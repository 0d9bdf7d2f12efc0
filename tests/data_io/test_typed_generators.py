"""Typed graphs from the generators (``edge_types``): ranges, symmetry per type, class-aware types (csbm)."""
import numpy as np
import pytest

from data_io.generators import GeneratorParamError, generate_csbm, generate_rmat, write_rmat
from data_io.dataset import open_dataset
from data_io.generators._common import draw_edge_types


def _triples(g):
    src, dst = g.edge_sources_destinations()
    return src, dst, g.edge_type.astype(np.int64)


@pytest.mark.parametrize("r", [1, 3, 6])
def test_rmat_types_uniform_and_symmetric(r):
    g = generate_rmat(9, 8, feat_dim=0, edge_types=r, seed=3)
    src, dst, t = _triples(g)
    assert g.edge_type.dtype == np.int16 and t.min() >= 0 and t.max() < r
    assert set(zip(src.tolist(), dst.tolist(), t.tolist())) == set(zip(dst.tolist(), src.tolist(), t.tolist()))
    counts = np.bincount(t, minlength=r)
    assert counts.min() > 0.7 * len(t) / r  # roughly uniform (thousands of edges)
    # same seed, same types; another seed, other types; the untyped graph has the same edges
    np.testing.assert_array_equal(generate_rmat(9, 8, feat_dim=0, edge_types=r, seed=3).edge_type, g.edge_type)
    plain = generate_rmat(9, 8, feat_dim=0, seed=3)
    assert plain.edge_type is None
    np.testing.assert_array_equal(plain.indices, g.indices)
    if r > 1:
        assert (draw_edge_types(g.indptr, g.indices, r, seed=4) != g.edge_type).any()


@pytest.mark.parametrize("r", [2, 3, 5])
def test_csbm_types_split_by_class(r):
    g = generate_csbm(600, 4, avg_degree=8, homophily=0.5, feat_dim=3, edge_types=r, seed=1)
    src, dst, t = _triples(g)
    same = g.label[src] == g.label[dst]
    k = (r + 1) // 2
    assert t[same].max() < k and t[~same].min() >= k and t[~same].max() < r
    assert set(zip(src.tolist(), dst.tolist(), t.tolist())) == set(zip(dst.tolist(), src.tolist(), t.tolist()))


def test_written_file_carries_types(tmp_path):
    info = write_rmat(tmp_path / "t.h5", 8, 4, feat_dim=2, edge_types=4, seed=2)
    g = generate_rmat(8, 4, feat_dim=2, edge_types=4, seed=2)
    with open_dataset(tmp_path / "t.h5") as ds:
        np.testing.assert_array_equal(ds.edge_type(), g.edge_type)
    assert info["num_edges"] == len(g.edge_type)


@pytest.mark.parametrize("bad", [-1, 40000, 1.5])
def test_bad_edge_types(tmp_path, bad):
    with pytest.raises(GeneratorParamError, match="edge_types"):
        generate_rmat(6, 2, edge_types=bad)
    with pytest.raises(GeneratorParamError, match="edge_types"):
        write_rmat(tmp_path / "x.h5", 6, 2, edge_types=bad)
    assert not (tmp_path / "x.h5").exists()
