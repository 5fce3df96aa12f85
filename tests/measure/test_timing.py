"""measure/timing.py: the fit rule, exponent fits, crossover (with its interval) and the sweep
machinery (variants, cost factors, metrics, errors, the cache), on synthetic data."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from measure import timing
from measure.timing import Fit, Sweep, compare, crossover, crossover_interval, fit_exponent, fit_points, fit_times
from results.schema import Fit as SchemaFit
from tests.helpers import DEVICES
from verify.registry import Mechanism, Variant

SIZES = [2**p for p in range(8, 20)]  # 12 points over 3.6 decades


def test_fit_is_the_schema_fit():
    assert Fit is SchemaFit


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0])
def test_fit_exponent_noise_free_is_exact(p):
    t = 3e-9 * np.asarray(SIZES, float) ** p
    fit = fit_exponent(SIZES, t)
    # exact data: only float64 round-off in the log-log regression
    assert fit.slope == pytest.approx(p, abs=1e-12)
    assert fit.robust_slope == pytest.approx(p, abs=1e-12)
    assert fit.low == pytest.approx(p, abs=1e-9) and fit.high == pytest.approx(p, abs=1e-9)
    assert fit.intercept == pytest.approx(np.log(3e-9), abs=1e-9)


@pytest.mark.parametrize("p", [1.0, 1.15, 2.0])
def test_fit_exponent_recovers_p_inside_its_ci(p):
    """t = c N^p exp(0.02 eps): at confidence 1 - 1e-6 a correct fit misses p with probability 1e-6
    (seeded, so deterministic); the CI must also be informative (exclude p +- 0.2, which it does
    unless the sample stderr is ~9x its expectation, probability far below 1e-6)."""
    rng = np.random.default_rng(12345)
    t = 2e-8 * np.asarray(SIZES, float) ** p * np.exp(0.02 * rng.standard_normal(len(SIZES)))
    fit = fit_exponent(SIZES, t, confidence=1 - 1e-6)
    assert fit.low <= p <= fit.high
    assert fit.high < p + 0.2 and fit.low > p - 0.2
    assert fit.low <= fit.slope <= fit.high and fit.confidence == 1 - 1e-6


def test_fit_exponent_ci_has_its_nominal_coverage():
    """Over 600 seeded replicates of a 5-point fit (3 degrees of freedom) the 95% interval covers
    the true slope about 95% of the time: two-sided exact binomial test, rejecting only at
    p < 1e-6. With so few points the Student t quantile matters: a normal quantile would cover
    only ~87% (here 521/600, rejected at p ~ 1e-14)."""
    rng = np.random.default_rng(7)
    sizes = [2**p for p in range(10, 15)]
    reps, hits = 600, 0
    for _ in range(reps):
        t = 1e-6 * np.asarray(sizes, float) ** 1.3 * np.exp(0.1 * rng.standard_normal(len(sizes)))
        fit = fit_exponent(sizes, t, confidence=0.95)
        hits += fit.low <= 1.3 <= fit.high
    assert stats.binomtest(hits, reps, 0.95).pvalue > 1e-6, hits


def test_fit_exponent_needs_three_points():
    with pytest.raises(ValueError, match=">= 3 sizes"):
        fit_exponent([1024, 2048], [1e-3, 2e-3])
    fit_exponent([1024, 2048, 4096], [1e-3, 2e-3, 4e-3])  # three is enough
    with pytest.raises(ValueError, match="positive"):
        fit_exponent([1024, 2048, 4096], [1e-3, 0.0, 4e-3])


# ------------------------------------------------------------------------------ the one fit rule


def test_fit_points_is_the_one_rule():
    """t >= MIN_FIT_S, but at least the largest FIT_MIN_POINTS sizes; all points when fewer."""
    assert timing.MIN_FIT_S == 1e-3 and timing.FIT_MIN_POINTS == 4
    sizes = [2**p for p in range(6, 14)]
    seconds = [max(2e-4, 1e-9 * n**2) for n in sizes]  # a 0.2 ms floor, then N^2: 1e-3 from 2^10 on
    np.testing.assert_array_equal(fit_points(sizes, seconds), [s >= 1e-3 for s in seconds])
    # only two points above 1e-2: the largest four are kept (order of the input does not matter)
    keep = fit_points(sizes[::-1], seconds[::-1], 1e-2)
    assert [n for n, k in zip(sizes[::-1], keep) if k] == sizes[::-1][:4]
    assert fit_points([1, 2, 3], [0.0, 0.0, 0.0]).all()  # fewer than four: all
    with pytest.raises(ValueError, match="same length"):
        fit_points([1, 2], [1.0])


def test_fit_exponent_with_min_seconds_applies_the_rule():
    sizes = [2**p for p in range(6, 14)]
    seconds = [max(2e-4, 1e-9 * n**2) for n in sizes]
    assert fit_exponent(sizes, seconds).slope < 1.9  # the floor bends a plain fit
    assert fit_exponent(sizes, seconds, min_seconds=timing.MIN_FIT_S).slope == pytest.approx(2.0, abs=1e-12)
    few = fit_exponent(sizes, seconds, min_seconds=1e-2)
    assert few.slope == pytest.approx(fit_exponent(sizes[-4:], seconds[-4:]).slope, abs=1e-15)


def test_fit_times_uses_the_rule_for_both_fits():
    """fit_times: points by raw time; the cost fit regresses t / factor on the same points."""
    sizes = [2**p for p in range(6, 14)]
    diam = [math.log2(n) for n in sizes]
    seconds = [max(2e-4, 1e-7 * n * d) for n, d in zip(sizes, diam)]  # floor, then N diam
    fitted, fit, cost_fit = fit_times(sizes, seconds, diam)
    assert fitted == list(fit_points(sizes, seconds))
    keep = np.asarray(fitted)
    assert 4 <= keep.sum() < len(sizes)
    assert fit.slope == pytest.approx(fit_exponent(np.asarray(sizes)[keep], np.asarray(seconds)[keep]).slope)
    assert cost_fit.slope == pytest.approx(1.0, abs=1e-12)  # t / diam = 1e-7 N exactly on the kept points
    assert fit.slope > 1.05  # the diameter's log factor shows in the raw fit
    assert fit_times(sizes, seconds)[2] is None  # no cost factors, no cost fit
    assert fit_times(sizes, seconds, [1.0] * (len(sizes) - 1) + [None])[2] is None
    assert fit_times([8, 16], [1.0, 2.0]) == ([True, True], None, None)  # < 3 points: no fit
    assert fit_times([], []) == ([], None, None)


def test_fit_to_dict_is_json():
    d = fit_exponent(SIZES[:4], [1.0, 2.0, 4.0, 8.0]).to_dict()
    assert set(d) == {"slope", "low", "high", "intercept", "confidence", "robust_slope"}
    json.dumps(d)


# ------------------------------------------------------------------------------ crossover


def _sweep(sizes, seconds, impl="fast", all_rounds=None):
    return Sweep("mech", impl, "cpu", "float32", 1, list(sizes), list(seconds), 1,
                 all_rounds=[] if all_rounds is None else all_rounds)


def _noisy(sizes, law, rounds, rng, sigma):
    """A sweep whose rounds scatter by exp(sigma eps) around law(N); seconds = their medians."""
    table = np.array([[law(n) * math.exp(sigma * rng.standard_normal()) for n in sizes] for _ in range(rounds)])
    return list(np.median(table, axis=0)), table.tolist()


def test_crossover_extrapolated_from_fits():
    """fast t = a N, dense t = b N^2: they cross at N = a / b."""
    a, b = 1e-6, 1e-9
    fast_n, dense_n = [2**p for p in range(11, 17)], [2**p for p in range(6, 10)]  # disjoint ranges
    got = crossover(_sweep(fast_n, [a * n for n in fast_n]), _sweep(dense_n, [b * n * n for n in dense_n], "dense"))
    assert got == pytest.approx(a / b, rel=1e-9)


def test_crossover_interpolated_inside_common_range():
    a, b = 1e-6, 1e-9
    sizes = [2**p for p in range(6, 14)]  # fast is slower at 64, faster from 1024 on
    got = crossover(_sweep(sizes, [a * n for n in sizes]), _sweep(sizes, [b * n * n for n in sizes], "dense"))
    assert got == pytest.approx(1000.0, rel=1e-9)
    assert sizes[0] < got < sizes[-1]


def test_crossover_when_fast_already_wins_at_the_smallest_size():
    sizes = [256, 512, 1024, 2048]
    got = crossover(_sweep(sizes, [1e-9 * n for n in sizes]), _sweep(sizes, [1e-9 * n * n for n in sizes], "dense"))
    assert got == 256.0


def test_crossover_none_when_fast_never_wins():
    sizes = [256, 512, 1024, 2048]
    assert crossover(_sweep(sizes, [1e-6 * n * n for n in sizes]), _sweep(sizes, [1e-9 * n for n in sizes], "dense")) is None


def test_crossover_interval_covers_the_true_crossover():
    """fast 1e-6 N, dense 1e-9 N^2 (true crossover 1000, inside the grid), 7 rounds scattered by
    3%: the bootstrap interval holds the estimate and the truth, and is informative. The estimate
    is off by at most a few percent and the interval spans the neighbouring grid points' noise,
    so [500, 2000] is a loose outer bound that a correct interval cannot leave."""
    rng = np.random.default_rng(3)
    sizes = [2**p for p in range(6, 14)]
    tf, rf = _noisy(sizes, lambda n: 1e-6 * n, 7, rng, 0.03)
    td, rd = _noisy(sizes, lambda n: 1e-9 * n * n, 7, rng, 0.03)
    fast, dense = _sweep(sizes, tf, all_rounds=rf), _sweep(sizes, td, "dense", rd)
    est = crossover(fast, dense)
    low, high = crossover_interval(fast, dense)
    assert low <= est <= high
    assert low <= 1000.0 <= high
    assert 500 < low and high < 2000
    # deterministic: the bootstrap uses its own seeded generator
    assert crossover_interval(fast, dense) == (low, high)
    # more noise, wider interval
    tf2, rf2 = _noisy(sizes, lambda n: 1e-6 * n, 7, np.random.default_rng(3), 0.3)
    td2, rd2 = _noisy(sizes, lambda n: 1e-9 * n * n, 7, np.random.default_rng(4), 0.3)
    low2, high2 = crossover_interval(_sweep(sizes, tf2, all_rounds=rf2), _sweep(sizes, td2, "dense", rd2))
    assert high2 / low2 > high / low


def test_crossover_interval_extrapolated_and_unbounded_cases():
    rng = np.random.default_rng(5)
    fast_n, dense_n = [2**p for p in range(11, 17)], [2**p for p in range(6, 10)]
    tf, rf = _noisy(fast_n, lambda n: 1e-6 * n, 5, rng, 0.02)
    td, rd = _noisy(dense_n, lambda n: 1e-9 * n * n, 5, rng, 0.02)
    fast, dense = _sweep(fast_n, tf, all_rounds=rf), _sweep(dense_n, td, "dense", rd)
    c = compare(fast, dense)
    assert c.extrapolated and c.crossover_low <= c.crossover <= c.crossover_high
    assert c.crossover_low < 1000.0 < c.crossover_high  # the truth
    assert c.sizes == [] and c.measured_crossover is None and c.speedup_fit is None
    # fast already wins at the smallest common N: the crossover is an upper bound, no lower bound
    sizes = [256, 512, 1024, 2048]
    tf, rf = _noisy(sizes, lambda n: 1e-9 * n, 3, rng, 0.02)
    td, rd = _noisy(sizes, lambda n: 1e-9 * n * n, 3, rng, 0.02)
    low, high = crossover_interval(_sweep(sizes, tf, all_rounds=rf), _sweep(sizes, td, "dense", rd))
    assert low is None and high == 256.0
    # never: dense grows slower
    tf, rf = _noisy(sizes, lambda n: 1e-6 * n * n, 3, rng, 0.02)
    td, rd = _noisy(sizes, lambda n: 1e-9 * n, 3, rng, 0.02)
    c = compare(_sweep(sizes, tf, all_rounds=rf), _sweep(sizes, td, "dense", rd))
    assert c.crossover is None and c.crossover_high is None and not c.extrapolated
    # one round: nothing to resample
    assert crossover_interval(_sweep(sizes, tf, all_rounds=[tf]), _sweep(sizes, td, "dense", [td])) == (None, None)
    assert crossover_interval(_sweep(sizes, tf), _sweep(sizes, td, "dense")) == (None, None)
    with pytest.raises(ValueError, match="confidence"):
        crossover_interval(_sweep(sizes, tf), _sweep(sizes, td, "dense"), confidence=1.0)


def test_compare_fills_the_comparison():
    a, b = 1e-6, 1e-9
    sizes = [2**p for p in range(6, 14)]
    tf, td = [a * n for n in sizes], [b * n * n for n in sizes]
    c = compare(_sweep(sizes, tf), _sweep(sizes, td, "dense"))
    assert c.mechanism == "mech" and c.variant == "default" and c.sizes == sizes
    np.testing.assert_allclose(c.speedup, [d / f for d, f in zip(td, tf)])
    assert c.crossover == pytest.approx(1000.0) and not c.extrapolated
    assert c.measured_crossover == 1024  # first grid point where fast wins, and it keeps winning
    # speed-up fit: common N where both times pass the rule (min(t_f, t_d) >= 1 ms from 2^10 on... )
    keep = fit_points(sizes, np.minimum(tf, td))
    assert c.speedup_fit.slope == pytest.approx(1.0, abs=1e-12) and keep.sum() >= 4
    assert (c.crossover_low, c.crossover_high) == (None, None)  # no per-round times


def test_measured_crossover_walks_down_from_the_largest_n():
    assert timing.measured_crossover([1, 2, 3, 4], [1.5, 0.9, 1.2, 1.3]) == 3  # noise at N=1 ignored
    assert timing.measured_crossover([1, 2, 3], [2.0, 2.0, 0.5]) is None
    assert timing.measured_crossover([], []) is None


# ------------------------------------------------------------------------------ sweeps


@pytest.mark.parametrize("device", DEVICES)
def test_measure_repeats_until_min_time(device):
    """On each device (CUDA: a synchronise after every call, so the window holds finished work)."""
    calls = []
    x = torch.ones(32, 32, device=device)

    def run():
        calls.append(1)
        return x @ x

    per_call = timing.measure(run, device=device, min_time=0.01)
    assert len(calls) >= 1 and per_call > 0
    assert per_call * len(calls) >= 0.01  # the mean over a window of at least min_time


def test_pinned_threads_restores():
    before = torch.get_num_threads()
    with timing.pinned_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), timing.pinned_threads(2):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with timing.pinned_threads(None):
        assert torch.get_num_threads() == before


class _Progress:
    n = 0

    def update(self, k):
        self.n += k


def _record(fail_setup_at=None, fail_call_at=None, calls=None, cost=True, **kw):
    """A synthetic record whose runner returns its own 'time' (law 1e-6 N * scale): with
    timing.measure monkeypatched to call the runner, sweeps are exact and instant."""

    def make_problem(n, seed, scale=1.0):
        return SimpleNamespace(n=n, seed=seed, scale=scale)

    def fast_setup(p, device, dtype, requires_grad=False):
        if calls is not None:
            calls.append(p.n)
        if fail_setup_at is not None and p.n >= fail_setup_at:
            raise MemoryError(f"no room for N={p.n}")
        state = {"calls": 0}

        def run():
            state["calls"] += 1
            if fail_call_at is not None and p.n >= fail_call_at and state["calls"] > 1:
                raise RuntimeError("boom")
            return 1e-6 * p.n * p.scale

        return run

    kw.setdefault("metrics", lambda p: {"depth": math.log2(p.n), "depth bound": 2 * math.log2(p.n)})
    extra = dict(complexity="N diam", cost_factor=lambda p: math.log2(p.n), cost_factor_name="log2 N") if cost \
        else dict(complexity="N")
    return Mechanism(id="synthetic-timing", title="t", source="s", make_problem=make_problem,
                     reference=lambda p: None, fast_setup=fast_setup,
                     dense_setup=lambda p, d, t, requires_grad=False: (lambda: 1e-9 * p.n * p.n),
                     variants=(Variant("one"), Variant("two", params={"scale": 3.0}, fast_sizes=(8, 16, 32, 64))),
                     fast_sizes=(16, 32, 64, 128), **extra, **kw)


@pytest.fixture
def exact_measure(monkeypatch):
    monkeypatch.setattr(timing, "measure", lambda runner, device="cpu", min_time=0: runner())


def test_sweep_records_variant_cost_factors_and_metrics(exact_measure):
    mech = _record()
    progress = _Progress()
    s = timing.sweep(mech, "fast", variant="two", rounds=2, progress=progress)
    assert s.variant == "two" and s.sizes == [8, 16, 32, 64]  # the variant's own grid
    np.testing.assert_allclose(s.seconds, [3e-6 * n for n in s.sizes])
    assert s.cost_factors == [3.0, 4.0, 5.0, 6.0]
    assert s.metrics == {"depth": [3.0, 4.0, 5.0, 6.0], "depth bound": [6.0, 8.0, 10.0, 12.0]}
    assert progress.n == 8 and s.error is None and s.error_n is None
    d = timing.sweep(mech, "fast", rounds=1)  # default variant, the mechanism's grid
    assert d.variant == "one" and d.sizes == [16, 32, 64, 128]
    np.testing.assert_allclose(d.seconds, [1e-6 * n for n in d.sizes])
    r = s.to_result()
    assert r.variant == "two" and r.fitted == list(fit_points(s.sizes, s.seconds)) and r.fit is not None
    assert r.cost_fit.slope == pytest.approx(fit_exponent(s.sizes, np.array(s.seconds) / s.cost_factors).slope)
    assert r.metrics == s.metrics and r.cost_factors == s.cost_factors
    with pytest.raises(KeyError, match="no variant 'three'"):
        timing.sweep(mech, "fast", variant="three")
    json.dumps(s.to_dict()), json.dumps(r.to_dict())


def test_sweep_without_cost_factor_or_metrics(exact_measure):
    mech = _record(cost=False, metrics=None)
    s = timing.sweep(mech, "dense", (8, 16), rounds=1)
    assert s.cost_factors is None and s.metrics == {} and s.impl == "dense"
    assert s.to_result().cost_fit is None and s.to_result().fit is None  # 2 points: no fit


@pytest.mark.parametrize("where", ["setup", "call"])
def test_sweep_error_stops_larger_n_and_keeps_the_points_before(exact_measure, where):
    calls = []
    mech = _record(calls=calls, **({"fail_setup_at": 64} if where == "setup" else {"fail_call_at": 64}))
    progress = _Progress()
    s = timing.sweep(mech, "fast", (16, 32, 64, 128), rounds=3, progress=progress)
    assert s.sizes == [16, 32] and len(s.seconds) == 2 and np.array(s.all_rounds).shape == (3, 2)
    assert s.error_n == 64 and s.error.startswith("N = 64: ")
    assert ("MemoryError" if where == "setup" else "RuntimeError: boom") in s.error
    assert s.cost_factors == [4.0, 5.0] and s.metrics["depth"] == [4.0, 5.0]
    assert progress.n == 12  # the bar still reaches its total
    if where == "setup":
        assert 128 not in calls  # larger N are not even set up
    assert s.to_result().error_n == 64


def test_sweep_cache_hit_miss_and_key(exact_measure):
    calls = []
    mech = _record(calls=calls)
    cache: dict = {}
    s = timing.sweep(mech, "fast", (16, 32), rounds=2, cache=cache)
    key = ("synthetic-timing", "one", "fast", (16, 32), 2, "cpu", 0)
    assert list(cache) == [key] and cache[key] is s and timing.sweep_key(*key) == key
    progress = _Progress()
    again = timing.sweep(mech, "fast", [16, 32], variant="one", rounds=2, cache=cache, progress=progress)
    assert again is s and calls == [16, 32] and progress.n == 4  # a hit: nothing set up, bar complete
    # any field of the key changes: a miss, stored beside
    timing.sweep(mech, "fast", (16, 32), rounds=3, cache=cache)
    timing.sweep(mech, "fast", (16, 32), rounds=2, seed=1, cache=cache)
    timing.sweep(mech, "fast", (16, 32), variant="two", rounds=2, cache=cache)
    assert len(cache) == 4 and len(calls) == 8
    # same key, other threads: measured again (and replaces the entry)
    other = timing.sweep(mech, "fast", (16, 32), rounds=2, threads=None, cache=cache)
    assert other is not s and cache[key] is other and len(calls) == 10


def test_sweep_on_a_registered_mechanism():
    from verify.mechanisms import get

    progress = _Progress()
    threads = torch.get_num_threads()
    s = timing.sweep(get("linear"), "fast", (8, 16, 32), rounds=2, threads=1, progress=progress)
    assert s.mechanism == "linear" and s.impl == "fast" and s.dtype == "float32" and s.threads == 1
    assert s.variant == get("linear").default_variant.name
    assert s.sizes == [8, 16, 32] and len(s.seconds) == 3 and all(t > 0 for t in s.seconds)
    assert np.array(s.all_rounds).shape == (2, 3)
    np.testing.assert_allclose(s.seconds, np.median(s.all_rounds, axis=0))
    assert progress.n == 6
    assert torch.get_num_threads() == threads
    json.dumps(s.to_dict())


def test_sweep_rejects_bad_arguments():
    from verify.mechanisms import get

    with pytest.raises(ValueError, match="impl must be 'fast' or 'dense'"):
        timing.sweep(get("linear"), "slow", (8,))
    with pytest.raises(ValueError, match="'softmax' has no dense implementation"):
        timing.sweep(get("softmax"), "dense", (8,))
    with pytest.raises(ValueError, match="rounds must be"):
        timing.sweep(get("linear"), "fast", (8,), rounds=0)
    with pytest.raises(ValueError, match="sizes must be"):
        timing.sweep(get("linear"), "fast", (0, 8))


def test_environment_facts():
    env = timing.environment()
    assert {"torch", "threads", "cpus", "omp_num_threads", "cuda"} <= set(env)
    assert env["torch"] == torch.__version__


def test_sweep_point_budget_skips_later_rounds_of_slow_points(exact_measure, monkeypatch):
    """With a budget, an N whose timed measurements used it gets no further round (NaN), at least
    one round each; the median is over the rounds done; the key carries the budget."""
    clock = {"t": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])

    def fake_measure(runner, device="cpu", min_time=0):
        t = runner()
        clock["t"] += t * 1e4  # N = 16 'spends' 0.16 s per round, N = 128 1.28 s
        return t

    monkeypatch.setattr(timing, "measure", fake_measure)
    mech = _record()
    cache: dict = {}
    progress = _Progress()
    s = timing.sweep(mech, "fast", (16, 128), rounds=3, point_budget=0.5, cache=cache, progress=progress)
    rounds = np.array(s.all_rounds)
    assert np.isfinite(rounds[:, 0]).all()  # 0.16 s per round: three rounds (0.32 < 0.5 before the third)
    assert np.isfinite(rounds[0, 1]) and np.isnan(rounds[1:, 1]).all()  # 1.28 s: one round
    np.testing.assert_allclose(s.seconds, [16e-6, 128e-6])
    assert s.point_budget == 0.5 and progress.n == 6
    assert list(cache) == [timing.sweep_key(mech.id, "one", "fast", (16, 128), 3, "cpu", 0, 0.5)]
    assert list(cache)[0][-1] == ("point_budget", 0.5)
    r = s.to_result()
    assert r.fit is None and np.isnan(r.all_rounds[1][1])
    with pytest.raises(ValueError, match="point_budget"):
        timing.sweep(mech, "fast", (16,), point_budget=0)


def test_crossover_interval_with_skipped_rounds():
    """NaN rounds (a point budget) count as the point's median: the interval stays defined."""
    sizes = [2**p for p in range(6, 14)]
    tf, td = [1e-6 * n for n in sizes], [1e-9 * n * n for n in sizes]
    rf = [list(np.array(tf) * f) for f in (0.98, 1.0, 1.02)]
    rd = [list(np.array(td) * f) for f in (0.97, 1.0, 1.03)]
    rd[1][-1] = rd[2][-1] = float("nan")
    low, high = crossover_interval(_sweep(sizes, tf, all_rounds=rf), _sweep(sizes, td, "dense", rd))
    assert low is not None and high is not None and low <= 1000.0 <= high


