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
import re
from dataclasses import dataclass, field
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


# ------------------------------------------------------------------ per-mechanism history


def class_name(mech_id: str) -> str:
    """asv_bench's class name of a mechanism id: non-word characters -> "_", "m_" before a digit.

    (asv splits benchmark names at "-", so asv_bench renames the classes; the rule is restated
    here because importing asv_bench would import the registry and torch.)
    """
    name = re.sub(r"\W", "_", mech_id)
    return f"m_{name}" if name[:1].isdigit() else name


@dataclass
class Line:
    """One line of a history panel: a value per commit of ``AsvHistory.commits`` (None: no result)."""

    label: str
    values: list[float | None]


@dataclass
class MechanismHistory:
    """What the history section shows of one mechanism, aligned with ``AsvHistory.commits``.

    exponent: one line per parameter combination (and machine, if several) of
    complexity.<cls>.track_exponent. time: attention.<cls>.time_attention, implementation 'fast',
    at N = ``time_n``; ``time_note`` says how that N was chosen.
    """

    mechanism: str
    cls: str
    exponent: list[Line] = field(default_factory=list)
    time: list[Line] = field(default_factory=list)
    time_n: int | None = None
    time_note: str = ""

    @property
    def empty(self) -> bool:
        return not self.exponent and not self.time


def _aligned(s: AsvSeries, commits: list[str]) -> list[float | None]:
    by = dict(zip(s.commits, s.values))
    return [by.get(c) for c in commits]


def _int(p: str) -> int | None:
    try:
        return int(float(unquote(p)))
    except ValueError:
        return None


def mechanism_histories(history: AsvHistory, mechanism_ids: list[str]) -> list[MechanismHistory]:
    """One MechanismHistory per mechanism with asv results: ``mechanism_ids`` first (in order),
    then classes found in the results that no given id maps to (named by their class)."""
    commits = history.commits
    machines = sorted({s.machine for s in history.series})
    multi = len(machines) > 1
    by_bench: dict[str, list[AsvSeries]] = {}
    for s in history.series:
        by_bench.setdefault(s.benchmark, []).append(s)
    ids = {class_name(m): m for m in mechanism_ids}
    found = {b.split(".")[1] for b in by_bench
             if b.count(".") == 2 and b.split(".")[0] in ("complexity", "attention")}
    order = [class_name(m) for m in mechanism_ids] + sorted(found - set(ids))
    out = []
    for cls in order:
        h = MechanismHistory(ids.get(cls, cls), cls)
        for s in by_bench.get(f"complexity.{cls}.track_exponent", []):
            label = ", ".join(filter(None, [s.label if s.params else "", s.machine if multi else ""])) or "exponent"
            h.exponent.append(Line(label, _aligned(s, commits)))
        fast = [s for s in by_bench.get(f"attention.{cls}.time_attention", [])
                if s.params and unquote(s.params[0]) == "fast" and _int(s.params[-1]) is not None]
        if fast:
            _pick_time(h, fast, commits, multi)
        if not h.empty:
            out.append(h)
    return out


def _pick_time(h: MechanismHistory, fast: list[AsvSeries], commits: list[str], multi: bool) -> None:
    """The largest N timed on every commit that timed this mechanism's fast path; else the N timed
    on the most commits (largest first), so noted."""
    timed = {c for s in fast for c in s.commits}
    per_n: dict[int, set[str]] = {}
    for s in fast:
        per_n.setdefault(_int(s.params[-1]), set()).update(s.commits)
    everywhere = [n for n, cs in per_n.items() if cs >= timed]
    if everywhere:
        n = max(everywhere)
        h.time_note = f"largest N timed on all {len(timed)} commit(s) with results"
    else:
        n = max(per_n, key=lambda k: (len(per_n[k]), k))
        h.time_note = (f"no N was timed on all {len(timed)} commit(s) with results; N timed on the most "
                       f"({len(per_n[n])})")
    h.time_n = n
    for s in fast:
        if _int(s.params[-1]) == n:
            h.time.append(Line(s.machine if multi else "fast", _aligned(s, commits)))


def other_track_series(history: AsvHistory) -> dict[str, list[AsvSeries]]:
    """{benchmark: its series} for every track_ benchmark except complexity.*.track_exponent
    (those are in the per-mechanism panels): accuracy, machine peak, ... one line per parameter
    combination."""
    out: dict[str, list[AsvSeries]] = {}
    for s in history.series:
        name = s.benchmark.rsplit(".", 1)[-1]
        if name.startswith("track_") and not (s.benchmark.startswith("complexity.") and name == "track_exponent"):
            out.setdefault(s.benchmark, []).append(s)
    return out
