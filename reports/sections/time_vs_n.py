"""Section "Time vs N": median seconds per call against N, one panel per mechanism on its default
input family, fast path beside its dense twin, each with its log-log fit.

>>> from reports.sections.time_vs_n import ID, TITLE
>>> ID, TITLE
('time', 'Time vs N')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from matplotlib.lines import Line2D

from reports import style
from reports.format import class_text
from reports.sections import PageInputs
from results.schema import MechanismInfo, Results, SweepResult

ID = "time"
TITLE = "Time vs N"
FIGURES: dict[str, Any] = {"time": None}


def default_sweep(results: Results, mech: MechanismInfo, impl: str) -> SweepResult | None:
    """The sweep of ``impl`` ("fast" or "dense") on the mechanism's default variant, or None.

    >>> from reports.sections.time_vs_n import default_sweep
    >>> from results.schema import Results, MechanismInfo
    >>> default_sweep(Results({}), MechanismInfo("causal", "t", "s", "N"), "fast") is None
    True
    """
    return results.sweep(mech.id, mech.default_variant, impl)


def sweep_facts(results: Results) -> dict[str, str]:
    """How the sweeps were timed, each fact joined over every sweep ("?" where none recorded it):
    {"threads", "rounds", "device", "dtype"}.

    >>> from reports.sections.time_vs_n import sweep_facts
    >>> from results.schema import Results
    >>> sweep_facts(Results({}))["device"]
    '?'
    """
    def joined(values) -> str:
        vals = sorted({str(v) for v in values if v is not None})
        return ", ".join(vals) or "?"

    fast = [s for s in results.sweeps]
    return {"threads": joined(s.threads for s in fast), "rounds": joined(s.rounds for s in fast),
            "device": joined(s.device for s in fast), "dtype": joined(s.dtype for s in fast)}


def plot_time(results: Results, out_dir: Path, name: str = "time_vs_n.png") -> str | None:
    """Median seconds per call vs N, one panel per mechanism (its default variant): fast path and
    dense twin, fits with 95% CIs in the legend below, grey guides ∝ N, N log N, N² through the
    middle fast point. None when no fast path was timed.

    >>> from reports.sections.time_vs_n import plot_time
    >>> from results.schema import Results
    >>> from pathlib import Path
    >>> plot_time(Results({}), Path("."))  # nothing timed: no figure
    """
    mechs = [m for m in results.mechanisms if (s := default_sweep(results, m, "fast")) is not None and s.sizes]
    if not mechs:
        return None
    shown = mechs[:style.MAX_PANELS]
    fig, axes = style.grid(len(shown))
    for ax, mech in zip(axes, shown):
        fast = default_sweep(results, mech, "fast")
        dense = default_sweep(results, mech, "dense")
        sizes = []
        for impl, s in (("fast", fast), ("dense", dense)):
            if s is None or not s.sizes:
                continue
            style.sweep_points(ax, s, style.COLORS[impl], label=style.sweep_label(impl, s))
            sizes += list(s.sizes)
        mid = len(fast.sizes) // 2
        style.draw_guides(ax, sizes, fast.sizes[mid], fast.seconds[mid])
        ax.set(yscale="log", xlabel="N", ylabel="seconds per call",
               title=f"{mech.id}  (claims {class_text(mech.complexity)})")
        style.log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, which="major", alpha=0.3)
        style.legend_below(ax, title="slope [95% CI]")
    style.top_legend(fig, [Line2D([], [], color=style.COLORS["fast"], marker="o", label="fast path"),
                           Line2D([], [], color=style.COLORS["dense"], marker="o", label="dense twin")]
                     + style.point_handles() + style.guide_handles())
    return style.save(fig, out_dir, name)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"time": the figure's file name or None}.

    >>> from reports.sections.time_vs_n import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'time': None}
    """
    return {"time": plot_time(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"sweep": sweep_facts} (the caption states how the sweeps were timed).

    >>> from reports.sections.time_vs_n import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})["sweep"]["rounds"]
    '?'
    """
    return {"sweep": sweep_facts(inputs.results)}
