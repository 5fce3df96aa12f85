"""reports/ only renders: it imports nothing that measures (issue 8).

Allowed: the standard library (minus process spawning), NumPy, matplotlib, Jinja2, reports itself,
results/ (the pure-data results schema) and from verify only the pure-data module verify.plots.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
THIRD_PARTY = {"numpy", "matplotlib", "jinja2"}
VERIFY_ALLOWED = {"verify.plots"}  # pure data: dicts, validation
#: Standard-library modules that run or spawn things (a renderer needs none of them).
STDLIB_FORBIDDEN = {"subprocess", "multiprocessing", "concurrent", "ctypes", "importlib", "runpy", "pty"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in a file, relative imports resolved to reports.*."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "reports" + (f".{base}" if base else "")
            # "from verify import plots" imports verify.plots: judge each name as a module too
            out += [(node.lineno, f"{base}.{a.name}" if base in ("verify", "reports") else base) for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            out.append((node.lineno, "__import__"))
    return out


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top in ("reports", "results"):  # results/: pure data (dataclasses), importable without torch
        return True
    if top == "verify":
        return any(module == m or module.startswith(m + ".") for m in VERIFY_ALLOWED)
    if top in THIRD_PARTY:
        return True
    if top == "__future__":
        return True
    return top in sys.stdlib_module_names and top not in STDLIB_FORBIDDEN


FILES = sorted(REPORTS.rglob("*.py"))


def test_there_are_files_to_check():
    names = {str(p.relative_to(REPORTS)) for p in FILES}
    assert {"__main__.py", "style.py", "page.py", "render.py", "asv_history.py", "format.py",
            "sections/__init__.py", "sections/peers.py", "sections/roofline.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measuring_imports(path):
    bad = [f"line {line}: {mod}" for line, mod in _imports(path) if not _allowed(mod)]
    assert not bad, f"{path.relative_to(ROOT)} imports what reports/ must not: {bad}"


@pytest.mark.parametrize("source, ok", [
    ("import torch", False), ("from fast.attention import x", False), ("import reference.features", False),
    ("from measure import timing", False), ("from measure import run", False), ("import subprocess", False),
    ("from verify.mechanisms import get", False), ("import measure.memory", False), ("import scipy", False),
    ("from results.schema import Results", True), ("from results import check", True), ("import json", True),
    ("from verify import plots", True),
    ("from .format import number", True), ("import matplotlib.pyplot as plt", True),
])
def test_the_rule_itself(tmp_path, source, ok):
    f = tmp_path / "m.py"
    f.write_text(source + "\n")
    assert all(_allowed(m) for _, m in _imports(f)) is ok


def test_rendering_loads_no_measuring_module():
    """Importing and running the renderer's modules pulls in no torch, fast/ or reference/."""
    code = ("import sys, reports.__main__, reports.render, reports.page, reports.style, reports.sections.peers, "
            "reports.sections.roofline; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fast', 'reference', 'scipy') "
            "or m in ('measure.timing', 'measure', 'measure.memory', 'verify.mechanisms', 'verify.registry')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
