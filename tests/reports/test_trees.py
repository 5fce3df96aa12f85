"""The tree-mask stage (reports.trees): output structure on tiny grids, fits, the recursion depth
within its bound, failures recorded, JSON round trip, figures and the HTML section."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reports import trees as T
from reports.data import ReportData
from reports.figures import plot_tree_depth, plot_tree_diam, plot_tree_timing
from reports.html import build_page, trees_section
from reports.render import write_report

TINY = (64, 128, 256)
CHAIN_MAX = 128


def _tiny(monkeypatch) -> None:
    """Grids and budgets small enough for the whole stage to run in about a second."""
    monkeypatch.setattr(T, "SIZES", {True: TINY, False: TINY})
    monkeypatch.setattr(T, "DIAM_CHAIN_MAX", {True: CHAIN_MAX, False: CHAIN_MAX})
    monkeypatch.setattr(T, "POINT_BUDGET_S", {True: 0.01, False: 0.01})


@pytest.fixture(scope="module")
def tiny_run() -> T.TreeMasks:
    with pytest.MonkeyPatch.context() as mp:
        _tiny(mp)
        return T.tree_masks(quick=True, rounds=2)


def _data(trees: T.TreeMasks | None) -> ReportData:
    return ReportData({"mode": "quick", "date": "2026-01-01"}, [], trees=trees)


def test_every_operator_and_family_timed(tiny_run):
    r = tiny_run
    assert r.sizes == list(TINY) and r.quick and r.rounds == 2 and r.columns == 16 and r.threads == 1
    assert [(c.operator, c.family) for c in r.curves] == [(op, fam) for op in T.OPERATORS for fam in T.FAMILIES]
    assert r.errors == []
    for c in r.curves:
        chain = c.operator == "tree-diam" and c.family in T.CHAIN_FAMILIES
        expected = [n for n in TINY if n <= CHAIN_MAX] if chain else list(TINY)
        assert c.sizes == expected, (c.operator, c.family)
        assert c.skipped == ([n for n in TINY if n > CHAIN_MAX] if chain else [])
        assert bool(c.skip_reason) == chain
        assert all(math.isfinite(s) and s > 0 for s in c.seconds)
        assert len(c.rounds) == len(c.setup_seconds) == len(c.fitted) == len(c.sizes)
        assert all(1 <= k <= 2 for k in c.rounds)
    # diameters: path N - 1, star 2, complete binary (heap order, N = 2^k) 2 log2 N - 1
    assert r.diameters["path"] == [n - 1 for n in TINY]
    assert r.diameters["star"] == [2] * len(TINY)
    assert r.diameters["complete binary"] == [2 * int(math.log2(n)) - 1 for n in TINY]


def test_fits_present(tiny_run):
    for c in tiny_run.curves:
        if len(c.sizes) >= 3:
            assert c.fit is not None and c.fit.low <= c.fit.slope <= c.fit.high, (c.operator, c.family)
            assert c.fit_rule and any(c.fitted)
            assert (c.diam_fit is not None) == (c.operator == "tree-diam")
        else:  # tree-diam on path and caterpillar: 2 sizes under the cap
            assert c.fit is None and c.fit_rule.startswith("no fit")


def test_recursion_depth_within_bound(tiny_run):
    assert [d.family for d in tiny_run.depths] == list(T.FAMILIES)
    for d in tiny_run.depths:
        assert d.sizes == list(TINY)
        assert d.within_bound()
        assert all(0 <= depth <= T.depth_bound(n) for n, depth in zip(d.sizes, d.recursion_depth))
        assert d.recursion_depth[0] == 0  # N = 64 <= dense_threshold: one dense block
        assert d.recursion_depth[-1] >= 1 and d.num_subproblems[-1] > d.num_subproblems[0]
    assert tiny_run.dense_threshold == 64


def test_fit_rule_drops_fast_points_only_when_enough_remain():
    sizes = [2**p for p in range(8, 14)]
    quick = T.fit_curve(T.TreeCurve("x", "y", sizes, [1e-5 * n / 256 for n in sizes]))
    assert quick.fitted == [True] * 6 and quick.fit_rule.startswith("all 6 N")  # only 2 took >= 1 ms
    assert quick.fit.slope == pytest.approx(1.0, abs=1e-9)
    slow = T.fit_curve(T.TreeCurve("x", "y", sizes, [1e-4, 2e-4, 1e-3, 2e-3, 4e-3, 8e-3]))
    assert slow.fitted == [False, False, True, True, True, True] and slow.fit_rule.startswith("4 of 6 N")
    assert slow.fit.slope == pytest.approx(1.0, abs=1e-9)
    diam = T.fit_curve(T.TreeCurve("tree-diam", "path", sizes, [1e-9 * n * n for n in sizes]), [n - 1 for n in sizes])
    assert diam.fit.slope == pytest.approx(2.0, abs=1e-9) and diam.diam_fit.slope == pytest.approx(1.0, abs=0.01)
    short = T.fit_curve(T.TreeCurve("x", "y", [256, 512], [1.0, 2.0]))
    assert short.fit is None and short.fitted == [False, False]


class _Broken:
    """A stand-in operator whose product raises from N = 128 on."""

    def __init__(self, forest, n):
        self.n = n

    def matmul(self, x):
        if self.n >= 128:
            raise RuntimeError("planted <bug> & co")
        return x


def test_failing_operator_and_family_are_recorded(monkeypatch, tmp_path):
    _tiny(monkeypatch)
    monkeypatch.setitem(T.BUILDERS, "tree-dc", _Broken)
    real_parent = T.family_parent

    def parent(family, n, seed=T.SEED):
        if family == "star" and n == 256:
            raise ValueError("no star today")
        return real_parent(family, n, seed)

    monkeypatch.setattr(T, "family_parent", parent)
    r = T.tree_masks(quick=True, rounds=1, operators=["tree-exp", "tree-dc"])
    dc = {c.family: c for c in r.curves if c.operator == "tree-dc"}
    for fam, c in dc.items():
        assert c.sizes == [64] and c.error_n == 128, fam  # larger N not tried after the failure
        assert c.error == "N = 128: RuntimeError: planted <bug> & co"
    exp_star = r.curve("tree-exp", "star")
    assert exp_star.sizes == [64, 128] and exp_star.error_n == 256 and "ValueError: no star today" in exp_star.error
    assert r.curve("tree-exp", "path").error is None and r.curve("tree-exp", "path").sizes == list(TINY)
    assert r.diameters["star"] == [2, 2, None]
    assert all(d.sizes == [] for d in r.depths)  # the stand-in has no plan to report
    assert len(r.errors) == len(T.FAMILIES) + 1
    # recorded in results.json, drawn, and shown escaped in plain view on the page
    data = _data(r)
    index = write_report(data, tmp_path)
    stored = json.loads((tmp_path / "results.json").read_text())["tree_masks"]
    bad = [c for c in stored["curves"] if c["error"]]
    assert len(bad) == len(r.errors) and {c["error_n"] for c in bad} == {128, 256}
    page = index.read_text()
    assert f"{len(r.errors)} (operator, family) pair(s) failed" in page
    assert "planted &lt;bug&gt; &amp; co" in page and "<bug>" not in page
    assert (tmp_path / "tree_time_vs_n.png").stat().st_size > 5000


def test_json_round_trip_and_page(tiny_run, tmp_path):
    data = _data(tiny_run)
    again = ReportData.from_dict(json.loads(json.dumps(data.to_dict())))
    assert again.trees == tiny_run
    figures = {"tree_timing": "tree_time_vs_n.png", "tree_diam": "tree_diam.png", "tree_depth": "tree_dc_depth.png"}
    assert build_page(again, figures) == build_page(data, figures)
    stored = data.to_dict()["tree_masks"]
    assert stored["depths"][0]["bound_log_1.5_n"] == pytest.approx([T.depth_bound(n) for n in TINY])
    assert stored["curves"][0]["fit"]["slope"] == tiny_run.curves[0].fit.slope


def test_figures_and_html_section(tiny_run, tmp_path):
    index = write_report(_data(tiny_run), tmp_path / "out")
    for name in ("tree_time_vs_n.png", "tree_diam.png", "tree_dc_depth.png"):
        assert (tmp_path / "out" / name).stat().st_size > 5000
    page = index.read_text()
    assert "<h2>7. Tree masks: time vs N per tree family</h2>" in page
    for src in ("tree_time_vs_n.png", "tree_diam.png", "tree_dc_depth.png"):
        assert f'src="{src}"' in page
    assert "x of shape (N, 16) float32" in page and "single thread" in page
    for claim in ("<b>O(N)</b>", "<b>O(N log² N)</b>", "<b>O(N · diam)</b>"):
        assert claim in page
    assert f"timed only up to N = 2^{int(math.log2(CHAIN_MAX))}" in page
    assert "Every recorded depth within the bound: <b>yes</b>" in page
    assert "pair(s) failed" not in page
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["figures"]["tree_timing"] == "tree_time_vs_n.png"
    assert results["tree_masks"]["sizes"] == list(TINY)


def test_without_the_stage():
    assert plot_tree_timing(None, None) is None and plot_tree_depth(None, None) is None
    assert plot_tree_diam(None, None) is None
    assert "tree-mask stage was not run" in trees_section(None, {})
    assert "tree-mask stage was not run" in build_page(_data(None), {})


def test_cli_from_json_renders_without_recomputing(tiny_run, tmp_path, monkeypatch):
    from reports.__main__ import main

    _data(tiny_run).write_json(tmp_path / "in.json")

    def no(*args, **kwargs):
        raise AssertionError("--from-json must not time anything")

    monkeypatch.setattr(T, "tree_masks", no)
    monkeypatch.setattr(T, "BUILDERS", {op: no for op in T.OPERATORS})
    out = tmp_path / "out"
    assert main(["--from-json", str(tmp_path / "in.json"), "--out", str(out), "--no-progress"]) == 0
    for name in ("tree_time_vs_n.png", "tree_diam.png", "tree_dc_depth.png"):
        assert (out / name).stat().st_size > 5000
    again = json.loads((out / "results.json").read_text())["tree_masks"]
    assert again == json.loads((tmp_path / "in.json").read_text())["tree_masks"]


@pytest.mark.parametrize("family", T.FAMILIES)
def test_families_are_trees_of_n_nodes(family):
    from reference.masks.tree import forest_adjacency

    for n in (1, 2, 7, 64):
        p = T.family_parent(family, n)
        assert p.shape == (n,) and (p < 0).sum() == 1
        assert forest_adjacency(p).nnz == 2 * (n - 1)
    np.testing.assert_array_equal(T.family_parent("random recursive", 50), T.family_parent("random recursive", 50))
    with pytest.raises(ValueError, match="unknown tree family"):
        T.family_parent("hedge", 4)
