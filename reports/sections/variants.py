"""Section "Variants of a mechanism": every swept variant (named input family) of a mechanism side by
side: time vs N, time / cost factor and the cost factor where the class carries one, and every
structural metric the sweeps recorded against its bound. One figure and one table per mechanism
that has such a view; a newly registered family with variants appears with no code here.

>>> from reports.sections.variants import ID, TITLE
>>> ID, TITLE
('variants', 'Variants of a mechanism')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from reports.sections.crossover import crossover_text
from results.schema import MechanismInfo, Results, SweepResult

ID = "variants"
TITLE = "Variants of a mechanism"
FIGURES: dict[str, Any] = {"variants": {}}


def anchor(prefix: str, text: str) -> str:
    """An HTML id: "variants-tree-diam" (characters outside [A-Za-z0-9_-] become "_")."""
    return prefix + "-" + "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in text)


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


# ------------------------------------------------------------------------------- figure


def plot_variants(results: Results, mech: MechanismInfo, out_dir: Path, name: str | None = None) -> str | None:
    """One mechanism's variants side by side, one colour and marker per variant in every panel:
    time vs N (fits in the legend); where the record has a cost factor, time / cost factor vs N
    (its fit) and the cost factor itself vs N; every recorded metric vs N with its "X bound"
    metric drawn as the bound (black when it is the same for every variant)."""
    vs = [(v, t, s) for v, t, s in variant_sweeps(results, mech) if s.sizes]
    if not vs:
        return None
    name = name or f"variants_{style.slug(mech.id)}.png"
    cost = mech.cost_factor_name or "cost factor"
    with_cost = [(v, t, s) for v, t, s in vs if s.cost_factors and len(s.cost_factors) == len(s.sizes)]
    metrics = metric_panels([s for _, _, s in vs])
    kinds = ["time"] + (["time/cost", "cost"] if with_cost else []) + [f"metric:{m}" for m, _ in metrics]
    fig, axes = style.grid(len(kinds), ncols=min(3, len(kinds)), w=4.6, h=4.2)
    styles = dict(zip([v for v, _, _ in vs], style.line_styles(len(vs))))
    for ax, kind in zip(axes, kinds):
        if kind == "time":
            all_n, all_t = [], []
            for v, _, s in vs:
                color, marker = styles[v]
                style.sweep_points(ax, s, color, marker, label=style.sweep_label(v, s))
                all_n += list(s.sizes)
                all_t += list(s.seconds)
            ref = sorted(set(all_n))[len(set(all_n)) // 2]
            ref_t = float(np.exp(np.mean([np.log(t) for n, t in zip(all_n, all_t) if n == ref and t and t > 0] or [0])))
            style.draw_guides(ax, all_n, ref, ref_t, (style.GUIDES[0], style.GUIDES[2]))
            ax.set(yscale="log", ylabel="seconds per call", title=f"{mech.id}: time vs N per variant")
            style.legend_below(ax, title="variant: slope [95% CI]")
        elif kind == "time/cost":
            for v, _, s in with_cost:
                color, marker = styles[v]
                per = [t / c if c else np.nan for t, c in zip(s.seconds, s.cost_factors)]
                style.sweep_points(ax, s, color, marker, values=per, fit=s.cost_fit,
                              label=style.sweep_label(v, s, s.cost_fit) if s.cost_fit else f"{v}: no fit")
            ax.set(yscale="log", ylabel=f"seconds / {cost}", title=f"{mech.id}: time / {cost} vs N")
            style.legend_below(ax, title=f"variant: slope of t / {cost} [95% CI]")
        elif kind == "cost":
            for v, _, s in with_cost:
                color, marker = styles[v]
                ax.plot(s.sizes, s.cost_factors, "-", marker=marker, color=color, ms=4, lw=1, label=v)
            ax.set(yscale="log", ylabel=cost, title=f"{mech.id}: {cost} of the timed inputs")
            style.legend_below(ax, ncol=2)
        else:
            metric = kind.split(":", 1)[1]
            bound = dict(metrics)[metric]
            _metric_panel(ax, vs, styles, metric, bound)
            ax.set(ylabel=metric, title=f"{mech.id}: {metric}" + (" vs its bound" if bound else ""))
            style.legend_below(ax, ncol=2)
        ax.set_xlabel("N")
        style.log2_x(ax)
        ax.title.set_fontsize(9)
        ax.grid(True, which="major", alpha=0.3)
    return style.save(fig, out_dir, name)


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
        ax.plot(g, y_top * g / n_top, "--", color=style.GUIDE_COLOR, lw=1, label="∝ N", zorder=1)
    for i, (v, _, s) in enumerate(vs):
        if metric not in s.metrics:
            continue
        color, marker = styles[v]
        n, y = style.as_arrays(s.sizes, s.metrics[metric])
        ax.plot(n, y, "-", marker=marker, color=color, mfc="none", ms=max(3.0, 8 - 1.2 * i), lw=1, label=v)
        if bound and bound in s.metrics:
            nb, yb = style.as_arrays(s.sizes, s.metrics[bound])
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


# ------------------------------------------------------------------------------- table


@dataclass
class VariantRow:
    name: str
    title: str
    fit: str
    cost_fit: str
    sizes: str
    largest_n: str
    t_largest: str
    cost_largest: str
    metrics: dict[str, str]
    crossover: str
    error: str
    points: str


@dataclass
class VariantSection:
    id: str
    anchor: str
    title: str
    complexity: str
    cost_name: str
    figure: str | None
    rows: list[VariantRow]
    metric_names: list[str]
    bounds: dict[str, str]
    not_swept: list[str] = field(default_factory=list)


def _sizes_text(sizes) -> str:
    return f"{fmt.pow2_text(min(sizes))} … {fmt.pow2_text(max(sizes))} ({len(sizes)})" if sizes else fmt.DASH


def _points_text(s: SweepResult, cost_name: str) -> str:
    parts = []
    for i, (n, t) in enumerate(zip(s.sizes, s.seconds)):
        text = f"{fmt.pow2_text(n)}: {fmt.seconds_text(t)}"
        if s.cost_factors and i < len(s.cost_factors) and s.cost_factors[i] is not None:
            text += f" ({cost_name} {fmt.count_text(s.cost_factors[i])})"
        parts.append(text)
    return ", ".join(parts) or fmt.DASH


def variant_section(results: Results, mech: MechanismInfo, figure: str | None) -> VariantSection:
    vs = variant_sweeps(results, mech)
    cost = mech.cost_factor_name or "cost factor"
    metrics = metric_panels([s for _, _, s in vs])
    all_metrics = [m for m, _ in metrics] + [b for _, b in metrics if b]
    rows = []
    for vname, title, s in vs:
        last = len(s.sizes) - 1
        cf = s.cost_factors[last] if s.cost_factors and last >= 0 and last < len(s.cost_factors) else None
        err = ""
        if s.error:
            err = f"failed at N = {fmt.pow2_text(s.error_n)}: {s.error}" if s.error_n else f"failed: {s.error}"
        rows.append(VariantRow(
            name=vname, title=title, fit=fmt.fit_text(s.fit), cost_fit=fmt.fit_text(s.cost_fit),
            sizes=_sizes_text(s.sizes), largest_n=fmt.pow2_text(s.sizes[last]) if s.sizes else fmt.DASH,
            t_largest=fmt.seconds_text(s.seconds[last]) if s.sizes else fmt.DASH,
            cost_largest=fmt.count_text(cf),
            metrics={m: fmt.count_text(s.metrics[m][last]) if m in s.metrics and s.sizes and last < len(s.metrics[m])
                     else fmt.DASH for m in all_metrics},
            crossover=crossover_text(results.comparison(mech.id, vname)), error=err,
            points=_points_text(s, cost)))
    swept = {v for v, _, _ in vs}
    not_swept = [v.name for v in mech.variants if v.name not in swept]
    return VariantSection(mech.id, anchor("variants", mech.id), mech.title, fmt.class_text(mech.complexity),
                          mech.cost_factor_name if any(s.cost_factors for _, _, s in vs) else "",
                          figure, rows, all_metrics, {m: b for m, b in metrics if b}, not_swept)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"variants": {mechanism id: its figure's file name}} for every mechanism with a variant view
    (has_variant_view); two ids with the same file-name slug get distinct names.

    >>> from reports.sections.variants import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'variants': {}}
    """
    results, files, taken = inputs.results, {}, set()
    for m in results.mechanisms:
        if not has_variant_view(results, m):
            continue
        name = f"variants_{style.slug(m.id)}.png"
        while name in taken:  # two ids with the same slug
            name = name[:-4] + "_.png"
        taken.add(name)
        note(f"figure: variants of {m.id}")
        files[m.id] = plot_variants(results, m, out_dir, name)
    return {"variants": files}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"variant_sections": a VariantSection per mechanism with a variant view, in record order}
    (the page's table of contents lists them too).

    >>> from reports.sections.variants import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {"variants": {}})
    {'variant_sections': []}
    """
    results = inputs.results
    return {"variant_sections": [variant_section(results, m, figures["variants"].get(m.id))
                                 for m in results.mechanisms if has_variant_view(results, m)]}
