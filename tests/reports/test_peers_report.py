"""The peers section (reports.sections.peers): the peer-suite summary read, tabulated and drawn, from a
synthetic summary (tests/reports/synthetic.py: peers_summary); a missing, unreadable or fully
skipped summary; the --peers-json option and its default."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import reports.render
from reports.__main__ import DEFAULT_PEERS_JSON, main, parse_args
from reports.page import render_page
from reports.sections.peers import PeerRow, PeersSummary, interval_text, load_peers, peers_view, plot_peers
from tests.reports.synthetic import (PEER_ENV, PEER_SIZES, PEER_SKIP, make_results, peer_ratio, peers_summary,
                                     write_peers)

PNG = b"\x89PNG\r\n\x1a\n"


def _section(page: str) -> str:
    return page[page.index('<section id="peers"'):page.index('<section id="roofline"')]


def _page(summary: PeersSummary | None, figure: str | None = "peers.png") -> str:
    return _section(render_page(make_results(), {"variants": {}, "peers": figure}, peers=summary))


def test_load_reads_every_row(tmp_path):
    s = load_peers(write_peers(tmp_path / "p.json"))
    assert s.found and not s.error and not s.row_errors
    assert len(s.rows) == 10 * 2 * len(PEER_SIZES)  # (op, pass) x d x N
    r = next(r for r in s.rows if (r.op, r.phase, r.d, r.N) == ("favor", "forward", 64, 2**16))
    assert r.peer == "performer-pytorch" and (r.B, r.H, r.m) == (1, 4, 64) and r.rounds == [25, 25]
    assert r.ratio == pytest.approx(peer_ratio("favor", "forward", 2**16, 64))
    assert r.slower and not r.faster  # 0.62 [0.58, 0.66]: the whole interval below parity
    assert s.environment == PEER_ENV and s.peers == {"performer-pytorch": "1.1.4", "pytorch-fast-transformers": "0.4.0"}


def test_slower_and_faster_follow_the_interval():
    row = PeerRow("elu", "forward", "p", 1024, 1.0, 0.9, 0.9, 0.85, 0.99)
    assert row.slower and not row.faster
    row.ratio_high = 1.01  # straddles parity: neither
    assert not row.slower and not row.faster
    row.ratio_low, row.ratio_high = None, None  # no interval: neither, and said so
    assert not row.slower and not row.faster and interval_text(row) == "0.90 [no interval]"


def test_rows_that_cannot_be_read_are_named_and_the_rest_kept():
    d = peers_summary()
    d["rows"][0].pop("peer_s")
    d["rows"][1]["N"] = "many"
    d["rows"][2] = "junk"
    d["rows"][3]["ratio"] = None  # recomputed as peer_s / maskbench_s
    d["rows"][4]["ratio_high"] = "inf"  # written as a string by some JSON writers
    s = PeersSummary.from_dict(d, "p.json")
    assert len(s.rows) == len(d["rows"]) - 3
    assert [e.split(":")[0] for e in s.row_errors] == ["row 0", "row 1", "row 2"]
    assert "peer_s" in s.row_errors[0] and "N" in s.row_errors[1]
    assert s.rows[0].ratio == pytest.approx(d["rows"][3]["peer_s"] / d["rows"][3]["maskbench_s"])
    assert s.rows[1].ratio_high == float("inf")


def test_view_pivot_and_table():
    v = peers_view(PeersSummary.from_dict(peers_summary(), "p.json"))
    assert v.sizes == ["2¹⁰", "2¹²", "2¹⁴", "2¹⁶"]
    assert [(p.op, p.phase, p.dm) for p in v.pivot[:3]] == [
        ("favor", "forward", "d = m = 16"), ("favor", "forward", "d = m = 64"),
        ("favor", "forward+backward", "d = m = 16")]
    assert [p.op for p in v.pivot[::4]] == ["favor", "favor-causal", "elu", "elu-causal", "softmax"]
    first = v.pivot[1].cells[0]  # favor forward d = m = 64, N = 2^10: 0.55 [0.52, 0.58]
    assert first == ("0.55 [0.52, 0.58]", "slower")
    rows = peers_summary()["rows"]
    assert v.slower == sum(r["ratio_high"] is not None and r["ratio_high"] < 1 for r in rows) > 0
    assert v.faster == sum(r["ratio_low"] is not None and r["ratio_low"] > 1 for r in rows) > 0
    t = v.rows[len(PEER_SIZES) * 2 - 1]  # favor forward d = m = 64 at the largest N
    assert (t.op, t.n, t.maskbench, t.rounds, t.max_rel_diff, t.css) == (
        "favor", "2¹⁶", "64 ms", "25 / 25", "1.2e-06", "slower")
    assert ("torch", "2.13.0+cpu") in v.env_rows and ("threads", "2") in v.env_rows


def test_section_renders_figure_tables_and_environment():
    section = _page(PeersSummary.from_dict(peers_summary(), "benchmarks/out/peers-summary.json"))
    assert 'src="peers.png"' in section and "No peer run was found" not in section
    assert '<td class="num slower">0.55 [0.52, 0.58]</td>' in section
    assert '<td class="num faster">1.30 [1.22, 1.38]</td>' in section  # favor forward+backward d = m = 64
    assert "0.84 [no interval]" in section
    assert '<tr class="slower"><td>favor</td><td>forward</td><td>performer-pytorch</td>' in section
    for text in ("performer-pytorch <b>1.1.4</b>", "pytorch-fast-transformers <b>0.4.0</b>", "2.13.0+cpu",
                 "Synthetic CPU @ 2.0GHz", "abc1234", "64 ms", "1.2e-06", "25 / 25", "clearly slower"):
        assert text in section, text


def test_missing_file_names_the_command(tmp_path):
    s = load_peers(tmp_path / "nope.json")
    assert not s.found and not s.rows
    section = _page(s, None)
    assert "No peer run was found" in section and "<code>make bench-ops</code>" in section
    assert str(tmp_path / "nope.json") in section and "<table" not in section
    assert "No peer run was found" in _page(None, None)  # render_page without a summary at all


@pytest.mark.parametrize("text, says", [("{not json", "JSONDecodeError"),
                                        ('{"schema": "maskbench-peers/0", "rows": []}', "maskbench-peers/1"),
                                        ("[1, 2]", "expected a JSON object")])
def test_unreadable_file_is_shown_not_raised(tmp_path, text, says):
    (tmp_path / "p.json").write_text(text)
    s = load_peers(tmp_path / "p.json")
    assert s.found and says in s.error and not s.rows
    section = _page(s, None)
    assert "could not be read" in section and "make bench-ops" in section


def test_skipped_peers_are_listed_and_their_rows_absent(tmp_path):
    d = peers_summary(skip_fast_transformers=True)
    d["skipped"].append("performer-pytorch <b>broken</b> & gone")
    s = PeersSummary.from_dict(d, "p.json")
    assert {r.peer for r in s.rows} == {"performer-pytorch", "torch-sdpa"}
    section = _page(s)
    assert "Peers skipped in this run" in section and PEER_SKIP in section
    assert "performer-pytorch &lt;b&gt;broken&lt;/b&gt; &amp; gone" in section and "<b>broken</b>" not in section
    assert "pytorch-fast-transformers <b>not installed</b>" in section
    assert "<td>elu</td>" not in section and "<td>favor</td>" in section
    assert plot_peers(s, tmp_path) == "peers.png"


def test_everything_skipped_no_figure_and_a_note(tmp_path):
    d = peers_summary(skip_fast_transformers=True)
    d["rows"] = []
    s = PeersSummary.from_dict(d, "p.json")
    assert plot_peers(s, tmp_path) is None and plot_peers(None, tmp_path) is None
    section = _page(s, None)
    assert "holds no comparison (every peer was skipped)" in section and PEER_SKIP in section


def test_figure_is_written(tmp_path):
    s = PeersSummary.from_dict(peers_summary(), "p.json")
    assert plot_peers(s, tmp_path) == "peers.png"
    png = tmp_path / "peers.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    # one (op, pass) with no rows still gets its panel (a note instead of lines)
    s.rows = [r for r in s.rows if (r.op, r.phase) != ("softmax", "forward")]
    assert plot_peers(s, tmp_path, "gap.png") == "gap.png"


# ------------------------------------------------------------------------------- the CLI option


def test_option_default_is_the_bench_ops_summary():
    assert parse_args([]).peers_json == str(DEFAULT_PEERS_JSON) == str(Path("benchmarks/out/peers-summary.json"))
    assert parse_args(["--peers-json", "x.json"]).peers_json == "x.json"


@pytest.fixture
def captured(tmp_path, monkeypatch):
    """main() with write_report replaced: the PeersSummary it would render, without drawing."""
    make_results().write(tmp_path / "out" / "results.json")
    seen = {}

    def fake(results, out, asv, source, note, peers, gpu=None):
        seen["peers"] = peers
        return Path(out) / "index.html"

    monkeypatch.setattr(reports.render, "write_report", fake)
    monkeypatch.chdir(tmp_path)
    return tmp_path, seen


def test_cli_reads_the_default_path_relative_to_the_working_directory(captured):
    root, seen = captured
    assert main(["--out", "out", "--no-progress"]) == 0
    assert not seen["peers"].found and seen["peers"].path == str(DEFAULT_PEERS_JSON)
    write_peers(root / DEFAULT_PEERS_JSON)
    assert main(["--out", "out", "--no-progress"]) == 0
    assert seen["peers"].found and len(seen["peers"].rows) == 10 * 2 * len(PEER_SIZES)


def test_cli_option_names_another_file(captured, capsys):
    root, seen = captured
    write_peers(root / "elsewhere.json", peers_summary(skip_fast_transformers=True))
    assert main(["--out", "out", "--peers-json", "elsewhere.json", "--no-progress"]) == 0
    assert seen["peers"].skipped == [PEER_SKIP]
    (root / "bad.json").write_text(json.dumps({"schema": "other"}))
    assert main(["--out", "out", "--peers-json", "bad.json", "--no-progress"]) == 0  # the page says so
    assert "bad.json not readable" in capsys.readouterr().err and seen["peers"].error


def test_a_row_in_another_dtype_is_its_own_panel():
    """bfloat16 and float32 rows of one (op, pass, peer, N, d, m) never share a line: the dtype
    joins the op (a row without a dtype, as older summaries have, is float32)."""
    d = peers_summary()
    flash = [dict(r, op="softmax-flash", peer="torch-sdpa-flash", dtype=dt) for r in d["rows"][:4]
             for dt in ("bfloat16", "float16")]
    d["rows"] = [dict(r, dtype="float32") for r in d["rows"][:4]] + flash
    s = PeersSummary.from_dict(d, "p.json")
    assert [r.op for r in s.rows[:4]] == ["favor"] * 4
    assert sorted({r.op for r in s.rows[4:]}) == ["softmax-flash (bfloat16)", "softmax-flash (float16)"]
    v = peers_view(s)
    assert len({(p.op, p.phase, p.dm) for p in v.pivot}) == len(v.pivot)  # no two dtypes on one line
