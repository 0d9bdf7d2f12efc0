"""``PeakRSS``: extra peak resident memory (MB) of a block of code, sampled in a background thread.

The sampler polls the process RSS (``psutil``) about every millisecond while
the block runs; the result is ``max(RSS) - RSS at entry``. Work that holds the
GIL for long stretches without releasing it can hide short peaks from the
sampler: torch ops and the numba kernels of this project (``nogil=True``)
release it. Allocations freed within less than a sampling period may be
missed, so this is a lower bound on the true peak.
"""
from __future__ import annotations

import gc
import threading
import time

import psutil

MB = float(1 << 20)


class PeakRSS:
    """Context manager measuring the extra peak RSS of its block.

    >>> with PeakRSS() as mem:  # doctest: +SKIP
    ...     big = bytearray(200 << 20)
    >>> mem.extra_mb > 150  # doctest: +SKIP
    True

    Attributes (set on exit):
        extra_mb: peak RSS during the block minus RSS at entry, in MiB (>= 0).
        samples: number of RSS samples taken.
    """

    def __init__(self, interval_s: float = 0.001):
        self.interval_s = float(interval_s)
        self.extra_mb = 0.0
        self.samples = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._peak = 0
        self._base = 0
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        rss = self._proc.memory_info
        while not self._stop.is_set():
            r = rss().rss
            if r > self._peak:
                self._peak = r
            self.samples += 1
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        self._base = self._peak = self._proc.memory_info().rss
        self.samples = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        final = self._proc.memory_info().rss
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, final)
        self.extra_mb = max(0.0, (self._peak - self._base) / MB)
