"""The version of hpc_graph, and the git commit it runs from when run from a clone.

``__version__`` changes with each release (``CHANGELOG.md`` says what each one brought); between releases a
clone's ``hpc-graph --version`` also names the commit (and ``dirty`` when the working tree has changes), so a
result can be traced to the code that produced it.
"""
from __future__ import annotations

import os
import subprocess

__version__ = "0.1.0"


def git_commit(path: str | None = None) -> str | None:
    """``<short sha>`` (``<short sha>-dirty`` with uncommitted changes) of the git checkout holding ``path`` (this
    package by default), or None outside a checkout or without git."""
    where = os.path.dirname(os.path.abspath(path or __file__))
    try:
        sha = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0 or not sha.stdout.strip():
            return None
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def version_string() -> str:
    """``hpc-graph 0.1.0`` with ``(git <commit>)`` when run from a clone."""
    commit = git_commit()
    return f"hpc-graph {__version__}" + (f" (git {commit})" if commit else "")
