"""Section "Summary": one row per registered mechanism: its claimed class, the fitted exponents of
its fast path and dense twin, the crossover N, peak memory at the largest N and whether every
check about it passed. The numbers are the other sections' (time, crossover, memory,
verification), read through their public helpers.

>>> from reports.sections.summary import ID, TITLE
>>> ID, TITLE
('summary', 'Summary')
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reports import format as fmt
from reports.sections import PageInputs
from reports.sections.crossover import crossover_note, crossover_text
from reports.sections.memory import memory_curves, memory_text
from reports.sections.time_vs_n import default_sweep
from reports.sections.variants import anchor, has_variant_view
from results.schema import Fit, MechanismInfo, Results, SweepResult

ID = "summary"
TITLE = "Summary"
FIGURES: dict[str, Any] = {}


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
    sizes = fast.get("sizes") or []
    at = {n: t for n, t in zip(sweep.sizes, sweep.seconds)}
    if sizes and all(n in at for n in sizes) and _same(fast.get("seconds", []), [at[n] for n in sizes]):
        # the same sweep judged at the check's own grid (a quick check in a full report)
        what = f"{cid} tested this sweep at N = {fmt.pow2_text(min(sizes))}-{fmt.pow2_text(max(sizes))}"
        return f"{what}: slope {fmt.fit_text(own)}" if own is not None else what
    return (f"{cid} timed a separate sweep: slope {fmt.fit_text(own)}" if own is not None
            else f"{cid} timed a separate sweep")


def verify_cell(results: Results, mech_id: str) -> tuple[str, str]:
    """(text, css class) summarising the checks about one mechanism: "FAIL: ids" (fail), "inconclusive:
    ids (n passed)" (unsettled: amber, neither pass nor fail), "pass (n, k skipped)" (pass).

    >>> from reports.sections.summary import verify_cell
    >>> from results.schema import Results
    >>> verify_cell(Results({}), "causal")
    ('not run', 'skip')
    """
    if results.checks is None:
        return "not run", "skip"
    mine = results.checks_for(mech_id)
    if not mine:
        return "no checks", "skip"
    failed = [r.id for r in mine if r.status == "fail"]
    if failed:
        return f"FAIL: {', '.join(failed)}", "fail"
    passed = sum(r.status == "pass" for r in mine)
    unsettled = [r for r in mine if r.status not in ("pass", "fail", "skip")]  # e.g. "inconclusive": amber
    if unsettled:
        return (f"{unsettled[0].status}: {', '.join(r.id for r in unsettled)} ({passed} passed)", "unsettled")
    skipped = len(mine) - passed
    return f"pass ({passed}{f', {skipped} skipped' if skipped else ''})", "pass" if passed else "skip"


def summary_row(results: Results, m: MechanismInfo) -> SummaryRow:
    """The summary's row of one mechanism (its default variant; "no dense twin" where it has none).

    >>> from reports.sections.summary import summary_row
    >>> from results.schema import Results, MechanismInfo
    >>> summary_row(Results({}), MechanismInfo("causal", "Causal", "paper", "N^2")).complexity
    'N²'
    """
    fast, dense = default_sweep(results, m, "fast"), default_sweep(results, m, "dense")
    comp = results.comparison(m.id, m.default_variant)
    mem = memory_curves(results, m)
    text, cls = verify_cell(results, m.id)
    return SummaryRow(
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
        variants_anchor=anchor("variants", m.id) if has_variant_view(results, m) else None)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """No figure of its own.

    >>> from reports.sections.summary import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {}
    """
    return {}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"summary": a SummaryRow per mechanism, in record order}.

    >>> from reports.sections.summary import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'summary': []}
    """
    return {"summary": [summary_row(inputs.results, m) for m in inputs.results.mechanisms]}
