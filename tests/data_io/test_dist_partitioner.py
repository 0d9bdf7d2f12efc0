"""Pieces of the distributed partitioner on one rank (``MPI.COMM_SELF``), against NumPy references.

The multi-rank runs (2 and 4 ranks, ParMETIS API and random) are in tests/mpi/test_dist_partition.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from data_io import _arrays
from data_io import dist_partitioner as dp
from data_io import parmetis
from data_io.partitioner import _symmetrise as serial_symmetrise
from hpc_graph.comm.env import select_mpi_library

SELF = MPI.COMM_SELF


def _random_csr(n, e, seed):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, n, e))
    src = rng.integers(0, n, e)
    src[:5] = dst[:5]  # some self loops
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1])
def test_symmetrise_matches_serial(seed):
    indptr, indices = _random_csr(50, 300, seed)
    xadj, adj = dp._symmetrise(SELF, 0, 50, 50, indptr, indices)
    ref_x, ref_a = serial_symmetrise(indptr, indices)
    assert np.array_equal(xadj, ref_x) and np.array_equal(adj, ref_a)


def test_alltoallv_in_rounds(monkeypatch):
    monkeypatch.setattr(_arrays, "_MAX_CALL_BYTES", 24)  # 3 int64 per call: many rounds
    data = np.arange(40, dtype=np.int64).reshape(20, 2)
    got, counts = _arrays.alltoallv(SELF, data, np.array([20]))
    assert np.array_equal(got, data) and counts.tolist() == [20]
    empty, counts = _arrays.alltoallv(SELF, np.zeros((0, 3), np.float32), np.array([0]))
    assert empty.shape == (0, 3) and counts.tolist() == [0]


def test_ranges():
    starts, lengths = np.array([5, 0, 9, 2]), np.array([2, 0, 3, 1])
    ref = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    assert np.array_equal(dp._ranges(starts, lengths), ref)
    assert len(dp._ranges(np.zeros(0), np.zeros(0))) == 0


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_random_parts_exact_deal(parts):
    train = np.random.default_rng(parts).random(101) < 0.3
    p = dp._random_parts(SELF, parts, seed=4, train=train)
    nodes, tr = np.bincount(p, minlength=parts), np.bincount(p[train], minlength=parts)
    assert nodes.max() - nodes.min() <= 1 and tr.max() - tr.min() <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repair_train_balance(seed):
    rng = np.random.default_rng(seed)
    n, P = 400, 4
    parts = rng.integers(0, P, n)
    train = np.zeros(n, dtype=bool)
    train[np.flatnonzero(parts == 0)[:60]] = True  # every training node in part 0 at first
    train[rng.choice(n, 20, replace=False)] = True
    degree = rng.integers(0, 10, n)
    new, swaps = dp._repair_train(SELF, parts, train, degree, P, 1.05)
    assert np.array_equal(np.bincount(new, minlength=P), np.bincount(parts, minlength=P))  # node counts kept
    t = np.bincount(new[train], minlength=P)
    assert t.max() <= max(np.floor(1.05 * train.sum() / P), np.ceil(train.sum() / P))
    moved = new != parts
    assert swaps > 0 and moved[train].sum() == swaps and moved[~train].sum() == swaps
    # lowest degree first among the training nodes leaving part 0
    left = np.flatnonzero(train & (parts == 0))
    gone = left[moved[left]]
    stay = left[~moved[left]]
    assert degree[gone].max() <= degree[stay].min()


def test_repair_train_noop_when_balanced():
    parts = np.arange(40) % 4
    train = np.arange(40) < 8
    new, swaps = dp._repair_train(SELF, parts, train, np.ones(40, np.int64), 4, 1.05)
    assert swaps == 0 and np.array_equal(new, parts)


def test_linked_mpi(tmp_path):
    for data, want in ((b"\x7fELF..libmpi.so.40..", "openmpi"), (b"\x7fELF..libmpi.so.12..", "mpich"),
                       (b"\x7fELF....", "none")):
        f = tmp_path / "lib.so"
        f.write_bytes(data)
        assert parmetis._linked_mpi(str(f)) == want
    assert parmetis._linked_mpi(str(tmp_path / "missing.so")) == "unreadable"


def test_missing_library_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_GRAPH_PARMETIS_LIB", str(tmp_path / "libparmetis.so"))
    with pytest.raises(parmetis.ParMetisUnavailable, match="apt-get install libscotchparmetis-dev"):
        parmetis.load_library()
    monkeypatch.setenv("HPC_GRAPH_PARMETIS_IDX", "16")
    with pytest.raises(parmetis.ParMetisUnavailable, match="HPC_GRAPH_PARMETIS_IDX"):
        parmetis.load_library()


def test_select_mpi_library():
    env = {"OMPI_COMM_WORLD_SIZE": "2"}
    # in this process mpi4py.MPI is imported already: nothing may change any more
    assert select_mpi_library(env) is None and "MPI4PY_LIBMPI" not in env
    import sys

    saved = sys.modules.pop("mpi4py.MPI")
    try:
        assert select_mpi_library(env) and env["MPI4PY_LIBMPI"]
        assert select_mpi_library({"PMI_RANK": "0"}) is None  # not Open MPI's launcher
        user = {"OMPI_COMM_WORLD_SIZE": "2", "MPI4PY_LIBMPI": "/opt/mpi/lib/libmpi.so"}
        assert select_mpi_library(user) is None and user["MPI4PY_LIBMPI"] == "/opt/mpi/lib/libmpi.so"
    finally:
        sys.modules["mpi4py.MPI"] = saved


def test_unique_helpers_match_numpy():
    a = np.random.default_rng(5).integers(0, 50, 300)
    u, inv = _arrays._unique_inverse(a)
    ru, rinv = np.unique(a, return_inverse=True)
    assert np.array_equal(u, ru) and np.array_equal(inv, rinv.reshape(-1)) and np.array_equal(u[inv], a)
    assert np.array_equal(_arrays._sorted_unique(a), ru)
    assert len(_arrays._sorted_unique(np.zeros(0, np.int64))) == 0
    assert len(_arrays._unique_inverse(np.zeros(0, np.int64))[0]) == 0


@pytest.mark.parametrize("n,edges,parts", [(60, 40, 4), (60, 12, 5), (40, 400, 3)])
def test_library_parts_leaves_out_nodes_without_edges(monkeypatch, n, edges, parts):
    """The library gets exactly the subgraph induced by the connected nodes, relabelled in order, and the
    fewest parts that hold it at n/P nodes each; the nodes without edges fill every part up to ceil(n/P)."""
    indptr, indices = _random_csr(n, edges, n + edges)
    xadj, adj = dp._symmetrise(SELF, 0, n, n, indptr, indices)
    connected = np.flatnonzero(np.diff(xadj) > 0)
    c = len(connected)
    calls = []

    def fake_part_kway(lib, comm, vtxdist, sx, sa, vw, k, *, seed, imbalance):
        calls.append((vtxdist.copy(), sx.copy(), sa.copy(), vw.copy(), k))
        return np.arange(len(sx) - 1) * k // (len(sx) - 1)  # contiguous, balanced

    monkeypatch.setattr(parmetis, "part_kway", fake_part_kway)
    vw = np.stack([np.ones(n, np.int64), np.arange(n) % 2], 1)
    info = {}
    got = dp._library_parts(SELF, None, n, np.array([0, n]), xadj, adj, vw, parts, 0, 1.05, info)
    want_parts = min(parts, -(-c * parts // n))
    assert {k: v for k, v in info.items() if k != "multilevel"} == {"isolated_nodes": n - c,
                                                                    "library_parts": want_parts}
    assert len(calls) == (1 if want_parts > 1 else 0)  # one part needs no library call
    (vtxdist, sx, sa, svw, k), = calls or [(None,) * 5]
    if want_parts == parts:  # no room to leave anything out: the whole graph goes in
        assert np.array_equal(sx, xadj) and np.array_equal(sa, adj) and k == parts
        return
    if want_parts > 1:
        new = np.full(n, -1)
        new[connected] = np.arange(c)
        assert vtxdist.tolist() == [0, c] and k == want_parts
        assert np.array_equal(sx, np.concatenate([xadj[connected], [xadj[-1]]]))
        assert np.array_equal(sa, new[adj]) and np.array_equal(svw, vw[connected])
    cap = -(-n // parts)
    counts = np.bincount(got, minlength=parts)
    conn = np.bincount(got[connected], minlength=parts)
    assert counts.sum() == n and set(got[connected].tolist()) <= set(range(want_parts))  # the rest hold no edges
    lonely = np.setdiff1d(np.arange(n), connected)
    assert (np.diff(got[lonely]) >= 0).all()  # dealt in id order, part after part
    filled = np.unique(got[lonely])
    assert (counts[filled[:-1]] == cap).all() and counts[filled[-1]] <= cap  # each filled up to ceil(n/P)
    assert (conn[filled] < cap).all()
