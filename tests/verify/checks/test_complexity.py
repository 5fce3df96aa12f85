"""verify/checks/complexity.py with fake sweeps (no timing in pass/fail tests): one check per
mechanism, the class rules, the generic cost factor, the dense comparison, reasons on failure."""
from __future__ import annotations

import math

import numpy as np
import pytest

from measure.timing import Sweep, fit_times
from results.check import Context
from verify.checks import complexity as C
from verify.mechanisms import get, mechanisms
from verify.registry import COST_FACTOR_CLASSES


def _fake_sweeps(monkeypatch, models: dict, calls: list | None = None, cost=None, error=None):
    """Replace measure.timing.sweep by exact times t = models[impl](N) (x cost factor where given)."""
    def fake(mech, impl, sizes, *, variant=None, rounds=3, device="cpu", seed=0, cache=None, **kw):
        if calls is not None:
            calls.append(dict(mech=mech.id, impl=impl, sizes=tuple(sizes), variant=variant, rounds=rounds,
                              device=device, seed=seed, cache=cache))
        sizes = list(sizes)
        factors = None if mech.cost_factor is None else [float(cost(n) if cost else 1.0) for n in sizes]
        seconds = [models[impl](n) * (factors[i] if factors else 1.0) for i, n in enumerate(sizes)]
        return Sweep(mech.id, impl, device, "float32", 1, sizes, seconds, rounds,
                     all_rounds=[seconds] * rounds, variant=mech.variant(variant).name, seed=seed,
                     cost_factors=factors, error=error if impl == "fast" else None)
    monkeypatch.setattr(C, "sweep", fake)


LINEAR = {"fast": lambda n: 1e-6 * n, "dense": lambda n: 1e-9 * n * n}


def test_one_check_per_mechanism_with_the_class_rule():
    checks = C.checks()
    assert [c.id for c in checks] == [f"complexity/{m.id}" for m in mechanisms()]
    for c, m in zip(checks, mechanisms()):
        assert c.kind == "complexity" and c.source == m.source and c.unit == "exponent"
        if C.tested_class(m.complexity) == "N^2":
            assert (c.compare, c.threshold) == (">", C.QUADRATIC_LOWER)
        else:
            assert (c.compare, c.threshold) == ("<", C.CLASS_UPPER[C.tested_class(m.complexity)])
    assert C.tested_class("N diam") == COST_FACTOR_CLASSES["N diam"] == "N"
    assert C.claim_rule("N^3") is None


def test_linear_passes_and_sweeps_the_default_variant_through_the_cache(monkeypatch):
    calls = []
    _fake_sweeps(monkeypatch, LINEAR, calls)
    ctx = Context(quick=True, seed=7)
    mech = get("causal")
    r = C.check_for(mech).evaluate(ctx)
    assert r.status == "pass" and r.details["reasons"] == []
    assert r.statistic == pytest.approx(1.0, abs=1e-6) and r.statistic < r.threshold
    assert [c["impl"] for c in calls] == ["fast", "dense"]
    assert calls[0]["sizes"] == mech.sizes("fast", True) and calls[1]["sizes"] == mech.sizes("dense", True)
    assert all(c["variant"] is None and c["cache"] is ctx.sweeps and c["seed"] == 7 and c["rounds"] == 3
               for c in calls)
    assert r.details["speedup"]["fit"]["slope"] == pytest.approx(1.0, abs=1e-6)
    assert r.details["crossover_n"] is not None and r.details["variant"] == "default"


def test_full_mode_uses_the_full_grids(monkeypatch):
    calls = []
    _fake_sweeps(monkeypatch, LINEAR, calls)
    C.check_for(get("causal")).evaluate(Context(quick=False))
    assert calls[0]["sizes"] == get("causal").fast_sizes and calls[0]["rounds"] == C.ROUNDS[False]


