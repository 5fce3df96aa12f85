"""The denominator guard of fast/ (fast.algebra.divide, fast.attention's floor) and the no-key policy.

den_i = phi_q_i . sum_j M_ij phi_k_j is refused (DenominatorError) where it is not finite, zero or
subnormal, or within round-off of zero relative to the terms it sums; rows that see no key follow
``no_key`` ("raise" or "zero"). The cancellation cases are built on purpose: keys 0.1, 0.2, -0.3 sum
to 5.55e-17 in float64 (not 0), so the exact-zero test alone divides by round-off and returns
outputs of ~1e16 (what the code did before the relative floor).
"""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fast
from fast import (CausalMask, DenominatorError, DenseMask, LowRankMask, PackingMask, PaddingMask, favor_attention,
                  masked_linear_attention, softmax_attention)
from fast.operator import MaskOperator
from tests.helpers import gen, positive, randn

#: float64 keys whose sum cancels to round-off: 0.1 + 0.2 - 0.3 = 5.55e-17, not 0.
CANCELLING = (0.1, 0.2, -0.3)


def _cancelling_keys(m: int, extra: int = 0, g: torch.Generator | None = None) -> torch.Tensor:
    """phi_k (3 + extra, m): the first three rows cancel feature by feature (sum 5.55e-17, not 0)."""
    rows = torch.tensor(CANCELLING, dtype=torch.float64)[:, None].expand(3, m).clone()
    if extra:
        rows = torch.cat([rows, randn((extra, m), g if g is not None else gen(0))])
    return rows


def _assert_round_off_case(num: torch.Tensor, den: torch.Tensor) -> None:
    """Power: the denominator is not 0 (the old exact-zero test passes it) but round-off, and dividing
    by it gives an output of ~1e15 or more."""
    assert bool((den != 0).all()) and float(den.abs().max()) < 1e-14
    assert float((num / den.unsqueeze(-1)).abs().max()) > 1e14


# ------------------------------------------------------------------ cancellation to round-off


def test_signed_features_unmasked_cancelling_denominator_is_refused():
    """Identity features, no mask: sum_j phi_k_j = 5.55e-17 per feature."""
    n, m = 3, 4
    phi_k = _cancelling_keys(m)
    phi_q, v = torch.ones(2, m, dtype=torch.float64), randn((n, 2), gen(1))
    _assert_round_off_case(phi_q @ (phi_k.T @ v), phi_q @ phi_k.sum(0))
    with pytest.raises(DenominatorError, match="round-off of zero"):
        masked_linear_attention(phi_q, phi_k, v)
    with pytest.raises(DenominatorError, match="round-off"):
        fast.linear_attention(phi_q, phi_k, v)


@pytest.mark.parametrize("generic", [False, True])
def test_padding_with_signed_features_cancelling_over_real_keys_is_refused(generic):
    """Identity features with padding (attend path, and the generic path through a DenseMask twin):
    (M phi_k)_i = sum over the real keys = 5.55e-17 for every query; the padded keys are large."""
    n, m = 6, 4
    g = gen(2)
    x = _cancelling_keys(m, extra=3, g=g) * torch.tensor([1.0] * 3 + [50.0] * 3, dtype=torch.float64)[:, None]
    key_mask = torch.arange(n) < 3
    v = randn((n, 2), g)
    phi = fast.Identity()(torch.ones(n, m, dtype=torch.float64))
    den = phi @ x[:3].sum(0)
    _assert_round_off_case(phi @ (x[:3].T @ v[:3]), den)
    mask = DenseMask(key_mask.to(torch.float64).expand(n, n)) if generic else PaddingMask(key_mask)
    with pytest.raises(DenominatorError, match="round-off of zero"):
        masked_linear_attention(phi, fast.Identity()(x), v, mask)


def test_nonnegative_low_rank_mask_with_signed_features_is_refused():
    """LowRankMask with positive factors (M = 1 1^T, nonnegative) and Identity features that cancel."""
    n, m = 3, 4
    mask = LowRankMask(torch.ones(n, 1, dtype=torch.float64), torch.ones(1, n, dtype=torch.float64))
    assert mask.nonnegative
    phi_k, phi_q, v = _cancelling_keys(m), torch.ones(n, m, dtype=torch.float64), randn((n, 2), gen(3))
    with pytest.raises(DenominatorError, match="round-off of zero"):
        masked_linear_attention(phi_q, phi_k, v, mask)


@pytest.mark.xfail(getattr(LowRankMask, "abs_matmul", None) is None, strict=True,
                   reason="needs LowRankMask.abs_matmul (|A| (|B|^T x), C1): without it the guard only sees "
                          "|(M phi_k)_i|, which has cancelled already")
def test_signed_low_rank_mask_with_positive_features_is_refused():
    """M = a b^T with b = (0.1, 0.2, -0.3): every row of M sums to 5.55e-17; positive features."""
    n, m = 3, 4
    left = torch.ones(n, 1, dtype=torch.float64)
    right = torch.tensor([CANCELLING], dtype=torch.float64)
    mask = LowRankMask(left, right)
    assert not mask.nonnegative
    phi = torch.ones(n, m, dtype=torch.float64)
    with pytest.raises(DenominatorError, match="round-off of zero"):
        masked_linear_attention(phi, phi, randn((n, 2), gen(4)), mask)


def test_signed_dense_mask_with_positive_features_is_refused():
    """A signed DenseMask whose rows cancel (generic path): its abs_matmul gives the scale of the terms."""
    n, m = 3, 2
    matrix = torch.tensor([CANCELLING] * n, dtype=torch.float64)
    mask = DenseMask(matrix)
    assert not mask.nonnegative
    phi, v = torch.ones(n, m, dtype=torch.float64), randn((n, 2), gen(5))
    _assert_round_off_case(m * (matrix @ v), m * matrix.sum(-1))  # num and den of ones-features
    with pytest.raises(DenominatorError, match="round-off of zero"):
        masked_linear_attention(phi, phi, v, mask)
    with pytest.raises(DenominatorError, match="round-off of zero"):  # the same mask as a NumPy array
        masked_linear_attention(phi, phi, v, matrix.numpy())


def test_relative_floor_does_not_refuse_a_small_but_accurate_signed_denominator():
    """Power for the floor: signed features whose denominator is small only because every term is
    (scaled by 2^-500, exact) pass; the floor is relative to the terms, not absolute."""
    g = gen(6)
    phi_q, phi_k, v = randn((5, 4), g), randn((5, 4), g).abs() + 0.5, randn((5, 2), g)
    phi_q = phi_q.abs() * torch.tensor([1.0, 1.0, 1.0, -0.1], dtype=torch.float64)  # signed, no cancellation
    out = masked_linear_attention(phi_q, phi_k, v)
    scaled = masked_linear_attention(phi_q * 2.0**-500, phi_k * 2.0**-500, v)
    assert torch.equal(out, scaled)


# ------------------------------------------------------------------------ subnormal and zero


@pytest.mark.parametrize("dtype, scale", [(torch.float32, 1e-20), (torch.float64, 1e-160)])
def test_subnormal_denominator_is_refused(dtype, scale):
    """Positive features whose products are subnormal (below finfo.tiny): not 0, so the old exact-zero
    test divided by a number with a few significant bits."""
    g = gen(7)
    phi_q, phi_k, v = positive((4, 3), g, dtype), positive((4, 3), g, dtype), randn((4, 2), g, dtype)
    phi_q = phi_q * scale
    phi_k = phi_k * scale
    den = (phi_q @ phi_k.sum(0).unsqueeze(-1)).squeeze(-1)
    assert bool((den > 0).all()) and bool((den < torch.finfo(dtype).tiny).all())
    with pytest.raises(DenominatorError, match="subnormal"):
        masked_linear_attention(phi_q, phi_k, v)
    with pytest.raises(DenominatorError, match="subnormal"):
        masked_linear_attention(phi_q, phi_k, v, CausalMask(4, chunk=2))


