"""Every relative link of README.md, CHANGELOG.md and docs/*.md points to a file of the repository, and every
``#anchor`` to a heading of its target (GitHub's heading slugs)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def _documents() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md")),
            REPO / "benchmarks" / "README.md"]


def test_slug_follows_github():
    assert _slug("12. `hpc-graph plan` against measured runs") == "12-hpc-graph-plan-against-measured-runs"
    assert _slug("History") == "history"


def test_relative_links_and_anchors_resolve():
    broken = []
    for doc in _documents():
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no file {dest})")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "\n".join(broken)
