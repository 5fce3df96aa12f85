"""reference/masks/toeplitz.py: the dense relative-position masks are what their definitions say.

Every expected matrix is built independently of the module: a double loop over tokens (or over
grid coordinates from itertools.product, row-major by construction) reading a dict offset ->
value. The comparisons are exact: both sides only copy table entries.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reference.masks.toeplitz import (
    block_toeplitz_mask,
    grid_coordinates,
    grid_offsets,
    l1_table,
    symmetric_coefficients,
    toeplitz_mask,
)

seeds = st.integers(0, 2**31 - 1)
grid_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


def _xi(coeffs: np.ndarray) -> dict[int, float]:
    """offset -> value, read off the documented layout coeffs[k] = xi(k - (N - 1))."""
    n = (len(coeffs) + 1) // 2
    return {k - (n - 1): float(coeffs[k]) for k in range(len(coeffs))}


def _brute_block(shape, table):
    """M[a, b] = f(x_a - y_b) with nodes in row-major order (itertools.product), f from the table."""
    nodes = list(itertools.product(*(range(s) for s in shape)))
    f = {tuple(int(i) - (s - 1) for i, s in zip(idx, shape)): table[idx] for idx in np.ndindex(*table.shape)}
    m = np.empty((len(nodes), len(nodes)))
    for a, x in enumerate(nodes):
        for b, y in enumerate(nodes):
            m[a, b] = f[tuple(xi - yi for xi, yi in zip(x, y))]
    return m


# ----------------------------------------------------------------------------------- 1-D


@given(n=st.integers(1, 12), seed=seeds)
@example(n=1, seed=0)
@example(n=2, seed=1)
def test_toeplitz_mask_entries_are_xi_of_i_minus_j(n, seed):
    coeffs = np.random.default_rng(seed).standard_normal(2 * n - 1)  # asymmetric: xi(k) != xi(-k)
    xi = _xi(coeffs)
    m = toeplitz_mask(coeffs)
    assert m.shape == (n, n) and m.dtype == np.float64
    for i in range(n):
        for j in range(n):
            assert m[i, j] == xi[i - j]


def test_toeplitz_mask_asymmetric_literal():
    """offsets -2..2 -> [a, b, c, d, e]: row i holds xi(i - j), so the first row is c, b, a."""
    m = toeplitz_mask(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    np.testing.assert_array_equal(m, [[3, 2, 1], [4, 3, 2], [5, 4, 3]])
    assert not np.array_equal(m, m.T)


def test_toeplitz_mask_zero_negative_offsets_is_lower_triangular():
    n = 6
    coeffs = np.arange(1.0, 2 * n)
    coeffs[: n - 1] = 0.0  # offsets -(N-1)..-1: keys after the query
    m = toeplitz_mask(coeffs)
    assert np.all(np.triu(m, 1) == 0) and np.all(m[np.tril_indices(n)] > 0)


def test_symmetric_coefficients():
    n = 5
    coeffs = symmetric_coefficients(lambda d: 1.0 / (1.0 + d), n)
    assert coeffs.shape == (2 * n - 1,)
    m = toeplitz_mask(coeffs)
    for i in range(n):
        for j in range(n):
            assert m[i, j] == 1.0 / (1.0 + abs(i - j))
    const = symmetric_coefficients(lambda d: 2.0, 3)  # a scalar broadcasts
    np.testing.assert_array_equal(const, np.full(5, 2.0))


@pytest.mark.parametrize("bad, match", [
    (np.ones(4), "coeffs"),                      # even length
    (np.ones((3, 3)), "coeffs"),                 # not 1-D
    (np.array([1.0, np.nan, 1.0]), "coeffs"),    # non-finite
    (np.array([1.0, np.inf, 1.0]), "coeffs"),
])
def test_toeplitz_mask_rejects_bad_coefficients(bad, match):
    with pytest.raises(ValueError, match=match):
        toeplitz_mask(bad)


@pytest.mark.parametrize("make", [lambda: l1_table(lambda r: np.exp(-r), (2, 3)),
                                  lambda: symmetric_coefficients(lambda d: np.exp(-d), 4)])
def test_tables_are_writable_arrays(make):
    table = make()
    assert table.flags.writeable
    table[0] = 5.0


def test_symmetric_coefficients_rejects_non_finite():
    with pytest.raises(ValueError, match="non-finite"):
        symmetric_coefficients(lambda d: np.where(d == 0, np.nan, 1.0), 3)


# ----------------------------------------------------------------------------------- d-D


def test_grid_offsets_and_coordinates():
    off = grid_offsets((2, 3))
    assert off.shape == (3, 5, 2)
    for a in range(3):
        for b in range(5):
            assert tuple(off[a, b]) == (a - 1, b - 2)
    for shape in [(1,), (4,), (2, 3), (3, 1, 2)]:
        coords = grid_coordinates(shape)
        np.testing.assert_array_equal(coords, list(itertools.product(*(range(s) for s in shape))))


def test_l1_table():
    t = l1_table(lambda r: 10.0 ** -r, (2, 3))
    for a in range(3):
        for b in range(5):
            assert t[a, b] == 10.0 ** -(abs(a - 1) + abs(b - 2))


@given(shape=grid_shapes, seed=seeds)
@example(shape=(1,), seed=0)
@example(shape=(1, 1), seed=0)
@example(shape=(3, 5), seed=1)
@example(shape=(5, 3), seed=2)
@example(shape=(2, 3, 4), seed=3)
@example(shape=(4, 1, 3), seed=4)
def test_block_toeplitz_mask_matches_coordinate_loop(shape, seed):
    table = np.random.default_rng(seed).standard_normal(tuple(2 * s - 1 for s in shape))
    m = block_toeplitz_mask(shape, table)
    assert m.shape == (int(np.prod(shape)),) * 2
    np.testing.assert_array_equal(m, _brute_block(shape, table))


@given(n=st.integers(1, 10), seed=seeds)
def test_block_toeplitz_mask_in_1d_is_toeplitz_mask(n, seed):
    coeffs = np.random.default_rng(seed).standard_normal(2 * n - 1)
    np.testing.assert_array_equal(block_toeplitz_mask((n,), coeffs), toeplitz_mask(coeffs))


@pytest.mark.parametrize("shape", [(1,), (4,), (2, 3), (2, 1, 2)])
def test_block_toeplitz_cls_token(shape):
    table = np.random.default_rng(7).standard_normal(tuple(2 * s - 1 for s in shape)) - 5.0  # no entry is 1
    n = int(np.prod(shape))
    m = block_toeplitz_mask(shape, table, cls_token=True)
    assert m.shape == (n + 1, n + 1)
    np.testing.assert_array_equal(m[0], np.ones(n + 1))
    np.testing.assert_array_equal(m[:, 0], np.ones(n + 1))
    np.testing.assert_array_equal(m[1:, 1:], block_toeplitz_mask(shape, table))


def test_block_toeplitz_n_argument():
    table = np.ones((3, 5))
    assert block_toeplitz_mask((2, 3), table, n=6).shape == (6, 6)
    assert block_toeplitz_mask((2, 3), table, cls_token=True, n=7).shape == (7, 7)
    with pytest.raises(ValueError, match=r"n=7"):
        block_toeplitz_mask((2, 3), table, n=7)
    with pytest.raises(ValueError, match=r"n=6"):
        block_toeplitz_mask((2, 3), table, cls_token=True, n=6)


@pytest.mark.parametrize("shape, table, exc, match", [
    ((), np.ones(()), ValueError, "shape"),                     # empty grid
    ((0, 2), np.ones((1, 3)), ValueError, "shape"),             # a zero side
    ((2, -1), np.ones((3, 1)), ValueError, "shape"),
    (5, np.ones(9), TypeError, "shape"),                        # not a tuple
    ((2, 2), np.ones((3, 4)), ValueError, "table"),             # wrong table shape
    ((3,), np.ones((3, 5)), ValueError, "table"),
    ((2,), np.array([1.0, np.nan, 1.0]), ValueError, "table"),  # non-finite
    ((2,), np.array([1.0, 1.0, -np.inf]), ValueError, "table"),
])
def test_block_toeplitz_mask_rejects_bad_input(shape, table, exc, match):
    with pytest.raises(exc, match=match):
        block_toeplitz_mask(shape, table)
