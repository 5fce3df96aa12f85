"""The numerics heatmap and table (reports.sections.numerics: plot_numerics, numerics_view) on
synthetic numerics/<id> results (tests/reports/synthetic.py): counts, labels, JSON round trip,
and runs without numerics checks or with a check that recorded no cells."""
from __future__ import annotations

import math

from reports.page import render_page
from reports.sections.numerics import (numerics_cells, numerics_checks, numerics_failing, numerics_label,
                                       numerics_totals, numerics_view, plot_numerics)
from tests.reports.synthetic import NUMERICS_ROWS, NUMERICS_STDS, check, make_results, numerics_check
from results.schema import Results

PNG = b"\x89PNG\r\n\x1a\n"


def _by_id(results, cid):
    return next(r for r in results.checks if r.id == cid)


def test_totals_and_labels_of_the_synthetic_checks():
    r = make_results()
    assert [c.id for c in numerics_checks(r)] == ["numerics/causal", "numerics/tree-x"]
    tree = numerics_cells(_by_id(r, "numerics/tree-x"))
    tot = numerics_totals(tree)
    assert list(tot) == ["float32", "bfloat16"]
    rows = 15 * NUMERICS_ROWS
    assert (tot["float32"]["rows"], tot["float32"]["silent"], tot["float32"]["refusals"],
            tot["float32"]["disallowed"], tot["float32"]["errors"]) == (rows, 3, NUMERICS_ROWS, NUMERICS_ROWS, 0)
    assert tot["bfloat16"]["errors"] == len(NUMERICS_STDS) * NUMERICS_ROWS and tot["bfloat16"]["silent"] == 0
    assert tot["float32"]["worst_row_error"] == 0.0123
    at = {(c["dtype"], c["std"], c["d"]): c for c in tree}
    assert numerics_label(at["float32", 4.0, 64]) == f"r {NUMERICS_ROWS}!"
    assert numerics_label(at["float32", 8.0, 128]) == "s 3"
    assert numerics_label(at["bfloat16", 0.5, 16]) == f"e {NUMERICS_ROWS}"
    assert numerics_label(at["float32", 0.5, 16]) == "0"
    assert [k for k, c in at.items() if numerics_failing(c)] == (
        [("float32", 4.0, 64), ("float32", 8.0, 128)] + [("bfloat16", s, 16) for s in NUMERICS_STDS])
    causal = {(c["dtype"], c["std"], c["d"]): c for c in numerics_cells(_by_id(r, "numerics/causal"))}
    allowed = causal["float32", 8.0, 128]
    assert numerics_label(allowed) == f"r {NUMERICS_ROWS}" and not numerics_failing(allowed)
    assert allowed["min_log2_ratio_refused"] == -math.inf  # "-inf" from JSON read back as a number


def test_cells_survive_the_results_json(tmp_path):
    r = make_results()
    again = Results.read(r.write(tmp_path / "results.json"))
    for cid in ("numerics/causal", "numerics/tree-x"):
        assert numerics_cells(_by_id(again, cid)) == numerics_cells(_by_id(r, cid))


def test_malformed_cells_are_dropped():
    c = numerics_check("x")
    c.details["cells"] = c.details["cells"][:2] + [{"dtype": "float32"}, "junk", None]
    assert len(numerics_cells(c)) == 2


def test_figure_draws_every_panel_and_a_check_without_cells(tmp_path):
    r = make_results()
    r.checks.append(check("numerics/broken", "numerics", "fail", None, 0.0, "<=", "count",
                          reasons=["RuntimeError: no <cells> & no luck"]))
    assert plot_numerics(r, tmp_path) == "numerics.png"
    png = tmp_path / "numerics.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    view = numerics_view(r)
    assert [row.id for row in view.rows] == ["numerics/causal", "numerics/tree-x", "numerics/broken"]
    broken = view.rows[-1]
    assert broken.cells == [None, None] and broken.reasons == ["RuntimeError: no <cells> & no luck"]
    page = render_page(r, {"variants": {}, "numerics": "numerics.png"})
    section = page[page.index('<section id="numerics"'):page.index('<section id="favor"')]
    assert section.count('<td colspan="5" class="muted">not run</td>') == 2  # broken: both dtypes
    assert "no &lt;cells&gt; &amp; no luck" in section and "<cells>" not in section


def test_a_check_with_one_dtype_leaves_the_other_columns_empty():
    r = make_results()
    only32 = numerics_check("f32-only")
    only32.details["cells"] = [c for c in only32.details["cells"] if c["dtype"] == "float32"]
    r.checks.append(only32)
    view = numerics_view(r)
    row = view.rows[-1]
    assert view.dtypes == ["float32", "bfloat16"]
    assert row.cells[0] is not None and row.cells[0].rows == "7,680" and row.cells[1] is None


def test_no_numerics_checks_no_figure_and_a_note(tmp_path):
    r = make_results()
    r.checks = [c for c in r.checks if c.kind != "numerics"]
    assert plot_numerics(r, tmp_path) is None and numerics_view(r) is None
    r.checks = None
    assert plot_numerics(r, tmp_path) is None
    page = render_page(r, {"variants": {}})
    assert "This run recorded no numerics checks" in page
