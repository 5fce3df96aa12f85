"""Section "More than one machine": sequence-sharded attention on gloo ranks (issue 26): the
distributed/<case> checks (sharded == one process), weak and strong scaling, and the bytes each
rank sends against N, from Results.distributed and the checks (measure.distributed measures).

>>> from reports.sections.distributed import ID, TITLE
>>> ID, TITLE
('distributed', 'More than one machine')
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from matplotlib.ticker import FormatStrFormatter, NullLocator

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from results.schema import DistributedScaling

ID = "distributed"
TITLE = "More than one machine"
FIGURES: dict[str, Any] = {"scaling": None, "bytes": None}


def plot_scaling(d: DistributedScaling, out_dir: Path, name: str = "distributed_scaling.png") -> str | None:
    """Two panels, seconds per call against ranks: weak (tokens per rank fixed; ideal flat) and
    strong (N fixed; ideal ∝ 1/P), the median with the min-max range of the repeats."""
    if not d.points:
        return None
    fig, axes = style.grid(2, ncols=2)
    for ax, kind in zip(axes, ("weak", "strong")):
        pts = sorted((p for p in d.points if p.kind == kind), key=lambda p: p.world)
        if not pts:
            style.no_data(ax, f"no {kind} scaling")
            continue
        w = [p.world for p in pts]
        med = [p.median for p in pts]
        ax.errorbar(w, med, yerr=[[p.median - p.low for p in pts], [p.high - p.median for p in pts]], fmt="o-",
                    color=style.COLORS["fast"], capsize=3, label="median, min-max of the repeats")
        ideal = [med[0] if kind == "weak" else med[0] * w[0] / x for x in w]
        ax.plot(w, ideal, "--", color=style.GUIDE_COLOR, label="ideal")
        ax.axvline(d.cpus / d.threads_per_rank, color="0.8", lw=3, zorder=0,
                   label=f"{d.cpus} cores: more ranks share them")
        title = (f"weak: {fmt.pow2_text(d.tokens_per_rank)} tokens per rank" if kind == "weak"
                 else f"strong: N = {fmt.pow2_text(d.strong_n)}")
        ax.set(xscale="log", yscale="log", xlabel="ranks", ylabel="seconds per call (slowest rank)", title=title)
        ax.set_xticks(w, [str(x) for x in w])
        ax.xaxis.set_minor_locator(NullLocator())  # only the measured rank counts are labelled
        for axis in (ax.yaxis,):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.title.set_fontsize(9)
        ax.grid(True, alpha=0.3)
        style.legend_below(ax)
    return style.save(fig, out_dir, name)


def plot_bytes(d: DistributedScaling, out_dir: Path, name: str = "distributed_bytes.png") -> str | None:
    """Bytes sent per rank per call against N (log-log), one line per (function, world): flat
    where communication does not grow with N."""
    if not d.communication:
        return None
    fig, axes = style.grid(1, ncols=1, w=6.0)
    ax = axes[0]
    keys = sorted({(c.function, c.world) for c in d.communication})
    for (func, world), (color, marker), dash in zip(keys, style.line_styles(len(keys)), style.dashes(len(keys))):
        pts = sorted((c for c in d.communication if (c.function, c.world) == (func, world)), key=lambda c: c.n)
        ax.plot([c.n for c in pts], [max(c.bytes_per_rank) for c in pts], color=color, marker=marker, ls=dash,
                label=f"{func}, {world} ranks (most of any rank)")
    ax.set(xscale="log", yscale="log", xlabel="N (tokens in all)", ylabel="bytes sent per rank per call",
           title="communication per rank against N")
    style.log2_x(ax)
    ax.title.set_fontsize(9)
    ax.grid(True, alpha=0.3)
    style.legend_below(ax)
    return style.save(fig, out_dir, name)


def scaling_rows(d: DistributedScaling | None) -> list[dict[str, str]]:
    """One row per (kind, world): N, the median and range of seconds, the efficiency with its range.

    >>> from reports.sections.distributed import scaling_rows
    >>> scaling_rows(None)
    []
    """
    if d is None:
        return []
    rows = []
    for kind, secs in sorted(d.single_process.items(), key=lambda kv: kv[0] != "weak"):
        if secs:
            n = d.tokens_per_rank if kind == "weak" else d.strong_n
            rows.append({"kind": kind, "world": "one process", "n": fmt.pow2_text(n),
                         "median": fmt.seconds_text(statistics.median(secs)),
                         "range": f"{fmt.seconds_text(min(secs))} – {fmt.seconds_text(max(secs))}",
                         "efficiency": fmt.DASH, "shared": "no"})
    for p in sorted(d.points, key=lambda p: (p.kind != "weak", p.world)):
        eff = fmt.DASH if p.efficiency is None else (
            f"{p.efficiency:.2f} [{p.efficiency_low:.2f}, {p.efficiency_high:.2f}]")
        rows.append({"kind": p.kind, "world": str(p.world), "n": fmt.pow2_text(p.n),
                     "median": fmt.seconds_text(p.median),
                     "range": f"{fmt.seconds_text(p.low)} – {fmt.seconds_text(p.high)}",
                     "efficiency": eff, "shared": "yes" if p.world * d.threads_per_rank > d.cpus else "no"})
    return rows


def bytes_rows(d: DistributedScaling | None) -> list[dict[str, str]]:
    """One row per (function, world): the bytes per rank at the smallest and largest N, and the
    ratio of the largest to the smallest over N (1.00: flat).

    >>> from reports.sections.distributed import bytes_rows
    >>> bytes_rows(None)
    []
    """
    if d is None:
        return []
    rows = []
    for func, world in sorted({(c.function, c.world) for c in d.communication}):
        pts = sorted((c for c in d.communication if (c.function, c.world) == (func, world)), key=lambda c: c.n)
        most = [max(c.bytes_per_rank) for c in pts]
        ratio = max(most) / min(most) if min(most) > 0 else float("inf")
        rows.append({"function": func, "world": str(world),
                     "ns": f"{fmt.pow2_text(pts[0].n)} – {fmt.pow2_text(pts[-1].n)}",
                     "low": fmt.bytes_text(min(most)), "high": fmt.bytes_text(max(most)),
                     "ratio": f"{ratio:.2f}", "flat": ratio <= 1.0 + 1e-9})
    return rows


def check_rows(inputs: PageInputs) -> list[dict[str, str]]:
    """The distributed/<case> checks: id, status, statistic (worst error over its bound), worst place.

    >>> from reports.sections.distributed import check_rows
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> check_rows(PageInputs(Results({})))
    []
    """
    return [{"id": r.id, "status": r.status, "statistic": fmt.number(r.statistic),
             "worst": str(r.details.get("worst") or fmt.DASH), "seconds": f"{r.seconds:.1f}"}
            for r in inputs.results.checks or [] if r.id.startswith("distributed/")]


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"scaling": file or None, "bytes": file or None}.

    >>> from reports.sections.distributed import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'scaling': None, 'bytes': None}
    """
    d = inputs.results.distributed
    if d is None:
        return dict(FIGURES)
    return {"scaling": plot_scaling(d, out_dir), "bytes": plot_bytes(d, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """The section's rows and facts (None where the run recorded no scaling).

    >>> from reports.sections.distributed import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})["distributed"] is None
    True
    """
    d = inputs.results.distributed
    facts = None
    if d is not None:
        most = max(d.worlds) if d.worlds else 1
        facts = {"mode": d.mode, "function": d.function,
                 "shape": ", ".join(f"{k} = {v}" for k, v in d.shape.items()), "repeats": d.repeats,
                 "threads": d.threads_per_rank, "cpus": d.cpus, "max_world": most,
                 "oversubscribed": most * d.threads_per_rank > d.cpus,
                 "load": " and ".join(f"{x:.1f}" for x in d.load) if d.load else "",
                 "tokens_per_rank": fmt.pow2_text(d.tokens_per_rank), "strong_n": fmt.pow2_text(d.strong_n),
                 "seconds": fmt.duration_text(d.seconds), "cuda": d.cuda, "cuda_note": d.cuda_note,
                 "cuda_median": fmt.seconds_text(d.cuda["median"]) if d.cuda else "",
                 "flat": all(r["flat"] for r in bytes_rows(d)) if d.communication else None,
                 "bytes_median": fmt.bytes_text(statistics.median(
                     b for c in d.communication for b in c.bytes_per_rank)) if d.communication else fmt.DASH}
    return {"distributed": facts, "distributed_scaling_rows": scaling_rows(d), "distributed_bytes_rows": bytes_rows(d),
            "distributed_check_rows": check_rows(inputs)}