def test_covering_sweep_answers_only_for_a_superset_with_enough_rounds():
    from measure.timing import Sweep, covering_sweep, sweep_key

    full = Sweep("m", "fast", "cpu", "float32", 1, [64, 128, 256, 512], [1.0, 2.0, 4.0, 8.0], 5, variant="v")
    budgeted = Sweep("m", "fast", "cpu", "float32", 1, [64, 128, 256, 512], [1.0, 2.0, 4.0, 8.0], 5, variant="v")
    cache = {sweep_key("m", "v", "fast", full.sizes, 5, "cpu", 0): full,
             sweep_key("m", "v", "fast", budgeted.sizes, 9, "cpu", 0, point_budget=1.0): budgeted}
    assert covering_sweep(cache, "m", "v", "fast", (128, 256), 3, "cpu", 0) is full
    assert covering_sweep(cache, "m", "v", "fast", (128, 256), 5, "cpu", 0) is full
    assert covering_sweep(cache, "m", "v", "fast", (128, 256), 6, "cpu", 0) is None  # too few rounds
    assert covering_sweep(cache, "m", "v", "fast", (128, 1024), 3, "cpu", 0) is None  # N not timed
    assert covering_sweep(cache, "m", "v", "dense", (128,), 3, "cpu", 0) is None
    assert covering_sweep(cache, "m", "w", "fast", (128,), 3, "cpu", 0) is None
    assert covering_sweep(cache, "m", "v", "fast", (128,), 3, "cpu", 1) is None  # another seed
    assert covering_sweep(cache, "m", "v", "fast", (128,), 3, "cpu", 0, threads=2) is None
    full.error = "N = 512: RuntimeError: boom"
    assert covering_sweep(cache, "m", "v", "fast", (128,), 3, "cpu", 0) is None  # never a failed sweep
    assert covering_sweep(None, "m", "v", "fast", (128,), 3, "cpu", 0) is None


