"""``numba_kernels.cpu_cache_state``: a fresh cache is cold, a kernel's first call (compiling it) warms it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHECK = """
import json, numpy as np
from numba_kernels import cpu_cache_state
from numba_kernels.cpu._transpose import csr_transpose
probe = "_transpose.csr_transpose"
before = [cpu_cache_state(), cpu_cache_state(probe)]
csr_transpose(np.array([0, 1, 3], np.int64), np.array([1, 0, 1], np.int64), 2, True)  # compiles, saves to the cache
print(json.dumps(before + [cpu_cache_state(probe), cpu_cache_state("spmm.no_such_kernel")]))
"""


def test_fresh_cache_is_cold_and_a_first_call_warms_it(tmp_path):
    cache = tmp_path / "numba-cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (spmm, spmm_dir), (probe_before, probe_dir), (probe_after, _), (missing, _) = json.loads(proc.stdout)
    assert spmm is False and probe_before is False  # nothing compiled in this folder yet
    assert spmm_dir.startswith(str(cache)) and probe_dir.startswith(str(cache))
    assert probe_after is True  # the call above compiled it and numba saved it
    assert missing is None  # a name that is no kernel: cannot be told
