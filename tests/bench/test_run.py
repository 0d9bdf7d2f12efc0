"""benchmarks/run.py: the statistics against a naive reference, a smoke run of the quick profile on tiny graphs
(schema, skipped peers, the report renders), the committed report and README table equal to what the committed
results give, and bad results files named with their field."""
import copy
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = REPO / "benchmarks" / "run.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_run", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = mod
    spec.loader.exec_module(mod)
    return mod


run = _load()


def test_spread_is_range_over_median():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8):
        v = list(rng.uniform(0.1, 10.0, n))
        assert abs(run.spread(v) - (max(v) - min(v)) / float(np.median(v))) <= 1e-12 * max(v)
    assert run.spread([3.0]) is None


def _runs(rng, n, with_bytes=False):
    out = []
    for r in range(n):
        ep = list(rng.uniform(0.5, 2.0, 5))
        rec = {"epoch_seconds": ep, "median_epoch_seconds": float(np.median(ep[1:])),
               "peak_rss_mb": float(rng.uniform(300, 900)), "round": r, "test_acc": float(rng.uniform(0.5, 0.9))}
        if with_bytes:
            rec["bytes_per_epoch"] = float(rng.integers(1, 10**6))
        out.append(rec)
    return out


def test_side_summary_and_comparison_against_numpy():
    rng = np.random.default_rng(1)
    a, b = _runs(rng, 5, with_bytes=True), _runs(rng, 5)
    a.append({"error": "exit 1: boom", "round": 5})
    floor = {"peak_rss_mb": 250.0}
    sa, sb = run.summarise_side(a, floor), run.summarise_side(b, {"peak_rss_mb": 200.0})
    ea = [r["median_epoch_seconds"] for r in a[:5]]
    eb = [r["median_epoch_seconds"] for r in b]
    assert sa["runs"] == 5 and sa["failed"] == 1
    assert sa["epoch_seconds"] == float(np.median(ea))
    assert sa["peak_rss_mb"] == float(np.median([r["peak_rss_mb"] for r in a[:5]]))
    assert sa["bytes_per_epoch"] == float(np.median([r["bytes_per_epoch"] for r in a[:5]]))
    accs = [r["test_acc"] for r in a[:5]]
    assert abs(sa["test_acc_mean"] - float(np.mean(accs))) <= 1e-12
    assert abs(sa["test_acc_std"] - float(np.std(accs))) <= 1e-12
    assert sa["net_rss_mb"] == sa["peak_rss_mb"] - 250.0
    c = run.compare(sa, sb, a, b)
    assert c["speed"] == float(np.median(eb)) / float(np.median(ea))
    per_round = [y / x for x, y in zip(ea, eb)]
    assert np.allclose(c["speed_rounds"], per_round, rtol=1e-14, atol=0)
    assert abs(c["speed_spread"] - (max(per_round) - min(per_round)) / float(np.median(per_round))) <= 1e-12
    assert c["memory"] == sa["peak_rss_mb"] / sb["peak_rss_mb"]
    assert c["memory_net"] == (sa["peak_rss_mb"] - 250.0) / (sb["peak_rss_mb"] - 200.0)


def test_a_side_with_no_successful_run_has_no_numbers():
    s = run.summarise_side([{"skipped": ".venv-dgl not found"}, {"skipped": ".venv-dgl not found"}], None)
    assert s == {"runs": 0, "failed": 0, "skipped": ".venv-dgl not found"}
    assert run.compare(s, {"epoch_seconds": 1.0, "peak_rss_mb": 1.0}, [], []) == {}


def test_targets_are_judged_by_their_operator():
    cell = {"comparisons": [{"speed": 1.6, "memory": 0.4}], "sides": {"single": {"test_acc_mean": 0.80}}}
    assert run.judge(cell, run.Target("t", "speed", ">=", 1.5, pair=0))["met"] is True
    assert run.judge(cell, run.Target("t", "memory", "<=", 0.3, pair=0))["met"] is False
    assert run.judge(cell, run.Target("t", "acc", ">=", 0.81, side="single"))["met"] is False
    assert run.judge(cell, run.Target("t", "memory_net", "<=", 0.5, pair=0))["met"] is None


def test_profiles_and_only():
    quick = run.select("quick", None)
    full = run.select("full", None)
    assert {c.key for c in quick} and {c.section for c in full} == set(run.SECTIONS)
    # one row per engine and per peer in the quick profile
    kinds = {s.kind for c in quick for s in c.sides}
    engines = {dict(s.sets).get("engine.name") for c in quick for s in c.sides if s.kind == "train"}
    assert {"dgl", "pyg", "dgl-mini", "pyg-mini"} <= kinds
    assert {"single", "dp", "sar", "sylvie", "minibatch", "apt", "flow", "seqpar"} <= engines
    with pytest.raises(SystemExit, match="no cell nope"):
        run.select("quick", ["nope"])


