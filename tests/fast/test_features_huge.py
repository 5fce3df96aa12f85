"""fast.features at huge keys (issue 24): the stabilised FAVOR+ exponentials stay <= 1, with the
largest exactly 1, where the norm term n = |x|^2 / 2 is finite but its rounding (ulp(n) far above 1)
exceeds every feature's range. Before the fix, p - (n + c) with n + c rounded gave inf features at
|x| ~ 1e10 in float32 and float64 alike."""
from __future__ import annotations

import math

import pytest
import torch

import fast
from fast.features import favor_exponentials
from fast.operator import default_key_stabilizer
from tests.helpers import gen

#: |x| of the keys: n = |x|^2 / 2 finite (float32 up to ~1e19), with ulp(n) >> 1 (n + c inexact)
HUGE = {torch.float32: [1e10, 1e15, 1e18], torch.float64: [1e10, 1e50, 1e150]}
CASES = [(dt, s) for dt, scales in HUGE.items() for s in scales]


def _keys(dtype: torch.dtype, scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    w = fast.gaussian_projection(16, 8, generator=g, dtype=dtype)
    # two slices: one of huge keys, one of ordinary keys (each slice has its own constant)
    x = torch.randn(2, 3, 24, 8, generator=g, dtype=dtype)
    x[0] *= scale
    return x, w


@pytest.mark.parametrize("dtype, scale", CASES)
def test_stabilised_key_features_stay_at_most_one(dtype, scale):
    x, w = _keys(dtype, scale)
    phi = fast.FavorPlus(w)(x)  # stabilised keys: one constant per (batch, head) slice
    root = math.sqrt(w.shape[0])
    assert torch.isfinite(phi).all()
    assert float(phi.max()) <= 1.0 / root
    # the largest exponential of each slice is exp(0) = 1 exactly: its exponent is its own constant
    top = fast.FavorPlus(w).exponentials(x).amax(dim=(-2, -1))
    assert torch.equal(top, torch.ones_like(top))


@pytest.mark.parametrize("dtype, scale", CASES)
def test_per_key_constants_from_row_maxima_stay_at_most_one(dtype, scale):
    """A mask's row_stabilizer (each key its own constant, as padding's visible keys may have): every
    key's largest exponential is exactly 1."""
    x, w = _keys(dtype, scale)
    phi, c, _ = favor_exponentials(x, w, 0.5, is_query=False, row_stabilizer=lambda rows: rows)
    top = phi.amax(-1)
    assert c.shape == (*x.shape[:-1], 1)
    assert torch.equal(top, torch.ones_like(top))


@pytest.mark.parametrize("dtype, scale", CASES)
def test_key_stabilizer_route_stays_at_most_one(dtype, scale):
    x, w = _keys(dtype, scale)
    phi = fast.FavorPlus(w).exponentials(x, key_stabilizer=default_key_stabilizer)
    assert torch.isfinite(phi).all() and float(phi.max()) <= 1.0


@pytest.mark.parametrize("dtype, scale", CASES)
def test_unstabilised_huge_keys_underflow_to_zero(dtype, scale):
    """exp(w.x - |x|^2/2) with |x| >= 1e10 and |w| ~ 4: below the smallest subnormal, so 0."""
    x, w = _keys(dtype, scale)
    phi = fast.FavorPlus(w, stabilize=False)(x)
    assert torch.isfinite(phi).all()
    assert torch.equal(phi[0], torch.zeros_like(phi[0]))


@pytest.mark.parametrize("dtype, scale", CASES)
def test_ordinary_slice_is_unaffected_by_a_huge_one(dtype, scale):
    x, w = _keys(dtype, scale)
    fmap = fast.FavorPlus(w)
    assert torch.equal(fmap(x)[1], fmap(x[1]))


# ------------------------------------------------------------------------------ |x|^2 / 2 overflowing


def _equal_norm_keys(dtype: torch.dtype, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (2, 24, 8) whose rows all have one norm (signed permutations of one vector of small integers,
    times a power of two, so every norm is the same floating-point number) and a projection: with
    equal norms n_j = n the exact stabilised features are exp(p - max p) per slice, whatever n is,
    so they are known without forming n."""
    g = gen(3)
    w = fast.gaussian_projection(16, 8, generator=g, dtype=dtype)
    base = torch.arange(1, 9, dtype=dtype)
    rows = [base[torch.randperm(8, generator=g)] * torch.where(torch.rand(8, generator=g) < 0.5, -1.0, 1.0).to(dtype)
            for _ in range(48)]
    return torch.stack(rows).reshape(2, 24, 8) * scale, w


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 2.0**66), (torch.float32, 2.0**100), (torch.float64, 2.0**520)])
def test_overflowed_norm_term_gives_the_exact_features(dtype, scale):
    """|x|^2 / 2 beyond the dtype's maximum for EVERY key (float32 |x| >~ 1.8e19): the stabilised
    features are still exact and finite (before: (p - inf) - (-inf) = NaN everywhere)."""
    x, w = _equal_norm_keys(dtype, scale)
    assert not torch.isfinite(0.5 * (x * x).sum(-1)).any()  # the norm term overflows for all keys
    p = x @ w.T
    keys = fast.FavorPlus(w).exponentials(x)
    want_k = torch.exp(p - p.amax(dim=(-2, -1), keepdim=True))
    torch.testing.assert_close(keys, want_k, rtol=0, atol=0)
    queries = fast.FavorPlus(w).exponentials(x, is_query=True)
    torch.testing.assert_close(queries, torch.exp(p - p.amax(-1, keepdim=True)), rtol=0, atol=0)
    torch.testing.assert_close(fast.FavorPlus(w)(x), want_k / 4.0, rtol=0, atol=0)  # m = 16: 1 / sqrt(m)


def test_overflowed_norm_term_with_a_key_stabilizer_and_its_gradient():
    x, w = _equal_norm_keys(torch.float32, 2.0**66)
    x = x.clone().requires_grad_(True)
    phi = fast.FavorPlus(w).exponentials(x, key_stabilizer=default_key_stabilizer)
    p = (x @ w.T).detach()
    torch.testing.assert_close(phi.detach(), torch.exp(p - p.amax(dim=(-2, -1), keepdim=True)), rtol=0, atol=0)
    q = fast.FavorPlus(w).exponentials(x, is_query=True)
    (gk,) = torch.autograd.grad(phi.sum() + q.sum(), x)
    assert torch.isfinite(gk).all()


def test_keys_whose_every_norm_overflows_are_refused_naming_x():
    x, w = _equal_norm_keys(torch.float32, 2.0**125)  # |x| = 14.3 * 2^125 beyond float32's maximum
    with pytest.raises(ValueError, match="x"):
        fast.FavorPlus(w)(x)
