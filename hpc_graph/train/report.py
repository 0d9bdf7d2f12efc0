"""Run reports: summary numbers and PNG plots from the metrics of one or several training runs.

A run directory holds the per-epoch metric lines of every rank, either as
``metrics.rank<R>.jsonl`` (one file per rank, written by
:class:`~hpc_graph.train.metrics.MetricsWriter`) or merged into one
``metrics.jsonl`` (read instead of the per-rank files when present), plus the
optional ``summary.json`` of rank 0. The fields used here are those the
:class:`~hpc_graph.train.trainer.Trainer` writes: ``rank, epoch, loss,
train_acc, val_acc, test_acc`` (accuracies ``null`` on epochs without
evaluation), ``epoch_seconds, compute_seconds, comm_seconds, bytes_sent,
eval_seconds, peak_rss_mb``; numeric fields other than ``epoch`` and ``rank``
may be absent or ``null``.

Conventions of the numbers (all computed from the metric lines):

* the time of an epoch is that of its slowest rank (the ranks wait for each
  other in the all-reduce); ``median_epoch_seconds`` is the median over epochs;
* "training time" (the x axis of the wall-time plots) is the cumulative sum over
  epochs of the slowest rank's step + evaluation seconds (start-up excluded);
* loss and accuracies are global (all-reduced), read from the lowest rank that
  has the epoch;
* per-rank compute and communication times are medians over epochs; the
  compute share is total compute seconds / (compute + communication seconds)
  over all ranks and epochs;
* peak memory of a rank is the maximum of its ``peak_rss_mb`` (MiB);
  bytes per epoch of a rank is the mean of its ``bytes_sent``, and the run's
  bytes per epoch is their sum over ranks (as in ``summary.json``).

Plots use matplotlib's object API (no pyplot, no global backend change) and are
written atomically: a failure leaves no partial PNG.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from data_io.errors import DataError, FormatError, atomic_output
from data_io.memory import format_bytes as _format_bytes

log = logging.getLogger(__name__)

MERGED_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
_RANK_FILE = re.compile(r"^metrics\.rank(\d+)\.jsonl$")
#: numeric per-epoch fields; each may be missing or null on a line
NUMERIC_FIELDS = ("loss", "train_acc", "val_acc", "test_acc", "lr", "epoch_seconds", "compute_seconds",
                  "comm_seconds", "bytes_sent", "eval_seconds", "eval_bytes_sent", "peak_rss_mb")
_DPI = 110


@dataclass
class Run:
    """The metrics of one training run.

    Attributes:
        rows: the metric lines (dicts), sorted by (epoch, rank); every row has int ``epoch`` and ``rank``.
        summary: the parsed ``summary.json`` of rank 0, or None when the run has none.
        num_ranks: number of distinct ranks with metric lines.
        run_dir: the run directory.
        sources: the metric files read.
    """

    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    num_ranks: int
    run_dir: Path = field(default_factory=Path)
    sources: list[Path] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        """Distinct ranks in ascending order (length ``num_ranks``)."""
        return sorted({r["rank"] for r in self.rows})

    @property
    def epochs(self) -> np.ndarray:
        """int64[E]: distinct epochs in ascending order."""
        return np.array(sorted({r["epoch"] for r in self.rows}), dtype=np.int64)

    @property
    def engine(self) -> str | None:
        """Engine name from ``summary.json`` (``engine``, else ``config.engine.name``), or None."""
        s = self.summary or {}
        name = s.get("engine")
        if name is None and isinstance(s.get("config"), dict):
            name = (s["config"].get("engine") or {}).get("name")
        return str(name) if name is not None else None

    def table(self, name: str) -> np.ndarray:
        """float64[E, R]: field ``name`` per (epoch, rank) in the order of ``epochs``/``ranks``; NaN where absent."""
        epochs, ranks = self.epochs, self.ranks
        e_index = {int(e): i for i, e in enumerate(epochs)}
        r_index = {r: j for j, r in enumerate(ranks)}
        out = np.full((len(epochs), len(ranks)), np.nan)
        for row in self.rows:
            v = row.get(name)
            if v is not None:
                out[e_index[row["epoch"]], r_index[row["rank"]]] = float(v)
        return out


# -- reading ----------------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read_lines(path: Path, file_rank: int | None, seen: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"line {lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise FormatError(path, where, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise FormatError(path, where, f"expected a JSON object, got {type(row).__name__}")
                epoch = row.get("epoch")
                if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                    raise FormatError(path, where, f"field 'epoch' must be a non-negative integer, got {epoch!r}")
                rank = row.get("rank", file_rank)
                if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                    raise FormatError(path, where, f"field 'rank' must be a non-negative integer, got {rank!r}")
                if file_rank is not None and rank != file_rank:
                    raise FormatError(path, where, f"field 'rank' is {rank} in the file of rank {file_rank}")
                for name in NUMERIC_FIELDS:
                    v = row.get(name)
                    if v is not None and not _is_number(v):
                        raise FormatError(path, where, f"field '{name}' must be a number or null, got {v!r}")
                key = (epoch, rank)
                if key in seen:
                    raise FormatError(path, where, f"epoch {epoch} of rank {rank} appears twice "
                                                   f"(first at {seen[key]})")
                seen[key] = f"{path.name} {where}"
                rows.append({**row, "rank": rank})
    except UnicodeDecodeError as exc:
        raise FormatError(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return rows


def _read_summary(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"line {exc.lineno}", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise FormatError(path, None, f"expected a JSON object, got {type(data).__name__}")
    return data


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read the metric lines and ``summary.json`` of ``run_dir``.

    Reads ``metrics.jsonl`` when it exists, else every ``metrics.rank<R>.jsonl``.
    Raises DataError for a missing directory or one without metric lines, and
    FormatError naming the file and line for a malformed line (bad JSON, a
    non-integer ``epoch``/``rank``, a non-numeric metric, a repeated epoch of a rank).
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise DataError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: not a directory (expected a run directory with metrics)")
    merged = run_dir / MERGED_FILE
    files: list[tuple[Path, int | None]]
    if merged.is_file():
        files = [(merged, None)]
    else:
        found = [(p, _RANK_FILE.match(p.name)) for p in run_dir.glob("metrics.rank*.jsonl")]
        files = sorted(((p, int(m.group(1))) for p, m in found if m and p.is_file()), key=lambda t: t[1])
    if not files:
        raise DataError(f"{run_dir}: no metrics (expected {MERGED_FILE} or metrics.rank<R>.jsonl)")
    seen: dict[tuple[int, int], str] = {}
    rows = [row for path, rank in files for row in _read_lines(path, rank, seen)]
    if not rows:
        raise DataError(f"{run_dir}: no metric lines in {', '.join(p.name for p, _ in files)}")
    rows.sort(key=lambda r: (r["epoch"], r["rank"]))
    summary = _read_summary(run_dir / SUMMARY_FILE)
    run = Run(rows=rows, summary=summary, num_ranks=len({r["rank"] for r in rows}), run_dir=run_dir,
              sources=[p for p, _ in files])
    size = (summary or {}).get("world_size")
    if _is_number(size) and size != run.num_ranks:
        log.warning("%s: summary.json says %s ranks but metrics exist for %d", run_dir, size, run.num_ranks)
    return run


# -- numbers ----------------------------------------------------------------------------------

def _row_max(mat: np.ndarray) -> np.ndarray:
    """float[E]: NaN-ignoring maximum of each row (NaN for an all-NaN row), without warnings."""
    if mat.shape[1] == 0:
        return np.full(mat.shape[0], np.nan)
    m = np.where(np.isnan(mat), -np.inf, mat).max(axis=1)
    return np.where(np.isneginf(m), np.nan, m)


def _col_reduce(mat: np.ndarray, fn) -> np.ndarray:
    """float[R]: ``fn`` (e.g. np.median) of each column's non-NaN values; NaN for an empty column."""
    out = np.full(mat.shape[1], np.nan)
    for j in range(mat.shape[1]):
        v = mat[:, j][~np.isnan(mat[:, j])]
        if v.size:
            out[j] = fn(v)
    return out


