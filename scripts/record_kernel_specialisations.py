#!/usr/bin/env python3
"""Record the kernel specialisations a command compiles and write them as the warm-up manifest.

    python scripts/record_kernel_specialisations.py [--out FILE] [--merge] -- COMMAND ...

runs COMMAND (the test suite, a training run) with numba's cache in an empty temporary folder, so that every
specialisation it uses is compiled and recorded, in every Python process it starts (a ``sitecustomize`` on
``PYTHONPATH`` installs :func:`numba_kernels.warm.install_recorder`), and writes the project's kernels among
them to FILE (default: the shipped ``numba_kernels/specialisations.tsv``). ``--merge`` keeps FILE's lines
too. The command's exit status is reported, not fatal: a failing test still compiled what it reached.

The shipped manifest was recorded with::

    python scripts/record_kernel_specialisations.py -- python -m pytest -q -p no:cacheprovider tests
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from numba_kernels.warm import MANIFEST, Specialisation, read_manifest, write_manifest  # noqa: E402

#: the packages whose kernels the warm-up compiles (a command's own scripts are left out)
PROJECT = ("numba_kernels.", "data_io.", "hpc_graph.")

# installs the recorder once numba's dispatcher module is imported, not before: importing numba at start-up
# would decide its threads before the command does
_SITECUSTOMIZE = """\
import importlib.abc, importlib.machinery, os, sys

class _AfterNumba(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "numba.core.dispatcher":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from numba_kernels.warm import install_recorder
            install_recorder(os.environ["HPC_GRAPH_RECORD_SPECIALISATIONS"])

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _AfterNumba())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(MANIFEST), help="manifest to write (default: %(default)s)")
    ap.add_argument("--merge", action="store_true", help="keep the lines already in --out")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to record after --")
    with tempfile.TemporaryDirectory(prefix="hpc-graph-record-") as tmp:
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        log = Path(tmp) / "compiled.tsv"
        log.touch()
        path = os.pathsep.join([str(hook), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        env = {**os.environ, "PYTHONPATH": path, "HPC_GRAPH_RECORD_SPECIALISATIONS": str(log),
               "NUMBA_CACHE_DIR": str(Path(tmp) / "numba-cache")}
        print(f"[record] {' '.join(command)} (numba cache empty: every specialisation compiles)", flush=True)
        status = subprocess.call(command, env=env, cwd=REPO)
        print(f"[record] the command exited with status {status}", flush=True)
        recorded = read_manifest(log)
    best: dict[tuple[str, str], Specialisation] = {}
    for s in recorded:
        if s.kernel.startswith(PROJECT):
            key = (s.kernel, s.args)
            if key not in best or s.seconds > best[key].seconds:
                best[key] = s
    found = len(best)
    if args.merge and Path(args.out).exists():
        for s in read_manifest(args.out):
            best.setdefault((s.kernel, s.args), s)
    header = ("numba kernel specialisations compiled by `hpc-graph warmup` (numba_kernels/warm.py):\n"
              "KERNEL<TAB>COMPILE SECONDS<TAB>ARGUMENT TYPES. Written by scripts/record_kernel_specialisations.py.")
    write_manifest(args.out, list(best.values()), header)
    print(f"[record] {found} specialisations recorded, {len(best)} written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
