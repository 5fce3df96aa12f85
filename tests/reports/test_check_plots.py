"""reports.sections.verification: any check's details["plots"] becomes a figure on the page."""
from __future__ import annotations

from pathlib import Path

from reports.sections.verification import plot_check_figures
from reports.render import write_report
from tests.reports.synthetic import check, make_results as results
from verify.plots import plot, series


def _curve_check(cid: str, plots) -> object:
    return check(cid, "statistical", "pass", 0.5, 1.0, compare="<=", plots=plots)


GOOD = [plot("rate", "walks n", "error", [series("measured", [2, 4, 8], [0.7, 0.5, 0.36], lower=[0.6, 0.4, 0.3],
                                                 upper=[0.8, 0.6, 0.4]),
                                          series("n^-1/2", [2, 8], [0.7, 0.35], kind="line"),
                                          series("bound", [2, 8], [2.0, 1.0], kind="bound")])]


def test_one_png_per_check_with_plots_and_malformed_ones_named(tmp_path):
    bad = {"title": "broken", "xlabel": "x", "ylabel": "y", "series": [{"label": "a", "x": [1, 2], "y": [1]}]}
    figs = plot_check_figures([_curve_check("paper/rate", GOOD), _curve_check("paper/bad", [bad, *GOOD]),
                               check("paper/none", "bound", "pass", 1.0, 2.0)], tmp_path)
    assert [f.id for f in figs] == ["paper/rate", "paper/bad"]
    assert all((tmp_path / f.figure).read_bytes()[:4] == b"\x89PNG" for f in figs)
    assert figs[0].skipped == [] and "differ in length" in figs[1].skipped[0]
    assert figs[0].panels == ["rate"]


def test_the_page_shows_check_curves(tmp_path):
    r = results()
    r.checks = [*r.checks, _curve_check("paper/rate", GOOD)]
    index = write_report(r, tmp_path)
    html = Path(index).read_text()
    assert 'id="check-curves"' in html and "check_paper_rate.png" in html
    assert (tmp_path / "check_paper_rate.png").exists()


def test_no_curves_no_section(tmp_path):
    r = results()
    r.checks = [c for c in r.checks if not (isinstance(c.details, dict) and c.details.get("plots"))]
    html = Path(write_report(r, tmp_path)).read_text()
    assert 'id="check-curves"' not in html
