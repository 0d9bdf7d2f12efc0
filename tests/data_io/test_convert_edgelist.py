"""Edge-list converter: streamed parsing vs a plain-Python reference, options, bad input."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from data_io.converters import convert_edgelist, read_edgelist
from data_io.converters._text import iter_rows
from data_io.dataset import open_dataset
from data_io.errors import DataError, FormatError
from hpc_graph.cli import main


def _random_edges(rng, n, e, self_loops=True):
    src = rng.integers(0, n, e)
    dst = rng.integers(0, n, e)
    # some exact duplicates and some reversed copies
    k = e // 5
    src[:k], dst[:k] = src[e - k:], dst[e - k:]
    src[k:2 * k], dst[k:2 * k] = dst[2 * k:3 * k].copy(), src[2 * k:3 * k].copy()
    if self_loops:
        dst[3 * k:3 * k + 3] = src[3 * k:3 * k + 3]
    return src, dst


def _write(path: Path, src, dst, w=None, seed=0, header=True):
    """An edge list with comments (also mid-file), blank lines, tabs and CRLF line ends."""
    rng = np.random.default_rng(seed)
    lines = ["# Directed graph: test", "% another comment style", "# FromNodeId\tToNodeId"] if header else []
    for k in range(len(src)):
        sep = "\t" if rng.random() < 0.3 else " " * int(rng.integers(1, 3))
        line = f"{src[k]}{sep}{dst[k]}" + ("" if w is None else f"{sep}{float(w[k])!r}")
        if rng.random() < 0.05:
            lines.append("  # a comment in the middle")
        if rng.random() < 0.05:
            lines.append("")
        lines.append(line + ("\r" if rng.random() < 0.1 else ""))
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)


def _reference(src, dst, n, w=None, symmetrize=False, remove_self_loops=False, dedup=False):
    """Plain-Python CSR over destinations: rows sorted by source, equal edges in input order."""
    edges = [(int(s), int(d), None if w is None else float(np.float32(w[k]))) for k, (s, d) in enumerate(zip(src, dst))]
    if remove_self_loops:
        edges = [x for x in edges if x[0] != x[1]]
    if symmetrize:
        edges = edges + [(d, s, ww) for s, d, ww in edges]
    if dedup:
        seen, kept = set(), []
        for x in edges:
            if (x[0], x[1]) not in seen:
                seen.add((x[0], x[1]))
                kept.append(x)
        edges = kept
    edges = sorted(edges, key=lambda x: (x[1], x[0]))  # stable
    indptr = np.zeros(n + 1, dtype=np.int64)
    for _, d, _ in edges:
        indptr[d + 1] += 1
    indptr = np.cumsum(indptr)
    indices = np.array([x[0] for x in edges], dtype=np.int64)
    weight = None if w is None else np.array([x[2] for x in edges], dtype=np.float32)
    return indptr, indices, weight


def _load(path):
    with open_dataset(path) as ds:
        return ds.load(), ds.attrs()


@pytest.mark.parametrize("symmetrize,remove_self_loops,dedup",
                         [(False, False, False), (True, False, False), (False, True, True), (True, True, True)])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_reference(tmp_path, symmetrize, remove_self_loops, dedup, weighted):
    rng = np.random.default_rng(7 + 2 * symmetrize + dedup + 11 * weighted)
    n, e = 60, 400
    src, dst = _random_edges(rng, n, e)
    src[0], dst[0] = n - 1, 0  # ids reach n-1: no relabelling
    w = rng.standard_normal(e).astype(np.float32) if weighted else None
    _write(tmp_path / "g.txt", src, dst, w)
    out = tmp_path / "g.h5"
    # ~8 kB of text in 97-byte blocks: many chunks
    convert_edgelist(tmp_path / "g.txt", out, symmetrize=symmetrize, remove_self_loops=remove_self_loops,
                     dedup=dedup, chunk_bytes=97)
    g, attrs = _load(out)
    indptr, indices, weight = _reference(src, dst, n, w, symmetrize, remove_self_loops, dedup)
    assert g.num_nodes == n
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    if weighted:
        np.testing.assert_array_equal(g.edge_weight, weight)
    else:
        assert g.edge_weight is None
    # directed unless the edge multiset equals its reverse
    pairs = sorted(zip(indices.tolist(), np.repeat(np.arange(n), np.diff(indptr)).tolist()))
    assert attrs["directed"] == (pairs != sorted((b, a) for a, b in pairs))
    if symmetrize:
        assert not attrs["directed"]


def test_several_chunks_same_result(tmp_path):
    rng = np.random.default_rng(1)
    src, dst = _random_edges(rng, 50, 300)
    src[0] = 49
    w = rng.random(300).astype(np.float32)
    _write(tmp_path / "g.txt", src, dst, w)
    size = (tmp_path / "g.txt").stat().st_size
    blocks = list(iter_rows(tmp_path / "g.txt", ncols=(2, 3), chunk_bytes=64))
    assert len(blocks) > size // 128  # really streamed in many blocks
    results = []
    for chunk in (5, 64, 1000, 1 << 24):  # 5 bytes: shorter than one line
        s, d, ww = read_edgelist(tmp_path / "g.txt", chunk_bytes=chunk)
        results.append((s, d, ww))
        np.testing.assert_array_equal(s.astype(np.int64), src)
        np.testing.assert_array_equal(d.astype(np.int64), dst)
        np.testing.assert_array_equal(ww, w)
    assert results[0][0].dtype == np.uint32  # compact per-chunk storage


def test_line_numbers_of_blocks(tmp_path):
    text = "# c\n\n1 2\n% c\n3 4\n  \n5 6\n7 8\n"
    (tmp_path / "g.txt").write_text(text)
    for chunk in (3, 8, 100):
        got = [(b.line_of(r), *b.values[r].tolist()) for b in iter_rows(tmp_path / "g.txt", chunk_bytes=chunk)
               for r in range(len(b.values))]
        assert got == [(3, 1, 2), (5, 3, 4), (7, 5, 6), (8, 7, 8)]


def test_gzip_input(tmp_path):
    rng = np.random.default_rng(2)
    src, dst = _random_edges(rng, 40, 200)
    src[0] = 39
    _write(tmp_path / "g.txt.gz", src, dst)
    convert_edgelist(tmp_path / "g.txt.gz", tmp_path / "g.h5", chunk_bytes=50)
    g, attrs = _load(tmp_path / "g.h5")
    indptr, indices, _ = _reference(src, dst, 40)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    assert attrs["name"] == "g"


def test_relabel_sparse_ids(tmp_path):
    rng = np.random.default_rng(3)
    src, dst = _random_edges(rng, 30, 150)
    ids = np.sort(rng.choice(10**9, size=30, replace=False)) + 5 * 10**9  # sparse and > 2**32
    _write(tmp_path / "g.txt", ids[src], ids[dst])
    convert_edgelist(tmp_path / "g.txt", tmp_path / "auto.h5", chunk_bytes=200)  # auto: relabels
    used = np.unique(np.concatenate([src, dst]))
    new = np.full(30, -1)
    new[used] = np.arange(len(used))  # order-preserving compaction of the ids in use
    g, _ = _load(tmp_path / "auto.h5")
    indptr, indices, _ = _reference(new[src], new[dst], len(used))
    assert g.num_nodes == len(used)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    # explicit relabel with more nodes than ids: extra isolated nodes at the end
    convert_edgelist(tmp_path / "g.txt", tmp_path / "n.h5", relabel=True, num_nodes=len(used) + 3)
    g2, _ = _load(tmp_path / "n.h5")
    assert g2.num_nodes == len(used) + 3
    np.testing.assert_array_equal(g2.indptr[:len(used) + 1], indptr)
    np.testing.assert_array_equal(g2.indices, indices)
    with pytest.raises(DataError, match="--num-nodes"):
        convert_edgelist(tmp_path / "g.txt", tmp_path / "bad.h5", relabel=True, num_nodes=len(used) - 1)
    assert not (tmp_path / "bad.h5").exists()


def test_dense_ids_kept_and_num_nodes(tmp_path):
    rng = np.random.default_rng(4)
    src, dst = _random_edges(rng, 20, 80)
    src, dst = src + 3, dst + 3  # ids 0..2 unused, still dense: no relabelling
    _write(tmp_path / "g.txt", src, dst)
    convert_edgelist(tmp_path / "g.txt", tmp_path / "a.h5")
    g, _ = _load(tmp_path / "a.h5")
    n = int(max(src.max(), dst.max())) + 1
    indptr, indices, _ = _reference(src, dst, n)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    convert_edgelist(tmp_path / "g.txt", tmp_path / "b.h5", num_nodes=n + 10)
    g, _ = _load(tmp_path / "b.h5")
    indptr, indices, _ = _reference(src, dst, n + 10)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    with pytest.raises(FormatError, match=r"g\.txt: line \d+: .*out of range"):
        convert_edgelist(tmp_path / "g.txt", tmp_path / "c.h5", num_nodes=n - 1)
    assert not (tmp_path / "c.h5").exists()


def test_random_features_labels_split(tmp_path):
    rng = np.random.default_rng(5)
    src, dst = _random_edges(rng, 300, 900)
    src[0] = 299
    _write(tmp_path / "g.txt", src, dst)
    convert_edgelist(tmp_path / "g.txt", tmp_path / "a.h5", random_features=8, num_classes=3,
                     split=(0.5, 0.25, 0.25), seed=11, symmetrize=True)
    convert_edgelist(tmp_path / "g.txt", tmp_path / "b.h5", random_features=8, num_classes=3,
                     split=(0.5, 0.25, 0.25), seed=11, symmetrize=True)
    a, attrs = _load(tmp_path / "a.h5")
    b, _ = _load(tmp_path / "b.h5")
    assert a.feat.shape == (300, 8) and a.feat.dtype == np.float32
    np.testing.assert_array_equal(a.feat, b.feat)  # seeded
    assert attrs["num_classes"] == 3 and a.label.min() >= 0 and a.label.max() < 3
    sizes = [int(a.train_mask.sum()), int(a.val_mask.sum()), int(a.test_mask.sum())]
    assert sizes == [150, 75, 75]
    assert not (a.train_mask & a.val_mask).any() and not (a.train_mask & a.test_mask).any()
    # labels are a linear function of the features: least squares on one-hot fits far above chance
    onehot = np.eye(3)[a.label]
    coef, *_ = np.linalg.lstsq(a.feat, onehot, rcond=None)
    assert (np.argmax(a.feat @ coef, axis=1) == a.label).mean() > 0.8
    assert not attrs["directed"]


@pytest.mark.parametrize("body,line,what", [
    ("1 2\n3 x\n", 3, "not a number"),
    ("1 2\n3 4 5 6\n", 3, "columns"),
    ("1 2\n3\n", 3, "columns"),
    ("1 2\n3 -4\n", 3, "negative"),
    ("1 2 0.5\n3 4\n", 3, "columns"),
    ("1 2 0.5\n3.5 4 1\n", 3, "not an integer"),
    ("1 2 0.5\n3 4 nan\n", 3, "not finite"),
])
def test_bad_lines_name_file_and_line(tmp_path, body, line, what):
    f = tmp_path / "bad.txt"
    f.write_text("# header\n" + body)
    out = tmp_path / "out.h5"
    for chunk in (4, 1 << 20):
        with pytest.raises(FormatError) as err:
            convert_edgelist(f, out, chunk_bytes=chunk)
        msg = str(err.value)
        assert msg.startswith(f"{f}: line {line}: ") and what in msg, msg
        assert not out.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]  # no temporary left


def test_empty_and_missing(tmp_path):
    (tmp_path / "empty.txt").write_text("# only a comment\n\n")
    with pytest.raises(FormatError, match="empty graph"):
        convert_edgelist(tmp_path / "empty.txt", tmp_path / "o.h5")
    with pytest.raises(DataError, match="no such file"):
        convert_edgelist(tmp_path / "nope.txt", tmp_path / "o.h5")
    convert_edgelist(tmp_path / "empty.txt", tmp_path / "o.h5", num_nodes=4)  # isolated nodes are fine
    g, _ = _load(tmp_path / "o.h5")
    assert g.num_nodes == 4 and g.num_edges == 0


def test_cli(tmp_path, capsys):
    rng = np.random.default_rng(6)
    src, dst = _random_edges(rng, 25, 100)
    src[0] = 24
    _write(tmp_path / "g.txt", src, dst)
    out = tmp_path / "g.h5"
    rc = main(["convert", "edgelist", str(tmp_path / "g.txt"), "-o", str(out), "--symmetrize", "--dedup",
               "--remove-self-loops", "--chunk-mb", "0.0001", "--random-features", "4", "--num-classes", "2"])
    assert rc == 0
    assert "25 nodes" in capsys.readouterr().out
    g, _ = _load(out)
    indptr, indices, _ = _reference(src, dst, 25, symmetrize=True, remove_self_loops=True, dedup=True)
    np.testing.assert_array_equal(g.indices, indices)
    assert g.feat.shape == (25, 4)
    # existing output without --force
    rc = main(["convert", "edgelist", str(tmp_path / "g.txt"), "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "output exists" in err and len(err.splitlines()) == 1
    # bad line: one-line error naming file and line, no output
    (tmp_path / "bad.txt").write_text("1 2\n2 oops\n")
    rc = main(["convert", "edgelist", str(tmp_path / "bad.txt"), "-o", str(tmp_path / "bad.h5")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "bad.txt: line 2:" in err[0]
    assert not (tmp_path / "bad.h5").exists()


@pytest.mark.parametrize("symmetrize,dedup", [(False, False), (True, True)])
def test_large_id_space_path(tmp_path, monkeypatch, symmetrize, dedup):
    """The lexsort path (used when N*N overflows an int64 key) gives the same CSR and symmetry flag."""
    import data_io.converters._csr as csr

    monkeypatch.setattr(csr, "_KEY_LIMIT", 0)
    rng = np.random.default_rng(8)
    src, dst = _random_edges(rng, 30, 200)
    src[0] = 29
    w = rng.random(200).astype(np.float32)
    _write(tmp_path / "g.txt", src, dst, w)
    convert_edgelist(tmp_path / "g.txt", tmp_path / "g.h5", symmetrize=symmetrize, dedup=dedup)
    g, attrs = _load(tmp_path / "g.h5")
    indptr, indices, weight = _reference(src, dst, 30, w, symmetrize=symmetrize, dedup=dedup)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    np.testing.assert_array_equal(g.edge_weight, weight)
    assert bool(attrs["directed"]) == (not symmetrize)


def test_memory_check_refuses_then_force(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(9)
    src, dst = _random_edges(rng, 30, 120)
    _write(tmp_path / "g.txt", src, dst)
    out = tmp_path / "g.h5"
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "1MB")
    rc = main(["convert", "edgelist", str(tmp_path / "g.txt"), "-o", str(out), "--num-nodes", "30"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "convert edgelist" in err[0] and "--force" in err[0]
    assert not out.exists()
    assert main(["convert", "edgelist", str(tmp_path / "g.txt"), "-o", str(out), "--num-nodes", "30", "--force"]) == 0
    g, _ = _load(out)
    assert g.num_nodes == 30
