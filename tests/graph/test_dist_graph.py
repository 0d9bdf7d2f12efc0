"""DistGraph construction (single process): blocks, plans, degrees against a plain NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data_io.partition import Partition
from hpc_graph.graph.dist_graph import DistGraph, check_ranks, transpose_csr


class _Comm:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


def _random_graph(rng, n: int, e: int, isolated: int):
    """Edges src -> dst among nodes [0, n - isolated) (the last nodes are isolated), with duplicates."""
    src = rng.integers(0, n - isolated, e)
    dst = rng.integers(0, n - isolated, e)
    return src, dst


def _partitions(src, dst, assign, num_parts):
    """Reference partitioner, written from the Partition docstring with plain loops."""
    n = len(assign)
    order = np.lexsort((np.arange(n), assign))           # new gid -> old id
    new_of_old = np.empty(n, dtype=np.int64)
    new_of_old[order] = np.arange(n)
    ranges = np.zeros(num_parts + 1, dtype=np.int64)
    ranges[1:] = np.cumsum(np.bincount(assign, minlength=num_parts))
    gsrc, gdst = new_of_old[src], new_of_old[dst]
    parts = []
    for p in range(num_parts):
        lo, hi = ranges[p], ranges[p + 1]
        rows = [[] for _ in range(hi - lo)]
        for s, d in zip(gsrc, gdst):              # edge order of the input, per destination
            if lo <= d < hi:
                rows[d - lo].append(int(s))
        halo = sorted({s for r in rows for s in r if not lo <= s < hi})
        col = {g: g - lo for g in range(lo, hi)}
        col.update({g: (hi - lo) + k for k, g in enumerate(halo)})
        indptr = np.zeros(hi - lo + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        indices = np.array([col[s] for r in rows for s in r], dtype=np.int64)
        halo_offsets = np.searchsorted(np.array(halo, dtype=np.int64), ranges).astype(np.int64)
        parts.append(dict(part_id=p, num_parts=num_parts, node_ranges=ranges, orig_id=order[lo:hi],
                          halo_gid=np.array(halo, dtype=np.int64), halo_offsets=halo_offsets,
                          indptr=indptr, indices=indices, global_num_nodes=n))
    for p in range(num_parts):          # send lists: what q's halo holds of p, ascending gid
        lids, offs = [], [0]
        for q in range(num_parts):
            hq = parts[q]
            mine = hq["halo_gid"][hq["halo_offsets"][p]:hq["halo_offsets"][p + 1]] if q != p else []
            lids.extend(int(g - ranges[p]) for g in mine)
            offs.append(len(lids))
        parts[p]["send_lid"] = np.array(lids, dtype=np.int64)
        parts[p]["send_offsets"] = np.array(offs, dtype=np.int64)
    return [Partition(**d) for d in parts], new_of_old


def _dense(g) -> np.ndarray:
    a = np.zeros((g.num_dst, g.num_src))
    for i in range(g.num_dst):
        for k in range(int(g.indptr[i]), int(g.indptr[i + 1])):
            a[i, int(g.indices[k])] += 1
    return a


@pytest.mark.parametrize("num_parts,seed", [(1, 0), (3, 1), (4, 2)])
def test_blocks_plans_degrees(num_parts, seed):
    rng = np.random.default_rng(seed)
    n = 40
    src, dst = _random_graph(rng, n, 150, isolated=5)
    assign = rng.integers(0, num_parts, n)
    assign[:num_parts] = np.arange(num_parts)             # no empty part
    parts, new_of_old = _partitions(src, dst, assign, num_parts)
    gsrc, gdst = new_of_old[src], new_of_old[dst]
    graphs = [DistGraph.from_partition(pt, _Comm(pt.part_id, num_parts), "cpu", torch.float64)
              for pt in parts]
    for p, (pt, dg) in enumerate(zip(parts, graphs)):
        lo, hi = pt.node_ranges[p], pt.node_ranges[p + 1]
        mine = (gdst >= lo) & (gdst < hi)
        # local CSR unchanged; global in-degree == local row length
        assert torch.equal(dg.local.indptr, torch.as_tensor(pt.indptr))
        assert dg.local.num_src == pt.num_owned + pt.num_halo
        # int32 columns (the local ids fit), in the blocks too
        assert dg.local.indices.dtype == torch.int32 and all(b.indices.dtype == torch.int32
                                                             for b in dg.blocks.values())
        np.testing.assert_array_equal(dg.in_degree.numpy(), np.bincount(gdst[mine] - lo, minlength=hi - lo))
        np.testing.assert_array_equal(dg.gid.numpy(), np.arange(lo, hi))
        # blocks partition the edges by the owner of the source, columns re-based per owner
        edges = []
        for q, blk in dg.blocks.items():
            assert blk.num_dst == pt.num_owned
            cols_gid = dg.block_gid(q).numpy()
            assert blk.num_src == len(cols_gid)
            assert (dg.book.owner(cols_gid) == q).all()
            for i in range(blk.num_dst):
                for k in range(int(blk.indptr[i]), int(blk.indptr[i + 1])):
                    edges.append((lo + i, int(cols_gid[int(blk.indices[k])])))
        assert sorted(edges) == sorted(zip(gdst[mine].tolist(), gsrc[mine].tolist()))
        # sum of blocks, columns placed back, is the local adjacency
        dense = np.zeros((dg.num_owned, dg.num_owned + dg.num_halo))
        dense[:, :dg.num_owned] += _dense(dg.blocks[p])
        for q in dg.recv_count:
            a, b = dg.halo_range(q)
            dense[:, dg.num_owned + a:dg.num_owned + b] += _dense(dg.blocks[q])
        np.testing.assert_array_equal(dense, _dense(dg.local))
        assert set(dg.blocks) == {p} | set(dg.recv_count)
        # transposes
        for q in dg.blocks:
            np.testing.assert_array_equal(_dense(dg.block_t(q)), _dense(dg.blocks[q]).T)
        # self loops appended once per row
        np.testing.assert_array_equal(_dense(dg.local_self_loops()),
                                      _dense(dg.local) + np.eye(dg.num_owned, dg.local.num_src))
        np.testing.assert_array_equal(_dense(dg.identity()), np.eye(dg.num_owned))
    # send plans match the peers' halo blocks, sizes agree both ways
    for p, dg in enumerate(graphs):
        for q, other in enumerate(graphs):
            if q == p:
                continue
            assert dg.send_count(q) == other.recv_count.get(p, 0)
            if dg.send_count(q):
                a, b = other.halo_range(p)
                np.testing.assert_array_equal(dg.gid[dg.send_lid[q]].numpy(), other.halo_gid[a:b].numpy())


def test_rank_count_mismatch_names_dir_and_numbers():
    rng = np.random.default_rng(3)
    src, dst = _random_graph(rng, 12, 30, isolated=0)
    parts, _ = _partitions(src, dst, np.arange(12) % 2, 2)
    with pytest.raises(ValueError, match=r"/data/parts.*2 parts.*3 ranks"):
        DistGraph.from_partition(parts[0], _Comm(0, 3), source="/data/parts")
    with pytest.raises(ValueError, match="2 parts"):
        check_ranks(2, _Comm(0, 1))
    from data_io.errors import DataError  # the CLI prints DataError as one line
    with pytest.raises(DataError):
        check_ranks(2, _Comm(0, 3))


def test_transpose_keeps_weights():
    rng = np.random.default_rng(4)
    from hpc_graph.ops.csr import CSR
    src, dst = rng.integers(0, 7, 20), rng.integers(0, 5, 20)
    w = rng.random(20)
    g = CSR.from_edges(src, dst, 5, 7, edge_weight=w)
    t = transpose_csr(g)
    dense = np.zeros((5, 7))
    np.add.at(dense, (dst, src), w)
    dense_t = np.zeros((7, 5))
    for j in range(7):
        for k in range(int(t.indptr[j]), int(t.indptr[j + 1])):
            dense_t[j, int(t.indices[k])] += float(t.edge_weight[k])
    np.testing.assert_allclose(dense_t, dense.T)


def _write_random_dataset(path, rng, n=50, e=200):
    from data_io.dataset import GraphData, write_dataset
    src, dst = rng.integers(0, n - 4, e), rng.integers(0, n - 4, e)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    write_dataset(path, GraphData(indptr=indptr, indices=src, feat=rng.standard_normal((n, 3)).astype(np.float32),
                                  label=rng.integers(0, 2, n), train_mask=rng.random(n) < 0.5, num_classes=2))
    return src, dst


def test_partitioner_output_round_trip(tmp_path):
    """Blocks built from ``partition_dataset`` output hold exactly the source edges (via ``orig_id``)."""
    from data_io.partition import read_partition
    from data_io.partitioner import partition_dataset
    rng = np.random.default_rng(5)
    src, dst = _write_random_dataset(tmp_path / "g.h5", rng)
    partition_dataset(tmp_path / "g.h5", tmp_path / "parts", 3, "random", seed=1)
    parts = [read_partition(tmp_path / "parts", p) for p in range(3)]
    orig_of_gid = np.concatenate([pt.orig_id for pt in parts])
    got = []
    for pt in parts:
        dg = DistGraph.from_partition(pt, _Comm(pt.part_id, 3), "cpu", torch.float64)
        for q, blk in dg.blocks.items():
            cols = dg.block_gid(q).numpy()
            rows = np.repeat(np.arange(blk.num_dst), np.diff(blk.indptr.numpy()))
            got += list(zip(orig_of_gid[dg.gid.numpy()[rows]], orig_of_gid[cols[blk.indices.numpy()]]))
        np.testing.assert_array_equal(dg.in_degree.numpy(), np.bincount(dst, minlength=50)[pt.orig_id])
    assert sorted(got) == sorted(zip(dst.tolist(), src.tolist()))


def test_load_dist_graph_checks_rank_count_and_loads(tmp_path):
    from data_io.partitioner import partition_dataset
    from hpc_graph.comm.local import LocalCommunicator
    from hpc_graph.graph.dist_graph import load_dist_graph, partition_tensors
    rng = np.random.default_rng(6)
    _write_random_dataset(tmp_path / "g.h5", rng)
    partition_dataset(tmp_path / "g.h5", tmp_path / "p2", 2, "random")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'p2'}: partitioned into 2 parts but the job runs 1 ranks"):
        load_dist_graph(tmp_path / "p2", _Comm(0, 1))
    partition_dataset(tmp_path / "g.h5", tmp_path / "p1", 1, "random")
    dg, part = load_dist_graph(tmp_path / "p1", LocalCommunicator(), "cpu", torch.float64)
    assert dg.num_halo == 0 and dg.num_owned == 50 and set(dg.blocks) == {0}
    # the structure lives in the DistGraph (int32 columns); the part file's int64 copy is not kept
    assert dg.local.indices.dtype == torch.int32 and part.indices is None
    data = partition_tensors(part, "cpu", torch.float64)
    assert data["feat"].dtype == torch.float64 and data["feat"].shape == (50, 3)
    np.testing.assert_array_equal(data["masks"]["train"].numpy(), part.train_mask)
    assert data["num_classes"] == 2 and data["num_features"] == 3
