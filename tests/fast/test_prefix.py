"""fast.prefix.running_max: both routes equal torch.cummax's values bit for bit (maxima are exact),
on every length around the doubling steps' powers of two, along any axis, with ties, infinities
and NaN (which spreads forward in both)."""
from __future__ import annotations

import math

import pytest
import torch

from fast.prefix import running_max


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 31, 32, 33, 1000, 4096, 4097])
@pytest.mark.parametrize("method", ["doubling", "cummax", None])
def test_equals_cummax_values(n, method):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, 2, n, generator=g)
    x[0, 0, n // 2:] = x[0, 0, n // 2]  # ties
    assert torch.equal(running_max(x, method=method), torch.cummax(x, dim=-1).values)


@pytest.mark.parametrize("method", ["doubling", "cummax"])
def test_other_axis_and_non_finite_entries(method):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    x[5, 0], x[7, 1], x[9, 2] = math.inf, -math.inf, math.nan
    got, want = running_max(x, dim=0, method=method), torch.cummax(x, dim=0).values
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert got.shape == x.shape and got.dtype == x.dtype and bool(got[9:, 2].isnan().all())


def test_names_bad_arguments():
    with pytest.raises(ValueError, match="^x must be a tensor"):
        running_max(torch.tensor(1.0))
    with pytest.raises(ValueError, match="^method must be"):
        running_max(torch.ones(3), method="scan")
