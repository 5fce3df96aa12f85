"""The report's figures (matplotlib, Agg backend), drawn from a verify.schema.Results.

Each ``plot_*`` function writes one PNG into ``out_dir`` and returns its file name, or None when
there is nothing to draw. Conventions on every figure: log-log axes for time and memory vs N
(base-2 N axis); filled points entered a fit, hollow ones did not; legends sit outside the axes
(below a panel, or right of it), never over data; a panel with many lines cycles a marker list
through a qualitative colormap, so every line differs in colour and marker.
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")  # headless: the report renders in CI and over ssh
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reports.asv_history import AsvSeries, MechanismHistory  # noqa: E402
from reports.format import bytes_text, class_text, fit_text, pow2_text, seconds_text  # noqa: E402
from results.check import CheckResult  # noqa: E402
from results.schema import (FavorError, Gallery, MechanismInfo, MemoryCurve, Results,  # noqa: E402
                           SweepResult, num)

DPI = 110
COLORS = {"fast": "tab:blue", "dense": "tab:red"}
#: Markers cycled with the colours; 9 is coprime to 10 and 20, so (colour, marker) pairs repeat
#: only after 90 (tab10) or 180 (tab20) lines.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
#: Grey guide lines through a reference point: (label, f(N), line style).
GUIDES = (("N", lambda n: n, "--"), ("N log N", lambda n: n * np.log(n), "-."), ("N²", lambda n: n**2, ":"))
GUIDE_COLOR = "0.55"
MASK_CMAP = "viridis"  # perceptually uniform, readable in grey scale and by colour-blind readers
#: One page-width figure holds this many panels at most; further ones are listed in the caption.
MAX_PANELS = 36
#: Floor of a memory point on a log axis (one 4 KiB page): a zero increment cannot be drawn.
MEMORY_FLOOR_BYTES = 4096.0


# ------------------------------------------------------------------------------- helpers


def line_styles(n: int) -> list[tuple[str, str]]:
    """(colour, marker) of n lines: tab10 up to ten lines, tab20 beyond, markers always cycled."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [(matplotlib.colors.to_hex(cmap(i % cmap.N)), MARKERS[i % len(MARKERS)]) for i in range(n)]


