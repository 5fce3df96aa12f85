"""verify/checks/reid25.py: the reid25 checks pass on the library, fail on planted bugs, and their exact
moments are what they claim (checked against an enumeration of every walk)."""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from reference.graphs import adjacency, degree, normalized_adjacency
from reference.masks.grf import grf_expected_features, grf_expected_mask, grf_mask
from tests.helpers import assert_ids_kinds_ratio, evaluate_quick, quick_results
from verify.checks import reid25 as C
from verify.problems import grid_graph

IDS = [("reid25/unbiased", "statistical"), ("reid25/theorem-3.1", "bound"), ("reid25/lemma-3.2", "bound"),
       ("reid25/rate", "statistical"), ("reid25/diagonal-bias", "statistical"), ("reid25/algorithm-2", "erratum"),
       ("reid25/variance-reduction", "statistical")]


def _evaluate(check_id: str, seed: int = 0):
    return evaluate_quick(C, check_id, seed)


def test_checks_are_listed_with_their_ids_and_kinds():
    assert_ids_kinds_ratio(C, IDS)


# --------------------------------------------------------------------------- the library passes


@pytest.fixture(scope="module")
def results():
    """Every check once, quick mode, seed 0 (~40 s on two idle cores)."""
    return quick_results(C)


@pytest.mark.parametrize("check_id", [i for i, _ in IDS])
def test_check_passes_on_the_library(results, check_id):
    r = results[check_id]
    assert r.status == "pass", r.details.get("reasons") or r.details.get("error")
    assert r.statistic <= r.threshold and r.details["reasons"] == []


def test_statistical_checks_state_their_alpha(results):
    for check_id, kind in IDS:
        if kind in ("statistical", "bound") and check_id != "reid25/algorithm-2":
            d = results[check_id].details
            assert d["alpha"] == 1e-8 and 0 < d["delta_per_case"] <= d["alpha"]


def test_measured_numbers_are_where_the_maths_puts_them(results):
    vr = results["reid25/variance-reduction"].details
    assert vr["antithetic_variance_ratio"] < 1 and vr["repelling_variance_ratio"] < 1 and vr["both_variance_ratio"] < 1
    assert abs(vr["iid_measured_over_formula"] - 1) < 0.02  # the exact variance formula, measured
    db = results["reid25/diagonal-bias"].details
    assert db["shared_mean_diagonal_bias"] > db["shared_radius"] > 0
    assert abs(db["independent_mean_diagonal_bias"]) <= db["independent_radius"]
    rate = results["reid25/rate"].details
    assert -0.6 < rate["slope"] < -0.45 and -0.52 < rate["exact_curve_slope"] < -0.5
    assert rate["ci"][0] <= rate["exact_curve_slope"] <= rate["ci"][1] and rate["minus_half_in_ci_widened_by_offset"]
    thm = results["reid25/theorem-3.1"].details
    assert 1e-3 <= min(c["bound"] for c in thm["cases"]) and max(c["bound"] for c in thm["cases"]) <= 0.5
    assert all(c["t_over_c2"] < 1 for c in thm["cases"])  # t below the sure bound: the bound can bite
    lem = results["reid25/lemma-3.2"].details
    assert lem["nnz_bound"] == 37 and lem["features"] == sum(2**e for e in C.LEMMA_LOG2N[True])
    alg = results["reid25/algorithm-2"].details
    assert alg["weakest_printed_error"] == pytest.approx(1 - 1 / min(C.ALG2_WALKERS))


# --------------------------------------------------------------------------- planted bugs fail


@pytest.fixture
def fewer_draws(monkeypatch):
    """Smaller samples for the planted-bug runs (each bug is far beyond the radius at these sizes)."""
    monkeypatch.setattr(C, "UNBIASED_DRAWS", {True: 5000, False: 5000})
    monkeypatch.setattr(C, "DIAG_DRAWS", {True: 5000, False: 5000})
    monkeypatch.setattr(C, "RATE_DRAWS", {True: 150, False: 150})
    monkeypatch.setattr(C, "VR_DRAWS", {True: 5000, False: 5000})
    monkeypatch.setattr(C, "THM31_DRAWS", {True: 300, False: 300})


def _without_halting_correction(monkeypatch):
    """The load without its 1/(1 - p_halt) (features built as if the walks had p_halt = 0)."""
    real = C.grf_features
    monkeypatch.setattr(C, "grf_features", lambda g, walks, f: real(g, dataclasses.replace(walks, p_halt=0.0), f))


