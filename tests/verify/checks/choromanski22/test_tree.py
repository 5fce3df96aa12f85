"""verify/checks/choromanski22/tree.py: the Lemma 3.5 check passes, and its two recursions are the ones claimed."""
from __future__ import annotations

import numpy as np
import pytest

from reference.masks import tree as ref_tree
from results.check import Context
from verify.checks.choromanski22 import tree as C
from verify.problems import tree_parent


def _evaluate(check_id: str, seed: int = 0):
    check = next(c for c in C.checks() if c.id == check_id)
    return check.evaluate(Context(quick=True, seed=seed))


def test_lemma_35_check_passes_and_shows_the_erratum():
    r = _evaluate("choromanski22/lemma-3.5")
    assert r.id == "choromanski22/lemma-3.5" and r.kind == "erratum" and r.status == "pass"
    assert r.details["weakest_printed_error"] > C.PRINTED_MUST_EXCEED
    assert (r.statistic <= r.threshold == 1.0) and r.compare == "<=" and r.details["reasons"] == []


def test_lemma_35_trees_come_from_the_one_tree_generator():
    trees = C._trees(0)
    np.testing.assert_array_equal(trees["path n=30"][0], tree_parent("path", 30))
    np.testing.assert_array_equal(trees["star n=30"][0], tree_parent("star", 30))
    rng = C.rng_for(0, 61)
    np.testing.assert_array_equal(trees["random tree n=40"][0], tree_parent("random recursive", 40, rng))
    for parent, weight in trees.values():
        ref_tree.forest_adjacency(parent, weights=weight)  # valid forests, lengths in [0.5, 1.5]
        assert weight.min() >= 0.5 and weight.max() <= 1.5
    assert int((trees["forest n=60 (3 trees)"][0] < 0).sum()) == 3


def test_lemma_35_fails_when_the_printed_form_is_not_wrong(monkeypatch):
    """If the 'printed' recursion were the corrected one, the erratum is not shown: fail, saying so."""
    real = C.two_phase
    monkeypatch.setattr(C, "two_phase", lambda parent, w, x, a, b, printed: real(parent, w, x, a, b, False))
    r = _evaluate("choromanski22/lemma-3.5")
    assert r.status == "fail" and r.statistic <= r.threshold
    assert len(r.details["reasons"]) == 1 and "printed recursion" in r.details["reasons"][0]


@pytest.mark.parametrize("a", [-0.5, 0.3])
def test_corrected_recursion_equals_dense_and_printed_does_not(a):
    parent = np.array([-1, 0, 0, 1, 1, 2, -1, 6])
    w = np.array([1.0, 0.7, 1.3, 0.5, 1.1, 0.9, 1.0, 0.6])
    x = np.random.default_rng(0).standard_normal((8, 2))
    exact = ref_tree.exp_affine_mask(ref_tree.forest_adjacency(parent, weights=w), a, 0.2) @ x
    np.testing.assert_allclose(C.two_phase(parent, w, x, a, 0.2, printed=False), exact, rtol=1e-12, atol=1e-12)
    assert np.abs(C.two_phase(parent, w, x, a, 0.2, printed=True) - exact).max() > 1e-2 * np.abs(exact).max()


def test_printed_equals_corrected_only_at_a_equal_one():
    """The erratum is exactly the missing factor a: at a = 1 the two forms coincide."""
    parent = np.array([-1, 0, 1, 1])
    w = np.array([1.0, 0.4, 0.8, 1.2])
    x = np.ones((4, 1))
    np.testing.assert_allclose(C.two_phase(parent, w, x, 1.0, 0.0, True), C.two_phase(parent, w, x, 1.0, 0.0, False))


# --------------------------------------------------------------------------- lemma 6.1 / 6.2

FAMILIES = {"path", "star", "caterpillar", "complete binary", "random recursive", "mixed forest"}


def test_checks_are_listed_with_their_ids_and_kinds():
    assert [(c.id, c.kind) for c in C.checks()] == [
        ("choromanski22/lemma-3.5", "erratum"), ("choromanski22/lemma-6.1", "bound"),
        ("choromanski22/lemma-6.2", "bound"), ("choromanski22/lemma-6.2-diam", "complexity")]


def test_lemma_61_check_passes_with_depth_within_bound():
    r = _evaluate("choromanski22/lemma-6.1")
    assert (r.id, r.kind, r.source, r.status) == ("choromanski22/lemma-6.1", "bound", "choromanski22 Lemma 6.1", "pass")
    assert r.statistic <= r.threshold == C.EXACT_ANY_F
    assert r.details["depth_within_log_1.5_n"] is True and r.details["n"] == C.FAMILY_N
    cases = r.details["cases"]
    assert {c["tree"] for c in cases} == FAMILIES and len(cases) == 2 * len(FAMILIES)
    assert max(c["relative_error"] for c in cases) == r.statistic
    for c in cases:
        assert c["recursion_depth"] <= c["depth_bound"] == pytest.approx(np.log(C.FAMILY_N) / np.log(1.5))
        # dense leaves of C.LEAF nodes: every family, the mixed forest's ~33-node trees included, is split
        assert c["recursion_depth"] >= 1


