"""verify/checks/choromanski22/graph.py: the choromanski22 graph-kernel checks pass on the operators as built,
and fail on planted bugs (a tolerance ignored, a missing e^{-lam c} factor, a wrong generator,
a closed form with the wrong rho, biased Monte Carlo features, a cost that ignores |E|).

No timing here: the cost sweep's clock (``time_cases``) is replaced by exact models of the counted
work, and the reported CPU seconds of the accuracy part by a constant.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import torch
from threadpoolctl import threadpool_info

from reference.masks import diffusion as ref_diffusion
from reference.masks import rwgnk as ref_rwgnk
from reference.walks import sample_walks
from results.check import Context
from verify.checks.choromanski22 import graph as C
from verify.problems import erdos_renyi, grid_graph, path_graph

IDS = [("choromanski22/theorem-4.1", "bound"), ("choromanski22/markov", "statistical"),
       ("choromanski22/theorem-4.2", "bound")]


def _evaluate(check_id: str, seed: int = 0):
    check = next(c for c in C.checks() if c.id == check_id)
    return check.evaluate(Context(quick=True, seed=seed))


@pytest.fixture
def fake_clock(monkeypatch):
    """Small cost graphs (N = 512) and a clock that returns model(kind, d, work) seconds, the same in
    every round; the accuracy part's reported CPU seconds are a constant."""
    monkeypatch.setattr(C, "COST_N", {True: 512, False: 512})
    monkeypatch.setattr(C, "_cpu_per_call", lambda fn, min_time=0.0: 1e-3)
    captured, calls = {}, []
    real_setup = C._cost_setup

    def setup(ctx):
        out = real_setup(ctx)
        captured.update(out)
        return out

    def install(model):
        def times(cases, rounds):
            calls.append(rounds)
            return {key: [model(key[0], key[1], captured["work"][key])] * rounds for key in cases}
        monkeypatch.setattr(C, "_cost_setup", setup)
        monkeypatch.setattr(C, "time_cases", times)
        return calls

    return install


PROPORTIONAL = lambda kind, d, work: 1e-10 * work  # noqa: E731  (time = the counted work)


def test_checks_are_listed_with_their_ids_and_kinds():
    assert [(c.id, c.kind) for c in C.checks()] == IDS
    for c in C.checks():
        assert c.quick and c.compare == "<=" and c.threshold is not None


# --------------------------------------------------------------------------- theorem 4.1


def test_theorem_41_passes_with_errors_within_delta(fake_clock):
    calls = fake_clock(PROPORTIONAL)
    r = _evaluate("choromanski22/theorem-4.1")
    assert r.status == "pass" and r.details["reasons"] == [] and calls == [C.COST_ROUNDS[True]]
    assert 0 < r.statistic <= r.threshold == 1.0
    cases = r.details["cases"]
    assert {c["kind"] for c in cases} == set(C.KINDS) and {c["delta"] for c in cases} == set(C.DELTAS[True])
    assert len(cases) == len(C.accuracy_graphs(0)) * 3 * len(C.ACCURACY_LAMS) * len(C.DELTAS[True])
    for c in cases:
        assert c["max_column_error_1norm"] <= c["delta"] + c["roundoff_floor"]
    # the error shrinks with delta, and the plan grows like log(1/delta)
    by_delta = r.details["max_error_by_delta"]
    assert by_delta["1e-12"] < by_delta["1e-09"] < by_delta["1e-06"] < by_delta["0.001"]
    # the reference twin (scipy expm) agrees with the eigendecomposition; expm_multiply is recorded
    assert r.details["reference_twin_error"] <= C.REFERENCE_TWIN_TOL
    assert all(row["expm_multiply_error_1norm"] < 1e-11 for row in r.details["expm_multiply"])
    cost = r.details["cost"]["kinds"]
    assert set(cost) == set(C.COST_KINDS)
    # L D^-1: |T|_1 = 2 for every degree, so the plan is the same at every d; L: it grows with d
    assert len(set(cost["random-walk"]["products"])) == 1
    assert cost["laplacian"]["products"] == sorted(cost["laplacian"]["products"])
    assert cost["laplacian"]["products"][-1] > 2 * cost["laplacian"]["products"][0]
    assert max(cost["random-walk"]["fast_vs_expm_multiply_1norm_difference"]) < 1e-7


class _IgnoresTol(C.DiffusionMask):
    """Planted bug: the plan ignores the tolerance asked for (always 1e-3)."""

    def __init__(self, graph, lam, kind="laplacian", tol=1e-8):
        super().__init__(graph, lam, kind=kind, tol=1e-3)


class _MissingShiftFactor(C.DiffusionMask):
    """Planted bug: exp(-lam T) = e^{-lam c} exp(lam (c I - T)) without its e^{-lam c}."""

    def matmul(self, x):
        return super().matmul(x) * math.exp(float(self.lam) * self.shift)


