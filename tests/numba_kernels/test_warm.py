"""``numba_kernels.warm`` and ``hpc-graph warmup``: the manifest, reading argument types, filling an empty
cache so that later processes only load, and recording what a command compiles."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core import types

from hpc_graph.cli import main
from numba_kernels.warm import (ManifestError, Specialisation, check_manifest, parse_signature, read_manifest,
                                write_manifest)

REPO = Path(__file__).resolve().parents[2]

I64 = "Array(int64, 1, 'C', False, aligned=True)"
I32 = "Array(int32, 1, 'C', False, aligned=True)"
#: cheap kernels (well under a second each to compile)
SMALL = [("numba_kernels.cpu._transpose.csr_transpose", f"({I64}, {I64}, int64, bool)"),
         ("numba_kernels.cpu._transpose.csr_transpose", f"({I64}, {I32}, int64, bool)"),
         ("numba_kernels.cpu._partition.row_chunks", f"({I64}, int64)")]


def _manifest(path: Path, rows) -> Path:
    path.write_text("# a comment line\n\n" + "".join(f"{k}\t0.5\t{a}\n" for k, a in rows))
    return path


def test_shipped_manifest_names_cached_kernels_with_fitting_argument_types():
    specs = read_manifest()
    assert len(specs) > 50
    check_manifest(specs)  # every kernel resolves, is cached, and every line's types fit its arguments
    assert {s.kernel.rpartition(".")[0] for s in specs} >= {
        "numba_kernels.cpu.spmm", "numba_kernels.cpu.sddmm", "numba_kernels.cpu.edge_softmax",
        "numba_kernels.cpu.gat_attention", "numba_kernels.cpu.dropout", "numba_kernels.cpu.sample"}


def test_argument_types_read_back_as_numba_wrote_them():
    rng = random.Random(0)
    dtypes = [types.int8, types.int16, types.int32, types.int64, types.uint8, types.uint64, types.float32,
              types.float64]
    for _ in range(200):
        sig = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            dt = rng.choice(dtypes)
            if kind < 0.6:
                sig.append(types.Array(dt, rng.randint(1, 3), rng.choice("CFA"), readonly=rng.random() < 0.3))
            elif kind < 0.8:
                sig.append(dt)
            elif kind < 0.9:
                sig.append(types.boolean)
            else:
                sig.append(types.UniTuple(dt, rng.randint(1, 3)))
        sig = tuple(sig)
        assert parse_signature(str(sig)) == sig


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "(int64, no_such_type)", "(int64,",
                                  "(Array(int64, 1, 'C').copy(),)", "[int64]"])
def test_argument_types_refuse_anything_but_types(text):
    with pytest.raises(ValueError):
        parse_signature(text)


@pytest.mark.parametrize("line, says", [
    ("numba_kernels.cpu.spmm._spmm_sum\t1.0", "expected KERNEL<TAB>SECONDS<TAB>ARGUMENT_TYPES"),
    ("numba_kernels.cpu.spmm._spmm_sum\tfast\t(int64,)", "compile seconds 'fast' is not a number"),
    ("spmm_sum\t1.0\t(int64,)", "is not MODULE.FUNCTION"),
])
def test_a_malformed_manifest_line_is_named_by_file_and_line(tmp_path, line, says):
    path = tmp_path / "m.tsv"
    path.write_text(f"# header\n{SMALL[0][0]}\t0.3\t{SMALL[0][1]}\n{line}\n")
    with pytest.raises(ManifestError, match=f"{path}:3: .*{says}"):
        read_manifest(path)


@pytest.mark.parametrize("kernel, args, says", [
    ("numba_kernels.cpu.spmm.no_such_kernel", "(int64,)", "no kernel"),
    ("numba_kernels.no_such_module.f", "(int64,)", "no kernel"),
    ("numba_kernels.warm.read_manifest", "(int64,)", "not a numba-compiled function"),
    ("numba_kernels.cpu._prefetch.row_lines", "(int64,)", "not compiled with cache=True"),
    ("numba_kernels.cpu._partition.row_chunks", f"({I64},)", "takes 2..2 arguments, the line gives 1"),
    ("numba_kernels.cpu._partition.row_chunks", f"({I64}, int65)", "unknown type 'int65'"),
])
def test_a_manifest_line_that_fits_no_kernel_is_named(tmp_path, kernel, args, says):
    path = _manifest(tmp_path / "m.tsv", [SMALL[0], (kernel, args)])
    with pytest.raises(ManifestError, match=f"{path}:4: .*{says}"):
        check_manifest(read_manifest(path))


def test_manifest_written_sorted_and_read_back_without_duplicates(tmp_path):
    specs = [Specialisation(k, 0.25 * i, a) for i, (k, a) in enumerate(reversed(SMALL + SMALL[:1]))]
    path = tmp_path / "m.tsv"
    write_manifest(path, specs, "two\nlines")
    back = read_manifest(path)
    assert [(s.kernel, s.args) for s in back] == sorted(set(SMALL))
    assert path.read_text().startswith("# two\n# lines\n") and not list(tmp_path.glob(".m.tsv.tmp-*"))


_LOADS = """
import json, numpy as np
from numba_kernels.cpu._transpose import csr_transpose
from numba_kernels.cpu._partition import row_chunks
csr_transpose(np.array([0, 1, 3], np.int64), np.array([1, 0, 1], np.int32), 2, True)
row_chunks(np.array([0, 1, 3], np.int64), 2)
print(json.dumps([sum(f._cache_hits.values()) for f in (csr_transpose, row_chunks)]
                 + [sum(f._cache_misses.values()) for f in (csr_transpose, row_chunks)]))