def test_peer_sides_are_skipped_without_running(tmp_path):
    cell = run.Cell("k", "peers", "t", "rmat-s8", (run.Side("DGL", kind="dgl"), run.Side("PyG", kind="pyg")),
                    (("DGL", "PyG"),), floor=True)
    res = run.run_cell(cell, tmp_path, 2, 2, 0, None, skip_peers=True)
    assert res["sides"]["DGL"] == {"runs": 0, "failed": 0, "skipped": "--no-peers"} and res["floors"] == {}
    assert res["comparisons"] == [{"side": "DGL", "reference": "PyG"}]
    assert [p.name for p in tmp_path.iterdir()] == ["rmat-s8.h5"]  # the cell's data, no run


def test_quick_profile_smoke_run_renders(tmp_path):
    """The quick profile's engines cell on a tiny graph: one round of each side (2-rank runs under mpiexec), every
    field of the schema, and a report with its table."""
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, str(_SCRIPT), "run", "--quick", "--only", "engines-s15", "--rounds", "1",
                           "--scale-shift", "-7", "--epochs", "2", "--no-peers", "--no-floors", "--work",
                           str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    run.validate(doc, str(out))
    assert doc["profile"] == "quick" and [c["key"] for c in doc["cells"]] == ["engines-s15"]
    assert doc["environment"]["commit"] and doc["environment"]["logical_cpus"] >= 1
    (engines,) = doc["cells"]
    ours = engines["sides"]["single"]
    assert ours["runs"] == 1 and ours["epoch_seconds"] > 0 and "floor_rss_mb" not in ours
    run_rec = engines["runs"]["single"][0]
    assert ours["epoch_seconds"] == statistics.median(run_rec["epoch_seconds"][1:])
    for label in ("dp, 2 ranks", "sar, 2 ranks", "sylvie 2-bit, 2 ranks"):
        side = engines["sides"][label]
        assert side["runs"] == 1 and side["bytes_per_epoch"] > 0, (label, side)
    assert {(c["side"], c["reference"]) for c in engines["comparisons"]} >= {("sar, 2 ranks", "dp, 2 ranks")}
    report = run.render({"quick": doc})
    assert "## 1. Full-graph engines across ranks" in report and "sar, 2 ranks" in report
    rendered = tmp_path / "r.md"
    assert run.main(["render", "--results", str(out), "--out", str(rendered)]) == 0
    assert rendered.read_text() == report


def test_committed_report_and_readme_table_are_rendered_from_committed_results():
    results = run.load_results()
    assert any(d["profile"] == "full" for d in results.values())
    assert sum(d["profile"] == "quick" for d in results.values()) >= 2
    assert (REPO / "docs" / "benchmarks.md").read_text() == run.render(results)
    readme = (REPO / "README.md").read_text()
    assert run.with_readme_table(readme, run.readme_table(results)) == readme


def test_readme_numbers_appear_in_the_full_results():
    """Every ratio in README's comparison table is one of the full results' ratios, to its printed digits."""
    results = run.load_results()
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index(run.README_BEGIN):readme.index(run.README_END)]
    printed = {float(x) for x in __import__("re").findall(r"(\d+\.\d\d)x", table)}
    assert printed
    known = {round(c[m], 2) for doc in results.values() if doc["profile"] == "full" for cell in doc["cells"]
             for c in cell["comparisons"] for m in ("speed", "memory", "memory_net") if c.get(m) is not None}
    assert printed <= known, printed - known


def test_bad_results_files_are_named_with_their_field(tmp_path):
    good = {"schema": run.SCHEMA, "profile": "quick", "rounds": 3, "environment": {
        "cpu": "x", "logical_cpus": 2, "memory_gib": 1.0, "versions": {}, "commit": "abc", "threads": {}},
        "cells": [{"key": "k", "section": "peers", "title": "t", "sides": {"a": {}}, "comparisons":
                   [{"side": "a", "reference": "a"}], "runs": {}, "targets": [], "side_order": ["a"]}]}
    run.validate(good, "f.json")
    for mutate, message in ((lambda d: d.pop("environment"), "f.json: environment is missing"),
                            (lambda d: d.update(schema=99), "f.json: schema 99"),
                            (lambda d: d.update(profile="medium"), "profile 'medium'"),
                            (lambda d: d["cells"][0].update(section="other"), "cells\\[0\\].section 'other'"),
                            (lambda d: d["cells"][0]["comparisons"][0].update(reference="b"), "unknown side 'b'"),
                            (lambda d: d["environment"].pop("commit"), "environment.commit is missing"),
                            (lambda d: d["cells"][0].update(sides=[]), "cells\\[0\\].sides should be")):
        bad = copy.deepcopy(good)
        mutate(bad)
        with pytest.raises(ValueError, match=message):
            run.validate(bad, "f.json")
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read .*broken.json"):
        run.main(["render", "--results", str(path), "--out", str(tmp_path / "r.md")])


def test_cli_bench_suite_forwards_to_the_runner(tmp_path, capfd):
    from hpc_graph.cli import main

    bad = tmp_path / "missing.json"
    assert main(["bench", "suite", "render", "--results", str(bad), "--out", str(tmp_path / "r.md")]) == 1
    assert f"--results: cannot read {bad}" in capfd.readouterr().err
