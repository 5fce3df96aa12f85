"""Read asv result files (``.asv/results/<machine>/<commit>.json``) into per-benchmark series.

asv (0.6, result format version 2) stores one file per (machine, commit, environment) with
``commit_hash``, ``date`` (commit time, ms since the epoch), ``result_columns`` and
``results: {benchmark: [column values...]}``. The ``result`` column is a flat list over the
cartesian product of the benchmark's ``params`` (lists of repr strings), or a scalar/one-item
list for unparameterised benchmarks. Failed or skipped points are null/NaN. We read the JSON
directly (no asv import), so the report works wherever the files are.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Files under results/<machine>/ that are not per-commit results.
_NOT_RESULTS = {"machine.json", "benchmarks.json"}


@dataclass
class AsvSeries:
    """One benchmark at one parameter combination: value per commit, in commit-date order."""

    benchmark: str
    params: tuple[str, ...]
    machine: str
    commits: list[str] = field(default_factory=list)
    dates_ms: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(unquote(p) for p in self.params) or "(no params)"


@dataclass
class AsvHistory:
    """Everything found under the results directory (empty series list if none)."""

    results_dir: str
    files: int
    series: list[AsvSeries]
    commits: list[str]  # every commit seen, in date order
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for s in d["series"]:
            s["params"] = list(s["params"])
        return d


def unquote(p: str) -> str:
    """asv stores parameter values as repr strings ("'causal'"); show them without quotes."""
    return p[1:-1] if len(p) >= 2 and p[0] == p[-1] and p[0] in "'\"" else p


def _finite(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _points(entry: list, columns: list[str]):
    """Yield (param tuple, value) of one benchmark entry of a result file."""
    row = dict(zip(columns, entry))
    result, params = row.get("result"), row.get("params") or []
    if not isinstance(result, list):
        result = [result]
    combos = list(itertools.product(*params)) if params else [()]
    for combo, value in zip(combos, result):
        yield tuple(map(str, combo)), _finite(value)


def load_history(results_dir: str | Path) -> AsvHistory:
    """Parse every ``results_dir/*/*.json`` result file; unreadable files are listed in errors."""
    root = Path(results_dir)
    files = sorted(p for p in root.glob("*/*.json") if p.name not in _NOT_RESULTS) if root.is_dir() else []
    table: dict[tuple[str, tuple[str, ...], str], dict[str, tuple[float, float]]] = {}
    commit_dates: dict[str, float] = {}
    errors: list[str] = []
    used = 0
    for path in files:
        try:
            data = json.loads(path.read_text())
            commit, date = str(data["commit_hash"]), float(data.get("date") or 0.0)
            columns, results = data["result_columns"], data["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        used += 1
        machine = path.parent.name
        commit_dates[commit] = date
        for bench, entry in results.items():
            for combo, value in _points(entry, columns):
                if value is not None:
                    table.setdefault((bench, combo, machine), {})[commit] = (date, value)
    series = []
    for (bench, combo, machine), by_commit in sorted(table.items()):
        ordered = sorted(by_commit.items(), key=lambda kv: kv[1][0])
        series.append(AsvSeries(bench, combo, machine, [c for c, _ in ordered],
                                [d for _, (d, _) in ordered], [v for _, (_, v) in ordered]))
    commits = [c for c, _ in sorted(commit_dates.items(), key=lambda kv: kv[1])]
    return AsvHistory(str(root), used, series, commits, errors)


def unit_of(benchmark: str) -> str:
    """asv's unit by benchmark prefix: time_ in seconds, peakmem_/mem_ in bytes, track_ unitless."""
    name = benchmark.rsplit(".", 1)[-1]
    if name.startswith("time_"):
        return "seconds"
    if name.startswith(("peakmem_", "mem_")):
        return "bytes"
    return ""