def slug(text: str) -> str:
    """A file-name-safe form of an id ("toeplitz-1d" stays, "a/b c" -> "a_b_c")."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


def _grid(n_panels: int, ncols: int = 3, w: float = 4.3, h: float = 3.9):
    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False, layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig, out_dir: Path, name: str) -> str:
    # bbox "tight" keeps the legends placed outside the axes inside the picture.
    fig.savefig(out_dir / name, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return name


def _legend_below(ax, ncol: int = 1, title: str | None = None, fontsize: float = 7) -> None:
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False, fontsize=fontsize,
              title=title, title_fontsize=fontsize)


def _legend_right(ax, fontsize: float = 7, title: str | None = None) -> None:
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=fontsize, title=title,
              title_fontsize=fontsize)


def _log2_x(ax) -> None:
    ax.set_xscale("log", base=2)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, textwrap.fill(text, 36), ha="center", va="center", transform=ax.transAxes,
            fontsize=8, color="0.35")


def _draw_guides(ax, sizes: Iterable[float], ref_n: float, ref_y: float, guides=GUIDES) -> None:
    """Grey guide lines through (ref_n, ref_y) over the range of ``sizes``."""
    sizes = [s for s in sizes if s and s > 0]
    if not sizes or not (ref_y and ref_y > 0):
        return
    n = np.geomspace(min(sizes), max(sizes), 50)
    for _, f, style in guides:
        ax.plot(n, ref_y * f(n) / f(ref_n), style, color=GUIDE_COLOR, lw=1, zorder=1)


def _guide_handles(guides=GUIDES) -> list[Line2D]:
    return [Line2D([], [], color=GUIDE_COLOR, ls=style, label=f"∝ {label}") for label, _, style in guides]


def _point_handles() -> list[Line2D]:
    return [Line2D([], [], color="0.3", marker="o", ls="none", label="point in the fit"),
            Line2D([], [], color="0.3", marker="o", ls="none", mfc="none", label="point left out of the fit"),
            Line2D([], [], color="0.3", ls="-", label="fitted line")]


def _top_legend(fig, handles: list[Line2D]) -> None:
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False, fontsize=9)


def _fitted(s: SweepResult) -> np.ndarray:
    if len(s.fitted) == len(s.sizes):
        return np.asarray(s.fitted, bool)
    return np.ones(len(s.sizes), bool)


def _arrays(sizes, values) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(sizes, float), np.asarray([np.nan if v is None else v for v in values], float)


def _sweep_points(ax, s: SweepResult, color: str, marker: str = "o", values=None, fit=None,
                  label: str | None = None, ms: float = 4) -> None:
    """Filled fitted points, hollow others, the fitted line over the fitted range, a failure mark."""
    n, t = _arrays(s.sizes, s.seconds if values is None else values)
    keep = _fitted(s)
    ax.plot(n[keep], t[keep], marker, color=color, ms=ms, ls="none")
    ax.plot(n[~keep], t[~keep], marker, color=color, ms=ms, ls="none", mfc="none")
    if fit is not None and keep.any():
        nf = n[keep]
        ax.plot(nf, np.exp(fit.intercept) * nf**fit.slope, "-", color=color, lw=1.3)
    elif n.size > 1:
        ax.plot(n, t, "-", color=color, lw=0.8, alpha=0.6)
    if s.error is not None and s.error_n:
        ax.plot([s.error_n], [0.93], "X", color=color, ms=9, mec="tab:red", ls="none",
                transform=ax.get_xaxis_transform())
    if label is not None:
        ax.plot([], [], marker + "-", color=color, ms=ms, label=label)


def sweep_label(name: str, s: SweepResult, fit=None) -> str:
    """Legend text: "fast: 1.03 [0.98, 1.08]", or why there is no slope, and a failure."""
    fit = s.fit if fit is None else fit
    text = f"{name}: {fit_text(fit)}" if fit is not None else f"{name}: {'no fit' if s.sizes else 'not timed'}"
    if s.error is not None:
        text += f"; failed at N = {pow2_text(s.error_n)}" if s.error_n else "; failed"
    return text


def default_sweep(results: Results, mech: MechanismInfo, impl: str) -> SweepResult | None:
    return results.sweep(mech.id, mech.default_variant, impl)


# ------------------------------------------------------------------------------- time, memory, crossover


def plot_time(results: Results, out_dir: Path, name: str = "time_vs_n.png") -> str | None:
    """Median seconds per call vs N, one panel per mechanism (its default variant): fast path and
    dense twin, fits with 95% CIs in the legend below, grey guides ∝ N, N log N, N² through the
    middle fast point."""
    mechs = [m for m in results.mechanisms if (s := default_sweep(results, m, "fast")) is not None and s.sizes]
    if not mechs:
        return None
    shown = mechs[:MAX_PANELS]
    fig, axes = _grid(len(shown))
    for ax, mech in zip(axes, shown):
        fast = default_sweep(results, mech, "fast")
        dense = default_sweep(results, mech, "dense")
        sizes = []
        for impl, s in (("fast", fast), ("dense", dense)):
            if s is None or not s.sizes:
                continue
            _sweep_points(ax, s, COLORS[impl], label=sweep_label(impl, s))
            sizes += list(s.sizes)
        mid = len(fast.sizes) // 2
        _draw_guides(ax, sizes, fast.sizes[mid], fast.seconds[mid])
        ax.set(yscale="log", xlabel="N", ylabel="seconds per call",
               title=f"{mech.id}  (claims {class_text(mech.complexity)})")
        _log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, which="major", alpha=0.3)
        _legend_below(ax, title="slope [95% CI]")
    _top_legend(fig, [Line2D([], [], color=COLORS["fast"], marker="o", label="fast path"),
                      Line2D([], [], color=COLORS["dense"], marker="o", label="dense twin")]
                + _point_handles() + _guide_handles())
    return _save(fig, out_dir, name)


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


def plot_memory(results: Results, out_dir: Path, name: str = "memory_vs_n.png") -> str | None:
    """Peak extra memory of one call (MiB) vs N per mechanism, fast and dense; hollow points are
    upper bounds (not resolved); guides ∝ N through the fast path's largest point and ∝ N²
    through the dense twin's."""
    mechs = [m for m in results.mechanisms if any(c.points for c in memory_curves(results, m).values())]
    if not mechs:
        return None
    shown = mechs[:MAX_PANELS]
    fig, axes = _grid(len(shown))
    for ax, mech in zip(axes, shown):
        curves = {k: c for k, c in memory_curves(results, mech).items() if c.points}
        for impl, c in curves.items():
            n, v, ok = _memory_arrays(c)
            ax.plot(n, v, "-", color=COLORS[impl], lw=1, alpha=0.6)
            ax.plot(n[ok], v[ok], "o", color=COLORS[impl], ms=4, ls="none")
            ax.plot(n[~ok], v[~ok], "o", color=COLORS[impl], ms=4, ls="none", mfc="none")
            ax.plot([], [], "o-", color=COLORS[impl], ms=4,
                    label=f"{impl}: {bytes_text(c.points[-1].peak_bytes)} at N = {pow2_text(c.points[-1].n)}")
        have = list(curves.values())
        n_all = [p.n for c in have for p in c.points]
        g = np.geomspace(min(n_all), max(n_all), 50)
        for (label, f, style), c in ((GUIDES[0], have[0]), (GUIDES[2], have[-1])):
            ref_n, ref_v = c.points[-1].n, max(c.points[-1].peak_bytes, MEMORY_FLOOR_BYTES) / 2**20
            ax.plot(g, ref_v * f(g) / f(ref_n), style, color=GUIDE_COLOR, lw=1, zorder=1)
        ax.set(yscale="log", xlabel="N", ylabel="peak extra memory (MiB)", title=mech.id)
        _log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, alpha=0.3)
        _legend_below(ax, title="at the largest N")
    _top_legend(fig, [Line2D([], [], color=COLORS["fast"], marker="o", label="fast path"),
                      Line2D([], [], color=COLORS["dense"], marker="o", label="dense twin"),
                      Line2D([], [], color="0.3", marker="o", ls="none", mfc="none", label="upper bound only")]
                + _guide_handles((GUIDES[0], GUIDES[2])))
    return _save(fig, out_dir, name)