def test_just_above_the_normal_range_is_accepted():
    """Power for the subnormal test: the same features scaled so den is just above finfo.tiny pass."""
    g = gen(8)
    phi_q, phi_k, v = positive((4, 3), g, torch.float32), positive((4, 3), g, torch.float32), randn((4, 2), g, torch.float32)
    out = masked_linear_attention(phi_q, phi_k, v)
    small = masked_linear_attention(phi_q * 2.0**-60, phi_k * 2.0**-60, v)  # den ~ 2^-120 * O(1) > 2^-126
    assert torch.equal(out, small)


def test_non_finite_denominator_is_refused_with_its_case():
    g = gen(9)
    phi_q, phi_k, v = positive((4, 3), g, torch.float32), positive((4, 3), g, torch.float32), randn((4, 2), g, torch.float32)
    with pytest.raises(DenominatorError, match="not finite"):
        masked_linear_attention(phi_q * 1e30, phi_k * 1e30, v)


# ------------------------------------------------------------ positive inputs are never refused


MASKS = {
    "none": lambda n: None,
    "padding": lambda n: PaddingMask(torch.arange(n) < n - 20),
    "packing": lambda n: PackingMask(torch.arange(n) // 50),
    "causal": lambda n: CausalMask(n),
}


@pytest.mark.parametrize("kind", sorted(MASKS))
@pytest.mark.parametrize("std", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_favor_attention_float32_realistic_magnitudes_are_never_refused(kind, std):
    """q, k entries of std 0.5 to 8 at d = m = 64 (the issue's range; attention logits of std up to
    64): no DenominatorError, and every row within 1e-3 relative of the float64 result."""
    n, d, m = 128, 64, 64
    for seed in range(2):
        g = gen(100 + seed)
        q, k = randn((2, n, d), g, scale=std), randn((2, n, d), g, scale=std)
        v = randn((2, n, 8), g)
        w = fast.gaussian_projection(m, d, generator=g, dtype=torch.float64)
        mask = MASKS[kind](n)
        exact = favor_attention(q, k, v, w, mask)
        got = favor_attention(q.float(), k.float(), v.float(), w.float(), mask)
        rows = (got.double() - exact).norm(dim=-1) / exact.norm(dim=-1)
        real = slice(0, n - 20) if kind == "padding" else slice(None)
        assert float(rows[:, real].max()) <= 1e-3


@settings(max_examples=20, deadline=None)
@given(exponent=st.integers(-60, 60), seed=st.integers(0, 2**31 - 1), causal=st.booleans())
def test_positive_features_rescaled_by_powers_of_two_are_never_refused(exponent, seed, causal):
    """float32 positive features times 2^e (|e| <= 60, den stays normal): the same output bit for
    bit; a guard with an absolute threshold or one relative to the batch would trip."""
    g = gen(seed)
    phi_q, phi_k = positive((2, 9, 4), g, torch.float32), positive((2, 9, 4), g, torch.float32)
    v = randn((2, 9, 3), g, torch.float32)
    mask = CausalMask(9, chunk=4) if causal else None
    base = masked_linear_attention(phi_q, phi_k, v, mask)
    scaled = masked_linear_attention(phi_q * 2.0**exponent, phi_k * 2.0**exponent, v, mask)
    assert torch.equal(base, scaled)


# ------------------------------------------------------------------- what the guard costs


class CountingMask(MaskOperator):
    """A dense mask that counts its products; ``nonnegative`` as given."""

    def __init__(self, matrix: torch.Tensor, nonnegative: bool):
        self.n, self.matrix, self.nonnegative, self.calls = matrix.shape[-1], matrix, nonnegative, 0

    def _matmat(self, x):
        self.calls += 1
        return self.matrix @ x


def test_nonnegative_mask_and_features_cost_no_extra_mask_product():
    """With M >= 0 and phi >= 0 the guard adds no product (and no-key detection does not run while
    every denominator passes); a mask of unknown sign costs one more (its terms' scale)."""
    g = gen(10)
    n = 7
    matrix = (torch.rand(n, n, generator=g, dtype=torch.float64) < 0.5).double() + torch.eye(n, dtype=torch.float64)
    phi_q, phi_k, v = positive((n, 4), g), positive((n, 4), g), randn((n, 2), g)
    known, unknown = CountingMask(matrix, True), CountingMask(matrix, False)
    with torch.no_grad():
        a = masked_linear_attention(phi_q, phi_k, v, known, block_cols=2)
        b = masked_linear_attention(phi_q, phi_k, v, unknown, block_cols=2)
    assert torch.equal(a, b)
    assert known.calls == 1 + 4  # den, then one block per feature (block_cols = d = 2: one feature a block)
    assert unknown.calls == known.calls + 1


# ------------------------------------------------------------------------------- no key


def _favor_inputs(lead=(), n=8, dtype=torch.float64, seed=11):
    g = gen(seed)
    q, k, v = randn((*lead, n, 4), g, dtype), randn((*lead, n, 4), g, dtype), randn((*lead, n, 3), g, dtype)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=dtype)
    return q, k, v, w


@pytest.mark.parametrize("generic", [False, True])
def test_fully_padded_sample_raises_naming_no_key(generic):
    """favor_attention(q, k, v, w, PaddingMask(zeros(8, bool))): the documented DenominatorError
    (it returned zeros before), saying the queries see no key and naming no_key="zero"."""
    q, k, v, w = _favor_inputs()
    mask = PaddingMask(torch.zeros(8, dtype=torch.bool))
    mask = DenseMask(torch.zeros(8, 8)) if generic else mask
    with pytest.raises(DenominatorError, match=r'8 of 8 queries see no key.*no_key="zero"'):
        favor_attention(q, k, v, w, mask)
    with pytest.raises(DenominatorError, match="no_key"):
        masked_linear_attention(q.exp(), k.exp(), v, mask)


def test_fully_padded_sample_with_no_key_zero_gives_zeros_and_zero_gradients():
    """A batch of two samples, the second fully padded: no_key="zero" gives it exactly 0 with finite
    zero gradients, and leaves the first sample as it is alone."""
    q, k, v, w = _favor_inputs((2,))
    key_mask = torch.ones(2, 8, dtype=torch.bool)
    key_mask[0, 5:] = False
    key_mask[1] = False
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = favor_attention(q, k, v, w, PaddingMask(key_mask), no_key="zero")
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    alone = favor_attention(q[:1], k[:1], v[:1], w, PaddingMask(key_mask[:1]))
    torch.testing.assert_close(out[:1], alone, rtol=1e-12, atol=0)
    (out * torch.arange(1.0, 4.0, dtype=out.dtype)).sum().backward()
    for t in (q, k, v):
        assert bool(torch.isfinite(t.grad).all())
        assert torch.equal(t.grad[1], torch.zeros_like(t.grad[1]))
    assert float(q.grad[0].abs().sum()) > 0  # power: the real sample does get gradients


@pytest.mark.parametrize("signed", [False, True])
def test_dense_mask_with_a_zero_row(signed):
    """Row 2 of a DenseMask is all zero (the mask nonnegative, or signed elsewhere: abs_matmul finds
    the row): "raise" names no_key; "zero" gives that row exactly 0 and the others their value."""
    g = gen(12)
    n = 6
    matrix = torch.rand(n, n, generator=g, dtype=torch.float64) + 0.5
    if signed:
        matrix[0, 1] = -0.2
    matrix[2] = 0.0
    phi_q, phi_k, v = positive((n, 4), g), positive((n, 4), g), randn((n, 3), g)
    with pytest.raises(DenominatorError, match=r'1 of 6 queries see no key.*no_key="zero"'):
        masked_linear_attention(phi_q, phi_k, v, matrix)
    phi_q, phi_k, v = (t.clone().requires_grad_() for t in (phi_q, phi_k, v))
    out = masked_linear_attention(phi_q, phi_k, v, matrix, no_key="zero")
    assert torch.equal(out[2], torch.zeros(3, dtype=torch.float64))
    a = (phi_q @ phi_k.T) * matrix
    expected = (a @ v) / a.sum(-1, keepdim=True)
    others = [0, 1, 3, 4, 5]
    torch.testing.assert_close(out[others], expected[others], rtol=1e-12, atol=0)
    out.sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (phi_q, phi_k, v))
    assert torch.equal(phi_q.grad[2], torch.zeros(4, dtype=torch.float64))


