"""The roofline section (reports.sections.roofline) from synthetic perf/<id> checks (kind "perf",
tests/reports/synthetic.py: perf_checks): the table, the figure, the JSON round trip, and a run
without perf checks."""
from __future__ import annotations

import html

from reports.page import render_page
from reports.sections.roofline import (RooflineEntry, perf_checks, plot_roofline, roofline_entries, roofline_view,
                              target_text)
from tests.reports.synthetic import PERF_CEILING, PERF_FAIL_REASON, PERF_SKIP_REASON, check, make_results
from results.schema import Results

PNG = b"\x89PNG\r\n\x1a\n"


def _section(page: str) -> str:
    return page[page.index('<section id="roofline"'):page.index('<section id="variants"')]


def test_entries_grouped_by_baseline():
    r = make_results()
    assert [c.id for c in perf_checks(r)] == ["perf/linear", "perf/causal", "perf/toeplitz-1d", "perf/tree-x",
                                              "perf/broken", "perf/skipped"]
    entries = roofline_entries(r)
    assert [(e.mechanism, e.baseline) for e in entries] == [
        ("linear", "matmul"), ("causal", "matmul"), ("broken", "matmul"), ("toeplitz-1d", "fft"),
        ("tree-x", "scatter"), ("skipped", "scatter")]
    linear = entries[0]
    assert (linear.fraction, linear.target, linear.meets_target, linear.ceiling, linear.N) == (
        0.62, 0.70, False, PERF_CEILING, 2**16)
    assert entries[-1].fraction is None and entries[-1].reasons == [PERF_SKIP_REASON]
    assert target_text(linear) == "target ≥ 0.70: missed"
    assert target_text(entries[1]) == "target ≥ 0.50 at N = 2¹⁶: met"  # timed at 2^14 (a quick run)
    assert target_text(entries[4]) == ""  # tree-x: no target


def test_view_rows():
    v = roofline_view(make_results())
    rows = {row.mechanism: row for row in v.rows}
    lin = rows["linear"]
    assert (lin.baseline, lin.n, lin.d, lin.m, lin.seconds, lin.gflops, lin.gflops_executed, lin.peak_gflops,
            lin.fraction, lin.target, lin.met, lin.met_class, lin.status) == (
        "matmul", "2¹⁶", "64", "64", "20 ms", "31", "34.1", "50", "0.620", "≥ 0.70", "MISSED: 0.62 < 0.70", "fail", "pass")
    assert (rows["causal"].n, rows["causal"].target, rows["causal"].met, rows["causal"].met_class) == (
        "2¹⁴", "≥ 0.50 at N = 2¹⁶", "met", "pass")
    fft = rows["toeplitz-1d"]
    assert (fft.n, fft.baseline_seconds, fft.gflops, fft.target, fft.met) == ("2¹⁴", "16 ms", "–", "≥ 0.67", "met")
    assert (rows["tree-x"].target, rows["tree-x"].met, rows["tree-x"].met_class) == ("none", "none", "skip")
    assert rows["broken"].status == "fail" and rows["broken"].reasons == [PERF_FAIL_REASON]
    assert rows["skipped"].fraction == "–" and rows["skipped"].status == "skip"
    assert (v.met, v.missed, v.no_target) == (3, 1, 2)
    assert v.settings == "float32, 1 thread(s), clock: cpu"
    assert [b for b, _ in v.baselines] == ["matmul", "fft", "scatter"]


def test_section_renders_table_and_figure(tmp_path):
    r = make_results()
    assert plot_roofline(r, tmp_path) == "roofline.png"
    png = tmp_path / "roofline.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
    section = _section(render_page(r, {"variants": {}, "roofline": "roofline.png"}))
    assert 'src="roofline.png"' in section and "recorded no roofline" not in section
    assert section.count("<tr><td><code>perf/") == 6
    assert html.escape(PERF_FAIL_REASON) in section and "<baseline>" not in section
    assert PERF_SKIP_REASON in section
    # a missed target is red twice (the fraction and "MISSED"), and named in a box above the table
    assert '<td class="fail">MISSED: 0.62 &lt; 0.70</td>' in section and '<td class="pass">met</td>' in section
    assert '<td class="num fail">0.620</td>' in section
    assert "<b>Targets missed</b>" in section and "<code>perf/linear</code> 0.620 against ≥ 0.70" in section
    assert '<td class="skip">none</td>' in section and '<td class="fail">FAIL</td>' in section
    assert "3 met, 1 missed, 2 without a target" in section


def test_round_trip_through_the_results_json(tmp_path):
    r = make_results()
    again = Results.read(r.write(tmp_path / "results.json"))
    assert roofline_view(again) == roofline_view(r)


def test_no_perf_checks_no_figure_and_a_note(tmp_path):
    r = make_results(perf=False)
    assert perf_checks(r) == [] and roofline_view(r) is None and plot_roofline(r, tmp_path) is None
    section = _section(render_page(r, {"variants": {}}))
    assert "This run recorded no roofline (perf) checks" in section and "python -m verify --only perf/" in section
    r.checks = None
    assert roofline_view(r) is None and plot_roofline(r, tmp_path) is None


def test_a_check_with_bare_details_still_draws(tmp_path):
    r = make_results(perf=False)
    r.checks.append(check("perf/bare", "perf", "pass", 0.4, 1.25, "<=", "ratio"))  # no details at all
    r.checks.append(check("perf/raised", "perf", "fail", None, 1.25, "<=", "ratio", error="RuntimeError: <x>"))
    e = roofline_entries(r)
    assert [x.fraction for x in e] == [0.4, None] and e[0].baseline == "none"
    assert RooflineEntry.of(r.checks[-1]).reasons == ["RuntimeError: <x>"]
    assert plot_roofline(r, tmp_path) == "roofline.png"
    section = _section(render_page(r, {"variants": {}, "roofline": "roofline.png"}))
    assert "RuntimeError: &lt;x&gt;" in section
