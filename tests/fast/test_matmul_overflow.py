"""MaskOperator.matmul / rmatmul near the dtype's maximum (issue 24): a finite x whose product M @ x is
finite comes back finite, although the masks' inner sums (an FFT's, a series' powers, prefix sums,
a GEMM's partial sums) pass the maximum on the way. Every mask family of the registry (its fast_mask
and dense_mask, N = 64) and the explicit masks, float32 and float64, nonnegative and signed x.

Per case: (1) the result equals 2^s (M @ (x 2^-s)) bit for bit, s = fast.scaling.value_shift(x) (x's
entries lie within a factor 4 of their column's largest, so the scaled copy has no subnormal and the
scaling is exact); (2) no entry is inf or NaN where the float64 reference M_ref @ x (formed on
x 2^-s, so that it cannot overflow) is at most half the dtype's maximum; (3) the finite entries agree
with the reference within the equivalence tests' tolerance (tests.helpers.EQUIV_TOL). Before the fix
the unchecked products (``matmul_unscaled``) returned inf or NaN for entries whose reference is
finite: test_the_unchecked_product_overflows_somewhere shows that this input reaches them."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

import fast
from fast.scaling import times_pow2, value_shift
from tests.helpers import EQUIV_TOL, gen, rel_frobenius
from verify import registry
from verify.mechanisms import mechanisms  # noqa: F401  (registers the families)

N = 64
COLUMNS = 3
MECH_IDS = [m.id for m in registry.registered() if m.fast_mask is not None and m.dense_mask is not None
            and m.id != "nodeformer"]  # nodeformer: fast_mask None (its graph bias is not a mask operator)
CASES = MECH_IDS + ["dense-signed", "sparse"]
DTYPES = [torch.float32, torch.float64]


@functools.lru_cache(maxsize=None)
def _case(name: str) -> tuple[fast.MaskOperator, np.ndarray]:
    """(operator, its dense float64 reference (N, N))."""
    if name == "dense-signed":
        m = torch.randn(N, N, generator=gen(3), dtype=torch.float64)
        return fast.DenseMask(m), m.numpy()
    if name == "sparse":
        m = torch.rand(N, N, generator=gen(4), dtype=torch.float64)
        m = m * (m > 0.7)
        return fast.as_mask_operator(m.to_sparse_csr()), m.numpy()
    mech = registry.lookup(name)
    problem = mech.problem(mech.admissible(N), 0)
    return mech.fast_mask(problem, "cpu"), np.asarray(mech.dense_mask(problem), dtype=np.float64)


def _x(n: int, dtype: torch.dtype, signed: bool, top: float, seed: int) -> torch.Tensor:
    """(n, COLUMNS), |entries| in [top / 4, top]: no subnormal in x 2^-s."""
    g = gen(seed)
    x = (torch.rand(n, COLUMNS, generator=g, dtype=torch.float64) * 0.75 + 0.25) * top
    if signed:
        x = x * torch.where(torch.rand(n, COLUMNS, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return x.to(dtype)


def _tops(dense: np.ndarray, dtype: torch.dtype) -> list[float]:
    """Largest |x|: the dtype's maximum over twice the largest row sum of |M| (every M x fits), and
    the maximum over 2, 4, 16, 64 and 256 (rows that truly overflow beside rows that fit, and inner
    sums that pass the maximum: each family loses entries at one of them without the check)."""
    big = float(torch.finfo(dtype).max)
    rowsum = float(np.abs(dense).sum(-1).max())
    return [big / max(2.0 * rowsum, 1.0)] + [big / div for div in (2, 4, 16, 64, 256)]


def _reference_scaled(dense: np.ndarray, x: torch.Tensor, s: torch.Tensor, transpose: bool) -> np.ndarray:
    """M_ref @ (x 2^-s) in float64 (no overflow: |x 2^-s| < 1)."""
    scaled = times_pow2(x.to(torch.float64), -s).numpy()
    return (dense.T if transpose else dense) @ scaled


def _check(op, dense, x, transpose, all_fit):
    product = op.rmatmul if transpose else op.matmul
    out = product(x)
    s = value_shift(x)
    expected = times_pow2(product(times_pow2(x, -s)), s)
    assert out.dtype == x.dtype and not torch.isnan(expected).any()
    assert torch.equal(out, expected)  # (1) exact: 2^s times the product on x 2^-s
    ref = _reference_scaled(dense, x, s, transpose)  # the true M x is ref 2^s
    limit = times_pow2(torch.full_like(x[:1], torch.finfo(x.dtype).max / 2, dtype=torch.float64), -s).numpy()
    representable = np.abs(ref) <= limit
    assert representable.all() if all_fit else True  # the first top: every true value fits
    got = times_pow2(out.to(torch.float64), -s).numpy()
    assert np.isfinite(got[representable]).all()  # (2) nothing lost where the true value fits
    assert rel_frobenius(got[representable], ref[representable]) <= EQUIV_TOL[x.dtype]  # (3)


@pytest.mark.parametrize("signed", [False, True], ids=["nonnegative", "signed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", CASES)
def test_matmul_near_the_maximum_is_exact(name, dtype, signed):
    op, dense = _case(name)
    for i, top in enumerate(_tops(dense, dtype)):
        _check(op, dense, _x(op.n, dtype, signed, top, seed=10 * i + signed), False, all_fit=i == 0)


@pytest.mark.parametrize("signed", [False, True], ids=["nonnegative", "signed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", CASES)
def test_rmatmul_near_the_maximum_is_exact(name, dtype, signed):
    op, dense = _case(name)
    if not op.has_rmatmul:
        pytest.skip(f"{type(op).__name__} offers no rmatmul")
    for i, top in enumerate(_tops(dense.T, dtype)):
        _check(op, dense, _x(op.n, dtype, signed, top, seed=10 * i + signed + 100), True, all_fit=i == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_the_unchecked_product_overflows_somewhere(dtype):
    """The inputs above reach the overflow the check repairs: in several families the unchecked
    product (or its transpose) loses entries whose true value fits (so the tests above fail
    without the check)."""
    lost = set()
    for name in CASES:
        op, dense = _case(name)
        for top in _tops(dense, dtype):
            for signed, transpose in itertools.product((False, True), (False, op.has_rmatmul)):
                x = _x(op.n, dtype, signed, top, seed=1)
                s = value_shift(x)
                limit = times_pow2(torch.full_like(x[:1], torch.finfo(dtype).max / 2, dtype=torch.float64), -s)
                fits = torch.as_tensor(np.abs(_reference_scaled(dense, x, s, transpose))) <= limit
                unchecked, checked = (op.rmatmul_unscaled, op.rmatmul) if transpose else (op.matmul_unscaled, op.matmul)
                if not torch.isfinite(unchecked(x))[fits].all():
                    lost.add(name)
                    assert torch.isfinite(checked(x))[fits].all()
    assert {"padding", "tree-exp", "low-rank", "hypercube-gdk", "dense-signed", "sparse"} <= lost, lost


def test_rows_that_met_no_overflow_are_kept_as_computed():
    """Packing: a segment of huge values overflows the segment sums, a segment of small ones does
    not; the small segment's results are the unchecked product's, not rounded through subnormals
    of x 2^-s."""
    ids = torch.tensor([0] * 4 + [1] * 4)
    op = fast.PackingMask(ids)
    x = torch.tensor([[3e38], [3e38], [-3e38], [-1e38], [1e-30], [2e-30], [3e-30], [4e-30]])
    out = op.matmul(x)
    assert torch.equal(out[4:], op.matmul_unscaled(x)[4:]) and float(out[4, 0]) == pytest.approx(1e-29, rel=1e-6)
    assert torch.isfinite(out[:4]).all() and float(out[0, 0]) == pytest.approx(2e38, rel=1e-6)


def test_half_precision_and_gradients():
    """float16 (maximum 65504): the shift is taken in float32 and the product stays float16; the
    gradient of the redone entries is M^T's, as for any linear map."""
    op = fast.DenseMask(torch.ones(3, 3))
    x = torch.tensor([[4e4], [4e4], [-4e4]], dtype=torch.float16)
    out = op.matmul(x)
    assert out.dtype == torch.float16 and out.flatten().tolist() == [4e4] * 3
    xg = torch.tensor([[2e38], [2e38], [-2e38]], requires_grad=True)
    op.matmul(xg).sum().backward()
    assert xg.grad.flatten().tolist() == [3.0, 3.0, 3.0]


