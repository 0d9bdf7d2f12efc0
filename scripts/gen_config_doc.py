#!/usr/bin/env python
"""Write docs/configuration.md from the config dataclasses (``hpc_graph.train.config``).

Usage: ``python scripts/gen_config_doc.py [--check] [--output PATH]``.
``--check`` writes nothing and exits 1 when the file differs from what would be generated.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from data_io.errors import atomic_output  # noqa: E402
from hpc_graph.train.config import config_reference_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(REPO / "docs" / "configuration.md"), help="where to write")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if out of date")
    args = parser.parse_args(argv)
    text = config_reference_markdown()
    out = Path(args.output)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else None
        if current != text:
            print(f"{out}: out of date; run python scripts/gen_config_doc.py", file=sys.stderr)
            return 1
        return 0
    with atomic_output(out, force=True) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
