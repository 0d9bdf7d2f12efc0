"""Importing ``hpc_graph``: process-wide settings it makes before any tensor exists."""
import os
import subprocess
import sys

import pytest

_PROBE = ("import os, hpc_graph, torch\n"
          "from hpc_graph.ops._kernel_args import torch_huge_pages\n"
          "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), torch_huge_pages())\n")


@pytest.mark.parametrize("preset, expected", [(None, "1 True"), ("0", "0 False"), ("1", "1 True")])
def test_import_turns_on_huge_pages_unless_user_chose(preset, expected):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected
