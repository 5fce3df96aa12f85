"""measure: the pipeline on a synthetic registry record (two variants), with exact fake
timings and the slow stages replaced; the JSON must round-trip through results.schema.Results."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from measure import pipeline, stages, timing
from measure.cli import main, parse_args
from measure.environment import BUSY_OTHER, LoadLog
from measure.experiments import favor_accuracy, favor_error
from measure.pipeline import Options, collect
from results.check import CheckResult
from results.schema import MemoryCurve, MemoryPoint, Results
from verify import registry

MECH_ID = "synthetic-measure"


def _record() -> registry.Mechanism:
    """Fast path t = 1e-6 N (variant "wide": 3x), dense twin t = 1e-9 N^2: crossover at N = 1000."""

    def make_problem(n, seed, scale=1.0):
        return SimpleNamespace(n=n, seed=seed, scale=scale)

    return registry.Mechanism(
        id=MECH_ID, title="synthetic", source="test", complexity="N", make_problem=make_problem,
        reference=lambda p: np.zeros((p.n, 1)),
        fast_setup=lambda p, device, dtype, requires_grad=False: (lambda: 1e-6 * p.n * p.scale),
        dense_setup=lambda p, device, dtype, requires_grad=False: (lambda: 1e-9 * p.n * p.n),
        dense_mask=lambda p: np.tril(np.ones((p.n, p.n))),
        metrics=lambda p: {"blocks": float(p.n // 8)},
        variants=(registry.Variant("narrow", "the default"),
                  registry.Variant("wide", "three times slower", params={"scale": 3.0}),
                  registry.Variant("option", "equivalence only", sweep=False)),
        quick_fast_sizes=tuple(2**p for p in range(6, 13)), quick_dense_sizes=tuple(2**p for p in range(6, 12)),
    )


@pytest.fixture
def synthetic(monkeypatch):
    """Register the record; timing.measure returns the runner's own 'time'; tiny FAVOR+ stage."""
    mech = registry.register(_record())
    monkeypatch.setattr(timing, "measure", lambda runner, device="cpu", min_time=0: runner())
    monkeypatch.setattr(stages, "favor_stage",
                        lambda quick, progress=True: favor_error(draws=20, grid=[2, 4, 8], progress=False))
    monkeypatch.setattr(stages, "favor_accuracy_stage",
                        lambda quick, progress=True: favor_accuracy(n=16, seeds=1, std=[0.25], m=[8], d=8))
    try:
        yield mech
    finally:
        registry.unregister(MECH_ID)


def _opts(**kw) -> Options:
    return Options(**{"quick": True, "only": [MECH_ID], "skip_memory": True, "skip_verify": True,
                      "progress": False, "argv": ["--quick"], **kw})


def test_pipeline_holds_every_variant_and_round_trips(synthetic, tmp_path):
    res = collect(_opts())
    path = res.write(tmp_path / "out" / "results.json")
    back = Results.read(path)
    assert back.to_dict() == res.to_dict()

    assert [m.id for m in back.mechanisms] == [MECH_ID]
    info = back.mechanisms[0]
    assert [v.name for v in info.variants] == ["narrow", "wide", "option"] and info.default_variant == "narrow"
    assert info.has_dense and [v.sweep for v in info.variants] == [True, True, False]
    # the default variant's fast path and dense twin, the other sweep variant fast only, not "option"
    assert {(s.variant, s.impl) for s in back.sweeps} == {("narrow", "fast"), ("narrow", "dense"), ("wide", "fast")}
    fast, dense, wide = back.sweep(MECH_ID, "narrow", "fast"), back.sweep(MECH_ID, "narrow", "dense"), \
        back.sweep(MECH_ID, "wide", "fast")
    assert fast.sizes == [2**p for p in range(6, 13)] and dense.sizes == [2**p for p in range(6, 12)]
    np.testing.assert_allclose(wide.seconds, [3e-6 * n for n in wide.sizes])
    assert fast.rounds == 3 and fast.threads == 1 and fast.fitted == list(timing.fit_points(fast.sizes, fast.seconds))
    assert fast.fit.slope == pytest.approx(1.0, abs=1e-9) and dense.fit.slope == pytest.approx(2.0, abs=1e-9)
    assert fast.metrics == {"blocks": [n / 8 for n in fast.sizes]} and fast.cost_factors is None
    # the comparison: crossover 1000 inside the grid, exact data
    (c,) = back.comparisons
    assert (c.mechanism, c.variant) == (MECH_ID, "narrow") and c.sizes == dense.sizes
    assert c.crossover == pytest.approx(1000.0) and not c.extrapolated and c.measured_crossover == 1024
    assert c.crossover_low == pytest.approx(1000.0) and c.crossover_high == pytest.approx(1000.0)  # no noise
    # gallery with the matrix, FAVOR+ experiment, environment, stages
    (panel,) = back.gallery.panels
    assert panel.id == MECH_ID and panel.n == 64 and np.array(panel.matrix).shape == (64, 64)
    assert panel.nonzero_fraction == pytest.approx((64 * 65 / 2) / 64**2)
    assert back.favor_error.m == [2, 4, 8] and len(back.favor_error.curves) == 2
    assert back.favor_accuracy.m == [8] and {c.mask for c in back.favor_accuracy.curves} == {"none", "causal"}
    env = back.environment
    assert env["mode"] == "quick" and env["sweep_threads"] == 1 and env["sweep_rounds"] == 3
    assert "load_warning" in env and set(env["load"]["stages"]) == {"sweeps", "favor_error", "favor_accuracy",
                                                                      "gallery"}
    assert all(st["cpu_s"] >= 0 for st in env["load"]["stages"].values())
    assert set(back.stage_seconds) == {"sweeps", "favor_error", "favor_accuracy", "gallery"}
    assert back.checks is None and "--skip-verify" in back.checks_note


def test_skip_variants_times_the_default_only(synthetic):
    res = collect(_opts(skip_variants=True))
    assert {(s.variant, s.impl) for s in res.sweeps} == {("narrow", "fast"), ("narrow", "dense")}
    assert [v.name for v in res.mechanisms[0].variants] == ["narrow", "wide", "option"]  # still described


def test_a_failing_sweep_is_recorded_and_the_rest_runs(synthetic, monkeypatch):
    broken = registry.unregister(MECH_ID)

    def fast_setup(p, device, dtype, requires_grad=False):
        if p.n >= 1024:
            raise MemoryError("too big")
        return broken.fast_setup(p, device, dtype)

    from dataclasses import replace

    registry.register(replace(broken, fast_setup=fast_setup))
    res = collect(_opts())
    s = res.sweep(MECH_ID, "narrow", "fast")
    assert s.sizes == [64, 128, 256, 512] and s.error_n == 1024 and "MemoryError: too big" in s.error
    assert res.sweep(MECH_ID, "narrow", "dense").error is None and res.comparisons


def test_memory_stage_and_stage_errors(synthetic, monkeypatch):
    curve = MemoryCurve(MECH_ID, "narrow", "fast", "cpu", [MemoryPoint(64, 1024.0, 5e7)], 4e7, "VmHWM reset")
    seen = {}

    def fake_memory(mechs, quick, device, progress=True, jobs=2, status=None):
        seen["ids"] = [m.id for m in mechs]
        return [curve]

    monkeypatch.setattr(stages, "memory_stage", fake_memory)
    monkeypatch.setattr(stages, "gallery_stage", lambda *a, **k: 1 / 0)
    res = collect(_opts(skip_memory=False))
    assert seen["ids"] == [MECH_ID] and res.memory == [curve]
    assert res.gallery is None and "ZeroDivisionError" in res.environment["stage_errors"]["gallery"]
    assert Results.from_dict(json.loads(json.dumps(res.to_dict()))).memory_curve(MECH_ID, "fast").points[0].n == 64


def test_checks_stage_shares_the_sweep_cache(synthetic, monkeypatch):
    import verify.runner

    seen = {}

    def fake_run_checks(quick=True, only=None, device="cpu", seed=0, progress=True, sweeps=None):
        seen.update(quick=quick, only=only, sweeps=sweeps)
        return [CheckResult(f"complexity/{MECH_ID}", "t", "s", "complexity", "pass", 1.0, 1.35)]

    monkeypatch.setattr(verify.runner, "run_checks", fake_run_checks)
    monkeypatch.setattr("verify.checks.all_checks", lambda: [
        SimpleNamespace(id=f"complexity/{MECH_ID}"), SimpleNamespace(id=f"scale/{MECH_ID}-train"),
        SimpleNamespace(id="complexity/linear"), SimpleNamespace(id="performer/variance")])
    res = collect(_opts(skip_verify=False))
    assert seen["quick"] is True and seen["only"] == [f"complexity/{MECH_ID}", f"scale/{MECH_ID}-train"]
    # the cache the sweeps filled, keyed as measure.timing.sweep_key: complexity/<id> hits it
    key = timing.sweep_key(MECH_ID, "narrow", "fast", _record().sizes("fast", True), 3, "cpu", 0)
    assert key in seen["sweeps"] and seen["sweeps"][key].sizes == res.sweep(MECH_ID, "narrow", "fast").sizes
    assert [r.id for r in res.checks] == [f"complexity/{MECH_ID}"] and "cache" in res.checks_note
    assert "checks" in res.stage_seconds and "checks" in res.environment["load"]["stages"]
    collect(_opts(skip_verify=False, verify_full=True))
    assert seen["quick"] is False


