"""The version: one place (``hpc_graph/version.py``), printed by ``hpc-graph --version`` with the git commit of a
clone, read by ``setup.py``, and a CHANGELOG entry for every release."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import hpc_graph
from hpc_graph.version import __version__, git_commit

ROOT = Path(__file__).resolve().parents[1]


def test_cli_prints_the_version_and_the_commit_of_the_clone():
    out = subprocess.run([sys.executable, "-m", "hpc_graph.cli", "--version"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if sha.returncode == 0:  # a clone (CI and development); an installed copy prints the version alone
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        want = f"hpc-graph {__version__} (git {sha.stdout.strip()}{'-dirty' if dirty else ''})"
    else:
        want = f"hpc-graph {__version__}"
    assert out.stdout.strip() == want


def test_outside_a_clone_there_is_no_commit(tmp_path):
    assert git_commit(str(tmp_path / "x.py")) is None


def test_one_version_everywhere():
    assert hpc_graph.__version__ == __version__ and re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "version=VERSION" in setup and '"0.' not in setup.split("setup(")[1].split("description")[0]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {__version__}\n" in changelog
