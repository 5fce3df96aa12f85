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