def _first_valid(mat: np.ndarray) -> np.ndarray:
    """float[E]: per row, the value of the first (lowest-rank) column that is not NaN."""
    out = np.full(mat.shape[0], np.nan)
    for j in range(mat.shape[1] - 1, -1, -1):
        col = mat[:, j]
        out = np.where(np.isnan(col), out, col)
    return out


def _num(v: Any) -> float | None:
    """A JSON-safe float: None for NaN/inf/None."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _nums(a: np.ndarray) -> list[float | None]:
    return [_num(v) for v in a]


def training_time(run: Run) -> np.ndarray:
    """float64[E]: cumulative training time in seconds at the end of each epoch.

    Sum over epochs of the slowest rank's ``epoch_seconds + eval_seconds``
    (missing values count as 0).
    """
    step = np.nan_to_num(run.table("epoch_seconds")) + np.nan_to_num(run.table("eval_seconds"))
    return np.cumsum(_row_max(step) if step.size else np.zeros(len(run.epochs)))


def summarize(run: Run) -> dict[str, Any]:
    """Summary numbers of a run (JSON-safe: NaN becomes None).

    Keys: ``run_dir, engine, num_ranks, ranks, epochs, first_epoch, last_epoch,
    best_epoch, best_val_acc, test_acc_at_best, final_loss, final_train_acc,
    final_val_acc, final_test_acc`` (last evaluated epoch), ``median_epoch_seconds``
    (slowest rank per epoch), ``training_seconds``, per rank (lists in ``ranks``
    order): ``median_epoch_seconds_per_rank``, ``median_compute_seconds_per_rank``,
    ``median_comm_seconds_per_rank``, ``peak_rss_mb_per_rank`` (MiB),
    ``bytes_per_epoch_per_rank``; ``compute_share``, ``comm_share`` (fractions of
    compute + communication seconds), ``max_peak_rss_mb``, ``bytes_per_epoch``
    (sum over ranks); for the sampled engines ``bytes_by_op_per_epoch`` (engine_stats'
    ``bytes_by_op``, summed over ranks, mean per epoch), ``strategy``, ``cache_hit_rate``,
    ``tuning_iterations`` (``apt``: iterations that ran another strategy to time it, the largest rank's total) and
    ``hec_hit_rate_per_layer`` (``minibatch`` in ``hec`` mode: per layer, layer 0 first, the cache's hits over its
    lookups on every rank in every epoch; None for a layer without lookups), None where absent.
    """
    epochs = run.epochs
    loss = _first_valid(run.table("loss"))
    acc = {k: _first_valid(run.table(f"{k}_acc")) for k in ("train", "val", "test")}
    epoch_s = run.table("epoch_seconds")
    compute, comm = run.table("compute_seconds"), run.table("comm_seconds")
    rss, sent = run.table("peak_rss_mb"), run.table("bytes_sent")

    out: dict[str, Any] = {"run_dir": str(run.run_dir), "engine": run.engine, "num_ranks": run.num_ranks,
                           "ranks": run.ranks, "epochs": int(len(epochs)),
                           "first_epoch": int(epochs[0]), "last_epoch": int(epochs[-1])}
    val = acc["val"]
    if np.any(~np.isnan(val)):
        i = int(np.nanargmax(val))  # first epoch reaching the best (the trainer keeps the first)
        out.update(best_epoch=int(epochs[i]), best_val_acc=_num(val[i]), test_acc_at_best=_num(acc["test"][i]))
    else:
        out.update(best_epoch=None, best_val_acc=None, test_acc_at_best=None)
    valid_loss = np.flatnonzero(~np.isnan(loss))
    out["final_loss"] = _num(loss[valid_loss[-1]]) if valid_loss.size else None
    evaluated = np.flatnonzero(~np.isnan(val) | ~np.isnan(acc["train"]) | ~np.isnan(acc["test"]))
    for k in ("train", "val", "test"):
        out[f"final_{k}_acc"] = _num(acc[k][evaluated[-1]]) if evaluated.size else None

    slowest = _row_max(epoch_s)
    slowest = slowest[~np.isnan(slowest)]
    out["median_epoch_seconds"] = _num(np.median(slowest)) if slowest.size else None
    out["training_seconds"] = _num(training_time(run)[-1])
    out["median_epoch_seconds_per_rank"] = _nums(_col_reduce(epoch_s, np.median))
    out["median_compute_seconds_per_rank"] = _nums(_col_reduce(compute, np.median))
    out["median_comm_seconds_per_rank"] = _nums(_col_reduce(comm, np.median))
    c_total, m_total = float(np.nansum(compute)), float(np.nansum(comm))
    both = c_total + m_total
    out["compute_share"] = _num(c_total / both) if both > 0 else None
    out["comm_share"] = _num(m_total / both) if both > 0 else None
    peak = _col_reduce(rss, np.max)
    out["peak_rss_mb_per_rank"] = _nums(peak)
    out["max_peak_rss_mb"] = _num(np.nanmax(peak)) if np.any(~np.isnan(peak)) else None
    per_rank_bytes = _col_reduce(sent, np.mean)
    out["bytes_per_epoch_per_rank"] = _nums(per_rank_bytes)
    out["bytes_per_epoch"] = _num(np.nansum(per_rank_bytes)) if np.any(~np.isnan(per_rank_bytes)) else None
    # sampled engines: bytes by operation (engine_stats.bytes_by_op), mean per epoch, summed over ranks
    by_op: dict[str, list[float]] = {}
    strategies, hits, tuning = set(), [], {}
    hec_hits: list[float] = []
    hec_lookups: list[float] = []
    for row in run.rows:
        st = row.get("engine_stats")
        if not isinstance(st, dict):
            continue
        rates, lookups = st.get("hec_hit_rate"), st.get("hec_lookups")
        if isinstance(rates, list) and isinstance(lookups, list) and len(rates) == len(lookups):
            if len(hec_hits) < len(rates):
                hec_hits += [0.0] * (len(rates) - len(hec_hits))
                hec_lookups += [0.0] * (len(rates) - len(hec_lookups))
            for i, (rate, n) in enumerate(zip(rates, lookups)):
                if _is_number(n) and n > 0 and _is_number(rate):
                    hec_hits[i] += float(rate) * float(n)
                    hec_lookups[i] += float(n)
        for op, v in (st.get("bytes_by_op") or {}).items():
            if _is_number(v):
                by_op.setdefault(op, []).append(float(v))
        if st.get("strategy"):
            strategies.add(str(st["strategy"]))
        if _is_number(st.get("cache_hit_rate")):
            hits.append(float(st["cache_hit_rate"]))
        if _is_number(st.get("tuning_iterations")):
            rank = row.get("rank", 0)
            tuning[rank] = tuning.get(rank, 0) + int(st["tuning_iterations"])
    n_epochs = max(len(epochs), 1)
    out["bytes_by_op_per_epoch"] = {op: sum(v) / n_epochs for op, v in sorted(by_op.items())} or None
    out["strategy"] = ", ".join(sorted(strategies)) or None
    out["cache_hit_rate"] = _num(float(np.mean(hits))) if hits else None
    out["tuning_iterations"] = max(tuning.values()) if tuning else None
    out["hec_hit_rate_per_layer"] = [_num(h / n) if n > 0 else None for h, n in zip(hec_hits, hec_lookups)] \
        if hec_lookups else None
    return out


# -- text -------------------------------------------------------------------------------------

def format_bytes(n: float | None) -> str:
    """``1536`` -> ``'1.50 KiB'`` (binary units, two decimals); ``'-'`` for None."""
    return "-" if n is None else _format_bytes(n, 2)


def format_seconds(s: float | None) -> str:
    """``0.0123`` -> ``'12.3 ms'``; ``'-'`` for None."""
    if s is None:
        return "-"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.1f} us"
    if abs(s) < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def format_summary(summary: dict[str, Any], label: str | None = None) -> list[str]:
    """Lines of text describing one :func:`summarize` result (no trailing newlines)."""
    s = summary
    head = label or s["run_dir"]
    engine = f"engine {s['engine']}, " if s.get("engine") else ""
    lines = [f"run {head}: {engine}{s['num_ranks']} rank(s), {s['epochs']} epochs "
             f"({s['first_epoch']}..{s['last_epoch']})"]
    if s["best_epoch"] is not None:
        lines.append(f"  best val acc {_fmt(s['best_val_acc'])} at epoch {s['best_epoch']}, "
                     f"test acc {_fmt(s['test_acc_at_best'])}")
    else:
        lines.append("  no evaluated epoch (no val acc)")
    lines.append(f"  final loss {_fmt(s['final_loss'])}")
    lines.append(f"  median epoch time {format_seconds(s['median_epoch_seconds'])} (slowest rank), "
                 f"training time {format_seconds(s['training_seconds'])}")
    if s["compute_share"] is not None:
        lines.append(f"  compute {100 * s['compute_share']:.1f}% / communication {100 * s['comm_share']:.1f}% "
                     "of step time")
    ranks = s["ranks"]
    lines.append("  peak memory per rank: " + ", ".join(
        f"{r}: {_fmt(v, '.1f')} MiB" for r, v in zip(ranks, s["peak_rss_mb_per_rank"])))
    lines.append(f"  bytes sent per epoch: {format_bytes(s['bytes_per_epoch'])} in all; per rank: " + ", ".join(
        f"{r}: {format_bytes(v)}" for r, v in zip(ranks, s["bytes_per_epoch_per_rank"])))
    if s.get("bytes_by_op_per_epoch"):
        lines.append("  by operation (all ranks, per epoch): " + ", ".join(
            f"{op} {format_bytes(v)}" for op, v in s["bytes_by_op_per_epoch"].items()))
    if s.get("strategy"):
        hit = s.get("cache_hit_rate")
        tuned = s.get("tuning_iterations")
        lines.append(f"  strategy {s['strategy']}" + (f", cache hit rate {100 * hit:.1f}%" if hit is not None else "")
                     + (f", {tuned} iterations timing the strategies" if tuned else ""))
    if s.get("hec_hit_rate_per_layer"):
        lines.append("  historical embedding cache hit rate per layer (layer 0 first): " + ", ".join(
            "-" if v is None else f"{100 * v:.1f}%" for v in s["hec_hit_rate_per_layer"]))
    return lines


def format_comparison(summaries: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[str]:
    """A table with one line per run: ranks, epochs, best val/test acc, median epoch time, peak memory, bytes."""
    w = max([len("run")] + [len(x) for x in labels])
    lines = [f"{'run':<{w}} {'ranks':>5} {'epochs':>6} {'best val':>8} {'test':>6} {'epoch time':>10} "
             f"{'max peak':>12} {'bytes/epoch':>12}"]
    for s, lab in zip(summaries, labels):
        lines.append(f"{lab:<{w}} {s['num_ranks']:>5} {s['epochs']:>6} {_fmt(s['best_val_acc']):>8} "
                     f"{_fmt(s['test_acc_at_best']):>6} {format_seconds(s['median_epoch_seconds']):>10} "
                     f"{_fmt(s['max_peak_rss_mb'], '.1f') + ' MiB':>12} {format_bytes(s['bytes_per_epoch']):>12}")
    return lines


# -- plots ------------------------------------------------------------------------------------

def _figure(nrows: int, ncols: int, width: float, height: float):
    from matplotlib.figure import Figure  # ImportError when matplotlib is missing: the CLI explains

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically (temporary name, then rename)."""
    with atomic_output(path, force=True) as tmp:
        fig.savefig(tmp, format="png", dpi=_DPI)
    log.debug("wrote %s", path)
    return path


def _out_dir(out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: output exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{out}: cannot create output directory: {exc.strerror or exc}") from None
    return out


def _scale(max_value: float, units: Sequence[tuple[str, float]]) -> tuple[str, float]:
    """The (unit, divisor) of the largest unit that keeps ``max_value`` >= 1."""
    best = units[0]
    for unit in units:
        if max_value >= unit[1]:
            best = unit
    return best


_TIME_UNITS = (("ms", 1e-3), ("s", 1.0))
_BYTE_UNITS = (("B", 1.0), ("KiB", 1024.0), ("MiB", 1024.0 ** 2), ("GiB", 1024.0 ** 3))
_MEM_UNITS = (("MiB", 1.0), ("GiB", 1024.0))


def _finite_max(*arrays: np.ndarray) -> float:
    vals = [a[np.isfinite(a)] for a in arrays if np.size(a)]
    vals = [v for v in vals if v.size]
    return float(max(v.max() for v in vals)) if vals else 0.0


def _marker(n: int) -> str | None:
    return "o" if n <= 30 else None


def _curves(axes, run: Run, label: str | None, color=None, splits=("train", "val", "test")) -> None:
    """Draw loss and accuracies of ``run`` on axes[0, :] (vs epoch) and axes[1, :] (vs training time)."""
    epochs = run.epochs.astype(float)
    wall = training_time(run)
    loss = _first_valid(run.table("loss"))
    styles = {"train": ":", "val": "-", "test": "--"}
    for row, x in ((0, epochs), (1, wall)):
        ok = ~np.isnan(loss)
        axes[row, 0].plot(x[ok], loss[ok], color=color, label=label or "loss", marker=_marker(int(ok.sum())),
                          markersize=3)
        for k in splits:
            acc = _first_valid(run.table(f"{k}_acc"))
            ok = ~np.isnan(acc)
            if ok.any():
                name = f"{label} {k}" if label and len(splits) > 1 else (label or k)
                axes[row, 1].plot(x[ok], acc[ok], color=color, linestyle=styles[k], label=name,
                                  marker=_marker(int(ok.sum())), markersize=3)


def _label_curves(axes, title: str) -> None:
    for row, what, xlabel in ((0, "epoch", "epoch"),
                              (1, "training time", "training time (s, slowest rank, step + eval)")):
        axes[row, 0].set(xlabel=xlabel, ylabel="training loss (cross-entropy)", title=f"loss vs {what}")
        axes[row, 1].set(xlabel=xlabel, ylabel="accuracy (fraction)", title=f"accuracy vs {what}")
        for ax in axes[row]:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    axes[0, 0].figure.suptitle(title)


def _title(run: Run, label: str | None) -> str:
    engine = f", engine {run.engine}" if run.engine else ""
    return f"{label or run.run_dir.name or run.run_dir}: {run.num_ranks} rank(s){engine}"


def plot_run(run: Run, out_dir: str | os.PathLike, label: str | None = None) -> list[Path]:
    """Write the plots of one run into ``out_dir`` (created if needed); return their paths.

    ``curves.png``: loss and train/val/test accuracy against epoch and against
    training time; ``rank_time.png``: per rank, median compute and communication
    seconds per epoch, stacked; ``rank_memory.png``: peak resident memory per rank;
    ``bytes_per_epoch.png``: bytes sent by each rank in each epoch. Plots whose
    fields are absent from every line are skipped (with a warning).
    """
    out = _out_dir(out_dir)
    title = _title(run, label)
    paths = []

    fig, axes = _figure(2, 2, 11, 8)
    _curves(axes, run, None)
    best = summarize(run)
    if best["best_epoch"] is not None:  # mark the best-validation epoch
        i = int(np.flatnonzero(run.epochs == best["best_epoch"])[0])
        for row, xb in ((0, float(best["best_epoch"])), (1, float(training_time(run)[i]))):
            axes[row, 1].plot([xb], [best["best_val_acc"]], marker="*", markersize=12, color="tab:red",
                              linestyle="none", label=f"best val (epoch {best['best_epoch']})")
    _label_curves(axes, title)
    paths.append(_save(fig, out / "curves.png"))

    ranks = run.ranks
    x = np.arange(len(ranks))
    compute = _col_reduce(run.table("compute_seconds"), np.median)
    comm = _col_reduce(run.table("comm_seconds"), np.median)
    if np.any(~np.isnan(compute)) or np.any(~np.isnan(comm)):
        unit, div = _scale(_finite_max(np.nan_to_num(compute) + np.nan_to_num(comm)), _TIME_UNITS)
        fig, axes = _figure(1, 1, max(5.0, 0.5 * len(ranks) + 3), 4.5)
        ax = axes[0, 0]
        c, m = np.nan_to_num(compute) / div, np.nan_to_num(comm) / div
        ax.bar(x, c, color="tab:blue", label="compute")
        ax.bar(x, m, bottom=c, color="tab:orange", label="communication")
        ax.set_ylim(0, 1.25 * max(float(np.max(c + m)), 1e-12))  # room for the legend above the bars
        ax.set(xlabel="rank", ylabel=f"time per epoch ({unit}, median over epochs)",
               title=f"compute vs communication per rank\n{title}")
        ax.set_xticks(x, [str(r) for r in ranks])
        ax.legend(loc="upper center", ncol=2)
        ax.grid(True, axis="y", alpha=0.3)
        paths.append(_save(fig, out / "rank_time.png"))
    else:
        log.warning("%s: no compute_seconds/comm_seconds in the metrics; rank_time.png skipped", run.run_dir)

    peak = _col_reduce(run.table("peak_rss_mb"), np.max)
    if np.any(~np.isnan(peak)):
        unit, div = _scale(_finite_max(peak), _MEM_UNITS)
        fig, axes = _figure(1, 1, max(5.0, 0.5 * len(ranks) + 3), 4.5)
        ax = axes[0, 0]
        ax.bar(x, np.nan_to_num(peak) / div, color="tab:green")
        ax.set(xlabel="rank", ylabel=f"peak resident memory ({unit})", title=f"peak memory per rank\n{title}")
        ax.set_xticks(x, [str(r) for r in ranks])
        ax.grid(True, axis="y", alpha=0.3)
        paths.append(_save(fig, out / "rank_memory.png"))
    else:
        log.warning("%s: no peak_rss_mb in the metrics; rank_memory.png skipped", run.run_dir)

    sent = run.table("bytes_sent")
    if np.any(~np.isnan(sent)):
        unit, div = _scale(_finite_max(sent), _BYTE_UNITS)
        fig, axes = _figure(1, 1, 7, 4.5)
        ax = axes[0, 0]
        epochs = run.epochs
        for j, r in enumerate(ranks):
            ok = ~np.isnan(sent[:, j])
            ax.plot(epochs[ok], sent[ok, j] / div, label=f"rank {r}", marker=_marker(int(ok.sum())), markersize=3)
        ax.set(xlabel="epoch", ylabel=f"bytes sent in the training step ({unit})",
               title=f"communication volume per epoch\n{title}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if len(ranks) <= 16:
            ax.legend(fontsize="small", ncol=max(1, len(ranks) // 8))
        paths.append(_save(fig, out / "bytes_per_epoch.png"))
    else:
        log.warning("%s: no bytes_sent in the metrics; bytes_per_epoch.png skipped", run.run_dir)
    return paths


def plot_compare(runs: Sequence[Run], labels: Sequence[str], out_dir: str | os.PathLike) -> list[Path]:
    """Write comparison plots of several runs into ``out_dir``; return their paths.

    ``compare_curves.png``: loss and validation accuracy of every run against
    epoch and training time, overlaid; ``scaling.png``: median epoch time
    (slowest rank) and maximum peak memory per rank against the number of ranks,
    one line per engine (runs without an engine name form one line), each point
    annotated with its label, and the ideal 1/P time of each line as dots.
    Raises ValueError when ``labels`` and ``runs`` differ in length.
    """
    if len(labels) != len(runs):
        raise ValueError(f"labels: {len(labels)} label(s) for {len(runs)} run(s)")
    if not runs:
        raise ValueError("runs: nothing to compare")
    out = _out_dir(out_dir)
    paths = []
    fig, axes = _figure(2, 2, 11, 8)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for run, lab, col in zip(runs, labels, colors):
        _curves(axes, run, lab, color=col, splits=("val",))
    _label_curves(axes, f"{len(runs)} runs: loss and validation accuracy")
    axes[0, 1].set_ylabel("validation accuracy (fraction)")
    axes[1, 1].set_ylabel("validation accuracy (fraction)")
    paths.append(_save(fig, out / "compare_curves.png"))

    summaries = [summarize(r) for r in runs]
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.engine or "runs", []).append(i)
    fig, axes = _figure(1, 2, 11, 4.5)
    ax_t, ax_m = axes[0, 0], axes[0, 1]
    times = np.array([s["median_epoch_seconds"] if s["median_epoch_seconds"] is not None else np.nan
                      for s in summaries])
    mems = np.array([s["max_peak_rss_mb"] if s["max_peak_rss_mb"] is not None else np.nan for s in summaries])
    t_unit, t_div = _scale(_finite_max(times), _TIME_UNITS)
    m_unit, m_div = _scale(_finite_max(mems), _MEM_UNITS)
    ideal_shown = False
    for g, (name, idx) in enumerate(groups.items()):
        idx = sorted(idx, key=lambda i: runs[i].num_ranks)
        p = np.array([runs[i].num_ranks for i in idx], dtype=float)
        col = f"C{g % 10}"
        for ax, ys, div in ((ax_t, times, t_div), (ax_m, mems, m_div)):
            y = ys[idx] / div
            ax.plot(p, y, marker="o", color=col, label=name)
            for pi, yi, i in zip(p, y, idx):
                if np.isfinite(yi):
                    ax.annotate(labels[i], (pi, yi), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        t0 = times[idx[0]] / t_div
        if len(idx) > 1 and np.isfinite(t0):
            ax_t.plot(p, t0 * p[0] / p, linestyle=":", color=col, label=None if ideal_shown else "ideal (1/P)")
            ideal_shown = True
    counts = sorted({r.num_ranks for r in runs})
    for ax in (ax_t, ax_m):
        if counts[-1] / counts[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax_t.set(xlabel="number of ranks", ylabel=f"median epoch time ({t_unit}, slowest rank)",
             title="epoch time vs ranks")
    ax_m.set(xlabel="number of ranks", ylabel=f"max peak memory per rank ({m_unit})",
             title="peak memory per rank vs ranks")
    ax_m.set_ylim(bottom=0)
    fig.suptitle("scaling")
    paths.append(_save(fig, out / "scaling.png"))
    return paths
