"""CUDA twins of gat_attention / dot_attention under the numba CUDA simulator.

Runs ``_attention_cudasim_check.py`` in a subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (tiny
inputs, forward and all gradients vs the torch references, dropout bits vs the CPU twin), so
the simulator setting never reaches the CPU tests in this process.
"""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_cuda_twins_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, str(HERE / "_attention_cudasim_check.py")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "cudasim attention OK" in proc.stdout
