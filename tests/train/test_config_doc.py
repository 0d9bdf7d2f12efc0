"""docs/configuration.md is generated from the config dataclasses and must stay in sync with them."""
import dataclasses
import subprocess
import sys
from pathlib import Path

from hpc_graph.train.config import SECTIONS, config_reference_markdown

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def test_committed_reference_equals_generated():
    assert DOC.read_text(encoding="utf-8") == config_reference_markdown(), \
        "docs/configuration.md is out of date: run python scripts/gen_config_doc.py"


def test_every_field_documented_with_type_default_and_help():
    text = config_reference_markdown()
    for name, cls in SECTIONS.items():
        assert f"## `{name}`" in text
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{name}.{f.name} has no help text"
            row = next(line for line in text.splitlines() if line.startswith(f"| `{name}.{f.name}` |"))
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            assert len(cells) == 5 and all(cells), row
            default = f.default
            shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else None
            if shown is not None:
                assert cells[2] == f"`{shown}`", row
            if "choices" in f.metadata:
                assert cells[3] == ", ".join(f"`{c}`" for c in f.metadata["choices"]), row
    assert "| 75 |" in text  # the preemption exit status is documented


def test_generator_script_check_mode(tmp_path):
    out = tmp_path / "configuration.md"
    script = REPO / "scripts" / "gen_config_doc.py"
    assert subprocess.run([sys.executable, script, "--check", "--output", out], timeout=60).returncode == 1
    assert subprocess.run([sys.executable, script, "--output", out], timeout=60).returncode == 0
    assert out.read_text(encoding="utf-8") == config_reference_markdown()
    assert subprocess.run([sys.executable, script, "--check", "--output", out], timeout=60).returncode == 0