# ------------------------------------------------------------------------------ the CPU clock


def test_cpu_clock_applies_to_one_thread_on_the_cpu_only():
    assert timing.cpu_clock_applies("cpu", 1) and timing.cpu_clock_applies("cpu:0", 1)
    assert not timing.cpu_clock_applies("cpu", None) and not timing.cpu_clock_applies("cpu", 2)
    assert not timing.cpu_clock_applies("cuda", 1) and not timing.cpu_clock_applies("cuda:1", 1)
    assert timing.CLOCKS == {"wall": "median", "cpu": "min"}


def test_sweep_records_cpu_seconds_per_call_beside_the_wall_times(monkeypatch):
    """A fake measurement makes 4 calls per measurement, each costing half its wall time in
    process CPU seconds (a fake process_time): cpu_rounds holds CPU seconds per call, counted
    through the runner, and the wall times are unchanged; with threads unpinned none are kept."""
    cpu = {"t": 0.0}
    monkeypatch.setattr(timing.time, "process_time", lambda: cpu["t"])
    load = iter([1.0, 3.0, 2.0] * 8)  # a per-measurement factor on the CPU clock: rounds differ

    def fake_measure(runner, device="cpu", min_time=0):
        f = next(load)
        for _ in range(4):
            t = runner()
            cpu["t"] += 0.5 * t * f
        return t

    monkeypatch.setattr(timing, "measure", fake_measure)
    s = timing.sweep(_record(cost=False), "fast", (16, 32, 64), rounds=2)
    np.testing.assert_allclose(s.seconds, [1e-6 * n for n in (16, 32, 64)])  # wall: the runner's own 'time'
    np.testing.assert_allclose(s.cpu_rounds, [[0.5e-6 * 16, 1.5e-6 * 32, 1e-6 * 64],
                                              [0.5e-6 * 16, 1.5e-6 * 32, 1e-6 * 64]])
    assert s.clock == "wall" and s.summary == "median"
    v = s.cpu_view()
    assert v.clock == "cpu" and v.summary == "min" and v.cpu_view() is v
    np.testing.assert_allclose(v.seconds, np.min(s.cpu_rounds, axis=0))
    assert v.all_rounds == s.cpu_rounds and v.sizes == s.sizes and v.rounds == 2
    json.dumps(s.to_dict())
    assert s.to_result().seconds == s.seconds  # the report's record: wall seconds, as before
    unpinned = timing.sweep(_record(cost=False), "fast", (16, 32, 64), rounds=1, threads=None)
    assert unpinned.cpu_rounds is None and unpinned.cpu_view() is None


