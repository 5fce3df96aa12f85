"""Section "Roofline": how close each fast path runs to what this machine can do, from the
``perf/<id>`` check results (kind "perf") in the results JSON.

Each perf check (verify/checks/perf.py) times one mechanism's fast path and compares it with a
baseline measured in the same run, on the same thread count::

    fraction = achieved / roofline
      matmul baseline:   (useful FLOPs / seconds) / measured fp32 matmul GFLOP/s
      fft, scatter:      seconds of the bare primitive(s) of the same size / seconds of the fast path

statistic = fraction; the check fails only when the fraction exceeds its validity ceiling (the
threshold: above it the FLOP count or the baseline is wrong). The issue's targets (e.g. 0.70 of
the matmul rate for linear attention) are benchmark targets, reported in details["target"] and
details["meets_target"], not pass/fail. This module reads those details (``roofline_view``) and
draws one bar per mechanism (``plot_roofline``); it measures nothing.

>>> from reports.sections.roofline import ID, TITLE
>>> ID, TITLE
('roofline', 'Roofline: fraction of this machine')
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.check import CheckResult
from results.schema import Results

ID = "roofline"
TITLE = "Roofline: fraction of this machine"
FIGURES: dict[str, Any] = {"roofline": None}
KIND = "perf"
#: Bar colour per baseline; groups are drawn in this order, any other baseline after them in grey.
BASELINE_COLORS = {"matmul": "tab:blue", "fft": "tab:orange", "scatter": "tab:green"}
OTHER_COLOR = "tab:gray"
BASELINE_TEXT = {"matmul": "fp32 matmul rate (useful GFLOP/s / peak GFLOP/s)",
                 "fft": "bare batched rfft/irfft of the same columns (time ratio)",
                 "scatter": "bare scatter of the same size (time ratio)"}


def perf_checks(results: Results) -> list[CheckResult]:
    """The perf/<mechanism> results (kind "perf"), in the order the run recorded them."""
    return [r for r in results.checks or [] if r.kind == KIND]


@dataclass
class RooflineEntry:
    """One perf check's numbers, read from its details (None where not recorded)."""

    id: str
    mechanism: str
    status: str
    baseline: str
    fraction: float | None
    target: float | None
    target_n: int | None
    meets_target: bool | None
    ceiling: float | None  # the check's threshold: a fraction above it is not believable
    N: int | None
    d: int | None
    m: int | None
    seconds: float | None
    baseline_seconds: float | None
    gflops: float | None
    gflops_executed: float | None
    peak_gflops: float | None
    what: str
    reasons: list[str]
    details: dict

    @classmethod
    def of(cls, r: CheckResult) -> "RooflineEntry":
        d = r.details if isinstance(r.details, dict) else {}
        fraction = fmt.as_float(d.get("fraction"))
        if fraction is None:
            fraction = fmt.as_float(r.statistic)

        def whole(key: str) -> int | None:
            v = fmt.as_float(d.get(key))
            return None if v is None or not np.isfinite(v) else int(v)

        meets = d.get("meets_target")
        reasons = d.get("reasons") or []
        reasons = [str(x) for x in reasons] if isinstance(reasons, (list, tuple)) else [str(reasons)]
        if r.status == "skip" and d.get("reason"):
            reasons = [str(d["reason"])] + reasons
        if r.status == "fail" and not reasons:
            reasons = [str(x) for x in getattr(r, "reasons", []) or []]
        return cls(r.id, r.id.split("/", 1)[-1], r.status, str(d.get("baseline") or "none"), fraction,
                   fmt.as_float(d.get("target")), whole("target_n"), meets if isinstance(meets, bool) else None,
                   fmt.as_float(r.threshold), whole("N"), whole("d"), whole("m"), fmt.as_float(d.get("seconds")),
                   fmt.as_float(d.get("baseline_seconds")), fmt.as_float(d.get("gflops")),
                   fmt.as_float(d.get("gflops_executed")), fmt.as_float(d.get("peak_gflops")),
                   str(d.get("what") or ""), reasons, d)


def roofline_entries(results: Results) -> list[RooflineEntry]:
    """Every perf check, grouped by baseline (BASELINE_COLORS order, others last), each group in
    the order the run recorded it."""
    entries = [RooflineEntry.of(r) for r in perf_checks(results)]
    order = list(BASELINE_COLORS)
    return sorted(entries, key=lambda e: order.index(e.baseline) if e.baseline in order else len(order))


