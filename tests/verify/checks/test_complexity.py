"""verify/checks/complexity.py with fake sweeps (no timing in pass/fail tests): one check per
mechanism, the class rules, the generic cost factor, the dense comparison, reasons on failure."""
from __future__ import annotations

import math

import numpy as np
import pytest

from verify.checks import complexity as C
from verify.mechanisms import get, mechanisms
from verify.registry import COST_FACTOR_CLASSES
from verify.result import Context
from verify.timing import Sweep


def _fake_sweeps(monkeypatch, models: dict, calls: list | None = None, cost=None, error=None):
    """Replace verify.timing.sweep by exact times t = models[impl](N) (x cost factor where given)."""
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
