"""Multi-rank tests: make ``from _run import run_mpi, SCRIPTS`` work from any test here."""
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