def test_quadratic_fast_path_fails_with_a_reason(monkeypatch):
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-9 * n * n, "dense": lambda n: 1e-9 * n * n})
    r = C.check_for(get("linear")).evaluate(Context())
    assert r.status == "fail" and r.statistic == pytest.approx(2.0, abs=1e-6)
    reasons = r.details["reasons"]
    assert any("not < 1.35" in x for x in reasons)
    assert any("does not grow with N" in x for x in reasons)  # no speed-up either
    assert r.reasons == reasons


def test_softmax_needs_a_quadratic_lower_ci(monkeypatch):
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-9 * n * n})
    r = C.check_for(get("softmax")).evaluate(Context())
    assert r.status == "pass" and r.compare == ">" and r.statistic == pytest.approx(2.0, abs=1e-6)
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-6 * n})
    r = C.check_for(get("softmax")).evaluate(Context())
    assert r.status == "fail" and "not > 1.8" in r.details["reasons"][0]


def test_cost_factor_divides_time_generically(monkeypatch):
    """tree-diam: t = 1e-7 N diam(N) with diam ~ N / 4 is O(N diam): pass on t / diam; the same
    times without the division would be quadratic."""
    mech = get("tree-diam")
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-7 * n, "dense": lambda n: 1e-9 * n * n}, cost=lambda n: n / 4)
    r = C.check_for(mech).evaluate(Context())
    assert r.status == "pass", r.details["reasons"]
    fast = r.details["fast"]
    assert fast["cost_factor_name"] == "diam" and fast["cost_factors"] == [n / 4 for n in fast["sizes"]]
    assert fast["fit"]["slope"] == pytest.approx(2.0, abs=1e-6)  # raw time: quadratic
    assert fast["fit_time_over_diam"]["slope"] == pytest.approx(1.0, abs=1e-6)
    assert r.statistic == pytest.approx(fast["fit_time_over_diam"]["high"])
    assert "time / diam" in r.details["statistic"]


def test_cost_factor_class_fails_when_the_quotient_is_not_linear(monkeypatch):
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-9 * n * n, "dense": lambda n: 1e-9 * n * n},
                 cost=lambda n: math.log2(n))
    r = C.check_for(get("tree-diam")).evaluate(Context())
    assert r.status == "fail" and any("time / diam slope" in x for x in r.details["reasons"])


def test_a_sweep_that_stopped_fails_with_its_error(monkeypatch):
    _fake_sweeps(monkeypatch, LINEAR, error="N = 65,536: MemoryError: out")
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status == "fail" and any("MemoryError" in x for x in r.details["reasons"])


def test_too_few_points_fail(monkeypatch):
    import dataclasses

    mech = dataclasses.replace(get("linear"), quick_fast_sizes=(2**10, 2**11), quick_dense_sizes=(2**10, 2**11))
    _fake_sweeps(monkeypatch, LINEAR)
    r = C.check_for(mech).evaluate(Context())
    assert r.status == "fail" and r.statistic is None and "fewer than 3" in r.details["reasons"][0]


@pytest.mark.parametrize("noise_seed", [0, 1])
def test_noisy_linear_times_pass(monkeypatch, noise_seed):
    """Multiplicative noise of a few percent keeps a linear claim within the bound."""
    rng = np.random.default_rng(noise_seed)
    noise = {}
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-6 * n * noise.setdefault(("f", n), rng.uniform(0.97, 1.03)),
                               "dense": lambda n: 1e-9 * n * n * noise.setdefault(("d", n), rng.uniform(0.97, 1.03))})
    r = C.check_for(get("packing")).evaluate(Context())
    assert r.status == "pass" and 1.0 < r.statistic < r.threshold


# ------------------------------------------------------------------------------ a loaded machine
#
# A fake measure.timing.sweep on a busy machine, deterministic: every measurement is the true cost
# times a load factor, separately for the wall clock (waiting for a core counts) and the CPU clock
# (it does not; cache and bandwidth contention still add a little). The decision logic is tested
# on these numbers; no test times anything.


