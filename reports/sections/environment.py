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


def env_rows(results: Results) -> list[tuple[str, str]]:
    """(key, value as text) of every environment entry, then the stages' wall times if recorded.

    >>> from reports.sections.environment import env_rows
    >>> from results.schema import Results
    >>> env_rows(Results({"threads": 2, "load": [1.5, 2]}, stage_seconds={"sweeps": 12.0}))
    [('threads', '2'), ('load', '[1.5, 2]'), ('stage wall times', 'sweeps 12 s')]
    """
    rows = [(k, fmt.value_text(v)) for k, v in (results.environment or {}).items()]
    if results.stage_seconds:
        rows.append(("stage wall times", ", ".join(f"{k} {fmt.seconds_text(v)}"
                                                    for k, v in results.stage_seconds.items())))
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
