"""GPU-only tests: skipped where torch sees no CUDA device (CI is CPU-only and covers the CUDA twins under
``NUMBA_ENABLE_CUDASIM=1`` in ``tests/numba_kernels``); run them on a machine with a GPU with
``python3 -m pytest tests/gpu`` (``benchmarks/gpu/run_gpu_checks.sh`` does, with the GPU benchmarks).

With ``HPC_GRAPH_FAILURE_LOG=PATH`` each failure's report is appended to ``PATH`` as soon as it happens:
a GPU run cut short by its time limit still leaves what failed and why (pytest's summary comes only at
the end)."""
from __future__ import annotations

import os

import pytest
import torch

HAVE_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    path = os.environ.get("HPC_GRAPH_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n")