def _loaded_sweeps(monkeypatch, laws: dict, wall_load, cpu_load, calls: list | None = None, cpu: bool = True,
                   load: list | None = None):
    """Replace measure.timing.sweep: round r of attempt a (0: the first sweep of an impl, 1: its
    retry) at N measures laws[impl](N) * wall_load(a, impl, r, N) wall seconds and
    laws[impl](N) * cpu_load(a, impl, r, N) CPU seconds (no cpu_rounds if not ``cpu``: an
    accelerator's sweep), each with the wait share 1 - CPU / wall that the real sweep records;
    ``load``: the load averages sampled around each sweep (none: an unknown load). ``calls``
    records (impl, rounds, cache is None) of every sweep."""
    attempts: dict[str, int] = {}

    def fake(mech, impl, sizes, *, variant=None, rounds=3, device="cpu", seed=0, cache=None, **kw):
        a = attempts[impl] = attempts.get(impl, -1) + 1
        if calls is not None:
            calls.append((impl, rounds, cache is None))
        sizes = list(sizes)
        wall = [[laws[impl](n) * wall_load(a, impl, r, n) for n in sizes] for r in range(rounds)]
        cpus = [[laws[impl](n) * cpu_load(a, impl, r, n) for n in sizes] for r in range(rounds)]
        waits = [[max(0.0, 1 - c / w) for c, w in zip(cr, wr)] for cr, wr in zip(cpus, wall)]
        return Sweep(mech.id, impl, device, "float32", 1, sizes, list(np.median(wall, axis=0)), rounds,
                     all_rounds=wall, variant=mech.variant(variant).name, seed=seed,
                     cpu_rounds=cpus if cpu else None, wait_rounds=waits if cpu else None, load=list(load or []))

    monkeypatch.setattr(C, "sweep", fake)


def _draw(salt: int, a: int, impl: str, r: int, n: int) -> float:
    """A uniform [0, 1) number fixed by the measurement (attempt, impl, round, N): no shared state."""
    return float(np.random.default_rng([salt, a, impl == "dense", r, n]).random())


def _busy_wall(a, impl, r, n, burst=(1024, 2048)):
    """Wall clock on a loaded machine: every call waits 0.5-2x its cost for a core, and while the
    dense twin timed its smaller N a burst of load made them 5x slower in every round (short calls
    are hit hardest by time slicing): the wall speed-up curve flattens (causal's speed-up fit uses
    N = 1024..8192)."""
    return (1.5 + 1.5 * _draw(11, a, impl, r, n)) * (5.0 if impl == "dense" and n in burst else 1.0)


def _busy_cpu(a, impl, r, n):
    """CPU clock on the same machine: 0-3% contention on every measurement, and in round 0 a
    cache-thrashing neighbour doubles it at every other N (the minimum over rounds drops it)."""
    spike = 2.0 if r == 0 and (n.bit_length() % 2) else 1.0
    return (1.0 + 0.03 * _draw(12, a, impl, r, n)) * spike


QUADRATIC_FAST = {"fast": lambda n: 1e-9 * n * n, "dense": lambda n: 3e-9 * n * n}


def test_a_loaded_machine_does_not_fail_a_correct_fast_path(monkeypatch):
    """The same load judged on the wall clock fails causal's speed-up test; on the CPU clock, with
    each point the minimum over rounds, it passes on the first attempt with slopes near the truth."""
    calls = []
    _loaded_sweeps(monkeypatch, LINEAR, _busy_wall, _busy_cpu, calls)
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status == "pass", r.details["reasons"]
    assert r.details["clock"] == "cpu" and [c[0] for c in calls] == ["fast", "dense"]  # no retry
    assert r.details["fast"]["fit"]["slope"] == pytest.approx(1.0, abs=0.03)
    assert r.details["speedup"]["fit"]["slope"] == pytest.approx(1.0, abs=0.05)
    assert r.details["fast"]["seconds"] != r.details["fast"]["cpu_seconds"]  # the wall medians are kept beside
    assert len(r.details["attempts"]) == 1 and r.details["attempts"][0]["verdict"] == "pass"
    # the same machine without CPU times (the wall clock, medians): the speed-up test fails, retry and all
    _loaded_sweeps(monkeypatch, LINEAR, _busy_wall, _busy_cpu, cpu=False)
    wall = C.check_for(get("causal")).evaluate(Context())
    assert wall.status == "fail" and wall.details["clock"] == "wall" and len(wall.details["attempts"]) == 2
    assert any("does not grow with N" in x for x in wall.reasons)


def test_a_planted_quadratic_fails_under_the_same_load(monkeypatch):
    """A quadratic fast path on the same loaded machine fails (after its retry), never inconclusive."""
    calls = []
    _loaded_sweeps(monkeypatch, QUADRATIC_FAST, _busy_wall, _busy_cpu, calls)
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status == "fail" and "inconclusive" not in r.details
    assert r.statistic == pytest.approx(2.0, abs=0.05)
    assert any("not < 1.35" in x for x in r.reasons) and any("does not grow with N" in x for x in r.reasons)
    assert [c[0] for c in calls] == ["fast", "dense", "fast", "dense"]  # the retry, then the verdict
    assert [a["verdict"] for a in r.details["attempts"]] == ["fail", "fail"]


def test_a_burst_during_the_first_sweep_is_outvoted_by_the_retry(monkeypatch):
    """Every round of the first fast sweep timed its two largest N during a burst (x3 CPU seconds,
    as a memory-hungry neighbour can do): the first attempt fails (slope 1.34, upper CI 1.57), so
    the check re-times (RETRY_ROUNDS more rounds, not cached) and decides on the pooled rounds,
    whose minimum drops the burst: pass."""
    calls = []

    def burst(a, impl, r, n):
        return 3.0 if a == 0 and impl == "fast" and n >= 2**14 else 1.0

    _loaded_sweeps(monkeypatch, LINEAR, burst, burst, calls)
    r = C.check_for(get("causal")).evaluate(Context(quick=True))
    assert r.status == "pass", r.details["reasons"]
    first, second = r.details["attempts"]
    assert first["verdict"] != "pass" and first["fit"]["high"] >= C.CLASS_UPPER["N"]
    assert second["verdict"] == "pass" and second["fit"]["slope"] == pytest.approx(1.0, abs=1e-9)
    assert calls == [("fast", 3, False), ("dense", 3, False), ("fast", C.RETRY_ROUNDS[True], True),
                     ("dense", C.RETRY_ROUNDS[True], True)]
    assert r.details["rounds"] == 3 + C.RETRY_ROUNDS[True]


def _zigzag(a, impl, r, n):
    """Persistent scatter, the same in every round and attempt: exp(+-0.45) at alternate N."""
    return math.exp(0.45 if n.bit_length() % 2 else -0.45) if impl == "fast" else 1.0


def test_a_wide_interval_around_a_right_estimate_is_inconclusive_not_failed(monkeypatch):
    """Scatter that no rounds remove leaves causal's slope estimate at 1.0 but its interval above
    1.35: after the retry the check is inconclusive (status "inconclusive", not failed), with a reason.
    The same scatter on a quadratic fast path fails: an estimate on the wrong side is never
    inconclusive."""
    _loaded_sweeps(monkeypatch, LINEAR, _zigzag, _zigzag)
    r = C.check_for(get("causal")).evaluate(Context())
    fit = r.details["fast"]["fit"]
    assert fit["slope"] == pytest.approx(1.0, abs=1e-9) and fit["high"] >= C.CLASS_UPPER["N"]
    assert r.status == "inconclusive" and r.details["inconclusive"] is True and r.reasons == []
    assert "inconclusive" in r.details["reason"] and "not < 1.35" in r.details["reason"]
    assert "busy" not in r.details  # the fake machine was quiet: the interval, not the load
    assert r.statistic == pytest.approx(fit["high"]) and len(r.details["attempts"]) == 2
    _loaded_sweeps(monkeypatch, QUADRATIC_FAST, _zigzag, _zigzag)
    q = C.check_for(get("causal")).evaluate(Context())
    assert q.status == "fail" and "inconclusive" not in q.details and any("not < 1.35" in x for x in q.reasons)


