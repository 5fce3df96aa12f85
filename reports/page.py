"""The page: a view model of a Results (plus asv history) rendered through Jinja2 templates.

``page_context`` turns the data into rows of ready text (units applied, fits formatted) and
``render_page`` fills ``templates/index.html.j2`` with it. Autoescaping is on for the templates,
so every value from the data (ids, check details, tracebacks, environment strings) is escaped;
the prose lives in the templates. The sections loop over Results.mechanisms and their variants:
a newly registered family appears with no change here.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from reports import format as fmt
from reports.asv_history import AsvHistory, MechanismHistory, mechanism_histories
from reports.figures import (default_sweep, has_variant_view, memory_curves, metric_panels, numerics_cells,
                             numerics_checks, numerics_totals, variant_sweeps)
from reports.peers import PeersSummary, peers_view
from reports.roofline import roofline_view
from reports.training import training_view
from reports.gpu import GpuRun, gpu_view
from results.check import CheckResult
from results.schema import Comparison, Fit, MechanismInfo, MemoryCurve, Results, SweepResult

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: The single figures of the page (reports.render.make_figures); a missing one reads "no data".
FIGURE_KEYS = ("gallery", "time", "crossover", "memory", "peers", "roofline", "favor", "numerics", "asv_history",
               "asv_track", "training_curves", "training_latent", "gpu_sweeps", "gpu_peers")


# ------------------------------------------------------------------------------- rows


@dataclass
class SummaryRow:
    id: str
    title: str
    source: str
    complexity: str
    exact: bool
    exponent: str
    exponent_note: str
    dense_exponent: str
    crossover: str
    crossover_note: str
    memory_fast: str
    memory_dense: str
    verify: str
    verify_class: str
    variants_anchor: str | None = None


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
    details: str


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


@dataclass
class NumericsDtype:
    """One dtype of a numerics/<id> row: counts in rows, as text."""

    dtype: str
    rows: str
    silent: str
    refusals: str
    disallowed: str
    errors: str
    worst: str
    failing: bool


@dataclass
class NumericsRow:
    id: str
    mechanism: str
    status: str
    dtypes: list[NumericsDtype]
    reasons: list[str]
    #: one entry per NumericsView.dtypes, None where this check has no cells of that dtype
    cells: list[NumericsDtype | None] = field(default_factory=list)


@dataclass
class NumericsView:
    rows: list[NumericsRow]
    dtypes: list[str]
    sizes: str
    dims: str
    stds: str
    tolerance: str


@dataclass
class HistoryView:
    results_dir: str
    files: int
    commits: list[tuple[str, str]]  # (short hash, date)
    rows: list[tuple[str, list[str]]]  # (mechanism, one cell per commit)
    notes: list[str]
    errors: list[str]
    figure: str | None
    track_figure: str | None
    track_benchmarks: list[str]
    mechanisms: int


# ------------------------------------------------------------------------------- helpers


def anchor(prefix: str, text: str) -> str:
    """An HTML id: "variants-tree-diam" (characters outside [A-Za-z0-9_-] become "_")."""
    return prefix + "-" + "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in text)


def _same(a, b) -> bool:
    try:
        return len(a) == len(b) and all(math.isclose(float(x), float(y), rel_tol=1e-12, abs_tol=0)
                                        for x, y in zip(a, b))
    except (TypeError, ValueError):
        return False


def exponent_note(results: Results, mech: MechanismInfo, sweep: SweepResult | None) -> str:
    """How the summary's exponent relates to complexity/<id>: the same sweep, or the check's own
    fit of a different sweep (stated with its value, so the two are not mistaken for one)."""
    cid = f"complexity/{mech.id}"
    chk = next((r for r in results.checks or [] if r.id == cid), None)
    if chk is None or sweep is None:
        return ""
    fast = chk.details.get("fast") if isinstance(chk.details, dict) else None
    if not isinstance(fast, dict):
        return f"{cid} recorded no sweep of its own"
    if fast.get("sizes") == list(sweep.sizes) and _same(fast.get("seconds", []), sweep.seconds):
        return f"the sweep {cid} tested"
    try:
        own = Fit.from_dict(fast.get("fit"))
    except (TypeError, ValueError):
        own = None
    return (f"{cid} timed a separate sweep: slope {fmt.fit_text(own)}" if own is not None
            else f"{cid} timed a separate sweep")


def crossover_text(c: Comparison | None) -> str:
    """"1,024 [800, 1,300]" (95% interval; "?" for a side that cannot be bounded) or "never"."""
    if c is None:
        return fmt.DASH
    if not fmt.finite(c.crossover):
        return "never"
    lo = "?" if c.crossover_low is None else fmt.n_text(c.crossover_low)
    hi = "?" if c.crossover_high is None else fmt.n_text(c.crossover_high)
    return f"{fmt.n_text(c.crossover)} [{lo}, {hi}]"


def crossover_note(c: Comparison | None) -> str:
    if c is None or not fmt.finite(c.crossover):
        return ""
    if c.extrapolated:
        return "extrapolated from the fits"
    if c.measured_crossover is not None:
        return f"timed: fast wins from N = {fmt.pow2_text(c.measured_crossover)}"
    return ""


def memory_text(c: MemoryCurve | None) -> str:
    """Peak extra memory at the largest measured N: "80 MiB at N = 2¹⁷" (≤ when only bounded)."""
    if c is None:
        return fmt.DASH
    if not c.points:
        return f"error: {c.error}" if c.error else fmt.DASH
    p = c.points[-1]
    return f"{'≤ ' if not p.resolved else ''}{fmt.bytes_text(p.peak_bytes)} at N = {fmt.pow2_text(p.n)}"


def verify_cell(results: Results, mech_id: str) -> tuple[str, str]:
    """(text, css class) summarising the checks about one mechanism."""
    if results.checks is None:
        return "not run", "skip"
    mine = results.checks_for(mech_id)
    if not mine:
        return "no checks", "skip"
    failed = [r.id for r in mine if r.status == "fail"]
    if failed:
        return f"FAIL: {', '.join(failed)}", "fail"
    passed = sum(r.status == "pass" for r in mine)
    skipped = len(mine) - passed
    return f"pass ({passed}{f', {skipped} skipped' if skipped else ''})", "pass" if passed else "skip"


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
    elif r.status == "skip" and d.get("reason"):
        out.append(str(d["reason"]))
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
        details=fmt.json_text(d) if d else "")


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


def _commit_dates(history: AsvHistory) -> dict[str, str]:
    out = {}
    for s in history.series:
        for c, ms in zip(s.commits, s.dates_ms):
            if ms:
                out[c] = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return out


def history_view(history: AsvHistory | None, histories: list[MechanismHistory], figure: str | None,
                 track_figure: str | None, track_benchmarks: list[str]) -> HistoryView | None:
    if history is None:
        return None
    dates = _commit_dates(history)
    rows = []
    for h in histories:
        cells = []
        for i in range(len(history.commits)):
            e = next((line.values[i] for line in h.exponent if line.values[i] is not None), None)
            t = next((line.values[i] for line in h.time if line.values[i] is not None), None)
            parts = [f"exp {e:.2f}" if e is not None else "", fmt.seconds_text(t) if t is not None else ""]
            cells.append(" · ".join(p for p in parts if p) or fmt.DASH)
        rows.append((h.mechanism, cells))
    notes = [f"{h.mechanism}: time at N = {fmt.pow2_text(h.time_n)}, {h.time_note}"
             for h in histories if h.time_n is not None and not h.time_note.startswith("largest")]
    return HistoryView(history.results_dir, history.files, [(c[:8], dates.get(c, "")) for c in history.commits],
                       rows, notes, history.errors, figure, track_figure, track_benchmarks, len(histories))


def numerics_view(results: Results) -> NumericsView | None:
    """The numerics/<id> table: per check and dtype, rows, silent errors, refusals (disallowed),
    errors and the worst row error, from the check's cells; None when the run has no such check."""
    checks = numerics_checks(results)
    if not checks:
        return None
    rows, all_dtypes, sizes, dims, stds, tol = [], [], set(), set(), set(), {}
    for r in checks:
        cells = numerics_cells(r)
        sizes |= {int(c["n"]) for c in cells}
        dims |= {int(c["d"]) for c in cells}
        stds |= {float(c["std"]) for c in cells}
        d = r.details if isinstance(r.details, dict) else {}
        if isinstance(d.get("tolerance"), dict):
            tol.update(d["tolerance"])
        dts = []
        for dtype, t in numerics_totals(cells).items():
            if dtype not in all_dtypes:
                all_dtypes.append(dtype)
            dts.append(NumericsDtype(
                dtype, fmt.count_text(t["rows"]), fmt.count_text(t["silent"]), fmt.count_text(t["refusals"]),
                fmt.count_text(t["disallowed"] + t["reference_disallowed"]),
                fmt.count_text(t["errors"]), fmt.number(t["worst_row_error"]),
                bool(t["silent"] or t["disallowed"] or t["reference_disallowed"] or t["errors"])))
        rows.append(NumericsRow(r.id, r.id.split("/", 1)[-1], r.status, dts,
                                check_reasons(r) if r.status != "pass" else []))
    for row in rows:
        row.cells = [next((c for c in row.dtypes if c.dtype == dt), None) for dt in all_dtypes]
    return NumericsView(rows, all_dtypes, ", ".join(fmt.pow2_text(n) for n in sorted(sizes)) or fmt.DASH,
                        ", ".join(str(d) for d in sorted(dims)) or fmt.DASH,
                        ", ".join(f"{s:g}" for s in sorted(stds)) or fmt.DASH,
                        ", ".join(f"{k} {fmt.number(v)}" for k, v in tol.items()) or fmt.DASH)


