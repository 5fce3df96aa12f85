"""fast/scaling.py and the drivers' rare path for values whose sums overflow where the output does not
(issue 24): out(v) is an average of v's entries, so it is finite for any finite v, yet num_i reaches
den_i max |v| (N max |v| with N keys). The drivers redo such a call on v 2^-s and multiply back, which
is exact, so the result must equal 2^k out(v 2^-k) bit for bit for any k that keeps the second call
clear of overflow and of subnormals (the common path there, checked against the reference elsewhere).
"""
from __future__ import annotations

import pytest
import torch

from fast import (CausalMask, DenseMask, EluPlusOne, PackingMask, ToeplitzMask, favor_attention,
                  gaussian_projection, linear_attention, masked_linear_attention)
from fast.scaling import max_exponent, pow2, times_pow2, value_shift, within_values
from tests.helpers import GenericMask, gen

#: the factor 2^K of the homogeneity comparison, per dtype: v 2^-K is far from both ends of the range
K = {torch.float32: 64, torch.float64: 512}


def near_max(shape, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Random signed values with |v| in [max / 4, max): every sum of two of them overflows."""
    big = torch.finfo(dtype).max
    mag = (0.25 + 0.75 * torch.rand(*shape, generator=g, dtype=torch.float64)) * big
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mag).to(dtype)


def rounding_bound(n: int, m: int, dtype: torch.dtype) -> float:
    """Worst-case relative error of an average of n keys through m features: num and den each sum
    n m products (gamma_{n m + 2} each), and the quotient adds one rounding."""
    u = torch.finfo(dtype).eps / 2
    return 2 * (n * m + 3) * u


# ------------------------------------------------------------------------------------ helpers


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pow2_is_exact_over_the_normal_range(dtype):
    emax = max_exponent(dtype)
    e = torch.arange(-(emax - 2), emax)
    want = torch.tensor([2.0 ** int(i) for i in e], dtype=torch.float64).to(dtype)
    assert torch.equal(pow2(e, dtype), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_times_pow2_round_trips_bit_for_bit(dtype):
    emax = max_exponent(dtype)
    x = near_max((64, 3), gen(0), dtype)
    e = torch.tensor([-(emax + 10), -emax, -3])  # beyond the largest single normal power of two too
    y = times_pow2(x, e)
    assert torch.isfinite(y).all() and bool((y != 0).all())
    assert torch.equal(times_pow2(y, -e), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_shift_bounds_the_sums(dtype):
    big = torch.finfo(dtype).max
    v = near_max((2, 50, 4), gen(1), dtype)
    v[1, :, 2] = 1.5  # a small column: no shift there
    s = value_shift(v, 1000.0)
    assert s.shape == (2, 1, 4) and s.dtype == torch.int64
    scaled = times_pow2(v.double(), -s)  # in float64: nothing rounds
    top = scaled.abs().amax(-2)
    assert bool((top * 1000.0 <= big / 4).all())
    assert bool((top * 1000.0 > big / 16).flatten()[s.flatten() > 0].all())  # the least such shift
    assert int(s[1, 0, 2]) == 0
    full = times_pow2(v.double(), -value_shift(v)).abs().amax(-2)
    assert bool(((full >= 0.5) & (full < 1)).flatten()[[0, 1, 2, 3, 4, 5, 7]].all())


# ------------------------------------------------------------------------------------ drivers


def elu_features(n: int, m: int, dtype: torch.dtype, lead=()):
    g = gen(2)
    return (EluPlusOne()(torch.randn(*lead, n, m, generator=g, dtype=dtype)),
            EluPlusOne()(torch.randn(*lead, n, m, generator=g, dtype=dtype)))


MASKS = {
    "none": lambda n: None,
    "causal (attend)": lambda n: CausalMask(n),
    "packing (generic)": lambda n: PackingMask(torch.arange(n) // 5),
    "dense tril (generic)": lambda n: DenseMask(torch.ones(n, n).tril()),
    "toeplitz (attend)": lambda n: ToeplitzMask.from_function(lambda dist: 0.5 ** dist, n, dtype=torch.float64),
    "causal via matmul": lambda n: GenericMask(CausalMask(n)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", list(MASKS))
def test_masked_linear_attention_of_huge_constant_values_is_that_value(mask, dtype):
    n, m = 12, 8
    val = 3e38 if dtype == torch.float32 else 1.7e308
    phi_q, phi_k = elu_features(n, m, dtype, lead=(2, 3))
    v = torch.full((2, 3, n, 4), val, dtype=dtype)
    out = masked_linear_attention(phi_q, phi_k, v, MASKS[mask](n))
    assert torch.isfinite(out).all()
    exact = v.double()
    assert float(((out.double() - exact) / exact).abs().max()) <= rounding_bound(n, m, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", list(MASKS))
def test_masked_linear_attention_is_homogeneous_in_huge_values(mask, dtype):
    n, m = 40, 8
    phi_q, phi_k = elu_features(n, m, dtype, lead=(2,))
    v = near_max((2, n, 3), gen(3), dtype)
    out = masked_linear_attention(phi_q, phi_k, v, MASKS[mask](n))
    want = times_pow2(masked_linear_attention(phi_q, phi_k, times_pow2(v, torch.tensor(-K[dtype])), MASKS[mask](n)),
                      torch.tensor(K[dtype]))
    assert torch.isfinite(out).all() and torch.isfinite(want).all()
    assert torch.equal(out, want)


@pytest.mark.parametrize("n, val", [(12, 3e38), (2048, 2e35)])
def test_linear_attention_float32_constant(n, val):
    phi_q, phi_k = elu_features(n, 4, torch.float32)
    out = linear_attention(phi_q, phi_k, torch.full((n, 3), val))
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rounding_bound(n, 4, torch.float32)


def test_gradients_stay_finite_on_the_rescaled_path():
    n, m = 30, 6
    phi_q, phi_k = elu_features(n, m, torch.float32)
    v = near_max((n, 3), gen(4), torch.float32).requires_grad_(True)
    mask = DenseMask(torch.ones(n, n).tril())
    out = masked_linear_attention(phi_q, phi_k, v, mask)
    assert torch.isfinite(out).all()
    out.sum().backward()  # the gradient w.r.t. v holds the attention weights' column sums: no scale
    small = (v.detach() * 2.0 ** -64).requires_grad_(True)
    masked_linear_attention(phi_q, phi_k, small, mask).sum().backward()
    assert torch.isfinite(v.grad).all()
    torch.testing.assert_close(v.grad, small.grad, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", ["none", "causal", "packing"])
def test_favor_attention_of_huge_values(mask, dtype):
    n, d_qk = 48, 4
    g = gen(5)
    q, k = (torch.randn(2, n, d_qk, generator=g, dtype=dtype) for _ in range(2))
    w = gaussian_projection(16, d_qk, generator=g, dtype=dtype)
    op = {"none": None, "causal": CausalMask(n), "packing": PackingMask(torch.arange(n) // 7)}[mask]
    v = near_max((2, n, 3), gen(6), dtype)
    out = favor_attention(q, k, v, w, op)
    want = times_pow2(favor_attention(q, k, times_pow2(v, torch.tensor(-K[dtype])), w, op), torch.tensor(K[dtype]))
    assert torch.isfinite(out).all()
    if mask == "causal":  # the rare path takes CausalMask's exact route, the scaled call its optimistic one
        scale = float(v.abs().max())
        torch.testing.assert_close(out, want, rtol=0, atol=rounding_bound(n, 16, dtype) * scale)
    else:
        assert torch.equal(out, want)
    const = torch.full((2, n, 3), 3e38 if dtype == torch.float32 else 1.7e308, dtype=dtype)
    out = favor_attention(q, k, const, w, op)
    assert float(((out.double() - const.double()) / const.double()).abs().max()) <= rounding_bound(n, 16, dtype)


def test_ordinary_values_take_the_common_path_unchanged():
    """A value scale that does not overflow gives the plain result: homogeneous bit for bit."""
    n, m = 64, 8
    phi_q, phi_k = elu_features(n, m, torch.float32)
    v = torch.randn(n, 3, generator=gen(7))
    for mask in (None, CausalMask(n), DenseMask(torch.ones(n, n).tril())):
        out = masked_linear_attention(phi_q, phi_k, v, mask)
        assert torch.equal(masked_linear_attention(phi_q, phi_k, v * 2.0 ** 100, mask), out * 2.0 ** 100)


def test_within_values_clamps_to_each_columns_range_and_zero():
    v = torch.tensor([[[1.0, -2.0, 3.0], [2.0, -1.0, 4.0]]])  # columns: [1, 2], [-2, -1], [3, 4]
    out = torch.tensor([[[2.5, -0.5, -1.0], [0.0, -3.0, 5.0]]])
    want = torch.tensor([[[2.0, -0.5, 0.0], [0.0, -2.0, 4.0]]])  # ranges widened to hold 0 (no-key rows)
    assert torch.equal(within_values(out, v), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", ["none", "causal (attend)", "dense tril (generic)"])
def test_values_at_the_dtypes_maximum(mask, dtype):
    """v = finfo.max in every entry: the average is that value, and the round-off of the rescaled
    average (a few units in the last place above it) must not push it past the maximum."""
    n, m = 30, 8
    big = torch.finfo(dtype).max
    phi_q, phi_k = elu_features(n, m, dtype)
    v = torch.full((n, 2), big, dtype=dtype)
    v[:, 1] = -big
    g = gen(8)
    q, k = (torch.randn(n, 4, generator=g, dtype=dtype) for _ in range(2))
    w = gaussian_projection(8, 4, generator=g, dtype=dtype)
    for out in (masked_linear_attention(phi_q, phi_k, v, MASKS[mask](n)),
                favor_attention(q, k, v, w, None if mask == "none" else MASKS[mask](n))):
        assert torch.isfinite(out).all()
        assert float(((out.double() - v.double()) / v.double()).abs().max()) <= rounding_bound(n, m, dtype)