def test_an_estimate_within_the_margin_fails():
    """The rule itself: inconclusive only with the estimate past the threshold by the margin."""
    from measure.timing import Fit

    assert C._one_sided(Fit(1.0, 0.6, 1.4, 0, 0.95, 0), "<", 1.35, C.SLOPE_MARGIN, "t", "")[0] == "unsure"
    assert C._one_sided(Fit(1.2, 1.0, 1.4, 0, 0.95, 0), "<", 1.35, C.SLOPE_MARGIN, "t", "")[0] == "fail"
    assert C._one_sided(Fit(1.4, 0.5, 2.3, 0, 0.95, 0), "<", 1.35, C.SLOPE_MARGIN, "t", "")[0] == "fail"
    assert C._one_sided(Fit(1.0, 0.9, 1.3, 0, 0.95, 0), "<", 1.35, C.SLOPE_MARGIN, "t", "")[0] == "pass"
    assert C._one_sided(Fit(2.1, 1.7, 2.5, 0, 0.95, 0), ">", 1.8, C.SLOPE_MARGIN, "t", "")[0] == "unsure"
    assert C._one_sided(Fit(1.9, 1.7, 2.1, 0, 0.95, 0), ">", 1.8, C.SLOPE_MARGIN, "t", "")[0] == "fail"


def test_the_speedup_curve_s_shape_is_not_noise(monkeypatch):
    """A dense twin whose times bend around the power law the same way in every round (cache steps):
    the t-interval of the speed-up fit reaches below 0, but the rounds agree, so the speed-up
    grows beyond their scatter (timing.speedup_interval): pass on the first attempt."""
    def shape(a, impl, r, n):
        return {1024: 2.6, 2048: 0.7, 4096: 1.6}.get(n, 1.0) if impl == "dense" else 1.0

    _loaded_sweeps(monkeypatch, LINEAR, shape, shape)
    r = C.check_for(get("causal")).evaluate(Context())
    sp = r.details["speedup"]
    assert sp["fit"]["low"] <= 0 < C.SPEEDUP_MARGIN <= sp["fit"]["slope"], sp
    assert r.status == "pass" and len(r.details["attempts"]) == 1
    assert sp["interval"][0] == pytest.approx(sp["fit"]["slope"]) == pytest.approx(sp["interval"][1])
    assert "bootstrap" in sp["interval_method"]


def _slow_rounds(a, impl, r, n):
    """In two of every three rounds the fast path at the largest common N (8192) ran 12x slower:
    the minimum is right, but a bootstrap replicate that misses the quiet rounds sees a speed-up
    that falls (its slope drops by ln 12 * 1.5 / (5 ln 2) = 1.08)."""
    return 12.0 if impl == "fast" and n == 8192 and r % 3 else 1.0


