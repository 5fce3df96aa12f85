"""verify/checks/tree.py: the Lemma 3.5 check passes, and its two recursions are the ones claimed."""
from __future__ import annotations

import numpy as np
import pytest

from reference.masks import tree as ref_tree
from verify.checks import tree as C
from verify.result import Context


def test_lemma_35_check_passes_and_shows_the_erratum():
    r = C._lemma_35(Context(quick=True, seed=0))
    assert r.id == "choromanski22/lemma-3.5" and r.kind == "erratum" and r.status == "pass"
    assert r.details["weakest_printed_error"] > C.PRINTED_MUST_EXCEED


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