"""


def test_warmup_fills_an_empty_cache_and_later_processes_only_load(tmp_path):
    manifest = _manifest(tmp_path / "m.tsv", SMALL)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hpc_graph.cli", "warmup", "--jobs", "2", "--manifest", str(manifest)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[warmup] 3 specialisations from" in first.stdout
    assert "3 compiled, 0 already in the cache, 2 kernels, 2 process(es)" in first.stdout, first.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "0 compiled, 3 already in the cache" in again.stdout, again.stdout
    use = subprocess.run([sys.executable, "-c", _LOADS], capture_output=True, text=True, env=env, timeout=300)
    assert use.returncode == 0, use.stderr[-3000:]
    assert use.stdout.split() == ["[1,", "1,", "0,", "0]"]  # loaded, nothing compiled


def test_warmup_refuses_bad_options_and_manifests_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("numba_kernels.cpu.spmm.gone\t1.0\t(int64,)\n")
    for argv, says in [(["--jobs", "0"], "--jobs: must be >= 1, got 0"),
                       (["--manifest", str(tmp_path / "none.tsv")], f"--manifest {tmp_path / 'none.tsv'}: cannot "
                                                                     f"read it"),
                       (["--manifest", str(bad)], f"{bad}:1: no kernel 'numba_kernels.cpu.spmm.gone'")]:
        assert main(["warmup", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"hpc-graph warmup: error: {says}" in err, err


def test_recording_lists_what_a_command_compiled(tmp_path):
    out = tmp_path / "m.tsv"
    code = ("import numpy as np\nfrom numba import njit\nfrom numba_kernels.cpu._partition import row_chunks\n"
            "row_chunks(np.array([0, 2, 3], np.int64), 2)\n"
            "njit(cache=False)(lambda x: x + 1)(1)\n")  # not the project's: left out
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "record_kernel_specialisations.py"),
                           "--out", str(out), "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    specs = read_manifest(out)
    assert [(s.kernel, s.args) for s in specs] == [SMALL[2]]
    assert specs[0].seconds > 0 and "1 specialisations recorded, 1 written" in proc.stdout