def test_a_speedup_scattered_by_rounds_is_inconclusive_unless_it_barely_grows(monkeypatch):
    """Round-to-round scatter widens the speed-up interval below 0 in both attempts: with the
    estimate at slope 1 (>= SPEEDUP_MARGIN) the check is inconclusive; with a dense twin that
    grows like N^1.3 (speed-up slope 0.3, below the margin) the same scatter fails it."""
    calls = []
    _loaded_sweeps(monkeypatch, LINEAR, _slow_rounds, _slow_rounds, calls)
    r = C.check_for(get("causal")).evaluate(Context())
    sp = r.details["speedup"]
    assert sp["fit"]["slope"] == pytest.approx(1.0, abs=1e-9) and sp["interval"][0] <= 0
    assert r.status == "inconclusive" and r.details["inconclusive"] and "does not grow" in r.details["reason"]
    assert [a["verdict"] for a in r.details["attempts"]] == ["inconclusive", "inconclusive"] and len(calls) == 4
    slow = {"fast": lambda n: 1e-6 * n, "dense": lambda n: 4e-5 * n**1.3}
    _loaded_sweeps(monkeypatch, slow, _slow_rounds, _slow_rounds)
    f = C.check_for(get("causal")).evaluate(Context())
    sp = f.details["speedup"]
    assert sp["fit"]["slope"] == pytest.approx(0.3, abs=1e-9) and sp["interval"][0] <= 0
    assert f.status == "fail" and any("does not grow" in x for x in f.reasons)


FLOOR = 5e-5  # a GPU call's floor (launches, host reads): the quick grid may never leave it


def test_launch_bound_times_on_an_accelerator_are_not_judged(monkeypatch):
    """On cuda, times at the per-call floor say nothing about the work: skipped with the reason,
    for the fast path and for a dense twin alike; the same times on the CPU are judged (and pass)."""
    _fake_sweeps(monkeypatch, {"fast": lambda n: FLOOR + 1e-11 * n, "dense": lambda n: FLOOR + 1e-13 * n * n})
    r = C.check_for(get("causal")).evaluate(Context(quick=True, device="cuda"))
    assert r.status == "skip" and r.statistic is None and r.reasons == []
    assert r.details["reason"].startswith("launch-bound on cuda: ")
    assert "judged on the CPU" in r.details["reason"] and r.details["fast"]["sizes"]
    # a twin at its floor drops only the speed-up test: the fast path's slope is still judged
    _fake_sweeps(monkeypatch, {"fast": lambda n: 1e-6 * n, "dense": lambda n: FLOOR + 1e-15 * n * n})
    r = C.check_for(get("causal")).evaluate(Context(quick=True, device="cuda:0"))
    assert r.status == "pass" and "speedup" not in r.details
    assert r.details["speedup_skipped"].startswith("launch-bound on cuda:0: ") and "(dense," in r.details["speedup_skipped"]


def test_a_quadratic_path_past_the_floor_still_fails_on_an_accelerator(monkeypatch):
    top = max(get("linear").sizes("fast", True))
    c = 200 * FLOOR / top**2  # 200 floors at the largest N: its last 4 sizes leave the floor
    _fake_sweeps(monkeypatch, {"fast": lambda n: FLOOR + c * n * n, "dense": lambda n: FLOOR + c * n * n})
    r = C.check_for(get("linear")).evaluate(Context(quick=True, device="cuda"))
    assert r.status == "fail" and any("not < 1.35" in x for x in r.reasons)
    assert C.launch_bound(C.sweep(get("linear"), "fast", get("linear").sizes("fast", True)), "cpu") is None


def test_a_linear_path_past_the_floor_is_judged_on_an_accelerator(monkeypatch):
    _fake_sweeps(monkeypatch, {"fast": lambda n: FLOOR + 1e-7 * n, "dense": lambda n: FLOOR + 1e-9 * n * n})
    r = C.check_for(get("causal")).evaluate(Context(quick=True, device="cuda"))
    assert r.status == "pass" and r.statistic < 1.35


# ------------------------------------------------------------------------------ a busy machine
#
# The sweeps record how busy the machine was (measure.timing.Sweep.busy: the wait share of each
# measurement and the load average around the sweep). Load that bends a correct path's slope past
# its bound makes the check "inconclusive: machine busy"; a planted quadratic still fails.

BUSY_LOAD = [4.6, 5.1]  # 3 CPU burners beside the timing thread on 2 cores


def _waiting(a, impl, r, n):
    """Wall clock beside one burner per core: the thread runs half the time."""
    return 2.0


