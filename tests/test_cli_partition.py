"""hpc-graph partition / info / check through hpc_graph.cli.main."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data_io"))
from _part_graphs import random_graph, write  # noqa: E402

from data_io.partition import read_partition, reassemble  # noqa: E402
from hpc_graph.cli import main  # noqa: E402


@pytest.fixture()
def src(tmp_path):
    return write(tmp_path, random_graph(120, 500, seed=3))


def test_partition_info_check(tmp_path, src, capsys):
    out = tmp_path / "p"
    assert main(["partition", str(src), "-o", str(out), "-n", "3", "--method", "random", "--seed", "4"]) == 0
    text = capsys.readouterr().out
    meta = json.loads((out / "partition.json").read_text())
    assert f"edge cut {meta['edge_cut']}" in text and meta["method"] == "random" and meta["seed"] == 4
    for e in meta["parts"]:
        assert f"{e['num_nodes']:>11} {e['num_edges']:>13} {e['num_halo']:>11}" in text
    g = random_graph(120, 500, seed=3)
    r = reassemble(out)
    assert np.array_equal(r.indices, g.indices) and np.array_equal(r.feat, g.feat)

    assert main(["info", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["kind"] == "partition" and res["num_parts"] == 3 and res["edge_cut"] == meta["edge_cut"]
    assert main(["info", str(src)]) == 0
    text = capsys.readouterr().out
    indeg = np.diff(g.indptr)
    assert f"in-degree: min {indeg.min()}, mean {indeg.mean():.2f}" in text and "nodes 120, edges 500" in text

    assert main(["check", str(out)]) == 0
    assert "OK (partition)" in capsys.readouterr().out
    assert main(["check", str(src)]) == 0
    assert "OK (dataset)" in capsys.readouterr().out


def test_partition_json_output(tmp_path, src, capsys):
    assert main(["partition", str(src), "-o", str(tmp_path / "p"), "-n", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res == json.loads((tmp_path / "p" / "partition.json").read_text())


def test_too_many_parts(tmp_path, src, capsys):
    assert main(["partition", str(src), "-o", str(tmp_path / "p"), "-n", "121"]) == 2
    err = capsys.readouterr().err
    assert "num_parts must be in [1, 120]" in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()
    assert main(["partition", str(src), "-o", str(tmp_path / "p"), "-n", "0"]) == 2
    assert "--num-parts" in capsys.readouterr().err


def test_existing_output_and_force(tmp_path, src, capsys):
    out = tmp_path / "p"
    assert main(["partition", str(src), "-o", str(out), "-n", "2"]) == 0
    assert main(["partition", str(src), "-o", str(out), "-n", "3"]) == 2
    assert "use --force" in capsys.readouterr().err
    assert json.loads((out / "partition.json").read_text())["num_parts"] == 2
    assert main(["partition", str(src), "-o", str(out), "-n", "3", "--force"]) == 0
    assert json.loads((out / "partition.json").read_text())["num_parts"] == 3


def test_check_reports_problems(tmp_path, src, capsys):
    out = tmp_path / "p"
    assert main(["-q", "partition", str(src), "-o", str(out), "-n", "3"]) == 0
    q = read_partition(out, 1, features=False)
    with h5py.File(out / "part-00001.h5", "r+") as h5:
        v = h5["/graph/indices"][...]
        v[0] = q.num_owned + q.num_halo + 5
        h5["/graph/indices"][...] = v
    (out / "part-00002.h5").unlink()
    capsys.readouterr()
    assert main(["check", str(out)]) == 1
    err = capsys.readouterr().err
    assert "part-00001.h5: /graph/indices: local id" in err and "part-00002.h5: missing part file" in err
    assert main(["check", str(out), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert not res["valid"] and len(res["problems"]) == 3, res["problems"]  # the edit shows in the digest too
    assert any("part-00001.h5: /graph/indices: content differs from its recorded sha256" in p
               for p in res["problems"])


def test_missing_input(tmp_path, capsys):
    assert main(["partition", str(tmp_path / "none.h5"), "-o", str(tmp_path / "p"), "-n", "2"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "none.h5")]) == 2
    assert main(["check", str(tmp_path / "none.h5")]) == 1


def test_partition_balance_edges_flag(tmp_path, src, capsys):
    out = tmp_path / "b"
    assert main(["partition", str(src), "-o", str(out), "-n", "2", "--balance-edges"]) == 0
    assert "edges balanced" in capsys.readouterr().out
    assert json.loads((out / "partition.json").read_text())["balance_edges"] is True
    assert main(["partition", str(src), "-o", str(tmp_path / "r"), "-n", "2", "--method", "random",
                 "--balance-edges"]) == 2
    assert "--balance-edges" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_partition_coarsen_to_needs_distributed(tmp_path, src, capsys):
    out = tmp_path / "c"
    assert main(["partition", str(src), "-o", str(out), "-n", "2", "--coarsen-to", "100"]) == 2
    assert "--coarsen-to: only with --distributed" in capsys.readouterr().err
    assert not out.exists()
