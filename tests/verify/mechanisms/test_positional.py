"""verify/mechanisms/positional.py and Mechanism.size_rule: grid shapes, admissible sizes, and
problems whose dense and fast masks are the same matrix."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fast
from verify.mechanisms import positional as MP
from verify.mechanisms import get, mechanisms

POSITIONAL = ("toeplitz-1d", "block-toeplitz", "low-rank", "hypercube-gdk")


def test_grid_shape_is_the_most_square_factorisation():
    for n in range(1, 501):
        a, b = MP.grid_shape(n)
        assert a * b == n and a <= b
        best = max(d for d in range(1, n + 1) if n % d == 0 and d * d <= n)  # brute force
        assert a == best, n


def test_grid_shape_documented_examples():
    assert MP.grid_shape(2**20) == (1024, 1024)
    assert MP.grid_shape(2**17) == (256, 512)
    assert MP.grid_shape(300) == (15, 20)
    assert MP.grid_shape(997) == (1, 997)


def test_hypercube_admissible_is_the_largest_power_of_two_at_most_n():
    mech = get("hypercube-gdk")
    for n in range(1, 3000):
        got = mech.admissible(n)
        assert got <= n and got & (got - 1) == 0 and 2 * got > n, n
    assert mech.admissible(2**20) == 2**20 and mech.admissible(2**20 - 1) == 2**19


def test_other_mechanisms_admit_every_n():
    for mech in mechanisms():
        if mech.id != "hypercube-gdk":
            assert mech.size_rule is None
            assert [mech.admissible(n) for n in (1, 7, 300)] == [1, 7, 300]


@pytest.mark.parametrize("n", [3, 6, 12, 100, 1000])
def test_hypercube_problem_refuses_non_powers_of_two(n):
    with pytest.raises(ValueError, match="power of two"):
        get("hypercube-gdk").make_problem(n, 0)


FAST_MASKS = {
    "toeplitz-1d": MP._toeplitz_fast,
    "block-toeplitz": MP._block_fast,
    "low-rank": MP._low_rank_fast,
    "hypercube-gdk": lambda p, device: fast.HypercubeDiffusionMask(p.n, float(p.extras["lam"])),
}


@pytest.mark.parametrize("mech_id, n", [(m, n) for m in POSITIONAL for n in (1, 16, 12) if m != "hypercube-gdk" or n != 12])
def test_dense_mask_is_the_fast_operator_and_positive(mech_id, n):
    """The gallery's dense mask and the operator the fast path uses are one matrix (float64)."""
    mech = get(mech_id)
    p = mech.make_problem(n, 3)
    dense = mech.dense_mask(p)
    assert dense.shape == (n, n) and np.all(dense > 0)
    got = FAST_MASKS[mech_id](p, "cpu").matmul(torch.eye(n, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(got, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())


@pytest.mark.parametrize("mech_id", POSITIONAL)
def test_fast_equals_reference_float64(mech_id):
    mech = get(mech_id)
    p = mech.make_problem(32, 1)
    out = mech.fast(p, dtype=torch.float64)
    ref = mech.reference(p)
    assert out.shape == ref.shape == (32, 16)
    assert np.linalg.norm(out.numpy() - ref) <= 1e-10 * np.linalg.norm(ref)


def test_problem_extras():
    p = MP.toeplitz_problem(10, 0)
    assert p.extras["log_coeffs"].shape == (19,)
    b = MP.block_toeplitz_problem(12, 0)
    assert tuple(b.extras["grid_shape"]) == (3, 4) and b.extras["log_table"].shape == (5, 7)
    lr = MP.low_rank_problem(9, 0)
    assert lr.extras["encodings"].shape == (9, 2 * MP.RPE_FREQS)
    assert lr.extras["rpe_projection"].shape == (MP.RPE_FEATURES, 2 * MP.RPE_FREQS)
    # deterministic in the seed, and the seed matters
    np.testing.assert_array_equal(MP.toeplitz_problem(10, 0).extras["log_coeffs"], p.extras["log_coeffs"])
    assert not np.array_equal(MP.toeplitz_problem(10, 1).extras["log_coeffs"], p.extras["log_coeffs"])
    # keys after the query (negative offsets) decay twice as fast: far ahead is smaller on average
    far = MP.toeplitz_problem(400, 0).extras["log_coeffs"]
    assert far[:100].mean() < far[-100:].mean() - 1.0
    assert math.isclose(float(MP.hypercube_problem(8, 0).extras["lam"]), MP.HYPERCUBE_LAMBDA)