def _bent(power: float):
    """CPU clock under load that grows with the working set: x (N / 512)^power in every round and
    attempt (no minimum removes it), plus 0-5% noise."""
    def cpu(a, impl, r, n):
        return (n / 512) ** power * (1.0 + 0.05 * _draw(13, a, impl, r, n))
    return cpu


@pytest.mark.parametrize("power", [0.0, 0.1, 0.2, 0.35, 0.5])
def test_load_on_a_linear_path_is_never_a_failure(monkeypatch, power):
    """A correct linear path whose CPU seconds load bends by N^power (slope 1 + power): pass while
    the bend stays inside the class, "inconclusive: machine busy" beyond it, never fail."""
    _loaded_sweeps(monkeypatch, LINEAR, _waiting, _bent(power), load=BUSY_LOAD)
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status in ("pass", "inconclusive"), r.details["reasons"]
    assert r.details["fast"]["fit"]["slope"] == pytest.approx(1.0 + power, abs=0.05)
    if r.status == "inconclusive":
        assert r.details["reason"].startswith("inconclusive: machine busy: load average 5.1 on ")
        assert r.reasons == [] and r.details["busy"] and len(r.details["attempts"]) == 2
    if power >= 0.5:
        assert r.status == "inconclusive"
        # the same times on a quiet machine fail: it is the recorded load that excuses them
        _loaded_sweeps(monkeypatch, LINEAR, lambda *a: 1.0, _bent(power), load=[1.0, 1.0])
        assert C.check_for(get("causal")).evaluate(Context()).status == "fail"


@pytest.mark.parametrize("power", [0.0, 0.2, 0.5])
def test_a_planted_quadratic_fails_on_a_busy_machine(monkeypatch, power):
    """The quadratic fast path under the same load: its whole slope interval lies beyond 1.35 +
    LOAD_SLACK, so load cannot explain it: fail, never inconclusive."""
    _loaded_sweeps(monkeypatch, QUADRATIC_FAST, _waiting, _bent(power), load=BUSY_LOAD)
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status == "fail" and "inconclusive" not in r.details and r.details["busy"]
    assert r.details["fast"]["fit"]["low"] >= C.CLASS_UPPER["N"] + C.LOAD_SLACK
    assert any("not < 1.35" in x for x in r.reasons)


def _both_slow(a, impl, r, n):
    """At the largest common N (8192) the fast path ran 12x slower in rounds 1, 2, 4, 5 and the dense
    twin in rounds 0, 2, 3, 5 (each has quiet rounds, so the minima are right): a bootstrap replicate
    that misses them sees the speed-up bend either way, so its interval is wide on both sides."""
    slow = (r % 3 != 0) if impl == "fast" else (r % 3 != 1)
    return 12.0 if n == 8192 and slow else 1.0


def test_a_speedup_interval_widened_on_a_busy_machine_is_inconclusive(monkeypatch):
    """A speed-up that grows slowly (dense twin ~N^1.3: slope 0.3, below SPEEDUP_MARGIN) with round
    scatter that spans 0 and SPEEDUP_MARGIN: on a quiet machine it fails (the estimate is too close
    to 0 to call the interval merely wide), on a busy one it is inconclusive; a speed-up whose whole
    interval lies below SPEEDUP_MARGIN (fast and twin both linear) fails on a busy machine too."""
    slow = {"fast": lambda n: 1e-6 * n, "dense": lambda n: 4e-5 * n**1.3}
    _loaded_sweeps(monkeypatch, slow, _both_slow, _both_slow, load=[1.0, 1.0])
    quiet = C.check_for(get("causal")).evaluate(Context())
    low, high = quiet.details["speedup"]["interval"]
    assert low <= 0 and high >= C.SPEEDUP_MARGIN, (low, high)
    assert quiet.status == "fail" and any("does not grow" in x for x in quiet.reasons)
    _loaded_sweeps(monkeypatch, slow, _both_slow, _both_slow, load=BUSY_LOAD)
    r = C.check_for(get("causal")).evaluate(Context())
    assert r.status == "inconclusive", r.reasons
    assert "does not grow" in r.details["reason"] and "machine busy" in r.details["reason"]
    flat = {"fast": lambda n: 1e-6 * n, "dense": lambda n: 2e-6 * n}
    _loaded_sweeps(monkeypatch, flat, _waiting, _bent(0.0), load=BUSY_LOAD)
    f = C.check_for(get("causal")).evaluate(Context())
    assert f.status == "fail" and any("does not grow" in x for x in f.reasons)