def _one_ensemble_twice(monkeypatch):
    """The key side reuses the query side's walks (one shared ensemble passed as two)."""
    real, last = C.sample_walks, {}

    def sample(g, n, **kw):
        if "walks" in last:
            return last.pop("walks")
        last["walks"] = real(g, n, **kw)
        return last["walks"]

    monkeypatch.setattr(C, "sample_walks", sample)


@pytest.mark.parametrize("check_id", ["reid25/unbiased", "reid25/rate"])
def test_load_without_the_halting_factor_fails(monkeypatch, fewer_draws, check_id):
    _without_halting_correction(monkeypatch)
    r = _evaluate(check_id)
    assert r.status == "fail" and r.statistic > r.threshold


def test_unbiased_fails_with_a_shared_ensemble_passed_as_independent(monkeypatch, fewer_draws):
    _one_ensemble_twice(monkeypatch)
    r = _evaluate("reid25/unbiased")
    assert r.status == "fail"
    assert all(c["worst_entry"][0] == c["worst_entry"][1] for c in r.details["cases"])  # the diagonal


def test_diagonal_bias_fails_with_a_shared_ensemble_passed_as_independent(monkeypatch, fewer_draws):
    _one_ensemble_twice(monkeypatch)
    r = _evaluate("reid25/diagonal-bias")
    assert r.status == "fail"
    assert any(reason.startswith("independent ensembles: mean diagonal") for reason in r.details["reasons"])


def test_diagonal_bias_fails_when_the_shared_ensemble_is_not_shared(monkeypatch, fewer_draws):
    real = C.draw_masks
    monkeypatch.setattr(C, "draw_masks", lambda s, copies, gen, **kw: real(s, copies, gen,
                                                                            **{**kw, "shared": False}))
    r = _evaluate("reid25/diagonal-bias")
    assert r.status == "fail"
    assert any("is not beyond the radius" in reason for reason in r.details["reasons"])


def test_theorem_31_fails_when_features_are_summed_not_averaged(monkeypatch, fewer_draws):
    class Summed(C.GRFMask):  # the 1/n of Eq. 10 missing on both sides: M_hat n^2 times too large
        def matmul(self, x):
            return super().matmul(x) * self.features_q.n_walkers ** 2

    monkeypatch.setattr(C, "GRFMask", Summed)
    r = _evaluate("reid25/theorem-3.1")
    assert r.status == "fail" and r.statistic > 1 and r.details["tightness_ratio"] > 1


@pytest.mark.parametrize("factor", [0.0, 3.0])
def test_theorem_31_fails_for_a_mask_off_by_its_own_size(monkeypatch, fewer_draws, factor):
    """A zero or tripled mask: on the f = (1, 0.1) setting the error |M_ii| ~ 1 (2 |M_ii|)
    exceeds every t tested (t <= 0.92 c^2 = 1.11)."""
    class Scaled(C.GRFMask):
        def matmul(self, x):
            return super().matmul(x) * factor

    monkeypatch.setattr(C, "GRFMask", Scaled)
    r = _evaluate("reid25/theorem-3.1")
    assert r.status == "fail" and r.statistic > 1
    assert any("f = [1.0, 0.1]" in reason for reason in r.details["reasons"])


def test_lemma_32_fails_when_walks_halt_too_rarely(monkeypatch):
    real = C.sample_walks
    monkeypatch.setattr(C, "sample_walks", lambda g, n, **kw: real(g, n, **{**kw, "p_halt": kw["p_halt"] / 4}))
    r = _evaluate("reid25/lemma-3.2")
    assert r.status == "fail" and any("outside" in reason for reason in r.details["reasons"])


def test_nnz_band_is_independent_of_n():
    """The band the mean nnz must stay in barely moves from N = 2^8 to 2^20: a row growing with N leaves it."""
    low8, high8 = C.nnz_band(256, 4, 0.5, 1e-9)
    low20, high20 = C.nnz_band(2**20, 4, 0.5, 1e-9)
    assert 1.8 < low8 <= low20 < 2 and 5 < high20 <= high8 < 6.2  # E[nnz] lies in [1 + 1 - 2^-4, 1 + 4]


def test_variance_reduction_fails_when_walkers_are_iid(monkeypatch, fewer_draws):
    real = C.sample_walks
    monkeypatch.setattr(C, "sample_walks", lambda g, n, **kw: real(g, n, **{**kw, "antithetic": False,
                                                                              "repelling": False}))
    r = _evaluate("reid25/variance-reduction")
    assert r.status == "fail"
    assert sum("is not below 1" in reason for reason in r.details["reasons"]) == len(C.VR_MODES)