def test_no_key_zero_still_refuses_other_failing_rows():
    """"zero" is for rows that see no key only: a row that sees keys but whose features vanish still
    raises (and the message is the guard's, not the no-key one)."""
    g = gen(13)
    n = 5
    matrix = torch.ones(n, n, dtype=torch.float64)
    matrix[1] = 0.0
    phi_q, phi_k, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)
    phi_q[3] = 0.0  # sees keys, but its features are zero
    with pytest.raises(DenominatorError, match="1 zero or subnormal"):
        masked_linear_attention(phi_q, phi_k, v, matrix, no_key="zero")


def test_softmax_row_with_all_logits_masked():
    """A logits_mask row of all -inf: "raise" (default) names no_key; "zero" gives exact zeros with
    finite zero gradients, and the other rows are unchanged."""
    g = gen(14)
    q, k, v = randn((2, 5, 4), g), randn((2, 5, 4), g), randn((2, 5, 3), g)
    logits = torch.zeros(5, 5, dtype=torch.float64)
    logits[1] = -torch.inf
    logits[3, :2] = -torch.inf
    with pytest.raises(DenominatorError, match=r'2 of 10 queries see no key.*no_key="zero"'):
        softmax_attention(q, k, v, logits)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = softmax_attention(q, k, v, logits, no_key="zero")
    assert torch.equal(out[:, 1], torch.zeros(2, 3, dtype=torch.float64))
    others = [0, 2, 3, 4]
    expected = softmax_attention(q[:, others], k, v, logits[others])
    torch.testing.assert_close(out[:, others], expected, rtol=1e-12, atol=0)
    out.sum().backward()
    for t in (q, k, v):
        assert bool(torch.isfinite(t.grad).all())
    assert torch.equal(q.grad[:, 1], torch.zeros(2, 4, dtype=torch.float64))


