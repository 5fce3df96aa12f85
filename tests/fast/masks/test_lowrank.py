"""fast/masks/lowrank.py: LowRankMask applies left @ right without forming it; the stochastic
RPE factors are the reference's FAVOR+ features on the same projection."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast import LowRankMask, masked_linear_attention
from reference.attention import masked_kernel_attention
from reference.masks.lowrank import low_rank_mask, sinusoidal_encodings, stochastic_rpe_factors
from tests.helpers import GenericMask, assert_unchanged, gen, np_, positive, randn, rel_frobenius

seeds = st.integers(0, 2**31 - 1)


@given(n=st.integers(1, 20), r=st.integers(1, 5), c=st.integers(1, 3),
       batch=st.sampled_from([(), (2,), (2, 3)]), seed=seeds)
def test_matmul_equals_dense_low_rank_mask(n, r, c, batch, seed):
    g = gen(seed)
    left, right = randn((n, r), g), randn((r, n), g)
    x = randn((*batch, n, c), g)
    mask = LowRankMask(left, right)
    assert mask.n == n and mask.rank == r
    dense = torch.as_tensor(low_rank_mask(np_(left), np_(right)))
    assert_unchanged(mask.matmul(x), dense @ x, rtol=1e-12)


def test_matmul_broadcasts_leading_dims():
    """Factors (B, 1, N, r) / (B, 1, r, N) with x (B, H, N, c): each sample uses its own factors."""
    g = gen(1)
    b, h, n, r = 2, 3, 7, 2
    left, right = randn((b, 1, n, r), g), randn((b, 1, r, n), g)
    x = randn((b, h, n, 4), g)
    out = LowRankMask(left, right).matmul(x)
    assert out.shape == (b, h, n, 4)
    for i in range(b):
        dense = torch.as_tensor(low_rank_mask(np_(left[i, 0]), np_(right[i, 0])))
        for j in range(h):
            assert_unchanged(out[i, j], dense @ x[i, j], rtol=1e-12)
    # unbatched factors with batched x: one mask for all
    out2 = LowRankMask(left[0, 0], right[0, 0]).matmul(x)
    assert_unchanged(out2[1, 2], torch.as_tensor(low_rank_mask(np_(left[0, 0]), np_(right[0, 0]))) @ x[1, 2], rtol=1e-12)


@given(n=st.integers(1, 16), r=st.integers(1, 8), k=st.integers(1, 4), seed=seeds)
@settings(max_examples=30)
def test_stochastic_rpe_factors_equal_the_reference(n, r, k, seed):
    enc = sinusoidal_encodings(n, k)
    w = np.random.default_rng(seed).standard_normal((r, 2 * k))
    ref_left, ref_right = stochastic_rpe_factors(enc, w)
    mask = LowRankMask.stochastic_rpe(torch.as_tensor(enc), torch.as_tensor(w))
    np.testing.assert_allclose(np_(mask.left), ref_left, rtol=1e-13)
    np.testing.assert_allclose(np_(mask.right), ref_right, rtol=1e-13)
    assert mask.nonnegative and mask.rank == r and mask.n == n
    x = randn((n, 2), gen(seed))
    assert_unchanged(mask.matmul(x), torch.as_tensor(low_rank_mask(ref_left, ref_right)) @ x, rtol=1e-12)


def test_stochastic_rpe_batched_encodings_and_float32_projection():
    enc = torch.as_tensor(np.stack([sinusoidal_encodings(6, 2), sinusoidal_encodings(6, 2, scale=0.3)]))
    w = torch.randn(5, 4, generator=gen(2))  # float32: converted to the encodings' dtype
    mask = LowRankMask.stochastic_rpe(enc, w)
    assert mask.left.shape == (2, 6, 5) and mask.right.shape == (2, 5, 6) and mask.left.dtype == torch.float64
    for i in range(2):
        ref_left, _ = stochastic_rpe_factors(np_(enc[i]), np_(w))
        np.testing.assert_allclose(np_(mask.left[i]), ref_left, rtol=1e-13)


def test_nonnegative_flag():
    ones = torch.ones(3, 2)
    assert LowRankMask(ones, ones.T).nonnegative
    neg = ones.clone()
    neg[1, 1] = -1e-30
    assert not LowRankMask(neg, ones.T).nonnegative
    assert not LowRankMask(ones, neg.T).nonnegative


@given(n=st.integers(1, 16), m=st.integers(1, 3), d=st.integers(1, 3), seed=seeds, generic=st.booleans())
@settings(max_examples=30)
def test_attention_equals_dense_masked_kernel_attention(n, m, d, seed, generic):
    g = gen(seed)
    enc = sinusoidal_encodings(n, 2)
    w = np.random.default_rng(seed).standard_normal((4, 4))
    mask = LowRankMask.stochastic_rpe(torch.as_tensor(enc), torch.as_tensor(w))
    pq, pk, v = positive((2, n, m), g), positive((2, n, m), g), randn((2, n, d), g)
    out = masked_linear_attention(pq, pk, v, GenericMask(mask) if generic else mask)
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), low_rank_mask(*stochastic_rpe_factors(enc, w)))
    assert rel_frobenius(out, expected) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_is_kept(dtype):
    g = gen(3)
    mask = LowRankMask(positive((5, 2), g), positive((2, 5), g))  # float64 factors
    x = torch.rand(5, 3, generator=g).to(dtype)
    out = mask.matmul(x)
    assert out.dtype == dtype
    assert rel_frobenius(out, mask.matmul(x.double())) <= 2 * torch.finfo(dtype).eps


@pytest.mark.parametrize("make, exc, match", [
    (lambda: LowRankMask(torch.ones(4, 2), torch.ones(3, 4)), ValueError, "do not match"),
    (lambda: LowRankMask(torch.ones(4, 2), torch.ones(2, 5)), ValueError, "do not match"),
    (lambda: LowRankMask(torch.ones(4), torch.ones(1, 4)), ValueError, "left"),
    (lambda: LowRankMask(torch.ones(4, 2, dtype=torch.int64), torch.ones(2, 4)), TypeError, "left"),
    (lambda: LowRankMask(torch.ones(4, 2), torch.full((2, 4), math.nan)), ValueError, "right"),
    (lambda: LowRankMask.stochastic_rpe(torch.ones(4, 3), torch.ones(5, 2)), ValueError, "projection"),
    (lambda: LowRankMask.stochastic_rpe(torch.full((4, 3), math.inf), torch.ones(5, 3)), ValueError, "encodings"),
    (lambda: LowRankMask(torch.ones(4, 2), torch.ones(2, 4)).matmul(torch.ones(3, 1)), ValueError, "x must have N=4"),
])
def test_bad_input_is_refused_naming_the_argument(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_abs_matmul_bounds_the_mask_entrywise():
    """abs_matmul(x) = |left| (|right| x): the product with B = |left| |right| >= |M| (contract C1)."""
    g = gen(6)
    left, right = randn((2, 7, 3), g), randn((2, 3, 7), g)
    mask = LowRankMask(left, right)
    assert not mask.nonnegative
    x = torch.rand(2, 7, 4, generator=g, dtype=torch.float64)
    b = left.abs() @ right.abs()
    assert bool((b >= (left @ right).abs()).all())
    assert_unchanged(mask.abs_matmul(x), b @ x, rtol=1e-12)
    assert mask.abs_matmul(x.float()).dtype == torch.float32


def test_nonnegative_is_read_from_the_current_factors():
    left, right = torch.ones(4, 2), torch.ones(2, 4)
    mask = LowRankMask(left, right)
    assert mask.nonnegative
    right.data[0, 0] = -1.0
    assert not mask.nonnegative


def test_cancelling_low_rank_denominator_is_refused():
    """Row 0 of M = left right is (-0.2, 0, 0.2): (M 1)_0 = 0 exactly, but the computed
    left (right 1) is 0.6 - 0.6 in floating point, round-off that does not vanish. The guard
    sees the size of the terms through abs_matmul and refuses den_0 instead of dividing by it."""
    from fast import DenominatorError

    left = torch.tensor([[1.0, -1.0], [1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    right = torch.tensor([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]], dtype=torch.float64)
    ones = torch.ones(3, 1, dtype=torch.float64)
    mask = LowRankMask(left, right)
    den0 = float(mask.matmul(ones)[0, 0])
    assert den0 != 0.0 and abs(den0) < 1e-15  # pure round-off: an exact-zero test would divide by it
    with pytest.raises(DenominatorError, match="round-off"):
        masked_linear_attention(ones, ones, randn((3, 2), gen(7)), mask)
