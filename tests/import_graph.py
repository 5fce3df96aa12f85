"""The project's import graph, read statically (ast), shared by the layout tests
(tests/test_layering.py, tests/verify/test_imports.py): every import of every module counts,
module level and inside functions alike, since a lazy import is still a dependency."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """The dotted name of the module in the file at ``path`` (a package's __init__ is the package)."""
    parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules among ``modules`` that the file at ``path`` imports: ``from a.b import c`` is a.b.c
    when that is a module, else a.b; ``import a.b.c`` is the deepest of a.b.c, a.b, a that is known;
    relative imports are resolved against the file's package."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                known = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules]
                out.update(known[:1])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    out.add(f"{base}.{a.name}")
                elif base in modules:
                    out.add(base)
    out.discard(name)
    return out


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the modules of ``packages`` it imports} for every module of ``packages``."""
    paths = sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): project_imports(p, modules) for p in paths}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``g`` as [a, b, ..., a], or None when the graph is acyclic (depth-first)."""
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
