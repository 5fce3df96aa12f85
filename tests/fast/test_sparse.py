"""fast/sparse.py: the CSR builder and its invariant check, transposes, block-diagonal patterns, and the
CSR product with its backward, against dense matrices (gradcheck in float64)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fast.sparse import (CSRProduct, block_diagonal_index, check_csr, csr_matmul, csr_matrix, csr_transpose,
                         index_dtype, row_pointers)
from tests.helpers import gen


def _random_csr(n_rows: int, n_cols: int, density: float, seed: int, dtype=torch.float64):
    """(crow, col, values, dense) of a random matrix with sorted unique columns per row (some rows empty)."""
    g = gen(seed)
    keep = torch.rand(n_rows, n_cols, generator=g) < density
    dense = torch.where(keep, torch.randn(n_rows, n_cols, generator=g, dtype=dtype), torch.zeros((), dtype=dtype))
    rows, cols = torch.nonzero(keep, as_tuple=True)  # row-major: sorted by (row, column)
    return row_pointers(rows, n_rows), cols, dense[rows, cols], dense


def test_index_dtype_switches_at_two_to_the_31():
    assert index_dtype(0) == index_dtype(2**31 - 1) == torch.int32
    assert index_dtype(5, 2**31) == torch.int64
    assert index_dtype() == torch.int32


def test_row_pointers_are_the_counts_prefix_sums():
    rows = torch.tensor([0, 0, 2, 2, 2, 4])
    assert row_pointers(rows, 6).tolist() == [0, 2, 2, 5, 5, 6, 6]
    assert row_pointers(torch.zeros(0, dtype=torch.int64), 3).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("shape", [(7, 7), (5, 9), (9, 4)])
def test_csr_matrix_equals_the_dense_matrix(shape):
    crow, col, values, dense = _random_csr(*shape, 0.4, seed=1)
    a = csr_matrix(crow, col, values, shape if shape[0] != shape[1] else shape[0])
    assert a.layout == torch.sparse_csr and tuple(a.shape) == shape
    assert torch.equal(a.to_dense(), dense)
    assert torch.equal(csr_matrix(crow, col, values, shape, check_invariants=True).to_dense(), dense)


def test_check_csr_returns_the_rows_of_a_valid_pattern():
    crow, col, _, dense = _random_csr(6, 8, 0.5, seed=2)
    rows = check_csr(crow, col, 8, "m")
    assert torch.equal(rows, torch.nonzero(dense != 0, as_tuple=True)[0])
    assert check_csr(torch.zeros(4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 3).numel() == 0


@pytest.mark.parametrize("crow, col, match", [
    ([1, 2, 3], [0, 1, 0], "crow must start at 0"),
    ([0, 2, 1, 3], [0, 1, 0], "non-decreasing"),
    ([0, 1, 2], [0, 1, 0], "end at E = 3"),
    ([0, 2, 3], [0, 3, 0], r"col must hold column indices in \[0, 3\)"),
    ([0, 2, 3], [-1, 1, 0], r"in \[0, 3\), got values in \[-1, 1\]"),
    ([0, 2, 3], [1, 0, 0], "sorted without duplicates within each row"),
    ([0, 2, 3], [1, 1, 0], "sorted without duplicates within each row"),
])
def test_check_csr_names_the_broken_invariant(crow, col, match):
    with pytest.raises(ValueError, match="^graph: .*" + match):
        check_csr(torch.tensor(crow), torch.tensor(col), 3, "graph")


def test_check_csr_refuses_wrong_dimensions():
    with pytest.raises(ValueError, match="crow must be 1-D"):
        check_csr(torch.zeros(2, 2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2)


def test_csr_matrix_checks_invariants_when_asked_or_when_torch_is_told_to():
    crow, col, values = torch.tensor([0, 2, 3]), torch.tensor([1, 5, 0]), torch.ones(3)  # column 5 of a 2 x 2
    with pytest.raises(RuntimeError):
        csr_matrix(crow, col, values, 2, check_invariants=True)
    with torch.sparse.check_sparse_tensor_invariants(), pytest.raises(RuntimeError):
        csr_matrix(crow, col, values, 2, check_invariants=None)


@pytest.mark.parametrize("shape", [(6, 6), (4, 7), (7, 3)])
def test_csr_transpose_is_the_pattern_of_the_transpose(shape):
    crow, col, values, dense = _random_csr(*shape, 0.5, seed=3)
    crow32, col32 = crow.to(torch.int32), col.to(torch.int32)
    crow_t, col_t, perm = csr_transpose(crow32, col32, shape[1])
    assert crow_t.dtype == col_t.dtype == torch.int32  # keeps the given index dtypes
    at = csr_matrix(crow_t, col_t, values[perm], (shape[1], shape[0]), check_invariants=True)
    assert torch.equal(at.to_dense(), dense.T)
    back = csr_transpose(crow_t, col_t, shape[0])
    assert torch.equal(values[perm][back[2]], values)  # transposing twice restores the order


def test_block_diagonal_index_applies_differently_valued_copies():
    crow, col, values, dense = _random_csr(5, 5, 0.5, seed=4)
    slices = 3
    big_crow, big_col = block_diagonal_index(crow, col, 5, slices)
    assert big_crow.dtype == big_col.dtype == torch.int32
    scale = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    vals = (scale[:, None] * values[None, :]).reshape(-1)
    big = csr_matrix(big_crow, big_col, vals, 5 * slices, check_invariants=True)
    assert torch.equal(big.to_dense(), torch.block_diag(*(s * dense for s in scale)))


def test_csr_product_forward_backward_against_dense():
    crow, col, values, dense = _random_csr(6, 6, 0.5, seed=5)
    crow_t, col_t, perm = csr_transpose(crow, col, 6)
    a, a_t = csr_matrix(crow, col, values, 6), csr_matrix(crow_t, col_t, values[perm], 6)
    x = torch.randn(6, 3, generator=gen(6), dtype=torch.float64, requires_grad=True)
    y = CSRProduct.apply(x, a, a_t)
    torch.testing.assert_close(y, dense @ x, rtol=1e-12, atol=1e-12)
    g = torch.randn(6, 3, generator=gen(7), dtype=torch.float64)
    (gx,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(gx, dense.T @ g, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(lambda t: CSRProduct.apply(t, a, a_t), (x,))
    torch.autograd.gradgradcheck(lambda t: CSRProduct.apply(t, a, a_t), (x,))


def test_csr_product_of_a_rectangular_matrix():
    crow, col, values, dense = _random_csr(4, 7, 0.5, seed=8)
    crow_t, col_t, perm = csr_transpose(crow, col, 7)
    a, a_t = csr_matrix(crow, col, values, (4, 7)), csr_matrix(crow_t, col_t, values[perm], (7, 4))
    x = torch.randn(7, 2, generator=gen(9), dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: csr_matmul(a, t, a_t), (x,))
    torch.testing.assert_close(csr_matmul(a, x, a_t), dense @ x, rtol=1e-12, atol=1e-12)


def test_csr_matmul_without_a_gradient_is_the_plain_product():
    crow, col, values, _ = _random_csr(8, 8, 0.4, seed=10)
    a = csr_matrix(crow, col, values.float(), 8)
    x = torch.randn(8, 4, generator=gen(11))
    y = csr_matmul(a, x, a)
    assert y.grad_fn is None and torch.equal(y, a @ x)
    with torch.no_grad():
        assert csr_matmul(a, x.requires_grad_(), a).grad_fn is None
    assert csr_matmul(a, x, a).grad_fn is not None and torch.equal(csr_matmul(a, x, a), a @ x)


def test_graph_csr_is_the_weighted_adjacency():
    """fast.graphs.Graph.csr (a public method handing out the CSR, built by csr_matrix)."""
    from fast.graphs import as_graph

    g = as_graph(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), n=3)
    assert torch.equal(g.csr().to_dense(), torch.tensor([[0.0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.float64))
