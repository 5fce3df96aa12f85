"""Section "Speed-up and crossover": the N from which each fast path beats its dense twin (with its
95% interval), and the measured speed-up t_dense / t_fast vs N.

>>> from reports.sections.crossover import ID, TITLE
>>> ID, TITLE
('crossover', 'Speed-up and crossover')
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.schema import Comparison, Results

ID = "crossover"
TITLE = "Speed-up and crossover"
FIGURES: dict[str, Any] = {"crossover": None}


def interval_ends(c: Comparison) -> tuple[float | None, bool, float | None, bool]:
    """(low, low_open, high, high_open) of the crossover's 95% interval, an end being open where the
    timed grid cut it off.

    The results JSON does not say whether an end was clipped; it is inferred from the grid stored
    beside it, ``c.sizes`` (the N both paths were timed at, the only N the crossover can be
    interpolated between). measure.timing.crossover_interval gives a bootstrap replicate where fast
    already wins at the first common N that N, and one where the curves never meet +inf (an upper
    end of None): a low end that is None or at the grid's first N, and a high end that is None or
    equal to its last N, only say that the crossover lies below (above) that N, so the end becomes
    that N and is open. A high end beyond the grid, from fits extrapolated by every replicate that
    enters the quantile, is a bound and stays closed.

    >>> from reports.sections.crossover import interval_ends
    >>> from results.schema import Comparison
    >>> interval_ends(Comparison("m", "v", [128, 256, 512], crossover=300.0, crossover_low=128.0, crossover_high=400.0))
    (128.0, True, 400.0, False)
    >>> interval_ends(Comparison("m", "v", [128, 256, 512], crossover=300.0, crossover_low=200.0))
    (200.0, False, 512.0, True)
    >>> interval_ends(Comparison("m", "v", [128, 256], crossover=300.0, crossover_low=200.0, crossover_high=900.0))
    (200.0, False, 900.0, False)
    """
    first, last = (float(min(c.sizes)), float(max(c.sizes))) if c.sizes else (None, None)
    low, high = c.crossover_low, c.crossover_high
    low_open = first is not None and (low is None or low <= first)
    high_open = last is not None and (high is None or math.isclose(high, last))
    if low_open:
        low = first
    if high_open:
        # an estimate extrapolated past the grid says more than "> last N"
        high = max(v for v in (last, c.crossover) if v is not None and math.isfinite(v))
    return low, low_open, high, high_open


def crossover_text(c: Comparison | None) -> str:
    """"1,024 [800, 1,300]" (95% interval) or "never"; an end that the timed grid cut off is written
    open, "< 128" or "> 4,096" (``interval_ends``); "?" for an end that cannot be bounded with no grid.

    >>> from reports.sections.crossover import crossover_text
    >>> from results.schema import Comparison
    >>> crossover_text(Comparison("m", "v", [128, 1024, 2048], crossover=1085.0, crossover_low=128.0,
    ...                           crossover_high=1132.0))
    '1,085 [< 128, 1,132]'
    >>> crossover_text(Comparison("m", "v", [128, 256], crossover=128.0, crossover_high=None))
    '< 128 [< 128, > 256]'
    """
    if c is None:
        return fmt.DASH
    if not fmt.finite(c.crossover):
        return "never"
    low, low_open, high, high_open = interval_ends(c)
    lo = "?" if low is None else ("< " if low_open else "") + fmt.n_text(low)
    hi = "?" if high is None else ("> " if high_open else "") + fmt.n_text(high)
    first = min(c.sizes) if c.sizes else None
    # crossover() returns the first common N when fast already wins there: an upper bound only
    point = f"< {fmt.n_text(first)}" if first is not None and c.crossover <= first else fmt.n_text(c.crossover)
    return f"{point} [{lo}, {hi}]"


def crossover_note(c: Comparison | None) -> str:
    if c is None or not fmt.finite(c.crossover):
        return ""
    if c.extrapolated:
        return "extrapolated from the fits"
    if c.measured_crossover is not None:
        return f"timed: fast wins from N = {fmt.pow2_text(c.measured_crossover)}"
    return ""


def plot_crossover(results: Results, out_dir: Path, name: str = "crossover.png") -> str | None:
    """Left: the crossover N of each mechanism's default variant as a point with its 95% interval
    (hollow where extrapolated beyond the timed range, × at the measured crossover); an unbounded
    side, or one the timed grid cut off (``interval_ends``), is drawn as an arrow to the axis edge.
    Right: the measured speed-up t_dense / t_fast vs N, one (colour, marker, dash) per line."""
    rows = [(m, c) for m in results.mechanisms if (c := results.comparison(m.id, m.default_variant)) is not None]
    if not rows:
        return None
    fig, (ax_x, ax_s) = plt.subplots(1, 2, figsize=(13, max(3.6, 0.32 * len(rows) + 1.6)), layout="constrained",
                                     gridspec_kw={"width_ratios": [1, 1.15]})
    ys = np.arange(len(rows))
    # the axis spans the estimates and the timed N; a high end far beyond (an extrapolated bootstrap
    # quantile reached 1.6e25 for gdk) is drawn as an arrow to the edge, its number is in the tables
    values = [v for _, c in rows for v in (c.crossover, c.crossover_low, c.measured_crossover)
              if v is not None and math.isfinite(v) and v > 0]
    values += [n for _, c in rows for n in c.sizes]
    lo, hi = (min(values) / 2, max(values) * 4) if values else (1, 2**20)
    ax_x.set_xscale("log", base=2)
    ax_x.set_xlim(lo, hi)
    for y, (mech, c) in zip(ys, rows):
        x = c.crossover
        if x is None or not math.isfinite(x):
            ax_x.text(lo * 1.1, y, "never: dense wins at every N, and the fits do not meet", va="center", fontsize=7,
                      color="0.3")
            continue
        color = "tab:purple" if c.extrapolated else "tab:green"
        low, low_open, high, high_open = interval_ends(c)
        # a closed end: a bar with a cap; an open one (cut off by the grid, or unbounded) or one
        # beyond the axis: the bar to the grid's end (the axis edge), then a dotted arrow to the edge
        for end, is_open, edge, tip in ((low, low_open, lo, "<"), (high, high_open, hi, ">")):
            end = x if end is None else min(max(end, lo), hi)
            ax_x.plot([x, end], [y, y], "-", color=color, lw=2, solid_capstyle="butt")
            if is_open or end in (lo, hi):
                ax_x.plot([end, edge], [y, y], ":", color=color, lw=1.5)
                ax_x.plot([edge], [y], tip, color=color, ms=6, clip_on=False)
            else:
                ax_x.plot([end], [y], "|", color=color, ms=9)
        ax_x.plot([x], [y], "o", color=color, ms=7, mfc="white" if c.extrapolated else color, zorder=3)
        if c.measured_crossover is not None:
            ax_x.plot([c.measured_crossover], [y], "x", color="k", ms=7, zorder=4)
    ax_x.set_yticks(ys, [m.id for m, _ in rows], fontsize=8)
    ax_x.set_ylim(len(rows) - 0.5, -0.5)
    ax_x.set(xlabel="N (fast beats dense above it)", title="crossover N with its 95% interval")
    ax_x.grid(True, axis="x", alpha=0.3)
    ax_x.legend(handles=[
        Line2D([], [], color="tab:green", marker="o", lw=2, label="estimate inside the timed range"),
        Line2D([], [], color="tab:purple", marker="o", mfc="white", lw=2, label="extrapolated from the fits"),
        Line2D([], [], color="k", marker="x", ls="none", label="measured: fast wins from here on"),
        Line2D([], [], color="0.3", ls=":", marker=">", label="interval open: beyond the timed N")],
        loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False, fontsize=7)
    paired = [(m, c) for m, c in rows if c.sizes]
    for (mech, c), (color, marker), dash in zip(paired, style.line_styles(len(paired)), style.dashes(len(paired))):
        ax_s.plot(c.sizes, c.speedup, dash, marker=marker, color=color, ms=4, lw=1, label=mech.id)
    ax_s.axhline(1.0, color="k", lw=1)
    ax_s.set(yscale="log", xlabel="N", ylabel="t_dense / t_fast", title="speed-up of the fast path over its dense twin")
    style.log2_x(ax_s)
    ax_s.grid(True, which="both", alpha=0.3)
    style.legend_right(ax_s)
    return style.save(fig, out_dir, name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"crossover": the figure's file name or None}.

    >>> from reports.sections.crossover import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'crossover': None}
    """
    return {"crossover": plot_crossover(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """Nothing besides the figure (the summary and the variants tables give the crossover texts).

    >>> from reports.sections.crossover import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {}
    """
    return {}
