"""Root pytest configuration.

Tests run with ``--import-mode=importlib`` (pytest.ini) so that test files in
different folders may share a base name (``tests/ops/test_spmm.py`` and
``tests/numba_kernels/test_spmm.py`` mirror different packages). Test folders
keep private helper modules (``_run.py``, ``_graphs.py``, ...) that sibling
tests import by bare name, so every folder under ``tests/`` is appended to
``sys.path`` (appended, so it never shadows a real package).
"""
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent / "tests"
for _d in sorted([_TESTS, *(p for p in _TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__")]):
    if str(_d) not in sys.path:
        sys.path.append(str(_d))
