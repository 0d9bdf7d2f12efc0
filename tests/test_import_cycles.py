"""No import circles among the modules of hpc_graph, data_io and numba_kernels.

Every module is parsed with :mod:`ast` (nothing is imported). An edge ``a -> b`` is an import
in ``a`` of ``b``, one of these packages' modules: ``import x.y`` and ``from x.y import z``
(``z`` resolved to the submodule ``x.y.z`` when it is one, else the edge goes to ``x.y``),
relative imports resolved against ``a``'s package.

* Module-level imports (anywhere outside a function body: under ``if``/``try``, in class bodies)
  run when ``a`` is imported; they must form no circle at all.
* Imports inside functions are deferred until the function runs, which is how a circle is made to
  import without failing; it is still a circle (two modules that each need the other). Counted with
  the module-level ones, they may close a circle only through an edge of :data:`DEFERRED_ALLOWED`.

A failure prints each circle, one import per step with its line number.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hpc_graph", "data_io", "numba_kernels")

#: Deferred imports allowed to close a circle (importer, imported). Each is deliberate; take one out
#: when the circle it closes is opened.
DEFERRED_ALLOWED = {
    # The planner runs each rank's training step on shapes, through the trainer's own code
    # (plan.rank -> train.trainer), and the trainer's memory refusal asks the planner for its estimate
    # (train.preflight -> plan.predict): planning and training call each other by design.
    ("hpc_graph.plan.rank", "hpc_graph.train.trainer"),
    ("hpc_graph.train.preflight", "hpc_graph.plan.predict"),
    # train.preflight checks a checkpoint before training (checkpoint at module level) and builds the
    # fault injector; checkpoint saving and fault injection use preflight's collective agreement and log
    # flush when they run.
    ("hpc_graph.train.checkpoint", "hpc_graph.train.preflight"),
    ("hpc_graph.train.faults", "hpc_graph.train.preflight"),
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(tree: ast.Module):
    """``(node, deferred)`` for every import statement; ``deferred`` when inside a function body."""
    stack = [(node, False) for node in tree.body]
    while stack:
        node, deferred = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, deferred
        inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _known(name: str, mods: dict) -> str | None:
    """``name`` or its longest prefix that is one of our modules (None when it is none of ours)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in mods:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph() -> dict[str, dict[str, tuple[int, bool]]]:
    """``{importer: {imported: (line, deferred)}}``; a module-level import wins over a deferred one."""
    mods = _modules()
    graph: dict[str, dict[str, tuple[int, bool]]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges: dict[str, tuple[int, bool]] = {}
        for node, deferred in _imports(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, mods) for alias in node.names]
            else:
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in mods else _known(source, mods))
            for target in targets:
                if target is None or target == name:
                    continue
                old = edges.get(target)
                if old is None or (old[1] and not deferred):
                    edges[target] = (node.lineno, deferred)
        graph[name] = edges
    return graph


def _components(adj: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(adj[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _shortest_cycle(adj: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest circle through the first module of ``comp`` (breadth-first, inside ``comp``)."""
    members, start = set(comp), comp[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(adj[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1] + [start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{comp} is not a circle")


def find_cycles(deferred: bool) -> list[str]:
    """One line per circle: ``a (line 12) -> b (line 40, deferred) -> a``, and the circle's modules."""
    graph = import_graph()
    adj = {a: {b for b, (_, d) in edges.items()
               if not d or (deferred and (a, b) not in DEFERRED_ALLOWED)}
           for a, edges in graph.items()}
    report = []
    for comp in _components(adj):
        cycle = _shortest_cycle(adj, comp)
        steps = [cycle[0]]
        for a, b in zip(cycle, cycle[1:]):
            line, d = graph[a][b]
            steps[-1] += f" (line {line}{', deferred' if d else ''})"
            steps.append(b)
        more = f"; all of: {', '.join(comp)}" if len(comp) > len(cycle) - 1 else ""
        report.append(" -> ".join(steps) + more)
    return report


def test_no_circles_among_module_level_imports():
    cycles = find_cycles(deferred=False)
    print("\n".join(cycles))
    assert not cycles, "import circles (module-level imports):\n" + "\n".join(cycles)


def test_no_circles_through_deferred_imports():
    cycles = find_cycles(deferred=True)
    print("\n".join(cycles))
    assert not cycles, "import circles (deferred imports count; see DEFERRED_ALLOWED):\n" + "\n".join(cycles)


def test_allowed_deferrals_are_deferred_imports_that_exist():
    graph = import_graph()
    for a, b in sorted(DEFERRED_ALLOWED):
        assert b in graph.get(a, {}) and graph[a][b][1], f"{a} -> {b} is no deferred import: update DEFERRED_ALLOWED"


if __name__ == "__main__":
    for kind in (False, True):
        print("deferred imports counted" if kind else "module-level imports", find_cycles(kind) or "no circles")