# ------------------------------------------------------------------------------- context


def _sweep_facts(results: Results) -> dict[str, str]:
    def joined(values) -> str:
        vals = sorted({str(v) for v in values if v is not None})
        return ", ".join(vals) or "?"

    fast = [s for s in results.sweeps]
    return {"threads": joined(s.threads for s in fast), "rounds": joined(s.rounds for s in fast),
            "device": joined(s.device for s in fast), "dtype": joined(s.dtype for s in fast)}


def page_context(results: Results, figures: dict[str, Any], history: AsvHistory | None,
                 histories: list[MechanismHistory], source: str, peers: PeersSummary | None = None,
                 gpu: GpuRun | None = None) -> dict[str, Any]:
    """Everything the template reads. ``figures``: {key: file name or None}; key "variants" maps
    mechanism id -> file name. ``source``: how the page names the results file it was made from.
    ``peers``: the peers summary (reports.peers.load_peers; None reads as "no peer run found").
    ``gpu``: the GPU run (reports.gpu.load_gpu; None reads as "no GPU run found")."""
    env = results.environment or {}
    figures = {**{k: None for k in FIGURE_KEYS}, "variants": {}, "track_benchmarks": [], "checks": [], **figures}
    variant_figs = figures["variants"]
    sections = [variant_section(results, m, variant_figs.get(m.id))
                for m in results.mechanisms if has_variant_view(results, m)]
    section_of = {s.id: s.anchor for s in sections}
    summary = []
    for m in results.mechanisms:
        fast, dense = default_sweep(results, m, "fast"), default_sweep(results, m, "dense")
        comp = results.comparison(m.id, m.default_variant)
        mem = memory_curves(results, m)
        text, cls = verify_cell(results, m.id)
        summary.append(SummaryRow(
            id=m.id, title=m.title, source=m.source, complexity=fmt.class_text(m.complexity), exact=m.exact,
            exponent=fmt.fit_text(fast.fit) if fast is not None else fmt.DASH,
            exponent_note="; ".join(filter(None, [
                f"t / {m.cost_factor_name or 'cost factor'}: {fmt.fit_text(fast.cost_fit)}"
                if fast is not None and fast.cost_fit is not None else "",
                exponent_note(results, m, fast)])),
            dense_exponent=(fmt.fit_text(dense.fit) if dense is not None else
                            ("no dense twin" if not m.has_dense else fmt.DASH)),
            crossover=crossover_text(comp) if comp is not None else ("no dense twin" if not m.has_dense else fmt.DASH),
            crossover_note=crossover_note(comp), memory_fast=memory_text(mem.get("fast")),
            memory_dense=memory_text(mem.get("dense")), verify=text, verify_class=cls,
            variants_anchor=section_of.get(m.id)))
    checks = [check_row(r) for r in results.checks] if results.checks is not None else None
    tally = None if checks is None else {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skip")}
    compare_missing = checks is not None and any(c.sign is None and c.threshold is not None for c in checks)
    env_rows = [(k, fmt.value_text(v)) for k, v in env.items()]
    if results.stage_seconds:
        env_rows.append(("stage wall times", ", ".join(f"{k} {fmt.seconds_text(v)}"
                                                        for k, v in results.stage_seconds.items())))
    gallery = results.gallery
    gallery_sizes = ""
    if gallery is not None and gallery.panels:
        by_n: dict[int, list[str]] = {}
        for p in gallery.panels:
            by_n.setdefault(p.n, []).append(p.id)
        gallery_sizes = (f"N = {gallery.n}" if set(by_n) <= {gallery.n} else
                         f"N = {gallery.n} requested; the nearest admissible size at or below it where needed ("
                         + "; ".join(f"N = {n}: {', '.join(ids)}" for n, ids in sorted(by_n.items(), reverse=True))
                         + ")")
    favor = results.favor_error
    favor_x2 = sum((a + b) ** 2 for a, b in zip(favor.x, favor.y)) if favor is not None else None
    methods = sorted({c.method for c in results.memory if c.method})
    memory_rows = [{"mechanism": c.mechanism, "variant": c.variant, "impl": c.impl, "method": c.method,
                    "points": ", ".join(f"{fmt.pow2_text(p.n)}: {'' if p.resolved else '≤ '}"
                                        f"{fmt.bytes_text(p.peak_bytes)}" for p in c.points) or fmt.DASH,
                    "error": c.error or ""} for c in results.memory]
    load_warning = env.get("load_warning")
    toc = [("summary", "Summary"), ("gallery", "What the masks look like"), ("time", "Time vs N"),
           ("crossover", "Speed-up and crossover"), ("memory", "Peak memory vs N"),
           ("peers", "Peers: maskbench beside other libraries"), ("roofline", "Roofline: fraction of this machine"),
           ("variants", "Variants of a mechanism"), ("verification", "Verification"),
           ("numerics", "Numerics: float32 and bfloat16 against float64"),
           ("favor", "FAVOR+ estimation error vs m"), ("training", "Training: learned latent graphs"),
           ("gpu", "GPU: tests, checks, time, memory and peers on CUDA"),
           ("history", "History across commits (asv)"),
           ("environment", "Environment")]
    return {
        "env": env, "mode": env.get("mode", "?"), "date": env.get("date", ""), "commit": env.get("git_commit", ""),
        "load_warning": fmt.value_text(load_warning) if load_warning else "",
        "source": source, "mechanisms": results.mechanisms, "summary": summary, "figures": figures,
        "sections": sections, "checks": checks, "tally": tally, "checks_note": results.checks_note,
        "compare_missing": compare_missing, "check_figures": figures["checks"], "env_rows": env_rows,
        "gallery": gallery, "gallery_sizes": gallery_sizes,
        "favor": favor, "favor_x2": favor_x2, "memory_methods": ", ".join(methods) or "none recorded",
        "memory_rows": memory_rows,
        "history": history_view(history, histories, figures.get("asv_history"), figures.get("asv_track"),
                                figures.get("track_benchmarks", [])),
        "sweep": _sweep_facts(results), "toc": toc, "schema": results.schema,
        "has_variants": bool(sections), "numerics": numerics_view(results),
        "peers": peers_view(peers), "roofline": roofline_view(results),
        "training": training_view(results), "gpu": gpu_view(gpu),
    }


def environment() -> jinja2.Environment:
    """The Jinja2 environment: templates/ of this package, autoescaping for *.html(.j2), strict
    undefined names (a typo in a template fails the render instead of printing nothing)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2"), default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(bytes=fmt.bytes_text, seconds=fmt.seconds_text, num=fmt.number, pow2=fmt.pow2_text,
                       fit=fmt.fit_text, ntext=fmt.n_text)
    return env


def render_page(results: Results, figures: dict[str, Any], history: AsvHistory | None = None,
                histories: list[MechanismHistory] | None = None, source: str = "results.json",
                peers: PeersSummary | None = None, gpu: GpuRun | None = None) -> str:
    """index.html as a string (``histories`` default: mechanism_histories of ``history``)."""
    if histories is None:
        histories = mechanism_histories(history, [m.id for m in results.mechanisms]) if history is not None else []
    ctx = page_context(results, figures, history, histories, source, peers, gpu)
    return environment().get_template("index.html.j2").render(**ctx)
