"""CUDA twin of the quant kernels under the numba CUDA simulator.

Runs ``_quant_cudasim_check.py`` in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``
(tiny messages, both dtypes, every bit width, forced grid-stride loops,
NaN/Inf values in rows with a finite scale, negative scales, grid values):
codes byte-identical to the CPU twin and the NumPy reference, dequantised
values equal to the CPU twin to 1e-6, row ranges (NaN/Inf rows included) equal.
A second test compiles the kernels to PTX with libNVVM (no GPU needed; skipped
without libNVVM), which catches numba-cuda typing errors the simulator cannot,
and checks that the pack kernel's float arithmetic is all ``.rn`` (never
contracted into an FMA), which byte identity on a real GPU relies on.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("_quant_cudasim_check.py")


def test_quant_cuda_twin_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(CHECK)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK quant" in proc.stdout


def test_quant_cuda_kernels_compile_to_ptx():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(CHECK), "ptx"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if "SKIP ptx" in proc.stdout:
        pytest.skip(proc.stdout.strip())
    assert "OK ptx" in proc.stdout
