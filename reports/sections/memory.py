"""Section "Peak memory vs N": the peak extra memory of one call against N, fast path and dense
twin, and every measured point as a table.

>>> from reports.sections.memory import ID, TITLE
>>> ID, TITLE
('memory', 'Peak memory vs N')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.lines import Line2D

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.schema import MechanismInfo, MemoryCurve, Results

ID = "memory"
TITLE = "Peak memory vs N"
FIGURES: dict[str, Any] = {"memory": None}
#: Floor of a memory point on a log axis (one 4 KiB page): a zero increment cannot be drawn.
MEMORY_FLOOR_BYTES = 4096.0


def _memory_arrays(curve: MemoryCurve):
    n = np.array([p.n for p in curve.points], float)
    v = np.array([max(p.peak_bytes, MEMORY_FLOOR_BYTES) for p in curve.points], float) / 2**20
    ok = np.array([p.resolved for p in curve.points], bool)
    return n, v, ok


def memory_curves(results: Results, mech: MechanismInfo) -> dict[str, MemoryCurve]:
    """{impl: curve} of a mechanism's default variant (any variant if none is recorded for it)."""
    out = {}
    for impl in ("fast", "dense"):
        c = results.memory_curve(mech.id, impl, mech.default_variant) or results.memory_curve(mech.id, impl)
        if c is not None:
            out[impl] = c
    return out


def memory_text(c: MemoryCurve | None) -> str:
    """Peak extra memory at the largest measured N: "80 MiB at N = 2¹⁷" (≤ when only bounded)."""
    if c is None:
        return fmt.DASH
    if not c.points:
        return f"error: {c.error}" if c.error else fmt.DASH
    p = c.points[-1]
    return f"{'≤ ' if not p.resolved else ''}{fmt.bytes_text(p.peak_bytes)} at N = {fmt.pow2_text(p.n)}"


def plot_memory(results: Results, out_dir: Path, name: str = "memory_vs_n.png") -> str | None:
    """Peak extra memory of one call (MiB) vs N per mechanism, fast and dense; hollow points are
    upper bounds (not resolved); guides ∝ N through the fast path's largest point and ∝ N²
    through the dense twin's."""
    mechs = [m for m in results.mechanisms if any(c.points for c in memory_curves(results, m).values())]
    if not mechs:
        return None
    shown = mechs[:style.MAX_PANELS]
    fig, axes = style.grid(len(shown))
    for ax, mech in zip(axes, shown):
        curves = {k: c for k, c in memory_curves(results, mech).items() if c.points}
        for impl, c in curves.items():
            n, v, ok = _memory_arrays(c)
            ax.plot(n, v, "-", color=style.COLORS[impl], lw=1, alpha=0.6)
            ax.plot(n[ok], v[ok], "o", color=style.COLORS[impl], ms=4, ls="none")
            ax.plot(n[~ok], v[~ok], "o", color=style.COLORS[impl], ms=4, ls="none", mfc="none")
            ax.plot([], [], "o-", color=style.COLORS[impl], ms=4,
                    label=f"{impl}: {fmt.bytes_text(c.points[-1].peak_bytes)} at N = {fmt.pow2_text(c.points[-1].n)}")
        have = list(curves.values())
        n_all = [p.n for c in have for p in c.points]
        g = np.geomspace(min(n_all), max(n_all), 50)
        for (label, f, ls), c in ((style.GUIDES[0], have[0]), (style.GUIDES[2], have[-1])):
            ref_n, ref_v = c.points[-1].n, max(c.points[-1].peak_bytes, MEMORY_FLOOR_BYTES) / 2**20
            ax.plot(g, ref_v * f(g) / f(ref_n), ls, color=style.GUIDE_COLOR, lw=1, zorder=1)
        ax.set(yscale="log", xlabel="N", ylabel="peak extra memory (MiB)", title=mech.id)
        style.log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, alpha=0.3)
        style.legend_below(ax, title="at the largest N")
    style.top_legend(fig, [Line2D([], [], color=style.COLORS["fast"], marker="o", label="fast path"),
                      Line2D([], [], color=style.COLORS["dense"], marker="o", label="dense twin"),
                      Line2D([], [], color="0.3", marker="o", ls="none", mfc="none", label="upper bound only")]
                + style.guide_handles((style.GUIDES[0], style.GUIDES[2])))
    return style.save(fig, out_dir, name)


def memory_rows(results: Results) -> list[dict[str, str]]:
    """One row per memory curve: mechanism, variant, impl, method, every point as text, error.

    >>> from reports.sections.memory import memory_rows
    >>> from results.schema import Results
    >>> memory_rows(Results({}))
    []
    """
    return [{"mechanism": c.mechanism, "variant": c.variant, "impl": c.impl, "method": c.method,
             "points": ", ".join(f"{fmt.pow2_text(p.n)}: {'' if p.resolved else '≤ '}"
                                 f"{fmt.bytes_text(p.peak_bytes)}" for p in c.points) or fmt.DASH,
             "error": c.error or ""} for c in results.memory]


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"memory": the figure's file name or None}.

    >>> from reports.sections.memory import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'memory': None}
    """
    return {"memory": plot_memory(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"memory_methods": the measuring methods recorded, "memory_rows": memory_rows}.

    >>> from reports.sections.memory import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'memory_methods': 'none recorded', 'memory_rows': []}
    """
    methods = sorted({c.method for c in inputs.results.memory if c.method})
    return {"memory_methods": ", ".join(methods) or "none recorded", "memory_rows": memory_rows(inputs.results)}
