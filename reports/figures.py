"""The report's figures (matplotlib, Agg backend): each function takes data and writes one PNG.

Every function returns the file name it wrote (relative to ``out_dir``), or None when there is
nothing to draw; ``make_figures`` writes them all.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: the report runs in CI and over ssh
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reports.asv_history import AsvHistory, unquote, unit_of  # noqa: E402
from reports.data import MechanismInfo, ReportData  # noqa: E402
from reports.favor import FavorError  # noqa: E402
from reports.gallery import MaskGallery  # noqa: E402
from reports.memory import MemoryCurve, mib_text  # noqa: E402
from reports.sweeps import ImplTiming, MechanismTiming, fitted_mask  # noqa: E402
from reports.trees import CLAIMED, TreeCurve, TreeMasks  # noqa: E402

COLORS = {"fast": "tab:blue", "dense": "tab:red"}
GUIDES = (("N", lambda n: n, "--"), ("N log N", lambda n: n * np.log(n), "-."), ("N²", lambda n: n**2, ":"))
DPI = 110
#: Panel caps keep the asv figure legible when the registry grows; the caption says so.
MAX_ASV_PANELS = 36
MAX_ASV_LINES = 10
#: Perceptually uniform, readable in grey scale and by colour-blind readers.
MASK_CMAP = "viridis"


def _grid(n_panels: int, ncols: int = 3, w: float = 4.2, h: float = 3.2):
    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=DPI)
    plt.close(fig)
    return name


def _draw_guides(ax, sizes, ref_n: float, ref_y: float, guides=GUIDES) -> None:
    """Grey guide lines (N, N log N, N^2) through (ref_n, ref_y) over ``sizes``' range."""
    n = np.geomspace(min(sizes), max(sizes), 50)
    for _, f, style in guides:
        ax.plot(n, ref_y * f(n) / f(ref_n), style, color="0.55", lw=1)


