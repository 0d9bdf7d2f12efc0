"""CUDA twin of the edge_softmax kernels under the numba CUDA simulator (tiny graphs, both dtypes).

Runs `_cudasim_check.py edge_softmax` in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``
so that the simulator never leaks into this pytest process (where the CPU
kernels are tested). The check compares with NumPy references and fails on
any mismatch.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).with_name("_cudasim_check.py")


def test_edge_softmax_cuda_twin_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(CHECK), "edge_softmax"], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK edge_softmax" in proc.stdout
