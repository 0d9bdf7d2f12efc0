"""Per-rank metrics: JSONL writer, timers, peak resident memory, saved-activation bytes and the rank-0 progress bar.

Every rank writes its own file ``RUN_DIR/metrics.rank<R>.jsonl`` (R = rank, no
padding), one JSON object per epoch, each carrying a ``rank`` field, so the
files can be concatenated or read with :func:`read_metrics`. Nothing is shared
between ranks' files, so no locking is needed on a parallel file system. At the
end of a run rank 0 merges them into ``RUN_DIR/metrics.jsonl``
(:func:`merge_metrics`; one line per rank per epoch, sorted by epoch then rank).
A resumed run appends to the per-rank files after dropping the lines of epochs
later than its checkpoint (epochs that will be trained again).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from data_io.errors import atomic_output
from data_io.memory import peak_rss_mb  # noqa: F401 (re-exported: hpc_graph.train.peak_rss_mb)

MERGED_METRICS = "metrics.jsonl"


def metrics_path(run_dir: str | os.PathLike, rank: int) -> Path:
    """``RUN_DIR/metrics.rank<R>.jsonl``: where rank ``rank`` writes its per-epoch lines."""
    return Path(run_dir) / f"metrics.rank{int(rank)}.jsonl"


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All ranks' metric lines of a run (from the per-rank files), sorted by (epoch, rank)."""
    rows = []
    for path in sorted(Path(run_dir).glob("metrics.rank*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return sorted(rows, key=lambda r: (r.get("epoch", 0), r.get("rank", 0)))


def merge_metrics(run_dir: str | os.PathLike) -> Path:
    """Write ``RUN_DIR/metrics.jsonl``: every per-rank line, sorted by epoch then rank (atomic); returns it."""
    path = Path(run_dir) / MERGED_METRICS
    rows = read_metrics(run_dir)
    with atomic_output(path, force=True) as tmp:
        Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _kept_lines(path: Path, last_epoch: int) -> list[str]:
    """Lines of ``path`` whose epoch is at most ``last_epoch`` (a torn last line is dropped)."""
    kept = []
    if not path.exists():
        return kept
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and int(row.get("epoch", 0)) <= last_epoch:
                kept.append(line if line.endswith("\n") else line + "\n")
    return kept


class MetricsWriter:
    """Append one JSON object per line to this rank's metrics file (flushed each line).

    A new run (``resume_epoch`` None) truncates the file. A resumed run keeps the
    lines of epochs ``<= resume_epoch`` (available as ``previous``, parsed) and appends.
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int, resume_epoch: int | None = None):
        self.rank = int(rank)
        self.path = metrics_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.previous: list[dict[str, Any]] = []
        if resume_epoch is None:
            self._fh = open(self.path, "w", encoding="utf-8")
            return
        kept = _kept_lines(self.path, int(resume_epoch))
        self.previous = [json.loads(line) for line in kept]
        with atomic_output(self.path, force=True) as tmp:  # drop epochs after the checkpoint
            Path(tmp).write_text("".join(kept), encoding="utf-8")
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Write ``record`` (plus ``rank``) as one JSON line."""
        self._fh.write(json.dumps({"rank": self.rank, **record}, sort_keys=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Timer:
    """Accumulating wall-clock timer (seconds): ``with timer: ...`` adds the block's duration."""

    def __init__(self):
        self.seconds = 0.0
        self._start: float | None = None

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        assert self._start is not None
        self.seconds += time.perf_counter() - self._start
        self._start = None

    def reset(self) -> float:
        """Return the accumulated seconds and set them to zero."""
        s, self.seconds = self.seconds, 0.0
        return s


class SavedBytes:
    """Count the bytes autograd keeps for the backward pass while the block runs (``with SavedBytes(params) as s``).

    Every tensor saved for backward is counted once per storage (views of one storage count the storage once;
    a slice of the input features counts the whole feature matrix); the storages of ``exclude`` (the
    parameters) are not counted. ``bytes`` holds the total after (and during) the block. Storages are told apart
    by identity, not by data pointer: on the meta device (a step run on shapes) every storage's pointer is 0.
    """

    def __init__(self, exclude: Any = ()):
        self._skip = {t.untyped_storage()._cdata for t in exclude}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks: Any = None

    def _pack(self, t):
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse tensors have no single storage
            return t
        key = storage._cdata
        if key not in self._seen and key not in self._skip:
            self._seen.add(key)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> "SavedBytes":
        import torch

        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


class ProgressBar:
    """Epoch progress on stderr (tqdm when importable, else a plain line), shown only when ``enabled``."""

    def __init__(self, total: int, enabled: bool, desc: str = "train"):
        self.enabled = enabled
        self._bar = None
        self._n = 0
        self.total = total
        self.desc = desc
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=True)
            except ImportError:  # a simple text bar
                self._bar = None

    def update(self, **postfix: Any) -> None:
        """Advance one step and show ``postfix`` values (floats shown with 4 digits)."""
        if not self.enabled:
            return
        self._n += 1
        shown = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in postfix.items() if v is not None}
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1)
        else:
            text = " ".join(f"{k}={v}" for k, v in shown.items())
            sys.stderr.write(f"\r{self.desc} {self._n}/{self.total} {text}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.enabled = False