def test_cpu_view_takes_the_minimum_and_refuses_unusable_cpu_times():
    s = Sweep("m", "fast", "cpu", "float32", 1, [8, 16, 32], [1.0, 2.0, 4.0], 3,
              all_rounds=[[1.0, 2.0, 4.0]] * 3,
              cpu_rounds=[[1.0, 2.5, math.nan], [0.9, 2.0, 4.5], [1.2, 3.0, 4.0]])
    np.testing.assert_allclose(s.cpu_view().seconds, [0.9, 2.0, 4.0])  # NaN (a skipped round) ignored
    assert _sweep([8, 16], [1.0, 2.0]).cpu_view() is None  # none recorded
    s.cpu_rounds[0][0] = 0.0  # a replaced measure() that took no CPU time
    assert s.cpu_view() is None
    s.cpu_rounds = [[1.0, 2.0, math.nan]] * 3  # a point without any CPU time
    assert s.cpu_view() is None


def test_merge_rounds_pools_a_retry():
    first = Sweep("mech", "fast", "cpu", "float32", 1, [8, 16, 32], [1.0, 2.0, 4.0], 3,
                  all_rounds=[[1.0, 2.0, 4.0], [1.1, 2.2, 4.4], [0.9, 1.8, 9.0]],
                  cpu_rounds=[[1.0, 2.0, 8.0], [1.0, 2.0, 8.0], [1.0, 2.0, 8.0]])
    again = Sweep("mech", "fast", "cpu", "float32", 1, [8, 16, 32], [1.0, 2.0, 4.0], 2,
                  all_rounds=[[1.2, 2.4, 4.0], [1.0, 2.0, 4.1]], cpu_rounds=[[0.9, 2.1, 4.0], [1.0, 2.0, 4.0]])
    m = timing.merge_rounds(first, again)
    assert m.rounds == 5 and len(m.all_rounds) == 5 and len(m.cpu_rounds) == 5 and m.sizes == [8, 16, 32]
    np.testing.assert_allclose(m.seconds, np.median(first.all_rounds + again.all_rounds, axis=0))
    np.testing.assert_allclose(m.cpu_view().seconds, [0.9, 2.0, 4.0])  # the burst at 32 is outvoted
    assert first.rounds == 3 and len(first.all_rounds) == 3  # not modified
    # a retry that stopped early: NaN where it has no size, and its error is kept
    short = Sweep("mech", "fast", "cpu", "float32", 1, [8], [1.0], 1, all_rounds=[[1.0]], cpu_rounds=[[0.8]],
                  error="N = 16: MemoryError: out", error_n=16)
    m = timing.merge_rounds(first, short)
    assert math.isnan(m.all_rounds[-1][1]) and m.cpu_view().seconds[0] == 0.8 and m.error_n == 16
    np.testing.assert_allclose(m.seconds[1:], np.median(first.all_rounds, axis=0)[1:])
    # no CPU times on one side: none pooled
    assert timing.merge_rounds(first, _sweep([8, 16, 32], [1.0, 2.0, 4.0], all_rounds=[[1.0, 2.0, 4.0]])
                               ).cpu_rounds is None
    with pytest.raises(ValueError, match="same kind"):
        timing.merge_rounds(first, _sweep([8, 16, 32], [1.0, 2.0, 4.0], "dense"))
    with pytest.raises(ValueError, match="cpu_view"):
        timing.merge_rounds(first.cpu_view(), first.cpu_view())


