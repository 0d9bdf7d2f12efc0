"""The CUDA twins' own checks (``tests/numba_kernels/_*cudasim_check.py``) run on the real GPU.

In CI the same scripts run under ``NUMBA_ENABLE_CUDASIM=1``; here they run
compiled for the device (``HPC_GRAPH_REAL_GPU=1``), each in its own process,
against the same NumPy/torch references and CPU twins.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "numba_kernels"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script,args,marker", [
    ("_cudasim_check.py", ["spmm"], "OK spmm"),
    ("_cudasim_check.py", ["sddmm"], "OK sddmm"),
    ("_cudasim_check.py", ["edge_softmax"], "OK edge_softmax"),
    ("_attention_cudasim_check.py", [], "attention OK"),
    ("_quant_cudasim_check.py", [], "OK quant"),
    ("_sample_cudasim_check.py", [], "OK sample"),
])
def test_cuda_twin_checks_on_the_gpu(script, args, marker):
    env = dict(os.environ, HPC_GRAPH_REAL_GPU="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, str(HERE / script), *args], env=env, capture_output=True, text=True,
                          timeout=580)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert marker in proc.stdout, proc.stdout[-4000:]