def met_text(meets: bool | None, fraction: float | None = None, target: float | None = None) -> str:
    """"met", "MISSED: 0.51 < 0.70" (the numbers where both are known), or "none" (no target).

    >>> from reports.sections.roofline import met_text
    >>> met_text(True), met_text(False, 0.512, 0.7), met_text(None)
    ('met', 'MISSED: 0.51 < 0.70', 'none')
    """
    if meets is None:
        return "none"
    if meets:
        return "met"
    return "MISSED" + (f": {fraction:.2f} < {target:.2f}" if fraction is not None and target is not None else "")


def _gflops_text(x: float | None) -> str:
    return fmt.DASH if x is None else fmt.number(x, ".3g")


# ------------------------------------------------------------------------------- view


@dataclass
class RooflineRow:
    id: str
    mechanism: str
    baseline: str
    n: str
    d: str
    m: str
    seconds: str
    baseline_seconds: str
    gflops: str
    gflops_executed: str
    peak_gflops: str
    fraction: str
    target: str
    met: str
    met_class: str  # "pass" (met), "fail" (missed), "skip" (no target)
    status: str
    what: str
    reasons: list[str]


@dataclass
class RooflineView:
    rows: list[RooflineRow]
    baselines: list[tuple[str, str]]  # (baseline, what it is), for the baselines present
    settings: str  # "float32, 1 thread(s), cpu clock"
    met: int
    missed: int
    no_target: int


def roofline_view(results: Results) -> RooflineView | None:
    """The section's table, or None when the run has no perf check."""
    entries = roofline_entries(results)
    if not entries:
        return None
    rows = []
    for e in entries:
        rows.append(RooflineRow(
            e.id, e.mechanism, e.baseline, fmt.pow2_text(e.N), fmt.number(e.d), fmt.number(e.m),
            fmt.seconds_text(e.seconds) if e.seconds is not None else fmt.DASH,
            fmt.seconds_text(e.baseline_seconds) if e.baseline_seconds is not None else fmt.DASH,
            _gflops_text(e.gflops), _gflops_text(e.gflops_executed), _gflops_text(e.peak_gflops),
            fmt.number(e.fraction, ".3f") if e.fraction is not None else fmt.DASH,
            (f"≥ {fmt.number(e.target, '.2f')}" + (f" at N = {fmt.pow2_text(e.target_n)}"
                                                   if e.target_n is not None and e.target_n != e.N else ""))
            if e.target is not None else "none",
            met_text(e.meets_target, e.fraction, e.target), {True: "pass", False: "fail", None: "skip"}[e.meets_target],
            e.status, e.what, e.reasons))
    baselines = list(dict.fromkeys(e.baseline for e in entries if e.baseline != "none"))
    settings = []
    for key, label in (("dtype", "{}"), ("threads", "{} thread(s)"), ("clock", "clock: {}")):
        vals = sorted({str(e.details[key]) for e in entries if e.details.get(key) is not None})
        if vals:
            settings.append(label.format(" or ".join(vals)))
    return RooflineView(rows, [(b, BASELINE_TEXT.get(b, "as the check describes it")) for b in baselines],
                        ", ".join(settings) or "not recorded",
                        sum(e.meets_target is True for e in entries), sum(e.meets_target is False for e in entries),
                        sum(e.meets_target is None for e in entries))


# ------------------------------------------------------------------------------- figure


def target_text(e: RooflineEntry) -> str:
    """"target ≥ 0.70 at N = 2¹⁶: missed" (N only where the target is stated at another N than
    the one timed, e.g. a quick run), or "" without a target."""
    if e.target is None:
        return ""
    at = f" at N = {fmt.pow2_text(e.target_n)}" if e.target_n is not None and e.target_n != e.N else ""
    return f"target ≥ {e.target:.2f}{at}: " + {True: "met", False: "missed", None: "not judged"}[e.meets_target]