@pytest.mark.parametrize("value", ["ignore", "Raise", "", None, 0, "nan"])
def test_bad_no_key_is_a_value_error_naming_no_key(value):
    g = gen(15)
    phi_q, phi_k, v = positive((4, 3), g), positive((4, 3), g), randn((4, 2), g)
    q, k = randn((4, 3), g), randn((4, 3), g)
    w = fast.gaussian_projection(4, 3, generator=g, dtype=torch.float64)
    calls = [lambda: masked_linear_attention(phi_q, phi_k, v, CausalMask(4), no_key=value),
             lambda: masked_linear_attention(phi_q, phi_k, v, no_key=value),
             lambda: favor_attention(q, k, v, w, CausalMask(4), no_key=value),
             lambda: softmax_attention(q, k, v, no_key=value)]
    for call in calls:
        with pytest.raises(ValueError, match=r'no_key must be "raise" or "zero".*got'):
            call()


def test_no_key_zero_is_a_no_op_when_every_query_sees_a_key():
    q, k, v, w = _favor_inputs((2,))
    mask = PaddingMask(torch.arange(8) < 6)
    assert torch.equal(favor_attention(q, k, v, w, mask, no_key="zero"), favor_attention(q, k, v, w, mask))
    logits = torch.zeros(8, 8, dtype=torch.float64)
    assert torch.equal(softmax_attention(q, k, v, logits, no_key="zero"), softmax_attention(q, k, v, logits))