def plot_crossover(results: Results, out_dir: Path, name: str = "crossover.png") -> str | None:
    """Left: the crossover N of each mechanism's default variant as a point with its 95% interval
    (hollow where extrapolated beyond the timed range, × at the measured crossover); an unbounded
    side is drawn as an arrow to the axis edge. Right: the measured speed-up t_dense / t_fast vs N."""
    rows = [(m, c) for m in results.mechanisms if (c := results.comparison(m.id, m.default_variant)) is not None]
    if not rows:
        return None
    fig, (ax_x, ax_s) = plt.subplots(1, 2, figsize=(13, max(3.6, 0.32 * len(rows) + 1.6)), layout="constrained",
                                     gridspec_kw={"width_ratios": [1, 1.15]})
    ys = np.arange(len(rows))
    values = [v for _, c in rows for v in (c.crossover, c.crossover_low, c.crossover_high, c.measured_crossover)
              if v is not None and math.isfinite(v) and v > 0]
    values += [n for _, c in rows for n in c.sizes]
    lo, hi = (min(values) / 2, max(values) * 2) if values else (1, 2**20)
    ax_x.set_xscale("log", base=2)
    ax_x.set_xlim(lo, hi)
    for y, (mech, c) in zip(ys, rows):
        x = c.crossover
        if x is None or not math.isfinite(x):
            ax_x.text(lo * 1.1, y, "never: dense wins at every N, and the fits do not meet", va="center", fontsize=7,
                      color="0.3")
            continue
        color = "tab:purple" if c.extrapolated else "tab:green"
        if c.crossover_low is not None and c.crossover_high is not None:
            ax_x.plot([c.crossover_low, c.crossover_high], [y, y], "-", color=color, lw=2, solid_capstyle="butt")
            ax_x.plot([c.crossover_low, c.crossover_high], [y, y], "|", color=color, ms=9)
        else:  # one side cannot be bounded: an arrow to the axis edge on that side
            for end, edge, tip in ((c.crossover_low, lo, "<"), (c.crossover_high, hi, ">")):
                if end is not None:
                    ax_x.plot([x, end], [y, y], "-", color=color, lw=2)
                    ax_x.plot([end], [y], "|", color=color, ms=9)
                else:
                    ax_x.plot([x, edge], [y, y], ":", color=color, lw=1.5)
                    ax_x.plot([edge], [y], tip, color=color, ms=6, clip_on=False)
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
        Line2D([], [], color="0.3", ls=":", marker=">", label="interval unbounded on that side")],
        loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False, fontsize=7)
    paired = [(m, c) for m, c in rows if c.sizes]
    for (mech, c), (color, marker) in zip(paired, line_styles(len(paired))):
        ax_s.plot(c.sizes, c.speedup, "-", marker=marker, color=color, ms=4, lw=1, label=mech.id)
    ax_s.axhline(1.0, color="k", lw=1)
    ax_s.set(yscale="log", xlabel="N", ylabel="t_dense / t_fast", title="speed-up of the fast path over its dense twin")
    _log2_x(ax_s)
    ax_s.grid(True, which="both", alpha=0.3)
    _legend_right(ax_s)
    return _save(fig, out_dir, name)


# ------------------------------------------------------------------------------- per-variant view