def test_crossover_interval_bootstraps_the_minimum_on_the_cpu_clock():
    """A view whose summary is the minimum resamples minima: with a point's rounds all at or above
    the law, the interval still covers the crossover measured on the minima."""
    sizes = [2**p for p in range(6, 14)]
    tf, td = [1e-6 * n for n in sizes], [1e-9 * n * n for n in sizes]
    up = lambda t, fs: [list(np.asarray(t) * f) for f in fs]  # noqa: E731
    fast = Sweep("m", "fast", "cpu", "float32", 1, sizes, tf, 3, all_rounds=up(tf, (1.0, 1.3, 1.6)),
                 cpu_rounds=up(tf, (1.0, 1.3, 1.6))).cpu_view()
    dense = Sweep("m", "dense", "cpu", "float32", 1, sizes, td, 3, all_rounds=up(td, (1.0, 1.2, 2.0)),
                  cpu_rounds=up(td, (1.0, 1.2, 2.0))).cpu_view()
    assert crossover(fast, dense) == pytest.approx(1000.0)
    low, high = crossover_interval(fast, dense)
    assert low <= 1000.0 <= high


def test_speedup_interval_covers_round_noise_not_the_curve_s_shape():
    """The bootstrap interval of the speed-up slope: exact rounds give the fit's slope at both ends
    even where the curve bends (the t-interval of the fit does not); scattered rounds widen it
    around the truth; fewer than 2 rounds or 3 points give (None, None)."""
    sizes = [2**p for p in range(6, 14)]
    bend = {2048: 2.5, 4096: 0.6}
    tf, td = [1e-6 * n for n in sizes], [1e-9 * n * n * bend.get(n, 1.0) for n in sizes]
    fast, dense = _sweep(sizes, tf, all_rounds=[tf] * 3), _sweep(sizes, td, "dense", [td] * 3)
    fit = compare(fast, dense).speedup_fit
    assert fit.low < 0 < fit.slope  # the bend, read as noise by the t-interval
    low, high = timing.speedup_interval(fast, dense)
    assert low == pytest.approx(fit.slope) and high == pytest.approx(fit.slope)
    rng = np.random.default_rng(8)
    tf, rf = _noisy(sizes, lambda n: 1e-6 * n, 7, rng, 0.05)
    td, rd = _noisy(sizes, lambda n: 1e-9 * n * n, 7, rng, 0.05)
    low, high = timing.speedup_interval(_sweep(sizes, tf, all_rounds=rf), _sweep(sizes, td, "dense", rd))
    assert low < 1.0 < high and high - low < 0.5
    assert timing.speedup_interval(_sweep(sizes, tf, all_rounds=rf[:1]), _sweep(sizes, td, "dense", rd)) == (None, None)
    assert timing.speedup_interval(_sweep(sizes[:2], tf[:2], all_rounds=[r[:2] for r in rf]),
                                   _sweep(sizes[:2], td[:2], "dense", [r[:2] for r in rd])) == (None, None)
    with pytest.raises(ValueError, match="confidence"):
        timing.speedup_interval(fast, dense, confidence=0.0)


