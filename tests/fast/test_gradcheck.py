"""Gradients of the fast ops users train (torch.autograd.gradcheck, float64, small N).

gradcheck compares analytic gradients with central finite differences (eps 1e-6); its default
tolerances (atol 1e-5, rtol 1e-3) are the finite-difference truncation and round-off error for
float64 functions of O(1) size, not tuned here.
"""
from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import fast
from fast import CausalMask, PackingMask, PaddingMask, favor_attention, masked_linear_attention
from tests.helpers import GenericMask, gen, positive, randn, unit_rows

MASKS = {
    "none": lambda n: None,
    "causal-chunked": lambda n: CausalMask(n, chunk=3),  # chunk < N: several chunks and a ragged last one
    "causal-generic": lambda n: GenericMask(CausalMask(n, chunk=3)),
    "packing": lambda n: PackingMask(torch.tensor([4, 4, -1, -1, -1, 9, 4, 9, 9][:n])),
    "padding": lambda n: PaddingMask(torch.arange(n) < n - 2),
}


@pytest.mark.parametrize("kind", list(MASKS))
@pytest.mark.parametrize("n", [5, 8])
def test_gradcheck_masked_linear_attention(kind, n):
    g = gen(n)
    # positive features, far enough from 0 that finite differences keep them positive
    pq = positive((2, n, 3), g).requires_grad_()
    pk = positive((2, n, 3), g).requires_grad_()
    v = randn((2, n, 2), g).requires_grad_()
    mask = MASKS[kind](n)
    assert gradcheck(lambda a, b, c: masked_linear_attention(a, b, c, mask, block_cols=2), (pq, pk, v))


@pytest.mark.parametrize("kind", ["none", "causal-chunked", "packing", "padding"])
def test_gradcheck_favor_attention(kind):
    n = 7
    g = gen(20)
    q = unit_rows((2, n, 4), g).requires_grad_()
    k = unit_rows((2, n, 4), g).requires_grad_()
    v = randn((2, n, 3), g).requires_grad_()
    w = fast.gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    mask = MASKS[kind](n)
    # the detached stabiliser constants cancel in the output, so the gradient is exact
    assert gradcheck(lambda a, b, c: favor_attention(a, b, c, w, mask), (q, k, v))


def test_gradgradcheck_causal():
    g = gen(21)
    n = 6
    pq, pk = positive((n, 2), g).requires_grad_(), positive((n, 2), g).requires_grad_()
    v = randn((n, 2), g).requires_grad_()
    mask = CausalMask(n, chunk=4)
    assert gradgradcheck(lambda a, b, c: masked_linear_attention(a, b, c, mask), (pq, pk, v))


def test_gradcheck_feature_maps():
    g = gen(22)
    x = randn((2, 5, 3), g, scale=0.5).requires_grad_()
    w = fast.gaussian_projection(4, 3, generator=g, dtype=torch.float64)
    for fmap in (fast.FavorPlus(w, stabilize=False), fast.Hyperbolic(w, stabilize=False), fast.TrigRFF(w),
                 fast.EluPlusOne()):
        assert gradcheck(lambda a: fmap(a), (x,))


def test_gradcheck_detects_a_wrong_backward():
    """Power check: gradcheck here is not vacuous; a function with a planted wrong gradient fails."""

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, grad):
            return grad  # should be 2 x grad

    x = randn((4,), gen(0)).requires_grad_()
    assert not gradcheck(Wrong.apply, (x,), raise_exception=False)