class _WrongKind(C.DiffusionMask):
    """Planted bug: the random-walk generator L D^-1 replaced by L."""

    def __init__(self, graph, lam, kind="laplacian", tol=1e-8):
        super().__init__(graph, lam, kind="laplacian" if kind == "random-walk" else kind, tol=tol)


@pytest.mark.parametrize("bug, delta", [(_IgnoresTol, "1e-12"), (_MissingShiftFactor, None), (_WrongKind, None)])
def test_theorem_41_fails_on_planted_operator_bugs(monkeypatch, fake_clock, bug, delta):
    fake_clock(PROPORTIONAL)
    monkeypatch.setattr(C, "DiffusionMask", bug)
    r = _evaluate("choromanski22/theorem-4.1")
    assert r.status == "fail" and r.statistic > r.threshold
    assert r.details["reasons"] and all("column error" in x or x.startswith("...") for x in r.details["reasons"])
    if delta:  # a fixed plan meets the large tolerances and misses the small ones
        worst = {c["delta"]: 0.0 for c in r.details["cases"]}
        for c in r.details["cases"]:
            worst[c["delta"]] = max(worst[c["delta"]], c["ratio"])
        assert worst[1e-3] <= 1.0 < worst[1e-12]


def test_theorem_41_fails_when_the_reference_twin_uses_the_wrong_generator(monkeypatch, fake_clock):
    fake_clock(PROPORTIONAL)
    real = ref_diffusion.diffusion_mask
    monkeypatch.setattr(C.ref_diffusion, "diffusion_mask",
                        lambda adj, lam, kind="laplacian": real(adj, lam, "laplacian"))
    r = _evaluate("choromanski22/theorem-4.1")
    assert r.status == "fail" and r.statistic <= r.threshold  # the fast path is right; the twin is not
    assert len(r.details["reasons"]) == 1 and "reference.masks.diffusion" in r.details["reasons"][0]


def test_theorem_41_fails_when_the_cost_does_not_grow_with_edges(fake_clock):
    """A product whose cost ignores E (e.g. a dense N x N product): constant time across d."""
    calls = fake_clock(lambda kind, d, work: 1e-3 * (1 + 0.02 * (d % 3)))  # flat, with a little scatter
    r = _evaluate("choromanski22/theorem-4.1")
    assert r.status == "fail" and r.statistic <= r.threshold and calls == [3, 3]  # re-timed once, pooled
    reasons = r.details["reasons"]
    assert len(reasons) == len(C.COST_KINDS) and all("does not grow with |E|" in x for x in reasons)
    assert len(r.details["cost"]["attempts"]) == 2


def test_theorem_41_fails_when_time_outgrows_the_counted_work(fake_clock):
    """A cost beyond the sparse products (here time = work x d, e.g. a per-product dense pass)."""
    fake_clock(lambda kind, d, work: 1e-10 * work * d)
    r = _evaluate("choromanski22/theorem-4.1")
    assert r.status == "fail"
    assert any("cost beyond the sparse products" in x for x in r.details["reasons"])


def test_exp_by_eigh_matches_scipy_expm_on_every_kind_with_isolated_nodes():
    adj = C._with_isolated(erdos_renyi(30, 0.15, 3), np.array([0, 5]))
    assert (np.asarray(adj.sum(axis=1)).ravel() == 0).sum() >= 2
    for kind in C.KINDS:
        t = C.generator(adj, kind)
        np.testing.assert_array_equal(t, ref_diffusion.generator_matrix(adj, kind))
        e = C.exp_by_eigh(adj, 0.7, kind)
        np.testing.assert_allclose(e, scipy.linalg.expm(-0.7 * t), rtol=1e-11, atol=1e-13)
    e = C.exp_by_eigh(adj, 0.7, "random-walk")
    np.testing.assert_allclose(e.sum(axis=0), 1.0, rtol=1e-12)  # column-stochastic
    assert e[0, 0] == 1.0 and e[:, 0].sum() == 1.0  # an isolated node keeps its walker


def test_one_thread_restores_the_blas_and_torch_threads():
    def blas_threads():
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    before = blas_threads()
    assert before  # NumPy's OpenBLAS at least: the test would prove nothing without one
    threads = torch.get_num_threads()
    with C.one_thread():
        assert torch.get_num_threads() == 1 and all(n == 1 for n in blas_threads())
    assert blas_threads() == before and torch.get_num_threads() == threads


# --------------------------------------------------------------------------- markov