def test_inconclusive_is_counted_printed_and_not_a_pass(monkeypatch, capsys):
    """The runner's table counts it and says why; progress_line shows the reason; python -m verify
    exits 3 (1 when something also failed, 0 only when nothing failed or was inconclusive)."""
    import verify.__main__ as cli
    from results.check import CheckResult, STATUSES
    from verify.runner import format_table, progress_line

    assert "inconclusive" in STATUSES
    busy = CheckResult("complexity/causal", "t", "s", "complexity", "inconclusive", 1.5, 1.35, 2.0,
                       {"reason": "inconclusive: machine busy: load average 5 on 2 CPUs", "reasons": []}, "<",
                       "exponent")
    ok = CheckResult("complexity/linear", "t", "s", "complexity", "pass", 1.0, 1.35, 1.0, {"reasons": []}, "<",
                     "exponent")
    table = format_table([ok, busy])
    assert "1 passed, 0 failed, 0 skipped, 1 inconclusive" in table and "could not conclude" in table
    assert "machine busy" in table and busy.reasons == []
    assert progress_line(busy, 1, 2).endswith(": inconclusive: machine busy: load average 5 on 2 CPUs")
    for results, code in (([ok], 0), ([ok, busy], 3), ([busy, CheckResult(**{**ok.__dict__, "status": "fail"})], 1)):
        monkeypatch.setattr(cli, "run_checks", lambda results=results, **kw: results)
        assert cli.main(["--quick", "--no-progress"]) == code
    capsys.readouterr()


def test_a_covering_full_sweep_is_judged_on_the_check_grid(monkeypatch):
    """measure's full sweep covers the quick grid: the quick check reuses its measurements (no new
    sweep) but judges them at the quick grid's sizes only, as python -m verify --quick would. The
    full grid here bends above 2^14 (a cache step: 3x per octave) as difformer's did on a quiet
    machine; judged on the full grid that reads as super-linear, on the quick grid it passes."""
    from measure.timing import sweep_key

    mech = get("difformer")

    def bent(n):  # linear, then 3x per doubling above 2^14 (out of cache)
        return 1e-7 * n * (1.5 ** max(0, math.log2(n / 2**14)))

    def full(impl, model):
        sizes = list(mech.sizes(impl, False))
        secs = [model(n) for n in sizes]
        return Sweep(mech.id, impl, "cpu", "float32", 1, sizes, secs, 5, all_rounds=[secs] * 5,
                     variant=mech.default_variant.name, seed=0)

    ctx = Context(quick=True)
    for impl, model in (("fast", bent), ("dense", lambda n: 1e-9 * n * n)):
        s = full(impl, model)
        ctx.sweeps[sweep_key(mech.id, s.variant, impl, s.sizes, 5, "cpu", 0, None)] = s
    monkeypatch.setattr(C, "sweep", lambda *a, **k: pytest.fail("the covering sweep should be reused"))
    r = C.check_for(mech).evaluate(ctx)
    assert r.status == "pass" and r.details["fast"]["sizes"] == list(mech.sizes("fast", True))
    assert fit_times(*(lambda s: (s.sizes, s.seconds))(full("fast", bent)))[1].slope > C.CLASS_UPPER["N"]  # the whole grid fails
