"""The import graph of verify/ (docs/design.md, "Layout"): no cycle; the registry imports no family;
the families import nothing from each other; the loader is the only module that imports them.

Static: every module's imports are read with ast (module level and inside functions alike, since a
lazy import inside a function is still a dependency), resolved to verify modules, and the graph is
searched for a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import verify

ROOT = Path(verify.__file__).parent
FAMILIES = {"verify.mechanisms.sequence", "verify.mechanisms.positional", "verify.mechanisms.tree"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """verify modules imported by the file at ``path`` (``from verify.x import y`` counts as
    verify.x.y when that is a module, else verify.x)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in modules:
                    out.add(full)
                elif base in modules:
                    out.add(base)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(g.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(g):
        if u not in state and (found := visit(u)):
            return found
    return None


def test_graph_reads_real_imports():
    g = graph()
    assert FAMILIES <= g["verify.mechanisms"]  # the loader imports the families
    assert "verify.registry" in g["verify.mechanisms.tree"]


def test_no_import_cycle_in_verify():
    assert _cycle(graph()) is None


def test_cycle_finder_finds_a_planted_cycle():
    g = graph()
    g["verify.registry"] = g["verify.registry"] | {"verify.mechanisms"}  # the old lazy loader
    found = _cycle(g)
    assert found is not None and "verify.registry" in found


def test_registry_and_families():
    g = graph()
    assert not g["verify.registry"] & ({"verify.mechanisms"} | FAMILIES)
    for fam in FAMILIES:
        assert not g[fam] & (FAMILIES | {"verify.mechanisms"}), fam
    importers = {m for m, deps in g.items() if deps & FAMILIES}
    assert importers == {"verify.mechanisms"}
