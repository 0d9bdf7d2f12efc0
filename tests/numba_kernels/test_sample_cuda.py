"""CUDA twin of the sample kernels under the numba CUDA simulator.

Runs ``_sample_cudasim_check.py`` in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``
(tiny graphs, fan-outs 1-10 and -1 in the one-thread-per-row kernel, fan-out
100 with selections beyond LOCAL_MAX in the block kernel, direct and
complement, forced grid-stride loops): counts and samples identical to the
CPU twin and the Python reference; different keys differ; bad fan-outs raise.
A second test compiles the kernels to PTX with libNVVM (no GPU needed; skipped
without libNVVM), which catches numba-cuda typing errors the simulator cannot.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("_sample_cudasim_check.py")


def test_sample_cuda_twin_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(CHECK)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK sample" in proc.stdout


def test_sample_cuda_kernels_compile_to_ptx():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(CHECK), "ptx"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "SKIP ptx" in proc.stdout:
        pytest.skip(proc.stdout.strip())
    assert "OK ptx" in proc.stdout
