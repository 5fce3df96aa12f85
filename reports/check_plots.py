"""The curves checks record in ``details["plots"]`` (verify.plots), drawn one figure per check.

A check that measures a curve (a rate against the number of walks with its bound, an action's
error against the tolerance asked for) stores the data; this module draws any such check the
same way, so a new family's curves reach the report with no code here: points with their
intervals as markers with error bars, "line" series solid, "bound" series dashed (a claim the
points must respect). A plot that fails verify.plots.validate_plot is skipped and named in the
figure's caption list instead of failing the whole report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reports import figures as fig
from verify.plots import MAX_PLOTS, MAX_SERIES, validate_plot
from results.check import CheckResult


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
    styles = fig.line_styles(len(lines))
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
    fig._legend_below(ax)


def plot_check_figures(checks: list[CheckResult] | None, out_dir: Path) -> list[CheckFigure]:
    """One PNG per check with plots (``check_<slug>.png``), in the checks' order."""
    out: list[CheckFigure] = []
    taken: set[str] = set()
    for r in checks or []:
        plots, skipped = _plots_of(r)
        if not plots:
            continue
        name = f"check_{fig.slug(r.id)}.png"
        while name in taken:  # two ids with the same slug
            name = name[:-4] + "_.png"
        taken.add(name)
        figure, axes = fig._grid(len(plots), ncols=min(3, len(plots)))
        for ax, p in zip(axes, plots):
            _draw(ax, p, skipped)
        out.append(CheckFigure(r.id, r.title, fig._save(figure, Path(out_dir), name), [p["title"] for p in plots],
                               skipped))
    return out