def test_algorithm_2_fails_when_the_printed_form_is_not_wrong(monkeypatch):
    monkeypatch.setattr(C, "grf_asym_attention_printed", C.grf_asym_attention)
    r = _evaluate("reid25/algorithm-2")
    assert r.status == "fail" and r.statistic <= r.threshold
    assert any("the erratum is not shown" in reason for reason in r.details["reasons"])


def test_algorithm_2_fails_on_a_transposed_fast_mask(monkeypatch):
    class Transposed(C.GRFAsymMask):
        def matmul(self, x):
            return self.features.rmatmul(x)

    monkeypatch.setattr(C, "GRFAsymMask", Transposed)
    r = _evaluate("reid25/algorithm-2")
    assert r.status == "fail" and r.statistic > r.threshold


# --------------------------------------------------------------------------- the exact moments


def _enumerate_moments(adj: sp.csr_matrix, f: np.ndarray, p: float, i_max: int | None):
    """(E x, E x x^T) per start node by listing every walk prefix up to T hops with its probability."""
    a = sp.csr_matrix(adj)
    w, deg, n = a.toarray(), degree(a), a.shape[0]
    top = len(f) - 1 if i_max is None else min(len(f) - 1, i_max)
    mean, second = np.zeros((n, n)), np.zeros((n, n, n))

    def walk(i, path, prob, load, x):
        # the walk may stop here (halt, cap, or no neighbour) or go on; beyond T hops nothing counts
        u = path[-1]
        can_go = len(path) - 1 < top and deg[u] > 0
        stop = prob * (p if can_go else 1.0)
        if stop > 0:
            mean[i] += stop * x
            second[i] += stop * np.outer(x, x)
        if not can_go:
            return
        for v in a.indices[a.indptr[u]:a.indptr[u + 1]]:
            step = w[u, v] * deg[u] / (1 - p)
            t = len(path)
            y = x.copy()
            y[v] += f[t] * load * step
            walk(i, path + [v], prob * (1 - p) / deg[u], load * step, y)

    for i in range(n):
        x0 = np.zeros(n)
        x0[i] = f[0]
        walk(i, [i], 1.0, 1.0, x0)
    return mean, second - mean[:, :, None] * mean[:, None, :]


def _weighted_loopy_graph() -> sp.csr_matrix:
    d = np.zeros((5, 5))
    for i, j, v in [(0, 1, 0.7), (1, 2, 1.3), (2, 3, 0.4), (3, 0, 0.9), (1, 3, 0.5), (2, 2, 0.6)]:
        d[i, j] = d[j, i] = v
    return adjacency(d)  # node 4 isolated, a self-loop at 2, weighted


@pytest.mark.parametrize("f, p, i_max", [([1.0, 0.5, 0.25], 0.5, None), ([0.8, -0.5, 0.3, -0.2], 0.3, 2),
                                         ([0.0, 1.0, 0.0, 0.7], 0.6, 3)])
def test_exact_moments_equal_an_enumeration_of_every_walk(f, p, i_max):
    adj = _weighted_loopy_graph()
    s = C.Setting("loopy", adj, np.array(f), p, 3, i_max)
    mu, cov = C.exact_moments(s)
    mean, cov_enum = _enumerate_moments(adj, np.array(f), p, i_max)
    np.testing.assert_allclose(mu, mean, atol=1e-12)
    np.testing.assert_allclose(cov, cov_enum, atol=1e-12)
    np.testing.assert_allclose(mu, grf_expected_features(adj, f, i_max), atol=1e-12)
    np.testing.assert_allclose(C.exact_mask(mu), grf_expected_mask(adj, f, i_max), atol=1e-12)


