"""reference/masks/hypercube.py: Hamming distances, the tanh^dist mask and the Sec. 4.1 identity."""
from __future__ import annotations

import math

import numpy as np
import pytest

from reference.masks.hypercube import (
    diffusion_kernel,
    hypercube_adjacency,
    hypercube_dimension,
    hypercube_distance,
    hypercube_mask,
)


def test_hypercube_dimension():
    for k in range(0, 21):
        assert hypercube_dimension(2**k) == k
    assert hypercube_dimension(np.int64(8)) == 3


@pytest.mark.parametrize("n", [0, 3, 6, 12, -4, 1023])
def test_hypercube_dimension_rejects_non_powers_of_two(n):
    with pytest.raises(ValueError, match="n must be a power of two"):
        hypercube_dimension(n)


@pytest.mark.parametrize("n", [True, 2.5, 4.0, "4"])
def test_hypercube_dimension_rejects_non_integers(n):
    """A float side is refused, not truncated or accepted when integral (TypeError naming n)."""
    with pytest.raises(TypeError, match="n must be an int"):
        hypercube_dimension(n)


@pytest.mark.parametrize("k", range(0, 7))
def test_hypercube_distance_is_popcount_of_xor(k):
    n = 2**k
    dist = hypercube_distance(n)
    assert dist.shape == (n, n)
    for i in range(n):
        for j in range(n):
            assert dist[i, j] == bin(i ^ j).count("1")


@pytest.mark.parametrize("k", range(0, 7))
def test_hypercube_adjacency(k):
    n = 2**k
    a = hypercube_adjacency(n)
    np.testing.assert_array_equal(a, a.T)
    np.testing.assert_array_equal(a.sum(1), np.full(n, k))  # k-regular
    for i in range(n):
        assert {j for j in range(n) if a[i, j]} == {i ^ (1 << b) for b in range(k)}


@pytest.mark.parametrize("lam", [0.1, 0.5, 2.0])
def test_hypercube_mask_is_tanh_to_the_distance(lam):
    n = 16
    m = hypercube_mask(n, lam)
    t = math.tanh(lam)
    for i in range(n):
        for j in range(n):
            assert m[i, j] == pytest.approx(t ** bin(i ^ j).count("1"), rel=1e-14)
    assert np.all(m > 0) and np.all(np.diag(m) == 1.0)


@pytest.mark.parametrize("k", range(0, 7))
@pytest.mark.parametrize("lam", [0.1, 0.5, 1.0, 3.0])
def test_diffusion_kernel_is_proportional_to_hypercube_mask(k, lam):
    """Sec. 4.1: exp(-lam L) = (e^-lam cosh lam)^k tanh(lam)^dist on {0,1}^k."""
    n = 2**k
    kernel = diffusion_kernel(hypercube_adjacency(n), lam)
    const = (math.exp(-lam) * math.cosh(lam)) ** k
    np.testing.assert_allclose(kernel, const * hypercube_mask(n, lam), rtol=1e-12, atol=1e-14)


def test_diffusion_kernel_on_a_path_of_three_is_not_a_function_of_distance():
    """The erratum (docs/papers.md Sec. 1): on grids of side >= 3 the diagonal is not constant."""
    path = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float)
    kernel = diffusion_kernel(path, 0.5)
    np.testing.assert_allclose(kernel.sum(1), 1.0, rtol=1e-13)  # exp(-lam L) 1 = 1 (L 1 = 0)
    assert abs(kernel[0, 0] - kernel[1, 1]) > 1e-2


@pytest.mark.parametrize("lam", [0.0, -1.0, math.inf, math.nan])
def test_hypercube_mask_rejects_bad_lambda(lam):
    with pytest.raises(ValueError, match="lam"):
        hypercube_mask(4, lam)


def test_hypercube_mask_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        hypercube_mask(6, 0.5)


def test_diffusion_kernel_rejects_non_symmetric():
    with pytest.raises(ValueError, match="adjacency"):
        diffusion_kernel(np.array([[0.0, 1.0], [0.0, 0.0]]), 0.5)
    with pytest.raises(ValueError, match="adjacency"):
        diffusion_kernel(np.ones((2, 3)), 0.5)