def metric_panels(sweeps: list[SweepResult]) -> list[tuple[str, str | None]]:
    """[(metric, its bound's name or None)] over the sweeps' metrics, in first-seen order; a
    metric "X bound" is the bound of "X" (drawn on X's panel), or its own panel without an X."""
    names: list[str] = []
    for s in sweeps:
        names += [k for k in s.metrics if k not in names]
    out = []
    for k in names:
        if k.endswith(" bound") and k[: -len(" bound")] in names:
            continue
        bound = f"{k} bound"
        out.append((k, bound if bound in names else None))
    return out


def variant_sweeps(results: Results, mech: MechanismInfo, impl: str = "fast") -> list[tuple[str, str, SweepResult]]:
    """[(variant name, title, sweep)] of every swept variant with a recorded sweep, in record order."""
    variants = [(v.name, v.title) for v in mech.variants if v.sweep] or [(mech.default_variant, "")]
    out = []
    for vname, title in variants:
        s = results.sweep(mech.id, vname, impl)
        if s is not None:
            out.append((vname, title, s))
    return out


def has_variant_view(results: Results, mech: MechanismInfo) -> bool:
    """More than one swept variant with a sweep, or a sweep carrying a cost factor or metrics."""
    vs = variant_sweeps(results, mech)
    return len(vs) > 1 or any(s.cost_factors or s.metrics for _, _, s in vs)


def plot_variants(results: Results, mech: MechanismInfo, out_dir: Path, name: str | None = None) -> str | None:
    """One mechanism's variants side by side, one colour and marker per variant in every panel:
    time vs N (fits in the legend); where the record has a cost factor, time / cost factor vs N
    (its fit) and the cost factor itself vs N; every recorded metric vs N with its "X bound"
    metric drawn as the bound (black when it is the same for every variant)."""
    vs = [(v, t, s) for v, t, s in variant_sweeps(results, mech) if s.sizes]
    if not vs:
        return None
    name = name or f"variants_{slug(mech.id)}.png"
    cost = mech.cost_factor_name or "cost factor"
    with_cost = [(v, t, s) for v, t, s in vs if s.cost_factors and len(s.cost_factors) == len(s.sizes)]
    metrics = metric_panels([s for _, _, s in vs])
    kinds = ["time"] + (["time/cost", "cost"] if with_cost else []) + [f"metric:{m}" for m, _ in metrics]
    fig, axes = _grid(len(kinds), ncols=min(3, len(kinds)), w=4.6, h=4.2)
    styles = dict(zip([v for v, _, _ in vs], line_styles(len(vs))))
    for ax, kind in zip(axes, kinds):
        if kind == "time":
            all_n, all_t = [], []
            for v, _, s in vs:
                color, marker = styles[v]
                _sweep_points(ax, s, color, marker, label=sweep_label(v, s))
                all_n += list(s.sizes)
                all_t += list(s.seconds)
            ref = sorted(set(all_n))[len(set(all_n)) // 2]
            ref_t = float(np.exp(np.mean([np.log(t) for n, t in zip(all_n, all_t) if n == ref and t and t > 0] or [0])))
            _draw_guides(ax, all_n, ref, ref_t, (GUIDES[0], GUIDES[2]))
            ax.set(yscale="log", ylabel="seconds per call", title=f"{mech.id}: time vs N per variant")
            _legend_below(ax, title="variant: slope [95% CI]")
        elif kind == "time/cost":
            for v, _, s in with_cost:
                color, marker = styles[v]
                per = [t / c if c else np.nan for t, c in zip(s.seconds, s.cost_factors)]
                _sweep_points(ax, s, color, marker, values=per, fit=s.cost_fit,
                              label=sweep_label(v, s, s.cost_fit) if s.cost_fit else f"{v}: no fit")
            ax.set(yscale="log", ylabel=f"seconds / {cost}", title=f"{mech.id}: time / {cost} vs N")
            _legend_below(ax, title=f"variant: slope of t / {cost} [95% CI]")
        elif kind == "cost":
            for v, _, s in with_cost:
                color, marker = styles[v]
                ax.plot(s.sizes, s.cost_factors, "-", marker=marker, color=color, ms=4, lw=1, label=v)
            ax.set(yscale="log", ylabel=cost, title=f"{mech.id}: {cost} of the timed inputs")
            _legend_below(ax, ncol=2)
        else:
            metric = kind.split(":", 1)[1]
            bound = dict(metrics)[metric]
            _metric_panel(ax, vs, styles, metric, bound)
            ax.set(ylabel=metric, title=f"{mech.id}: {metric}" + (" vs its bound" if bound else ""))
            _legend_below(ax, ncol=2)
        ax.set_xlabel("N")
        _log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, which="major", alpha=0.3)
    return _save(fig, out_dir, name)


