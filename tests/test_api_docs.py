"""The API reference builds from the docstrings of the public modules with no warning (scripts/api_docs.sh), and
has a page for each of them."""
import subprocess
from pathlib import Path

from hpc_graph._api_modules import MODULES

REPO = Path(__file__).resolve().parents[1]


def test_api_reference_builds_without_warnings(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "api_docs.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for module in MODULES:
        assert (tmp_path / (module.replace(".", "/") + ".html")).exists(), module
