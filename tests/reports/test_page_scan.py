"""A page to scan (issue 23 item 4): failures first, one description per check family, all-zero
numerics panels folded into one line, details as small tables, readable units, folded sections, and
the whole page under 15,000 px at 1400 px wide (estimated: tests/reports/page_height.py).

The page is rendered once from the synthetic results with 21 extra mechanisms (23 in all, as many
as the registry), each with the equivalence, complexity and numerics checks a real one has.
"""
from __future__ import annotations

import re

import pytest

from reports.__main__ import main
from reports.page import render_page
from reports.sections.numerics import numerics_view
from tests.reports.page_height import estimate_height
from tests.reports.synthetic import EQUIVALENCE_WHAT, FAIL_REASON, check, make_asv, make_results, write_peers

MAX_PAGE_PX = 15_000
EXTRA = 21


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    make_results(extra=EXTRA).write(root / "out" / "results.json")
    asv = make_asv(root / "asv")
    peers = write_peers(root / "peers-summary.json")
    assert main(["--out", str(root / "out"), "--asv-results", str(asv), "--peers-json", str(peers),
                 "--no-progress"]) == 0
    return root / "out", (root / "out" / "index.html").read_text(encoding="utf-8")


def _section(page: str, sid: str) -> str:
    start = page.index(f'<section id="{sid}"')
    return page[start:page.index("</section>", start)]


def test_failures_first_with_reasons_and_links(page):
    _, html = page
    box = html[html.index('id="failures"'):html.index('<nav id="toc">')]
    assert html.index('id="failures"') < html.index('<section id="summary"')
    failed = re.findall(r'<li><a href="#([^"]+)"><code>([^<]+)</code></a>', box)
    assert [cid for _, cid in failed] == ["complexity/tree-x", "performer/broken", "numerics/tree-x", "perf/broken"]
    for anchor, _ in failed:  # each links to its row in the verification table
        assert html.count(f'<tr id="{anchor}">') == 1, anchor
    assert f"4 of {len(make_results(extra=EXTRA).checks)} checks failed" in box
    assert FAIL_REASON.replace(">", "&gt;") in box
    assert "1 roofline target missed" in box


def test_all_passed_line_and_an_inconclusive_check_is_amber(tmp_path):
    r = make_results(perf=False)
    r.checks = [c for c in r.checks if c.status == "pass"]
    html = render_page(r, {"variants": {}})
    assert f'<p class="allpass" id="failures">All {len(r.checks)} checks passed.</p>' in html
    busy = check("complexity/causal", "complexity", "inconclusive", 1.2, 1.35, "<=", "exponent",
                 reason="inconclusive: machine busy (load 5.1 on 2 CPUs)")
    r.checks = [c for c in r.checks if c.id != "complexity/causal"] + [busy]
    html = render_page(r, {"variants": {}})
    assert '<p class="allpass"' not in html and "checks failed</b>" not in html
    assert "1 check could not conclude" in html and "inconclusive: machine busy (load 5.1 on 2 CPUs)" in html
    row = html[html.index('<tr id="check-complexity_causal">'):]
    assert row.index('<td class="unsettled">inconclusive</td>') < row.index("</tr>")
    summary = _section(html, "summary")  # the mechanism's "verified?" cell: amber, not a pass
    assert '<td class="unsettled">inconclusive: complexity/causal (' in summary


def test_one_description_per_check_family(page):
    _, html = page
    verification = _section(html, "verification")
    assert html.count(EQUIVALENCE_WHAT) == 1
    assert verification.count("statistic of every <code>equivalence/…</code> check below") == 1
    # no row repeats it; a description of one row only (perf/<id>: its N and baseline) stays on that row
    assert all("statistic: " not in row for row in verification.split("<tr ") if 'id="check-equivalence_' in row)
    assert "statistic: linear fast path at N = 65536 against the matmul roofline" in verification
    # the families fold; one with a failure opens, its failure in sight and its passes one click away
    assert '<details class="family"><summary><b>equivalence</b>: 23 checks' in verification
    assert '<details class="family" open><summary><b>complexity</b>: 23 checks' in verification
    assert "the 22 other <code>complexity/…</code> checks (passed or skipped)" in verification


def test_all_zero_numerics_panels_fold_into_one_line(page):
    out, html = page
    numerics = _section(html, "numerics")
    cells = 5 * 3  # stds x dims per panel (one panel per check and dtype)
    assert f"<b>{2 * EXTRA} panels ({2 * EXTRA * cells} cells), all 0</b>" in numerics
    assert "extra-00 · float32, extra-00 · bfloat16" in numerics
    view = numerics_view(make_results(extra=EXTRA))
    assert view.drawn == 4 and len(view.clean) == 2 * EXTRA  # causal (allowed refusals) and tree-x, two dtypes each
    assert 'src="numerics.png"' in numerics
    # nothing but zeros: no figure at all, and no "no data" line in its place
    r = make_results(extra=2)
    r.checks = [c for c in r.checks if not c.id.startswith("numerics/") or c.id.startswith("numerics/extra")]
    section = _section(render_page(r, {"variants": {}}), "numerics")
    assert "<b>4 panels (60 cells), all 0</b>" in section and "No data for this figure" not in section


def test_details_are_small_tables_with_units(page):
    _, html = page
    verification = _section(html, "verification")
    assert "<pre>" not in verification and '"fit"' not in verification
    row = verification[verification.index('<tr id="check-equivalence_extra-00">'):]
    row = row[:row.index("</table></details>")]
    assert "<th>n</th><td>4,096</td>" in row and "<th>fit_seconds</th><td>22 min 42 s</td>" in row
    assert "<th>max_abs_error</th><td>3e-08</td>" in row


def test_environment_in_words_and_units(page):
    _, html = page
    env = _section(html, "environment")
    assert "load 3.4 / 2 / 1 (1, 5, 15 min) at start, 3.1 / 2.1 / 1 at end" in env
    assert "[3.4" not in env and "{" not in env and "e+0" not in env
    assert "sweeps 12 s, memory 3.5 s, total 16 s" in env


def test_roofline_target_missed_is_not_shown_as_a_pass(page):
    _, html = page
    roofline = _section(html, "roofline")
    assert "<b>Targets missed</b>" in roofline and '<td class="fail">MISSED: 0.62 &lt; 0.70</td>' in roofline


def test_empty_sections_name_the_command_that_fills_them(tmp_path):
    from reports.asv_history import load_history

    html = render_page(make_results(), {"variants": {}})
    for sid in ("peers", "history", "gpu"):  # folded by default, but open while they only name their command
        assert f'<section id="{sid}"><details class="section" open>' in html, sid
    assert "No peer run was found" in _section(html, "peers") and "make bench-ops" in _section(html, "peers")
    assert "make bench" in _section(html, "history")
    assert "No GPU run was found" in _section(html, "gpu") and "make gpu-check" in _section(html, "gpu")
    html = render_page(make_results(), {"variants": {}}, load_history(tmp_path / "none"))
    assert "make bench" in _section(html, "history")


def test_page_height_under_the_bound(page):
    out, html = page
    height = estimate_height(html, out)
    assert height < MAX_PAGE_PX, f"page about {height:,.0f} px tall at 1400 px wide"
    # the estimate can fail: with every <details> open the same page is far over the bound
    assert estimate_height(html, out, open_all=True) > 2 * MAX_PAGE_PX
    # folded, everything stays one click away: every section's heading is in sight
    assert html.count('<details class="section"') == 16
    assert '<section id="peers"><details class="section">' in html  # filled: folded