def _metric_panel(ax, vs, styles, metric: str, bound: str | None) -> None:
    """Metric vs N per variant (hollow markers of decreasing size, so equal values of several
    variants stay visible); the bound as one black line when every variant has the same bound,
    else dashed in each variant's colour; points above their bound ringed in red."""
    bounds = {}
    values = [(n, y) for _, _, s in vs for n, y in zip(s.sizes, s.metrics.get(metric, [])) if y is not None]
    ys = [y for _, y in values if math.isfinite(y)]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 30:
        # a count spanning decades (subproblems, blocks): log axis and a grey guide ∝ N
        ax.set_yscale("log")
        n_top, y_top = max(values)
        g = np.geomspace(min(n for n, _ in values), n_top, 50)
        ax.plot(g, y_top * g / n_top, "--", color=GUIDE_COLOR, lw=1, label="∝ N", zorder=1)
    for i, (v, _, s) in enumerate(vs):
        if metric not in s.metrics:
            continue
        color, marker = styles[v]
        n, y = _arrays(s.sizes, s.metrics[metric])
        ax.plot(n, y, "-", marker=marker, color=color, mfc="none", ms=max(3.0, 8 - 1.2 * i), lw=1, label=v)
        if bound and bound in s.metrics:
            nb, yb = _arrays(s.sizes, s.metrics[bound])
            bounds[v] = dict(zip(nb, yb))
            over = y > yb
            if over.any():
                ax.plot(n[over], y[over], "o", ms=12, mfc="none", mec="tab:red", mew=1.5, ls="none")
    if not bounds:
        return
    tables = list(bounds.values())
    first = tables[0]
    shared = all(np.isclose(t[k], first[k], equal_nan=True) for t in tables[1:] for k in set(t) & set(first))
    if shared:
        merged = {k: v for t in tables for k, v in t.items()}
        ks = sorted(merged)
        ax.plot(ks, [merged[k] for k in ks], "k-", lw=1.5, label=bound)
    else:
        for v, t in bounds.items():
            ks = sorted(t)
            ax.plot(ks, [t[k] for k in ks], "--", color=styles[v][0], lw=1, label=f"{v}: {bound}")
    if any(l.get_mec() == "tab:red" for l in ax.lines):
        ax.plot([], [], "o", ms=10, mfc="none", mec="tab:red", ls="none", label="above its bound")


# ------------------------------------------------------------------------------- FAVOR+, gallery


def plot_favor(favor: FavorError | None, out_dir: Path, name: str = "favor_error.png") -> str | None:
    """Empirical RMSE of the FAVOR+ estimate vs m (with 95% intervals), and the predicted RMSE."""
    if favor is None or not favor.m:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6), layout="constrained")
    ax.plot(favor.m, favor.predicted_rmse, "k-", lw=1.5, label="predicted sqrt(Var), iid (slope −1/2)")
    styles = {"iid": ("tab:blue", "o"), "orthogonal": ("tab:orange", "s")}
    for c in favor.curves:
        color, marker = styles.get(c.kind, ("tab:gray", "^"))
        r = np.asarray(c.rmse, float)
        err = np.vstack([r - np.asarray(c.rmse_low, float), np.asarray(c.rmse_high, float) - r])
        ax.errorbar(c.m, r, yerr=err, fmt=marker, color=color, ms=4, capsize=2,
                    label=f"{c.kind}: slope {c.slope:.3f} [{c.slope_low:.3f}, {c.slope_high:.3f}]")
    ax.set(yscale="log", xlabel="number of random features m", ylabel="RMSE of φ(x)·φ(y) vs exp(x·y)",
           title=f"FAVOR+ estimation error, exp(x·y) = {favor.exact:.3f}, {favor.draws} draws per m")
    _log2_x(ax)
    ax.grid(True, which="both", alpha=0.3)
    _legend_right(ax, fontsize=8)
    return _save(fig, out_dir, name)


