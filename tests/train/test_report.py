"""`hpc-graph report` and hpc_graph.train.report on synthetic run directories.

Every run directory is built here from random per-rank metric lines (the
trainer's fields); the summary numbers are checked against NumPy on the same
random arrays, the plots for existence and PNG validity, and every bad input
for a one-line error with exit status 2.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from hpc_graph.cli import main
from hpc_graph.train.report import load_run, plot_compare, plot_run, summarize, training_time

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_PLOTS = ("curves.png", "rank_time.png", "rank_memory.png", "bytes_per_epoch.png")


def _random_run(seed: int, ranks: int, epochs: int = 12, eval_every: int = 3) -> dict[str, np.ndarray]:
    """Random metric arrays: per-epoch globals [E] and per-(epoch, rank) values [E, R]."""
    rng = np.random.default_rng(seed)
    evaluated = (np.arange(1, epochs + 1) % eval_every == 0)
    evaluated[-1] = True
    acc = {k: np.where(evaluated, rng.uniform(0.2, 0.9, epochs), np.nan) for k in ("train", "val", "test")}
    comm = rng.uniform(0.0, 0.05, (epochs, ranks)) if ranks > 1 else np.zeros((epochs, 1))
    compute = rng.uniform(0.05, 0.2, (epochs, ranks))
    return {
        "epoch": np.arange(1, epochs + 1), "loss": rng.uniform(0.1, 2.0, epochs), **acc,
        "compute": compute, "comm": comm, "epoch_s": compute + comm,
        "eval_s": np.where(evaluated[:, None], rng.uniform(0.0, 0.02, (epochs, ranks)), 0.0),
        "bytes": rng.integers(0, 10**6, (epochs, ranks)) if ranks > 1 else np.zeros((epochs, 1), np.int64),
        "rss": rng.uniform(100.0, 2000.0, (epochs, ranks)),
    }


def _line(m: dict, e: int, r: int) -> dict:
    def v(x):
        return None if np.isnan(x) else float(x)
    return {"rank": r, "epoch": int(m["epoch"][e]), "loss": float(m["loss"][e]), "train_acc": v(m["train"][e]),
            "val_acc": v(m["val"][e]), "test_acc": v(m["test"][e]), "lr": 0.01,
            "epoch_seconds": float(m["epoch_s"][e, r]), "compute_seconds": float(m["compute"][e, r]),
            "comm_seconds": float(m["comm"][e, r]), "bytes_sent": int(m["bytes"][e, r]),
            "eval_seconds": float(m["eval_s"][e, r]), "eval_bytes_sent": 0,
            "peak_rss_mb": float(m["rss"][e, r]), "engine_stats": {"halo": 3}}


def _write_run(path, m: dict, merged: bool = False, engine: str | None = "dp", drop_last_of: int | None = None):
    """Write ``m`` as per-rank files (or one shuffled metrics.jsonl) + summary.json under ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    E, R = m["epoch_s"].shape
    lines = {r: [_line(m, e, r) for e in range(E) if not (r == drop_last_of and e == E - 1)] for r in range(R)}
    if merged:
        rows = [row for r in range(R) for row in lines[r]]
        order = np.random.default_rng(0).permutation(len(rows))
        (path / "metrics.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in order))
    else:
        for r in range(R):
            (path / f"metrics.rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[r]) + "\n")
    if engine is not None:
        (path / "summary.json").write_text(json.dumps({"engine": engine, "world_size": R, "epochs": E}))
    return path


def _check_png(path) -> None:
    import matplotlib.image as mpimg

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300 and img.shape[2] in (3, 4)
    assert float(img[..., :3].std()) > 0.01, f"{path} is blank"


# -- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks,merged", [(1, False), (2, False), (4, False), (4, True)])
def test_summary_matches_numpy(tmp_path, ranks, merged):
    m = _random_run(seed=10 + ranks, ranks=ranks)
    run_dir = _write_run(tmp_path / "run", m, merged=merged)
    if merged:  # a stale per-rank file beside metrics.jsonl must be ignored
        (run_dir / "metrics.rank0.jsonl").write_text("not json\n")
    run = load_run(run_dir)
    assert run.num_ranks == ranks and run.ranks == list(range(ranks)) and len(run.rows) == 12 * ranks
    assert [(r["epoch"], r["rank"]) for r in run.rows] == sorted((r["epoch"], r["rank"]) for r in run.rows)
    s = summarize(run)

    assert s["epochs"] == 12 and s["num_ranks"] == ranks and s["engine"] == "dp"
    best = int(np.nanargmax(m["val"]))
    assert s["best_epoch"] == m["epoch"][best]
    assert s["best_val_acc"] == pytest.approx(m["val"][best])
    assert s["test_acc_at_best"] == pytest.approx(m["test"][best])
    assert s["final_loss"] == pytest.approx(m["loss"][-1]) and s["final_val_acc"] == pytest.approx(m["val"][-1])
    assert s["median_epoch_seconds"] == pytest.approx(np.median(m["epoch_s"].max(axis=1)))
    np.testing.assert_allclose(s["median_epoch_seconds_per_rank"], np.median(m["epoch_s"], axis=0))
    np.testing.assert_allclose(s["median_compute_seconds_per_rank"], np.median(m["compute"], axis=0))
    np.testing.assert_allclose(s["median_comm_seconds_per_rank"], np.median(m["comm"], axis=0))
    share = m["compute"].sum() / (m["compute"].sum() + m["comm"].sum())
    assert s["compute_share"] == pytest.approx(share) and s["comm_share"] == pytest.approx(1 - share)
    np.testing.assert_allclose(s["peak_rss_mb_per_rank"], m["rss"].max(axis=0))
    assert s["max_peak_rss_mb"] == pytest.approx(m["rss"].max())
    np.testing.assert_allclose(s["bytes_per_epoch_per_rank"], m["bytes"].mean(axis=0))
    assert s["bytes_per_epoch"] == pytest.approx(m["bytes"].mean(axis=0).sum())
    wall = np.cumsum((m["epoch_s"] + m["eval_s"]).max(axis=1))
    np.testing.assert_allclose(training_time(run), wall)
    assert s["training_seconds"] == pytest.approx(wall[-1])
    json.dumps(s, allow_nan=False)  # JSON-safe


def test_partial_run_and_tied_best(tmp_path):
    """A rank that missed the last epoch and two epochs tied for the best val acc (the first wins)."""
    m = _random_run(seed=3, ranks=3)
    ev = np.flatnonzero(~np.isnan(m["val"]))
    m["val"][ev[1]] = m["val"][ev[3]] = 0.95
    run = load_run(_write_run(tmp_path / "run", m, drop_last_of=2, engine=None))
    s = summarize(run)
    assert len(run.rows) == 12 * 3 - 1 and run.summary is None and s["engine"] is None
    assert s["best_epoch"] == m["epoch"][ev[1]] and s["test_acc_at_best"] == pytest.approx(m["test"][ev[1]])
    t = m["epoch_s"].copy()
    t[-1, 2] = np.nan
    assert s["median_epoch_seconds"] == pytest.approx(np.median(np.nanmax(t, axis=1)))
    b = m["bytes"].astype(float)
    b[-1, 2] = np.nan
    np.testing.assert_allclose(s["bytes_per_epoch_per_rank"], np.nanmean(b, axis=0))
    r = m["rss"].copy()
    r[-1, 2] = np.nan
    np.testing.assert_allclose(s["peak_rss_mb_per_rank"], np.nanmax(r, axis=0))


# -- plots and the CLI ----------------------------------------------------------------------

def test_cli_single_run_text_and_plots(tmp_path, capsys):
    m = _random_run(seed=7, ranks=4)
    run_dir = _write_run(tmp_path / "run4", m)
    assert main(["-q", "report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    s = summarize(load_run(run_dir))
    best = int(np.nanargmax(m["val"]))
    assert f"best val acc {m['val'][best]:.4f} at epoch {m['epoch'][best]}, test acc {m['test'][best]:.4f}" in out
    assert f"run {run_dir}: engine dp, 4 rank(s), 12 epochs (1..12)" in out
    assert f"median epoch time {1e3 * np.median(m['epoch_s'].max(axis=1)):.1f} ms" in out
    assert f"compute {100 * s['compute_share']:.1f}% / communication" in out
    assert f"3: {m['rss'][:, 3].max():.1f} MiB" in out
    for name in RUN_PLOTS:
        _check_png(run_dir / "report" / name)
        assert f"wrote {run_dir / 'report' / name}" in out
    assert not [p for p in (run_dir / "report").iterdir() if p.suffix != ".png"]  # no temporary files left

    out_dir = tmp_path / "elsewhere" / "r"
    assert main(["-q", "report", str(run_dir), "--out", str(out_dir), "--json", "--no-plots"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plots"] == [] and not out_dir.exists()
    assert doc["median_epoch_seconds"] == pytest.approx(np.median(m["epoch_s"].max(axis=1)))
    assert doc["peak_rss_mb_per_rank"] == pytest.approx(list(m["rss"].max(axis=0)))


def test_plot_run_single_rank_without_traffic(tmp_path):
    run = load_run(_write_run(tmp_path / "run1", _random_run(seed=1, ranks=1), engine="single"))
    paths = plot_run(run, tmp_path / "out")
    assert [p.name for p in paths] == list(RUN_PLOTS)
    for p in paths:
        _check_png(p)


def test_cli_compare_runs(tmp_path, capsys):
    runs = {f"dp{r}": _random_run(seed=20 + r, ranks=r) for r in (1, 2, 4)}
    dirs = [str(_write_run(tmp_path / name, m, engine="dp" if name != "dp1" else "single"))
            for name, m in runs.items()]
    dirs.append(str(_write_run(tmp_path / "sar2", _random_run(seed=99, ranks=2), engine="sar")))
    out_dir = tmp_path / "cmp"
    assert main(["-q", "report", *dirs, "--out", str(out_dir), "--labels", "a,b,c,d", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in doc["runs"]] == ["a", "b", "c", "d"]
    assert [r["num_ranks"] for r in doc["runs"]] == [1, 2, 4, 2]
    for r, m in zip(doc["runs"], runs.values()):
        assert r["median_epoch_seconds"] == pytest.approx(np.median(m["epoch_s"].max(axis=1)))
        assert r["max_peak_rss_mb"] == pytest.approx(m["rss"].max())
    assert doc["plots"] == [str(out_dir / "compare_curves.png"), str(out_dir / "scaling.png")]
    for p in doc["plots"]:
        _check_png(tmp_path / p)

    assert main(["-q", "report", *dirs[:3], "--no-plots"]) == 0  # text table, default labels
    out = capsys.readouterr().out
    table = out[out.index("run ranks epochs"):]
    assert [line.split()[:3] for line in table.splitlines()[1:]] == [["dp1", "1", "12"], ["dp2", "2", "12"],
                                                                     ["dp4", "4", "12"]]


def test_plots_are_atomic(tmp_path, monkeypatch):
    """A failure while writing a PNG leaves no partial file and keeps an existing plot as it was."""
    from matplotlib.figure import Figure

    run = load_run(_write_run(tmp_path / "run", _random_run(seed=5, ranks=2)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "curves.png").write_bytes(b"old plot")

    def broken_savefig(self, fname, **kwargs):
        with open(fname, "wb") as fh:
            fh.write(PNG_MAGIC + b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    from data_io.errors import DataError

    with pytest.raises(DataError, match="curves.png: write failed: disk full"):
        plot_run(run, out)
    assert sorted(p.name for p in out.iterdir()) == ["curves.png"]
    assert (out / "curves.png").read_bytes() == b"old plot"
    with pytest.raises(ValueError, match="labels: 1 label"):
        plot_compare([run, run], ["x"], out)


# -- bad input ------------------------------------------------------------------------------

def _good(tmp_path, name="run", ranks=2):
    return _write_run(tmp_path / name, _random_run(seed=2, ranks=ranks))


def _replace_line(path, lineno: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")


def _bad_malformed_json(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank1.jsonl", 3, '{"rank": 1, "epoch": 3, "loss": 0.5')
    return [str(d)], "metrics.rank1.jsonl: line 3: not valid JSON"


def _bad_not_object(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank0.jsonl", 2, "[1, 2]")
    return [str(d)], "metrics.rank0.jsonl: line 2: expected a JSON object, got list"


def _bad_epoch(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank0.jsonl", 5, '{"rank": 0, "epoch": "5", "loss": 0.5}')
    return [str(d)], "metrics.rank0.jsonl: line 5: field 'epoch' must be a non-negative integer"


def _bad_number(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank1.jsonl", 4, '{"rank": 1, "epoch": 4, "peak_rss_mb": "big"}')
    return [str(d)], "metrics.rank1.jsonl: line 4: field 'peak_rss_mb' must be a number or null"


def _bad_rank_mismatch(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank1.jsonl", 1, '{"rank": 0, "epoch": 1}')
    return [str(d)], "metrics.rank1.jsonl: line 1: field 'rank' is 0 in the file of rank 1"


def _bad_duplicate(tmp_path):
    d = _good(tmp_path)
    _replace_line(d / "metrics.rank0.jsonl", 6, '{"rank": 0, "epoch": 2, "loss": 1.0}')
    return [str(d)], ("metrics.rank0.jsonl: line 6: epoch 2 of rank 0 appears twice "
                      "(first at metrics.rank0.jsonl line 2)")


def _bad_merged_without_rank(tmp_path):
    d = tmp_path / "merged"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"rank": 0, "epoch": 1}\n\n{"epoch": 1, "loss": 1.0}\n')
    return [str(d)], "metrics.jsonl: line 3: field 'rank' must be a non-negative integer, got None"


def _bad_missing_dir(tmp_path):
    return [str(tmp_path / "nope")], f"{tmp_path / 'nope'}: no such run directory"


def _bad_file_not_dir(tmp_path):
    (tmp_path / "f").write_text("x")
    return [str(tmp_path / "f")], f"{tmp_path / 'f'}: not a directory"


def _bad_no_metrics(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "summary.json").write_text("{}")
    return [str(tmp_path / "empty")], f"{tmp_path / 'empty'}: no metrics (expected metrics.jsonl or"


def _bad_blank_metrics(tmp_path):
    d = tmp_path / "blank"
    d.mkdir()
    (d / "metrics.rank0.jsonl").write_text("\n\n")
    return [str(d)], f"{d}: no metric lines in metrics.rank0.jsonl"


def _bad_summary(tmp_path):
    d = _good(tmp_path)
    (d / "summary.json").write_text('{"engine": "dp",\n "world_size": }')
    return [str(d)], "summary.json: line 2: not valid JSON"


def _bad_labels(tmp_path):
    return [str(_good(tmp_path, "a")), str(_good(tmp_path, "b")), "--labels", "x,y,z", "--out",
            str(tmp_path / "o")], "--labels: expected 2 non-empty comma-separated name(s)"


def _bad_no_out(tmp_path):
    return [str(_good(tmp_path, "a")), str(_good(tmp_path, "b"))], "--out: required when comparing several runs"


def _bad_out_is_file(tmp_path):
    (tmp_path / "o").write_text("x")
    return [str(_good(tmp_path)), "--out", str(tmp_path / "o")], f"{tmp_path / 'o'}: output exists and is not a dir"


@pytest.mark.parametrize("make", [
    _bad_malformed_json, _bad_not_object, _bad_epoch, _bad_number, _bad_rank_mismatch, _bad_duplicate,
    _bad_merged_without_rank, _bad_missing_dir, _bad_file_not_dir, _bad_no_metrics, _bad_blank_metrics,
    _bad_summary, _bad_labels, _bad_no_out, _bad_out_is_file,
], ids=lambda f: f.__name__[5:])
def test_bad_input_one_line_exit_2(tmp_path, capsys, make):
    args, message = make(tmp_path)
    rc = main(["report", *args])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 2, captured
    assert err.startswith("hpc-graph report: error: ") and "\n" not in err
    assert message in err, err
    assert captured.out == ""
    assert not list(tmp_path.rglob("*.png"))  # nothing written


def test_bytes_by_operation_and_strategy(tmp_path, capsys):
    """Sampled engines' engine_stats.bytes_by_op: summed over ranks, mean per epoch; strategy and hit rate."""
    m = _random_run(seed=9, ranks=3, epochs=4)
    run_dir = _write_run(tmp_path / "run", m, engine="apt")
    rng = np.random.default_rng(3)
    ops = rng.integers(0, 10**6, (4, 3, 2))
    hit = rng.uniform(0, 1, (4, 3))
    tune = rng.integers(0, 6, 4)
    rows = []
    for r in range(3):
        path = run_dir / f"metrics.rank{r}.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        for e, line in enumerate(lines):
            line["engine_stats"] = {"strategy": "dnp", "cache_hit_rate": float(hit[e, r]),
                                    "bytes_by_op": {"load": int(ops[e, r, 0]), "shuffle": int(ops[e, r, 1])},
                                    "tuning_iterations": int(tune[e])}
        rows.append(lines)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = summarize(load_run(run_dir))
    assert s["bytes_by_op_per_epoch"]["load"] == pytest.approx(ops[..., 0].sum() / 4)
    assert s["bytes_by_op_per_epoch"]["shuffle"] == pytest.approx(ops[..., 1].sum() / 4)
    assert s["strategy"] == "dnp" and s["cache_hit_rate"] == pytest.approx(hit.mean())
    assert s["tuning_iterations"] == int(tune.sum())  # per rank over the epochs, not over the ranks
    from hpc_graph.train.report import format_summary

    text = "\n".join(format_summary(s))
    assert "by operation" in text and "strategy dnp" in text
    assert (f"{int(tune.sum())} iterations timing" in text) == (tune.sum() > 0)
    assert s["hec_hit_rate_per_layer"] is None and "historical embedding cache" not in text


def test_hec_hit_rate_per_layer_is_hits_over_lookups_on_every_rank_and_epoch(tmp_path):
    m = _random_run(seed=4, ranks=2, epochs=3)
    run_dir = _write_run(tmp_path / "run", m, engine="minibatch")
    rng = np.random.default_rng(8)
    lookups = rng.integers(0, 50, (3, 2, 3))
    lookups[:, :, 2] = 0  # a layer that never looked anything up
    hits = rng.integers(0, 50, (3, 2, 3)) % (lookups + 1)
    for r in range(2):
        path = run_dir / f"metrics.rank{r}.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        for e, line in enumerate(lines):
            line["engine_stats"] = {"hec_lookups": [int(x) for x in lookups[e, r]],
                                    "hec_hit_rate": [h / n if n else None for h, n in zip(hits[e, r], lookups[e, r])]}
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = summarize(load_run(run_dir))
    want = hits.sum(axis=(0, 1)) / np.maximum(lookups.sum(axis=(0, 1)), 1)
    got = s["hec_hit_rate_per_layer"]
    assert got[:2] == pytest.approx(want[:2], rel=1e-12) and got[2] is None
    from hpc_graph.train.report import format_summary

    text = "\n".join(format_summary(s))
    assert f"layer 0 first): {100 * want[0]:.1f}%, {100 * want[1]:.1f}%, -" in text
