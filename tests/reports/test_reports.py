"""The report renders a synthetic Results (tests/reports/synthetic.py): no measuring anywhere.

Rendering once per module (figures take a few seconds on a busy machine) and reading the page
in several tests.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from markupsafe import escape

from reports.__main__ import main
from reports.asv_history import class_name, load_history, mechanism_histories
from reports.format import bytes_text, compare_sign, seconds_text, with_unit
from reports.page import render_page
from tests.reports.synthetic import (COMMITS, FAIL_REASON, LOAD_WARNING, MALICIOUS, NUMERICS_REASON, make_asv,
                                     make_results, write_peers)

PNG = b"\x89PNG\r\n\x1a\n"
TOC = ("summary", "gallery", "time", "crossover", "memory", "peers", "roofline", "variants", "verification",
       "numerics", "favor", "history", "environment")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    results = make_results()
    results.write(root / "out" / "results.json")
    asv = make_asv(root / "asv")
    peers = write_peers(root / "peers-summary.json")
    assert main(["--out", str(root / "out"), "--asv-results", str(asv), "--peers-json", str(peers),
                 "--no-progress"]) == 0
    return root, (root / "out" / "index.html").read_text(encoding="utf-8")


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_toc_anchors_in_order(rendered):
    _, page = rendered
    positions = []
    for key in TOC:
        assert f'href="#{key}"' in page, key
        assert f'id="{key}"' in page, key
        positions.append(page.index(f'<section id="{key}"'))
    assert positions == sorted(positions), "sections out of the table of contents' order"
    assert 'href="#variants-tree-x"' in page and 'id="variants-tree-x"' in page


def test_every_figure_is_a_png_and_on_the_page(rendered):
    root, page = rendered
    for name in ("mask_gallery.png", "time_vs_n.png", "crossover.png", "memory_vs_n.png", "favor_error.png",
                 "variants_tree-x.png", "asv_history.png", "asv_track.png", "numerics.png", "peers.png",
                 "roofline.png"):
        assert _is_png(root / "out" / name), name
        assert f'src="{name}"' in page, name
    # causal has one variant and no cost factor or metric: no per-variant view of it
    assert not (root / "out" / "variants_causal.png").exists()


def test_variant_view_is_generic(rendered):
    _, page = rendered
    section = page[page.index('id="variants-tree-x"'):page.index('id="verification"')]
    # both swept variants, the cost factor and the metric with its bound; the unswept one named
    for text in ("path", "binary", "exponent of t / diam", "depth at largest N", "depth bound at largest N",
                 'Metric "depth" is drawn against "depth bound"', "Checked for equivalence only, not timed: star"):
        assert html.escape(text, quote=True) in section or text in section, text
    assert "1.00 [0.96, 1.04]" in section  # path's t / diam fit (cost_fit of t = 3e-9 N^2, diam N - 1)
    assert "failed at N = 2¹⁵: MemoryError: cannot allocate &lt;4 GiB&gt;" in section


def test_verification_shows_direction_units_and_reasons(rendered):
    _, page = rendered
    table = page[page.index('id="verification"'):page.index('id="favor"')]
    assert "3.5 GiB <b>≤</b> 8 GiB" in table  # bytes in binary units
    assert "2.5 s <b>≤</b> 120 s" in table  # seconds
    assert "0.7 <b>≥</b> 0.5" in table and "(ratio)" in table
    assert "1.62 <b>≤</b> 1.35" in table and "(exponent)" in table
    assert html.escape(FAIL_REASON) in table
    assert "no GPU" in table  # a skipped check's reason
    # 6 + numerics/causal + 4 perf/ passed; complexity/tree-x, performer/broken, numerics/tree-x and
    # perf/broken failed; tree/skipped and perf/skipped skipped
    assert "12 passed" not in table and "11 passed" in table and "4 failed" in table and "2 skipped" in table


def test_malicious_detail_is_escaped(rendered):
    _, page = rendered
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert str(escape(MALICIOUS)) in page  # in the reasons cell (and, indented, in the details)
    assert "Traceback &lt;module&gt;" in page
    assert "mask &lt;too&gt; big &amp; broken" in page  # a failed gallery panel's error


def test_load_warning_box(rendered):
    _, page = rendered
    assert 'class="warning"' in page and str(escape(LOAD_WARNING)) in page
    assert page.index('id="load-warning"') < page.index('id="summary"')


def test_summary_one_exponent_per_mechanism(rendered):
    _, page = rendered
    summary = page[page.index('<section id="summary"'):page.index('<section id="gallery"')]
    assert "the sweep complexity/causal tested" in summary
    assert "complexity/tree-x timed a separate sweep" in summary
    assert "1,000 [800, 1,300]" in summary and "200,000 [90,000, &gt; 200,000]" in summary
    assert "extrapolated from the fits" in summary and "FAIL: complexity/tree-x" in summary
    assert "12.5 MiB at N = 2¹⁴" in summary  # 800 bytes * 2^14


def test_history_shows_three_commits(rendered):
    root, page = rendered
    history = page[page.index('<section id="history"'):page.index('<section id="environment"')]
    for commit, _ in COMMITS:
        assert f"<code>{commit[:8]}</code>" in history
    assert "3 commit(s)" in history and "2 mechanism(s) with results" in history
    assert "accuracy.causal.track_relative_error" in history
    h = load_history(root / "asv")
    (causal, tree) = mechanism_histories(h, ["causal", "tree-x"])
    assert tree.cls == "tree_x" and [line.values for line in tree.exponent] == [[1.3, 1.31, 1.32]]
    # 4096 is missing on the first commit: the time is taken at the largest N timed on all three
    assert causal.time_n == 1024 and causal.time[0].values == pytest.approx([1e-3, 1.1e-3, 1.2e-3])


def test_from_json_rerender_equals_first_render(rendered, tmp_path):
    root, first = rendered
    again = tmp_path / "again"
    args = ["--from-json", str(root / "out" / "results.json"), "--out", str(again),
            "--asv-results", str(root / "asv"), "--peers-json", str(root / "peers-summary.json"),
            "--gpu-json", str(root / "out" / "gpu.json"), "--no-progress"]  # the first render's (none there)
    assert main(args) == 0
    second = (again / "index.html").read_text(encoding="utf-8")
    src = re.compile(r'<code>[^<]*results\.json</code>')  # the page names its source file
    assert src.sub("", second) == src.sub("", first)
    pngs = sorted(p.name for p in (root / "out").glob("*.png"))
    assert pngs == sorted(p.name for p in again.glob("*.png"))
    # asv results are re-read on every render: a fourth commit appears without re-measuring
    make_asv(root / "asv", COMMITS + (("dddd4444dddd", 1_700_300_000_000),))
    assert main(args) == 0
    assert "<code>dddd4444</code>" in (again / "index.html").read_text(encoding="utf-8")


def test_missing_results_file_says_how_to_make_it(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "nowhere"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "python -m measure --out" in err and "make report" in err


def test_measuring_flags_point_to_verify_measure(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--quick"])
    assert exc.value.code == 2
    assert "python -m measure --quick" in capsys.readouterr().err


def test_schema_mismatch_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "results.json").write_text('{"schema": "maskbench-results/1"}')
    assert main(["--out", str(tmp_path), "--no-progress"]) == 2
    assert "maskbench-results/2" in capsys.readouterr().err


def test_page_without_optional_parts(tmp_path):
    r = make_results()
    r.checks, r.gallery, r.favor_error, r.memory = None, None, None, []
    r.environment.pop("load_warning")
    page = render_page(r, {"variants": {}}, load_history(tmp_path / "no-asv"))
    assert 'class="warning"' not in page
    assert "The checks were not run" in page and "recorded no mask gallery" in page
    assert "No asv results found" in page and "make bench" in page


def test_many_lines_get_distinct_colour_and_marker(tmp_path):
    from reports.sections.crossover import plot_crossover
    from reports.style import line_styles

    styles = line_styles(13)
    assert len(set(styles)) == 13 and len({c for c, _ in styles}) == 10  # tab10, markers cycled
    assert plot_crossover(make_results(extra=11), tmp_path) == "crossover.png"
    assert _is_png(tmp_path / "crossover.png")


@pytest.mark.parametrize("mech_id, cls", [("toeplitz-1d", "toeplitz_1d"), ("2d-grid", "m_2d_grid"),
                                          ("causal", "causal")])
def test_class_name_matches_asv_bench(mech_id, cls):
    assert class_name(mech_id) == cls


def test_units_and_signs():
    assert bytes_text(3 * 2**30) == "3 GiB" and bytes_text(1536) == "1.5 KiB" and bytes_text(12) == "12 B"
    assert seconds_text(0.00042) == "420 µs" and seconds_text(2.5) == "2.5 s" and seconds_text(0.012) == "12 ms"
    assert with_unit(2**20, "bytes") == "1 MiB" and with_unit(float("inf"), "seconds") == "∞"
    assert compare_sign("<=") == "≤" and compare_sign(">=") == "≥" and compare_sign("") is None


def test_numerics_section_and_heatmap(rendered):
    root, page = rendered
    section = page[page.index('<section id="numerics"'):page.index('<section id="favor"')]
    assert 'src="numerics.png"' in section and _is_png(root / "out" / "numerics.png")
    assert "<code>numerics/causal</code>" in section and "<code>numerics/tree-x</code>" in section
    # tree-x: float32 3 silent rows and 512 refused rows, all disallowed; bfloat16: 5 x 512 rows raised
    for cell in ('<td class="num fail">3</td>', '<td class="num fail">512 (512)</td>',
                 '<td class="num fail">2,560</td>'):
        assert cell in section, cell
    assert '<td class="num">512 (0)</td>' in section  # causal's allowed refusals
    assert html.escape(NUMERICS_REASON) in section
    assert "float32 0.001, bfloat16 0.01" in section and "N = 2⁸" in section


def test_the_summary_cites_the_sections_by_their_numbers():
    """templates/sections/summary.html.j2 cites sections by number in its prose: reordering
    reports.page.SECTIONS must update it."""
    from reports.page import SECTIONS, TEMPLATES

    number = {s.ID: i + 1 for i, s in enumerate(SECTIONS)}
    prose = (TEMPLATES / "sections" / "summary.html.j2").read_text(encoding="utf-8")
    for sid, cited in (("crossover", "section 4"), ("memory", "section 5"), ("roofline", "section 7"),
                       ("verification", "Section 9"), ("numerics", "section 10")):
        assert cited in prose and cited.endswith(f" {number[sid]}"), (sid, cited, number[sid])


def test_history_with_exponents_only_draws_one_panel_per_mechanism(tmp_path):
    """make report records only asv's exponents: the figure then has no empty time panels, and
    the caption says which command adds the times."""
    from matplotlib import image

    from reports.asv_history import Line, MechanismHistory
    from reports.sections.history import has_times, plot_history

    exp_only = [MechanismHistory(m, m, exponent=[Line("exponent", [1.0])]) for m in ("a", "b", "c", "d")]
    with_time = [MechanismHistory(m, m, exponent=[Line("exponent", [1.0])], time=[Line("fast", [1e-3])], time_n=1024)
                 for m in ("a", "b", "c", "d")]
    assert not has_times(exp_only) and has_times(with_time)
    one = image.imread(tmp_path / plot_history(exp_only, ["c1"], {}, tmp_path, "one.png"))
    two = image.imread(tmp_path / plot_history(with_time, ["c1"], {}, tmp_path, "two.png"))
    assert one.shape[0] < two.shape[0]  # 4 panels fill one row of 4; 8 panels need two rows
