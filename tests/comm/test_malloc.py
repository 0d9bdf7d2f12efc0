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

# glibc's allocator and its accounting through ctypes, for the probes below (each one a fresh process)
LIBC = "; ".join([
    'libc = ctypes.CDLL("libc.so.6")',
    'Info = type("Info", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_size_t) for n in '
    '"arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]})',
    "libc.mallinfo2.restype = Info",
    "libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]",
    "libc.free.argtypes = [ctypes.c_void_p]"])

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
    {libc}
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
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), configure=configure, libc=LIBC)],
                         env=env,
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


HEAP_PROBE = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, {root!r})
    from hpc_graph.comm.malloc import configure_malloc, heap_blocks
    configure_malloc(1 << 20)
    {libc}
    def mmapped(size):
        before = libc.mallinfo2().hblks
        block = libc.malloc(size)
        n = libc.mallinfo2().hblks - before
        libc.free(block)
        return n
    with heap_blocks(8 << 20):
        inside = [mmapped(4 << 20), mmapped(16 << 20)]
        kept = libc.mallinfo2().arena  # the freed 4 MiB stays in the heap for the next temporary
    libc.free(libc.malloc(4 << 20))  # after: the next free of a large block returns the heap's top
    print(json.dumps({{"inside": inside, "kept_mib": kept >> 20, "after_mib": libc.mallinfo2().arena >> 20}}))
""")


def test_heap_blocks_serves_temporaries_from_the_heap_and_restores_the_fixed_threshold():
    import os
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE.format(root=str(ROOT), libc=LIBC)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    # a 4 MiB block from the heap inside, a 16 MiB one (above the limit) still mmapped; the heap kept the freed
    # 4 MiB inside and gave it back after
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["inside"] == [0, 1] and got["kept_mib"] >= 4 and got["after_mib"] < 4, got


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


# -- the policy each engine gets -------------------------------------------------------------------------

def _documented_policies() -> dict[str, int]:
    """docs/cluster.md's allocator table: engine -> documented threshold (bytes; 0 = glibc's adaptive default)."""
    import re

    text = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    table = text[text.index("**Memory allocator.**"):text.index("**GPUs.**")]
    out: dict[str, int] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        if "fixed at 1 MiB" in cells[1]:
            value = 1 << 20
        elif "adaptive" in cells[1]:
            value = 0
        else:
            raise AssertionError(f"docs/cluster.md: allocator policy not understood: {cells[1]!r}")
        for name in re.findall(r"`([a-z]+)`", cells[0]):
            assert name not in out, f"docs/cluster.md lists engine {name} twice"
            out[name] = value
    return out


def _config(engine: str, threshold=None, path="x.h5"):
    from hpc_graph.train.config import config_from_dict

    return config_from_dict({"data": {"path": path}, "model": {"name": "gcn"},
                             "train": {"malloc_mmap_threshold": threshold}})


def test_every_engine_gets_the_documented_policy():
    from hpc_graph.engines import engine_names
    from hpc_graph.train.preflight import malloc_threshold

    documented = _documented_policies()
    assert set(documented) == set(engine_names())
    for name in engine_names():
        assert malloc_threshold(_config(name), name) == documented[name], name


@pytest.mark.parametrize("given", [0, 2 << 20])
def test_the_config_overrides_the_engines_policy(given):
    from hpc_graph.engines import engine_names
    from hpc_graph.train.preflight import malloc_threshold

    for name in engine_names():
        assert malloc_threshold(_config(name, given), name) == given


# A fresh process builds a Trainer on Cora, then probes glibc as PROBE does: after a 30 MiB block is freed, is a
# 24 MiB block served from fresh pages (a fixed threshold) or from the heap (glibc's adaptive default)? Larger
# blocks than PROBE's: the trainer's heap may hold a free chunk of a few MiB, which glibc would reuse first.
TRAINER_PROBE = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, {root!r})
    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer
    cfg = config_from_dict({{"data": {{"path": {data!r}}}, "engine": {{"name": {engine!r}}},
                            "model": {{"name": "sage", "hidden": 8}}, **{extra!r},
                            "train": {{"epochs": 1, "progress": False, "run_dir": {run_dir!r}}}}})
    trainer = Trainer(cfg)
    {libc}
    libc.free(libc.malloc(30 << 20))
    before = libc.mallinfo2().hblks
    block = libc.malloc(24 << 20)
    mmapped = libc.mallinfo2().hblks - before
    libc.free(block)
    print(json.dumps({{"mmapped": mmapped, "summary": trainer.fit()["malloc_per_rank"]}}))
""")


@pytest.fixture(scope="module")
def cora_file(tmp_path_factory):
    from data_io.converters.npz import convert_npz

    path = tmp_path_factory.mktemp("cora") / "cora.h5"
    convert_npz(ROOT / "tests" / "data" / "cora.npz", path)
    return path


@pytest.mark.parametrize("engine, mmapped, policy", [("single", 1, "mmap threshold 1048576 (fixed)"),
                                                     ("minibatch", 0, "glibc adaptive")])
def test_the_trainer_applies_the_engines_policy_before_loading(cora_file, tmp_path, engine, mmapped, policy):
    import os

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    code = TRAINER_PROBE.format(root=str(ROOT), libc=LIBC, data=str(cora_file), engine=engine,
                                run_dir=str(tmp_path / "run"),
                                extra={"sampler": {"fanouts": [3, 3]}} if engine == "minibatch" else {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"mmapped": mmapped, "summary": [policy]}
