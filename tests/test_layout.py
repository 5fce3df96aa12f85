"""The layout rules of docs/design.md that hold across packages, checked statically or by running:

- no library module imports another module's private (underscore) name: what two modules share is
  public in one of them (or in a module of shared plumbing);
- every docstring example (``>>>``) of the library runs, as a doctest, in ``make test``;
- every public function and class of fast/ and reference/ carries one runnable example.
"""
from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The library packages (tests/ are not library code: a test may reach into a private helper).
PACKAGES = ("fast", "reference", "results", "verify", "measure", "reports", "asv_bench", "benchmarks")
#: Packages whose public functions and classes must each carry a runnable example.
EXAMPLE_PACKAGES = ("fast", "reference")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """``from x import _y`` and ``x._y`` (x a library package or a module imported by name) in the
    file at ``path``, as readable strings."""
    tree = ast.parse(path.read_text())
    local_modules: set[str] = set(PACKAGES)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    local_modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"from {node.module} import {alias.name}")
                elif _is_module(f"{node.module}.{alias.name}"):
                    local_modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in local_modules:
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _is_module(dotted: str) -> bool:
    """True when ``dotted`` names a module of the library (not a function or class in one)."""
    parent, _, leaf = dotted.rpartition(".")
    return (ROOT / Path(*parent.split(".")) / f"{leaf}.py").is_file() \
        or (ROOT / Path(*dotted.split(".")) / "__init__.py").is_file()


def test_private_import_scan_finds_a_planted_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from fast.features import _helper\nimport fast\nfast._hidden\n")
    assert private_imports(planted) == ["from fast.features import _helper", "fast._hidden"]


@pytest.mark.parametrize("source, ok", [
    ("from reports.style import _fitted", False), ("from reports import style\nstyle._fitted(1)", False),
    ("import reports.style as st\nst._fitted(1)", False), ("from reports.style import grid", True),
    ("from reports import style\nstyle.grid(1)", True), ("class A:\n    def f(self):\n        return self._x", True),
    ("from __future__ import annotations", True), ("import json\njson.__name__", True),
])
def test_the_private_rule_itself(tmp_path, source, ok):
    f = tmp_path / "m.py"
    f.write_text(source + "\n")
    assert (not private_imports(f)) is ok


def test_no_module_imports_another_modules_private_name():
    offenders = {str(p.relative_to(ROOT)): found for p in _sources() if (found := private_imports(p))}
    assert not offenders, f"private names imported across modules: {offenders}"


def _library_modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        if not (ROOT / pkg / "__init__.py").is_file():
            continue
        names.append(pkg)
        module = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{pkg}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


@pytest.mark.parametrize("name", _library_modules())
def test_docstring_examples_run(name):
    """Every ``>>>`` example of the module runs and prints what its docstring says."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs={}):
        if test.examples and _defined_in(test, module):
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples of {name} failed (output above)"


def _defined_in(test: doctest.DocTest, module) -> bool:
    # a name re-exported by a package is tested in the module that defines it, once
    return test.filename is None or Path(test.filename).resolve() == Path(module.__file__).resolve()


def public_api_without_example() -> list[str]:
    """Public functions and classes defined in the EXAMPLE_PACKAGES whose docstring has no ``>>>``."""
    missing = []
    for name in _library_modules():
        if name.split(".")[0] not in EXAMPLE_PACKAGES or any(_private(part) for part in name.split(".")):
            continue  # a private module's functions are plumbing, documented where they are used
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != name:
                continue
            if ">>>" not in (inspect.getdoc(obj) or ""):
                missing.append(f"{name}.{attr}")
    return missing


def test_every_public_function_and_class_has_an_example():
    missing = public_api_without_example()
    assert not missing, f"{len(missing)} public functions/classes without a runnable example: {missing}"
