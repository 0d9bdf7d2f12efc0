"""``hpc-graph bench kernels`` end to end on a tiny graph: JSON Lines, PNG, summary, errors."""
from __future__ import annotations

import json

from hpc_graph.cli import main


def test_bench_kernels_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "k.jsonl", tmp_path / "k.png"
    rc = main(["-q", "bench", "kernels", "--scale", "6", "--feat", "8", "--heads", "2", "--repeat", "1",
               "--ops", "spmm", "sage", "--grad", "off", "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    recs = [json.loads(line) for line in out_json.read_text().splitlines()]
    assert {(r["op"], r["impl"]) for r in recs} == {("spmm", "hpc_graph"), ("spmm", "torch.sparse.mm"),
                                                    ("spmm", "gather_index_add"), ("sage", "hpc_graph"),
                                                    ("sage", "pyg.SAGEConv")}
    assert all(r["requires_grad"] is False and r["scale"] == 6 for r in recs)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "vs torch.sparse.mm" in printed and f"wrote {out_json}" in printed
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left


def test_bench_kernels_bad_option_is_one_line_error(tmp_path, capsys):
    assert main(["bench", "kernels", "--scale", "6", "--feat", "10", "--heads", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--heads" in err[0]


def test_bench_kernels_refuses_existing_output_before_running(tmp_path, capsys, monkeypatch):
    import hpc_graph.bench.kernels as kb

    monkeypatch.setattr(kb, "run_kernel_bench", lambda cfg: (_ for _ in ()).throw(AssertionError("ran")))
    existing = tmp_path / "k.jsonl"
    existing.write_text("keep\n")
    assert main(["bench", "kernels", "--scale", "6", "--json", str(existing)]) == 2
    assert "exists" in capsys.readouterr().err
    assert existing.read_text() == "keep\n"
