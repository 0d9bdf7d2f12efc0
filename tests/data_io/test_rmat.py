"""Graph500 Kronecker generator: kernel vs a NumPy reference, CSR building, graph properties, files."""
from __future__ import annotations

import numpy as np
import pytest

from data_io.dataset import MASKS, open_dataset, validate_dataset
from data_io.errors import OutputExistsError
from data_io.generators import GeneratorParamError, generate_rmat, write_rmat
from data_io.generators import _common
from numba_kernels.cpu.rmat import rmat_edges

U64 = np.uint64


def _mix64_ref(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def _rmat_ref(seed, scale, a, b, c, first, m, perm):
    """Plain NumPy version of the kernel: the same counter-based draws, vectorised over edges."""
    golden = U64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        key = _mix64_ref(np.array([seed], dtype=U64) * golden + U64(0x5DEECE66D))[0]
        state = key ^ _mix64_ref(np.arange(first, first + m, dtype=U64))
        u = np.zeros(m, dtype=np.int64)
        v = np.zeros(m, dtype=np.int64)
        for _ in range(scale):
            state = state + golden
            z = _mix64_ref(state)
            r1 = (z >> U64(32)).astype(np.float64) / 2**32
            r2 = (z & U64(0xFFFFFFFF)).astype(np.float64) / 2**32
            ii = r1 > a + b
            jj = r2 > np.where(ii, c / (1 - a - b), a / (a + b))
            u = (u << 1) | ii
            v = (v << 1) | jj
    if len(perm):
        u, v = perm[u], perm[v]
    return u, v


@pytest.mark.parametrize("with_perm", [False, True])
def test_kernel_matches_numpy_reference(with_perm):
    rng = np.random.default_rng(5)
    scale, m, first = 9, 3000, 12345
    a, b, c = rng.uniform(0.1, 0.3, 3)
    perm = rng.permutation(1 << scale).astype(np.int64) if with_perm else np.empty(0, np.int64)
    src = np.empty(m, np.int64)
    dst = np.empty(m, np.int64)
    rmat_edges(77, scale, a, b, c, first, perm, src, dst)
    rs, rd = _rmat_ref(77, scale, a, b, c, first, m, perm)
    np.testing.assert_array_equal(src, rs)
    np.testing.assert_array_equal(dst, rd)


def test_kernel_split_into_calls_gives_same_edges():
    m = 1000
    full_s, full_d = np.empty(m, np.int32), np.empty(m, np.int32)
    none = np.empty(0, np.int32)
    rmat_edges(3, 10, 0.57, 0.19, 0.19, 0, none, full_s, full_d)
    part_s, part_d = np.empty(m - 400, np.int32), np.empty(m - 400, np.int32)
    rmat_edges(3, 10, 0.57, 0.19, 0.19, 400, none, part_s, part_d)
    np.testing.assert_array_equal(full_s[400:], part_s)
    np.testing.assert_array_equal(full_d[400:], part_d)


def test_kernel_bit_frequencies_follow_quadrant_probabilities():
    a, b, c = 0.57, 0.19, 0.19
    d = 1 - a - b - c
    m, scale = 200_000, 8
    src, dst = np.empty(m, np.int64), np.empty(m, np.int64)
    rmat_edges(11, scale, a, b, c, 0, np.empty(0, np.int64), src, dst)
    tol = 4 * np.sqrt(0.25 / m)  # 4 standard errors
    for level in range(scale):
        sb, db = (src >> level) & 1, (dst >> level) & 1
        assert abs(np.mean((sb == 0) & (db == 0)) - a) < tol
        assert abs(np.mean((sb == 0) & (db == 1)) - b) < tol
        assert abs(np.mean((sb == 1) & (db == 0)) - c) < tol
        assert abs(np.mean((sb == 1) & (db == 1)) - d) < tol


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("drop_loops", [False, True])
@pytest.mark.parametrize("dedupe", [False, True])
def test_coo_to_csr_matches_numpy_reference(symmetric, drop_loops, dedupe):
    rng = np.random.default_rng(int(symmetric) * 4 + int(drop_loops) * 2 + int(dedupe))
    n, m = 50, 600
    src = rng.integers(0, n, m).astype(np.int32)
    dst = rng.integers(0, n, m).astype(np.int32)
    src[:20] = dst[:20]  # make sure there are self-loops
    indptr, indices = _common.coo_to_csr(src, dst, n, symmetric=symmetric, drop_self_loops=drop_loops,
                                         dedupe=dedupe)
    s, d = src.astype(np.int64), dst.astype(np.int64)
    if symmetric:
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
    if drop_loops:
        keep = s != d
        s, d = s[keep], d[keep]
    key = d * n + s
    key = np.unique(key) if dedupe else np.sort(key)
    ref_indptr = np.concatenate([[0], np.cumsum(np.bincount(key // n, minlength=n))])
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    np.testing.assert_array_equal(indptr, ref_indptr)
    np.testing.assert_array_equal(indices, key % n)


def _degrees(g):
    return np.diff(g.indptr)


def test_graph_is_valid_symmetric_simple_and_split():
    g = generate_rmat(11, 8, feat_dim=8, num_classes=7, train_frac=0.5, val_frac=0.25, test_frac=0.1, seed=3)
    g.validate()
    n = 1 << 11
    assert g.num_nodes == n and g.indices.dtype == np.int32 and not g.directed
    assert g.feat.shape == (n, 8) and g.feat.dtype == np.float32
    assert g.label.min() >= 0 and g.label.max() < 7 and len(np.unique(g.label)) == 7
    src, dst = g.edge_sources_destinations()
    assert not np.any(src == dst), "self-loop"
    key = dst * n + src
    assert len(np.unique(key)) == len(key), "duplicate edge"
    np.testing.assert_array_equal(np.sort(key), np.sort(src * n + dst))  # symmetric
    sizes = [int(getattr(g, m).sum()) for m in MASKS]
    assert sizes == [round(0.5 * n), round(0.25 * n), round(0.1 * n)]
    assert not np.any(g.train_mask & g.val_mask) and not np.any(g.train_mask & g.test_mask)
    assert not np.any(g.val_mask & g.test_mask)


def test_options_keep_loops_duplicates_and_direction():
    scale, ef, seed = 9, 8, 4
    n, m = 1 << scale, ef << scale
    raw = generate_rmat(scale, ef, symmetrize=False, remove_self_loops=False, remove_duplicates=False,
                        feat_dim=0, seed=seed)
    assert raw.directed and raw.num_edges == m and raw.feat is None
    src, dst = raw.edge_sources_destinations()
    loops = int(np.sum(src == dst))
    assert loops > 0 and len(np.unique(dst * n + src)) < m  # R-MAT repeats edges at this density
    sym = generate_rmat(scale, ef, remove_duplicates=False, feat_dim=0, seed=seed)
    assert sym.num_edges == 2 * (m - loops)
    clean = generate_rmat(scale, ef, feat_dim=0, seed=seed)
    both = np.concatenate([dst * n + src, src * n + dst])
    assert clean.num_edges == len(np.unique(both[np.concatenate([src != dst] * 2)]))


def test_degree_tail_is_heavy_compared_to_uniform_random_graph():
    scale, ef = 13, 16
    g = generate_rmat(scale, ef, feat_dim=0, seed=8)
    deg = _degrees(g)
    n = g.num_nodes
    # reference: a uniform random graph with the same number of edges, built the same way
    rng = np.random.default_rng(0)
    s = rng.integers(0, n, g.num_edges // 2).astype(np.int32)
    d = rng.integers(0, n, g.num_edges // 2).astype(np.int32)
    ip, _ = _common.coo_to_csr(s, d, n, symmetric=True, drop_self_loops=True, dedupe=True)
    deg_er = np.diff(ip)
    assert deg.max() > 20 * deg.mean()
    assert deg.max() / deg.mean() > 10 * (deg_er.max() / deg_er.mean())
    assert deg.std() > 5 * deg_er.std()


def test_vertex_ids_are_permuted():
    g = generate_rmat(13, 8, feat_dim=0, seed=2)
    deg = _degrees(g).astype(np.float64)
    ids = np.arange(g.num_nodes, dtype=np.float64)
    # without the permutation, low ids (many 0 bits) get most edges: strong negative correlation
    assert abs(np.corrcoef(ids, deg)[0, 1]) < 0.05
    assert np.argmax(deg) != 0


def test_same_seed_same_graph_different_seed_different_graph():
    kw = dict(feat_dim=4, num_classes=3)
    g1, g2, g3 = (generate_rmat(9, 4, seed=10, **kw), generate_rmat(9, 4, seed=10, **kw),
                  generate_rmat(9, 4, seed=11, **kw))
    for f in ("indptr", "indices", "feat", "label", *MASKS):
        np.testing.assert_array_equal(getattr(g1, f), getattr(g2, f))
    assert not np.array_equal(g1.indptr, g3.indptr) or not np.array_equal(g1.indices, g3.indices)
    assert not np.array_equal(g1.feat, g3.feat)
    assert not np.array_equal(g1.label, g3.label)
    assert not np.array_equal(g1.train_mask, g3.train_mask)


def test_write_rmat_streams_same_arrays_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "_FEAT_BLOCK_BYTES", 1024)  # 64-row blocks: many write calls
    path = tmp_path / "r.h5"
    info = write_rmat(path, 10, 4, feat_dim=6, num_classes=5, seed=9)
    g = generate_rmat(10, 4, feat_dim=6, num_classes=5, seed=9)
    assert validate_dataset(path) == []
    assert info == {"num_nodes": g.num_nodes, "num_edges": g.num_edges, "feat_dim": 6}
    with open_dataset(path) as ds:
        assert ds.num_classes == 5 and not ds.directed and ds.name == "rmat-s10-ef4"
        d = ds.load()
    for f in ("indptr", "indices", "feat", "label", *MASKS):
        np.testing.assert_array_equal(getattr(d, f), getattr(g, f))
    with pytest.raises(OutputExistsError):
        write_rmat(path, 10, 4, seed=9)
    write_rmat(path, 8, 2, feat_dim=0, force=True)
    assert open_dataset(path).num_nodes == 256


@pytest.mark.parametrize("kwargs, param", [
    (dict(scale=0), "scale"), (dict(scale=41), "scale"), (dict(edge_factor=-1), "edge_factor"),
    (dict(feat_dim=-2), "feat_dim"), (dict(num_classes=0), "num_classes"),
    (dict(scale=3, num_classes=9), "num_classes"),
    (dict(train_frac=0.7, val_frac=0.3, test_frac=0.2), "train_frac"), (dict(val_frac=-0.1), "val_frac"),
    (dict(a=0.6, b=0.3, c=0.3), "a"), (dict(seed=-1), "seed"), (dict(scale=2.5), "scale"),
])
def test_bad_arguments_name_the_parameter_and_write_nothing(tmp_path, kwargs, param):
    args = dict(scale=6, edge_factor=2)
    args.update(kwargs)
    with pytest.raises(GeneratorParamError) as err:
        generate_rmat(**args)
    assert err.value.param == param and str(err.value).startswith(param)
    with pytest.raises(GeneratorParamError):
        write_rmat(tmp_path / "x.h5", **args)
    assert list(tmp_path.iterdir()) == []