def test_independent_variance_formula_by_enumeration():
    """Var(phi_i . phi'_j) for n = 2 iid walkers per side, by enumerating pairs of walk outcomes."""
    adj = normalized_adjacency(adjacency(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0.0]])))
    f, p = np.array([1.0, 0.6, 0.2]), 0.4
    s = C.Setting("star", adj, f, p, 2, None)
    mu, cov = C.exact_moments(s)
    # outcomes of one walk from each node: (probability, x) listed by enumeration
    outcomes = [[] for _ in range(3)]
    a = sp.csr_matrix(adj)
    w, deg = a.toarray(), degree(a)

    def walk(i, path, prob, load, x):
        u = path[-1]
        can_go = len(path) - 1 < len(f) - 1 and deg[u] > 0
        outcomes[i].append((prob * (p if can_go else 1.0), x))
        if can_go:
            for v in a.indices[a.indptr[u]:a.indptr[u + 1]]:
                step = w[u, v] * deg[u] / (1 - p)
                y = x.copy()
                y[v] += f[len(path)] * load * step
                walk(i, path + [v], prob * (1 - p) / deg[u], load * step, y)

    for i in range(3):
        walk(i, [i], 1.0, 1.0, np.eye(3)[i] * f[0])
    var = C.independent_variance(mu, cov, 2)
    for i, j in [(0, 0), (0, 1), (1, 2)]:
        moments = np.zeros(2)
        for (pa, xa), (pb, xb), (pc, xc), (pd, xd) in itertools.product(outcomes[i], outcomes[i], outcomes[j],
                                                                        outcomes[j]):
            val = ((xa + xb) / 2) @ ((xc + xd) / 2)
            moments += pa * pb * pc * pd * np.array([val, val * val])
        assert moments[1] - moments[0] ** 2 == pytest.approx(var[i, j], rel=1e-10, abs=1e-14)


def test_c_constant_bounds_every_feature_row():
    s = C.grid_setting()
    gen = torch.Generator().manual_seed(3)
    g = C.copies_graph(s, 50)
    walks = C.sample_walks(g, s.n_walkers, p_halt=s.p_halt, i_max=s.i_max, generator=gen)
    dense = C.grf_features(g, walks, torch.as_tensor(s.f)).to_dense()
    assert float(dense.abs().sum(dim=1).max()) <= C.c_constant(s) * (1 + 1e-12)
    r = C.load_rate(s)
    # max W_ij d_i = max sqrt(d_i / d_j) over edges = sqrt(3 / 2) (a 4x4 grid joins degrees 2-3, 3-3, 3-4, 4-4)
    assert r == pytest.approx(math.sqrt(1.5) / (1 - s.p_halt))


def test_draw_masks_blocks_equal_the_dense_reference_on_the_same_walks(monkeypatch):
    s = C.irregular_setting()
    seen = []
    real = C.sample_walks

    def record(g, n, **kw):
        seen.append(real(g, n, **kw))
        return seen[-1]

    monkeypatch.setattr(C, "sample_walks", record)
    copies = 3
    blocks = C.draw_masks(s, copies, torch.Generator().manual_seed(0))
    big = sp.kron(sp.identity(copies, format="csr"), s.adj, format="csr")
    dense = grf_mask(big, seen[0].to_numpy(), seen[1].to_numpy(), s.f)
    for r in range(copies):
        sl = slice(r * s.n, (r + 1) * s.n)
        np.testing.assert_allclose(blocks[r], dense[sl, sl], rtol=1e-12, atol=1e-13)
    off_block = np.kron(1 - np.eye(copies), np.ones((s.n, s.n))).astype(bool)
    assert not dense[off_block].any()  # walks stay in their copy


# --------------------------------------------------------------------------- formulas of the papers


def test_lemma_32_bound_matches_the_papers_examples():
    assert math.ceil(C.lemma_32_b(4, 0.5, 0.01)) == 9 and C.lemma_32_bound(4, 0.5, 0.01) == 37
    assert 100 * math.ceil(C.lemma_32_b(100, 0.5, 0.01)) == 1400


def test_theorem_31_worked_example_and_inverse():
    # c = 1, delta = 0.05 needs n = 2951 for t = 0.1 (docs/papers.md)
    assert C.theorem_31_bound(0.1, 2951, 1.0) <= 0.05 < C.theorem_31_bound(0.1, 2950, 1.0)
    for b in C.THM31_BOUNDS:
        assert C.theorem_31_bound(C.theorem_31_t(b, 64, 2.0), 64, 2.0) == pytest.approx(b)


def test_regular_setting_has_unit_loads():
    s = C.regular_setting(8, (1.0, 0.5))
    assert C.load_rate(s) == pytest.approx(1.0) and C.c_constant(s) == pytest.approx(1.5)


def test_nnz_band_holds_the_sure_inequalities():
    g = C.as_graph(normalized_adjacency(grid_graph((16, 16))))
    walks = C.sample_walks(g, 4, p_halt=0.5, generator=torch.Generator().manual_seed(1))
    nnz = C.grf_features(g, walks, torch.as_tensor(C.LEMMA_F)).nnz_per_row.numpy()
    hops = walks.length.reshape(256, 4).sum(dim=1).numpy()
    assert (nnz <= 1 + hops).all() and (nnz >= 1 + (hops > 0)).all()
    low, high = C.nnz_band(256, 4, 0.5, 1e-9)
    assert low <= nnz.mean() <= high
