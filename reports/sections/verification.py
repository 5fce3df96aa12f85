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
    details: list[tuple[str, str]]  # (key, value with its unit): format.details_rows
    anchor: str = ""  # the row's id on the page ("check-equivalence_causal"), where the failures list links


#: Statuses that are neither pass nor fail (an amber cell): a check that could not conclude, e.g.
#: "inconclusive: machine busy" from a complexity check under load.
SETTLED = ("pass", "fail", "skip")


def check_anchor(check_id: str) -> str:
    """The page anchor of a check's row.

    >>> from reports.sections.verification import check_anchor
    >>> check_anchor("equivalence/toeplitz-1d")
    'check-equivalence_toeplitz-1d'
    """
    return "check-" + style.slug(check_id)


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
    elif r.status != "pass" and d.get("reason"):  # skipped, or inconclusive
        out.append(str(d["reason"]))
    elif r.status not in SETTLED:
        given = getattr(r, "reasons", None) or d.get("reasons") or []
        out += [given] if isinstance(given, str) else [str(x) for x in given]
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
        details=fmt.details_rows(d, skip=("plots", "statistic", "reasons", "reason", "compare", "unit", "note")),
        anchor=check_anchor(r.id))


@dataclass
class CheckFamily:
    """The checks whose ids share a prefix ("equivalence", "complexity", a paper), shown as one
    collapsible table: the description their rows share said once (``what``), a tally, and
    ``open`` when a row failed or could not conclude (those stay in sight).

    >>> from reports.sections.verification import CheckFamily
    >>> CheckFamily("complexity", "", [], {"pass": 0}, False).flagged
    []
    """

    name: str
    what: str
    rows: list[CheckRow]
    tally: dict[str, int]
    open: bool

    @property
    def flagged(self) -> list[CheckRow]:
        """The rows that failed or could not conclude: in sight when the family is open."""
        return [r for r in self.rows if r.status not in ("pass", "skip")]

    @property
    def others(self) -> list[CheckRow]:
        """The rows that passed or were skipped: one more click away when the family is open."""
        return [r for r in self.rows if r.status in ("pass", "skip")]


def check_families(rows: list[CheckRow]) -> list[CheckFamily]:
    """``rows`` grouped by id prefix, in first-seen order; a statistic description that more than
    one row of a family shares moves to the family (and leaves those rows), so it appears once.

    >>> from reports.sections.verification import check_families, check_row
    >>> from results.check import CheckResult
    >>> rows = [check_row(CheckResult(f"equivalence/{m}", m, "src", "equivalence", "pass", 1e-7, 1e-5, 0.1,
    ...                                {"statistic": "max relative error"})) for m in ("a", "b")]
    >>> [(f.name, f.what, [r.what for r in f.rows], f.tally["pass"]) for f in check_families(rows)]
    [('equivalence', 'max relative error', ['', ''], 2)]
    """
    groups: dict[str, list[CheckRow]] = {}
    for r in rows:
        groups.setdefault(r.id.split("/", 1)[0], []).append(r)
    out = []
    for name, members in groups.items():
        whats = [r.what for r in members if r.what]
        shared = max(set(whats), key=whats.count) if whats else ""
        if whats.count(shared) < 2:
            shared = ""
        for r in members:
            if shared and r.what == shared:
                r.what = ""
        statuses = [r.status for r in members]
        tally = {st: statuses.count(st) for st in dict.fromkeys(["pass", "fail", "skip"] + statuses)}
        out.append(CheckFamily(name, shared, members, tally, any(st not in ("pass", "skip") for st in statuses)))
    return out


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
    """{"checks": a CheckRow per check (None: the checks were not run), "check_families": them
    grouped (check_families), "tally": {status: count} (pass, fail, skip, then any other status
    such as "inconclusive"), "check_failures" / "check_unsettled": the rows that failed / could not
    conclude (the page lists them first, linked to their rows), "checks_note", "compare_missing":
    some check recorded a threshold but not which way it compares, "check_figures":
    figures["checks"]}.

    >>> from reports.sections.verification import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {"checks": []})["checks"] is None
    True
    """
    results = inputs.results
    checks = [check_row(r) for r in results.checks] if results.checks is not None else None
    tally = None
    if checks is not None:
        statuses = [c.status for c in checks]
        tally = {s: statuses.count(s) for s in dict.fromkeys(["pass", "fail", "skip"] + statuses)}
    compare_missing = checks is not None and any(c.sign is None and c.threshold is not None for c in checks)
    return {"checks": checks, "check_families": check_families(checks) if checks else [], "tally": tally,
            "check_failures": [c for c in checks or [] if c.status == "fail"],
            "check_unsettled": [c for c in checks or [] if c.status not in SETTLED],
            "checks_note": results.checks_note, "compare_missing": compare_missing,
            "check_figures": figures["checks"]}
