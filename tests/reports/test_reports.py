"""Smoke tests of the report builders on small synthetic inputs (no sweeps, no subprocesses)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reports.asv_history import load_history
from reports.data import MechanismInfo, ReportData
from reports.favor import FavorError, FavorErrorCurve, predicted_variance
from reports.gallery import mask_gallery
from reports.html import build_page, esc
from reports.memory import MemoryCurve, MemoryPoint
from reports.render import write_report
from reports.sweeps import analyse
from verify.registry import mechanisms
from verify.result import CheckResult
from verify.timing import Sweep


def _sweep(mech_id: str, impl: str, sizes, exponent: float, scale: float) -> Sweep:
    # t = scale * N^exponent with a little deterministic wobble, so fits have a finite CI.
    rng = np.random.default_rng(len(mech_id) + (7 if impl == "dense" else 0))
    secs = [scale * n**exponent * float(np.exp(rng.normal(0, 0.03))) for n in sizes]
    return Sweep(mech_id, impl, "cpu", "float32", 1, list(sizes), secs, 3, [secs] * 3)


def synthetic_data(with_asv_dir=None) -> ReportData:
    """A ReportData for every registered mechanism, built from formulas instead of timings."""
    mechs = mechanisms()
    fast_n, dense_n = [2**p for p in range(8, 14)], [2**p for p in range(7, 12)]
    timings, memory = {}, {}
    for m in mechs:
        dense = _sweep(m.id, "dense", dense_n, 2.0, 2e-9) if m.dense_setup is not None else None
        timings[m.id] = analyse(_sweep(m.id, "fast", fast_n, 1.0, 2e-6), dense)
        memory[m.id] = {"fast": MemoryCurve(m.id, "fast", "cpu", [MemoryPoint(n, n * 1e-4, 300.0) for n in fast_n],
                                            300.0, "VmHWM reset")}
        if dense is not None:
            memory[m.id]["dense"] = MemoryCurve(m.id, "dense", "cpu", [MemoryPoint(n, n * n * 4e-6, 300.0, n > 128)
                                                                       for n in dense_n], 300.0, "ru_maxrss")
    x, y = np.full(4, 0.2), np.full(4, 0.1)
    grid = [2, 4, 8, 16]
    pred = list(np.sqrt(predicted_variance(x, y, np.array(grid))))
    favor = FavorError(list(x), list(y), float(np.exp(x @ y)), 10, grid, pred,
                       [FavorErrorCurve(k, grid, pred, [p * 0.9 for p in pred], [p * 1.1 for p in pred],
                                        -0.5, -0.55, -0.45) for k in ("iid", "orthogonal")])
    checks = [CheckResult(f"equivalence/{m.id}", f"fast == reference <{m.id}>", m.source, "equivalence",
                          "pass", 1e-7, 1e-5, 0.1, {"note": "a < b & c"}) for m in mechs]
    checks.append(CheckResult("performer/prf-variance", "variance", "wu22 Lemma 1", "statistical", "fail",
                              float("inf"), 0.01, 1.0, {"error": "Traceback <module>"}))
    env = {"mode": "quick", "date": "2026-01-01", "threads": 2, "cpus": 2, "sweep_threads": 1, "sweep_rounds": 3}
    return ReportData(env, [MechanismInfo.from_mechanism(m) for m in mechs], timings, memory, favor, checks,
                      "synthetic", load_history(with_asv_dir) if with_asv_dir else None, gallery=mask_gallery(mechs))


def _asv_results(root) -> None:
    """Two asv (format 2) result files for two commits, one parameterised benchmark."""
    machine = root / "box"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    cols = ["result", "params", "version", "started_at", "duration"]
    for i, (commit, date) in enumerate((("aaaa1111", 1000), ("bbbb2222", 2000))):
        data = {"commit_hash": commit, "date": date, "env_name": "e", "params": {}, "python": "3.11",
                "requirements": {}, "env_vars": {}, "result_columns": cols, "version": 2, "durations": {},
                "results": {
                    "bench.TimeSuite.time_fast": [[1e-3 * (i + 1), 2e-3, None],
                                                  [["'causal'"], ["1024", "2048", "4096"]], "v", 0, 1.0],
                    "bench.track_err": [0.5 + i, [], "v"],
                }}
        (machine / f"{commit}-existing.json").write_text(json.dumps(data))


def test_page_lists_every_mechanism_and_figures_exist(tmp_path):
    asv_dir = tmp_path / "asv"
    _asv_results(asv_dir)
    data = synthetic_data(asv_dir)
    index = write_report(data, tmp_path / "out")
    page = index.read_text()
    for m in mechanisms():
        assert f"<code>{esc(m.id)}</code>" in page
    for name in ("time_vs_n.png", "memory_vs_n.png", "crossover.png", "favor_error.png", "asv_history.png",
                 "mask_gallery.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000
        assert f'src="{name}"' in page
    # escaped, never raw: check details contain < and &
    assert "Traceback &lt;module&gt;" in page and "<module>" not in page
    assert 'class="fail"' in page
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["timings"]) == {m.id for m in mechanisms()}
    assert results["verify"][-1]["statistic"] == "inf"


def test_fits_and_crossover_from_synthetic_sweeps():
    data = synthetic_data()
    for m in mechanisms():
        t = data.timings[m.id]
        assert t.fast.fit.slope == pytest.approx(1.0, abs=0.1)
        if t.dense is not None:
            assert t.dense.fit.slope == pytest.approx(2.0, abs=0.1)
            # 2e-6 N = 2e-9 N^2 at N = 1000
            assert t.crossover == pytest.approx(1000, rel=0.3)


def test_asv_history_and_missing_results(tmp_path):
    _asv_results(tmp_path)
    h = load_history(tmp_path)
    assert h.files == 2 and h.commits == ["aaaa1111", "bbbb2222"]
    by = {(s.benchmark, s.params): s for s in h.series}
    assert by[("bench.TimeSuite.time_fast", ("'causal'", "1024"))].values == [1e-3, 2e-3]
    assert ("bench.TimeSuite.time_fast", ("'causal'", "4096")) not in by  # null results dropped
    assert by[("bench.track_err", ())].values == [0.5, 1.5]
    empty = load_history(tmp_path / "nowhere")
    assert empty.series == [] and empty.files == 0
    data = synthetic_data()
    data.asv = empty
    assert "make bench" in build_page(data, {})


def test_page_without_verify_or_memory():
    data = synthetic_data()
    data.verify, data.memory, data.favor = None, {}, None
    page = build_page(data, {"timing": "time_vs_n.png"})
    assert "not run" in page and "--skip-verify" in page


def test_results_json_round_trip(tmp_path):
    """results.json holds everything: a page re-rendered from it (--from-json) is the same page."""
    asv_dir = tmp_path / "asv"
    _asv_results(asv_dir)
    data = synthetic_data(asv_dir)
    figures = {"timing": "time_vs_n.png"}
    again = ReportData.from_dict(json.loads(json.dumps(data.to_dict())))
    assert build_page(again, figures) == build_page(data, figures)


def test_cli_from_json(tmp_path):
    from reports.__main__ import main

    data = synthetic_data()
    data.write_json(tmp_path / "in.json")
    assert main(["--from-json", str(tmp_path / "in.json"), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert (tmp_path / "out" / "index.html").exists() and (tmp_path / "out" / "time_vs_n.png").exists()
