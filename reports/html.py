"""The report page: one self-contained index.html (inline CSS) referencing the PNGs beside it.

Every piece of text that comes from data (ids, sources, check details, environment values) goes
through ``html.escape``: check details can hold tracebacks with <, > and &.
"""
from __future__ import annotations

import html
import json
import math

from reports.data import ReportData
from reports.favor import FavorError
from reports.gallery import MaskGallery
from reports.memory import MemoryCurve, mib_text
from reports.sweeps import ImplTiming, MechanismTiming
from reports.trees import CLAIMED, TreeCurve, TreeMasks, depth_bound
from verify.result import CheckResult

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto; max-width: 1250px;
       color: #222; line-height: 1.45; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { background: #dff3df; color: #135f13; } .fail { background: #f8d7d7; color: #8a1010; font-weight: bold; }
.skip { background: #eee; color: #666; } .muted { color: #777; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 70em; }
pre { background: #f7f7f7; padding: 0.5em; overflow-x: auto; font-size: 0.85em; max-width: 60em; }
details summary { cursor: pointer; color: #245; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def esc(x) -> str:
    """HTML-escape anything (None -> "")."""
    return "" if x is None else html.escape(str(x), quote=True)


def _num(x, fmt: str = ".3g") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return esc(x)
    if isinstance(x, (int, float)):
        return format(x, fmt)
    return esc(x)


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Rows are lists of ready HTML cells ("<td>...</td>"); the head is escaped here."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "\n".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{th}</tr></thead><tbody>\n{body}\n</tbody></table>'


def _td(text: str = "", cls: str = "", raw: bool = False) -> str:
    content = text if raw else esc(text)
    return f'<td class="{esc(cls)}">{content}</td>' if cls else f"<td>{content}</td>"


def _figure(src: str | None, caption: str, alt: str) -> str:
    if src is None:
        return f'<p class="muted">No data for this figure in this run. {caption}</p>'
    return f'<figure><img src="{esc(src)}" alt="{esc(alt)}"><figcaption>{caption}</figcaption></figure>'


# ------------------------------------------------------------------------------- sections


def _environment(data: ReportData) -> str:
    env = dict(data.environment)
    rows = [[_td(k), _td(v if v is not None else "–")] for k, v in env.items()]
    if data.stage_seconds:
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in data.stage_seconds.items())
        rows.append([_td("stage wall times"), _td(stages)])
    return _table(["", "value"], rows)


def exponent_cell(it: ImplTiming | None) -> str:
    """"1.03 [0.98, 1.08]" or a dash."""
    if it is None:
        return "–"
    if it.fit is None:
        return "too few sizes"
    f = it.fit
    return f"{f.slope:.2f} [{f.low:.2f}, {f.high:.2f}]"


def crossover_cell(t: MechanismTiming | None) -> str:
    """The crossover estimate, and the timed N from which fast wins (if inside the range)."""
    if t is None:
        return "–"
    if t.dense is None:
        return "no dense twin"
    if t.crossover is None:
        return "never"
    text = f"{t.crossover:,.0f}"
    if t.measured_crossover is not None:
        text += f" (timed: fast wins from {t.measured_crossover:,})"
    else:
        text += " (extrapolated)"
    return text


def memory_cell(curve: MemoryCurve | None) -> str:
    """Peak extra memory at the largest measured N, e.g. "80.0 MiB @ 131,072"."""
    if curve is None:
        return "–"
    if not curve.points:
        return "error" if curve.error else "–"
    p = curve.points[-1]
    mark = "" if p.resolved else " (≤, not resolved)"
    return f"{mib_text(p.peak_mib)} @ {p.n:,}{mark}"


def verify_cell(data: ReportData, mech_id: str) -> tuple[str, str]:
    """(text, css class) summarising the checks about one mechanism."""
    if data.verify is None:
        return "not run", "skip"
    mine = data.checks_for(mech_id)
    if not mine:
        return "no checks", "skip"
    failed = [r.id for r in mine if r.status == "fail"]
    if failed:
        return f"FAIL: {', '.join(failed)}", "fail"
    passed = sum(r.status == "pass" for r in mine)
    skipped = len(mine) - passed
    return f"pass ({passed}{f', {skipped} skipped' if skipped else ''})", "pass" if passed else "skip"


def _summary(data: ReportData) -> str:
    head = ["id", "source", "claimed class", "fast exponent [95% CI]", "dense exponent [95% CI]",
            "crossover N", "fast peak memory", "dense peak memory", "verify"]
    rows = []
    for m in data.mechanisms:
        t = data.timings.get(m.id)
        mem = data.memory.get(m.id, {})
        text, cls = verify_cell(data, m.id)
        rows.append([
            f'<td title="{esc(m.title)}"><code>{esc(m.id)}</code></td>', _td(m.source), _td(m.complexity),
            _td(exponent_cell(t.fast if t else None), "num"),
            _td(exponent_cell(t.dense if t else None) if (t and t.dense) else "–", "num"),
            _td(crossover_cell(t), "num"), _td(memory_cell(mem.get("fast")), "num"),
            _td(memory_cell(mem.get("dense")), "num"), _td(text, cls)])
    return _table(head, rows)


def _memory_details(data: ReportData) -> str:
    rows = []
    for m in data.mechanisms:
        for impl, c in data.memory.get(m.id, {}).items():
            pts = ", ".join(f"{p.n:,}: {p.peak_mib:.3g}{'' if p.resolved else '*'}" for p in c.points)
            rows.append([_td(m.id), _td(impl), _td(pts or "–"), _td(c.error or "")])
    if not rows:
        return ""
    return ("<details><summary>peak memory per N (MiB; * = not resolved)</summary>"
            + _table(["mechanism", "impl", "N: MiB", "error"], rows) + "</details>")


def verify_table(results: list[CheckResult]) -> str:
    """Figure 4: the verify results, status coloured, details collapsible."""
    rows = []
    for r in results:
        details = json.dumps(r.details, indent=1, default=str) if r.details else ""
        det = (f"<details><summary>details</summary><pre>{esc(details)}</pre></details>" if details else "")
        rows.append([f'<td><code>{esc(r.id)}</code><br><span class="muted">{esc(r.title)}</span></td>',
                     _td(r.source), _td(r.kind), _td(r.status.upper() if r.status == "fail" else r.status, r.status),
                     _td(_num(r.statistic), "num"), _td(_num(r.threshold), "num"),
                     _td(f"{r.seconds:.1f}", "num"), _td(det, raw=True)])
    n = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    tally = f"<p>{n['pass']} passed, {n['fail']} failed, {n['skip']} skipped.</p>"
    return tally + _table(["id", "source", "kind", "status", "statistic", "threshold", "seconds", "details"], rows)


def _favor_caption(f: FavorError) -> str:
    x2 = sum((a + b) ** 2 for a, b in zip(f.x, f.y))
    fits = "; ".join(f"{c.kind} slope {c.slope:.3f} [{c.slope_low:.3f}, {c.slope_high:.3f}]" for c in f.curves)
    return (f"RMSE of the FAVOR+ estimate phi(x)·phi(y) of SM(x, y) = exp(x·y) for one fixed pair in R^{len(f.x)} "
            f"(|x+y|² = {x2:.3f}), over {f.draws} independent projections per m (seeded NumPy Generators, "
            "reference.features), with 95% CLT intervals on the mean squared error. The black line is the "
            "predicted RMSE sqrt(Var), Var = (1/m) exp(|x+y|²) SM(x,y)² (1 − exp(−|x+y|²)) (Performer; "
            "wu22 Lemma 1), a slope of −1/2: iid points should scatter around it, orthogonal ones on or "
            "below it (lower variance). The empirical RMSE of a heavy-tailed estimator tends to sit slightly "
            f"below its true value for finite draws. Fitted log-log slopes: {esc(fits)}.")


def _asv_section(data: ReportData, src: str | None) -> str:
    h = data.asv
    if h is None or not h.series:
        where = esc(h.results_dir) if h is not None else ".asv/results"
        msg = (f"<p>No asv results found under <code>{where}</code>. Create them with <code>make bench</code> "
               "(asv run against the installed project, saved under the current commit), once per commit "
               "you want on the chart, then rerun <code>make report</code>.</p>")
        if h is not None and h.errors:
            msg += "<pre>" + esc("\n".join(h.errors)) + "</pre>"
        return msg
    cap = (f"{h.files} asv result file(s), {len(h.commits)} commit(s), {len(h.series)} series from "
           f"<code>{esc(h.results_dir)}</code>. One panel per time_ benchmark (seconds, log axis), x: commits "
           "in commit-date order; one line per implementation at its largest N, where the asymptotic cost "
           "shows (every N, and the peakmem_ and track_ series, are in results.json). asv runs every "
           "parameter in its own process (spread up to 2x here): use it for history and the in-process "
           "sweeps above for exponents.")
    if len(h.commits) == 1:
        cap += (" Only one commit has results so far; run <code>make bench</code> on later commits to "
                "turn the points into a history.")
    if h.errors:
        cap += " Unreadable files: " + esc("; ".join(h.errors))
    return _figure(src, cap, "asv history")


def _gallery_sizes(g: MaskGallery) -> str:
    """"N = 64" or, where some mechanisms needed another admissible size, which used which."""
    by_n: dict[int, list[str]] = {}
    for p in g.panels:
        by_n.setdefault(p.n, []).append(p.id)
    if set(by_n) <= {g.n}:
        return f"N = {g.n}"
    used = "; ".join(f"N = {n}: {', '.join(ids)}" for n, ids in sorted(by_n.items(), reverse=True))
    return f"N = {g.n} requested, the nearest admissible size at or below it used ({used})"


def gallery_section(g: MaskGallery | None, src: str | None) -> str:
    """The mask gallery: figure, caption, failures in plain view, summary numbers in a details."""
    if g is None:
        return "<p class='muted'>No mask gallery in this run.</p>"
    if not g.panels:
        return "<p class='muted'>No registered mechanism has a dense mask.</p>"
    cap = (
        "What each mechanism computes is out_i = Σ_j M_ij K(q_i, k_j) v_j / Σ_j M_ij K(q_i, k_j): the mask "
        "M (N × N, non-negative) weighs how much key j contributes to query i; the sub-quadratic fast paths "
        "apply it without ever forming it. Each panel is the exact dense mask from "
        "<code>reference/</code> (the mechanism's <code>dense_mask</code> on its own "
        f"<code>make_problem(N, seed={esc(g.seed)})</code>, so data-dependent masks show one draw) for a "
        f"small instance, {esc(_gallery_sizes(g))}. Rows: query i (top to bottom); columns: key j. Colour: "
        "viridis on a linear scale normalised per panel to [0, max M] (each colorbar gives its max), so "
        "masks spanning orders of magnitude (exponential decay) show their small entries near 0: min, max "
        "and the fraction of nonzero entries are in the table below and in results.json (mask_gallery).")
    if g.without_mask:
        cap += f" No dense mask registered (not drawn): {esc(', '.join(g.without_mask))}."
    if g.errors:
        cap += " Red panels: building the mask raised; the message is in the panel and below."
    parts = [_figure(src, cap, "mask gallery")]
    if g.note:
        parts.append(f"<p class='muted'>{esc(g.note)}</p>")
    if g.errors:
        items = "".join(f"<li><code>{esc(p.id)}</code> (N = {p.n}): <code>{esc(p.error)}</code></li>" for p in g.errors)
        parts.append(f"<div class='fail'><p>dense_mask failed for {len(g.errors)} mechanism(s):</p>"
                     f"<ul>{items}</ul></div>")
    rows = [[_td(p.id), _td(p.n, "num"), _td(_num(p.min), "num"), _td(_num(p.max), "num"),
             _td(_num(p.nonzero_fraction, ".4f"), "num"), _td(p.error or p.note or "", "fail" if p.error else "")]
            for p in g.panels]
    parts.append("<details><summary>mask summaries</summary>"
                 + _table(["mechanism", "N", "min M", "max M", "fraction nonzero", "error / note"], rows)
                 + "</details>")
    return "\n".join(parts)


def _seconds_text(t: float) -> str:
    """"0.42 ms", "1.3 s": a duration at three significant digits."""
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def _fit_text(c: TreeCurve) -> str:
    if c.fit is None:
        return "–"
    return f"{c.fit.slope:.2f} [{c.fit.low:.2f}, {c.fit.high:.2f}]"


def _pow2(n: int | None) -> str:
    if n is None:
        return "–"
    n = int(n)
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else f"{n:,}"


def _tree_fit_table(t: TreeMasks) -> str:
    rows = []
    for c in t.curves:
        last = c.sizes[-1] if c.sizes else None
        diam = t.diameter(c.family, last) if last else None
        diam_fit = (f"{c.diam_fit.slope:.2f} [{c.diam_fit.low:.2f}, {c.diam_fit.high:.2f}]"
                    if c.diam_fit is not None else "–")
        note = []
        if c.skip_reason and c.skipped:
            note.append(f"not timed at N = {', '.join(_pow2(n) for n in c.skipped)}: {c.skip_reason}")
        if c.error:
            note.append(f"FAILED: {c.error}")
        rows.append([f"<td><code>{esc(c.operator)}</code></td>", _td(CLAIMED.get(c.operator, "?")), _td(c.family),
                     _td(_fit_text(c), "num"), _td(c.fit_rule), _td(diam_fit, "num"), _td(_pow2(last), "num"),
                     _td(_seconds_text(c.seconds[-1]) if c.seconds else "–", "num"),
                     _td("–" if diam is None else diam, "num"), _td("; ".join(note), "fail" if c.error else "")])
    return _table(["operator", "claims O(·)", "family", "exponent [95% CI]", "points fitted",
                   "exponent of t / diam", "largest N", "t at largest N", "diam at largest N", "note"], rows)


def _tree_depth_table(t: TreeMasks) -> str:
    rows = []
    for d in t.depths:
        for n, depth, subs, blocks in zip(d.sizes, d.recursion_depth, d.num_subproblems, d.num_dense_blocks):
            bound = depth_bound(n)
            rows.append([_td(d.family), _td(_pow2(n), "num"), _td(depth, "num" + ("" if depth <= bound else " fail")),
                         _td(f"{bound:.1f}", "num"), _td(subs, "num"), _td(blocks, "num")])
    return _table(["family", "N", "recursion depth", "bound log₁.₅ N", "subproblems", "dense blocks"], rows)


def _tree_points_table(t: TreeMasks) -> str:
    rows = []
    for c in t.curves:
        pts = ", ".join(f"{_pow2(n)}: {_seconds_text(s)} ({r})" for n, s, r in zip(c.sizes, c.seconds, c.rounds))
        setup = ", ".join(f"{_pow2(n)}: {_seconds_text(s)}" for n, s in zip(c.sizes, c.setup_seconds))
        rows.append([_td(c.operator), _td(c.family), _td(pts or "–"), _td(setup or "–")])
    return _table(["operator", "family", "N: seconds per product (timed rounds)", "N: setup seconds (untimed)"], rows)


def trees_section(t: TreeMasks | None, figures: dict[str, str | None]) -> str:
    """Tree masks: what is timed, the three figures, the fitted exponents, failures in plain view."""
    if t is None:
        return ("<p class='muted'>The tree-mask stage was not run (<code>--skip-trees</code>, or a results.json "
                "written before it existed).</p>")
    grid = f"N = {_pow2(min(t.sizes))} … {_pow2(max(t.sizes))}" if t.sizes else "no N"
    intro = (
        "Each tree operator of <code>fast.masks.tree</code> timed alone on each tree family: what is timed is one "
        f"mask product M x (<code>op.matmul(x)</code>) with x of shape (N, {esc(t.columns)}) float32, i.e. "
        f"{esc(t.columns)} columns, on {esc(t.device)} with torch threads pinned to {esc(t.threads)} (single "
        "thread), in inference mode; building the forest and the operator (TreeDCMask plans its recursion "
        "there) is set-up and not timed. Each point is the minimum over up to "
        f"{esc(t.rounds)} rounds after one warm-up call (a round repeats the call for at least 20 ms and takes "
        f"the mean per call; rounds stop once a point has used {t.point_budget_s:g} s, at least one round). "
        f"{esc(grid)}, powers of two; one tree per family: <b>path</b> (diam N − 1), <b>star</b> (diam 2), "
        "<b>caterpillar</b> (a spine of N/2 nodes with one leaf each, diam ≈ N/2), <b>complete binary</b> "
        "(heap order, diam ≈ 2 log₂ N) and <b>random recursive</b> (node i joins a uniformly drawn earlier "
        "node; depth ≈ e ln N). Claimed classes: <code>tree-exp</code> (TreeExpMask, choromanski22 Lemma 3.5, "
        f"M_ij = exp(a dist + b) with a = {t.exp_a:g}, b = {t.exp_b:g}, unit edge lengths) <b>O(N)</b>; "
        "<code>tree-dc</code> (TreeDCMask, Lemma 6.1, any f, balanced separator recursion with FFT Hankel "
        f"cross terms; here {esc(t.f)}) <b>O(N log² N)</b>; <code>tree-diam</code> (TreeDiamMask, Lemma 6.2, "
        "same f, depth arrays) <b>O(N · diam)</b>, so O(N²) on paths and caterpillars and O(N log N) on "
        f"binary trees. Stage wall time {t.seconds:.1f} s.")
    parts = [f"<p>{intro}</p>"]
    if t.errors:
        items = "".join(f"<li><code>{esc(c.operator)}</code> on {esc(c.family)}: <code>{esc(c.error)}</code> "
                        "(larger N not tried)</li>" for c in t.errors)
        parts.append(f"<div class='fail'><p>{len(t.errors)} (operator, family) pair(s) failed:</p>"
                     f"<ul>{items}</ul></div>")
    level_note = ""
    path_exp = t.curve("tree-exp", "path")
    if path_exp is not None and path_exp.sizes:
        n, s = path_exp.sizes[-1], path_exp.seconds[-1]
        level_note = (f" (here tree-exp on a path at N = {_pow2(n)}: {_seconds_text(s)}, "
                      f"{s / (2 * n) * 1e6:.1f} µs per level and pass)")
    cap1 = (
        "Seconds per product vs N, log-log, one panel per operator, one colour (and marker) per family. Filled "
        "points enter the least-squares fit of log t on log N (<code>verify.timing.fit_exponent</code>; legend: "
        "slope with its 95% t-interval); hollow points took under 1 ms and are left out while at least 4 "
        "points remain, otherwise every point is fitted: such a slope mostly measures fixed per-call overheads "
        "(read it as flat, not as a sub-linear class). Grey guides ∝ N (dashed) and ∝ N² (dotted) pass "
        "through the geometric-mean time at the middle N. "
        f"<b>tree-diam on path and caterpillar is timed only up to N = {_pow2(t.diam_chain_max)}</b>: it is "
        "O(N²) there (diam ~ N), as the panel notes. How to read it: slope 1 is linear; O(N log² N) has local "
        "slope 1 + 2/ln N (1.36 at N = 2⁸, 1.17 at 2¹⁷) when its FFTs dominate; O(N · diam) is slope 2 on paths "
        "and caterpillars, about 1 on stars, binary and random recursive trees. tree-exp and tree-diam work "
        "level by level (a few tensor operations per depth), so on deep trees a fixed per-level cost "
        f"multiplies the height{level_note}: tree-exp stays linear but is far slower on paths than on shallow "
        "trees, and at small N tree-diam on a path pays mostly that cost, so its slope approaches 2 only as N "
        "grows.")
    parts.append(_figure(figures.get("tree_timing"), cap1, "tree masks: time vs N per family"))
    parts.append(_tree_fit_table(t))
    cap2 = (
        "The diam factor of Lemma 6.2. Left: tree-diam's time on a path (diam N − 1) over its time on a "
        "complete binary tree (diam ≈ 2 log₂ N) at the same N, with the diameter ratio (black): if the cost "
        "is O(N · diam) the two grow alike, up to constants (fixed per-call and per-level costs bend either "
        "time at small N, so compare the slopes at the larger N); tree-dc's ratio (grey, dashed) for contrast, "
        "whose cost does not depend on the diameter. "
        "Right: tree-diam's t / (N · diam) per family in ns, flat when the time is proportional to N · diam; "
        "legend: fitted exponent of t / diam vs N (1 for O(N · diam)). The verify check "
        "<code>choromanski22/lemma-6.2-diam</code> tests the left panel's slope.")
    parts.append(_figure(figures.get("tree_diam"), cap2, "tree-diam: path vs binary tree"))
    recorded = [d for d in t.depths if d.sizes]
    within = ("no recursion recorded (tree-dc not run or failed)" if not recorded else
              "yes" if all(d.within_bound() for d in recorded) else "NO")
    thr = f" = {t.dense_threshold}" if t.dense_threshold else ""
    cap3 = (
        "TreeDCMask plans its recursion once: a centroid v splits a tree into two parts sharing v, each of at "
        f"most 2(|T| − 1)/3 + 1 nodes, and parts of at most dense_threshold{esc(thr)} nodes become dense blocks. "
        "Left: the recursion depth (levels of splits) vs N per family against the bound log₁.₅ N (black) that "
        "the balanced split guarantees (choromanski22 Lemma 6.1; <code>choromanski22/lemma-6.1</code> checks it "
        "at N = 200); depths are integers, each family's line is shifted by at most a quarter of a level so "
        "equal depths stay apart (exact values in the table below). Right: the number of subproblems "
        "(splits plus dense blocks), which grows ∝ N / dense_threshold. "
        f"Every recorded depth within the bound: <b>{within}</b>.")
    parts.append(_figure(figures.get("tree_depth"), cap3, "TreeDCMask recursion depth vs N"))
    if t.depths:
        parts.append("<details><summary>recursion depth per family and N</summary>" + _tree_depth_table(t)
                     + "</details>")
    parts.append("<details><summary>every timed point</summary>" + _tree_points_table(t) + "</details>")
    return "\n".join(parts)


def build_page(data: ReportData, figures: dict[str, str | None]) -> str:
    """The whole index.html as a string."""
    env = data.environment
    mode = esc(env.get("mode", "?"))
    threads = esc(env.get("sweep_threads", 1))
    timing_cap = (
        "Median seconds per call vs N, log-log, one panel per mechanism (blue: fast path, red: dense "
        "O(N²) torch twin). Each (mechanism, implementation) is timed in one process, all N interleaved "
        f"over {esc(env.get('sweep_rounds', '?'))} rounds, torch threads pinned to {threads}. Filled "
        "points enter the least-squares fit of log t on log N (legend: slope with its 95% t-interval); "
        "hollow points took under 1 ms, are dominated by fixed overheads and are left out (the largest 4 "
        "are always kept). How to read it: the slope is the exponent; a slope of 1 means doubling N "
        "doubles the time (O(N)), a slope of 2 means it quadruples (O(N²)). O(N log N) has local slope "
        "1 + 1/ln N (1.14 at N = 2¹⁰, 1.09 at N = 2¹⁷), so it cannot be told from O(N) by slope alone: "
        "the grey guides ∝ N (dashed), ∝ N log N (dash-dot) and ∝ N² (dotted) pass through the middle "
        "fast point for comparison.")
    methods = sorted({c.method for curves in data.memory.values() for c in curves.values() if c.method})
    memory_cap = (
        "Peak extra memory of one call vs N (MiB, log-log; blue fast path, red dense twin). Method: one "
        "subprocess per (mechanism, implementation) runs the sizes in increasing order; for each N it builds "
        "inputs and operators (untimed setup), takes the current RSS as the baseline (after imports and "
        "problem setup), runs the call once and reads the peak RSS; the point is peak − baseline. Which peak: "
        "getrusage(RUSAGE_SELF).ru_maxrss never decreases within a process, so setup temporaries (a dense "
        "twin builds its mask in float64 first) and earlier sizes can hide a call's peak, and on Linux it "
        "also carries the parent's peak across fork/exec (the report process's, after the sweeps). Where "
        "Linux allows, the child therefore reads its own high-water mark (VmHWM) and resets it to the "
        "current RSS just before each call (/proc/self/clear_refs), so every point is independent; "
        "elsewhere it falls back to ru_maxrss, and a size whose peak stays below the running maximum is "
        "drawn hollow (not resolved, an upper bound). Caveats: the allocator may keep freed memory (the "
        "child makes glibc mmap buffers of 64 KiB and more, so they are returned on free); resolution is a "
        "page; a warm-up call at a small N keeps one-time library initialisation out of the first point, "
        "and the smallest N are at the noise floor (a few MiB of library arenas). A slope of 1 is memory "
        "linear in N; the dense twin's slope 2 is its N×N matrices (grey guides: ∝ N through the fast "
        "path's largest point, ∝ N² through the dense twin's). On CUDA, "
        "torch.cuda.max_memory_allocated is used instead. "
        f"Method used in this run: {esc(', '.join(methods) or 'none')}.")
    cross_cap = (
        "Left: the crossover N above which the fast path beats its dense twin (verify.timing.crossover: "
        "log-log interpolation of the measured ratio where it crosses 1, the smallest common N if fast "
        "already wins there, otherwise the fitted lines extrapolated; such bars are hatched). Right: the "
        "measured speed-up t_dense / t_fast at every N both were timed at; above the black line the fast "
        "path wins. For a linear fast path against a quadratic twin the ratio grows about ∝ N (slope 1).")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>maskbench report ({mode})</title><style>{CSS}</style></head><body>",
        f"<h1>maskbench report</h1><p class='muted'>{mode} run, {esc(env.get('date', ''))}, "
        f"{len(data.mechanisms)} registered mechanisms. Reference: dense NumPy ground truth; fast: PyTorch "
        "masked linear attention at sub-quadratic cost. All numbers are in <code>results.json</code> "
        "next to this page.</p>",
        "<h2>Environment</h2>", _environment(data),
        f"<p>Timings: torch threads pinned to {threads} for every sweep and fit (docs/methods.md); the machine's "
        f"default is {esc(env.get('threads', '?'))} threads on {esc(env.get('cpus', '?'))} CPUs. "
        "Multi-thread numbers are not part of this report.</p>",
        "<h2>Summary</h2>", _summary(data),
        "<p class='muted'>Exponents: least-squares slope of log t on log N with its 95% t-interval. "
        "Crossover: see figure 3. Peak memory: extra memory of one call at the largest measured N "
        "(figure 2). Verify: the checks whose id ends in the mechanism id (equivalence/, complexity/, "
        "scale/).</p>",
        "<h2>Masks M (gallery)</h2>", gallery_section(data.gallery, figures.get("gallery")),
        "<h2>1. Time vs N</h2>", _figure(figures.get("timing"), timing_cap, "time vs N"),
        "<h2>2. Peak memory vs N</h2>", _figure(figures.get("memory"), memory_cap, "memory vs N"),
        _memory_details(data),
        "<h2>3. Crossover</h2>", _figure(figures.get("crossover"), cross_cap, "crossover"),
        "<h2>4. Verification</h2>",
    ]
    if data.verify_note:
        parts.append(f"<p class='muted'>{esc(data.verify_note)}</p>")
    parts.append(verify_table(data.verify) if data.verify is not None else
                 "<p>Verification was not run (<code>--skip-verify</code>). Run <code>python -m verify</code>.</p>")
    parts += ["<h2>5. FAVOR+ estimation error vs m</h2>",
              _figure(figures.get("favor"), _favor_caption(data.favor) if data.favor else "", "FAVOR+ error"),
              "<h2>6. Benchmark history (asv)</h2>", _asv_section(data, figures.get("asv")),
              "<h2>7. Tree masks: time vs N per tree family</h2>", trees_section(data.trees, figures),
              "<p class='muted'>Regenerate with <code>make report</code> (<code>python -m reports [--quick] "
              "[--out DIR]</code>).</p></body></html>"]
    return "\n".join(parts)
