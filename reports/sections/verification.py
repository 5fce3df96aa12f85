"""Section "Verification": every check with its test (statistic, sign, threshold in the check's
unit), its reasons when it failed or was skipped, and the curves checks record in
``details["plots"]`` (verify.plots), one figure per check.

A check that measures a curve (a rate against the number of walks with its bound, an action's
error against the tolerance asked for) stores the data; this module draws any such check the
same way, so a new family's curves reach the report with no code here: points with their
intervals as markers with error bars, "line" series solid, "bound" series dashed (a claim the
points must respect). A plot that fails verify.plots.validate_plot is skipped and named in the
figure's caption list instead of failing the whole report.

>>> from reports.sections.verification import ID, TITLE
>>> ID, TITLE
('verification', 'Verification')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.check import CheckResult
from verify.plots import MAX_PLOTS, MAX_SERIES, validate_plot

ID = "verification"
TITLE = "Verification"
FIGURES: dict[str, Any] = {"checks": []}


# ------------------------------------------------------------------------------- the table


@dataclass
class CheckRow:
    id: str
    title: str
    source: str
    kind: str
    status: str
    statistic: str
    sign: str | None  # None: the check did not record which way it compares
    threshold: str | None
    unit: str  # shown beside the test where the numbers do not carry it (exponent, relative, ...)
    what: str  # what the statistic is (details["statistic"], where the check says)
    reasons: list[str]
    note: str
    seconds: str
    details: str


def check_reasons(r: CheckResult) -> list[str]:
    """Why a check failed (CheckResult.reasons where this checkout has it, else details["reasons"]
    and details["error"]), or why it was skipped (details["reason"]); duplicates dropped."""
    d = r.details if isinstance(r.details, dict) else {}
    out: list[str] = []
    if r.status == "fail":
        given = getattr(r, "reasons", None)
        if isinstance(given, (list, tuple)) and given:
            out += [str(x) for x in given]
        else:
            rs = d.get("reasons")
            out += [rs] if isinstance(rs, str) and rs else [str(x) for x in rs or [] if x]
            if d.get("error"):
                out.append(str(d["error"]))
        if not out:
            out.append("no reason recorded (see details)")
    elif r.status == "skip" and d.get("reason"):
        out.append(str(d["reason"]))
    return list(dict.fromkeys(out))


def check_row(r: CheckResult) -> CheckRow:
    """One verification row; ``compare`` and ``unit`` are read where the CheckResult (or, failing
    that, its details) records them."""
    d = r.details if isinstance(r.details, dict) else {}
    compare = getattr(r, "compare", None) or d.get("compare")
    unit = getattr(r, "unit", None) or d.get("unit") or ""
    return CheckRow(
        id=r.id, title=r.title, source=r.source, kind=r.kind, status=r.status,
        statistic=fmt.with_unit(r.statistic, unit), sign=fmt.compare_sign(compare),
        threshold=None if r.threshold is None else fmt.with_unit(r.threshold, unit),
        unit="" if str(unit).lower() in fmt.BYTE_UNITS | fmt.SECOND_UNITS else str(unit),
        what=d["statistic"] if isinstance(d.get("statistic"), str) else "",
        reasons=check_reasons(r) if r.status != "pass" else [],
        note="" if r.status != "pass" else str(d.get("note", "")),
        seconds=fmt.seconds_text(r.seconds) if r.seconds else fmt.DASH,
        details=fmt.json_text(d) if d else "")


# ------------------------------------------------------------------------------- the curves checks record


@dataclass
class CheckFigure:
    """One drawn check: its id and title, the PNG's file name, its panels' titles, and what could
    not be drawn (malformed plots, panels or series beyond the caps)."""

    id: str
    title: str
    figure: str
    panels: list[str]
    skipped: list[str] = field(default_factory=list)


def _plots_of(r: CheckResult) -> tuple[list[dict], list[str]]:
    d = r.details if isinstance(r.details, dict) else {}
    raw = d.get("plots")
    if not raw:
        return [], []
    if not isinstance(raw, list):
        return [], [f"details['plots'] is a {type(raw).__name__}, not a list"]
    good, skipped = [], []
    for i, p in enumerate(raw):
        try:
            good.append(validate_plot(p))
        except ValueError as e:
            skipped.append(f"plot {i}: {e}")
    if len(good) > MAX_PLOTS:
        skipped.append(f"{len(good) - MAX_PLOTS} plots beyond the first {MAX_PLOTS}")
        good = good[:MAX_PLOTS]
    return good, skipped


def _positive(values, log: bool) -> np.ndarray:
    a = np.array([np.nan if v is None else v for v in values], dtype=float)
    if log:
        a[~(a > 0)] = np.nan  # a log axis cannot show zero or negative values: drawn as gaps
    return a


def _draw(ax, p: dict, skipped: list[str]) -> None:
    lines = p["series"]
    if len(lines) > MAX_SERIES:
        skipped.append(f"{p['title']}: {len(lines) - MAX_SERIES} series beyond the first {MAX_SERIES}")
        lines = lines[:MAX_SERIES]
    styles = style.line_styles(len(lines))
    for (color, marker), s in zip(styles, lines):
        x, y = _positive(s["x"], p["xlog"]), _positive(s["y"], p["ylog"])
        if s["kind"] == "points":
            lo, hi = s.get("lower"), s.get("upper")
            if lo is not None or hi is not None:
                lo_a = y - _positive(lo, p["ylog"]) if lo is not None else np.zeros_like(y)
                hi_a = _positive(hi, p["ylog"]) - y if hi is not None else np.zeros_like(y)
                err = np.nan_to_num(np.vstack([np.clip(lo_a, 0, None), np.clip(hi_a, 0, None)]))
                ax.errorbar(x, y, yerr=err, fmt=marker, color=color, ms=4, capsize=2, lw=0.8, label=s["label"])
            else:
                ax.plot(x, y, marker, color=color, ms=4, label=s["label"])
        else:
            ax.plot(x, y, "--" if s["kind"] == "bound" else "-", color=color, lw=1.2, label=s["label"])
    if p["xlog"]:
        ax.set_xscale("log")
    if p["ylog"]:
        ax.set_yscale("log")
    ax.set_title(p["title"], fontsize=9)
    ax.set_xlabel(p["xlabel"], fontsize=8)
    ax.set_ylabel(p["ylabel"], fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", alpha=0.25)
    style.legend_below(ax)


def plot_check_figures(checks: list[CheckResult] | None, out_dir: Path) -> list[CheckFigure]:
    """One PNG per check with plots (``check_<slug>.png``), in the checks' order."""
    out: list[CheckFigure] = []
    taken: set[str] = set()
    for r in checks or []:
        plots, skipped = _plots_of(r)
        if not plots:
            continue
        name = f"check_{style.slug(r.id)}.png"
        while name in taken:  # two ids with the same slug
            name = name[:-4] + "_.png"
        taken.add(name)
        figure, axes = style.grid(len(plots), ncols=min(3, len(plots)))
        for ax, p in zip(axes, plots):
            _draw(ax, p, skipped)
        out.append(CheckFigure(r.id, r.title, style.save(figure, Path(out_dir), name), [p["title"] for p in plots],
                               skipped))
    return out


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"checks": plot_check_figures of the run's checks (a list of CheckFigure)}.

    >>> from reports.sections.verification import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'checks': []}
    """
    return {"checks": plot_check_figures(inputs.results.checks, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"checks": a CheckRow per check (None: the checks were not run), "tally": {status: count},
    "checks_note", "compare_missing": some check recorded a threshold but not which way it
    compares, "check_figures": figures["checks"]}.

    >>> from reports.sections.verification import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {"checks": []})["checks"] is None
    True
    """
    results = inputs.results
    checks = [check_row(r) for r in results.checks] if results.checks is not None else None
    tally = None if checks is None else {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skip")}
    compare_missing = checks is not None and any(c.sign is None and c.threshold is not None for c in checks)
    return {"checks": checks, "tally": tally, "checks_note": results.checks_note, "compare_missing": compare_missing,
            "check_figures": figures["checks"]}