def test_non_finite_x_is_returned_as_computed():
    op = fast.CausalMask(3)
    x = torch.tensor([[1.0], [float("inf")], [1.0]])
    assert torch.equal(op.matmul(x), op.matmul_unscaled(x))


def test_an_override_of_matmul_is_what_the_drivers_compute_with():
    """matmul_unscaled (the drivers' product) calls a subclass's or an instance's own matmul /
    rmatmul: a product defined there is never bypassed."""
    class Doubled(fast.DenseMask):
        def matmul(self, x):
            return 2 * super().matmul(x)

    m = torch.rand(4, 4, generator=gen(5), dtype=torch.float64)
    x = torch.rand(4, 2, generator=gen(6), dtype=torch.float64)
    assert torch.equal(Doubled(m).matmul_unscaled(x), 2 * (m @ x))
    op = fast.DenseMask(m)
    op.rmatmul = lambda y: 3 * (m.T @ y)
    assert torch.equal(op.rmatmul_unscaled(x), 3 * (m.T @ x))
    assert torch.equal(fast.DenseMask(m).rmatmul_unscaled(x), m.T @ x)


def test_a_learnable_mask_gets_its_gradient_through_the_redo():
    """With a parameter requiring grad the factors 2^-s, 2^s stay in the graph: d(sum M x)/dM = 1 x^T
    exactly (powers of two), here where g 2^s fits float64. Each term 1e5 x_j of the first two
    overflows by itself, so the unchecked product is NaN in every summation order a GEMM may take."""
    m = torch.full((3, 3), 1e5, dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[2e303], [-2e303], [1e303]], dtype=torch.float64)
    op = fast.DenseMask(m)
    assert not torch.isfinite(op.matmul_unscaled(x)).all()
    out = op.matmul(x)
    assert torch.isfinite(out).all() and out[0, 0].item() == pytest.approx(1e308, rel=1e-12)
    out.sum().backward()
    assert torch.equal(m.grad, torch.ones(3, 1, dtype=torch.float64) @ x.T)
