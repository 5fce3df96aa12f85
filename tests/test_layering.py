"""The layering of the packages (issue 22), read statically: every import of every module (module
level and inside functions alike: a lazy import is still a dependency), resolved with ast.

Layers, lowest first; a module imports only modules of its own layer or below, and the graph of
all modules is acyclic:

    0  results.*                               the results schema: pure data, imports no project module
    1  measure, measure.timing, measure.roofline   instruments: time and count (fast/ and results/ only)
    2  verify core: registry, problems, stats, dense, favor, plots, mechanisms.*
    3  measure workers: memory, scale_worker, datasets, training, experiments
    4  verify.checks.*, verify.runner, verify.__main__ (and the verify package itself)
    5  measure pipeline: environment, stages, pipeline, cli, gpu, __main__

So verify and measure interleave on purpose (the checks time with measure's instruments and drive
its scale workers; the pipeline runs the checks), and these rules are the explicit exceptions to
"one direction": verify -> measure only into layers 1 and 3, measure -> verify only from layers 3
and 5. fast/ and reference/ import neither each other nor any of results/, verify/, measure/.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fast", "reference", "results", "verify", "measure")

INSTRUMENTS = {"measure", "measure.timing", "measure.roofline"}
VERIFY_CORE = {"verify.registry", "verify.problems", "verify.stats", "verify.dense", "verify.favor", "verify.plots"}
WORKERS = {"measure.memory", "measure.scale_worker", "measure.datasets", "measure.training", "measure.experiments"}
PIPELINE = {"measure.environment", "measure.stages", "measure.pipeline", "measure.cli", "measure.gpu",
            "measure.__main__"}


def layer(module: str) -> int | None:
    """The layer of a module of results/, verify/ or measure/ (None for fast/ and reference/)."""
    top = module.split(".")[0]
    if top == "results":
        return 0
    if module in INSTRUMENTS:
        return 1
    if module in VERIFY_CORE or module == "verify.mechanisms" or module.startswith("verify.mechanisms."):
        return 2
    if module in WORKERS:
        return 3
    if module in ("verify", "verify.runner", "verify.__main__") or module.startswith("verify.checks"):
        return 4
    if module in PIPELINE:
        return 5
    if top in ("fast", "reference"):
        return None
    raise AssertionError(f"{module} has no layer: place it in tests/test_layering.py and in its package's docstring")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules imported by the file (``from a.b import c`` is a.b.c when that is a module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                # import a.b.c loads a, a.b and a.b.c: the deepest project module is the dependency
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


def graph() -> dict[str, set[str]]:
    paths = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
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
    assert "results.check" in g["results.schema"]
    assert "measure.timing" in g["verify.checks.complexity"]
    assert "verify.runner" in g["measure.stages"]


def test_every_module_has_a_layer():
    for module in graph():
        layer(module)


def test_no_module_imports_a_higher_layer():
    bad = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})" for m, deps in graph().items()
           if layer(m) is not None for d in sorted(deps) if layer(d) is not None and layer(d) > layer(m)]
    assert not bad, bad


def test_fast_and_reference_import_no_harness_and_not_each_other():
    for m, deps in graph().items():
        top = m.split(".")[0]
        if top in ("fast", "reference"):
            assert {d.split(".")[0] for d in deps} <= {top}, (m, sorted(deps))


def test_results_imports_no_project_module():
    for m, deps in graph().items():
        if m.split(".")[0] == "results":
            assert {d.split(".")[0] for d in deps} <= {"results"}, (m, sorted(deps))


def test_measure_package_file_imports_nothing():
    # importing an instrument (measure.timing) runs measure/__init__.py first: it must not load the pipeline
    assert graph()["measure"] == set()


def test_no_import_cycle():
    assert _cycle(graph()) is None


def test_the_rules_catch_a_planted_violation():
    g = graph()
    g["measure.timing"] = g["measure.timing"] | {"verify.checks.complexity"}
    assert _cycle(g) is not None
    assert layer("measure.timing") < layer("verify.checks.complexity")