def test_lemma_62_check_passes():
    r = _evaluate("choromanski22/lemma-6.2")
    assert (r.id, r.kind, r.source, r.status) == ("choromanski22/lemma-6.2", "bound", "choromanski22 Lemma 6.2", "pass")
    assert r.statistic <= r.threshold == C.EXACT_ANY_F
    assert {c["tree"] for c in r.details["cases"]} == FAMILIES and len(r.details["cases"]) == 2 * len(FAMILIES)


def test_families_are_trees_of_family_n_nodes():
    fams = C._families(0)
    assert set(fams) == FAMILIES
    for name, parent in fams.items():
        assert parent.shape == (C.FAMILY_N,)
        ref_tree.forest_adjacency(parent)  # a valid forest
        assert int((parent < 0).sum()) == (6 if name == "mixed forest" else 1)


def test_planted_bug_in_the_product_fails_lemma_61(monkeypatch):
    """One wrong row in TreeDCMask's product (an extra 1e-6 x_0 at node 0) must fail the check."""
    real = C.TreeDCMask.matmul

    def wrong(self, x):
        out = real(self, x).clone()
        out[..., 0, :] += 1e-6 * x[..., 0, :]
        return out

    monkeypatch.setattr(C.TreeDCMask, "matmul", wrong)
    r = _evaluate("choromanski22/lemma-6.1")
    assert r.status == "fail" and r.statistic > r.threshold
    assert len(r.details["reasons"]) == 1 and "relative error" in r.details["reasons"][0]
    assert r.details["depth_within_log_1.5_n"] is True  # the depth is fine: the error alone fails it


def test_planted_bug_in_f_fails_lemma_61(monkeypatch):
    """An operator built with f(1) off by 1e-6 (a wrong f passed) must fail the check."""
    real = C.TreeDCMask

    def shifted(forest, f, **kw):
        f = f.clone()
        f[1] += 1e-6
        return real(forest, f, **kw)

    monkeypatch.setattr(C, "TreeDCMask", shifted)
    r = _evaluate("choromanski22/lemma-6.1")
    assert r.status == "fail" and r.statistic > r.threshold


def test_too_deep_recursion_fails_lemma_61(monkeypatch):
    """An exact product with a recursion deeper than log_1.5 N still fails (the O(log N) claim)."""
    real = C.TreeDCMask

    def deep(forest, f, **kw):
        op = real(forest, f, **kw)
        op.recursion_depth = int(np.log(forest.n) / np.log(1.5)) + 1
        return op

    monkeypatch.setattr(C, "TreeDCMask", deep)
    r = _evaluate("choromanski22/lemma-6.1")
    assert r.status == "fail" and r.statistic <= r.threshold and r.details["depth_within_log_1.5_n"] is False
    assert r.details["reasons"] and all("recursion depth" in x for x in r.details["reasons"])


# --------------------------------------------------------------- lemma-6.2-diam (fake timings)


def _fake_times(monkeypatch, path_cost, binary_cost):
    """Replace the timer by exact costs of N (no timing in a pass/fail test)."""
    def fake(parent, rounds):
        n = parent.size
        return (path_cost if parent[-1] == n - 2 and n > 2 else binary_cost)(n) * 1e-9
    monkeypatch.setattr(C, "_time_diam", fake)


def test_lemma_62_diam_passes_when_paths_fall_behind_like_n_over_log_n(monkeypatch):
    _fake_times(monkeypatch, lambda n: n * n, lambda n: n * 2 * np.log2(n))
    r = _evaluate("choromanski22/lemma-6.2-diam")
    assert r.status == "pass" and r.statistic > r.threshold == C.RATIO_LOWER and r.compare == ">"
    assert r.unit == "slope" and r.details["reasons"] == []


def test_lemma_62_diam_fails_without_the_diam_factor(monkeypatch):
    """An O(N log N) method on paths too: the ratio's slope is 0, and the reason says so."""
    _fake_times(monkeypatch, lambda n: n * np.log2(n), lambda n: n * np.log2(n))
    r = _evaluate("choromanski22/lemma-6.2-diam")
    assert r.status == "fail" and not r.statistic > r.threshold
    assert len(r.details["reasons"]) == 1 and "diam factor" in r.details["reasons"][0]


def test_lemma_62_diam_fails_when_binary_trees_are_quadratic(monkeypatch):
    _fake_times(monkeypatch, lambda n: n**2.9, lambda n: n**2.0)
    r = _evaluate("choromanski22/lemma-6.2-diam")
    assert r.status == "fail" and r.statistic > r.threshold  # the ratio grows: only the binary slope fails
    assert len(r.details["reasons"]) == 1 and "binary trees" in r.details["reasons"][0]
