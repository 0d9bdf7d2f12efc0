"""hpc_graph.comm.malloc: glibc's mmap threshold, checked through glibc's own accounting (mallinfo2)."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_graph.comm.malloc import MAX_THRESHOLD, configure_malloc
from hpc_graph.train.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

# A fresh process: a 4 MiB block is freed (glibc's adaptive threshold rises to 4 MiB), then a 2 MiB block is
# allocated. mallinfo2().hblks counts the blocks served by mmap: with a fixed 1 MiB threshold the 2 MiB block
# is one of them, with glibc's default it comes from the heap.
PROBE = textwrap.dedent("""
    import ctypes, json, os, sys
    sys.path.insert(0, {root!r})
    applied = None
    if {configure}:
        from hpc_graph.comm.malloc import configure_malloc
        applied = configure_malloc(1 << 20)
    libc = ctypes.CDLL("libc.so.6")
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc.mallinfo2.restype = Info
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(4 << 20))
    before = libc.mallinfo2().hblks
    block = libc.malloc(2 << 20)
    mmapped = libc.mallinfo2().hblks - before
    libc.free(block)
    print(json.dumps({{"applied": applied, "mmapped": mmapped}}))
""")


def _probe(configure: bool, env_extra: dict | None = None) -> dict:
    import os
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), configure=configure)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc_has_mallinfo2() -> bool:
    import ctypes
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _glibc_has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")


def test_a_fixed_threshold_serves_large_blocks_from_fresh_pages():
    assert _probe(configure=False) == {"applied": None, "mmapped": 0}  # glibc's adaptive default: the heap
    assert _probe(configure=True) == {"applied": True, "mmapped": 1}


def test_the_environment_variable_wins():
    got = _probe(configure=True, env_extra={"MALLOC_MMAP_THRESHOLD_": "8388608"})
    assert got == {"applied": False, "mmapped": 0}  # glibc honours the user's 8 MiB: a 2 MiB block stays home


def test_zero_leaves_the_default_and_bad_values_name_the_option():
    assert configure_malloc(0) is False
    for bad in (-1, MAX_THRESHOLD + 1):
        with pytest.raises(ValueError, match="train.malloc_mmap_threshold"):
            configure_malloc(bad)


@pytest.mark.parametrize("value", [-1, 64 << 20, "1MB", 1.5])
def test_config_refuses_bad_thresholds(tmp_path, value):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {path: x.h5}\nmodel: {name: gcn}\n")
    with pytest.raises(ConfigError, match="train.malloc_mmap_threshold"):
        load_config(cfg, [f"train.malloc_mmap_threshold={value}"])