def plot_gallery(gallery: Gallery | None, out_dir: Path, name: str = "mask_gallery.png") -> str | None:
    """One heatmap per mechanism of its dense mask M (n, n): row = query i, column = key j, linear
    colour scale from 0 to the panel's max (own colorbar). A failed panel shows its error text."""
    if gallery is None or not gallery.panels:
        return None
    from matplotlib.colors import Normalize

    panels = gallery.panels[:MAX_PANELS]
    fig, axes = _grid(len(panels), ncols=4, w=3.1, h=2.8)
    for ax, p in zip(axes, panels):
        title = p.id + (f"  (N = {p.n})" if p.n != gallery.n else "")
        if p.matrix is None:
            ax.text(0.5, 0.5, textwrap.fill(p.error or "no matrix recorded", 34), ha="center", va="center",
                    fontsize=7, color="tab:red" if p.error else "0.3", transform=ax.transAxes)
            ax.set_xticks([]), ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("tab:red" if p.error else "0.6")
            ax.set_title(title + (" — FAILED" if p.error else ""), fontsize=9,
                         color="tab:red" if p.error else "black")
            continue
        m = np.asarray(p.matrix, float)
        hi = float(np.nanmax(m)) if m.size else 1.0
        hi = hi if hi > 0 else 1.0
        im = ax.imshow(m, cmap=MASK_CMAP, norm=Normalize(0.0, hi), interpolation="nearest", origin="upper")
        ax.set_xticks([0, m.shape[1] - 1]), ax.set_yticks([0, m.shape[0] - 1])
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, ticks=[0.0, hi])
        cb.ax.tick_params(labelsize=7)
        cb.ax.set_yticklabels(["0", f"{hi:.3g}"])
    fig.supxlabel("key j", fontsize=10)
    fig.supylabel("query i", fontsize=10)
    return _save(fig, out_dir, name)


# ------------------------------------------------------------------------------- numerics

#: The counts of a numerics cell (verify/checks/numerics.py), summed by numerics_totals.
NUMERICS_COUNTS = ("rows", "silent", "refusals", "disallowed", "errors", "unjudged", "reference_refusals",
                   "reference_disallowed")
#: Colours of the numerics heatmap: refusal rate in blues, silent-error rate in reds (a cell
#: with any silent error or error is drawn in reds: those are the worse failure), on a power
#: scale so that one row in 512 is already visible.
NUMERICS_REFUSAL_CMAP = "Blues"
NUMERICS_ERROR_CMAP = "Reds"
NUMERICS_GAMMA = 0.3


#: How the results JSON writes non-finite numbers (verify.schema).
_NON_FINITE = ("inf", "-inf", "nan")


def numerics_checks(results: Results) -> list[CheckResult]:
    """The numerics/<mechanism> results (kind "numerics"), in the order the run recorded them."""
    return [r for r in results.checks or [] if r.kind == "numerics"]


def numerics_cells(check: CheckResult) -> list[dict]:
    """The check's cells (details["cells"]) with numbers read back from JSON ("inf" -> inf); cells
    that are not dicts with a dtype, std, d and N are dropped."""
    d = check.details if isinstance(check.details, dict) else {}
    out = []
    for c in d.get("cells") or []:
        if not isinstance(c, dict) or not all(k in c for k in ("dtype", "std", "d", "n")):
            continue
        cell = {k: num(v) if isinstance(v, str) and v in _NON_FINITE else v for k, v in c.items()}
        for key in NUMERICS_COUNTS:
            cell[key] = int(num(cell.get(key)) or 0)
        out.append(cell)
    return out


def numerics_dtypes(cells: list[dict]) -> list[str]:
    """The dtypes of the cells, float32 first, then bfloat16, then any other in first-seen order."""
    seen = list(dict.fromkeys(str(c["dtype"]) for c in cells))
    order = {"float32": 0, "bfloat16": 1}
    return sorted(seen, key=lambda t: (order.get(t, 2), seen.index(t)))


def numerics_totals(cells: list[dict]) -> dict[str, dict]:
    """{dtype: the cells' counts summed, and "worst_row_error" their max} (dtypes in numerics_dtypes order)."""
    out: dict[str, dict] = {}
    for dtype in numerics_dtypes(cells):
        mine = [c for c in cells if c["dtype"] == dtype]
        t: dict = {k: sum(c[k] for c in mine) for k in NUMERICS_COUNTS}
        worst = [float(c["worst_row_error"]) for c in mine if isinstance(c.get("worst_row_error"), (int, float))]
        t["worst_row_error"] = max(worst) if worst else None
        out[dtype] = t
    return out


def numerics_failing(cell: dict) -> bool:
    """A cell that counts against its check: silent errors, disallowed refusals or errors."""
    return bool(cell["silent"] or cell["disallowed"] or cell["reference_disallowed"] or cell["errors"])


def _numerics_label(cell: dict) -> str:
    """"0", or "r 512!" (refused rows, "!" when some were disallowed), "s 3" (silent errors),
    "e 512" (rows of calls that raised), one per line."""
    lines = []
    if cell["refusals"]:
        lines.append(f"r {cell['refusals']}" + ("!" if cell["disallowed"] else ""))
    if cell["silent"]:
        lines.append(f"s {cell['silent']}")
    if cell["errors"]:
        lines.append(f"e {cell['errors']}")
    return "\n".join(lines) or "0"


