"""verify/timing.py: exponent fits, crossover and the sweep machinery, on synthetic data."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from verify import timing
from verify.registry import get
from verify.timing import Sweep, crossover, fit_exponent

SIZES = [2**p for p in range(8, 20)]  # 12 points over 3.6 decades


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


def test_fit_exponent_drops_overhead_dominated_points():
    """Points faster than min_seconds are left out, keeping at least the largest four."""
    sizes = [2**p for p in range(6, 14)]
    seconds = [max(2e-4, 1e-9 * n**2) for n in sizes]  # a 0.2 ms floor, then N^2
    assert fit_exponent(sizes, seconds).slope < 1.9  # the floor bends a plain fit
    fit = fit_exponent(sizes, seconds, min_seconds=1e-3)
    kept = [n for n, t in zip(sizes, seconds) if t >= 1e-3]
    assert len(kept) >= 4 and fit.slope == pytest.approx(2.0, abs=1e-12)
    # only two points above the threshold: the largest four are used
    few = fit_exponent(sizes, seconds, min_seconds=1e-2)
    assert few.slope == pytest.approx(fit_exponent(sizes[-4:], seconds[-4:]).slope, abs=1e-15)


def test_fit_to_dict_is_json():
    d = fit_exponent(SIZES[:4], [1.0, 2.0, 4.0, 8.0]).to_dict()
    assert set(d) == {"slope", "low", "high", "intercept", "confidence", "robust_slope"}
    json.dumps(d)


def _sweep(sizes, seconds, impl="fast"):
    return Sweep("mech", impl, "cpu", "float32", 1, list(sizes), list(seconds), 1)


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


def test_measure_repeats_until_min_time():
    calls = []
    per_call = timing.measure(lambda: calls.append(1), min_time=0.01)
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


def test_sweep_on_a_registered_mechanism():
    class Progress:
        n = 0

        def update(self, k):
            self.n += k

    progress = Progress()
    threads = torch.get_num_threads()
    s = timing.sweep(get("linear"), "fast", (8, 16, 32), rounds=2, threads=1, progress=progress)
    assert s.mechanism == "linear" and s.impl == "fast" and s.dtype == "float32" and s.threads == 1
    assert s.sizes == [8, 16, 32] and len(s.seconds) == 3 and all(t > 0 for t in s.seconds)
    assert np.array(s.all_rounds).shape == (2, 3)
    np.testing.assert_allclose(s.seconds, np.median(s.all_rounds, axis=0))
    assert progress.n == 6
    assert torch.get_num_threads() == threads
    json.dumps(s.to_dict())


def test_sweep_rejects_bad_impl_and_missing_dense():
    with pytest.raises(ValueError, match="impl must be 'fast' or 'dense'"):
        timing.sweep(get("linear"), "slow", (8,))
    with pytest.raises(ValueError, match="'softmax' has no dense implementation"):
        timing.sweep(get("softmax"), "dense", (8,))


def test_environment_facts():
    env = timing.environment()
    assert {"torch", "threads", "cpus", "omp_num_threads", "cuda"} <= set(env)
    assert env["torch"] == torch.__version__
