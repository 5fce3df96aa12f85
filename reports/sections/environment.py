"""Section "Environment": where and how the run was measured (the results' environment record and
the wall time of each measuring stage).

>>> from reports.sections.environment import ID, TITLE
>>> ID, TITLE
('environment', 'Environment')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from reports import format as fmt
from reports.sections import PageInputs
from results.schema import Results

ID = "environment"
TITLE = "Environment"
FIGURES: dict[str, Any] = {}


def load_rows(load) -> list[tuple[str, str]]:
    """The environment's "load" record as readable rows: one per stage ("load: sweeps", "load 3.4 /
    2 / 1 (1, 5, 15 min) at start, 3.1 / 2.1 / 1 at end; 2 threads; other processes 1.4 cores;
    CPU 12 min 3 s"), then the run's worst other load; a record of another shape as value_text.

    >>> from reports.sections.environment import load_rows
    >>> load_rows({"cpus": 2, "stages": {"sweeps": {"threads": 2, "start": [3.4, 2.0, 1.0], "end": None}}})
    [('load: sweeps', 'load 3.4 / 2 / 1 (1, 5, 15 min) at start; 2 threads')]
    """
    if not isinstance(load, dict):
        return [("load", fmt.load_text(load))]
    stages = load.get("stages") if isinstance(load.get("stages"), dict) else {
        k: v for k, v in load.items() if isinstance(v, dict)}  # the older flat form {stage: {start, end}}
    rows = []
    for name, st in stages.items():
        parts = []
        # "load 3.4 / 2 / 1 (1, 5, 15 min) at start, 3.1 / 2.1 / 1 at end": the periods named once
        ends = [f"{fmt.load_text(st[k])} at {k}" for k in ("start", "end") if st.get(k)]
        if ends:
            parts.append("load " + ", ".join([ends[0]] + [e.replace(" (1, 5, 15 min)", "") for e in ends[1:]]))
        if st.get("threads") is not None:
            parts.append(f"{st['threads']} thread" + ("s" if st["threads"] != 1 else ""))
        if fmt.finite(st.get("other_load")):
            parts.append(f"other processes {st['other_load']:.2g} cores")
        if fmt.finite(st.get("cpu_s")):
            parts.append(f"CPU {fmt.duration_text(st['cpu_s'])}")
        rows.append((f"load: {name}", "; ".join(parts) or fmt.DASH))
    if fmt.finite(load.get("max_other_load")):
        rows.append(("load: worst", f"other processes used up to {load['max_other_load']:.2g} cores"
                     + (f" of {load['cpus']} CPUs" if load.get("cpus") else "")))
    return rows


def env_rows(results: Results) -> list[tuple[str, str]]:
    """(key, value as text) of every environment entry (load per stage, byte counts in MiB/GiB,
    nested dicts as "key: value" lists), then the stages' wall times ("22 min 40 s") if recorded.

    >>> from reports.sections.environment import env_rows
    >>> from results.schema import Results
    >>> rows = env_rows(Results({"threads": 2, "load": [1.5, 2, 2.5]}, stage_seconds={"sweeps": 1362.0, "render": 37.2}))
    >>> rows[1:]
    [('load', '1.5 / 2 / 2.5 (1, 5, 15 min)'), ('stage wall times', 'sweeps 22 min 42 s, render 37 s, total 23 min 19 s')]
    """
    rows: list[tuple[str, str]] = []
    for k, v in (results.environment or {}).items():
        if k == "load":
            rows += load_rows(v)
        elif k == "load_warning":
            rows.append((k, fmt.value_text(v) if v else "none: the machine was quiet enough"))
        else:
            rows.append((k, fmt.brief_text(v, k, max_items=12) if isinstance(v, (dict, list, tuple)) or
                         k.endswith("bytes") else fmt.value_text(v)))
    if results.stage_seconds:
        times = [f"{k} {fmt.duration_text(v)}" for k, v in results.stage_seconds.items()]
        total = sum(v for v in results.stage_seconds.values() if fmt.finite(v))
        rows.append(("stage wall times", ", ".join(times) + f", total {fmt.duration_text(total)}"))
    return rows


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """No figure of its own.

    >>> from reports.sections.environment import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {}
    """
    return {}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"env_rows": env_rows}.

    >>> from reports.sections.environment import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({"mode": "quick"})), {})
    {'env_rows': [('mode', 'quick')]}
    """
    return {"env_rows": env_rows(inputs.results)}