def test_crossover_of_nearly_parallel_lines_is_never_not_an_overflow():
    """A loaded run gave a bootstrap replicate whose two lines met beyond the largest float N
    (math.exp overflowed and complexity/tree-diam raised): such a crossover is "never"."""
    fast_n, dense_n = [2**p for p in range(11, 17)], [2**p for p in range(6, 10)]
    fast = _sweep(fast_n, [1e-3 * n for n in fast_n], all_rounds=[[1e-3 * n for n in fast_n]] * 2)
    dense = _sweep(dense_n, [1e-9 * n**1.0001 for n in dense_n], "dense",
                   [[1e-9 * n**1.0001 for n in dense_n]] * 2)
    assert crossover(fast, dense) is None
    assert crossover_interval(fast, dense) == (None, None)
    c = compare(fast, dense)
    assert c.crossover is None and not c.extrapolated


@pytest.mark.skipif(timing._libc() is None, reason="glibc's mallopt is not available here")
def test_steady_heap_keeps_large_buffers_instead_of_faulting_them_in_at_every_call():
    """64 MiB is above glibc's largest mmap threshold (32 MiB): outside steady_heap every fresh
    buffer is mapped and faulted in again (16384 pages of 4 KiB) at every call; inside it, once the
    heap has grown (a call or a few; every sweep makes a warm-up call), the freed buffer is reused
    and a call faults in almost nothing. In a fresh process, as a sweep's main thread is: a thread
    that glibc has moved to another arena (after contention in a long multi-threaded process) gets
    mmapped chunks above that arena's 64 MiB heaps whatever the settings."""
    script = (
        "import json, resource, torch\n"
        "from measure import timing\n"
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    torch.empty(2**24).fill_(1.0)\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "outside = [faults() for _ in range(4)]\n"
        "with timing.steady_heap():\n"
        "    inside = [faults() for _ in range(8)]\n"
        "print(json.dumps([outside, inside]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    outside, inside = json.loads(proc.stdout.splitlines()[-1])
    assert min(outside) > 8000
    assert sorted(inside)[5] < 500, inside  # at most 3 of 8 calls grow the heap; the others fault nothing


# ------------------------------------------------------------------------------ contention


def test_wait_share_and_machine_busy_rules():
    assert timing.wait_share(0.01, 0.04) == pytest.approx(0.75) and timing.wait_share(0.05, 0.04) == 0.0
    assert math.isnan(timing.wait_share(0.01, 0.0))
    assert timing.machine_busy([0.9, 1.2], [0.0, 0.02, math.nan], cpus=2) is None  # the timing thread alone
    by_wait = timing.machine_busy([1.0], [0.1, 0.5, 0.6], cpus=2)
    assert by_wait.startswith("machine busy: ") and "waited for a core 50%" in by_wait
    # neighbours on the other core only: no wait, but they share caches and bandwidth
    assert "load average 2" in timing.machine_busy([1.0, 2.0], [0.0, 0.01], cpus=2)
    assert timing.machine_busy([1.9], [0.0], cpus=2) is None  # less than half a core per CPU of others
    assert timing.machine_busy([None], [], cpus=2) is None and timing.machine_busy([], None, cpus=2) is None


def test_sweep_detects_contention_with_a_fake_clock(monkeypatch):
    """Fake clocks: in round 1 the thread ran only a quarter of each measurement's wall time (three
    quarters waiting for a core), in round 0 all of it. wait_rounds records 0 and 0.75 per point,
    load the two samples around the sweep, and Sweep.busy() reads them; the CPU seconds per call
    are those of the fake CPU clock."""
    clock = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(timing.time, "process_time", lambda: clock["cpu"])
    loads = iter([1.0, 1.1, 4.5, 4.6])
    monkeypatch.setattr(timing, "load_average", lambda: next(loads))
    state = {"measurements": 0}

    def fake_measure(runner, device="cpu", min_time=0):
        share = 1.0 if state["measurements"] < 3 else 0.25  # round 0 (3 sizes) quiet, round 1 contended
        state["measurements"] += 1
        t = runner()
        clock["wall"] += t
        clock["cpu"] += t * share
        return t

    monkeypatch.setattr(timing, "measure", fake_measure)
    quiet_then_busy = timing.sweep(_record(cost=False), "fast", (16, 32, 64), rounds=2)
    np.testing.assert_allclose(quiet_then_busy.wait_rounds, [[0.0] * 3, [0.75] * 3])
    np.testing.assert_allclose(quiet_then_busy.cpu_rounds[1], [0.25e-6 * n for n in (16, 32, 64)])
    assert quiet_then_busy.load == [1.0, 1.1]
    assert quiet_then_busy.busy(cpus=2) is not None  # median wait 0.375 over its 6 measurements
    state["measurements"] = 0
    quiet = timing.sweep(_record(cost=False), "fast", (16, 32, 64), rounds=1)
    np.testing.assert_allclose(quiet.wait_rounds, [[0.0] * 3], atol=1e-12)
    assert quiet.load == [4.5, 4.6]
    assert "load average 4.6 on 2 CPUs" in quiet.busy(cpus=2)  # no wait, but a loaded machine
    monkeypatch.setattr(timing, "load_average", lambda: 1.0)
    state["measurements"] = 0
    assert timing.sweep(_record(cost=False), "fast", (16, 32, 64), rounds=1).busy(cpus=2) is None
    json.dumps(quiet.to_dict())


def test_merge_rounds_pools_waits_and_load():
    first = Sweep("m", "fast", "cpu", "float32", 1, [8, 16], [1.0, 2.0], 1, all_rounds=[[1.0, 2.0]],
                  cpu_rounds=[[1.0, 2.0]], wait_rounds=[[0.0, 0.1]], load=[1.0, 1.2])
    again = Sweep("m", "fast", "cpu", "float32", 1, [8], [1.0], 1, all_rounds=[[1.0]], cpu_rounds=[[1.0]],
                  wait_rounds=[[0.6]], load=[3.0, 3.5])
    m = timing.merge_rounds(first, again)
    assert m.load == [1.0, 1.2, 3.0, 3.5] and m.wait_rounds[0] == [0.0, 0.1]
    assert m.wait_rounds[1][0] == 0.6 and math.isnan(m.wait_rounds[1][1])