def plot_numerics(results: Results, out_dir: Path, name: str = "numerics.png") -> str | None:
    """numerics/<id> as heatmaps: one panel per mechanism and dtype, rows the std of the q, k
    entries, columns the head dimension d (and N, when the run had several). A cell is coloured by
    its refusal rate (blues), or by its silent-error rate (reds) when it has silent errors or
    errors; its text gives the counts (_numerics_label) and a red frame marks a cell that fails
    (silent errors, disallowed refusals, errors). A check without cells shows its reason."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import PowerNorm
    from matplotlib.patches import Rectangle

    checks = numerics_checks(results)
    if not checks:
        return None
    panels: list[tuple[CheckResult, str | None, list[dict]]] = []
    for r in checks:
        cells = numerics_cells(r)
        dtypes = numerics_dtypes(cells)
        panels += [(r, t, [c for c in cells if c["dtype"] == t]) for t in dtypes] or [(r, None, [])]
    panels = panels[:MAX_PANELS]
    fig, axes = _grid(len(panels), ncols=4, w=3.2, h=2.7)
    norm = PowerNorm(NUMERICS_GAMMA, vmin=0.0, vmax=1.0)
    blues, reds = plt.get_cmap(NUMERICS_REFUSAL_CMAP), plt.get_cmap(NUMERICS_ERROR_CMAP)
    for ax, (r, dtype, cells) in zip(axes, panels):
        mech = r.id.split("/", 1)[-1]
        if not cells:
            reasons = (r.details or {}).get("reasons") if isinstance(r.details, dict) else None
            text = "; ".join(str(x) for x in reasons or []) or "no cells recorded"
            _no_data(ax, text)
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"{mech}: {r.status}", fontsize=9, color="tab:red" if r.status == "fail" else "black")
            continue
        stds = sorted({float(c["std"]) for c in cells})
        sizes = sorted({int(c["n"]) for c in cells})
        cols = sorted({(int(c["n"]), int(c["d"])) for c in cells})
        at = {(float(c["std"]), int(c["n"]), int(c["d"])): c for c in cells}
        rgba = np.ones((len(stds), len(cols), 4))
        for i, s in enumerate(stds):
            for j, (n, d) in enumerate(cols):
                c = at.get((s, n, d))
                if c is None or not c["rows"]:
                    rgba[i, j] = (0.85, 0.85, 0.85, 1.0)
                    continue
                bad = c["silent"] + c["errors"]
                rgba[i, j] = (reds(norm(bad / c["rows"])) if bad else blues(norm(c["refusals"] / c["rows"])))
        ax.imshow(rgba, aspect="auto", interpolation="nearest", origin="upper")
        for i, s in enumerate(stds):
            for j, (n, d) in enumerate(cols):
                c = at.get((s, n, d))
                if c is None:
                    continue
                dark = sum(rgba[i, j, :3] * (0.299, 0.587, 0.114)) < 0.5
                label = _numerics_label(c)
                ax.text(j, i, label, ha="center", va="center", fontsize=6.5,
                        color="white" if dark else ("0.55" if label == "0" else "black"))
                if numerics_failing(c):
                    ax.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, ec="tab:red", lw=1.8))
        ax.set_xticks(range(len(cols)), [f"{d}" if len(sizes) == 1 else f"{d}\nN={pow2_text(n)}" for n, d in cols],
                      fontsize=7)
        ax.set_yticks(range(len(stds)), [f"{s:g}" for s in stds], fontsize=7)
        ax.set_xlabel("head dimension d", fontsize=8)
        ax.set_ylabel("std of q, k entries", fontsize=8)
        failing = any(numerics_failing(c) for c in cells)
        ax.set_title(f"{mech} · {dtype}" + (f"  (N = {pow2_text(sizes[0])})" if len(sizes) == 1 else ""),
                     fontsize=9, color="tab:red" if failing else "black")
    for cmap, label in ((blues, "refused rows / rows"),
                        (reds, "silently wrong rows (and rows of calls that raised) / rows")):
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, location="bottom", shrink=0.45, aspect=40,
                          pad=0.02)
        cb.set_label(label, fontsize=8)
        cb.set_ticks([0, 0.002, 0.01, 0.1, 0.5, 1.0])
        cb.ax.tick_params(labelsize=7)
    return _save(fig, out_dir, name)


# ------------------------------------------------------------------------------- asv history


def _commit_axis(ax, commits: list[str]) -> None:
    ax.set_xticks(range(len(commits)), [c[:8] for c in commits], rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, max(len(commits) - 0.5, 0.5))
    ax.grid(True, alpha=0.3)


def _history_lines(ax, lines, commits: list[str]) -> list[float]:
    """Plot each line over the commit positions (gaps where a commit has no value); returns the values."""
    values = []
    for line, (color, marker) in zip(lines, line_styles(len(lines))):
        y = np.asarray([np.nan if v is None else v for v in line.values], float)
        ax.plot(range(len(commits)), y, "-", marker=marker, color=color, ms=5, lw=1.2, label=line.label)
        values += [v for v in y if np.isfinite(v)]
    return values


def _seconds_axis(ax, values: list[float]) -> None:
    """Seconds as "1.2 ms" ticks; a log axis only when the values span more than a decade (a
    narrow range on a log axis gets unreadable "1.1x10^-3" tick labels)."""
    from matplotlib.ticker import FuncFormatter

    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 10:
        ax.set_yscale("log")
    else:
        hi = max(pos) if pos else 1.0
        ax.set_ylim(0, hi * 1.15)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: seconds_text(y) if y > 0 else "0"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))


#: The exponent a class should fit (a guide on the exponent panels).
CLASS_EXPONENT = {"N": 1.0, "N log N": 1.0, "N log^2 N": 1.0, "N diam": 1.0, "N + E": 1.0, "N^2": 2.0}


def plot_history(histories: list[MechanismHistory], commits: list[str], claims: dict[str, str],
                 out_dir: Path, name: str = "asv_history.png") -> str | None:
    """Two panels per mechanism, x = commits in commit-date order (short hashes): its fitted
    exponent (asv track_exponent; grey guide: the class's exponent) and its fast path's time at
    a fixed N (asv time_attention)."""
    if not histories or not commits:
        return None
    shown = histories[: MAX_PANELS // 2]
    fig, axes = _grid(2 * len(shown), ncols=4, w=3.6, h=3.1)
    for i, h in enumerate(shown):
        ax_e, ax_t = axes[2 * i], axes[2 * i + 1]
        if h.exponent:
            values = _history_lines(ax_e, h.exponent, commits)
            claim = claims.get(h.mechanism)
            if claim in CLASS_EXPONENT:
                ax_e.axhline(CLASS_EXPONENT[claim], ls="--", color=GUIDE_COLOR, lw=1)
                values.append(CLASS_EXPONENT[claim])
            if values:  # at least +-0.15 around the data: commit-to-commit noise should look small
                ax_e.set_ylim(min(values) - 0.15, max(values) + 0.15)
        else:
            _no_data(ax_e, "no track_exponent results")
        ax_e.set_title(f"{h.mechanism}: fitted exponent", fontsize=9)
        ax_e.set_ylabel("exponent", fontsize=8)
        if h.time:
            _seconds_axis(ax_t, _history_lines(ax_t, h.time, commits))
        else:
            _no_data(ax_t, "no time_attention results for 'fast'")
        ax_t.set_title(f"{h.mechanism}: fast path at N = {pow2_text(h.time_n)}" if h.time_n else
                       f"{h.mechanism}: fast path", fontsize=9)
        ax_t.set_ylabel("time per call", fontsize=8)
        for ax in (ax_e, ax_t):
            _commit_axis(ax, commits)
            if len(ax.get_legend_handles_labels()[0]) > 1:
                _legend_below(ax, fontsize=6)
    return _save(fig, out_dir, name)


def plot_track(series: dict[str, list[AsvSeries]], commits: list[str], out_dir: Path,
               name: str = "asv_track.png") -> str | None:
    """Every other asv track_ benchmark across commits: one panel per benchmark, one line per
    parameter combination (legend below the panel)."""
    if not series or not commits:
        return None
    benches = list(series)[:MAX_PANELS]
    fig, axes = _grid(len(benches), ncols=3, w=4.4, h=3.6)
    x_of = {c: i for i, c in enumerate(commits)}
    for ax, bench in zip(axes, benches):
        lines = series[bench]
        for s, (color, marker) in zip(lines, line_styles(len(lines))):
            ax.plot([x_of[c] for c in s.commits], s.values, "-", marker=marker, color=color, ms=4, lw=1,
                    label=s.label)
        values = [v for s in lines for v in s.values if v is not None]
        if values and min(values) > 0 and max(values) / min(values) > 30:
            ax.set_yscale("log")
        ax.set_title(bench, fontsize=8)
        _commit_axis(ax, commits)
        _legend_below(ax, ncol=2, fontsize=6)
    return _save(fig, out_dir, name)