def plot_roofline(results: Results, out_dir: Path, name: str = "roofline.png") -> str | None:
    """One horizontal bar per perf check: its fraction of the roofline, coloured by baseline
    (matmul, fft, scatter) and grouped by it (top to bottom, a faint rule between groups); a
    diamond at the target where the check has one (hollow: met, filled: missed); right of the axes
    a column with each fraction and "target ≥ x: met / missed"; a black line at 1.0 (the roofline)
    and the validity ceiling (the check's threshold) as a red dotted line, or a red tick per bar
    when the checks' ceilings differ; a failed check's bar is hatched with a red edge; a check
    without a fraction (skipped, raised) gets its status and reason in place of a bar."""
    import matplotlib.pyplot as plt

    entries = roofline_entries(results)
    if not entries:
        return None
    n = len(entries)
    fig, ax = plt.subplots(figsize=(10, max(2.6, 0.42 * n + 1.6)), layout="constrained")
    ys = np.arange(n)
    values = [v for e in entries for v in (e.fraction, e.target, e.ceiling) if v is not None and np.isfinite(v)]
    right = max(values + [1.0]) * 1.12
    ceilings = {e.ceiling for e in entries if e.ceiling is not None and np.isfinite(e.ceiling)}
    for y, e in zip(ys, entries):
        color = BASELINE_COLORS.get(e.baseline, OTHER_COLOR)
        if e.fraction is None or not np.isfinite(e.fraction):
            why = f"{e.status}: " + ("; ".join(e.reasons) or "no fraction recorded")
            ax.text(0.01 * right, y, why if len(why) < 90 else why[:87] + "…", va="center", fontsize=7,
                    color="tab:red" if e.status == "fail" else "0.35")
            continue
        failed = e.status == "fail"
        ax.barh(y, e.fraction, height=0.62, color=color, alpha=0.85, edgecolor="tab:red" if failed else color,
                hatch="///" if failed else None, lw=1.5 if failed else 0.5, zorder=2)
        if e.target is not None:
            ax.plot([e.target], [y], "D", color="k", ms=6, mfc="white" if e.meets_target else "k", zorder=4)
        # the numbers in a column right of the axes, clear of the bars, the markers and the lines
        text = "  ·  ".join(filter(None, [fmt.number(e.fraction, ".2f" if abs(e.fraction) >= 0.1 else ".2g"),
                                          target_text(e),
                                          "check failed" if failed else ""]))
        ax.text(1.01, y, text, va="center", fontsize=7.5, transform=ax.get_yaxis_transform(),
                color="tab:red" if failed or e.meets_target is False else "0.15")
        if len(ceilings) > 1 and e.ceiling is not None:
            ax.plot([e.ceiling], [y], "|", color="tab:red", ms=14, mew=1.6, zorder=3)
    for y in range(1, n):  # a faint rule between two baseline groups
        if entries[y].baseline != entries[y - 1].baseline:
            ax.axhline(y - 0.5, color="0.6", lw=0.8, ls="-", zorder=1)
    ax.axvline(1.0, color="k", lw=1.3, zorder=3)
    if len(ceilings) == 1:
        ax.axvline(next(iter(ceilings)), color="tab:red", ls=":", lw=1.3, zorder=3)
    labels = [f"{e.mechanism}  ·  N = {fmt.pow2_text(e.N)}" if e.N is not None else e.mechanism for e in entries]
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, right)
    ax.set_xlabel("fraction of the roofline (achieved / what the baseline allows; 1.0 = the roofline)", fontsize=9)
    ax.set_title("fast path against this machine's roofline, per mechanism (perf/<id> checks)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    present = list(dict.fromkeys(e.baseline for e in entries))
    handles = [Patch(color=BASELINE_COLORS.get(b, OTHER_COLOR), alpha=0.85, label=f"baseline: {b}") for b in present]
    if any(e.target is not None for e in entries):
        handles += [Line2D([], [], color="k", marker="D", mfc="white", ls="none", label="target (met)"),
                    Line2D([], [], color="k", marker="D", ls="none", label="target (missed)")]
    handles.append(Line2D([], [], color="k", lw=1.3, label="roofline (1.0)"))
    if ceilings:
        handles.append(Line2D([], [], color="tab:red", ls=":" if len(ceilings) == 1 else "none",
                              marker=None if len(ceilings) == 1 else "|", ms=12,
                              label="validity ceiling: a fraction above it fails the check"))
    if any(e.status == "fail" for e in entries):
        handles.append(Patch(facecolor="white", edgecolor="tab:red", hatch="///", label="check failed"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), frameon=False, fontsize=8)
    return style.save(fig, out_dir, name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"roofline": plot_roofline (None when the run has no perf check)}.

    >>> from reports.sections.roofline import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'roofline': None}
    """
    return {"roofline": plot_roofline(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"roofline": roofline_view (None when the run has no perf check)}.

    >>> from reports.sections.roofline import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'roofline': None}
    """
    return {"roofline": roofline_view(inputs.results)}
