"""Nothing outside ``hpc_graph/engines/`` compares against an engine's name: the rest of the suite asks the
registry and the engines' declarations (kind, data source, replication, options) instead."""
import ast
from pathlib import Path

from hpc_graph.engines import engine_names

ROOT = Path(__file__).resolve().parents[2] / "hpc_graph"
NAMES = set(engine_names())


def _names_in(node: ast.AST) -> set[str]:
    """Engine names among the string constants of ``node`` (a constant, or a tuple/list/set/dict of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Dict):
        return set().union(*(_names_in(k) for k in node.keys if k is not None)) if node.keys else set()
    return set()


def comparisons(path: Path) -> list[str]:
    """``file:line: names`` of every comparison (``==``, ``!=``, ``in``, ``not in``) with an engine name, and of
    every dict keyed by engine names (a table per engine)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        hits: set[str] = set()
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                hits |= _names_in(side)
        elif isinstance(node, ast.Dict):
            hits |= _names_in(node)
        if hits:
            found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {', '.join(sorted(hits))}")
    return found


def test_no_module_outside_engines_compares_engine_names():
    found = [hit for path in sorted(ROOT.rglob("*.py")) if "engines" not in path.relative_to(ROOT).parts[:1]
             for hit in comparisons(path)]
    assert not found, "engine names compared outside hpc_graph/engines/:\n" + "\n".join(found)


def test_the_check_sees_a_comparison(tmp_path):
    """The detector itself: a comparison and a membership test are found, other strings are not."""
    probe = ROOT / "_probe_engine_names.py"
    probe.write_text('a = "sar"\nif a == "sar" or a in ("dp", "x"):\n    pass\nb = {"flow": 1}\nc = "text"\n')
    try:
        hits = comparisons(probe)
    finally:
        probe.unlink()
    assert [h.split(": ")[-1] for h in hits] == ["dp, sar", "flow"] or \
        sorted(h.split(": ")[-1] for h in hits) == ["dp", "flow", "sar"]
