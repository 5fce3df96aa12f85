"""Section "Numerics": the numerics/<id> checks, float32 and bfloat16 against float64, as heatmaps
(one panel per mechanism and dtype) and a table of counts per check and dtype.

>>> from reports.sections.numerics import ID, TITLE
>>> ID, TITLE
('numerics', 'Numerics: float32 and bfloat16 against float64')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np

from reports import format as fmt
from reports import style
from reports.sections import PageInputs
from reports.sections.verification import check_reasons
from results.check import CheckResult
from results.schema import Results, num

ID = "numerics"
TITLE = "Numerics: float32 and bfloat16 against float64"
FIGURES: dict[str, Any] = {"numerics": None}

#: The counts of a numerics cell (verify/checks/numerics.py), summed by numerics_totals.
NUMERICS_COUNTS = ("rows", "silent", "refusals", "disallowed", "errors", "unjudged", "reference_refusals",
                   "reference_disallowed")

#: Colours of the numerics heatmap: refusal rate in blues, silent-error rate in reds (a cell
#: with any silent error or error is drawn in reds: those are the worse failure), on a power
#: scale so that one row in 512 is already visible.
NUMERICS_REFUSAL_CMAP = "Blues"

NUMERICS_ERROR_CMAP = "Reds"

NUMERICS_GAMMA = 0.3


#: How the results JSON writes non-finite numbers (results.schema).
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


def numerics_clean(cells: list[dict]) -> bool:
    """True when every cell reads "0" (nothing refused, silently wrong or raised): such a panel is
    folded into one line of text instead of drawn.

    >>> from reports.sections.numerics import numerics_clean
    >>> numerics_clean([{"refusals": 0, "silent": 0, "errors": 0}]), numerics_clean([])
    (True, False)
    """
    return bool(cells) and not any(c.get("refusals") or c.get("silent") or c.get("errors") or c.get("disallowed")
                                   or c.get("reference_disallowed") for c in cells)


def numerics_label(cell: dict) -> str:
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
    errors; its text gives the counts (numerics_label) and a red frame marks a cell that fails
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
    # all-zero panels are folded into one line on the page (numerics_view), not drawn
    panels = [p for p in panels if not numerics_clean(p[2])][:style.MAX_PANELS]
    if not panels:
        return None
    fig, axes = style.grid(len(panels), ncols=4, w=3.2, h=2.7)
    norm = PowerNorm(NUMERICS_GAMMA, vmin=0.0, vmax=1.0)
    blues, reds = plt.get_cmap(NUMERICS_REFUSAL_CMAP), plt.get_cmap(NUMERICS_ERROR_CMAP)
    for ax, (r, dtype, cells) in zip(axes, panels):
        mech = r.id.split("/", 1)[-1]
        if not cells:
            reasons = (r.details or {}).get("reasons") if isinstance(r.details, dict) else None
            text = "; ".join(str(x) for x in reasons or []) or "no cells recorded"
            style.no_data(ax, text)
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
                label = numerics_label(c)
                ax.text(j, i, label, ha="center", va="center", fontsize=6.5,
                        color="white" if dark else ("0.55" if label == "0" else "black"))
                if numerics_failing(c):
                    ax.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, ec="tab:red", lw=1.8))
        ax.set_xticks(range(len(cols)), [f"{d}" if len(sizes) == 1 else f"{d}\nN={fmt.pow2_text(n)}" for n, d in cols],
                      fontsize=7)
        ax.set_yticks(range(len(stds)), [f"{s:g}" for s in stds], fontsize=7)
        ax.set_xlabel("head dimension d", fontsize=8)
        ax.set_ylabel("std of q, k entries", fontsize=8)
        failing = any(numerics_failing(c) for c in cells)
        ax.set_title(f"{mech} · {dtype}" + (f"  (N = {fmt.pow2_text(sizes[0])})" if len(sizes) == 1 else ""),
                     fontsize=9, color="tab:red" if failing else "black")
    for cmap, label in ((blues, "refused rows / rows"),
                        (reds, "silently wrong rows (and rows of calls that raised) / rows")):
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, location="bottom", shrink=0.45, aspect=40,
                          pad=0.02)
        cb.set_label(label, fontsize=8)
        cb.set_ticks([0, 0.002, 0.01, 0.1, 0.5, 1.0])
        cb.ax.tick_params(labelsize=7)
    return style.save(fig, out_dir, name)


# ------------------------------------------------------------------------------- the table


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
    clean: list[str] = field(default_factory=list)  # "causal · float32": panels all 0, folded, not drawn
    clean_cells: int = 0
    drawn: int = 0  # panels drawn (those with a refusal, a silent error or an error)


def numerics_view(results: Results) -> NumericsView | None:
    """The numerics/<id> table: per check and dtype, rows, silent errors, refusals (disallowed),
    errors and the worst row error, from the check's cells; None when the run has no such check."""
    checks = numerics_checks(results)
    if not checks:
        return None
    rows, all_dtypes, sizes, dims, stds, tol = [], [], set(), set(), set(), {}
    clean, clean_cells, drawn = [], 0, 0
    for r in checks:
        cells = numerics_cells(r)
        for dtype in numerics_dtypes(cells) or [None]:
            mine = [c for c in cells if c["dtype"] == dtype]
            if numerics_clean(mine):
                clean.append(f"{r.id.split('/', 1)[-1]} · {dtype}")
                clean_cells += len(mine)
            else:
                drawn += 1
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
                        ", ".join(f"{k} {fmt.number(v)}" for k, v in tol.items()) or fmt.DASH,
                        clean, clean_cells, drawn)


def draw(inputs: PageInputs, out_dir: Path, note: Callable[[str], None]) -> dict[str, Any]:
    """{"numerics": the heatmaps' file name or None}.

    >>> from reports.sections.numerics import draw
    >>> from reports.sections import PageInputs
    >>> from pathlib import Path
    >>> from results.schema import Results
    >>> draw(PageInputs(Results({})), Path("."), print)
    {'numerics': None}
    """
    return {"numerics": plot_numerics(inputs.results, out_dir)}


def view(inputs: PageInputs, figures: dict[str, Any]) -> dict[str, Any]:
    """{"numerics": numerics_view (None when the run has no numerics check)}.

    >>> from reports.sections.numerics import view
    >>> from reports.sections import PageInputs
    >>> from results.schema import Results
    >>> view(PageInputs(Results({})), {})
    {'numerics': None}
    """
    return {"numerics": numerics_view(inputs.results)}