def test_poisson_mixture_on_two_nodes_is_cosh_and_sinh():
    """One edge: P swaps the nodes, so the mixture is e^-lam [[cosh, sinh], [sinh, cosh]]."""
    adj = sp.csr_matrix(np.array([[0.0, 2.0], [2.0, 0.0]]))
    lam = 1.3
    want = math.exp(-lam) * np.array([[math.cosh(lam), math.sinh(lam)], [math.sinh(lam), math.cosh(lam)]])
    np.testing.assert_allclose(C.poisson_mixture(adj, lam), want, rtol=1e-14)
    assert C.poisson_terms(lam) >= 1 and C.poisson_terms(4.0) > C.poisson_terms(1.0)


def test_random_walk_matrix_keeps_walkers_at_isolated_nodes():
    adj = C._with_isolated(sp.csr_matrix(path_graph(5)), np.array([4]))
    p = C.random_walk_matrix(adj)
    np.testing.assert_allclose(p.sum(axis=0), 1.0)
    assert p[4, 4] == 1.0 and p[1, 0] == 1.0 and p[0, 1] == p[2, 1] == 0.5


def test_simulated_walks_end_where_the_mixture_says():
    adj = sp.csr_matrix(grid_graph((3, 3)))
    ends = C.simulate_poisson_walks(adj, 4, 1.0, 40_000, np.random.default_rng(0))
    freq = np.bincount(ends, minlength=9) / 40_000
    np.testing.assert_allclose(freq, C.poisson_mixture(adj, 1.0)[:, 4], atol=0.015)  # ~6 standard errors
    assert (C.simulate_poisson_walks(adj, 0, 0.0, 10, np.random.default_rng(0)) == 0).all()  # no steps


def test_markov_passes():
    r = _evaluate("choromanski22/markov")
    assert r.status == "pass" and r.details["reasons"] == [] and r.statistic <= r.threshold == 1.0
    assert r.details["alpha"] == 1e-8 and r.details["delta_per_count"] * r.details["monte_carlo_counts"] == \
        pytest.approx(1e-8)
    assert {row["impl"] for row in r.details["dense"]} == {"reference", "fast"}
    assert {row["impl"] for row in r.details["monte_carlo"]} == {"reference", "fast"}


def test_markov_fails_when_the_reference_uses_the_wrong_generator(monkeypatch):
    real = ref_diffusion.diffusion_mask
    monkeypatch.setattr(C.ref_diffusion, "diffusion_mask",
                        lambda adj, lam, kind="laplacian": real(adj, lam, "laplacian"))
    r = _evaluate("choromanski22/markov")
    assert r.status == "fail" and r.statistic > r.threshold
    assert any("reference exp(-lam L D^-1)" in x for x in r.details["reasons"])  # dense
    assert any("Poisson walks land there" in x and "reference column" in x for x in r.details["reasons"])  # MC


def test_markov_fails_when_the_fast_operator_misses_its_shift_factor(monkeypatch):
    monkeypatch.setattr(C, "DiffusionMask", _MissingShiftFactor)
    r = _evaluate("choromanski22/markov")
    assert r.status == "fail"
    assert any("fast exp(-lam L D^-1)" in x for x in r.details["reasons"])
    assert not any("reference" in x for x in r.details["reasons"])


def test_markov_monte_carlo_sees_a_20_percent_error_in_the_diffusion_time(monkeypatch):
    """Walks of Poisson(1.2 lam) steps: the dense identity still holds, the Monte Carlo part fails."""
    real = C.simulate_poisson_walks
    monkeypatch.setattr(C, "simulate_poisson_walks", lambda adj, j, lam, m, rng: real(adj, j, 1.2 * lam, m, rng))
    r = _evaluate("choromanski22/markov")
    assert r.status == "fail" and r.details["reasons"]
    assert all("Poisson walks land there" in x for x in r.details["reasons"])


# --------------------------------------------------------------------------- theorem 4.2


def test_theorem_42_passes_and_lists_the_vacuous_cases():
    r = _evaluate("choromanski22/theorem-4.2")
    assert r.status == "pass" and r.details["reasons"] == [] and r.statistic <= r.threshold == C.BOUND_TOL
    rows = r.details["cases"]
    assert any(row["upper_bound_finite"] for row in rows) and any(not row["upper_bound_finite"] for row in rows)
    assert len(r.details["vacuous_upper_bound"]) == sum(not row["upper_bound_finite"] for row in rows)
    for row in rows:
        assert row["upper_bound_finite"] == (row["rho_specrad_over_dmin"] < 1)
        if row["graph"].startswith("random 4-regular"):  # d_min = d_max: both bounds equal K
            assert row["median_lower_over_K"] == pytest.approx(1.0) and row["median_K_over_upper"] == pytest.approx(1.0)
    rate = r.details["rate"]
    assert rate["fast_equivalence_error"] <= C.RWGNK_EQUIVALENCE_TOL
    for fit in rate["fits"].values():
        low, high = fit["interval"]
        assert low <= -0.5 <= high and high - low < 0.6  # an interval with power against a flat curve
    # the shared ensemble's diagonal bias is positive and O(1/n): n x bias stays within a factor 3
    bias = np.asarray(rate["n_times_shared_diagonal_relative_bias"])
    assert (np.asarray(rate["shared_diagonal_relative_bias"][:2]) > 0).all() and bias.max() < 3 * bias[:2].min()