def _figure_legend(fig, guides=GUIDES) -> None:
    """One legend for what every panel shares (colours, guide styles), so panel legends stay short
    and do not cover data."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=COLORS["fast"], marker="o", label="fast path"),
               Line2D([], [], color=COLORS["dense"], marker="o", label="dense twin")]
    handles += [Line2D([], [], color="0.55", ls=style, label=f"∝ {label}") for label, _, style in guides]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False, fontsize=9)


def _save_with_top_legend(fig, out_dir: Path, name: str) -> str:
    # Leave room for the figure legend: about 0.35 inch at the top whatever the figure height.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(out_dir / name, dpi=DPI)
    plt.close(fig)
    return name


def fit_label(impl: str, timing: ImplTiming) -> str:
    """Legend text: "fast: slope 1.03 [0.98, 1.08]" (95% CI)."""
    f = timing.fit
    if f is None:
        return f"{impl}: too few sizes to fit"
    return f"{impl}: slope {f.slope:.2f} [{f.low:.2f}, {f.high:.2f}]"


def plot_timing(mechs: list[MechanismInfo], timings: dict[str, MechanismTiming], out_dir: Path,
                name: str = "time_vs_n.png") -> str | None:
    """Figure 1: log-log median time vs N per mechanism, fits with CIs, guide slopes."""
    mechs = [m for m in mechs if m.id in timings]
    if not mechs:
        return None
    fig, axes = _grid(len(mechs))
    for ax, mech in zip(axes, mechs):
        t = timings[mech.id]
        impls = [("fast", t.fast)] + ([("dense", t.dense)] if t.dense is not None else [])
        for impl, it in impls:
            n, s = np.asarray(it.sweep.sizes, float), np.asarray(it.sweep.seconds, float)
            fitted = fitted_mask(n, s)
            ax.plot(n[fitted], s[fitted], "o", color=COLORS[impl], ms=4)
            ax.plot(n[~fitted], s[~fitted], "o", color=COLORS[impl], ms=4, mfc="none")
            if it.fit is not None:
                ax.plot(n, np.exp(it.fit.intercept) * n**it.fit.slope, "-", color=COLORS[impl], lw=1.3,
                        label=fit_label(impl, it))
            else:
                ax.plot([], [], "o", color=COLORS[impl], label=fit_label(impl, it))
        fs = t.fast.sweep
        mid = len(fs.sizes) // 2
        all_sizes = list(fs.sizes) + (list(t.dense.sweep.sizes) if t.dense else [])
        _draw_guides(ax, all_sizes, fs.sizes[mid], fs.seconds[mid])
        ax.set(xscale="log", yscale="log", xlabel="N", ylabel="seconds per call",
               title=f"{mech.id}  (claims {mech.complexity})")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    _figure_legend(fig)
    return _save_with_top_legend(fig, out_dir, name)


def _memory_points(curve: MemoryCurve):
    floor = 1.0 / 256  # 4 KiB, one page: a zero increment cannot sit on a log axis
    n = np.array([p.n for p in curve.points], float)
    v = np.array([max(p.peak_mib, floor) for p in curve.points], float)
    ok = np.array([p.resolved for p in curve.points], bool)
    return n, v, ok


def plot_memory(mechs: list[MechanismInfo], memory: dict[str, dict[str, MemoryCurve]], out_dir: Path,
                name: str = "memory_vs_n.png") -> str | None:
    """Figure 2: peak extra memory (MiB) vs N, fast and dense, log-log, guides N and N^2."""
    mechs = [m for m in mechs if any(c.points for c in memory.get(m.id, {}).values())]
    if not mechs:
        return None
    fig, axes = _grid(len(mechs))
    for ax, mech in zip(axes, mechs):
        curves = memory[mech.id]
        for impl in ("fast", "dense"):
            c = curves.get(impl)
            if c is None or not c.points:
                continue
            n, v, ok = _memory_points(c)
            ax.plot(n, v, "-", color=COLORS[impl], lw=1, alpha=0.6)
            ax.plot(n[ok], v[ok], "o", color=COLORS[impl], ms=4, label=f"{impl} (max {mib_text(v.max())})")
            if (~ok).any():
                ax.plot(n[~ok], v[~ok], "o", color=COLORS[impl], ms=4, mfc="none", label=f"{impl}: not resolved")
        # ∝ N through the fast path's largest point, ∝ N² through the dense twin's (the slope each
        # should follow), each falling back to the other curve when one is missing.
        have = [c for c in (curves.get("fast"), curves.get("dense")) if c is not None and c.points]
        n_all = [p.n for c in have for p in c.points]
        g = np.geomspace(min(n_all), max(n_all), 50)
        for (label, f, style), c in ((GUIDES[0], have[0]), (GUIDES[2], have[-1])):
            ref_n, ref_v = c.points[-1].n, max(c.points[-1].peak_mib, 1.0 / 256)
            ax.plot(g, ref_v * f(g) / f(ref_n), style, color="0.55", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak extra memory (MiB)", title=mech.id)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    _figure_legend(fig, (GUIDES[0], GUIDES[2]))
    return _save_with_top_legend(fig, out_dir, name)


def plot_crossover(mechs: list[MechanismInfo], timings: dict[str, MechanismTiming], out_dir: Path,
                   name: str = "crossover.png") -> str | None:
    """Figure 3: crossover N per mechanism (bars) and t_dense / t_fast vs N (lines)."""
    paired = [m for m in mechs if m.id in timings and timings[m.id].dense is not None]
    if not paired:
        return None
    fig, (ax_bar, ax_ratio) = plt.subplots(1, 2, figsize=(12, max(3.2, 0.35 * len(paired) + 1.5)))
    ys = np.arange(len(paired))
    for y, mech in zip(ys, paired):
        t = timings[mech.id]
        if t.crossover is None:
            ax_bar.text(1, y, " never (in range or by fit)", va="center", fontsize=8)
            continue
        # Hatched: no timed N shows fast winning for good, so the value rests on extrapolated fits.
        extrapolated = t.measured_crossover is None
        ax_bar.barh(y, t.crossover, color="tab:green", alpha=0.7, hatch="//" if extrapolated else None)
        ax_bar.text(t.crossover, y, f" {t.crossover:,.0f}" + (" (extrapolated)" if extrapolated else ""),
                    va="center", fontsize=8)
    ax_bar.set_yticks(ys, [m.id for m in paired])
    ax_bar.invert_yaxis()
    ax_bar.set_xscale("log", base=2)
    ax_bar.set(xlabel="crossover N (fast beats dense above it)", title="crossover N")
    ax_bar.grid(True, axis="x", alpha=0.3)
    for mech in paired:
        sizes, ratio = timings[mech.id].speedups()
        if sizes:
            ax_ratio.plot(sizes, ratio, "o-", ms=3, label=mech.id)
    ax_ratio.axhline(1.0, color="k", lw=1)
    ax_ratio.set(xscale="log", yscale="log", xlabel="N", ylabel="t_dense / t_fast",
                 title="speed-up of the fast path over its dense twin")
    ax_ratio.set_xscale("log", base=2)
    ax_ratio.grid(True, alpha=0.3)
    ax_ratio.legend(fontsize=7, ncol=2)
    return _save(fig, out_dir, name)


def plot_favor(favor: FavorError | None, out_dir: Path, name: str = "favor_error.png") -> str | None:
    """Figure 5: empirical RMSE of the FAVOR+ estimate vs m, with the predicted RMSE line."""
    if favor is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    m = np.asarray(favor.m, float)
    ax.plot(m, favor.predicted_rmse, "k-", lw=1.5, label="predicted sqrt(Var), iid (slope -1/2)")
    styles = {"iid": ("tab:blue", "o"), "orthogonal": ("tab:orange", "s")}
    for c in favor.curves:
        color, marker = styles.get(c.kind, ("tab:gray", "^"))
        r = np.asarray(c.rmse)
        err = np.vstack([r - np.asarray(c.rmse_low), np.asarray(c.rmse_high) - r])
        ax.errorbar(c.m, r, yerr=err, fmt=marker, color=color, ms=4, capsize=2,
                    label=f"{c.kind}: slope {c.slope:.3f} [{c.slope_low:.3f}, {c.slope_high:.3f}]")
    ax.set(xscale="log", yscale="log", xlabel="number of random features m",
           ylabel="RMSE of phi(x)·phi(y) vs exp(x·y)",
           title=f"FAVOR+ estimation error, exp(x·y) = {favor.exact:.3f}, {favor.draws} draws per m")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_dir, name)


def _as_number(p: str) -> float:
    try:
        return float(unquote(p))
    except ValueError:
        return math.nan


def asv_lines(history: AsvHistory) -> dict[str, list]:
    """{panel title: [(label, series)]} for the time_ benchmarks of an asv history.

    One panel per benchmark (and machine, if several). asv_bench parameterises benchmarks as
    (..., N): for each combination of the other parameters we keep the series at its largest
    numeric last parameter, where the asymptotic cost shows; a benchmark without parameters is
    one line.
    """
    multi_machine = len({s.machine for s in history.series}) > 1
    panels: dict[str, dict[tuple, object]] = {}
    for s in history.series:
        if unit_of(s.benchmark) != "seconds":
            continue
        title = s.benchmark + (f" @{s.machine}" if multi_machine else "")
        group = panels.setdefault(title, {})
        head = s.params[:-1]
        best = group.get(head)
        last = _as_number(s.params[-1]) if s.params else math.nan
        if best is None or (last > _as_number(best.params[-1])):
            group[head] = s
    out = {}
    for title, group in panels.items():
        lines = []
        for head, s in sorted(group.items()):
            parts = [unquote(p) for p in head]
            if s.params:
                last = unquote(s.params[-1])
                parts.append(f"N={last}" if math.isfinite(_as_number(last)) else last)
            lines.append((", ".join(parts) or "(no params)", s))
        out[title] = lines
    return out


def plot_asv(history: AsvHistory | None, out_dir: Path, name: str = "asv_history.png") -> str | None:
    """Figure 6: each asv time_ benchmark across commits (x: commits in date order)."""
    if history is None:
        return None
    panels = asv_lines(history)
    if not panels:
        return None
    titles = list(panels)[:MAX_ASV_PANELS]
    fig, axes = _grid(len(titles), ncols=3, w=4.5, h=3.0)
    x_of = {c: i for i, c in enumerate(history.commits)}
    for ax, title in zip(axes, titles):
        for label, s in panels[title][:MAX_ASV_LINES]:
            ax.plot([x_of[c] for c in s.commits], s.values, "o-", ms=4, label=label)
        ax.set_xticks(range(len(history.commits)), [c[:8] for c in history.commits], rotation=45, fontsize=7)
        ax.set_xlim(-0.5, max(len(history.commits) - 0.5, 0.5))
        ax.set_yscale("log")
        ax.set(title=title, ylabel="seconds")
        ax.title.set_fontsize(8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    if len(panels) > len(titles):
        fig.suptitle(f"first {len(titles)} of {len(panels)} time_ benchmarks (all are in results.json)")
    return _save(fig, out_dir, name)


def plot_gallery(gallery: MaskGallery | None, out_dir: Path, name: str = "mask_gallery.png") -> str | None:
    """Mask gallery: one heatmap per mechanism of its dense mask M, shape (n, n): row = query i,
    column = key j, linear colour scale from 0 to that panel's max (own colorbar). A panel whose
    mask failed shows the error text instead; one with no matrix (re-render) shows its note."""
    if gallery is None or not gallery.panels:
        return None
    import textwrap

    from matplotlib.colors import Normalize

    fig, axes = _grid(len(gallery.panels), ncols=4, w=3.0, h=2.7)
    for ax, p in zip(axes, gallery.panels):
        title = p.id + (f"  (N={p.n})" if p.n != gallery.n else "")
        if p.matrix is None:
            text = p.error or p.note or "no matrix"
            ax.text(0.5, 0.5, textwrap.fill(text, 34), ha="center", va="center", fontsize=7, wrap=True,
                    color="tab:red" if p.error else "0.3", transform=ax.transAxes)
            ax.set_xticks([]), ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("tab:red" if p.error else "0.6")
            ax.set_title(title + (" — FAILED" if p.error else ""), fontsize=9,
                         color="tab:red" if p.error else "black")
            continue
        hi = float(p.matrix.max())
        im = ax.imshow(p.matrix, cmap=MASK_CMAP, norm=Normalize(0.0, hi if hi > 0 else 1.0),
                       interpolation="nearest", origin="upper")
        ticks = [0, p.n - 1]
        ax.set_xticks(ticks), ax.set_yticks(ticks)
        ax.tick_params(labelsize=7)
        ax.set_title(title, fontsize=9)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, ticks=[0.0, hi if hi > 0 else 1.0])
        cb.ax.tick_params(labelsize=7)
        cb.ax.set_yticklabels(["0", f"{hi:.3g}"])
        if p.note:
            ax.set_xlabel(textwrap.fill(p.note, 40), fontsize=6, color="tab:orange")
    fig.supxlabel("key j", fontsize=10)
    fig.supylabel("query i", fontsize=10)
    return _save(fig, out_dir, name)


#: Tree families: colour and marker (markers keep them apart in grey scale).
FAMILY_STYLE = {"path": ("tab:red", "o"), "star": ("tab:green", "s"), "caterpillar": ("tab:orange", "D"),
                "complete binary": ("tab:blue", "^"), "random recursive": ("tab:purple", "v")}


def _family_style(family: str) -> tuple[str, str]:
    return FAMILY_STYLE.get(family, ("tab:gray", "x"))


_SUPERSCRIPT = str.maketrans("0123456789.-", "⁰¹²³⁴⁵⁶⁷⁸⁹·⁻")


def pow2_text(n: int) -> str:
    """"2¹²" for powers of two, else "5,000"."""
    n = int(n)
    return f"2{str(n.bit_length() - 1).translate(_SUPERSCRIPT)}" if n > 0 and n & (n - 1) == 0 else f"{n:,}"


def tree_fit_label(c: TreeCurve) -> str:
    """Legend text of one tree curve: "path: 1.04 [0.88, 1.20]", its failure or why it has no fit."""
    if c.fit is not None:
        text = f"{c.family}: {c.fit.slope:.2f} [{c.fit.low:.2f}, {c.fit.high:.2f}]"
    elif not c.sizes:
        text = f"{c.family}: not timed"
    else:
        text = f"{c.family}: no fit"
    if c.skipped and c.sizes:
        text += f" (N ≤ {pow2_text(max(c.sizes))})"
    if c.error is not None:
        text += f"; FAILED at N = {pow2_text(c.error_n)}" if c.error_n else "; FAILED"
    return text


def _tree_points(c: TreeCurve):
    n, s = np.asarray(c.sizes, float), np.asarray(c.seconds, float)
    fitted = np.asarray(c.fitted, bool) if len(c.fitted) == n.size else np.ones(n.size, bool)
    return n, s, fitted


def plot_tree_timing(trees: TreeMasks | None, out_dir: Path, name: str = "tree_time_vs_n.png") -> str | None:
    """Tree masks, figure 1: seconds per product vs N, one panel per operator, one line per family
    (filled points fitted, hollow ones under 1 ms and left out), fitted slopes in the legends, grey
    guides ∝ N and ∝ N²; a failed curve gets an × at the N where it failed."""
    if trees is None or not trees.curves:
        return None
    ops = trees.operators
    fig, axes = _grid(len(ops), ncols=3, w=4.6, h=4.6)
    for ax, op in zip(axes, ops):
        curves = [c for c in (trees.curve(op, fam) for fam in trees.families) if c is not None]
        all_n = [n for c in curves for n in c.sizes]
        all_s = [t for c in curves for t in c.seconds]
        for c in curves:
            color, marker = _family_style(c.family)
            n, s, fitted = _tree_points(c)
            ax.plot(n[fitted], s[fitted], marker, color=color, ms=4, ls="none")
            ax.plot(n[~fitted], s[~fitted], marker, color=color, ms=4, ls="none", mfc="none")
            if c.fit is not None:
                nf = n[fitted]
                ax.plot(nf, np.exp(c.fit.intercept) * nf**c.fit.slope, "-", color=color, lw=1.2)
            elif n.size:
                ax.plot(n, s, "-", color=color, lw=0.8, alpha=0.6)
            ax.plot([], [], marker + "-", color=color, ms=4, label=tree_fit_label(c))
            if c.error is not None and c.error_n:
                ax.plot([c.error_n], [0.9], "X", color=color, ms=9, mec="tab:red", ls="none",
                        transform=ax.get_xaxis_transform())
        ax.set(xscale="log", yscale="log", xlabel="N (nodes)", ylabel="seconds per product (16 columns)",
               title=f"{op}  (claims O({CLAIMED.get(op, '?')}))")
        ax.set_xscale("log", base=2)
        if all_s:
            lo, hi = min(all_s), max(all_s)
            ax.set_ylim(lo / 2, hi * 3)
            mid = sorted(set(all_n))[len(set(all_n)) // 2]
            ref = float(np.exp(np.mean([np.log(t) for n, t in zip(all_n, all_s) if n == mid])))
            failed_at = [c.error_n for c in curves if c.error is not None and c.error_n]
            xlim = (min(all_n + failed_at) / 1.3, max(all_n + failed_at) * 1.3)
            _draw_guides(ax, [min(all_n), max(all_n)], mid, ref, (GUIDES[0], GUIDES[2]))
            ax.set_xlim(*xlim)
        else:
            ax.text(0.5, 0.5, "nothing timed", ha="center", va="center", transform=ax.transAxes, color="tab:red")
        skipped = [c.family for c in curves if c.skipped]
        if skipped:
            cap = max(max(c.sizes) if c.sizes else 0 for c in curves if c.skipped)
            ax.text(0.02, 0.98, f"{', '.join(skipped)}: O(N²) (diam ~ N),\ntimed only up to N = {pow2_text(cap)}"
                    if cap else f"{', '.join(skipped)}: not timed (O(N²))",
                    transform=ax.transAxes, ha="left", va="top", fontsize=7, color="0.25",
                    bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.9))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), title="family: slope [95% CI]",
                  title_fontsize=7, frameon=False)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="0.3", marker="o", ls="none", label="fitted point"),
               Line2D([], [], color="0.3", marker="o", ls="none", mfc="none", label="under 1 ms, not fitted"),
               Line2D([], [], color="0.3", ls="-", label="fit")]
    handles += [Line2D([], [], color="0.55", ls=style, label=f"∝ {label}")
                for label, _, style in (GUIDES[0], GUIDES[2])]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False, fontsize=9)
    return _save_with_top_legend(fig, out_dir, name)


def _common(a: TreeCurve | None, b: TreeCurve | None):
    if a is None or b is None:
        return [], [], []
    sa, sb = dict(zip(a.sizes, a.seconds)), dict(zip(b.sizes, b.seconds))
    common = sorted(set(sa) & set(sb))
    return common, [sa[n] for n in common], [sb[n] for n in common]


def plot_tree_diam(trees: TreeMasks | None, out_dir: Path, name: str = "tree_diam.png") -> str | None:
    """Tree masks, figure 2: the diam factor of tree-diam. Left: t_path / t_binary vs N for tree-diam
    (and tree-dc, which should not care) against diam_path / diam_binary. Right: tree-diam's
    t / (N diam) per family, flat if the time is O(N diam)."""
    if trees is None or not any(c.operator == "tree-diam" and c.sizes for c in trees.curves):
        return None
    fig, (ax_r, ax_n) = plt.subplots(1, 2, figsize=(12, 4.4))
    drew = []
    for op, style, color in (("tree-diam", "o-", "tab:red"), ("tree-dc", "s--", "0.5")):
        common, tp, tb = _common(trees.curve(op, "path"), trees.curve(op, "complete binary"))
        if common:
            ax_r.plot(common, np.divide(tp, tb), style, color=color, ms=5, label=f"{op}: t_path / t_binary")
            drew.append(max(common))
    # the diameter ratio over tree-diam's range (or every N if tree-diam has no ratio)
    top = drew[0] if drew and trees.curve("tree-diam", "path") is not None else max(trees.sizes, default=0)
    diam_n = [n for n in trees.sizes
              if n <= top and trees.diameter("path", n) and trees.diameter("complete binary", n)]
    if diam_n:
        ratio = [trees.diameter("path", n) / trees.diameter("complete binary", n) for n in diam_n]
        ax_r.plot(diam_n, ratio, "k-", lw=1.5, label="diam_path / diam_binary = (N − 1) / diam_binary")
    if drew or diam_n:
        ax_r.axhline(1.0, color="0.6", lw=0.8)
        ax_r.legend(fontsize=8, loc="upper left")
    else:
        ax_r.text(0.5, 0.5, "no path and binary timings to compare", ha="center", va="center",
                  transform=ax_r.transAxes, color="tab:red")
    ax_r.set(xscale="log", yscale="log", xlabel="N (nodes)", ylabel="ratio", title="path (diam N − 1) vs complete "
             "binary tree (diam ~ 2 log₂ N)")
    ax_r.set_xscale("log", base=2)
    ax_r.grid(True, which="both", alpha=0.3)
    for fam in trees.families:
        c = trees.curve("tree-diam", fam)
        if c is None or not c.sizes:
            continue
        diam = [trees.diameter(fam, n) for n in c.sizes]
        pts = [(n, t / (n * d) * 1e9) for n, t, d in zip(c.sizes, c.seconds, diam) if d]
        if not pts:
            continue
        color, marker = _family_style(fam)
        label = fam + (f": t / diam ∝ N{f'{c.diam_fit.slope:.2f}'.translate(_SUPERSCRIPT)}"
                       if c.diam_fit is not None else "")
        ax_n.plot(*zip(*pts), marker + "-", color=color, ms=4, lw=1, label=label)
    ax_n.set(xscale="log", yscale="log", xlabel="N (nodes)", ylabel="t / (N · diam)  (ns)",
             title="tree-diam: time per node per unit of diameter")
    ax_n.set_xscale("log", base=2)
    ax_n.grid(True, which="both", alpha=0.3)
    if ax_n.lines:
        ax_n.legend(fontsize=7, loc="best")
    return _save(fig, out_dir, name)


#: Vertical shift between the families' depth lines (they often coincide); the caption says so.
DEPTH_OFFSET = 0.12


def plot_tree_depth(trees: TreeMasks | None, out_dir: Path, name: str = "tree_dc_depth.png") -> str | None:
    """Tree masks, figure 3: TreeDCMask's separator recursion depth vs N per family against the
    bound log_{1.5} N (left), and its number of subproblems (right, ∝ N guide)."""
    if trees is None or not any(d.sizes for d in trees.depths):
        return None
    fig, (ax_d, ax_s) = plt.subplots(1, 2, figsize=(12, 4.4))
    all_n = sorted({n for d in trees.depths for n in d.sizes})
    g = np.geomspace(min(all_n), max(all_n), 50)
    ax_d.plot(g, np.log(g) / np.log(1.5), "k-", lw=1.5, label="bound log₁.₅ N")
    for i, d in enumerate(trees.depths):
        if not d.sizes:
            continue
        color, marker = _family_style(d.family)
        # equal depths of several families: shifted up or down a little, hollow markers shrinking
        off = DEPTH_OFFSET * (i - (len(trees.depths) - 1) / 2)
        style = dict(color=color, marker=marker, mfc="none", ms=max(3.0, 8 - 1.2 * i), lw=1)
        ax_d.plot(d.sizes, np.asarray(d.recursion_depth, float) + off, label=d.family, **style)
        ax_s.plot(d.sizes, d.num_subproblems, label=d.family, **style)
    ax_d.set(xlabel="N (nodes)", ylabel="recursion depth (levels of splits)",
             title="TreeDCMask: separator recursion depth")
    ax_d.set_xscale("log", base=2)
    ax_d.set_ylim(bottom=0)
    ax_d.grid(True, alpha=0.3)
    ax_d.legend(fontsize=8, loc="upper left")
    ref = max(d.num_subproblems[-1] for d in trees.depths if d.sizes)
    ax_s.plot(g, ref * g / max(all_n), "--", color="0.55", lw=1, label="∝ N")
    ax_s.set(xscale="log", yscale="log", xlabel="N (nodes)", ylabel="subproblems (splits + dense blocks)",
             title="TreeDCMask: number of subproblems")
    ax_s.set_xscale("log", base=2)
    ax_s.grid(True, which="both", alpha=0.3)
    ax_s.legend(fontsize=8, loc="upper left")
    return _save(fig, out_dir, name)


def make_figures(data: ReportData, out_dir: str | Path) -> dict[str, str | None]:
    """Write every figure into ``out_dir``; returns {figure key: file name or None}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "timing": plot_timing(data.mechanisms, data.timings, out),
        "memory": plot_memory(data.mechanisms, data.memory, out),
        "crossover": plot_crossover(data.mechanisms, data.timings, out),
        "favor": plot_favor(data.favor, out),
        "asv": plot_asv(data.asv, out),
        "gallery": plot_gallery(data.gallery, out),
        "tree_timing": plot_tree_timing(data.trees, out),
        "tree_diam": plot_tree_diam(data.trees, out),
        "tree_depth": plot_tree_depth(data.trees, out),
    }