def test_cli_writes_the_json_with_checks_from_a_file(synthetic, tmp_path, capsys):
    checks = tmp_path / "verify.json"
    checks.write_text(json.dumps([CheckResult(f"complexity/{MECH_ID}", "t", "s", "complexity", "fail",
                                              float("inf"), 1.35).to_dict()]))
    out = tmp_path / "r.json"
    assert main(["--quick", "--only", MECH_ID, "--skip-memory", "--verify-json", str(checks), "--out", str(out),
                 "--no-progress", "--rounds", "2"]) == 0
    res = Results.read(out)
    assert res.checks[0].status == "fail" and math.isinf(res.checks[0].statistic)
    assert str(checks) in res.checks_note and "checks" not in res.stage_seconds
    assert res.sweeps[0].rounds == 2 and res.environment["sweep_rounds"] == 2
    assert "--verify-json" in res.environment["command"]
    err = capsys.readouterr().err
    assert "[measure] sweeps done in" in err and "wrote" in err


def test_cli_rejects_bad_arguments(synthetic, tmp_path):
    for argv in (["--only", "no-such-mechanism"], ["--rounds", "0"], ["--verify-json", str(tmp_path / "none.json")]):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
    opts, out = parse_args(["--only", MECH_ID, "linear", "--only", MECH_ID])
    assert opts.only == [MECH_ID, "linear"] and out.name == "results.json" and not opts.quick


def test_load_warning_rule():
    log = LoadLog(cpus=2)
    log.stages = {"sweeps": {"threads": 1, "start": [0.4, 0, 0], "end": [1.2, 0, 0]},
                  "memory": {"threads": 2, "start": [3.9, 0, 0], "end": [3.9, 0, 0]},
                  "checks": {"threads": 2, "start": [1.5, 0, 0], "end": [2.0, 0, 0]}}
    # memory is not a timing stage; sweeps: other load 0.2 < BUSY_OTHER; checks: its own 2 threads
    assert log.warning() is None
    s = log.summary()
    assert s["stages"]["sweeps"]["other_load"] == pytest.approx(0.2) and s["max_other_load"] == pytest.approx(1.9)
    assert s["other_busy"] and "rule" in s
    log.stages["sweeps"]["end"] = [1 + BUSY_OTHER + 0.1, 0, 0]  # another process used 0.6 core
    w = log.warning()
    assert w and "the sweeps stage (load 1.60" in w and "2 CPUs" in w and "checks" not in w
    log.stages["checks"]["end"] = [2 + BUSY_OTHER, 0, 0]
    assert "the checks stage (load 2.50, this run 2 thread(s))" in log.warning()
    log.start("checks", 2)
    log.end("checks")
    assert set(log.summary()["stages"]) == {"sweeps", "memory", "checks"}


def test_status_lines_go_to_stderr(capsys):
    pipeline.status("hello")
    captured = capsys.readouterr()
    assert captured.err == "[measure] hello\n" and captured.out == ""


def test_memory_stage_runs_one_child_per_mechanism(synthetic, monkeypatch):
    """memory_stage: one child per mechanism (fast, then dense), default variant, quick caps, curves in order;
    a failing child's error is reported on a status line, never raised."""
    import measure.memory

    calls = []

    def fake_curves(mech_id, tasks, *, variant=None, device="cpu", seed=0, on_point=None, timeout=0):
        calls.append((mech_id, [(impl, tuple(sizes)) for impl, sizes in tasks], variant))
        out = []
        for impl, sizes in tasks:
            points = [MemoryPoint(n, float(n), 1e7) for n in sizes[:1]]
            for _ in points:
                on_point()
            out.append(MemoryCurve(mech_id, variant, impl, device, points,
                                   error=None if impl == "fast" else "child died"))
        return out

    monkeypatch.setattr(measure.memory, "memory_curves", fake_curves)
    lines = []
    curves = stages.memory_stage([synthetic], True, "cpu", progress=False, status=lines.append)
    assert [(c.mechanism, c.impl) for c in curves] == [(MECH_ID, "fast"), (MECH_ID, "dense")]
    assert calls == [(MECH_ID, [("fast", tuple(2**p for p in range(6, 13))),  # under the caps
                                ("dense", tuple(2**p for p in range(6, 12)))], "narrow")]
    assert any("child died" in line for line in lines)


def test_variant_sweeps_get_a_point_budget(synthetic, monkeypatch):
    """The default variant's sweeps are taken without a budget (the checks' cache keys), the
    others with VARIANT_POINT_BUDGET_S of the mode."""
    seen = {}
    real = timing.sweep

    def spy(mech, impl, sizes=None, **kw):
        seen[kw["variant"], impl] = kw.get("point_budget")
        return real(mech, impl, sizes, **kw)

    monkeypatch.setattr(timing, "sweep", spy)
    collect(_opts())
    assert seen == {("narrow", "fast"): None, ("narrow", "dense"): None,
                    ("wide", "fast"): stages.VARIANT_POINT_BUDGET_S[True]}