def test_theorem_42_fails_when_the_closed_form_has_the_wrong_rho(monkeypatch):
    """(1 - p)^2 lam instead of (1 - p) lam: on a regular graph K must equal Gamma(rho A / d)."""
    real = ref_rwgnk.rwgnk_closed_form
    monkeypatch.setattr(C, "_rate", lambda ctx: ([], {"alpha": 1e-8}))  # the bounds alone (the rate: below)
    monkeypatch.setattr(C.ref_rwgnk, "rwgnk_closed_form",
                        lambda adj, lam, p_halt=None, **kw: real(adj, lam * (1 - p_halt), p_halt=p_halt, **kw))
    r = _evaluate("choromanski22/theorem-4.2")
    assert r.status == "fail" and r.statistic > r.threshold
    assert any("random 4-regular" in x and "lower bound" in x for x in r.details["reasons"])


def test_theorem_42_rate_fails_for_biased_features(monkeypatch):
    """Reference features with lam^t replaced by (0.7 lam)^t: a bias the error plateaus at."""
    real = ref_rwgnk.rwgnk_features
    monkeypatch.setattr(C.ref_rwgnk, "rwgnk_features",
                        lambda adj, walks, lam, alpha=0: real(adj, walks, 0.7 * lam, alpha))
    reasons, rate = C._rate(Context(quick=True, seed=0))
    assert any(x.startswith("independent ensembles") and "does not contain the n^-1/2 law" in x for x in reasons)
    assert any("differ from the reference on identical walks" in x for x in reasons)
    assert rate["fits"]["independent ensembles (reference features)"]["mean_slope"] > -0.4  # flattened by the bias


def test_first_walkers_is_a_nested_sub_ensemble():
    adj = sp.csr_matrix(path_graph(6))
    walks = sample_walks(adj, 5, np.random.default_rng(0), p_halt=0.3)
    assert C.first_walkers(walks, 5).nodes.tolist() == walks.nodes.tolist()
    sub = C.first_walkers(walks, 2)
    assert sub.n_walkers == 2 and sub.length.size == 12
    for i in range(6):
        for r in range(2):
            assert sub.walk(i * 2 + r).tolist() == walks.walk(i * 5 + r).tolist()
    with pytest.raises(ValueError, match="n must lie in"):
        C.first_walkers(walks, 6)


def test_rate_slope_interval_is_a_student_t_interval():
    slopes = np.array([-0.52, -0.48, -0.5, -0.51, -0.49])
    mean, low, high = C.rate_slope_interval(slopes, 0.05)
    assert mean == pytest.approx(-0.5) and low < -0.5 < high
    assert high - mean == pytest.approx(2.7764451 * np.std(slopes, ddof=1) / math.sqrt(5), rel=1e-6)


def test_exact_walk_moments_match_the_closed_form_and_a_direct_sum():
    """mu is the closed form's factor (K = mu mu^T), and the covariance equals a direct sum over
    every walk of a tiny graph (path of 3 nodes, p = 0.7: walks enumerated until the mass still
    walking, 0.3^t, is below 1e-14, a few thousand walks)."""
    adj = sp.csr_matrix(path_graph(3))
    lam, p = 0.6, 0.7
    mu, cov = C.walk_frequency_moments(adj, lam, p)
    k = np.asarray(ref_rwgnk.rwgnk_closed_form(adj, lam, p_halt=p))
    np.testing.assert_allclose(mu @ mu.T, k, rtol=1e-12)
    nbrs = {0: [1], 1: [0, 2], 2: [1]}
    for start in range(3):
        m1, m2 = np.zeros(3), np.zeros((3, 3))
        stack = [([start], 1.0)]  # (walk so far, probability of walking it and then going on or halting)
        while stack:
            walk, prob = stack.pop()
            f = np.zeros(3)
            for t, u in enumerate(walk):
                f[u] += lam**t
            halt = prob * p
            m1 += halt * f
            m2 += halt * np.outer(f, f)
            if prob * (1 - p) > 1e-14:
                for v in nbrs[walk[-1]]:
                    stack.append((walk + [v], prob * (1 - p) / len(nbrs[walk[-1]])))
        np.testing.assert_allclose(m1, mu[start], atol=1e-12)  # the omitted mass: < 1e-13 x |f|^2 <= 7
        np.testing.assert_allclose(m2 - np.outer(m1, m1), cov[start], atol=1e-12)
