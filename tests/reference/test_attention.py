"""reference/attention.py against the definitions written out entry by entry (Python loops)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from reference.attention import masked_kernel_attention, softmax_attention
from reference.masks.sequence import causal_mask

#: The loop and the vectorised form sum the same float64 terms in different orders.
RTOL = 1e-12


def _rng(seed=0):
    return np.random.default_rng(seed)


def _loop_masked(phi_q, phi_k, v, mask):
    n_q, n = phi_q.shape[0], phi_k.shape[0]
    out = np.zeros((n_q, v.shape[1]))
    for i in range(n_q):
        num, den = np.zeros(v.shape[1]), 0.0
        for j in range(n):
            a = mask[i, j] * float(phi_q[i] @ phi_k[j])
            num += a * v[j]
            den += a
        out[i] = num / den
    return out


def test_masked_kernel_attention_is_eq2_with_a_hadamard_mask():
    rng = _rng(1)
    n = 7
    phi_q, phi_k, v = rng.random((n, 3)) + 0.1, rng.random((n, 3)) + 0.1, rng.standard_normal((n, 2))
    mask = rng.random((n, n)) + 0.05  # a general positive mask: a matrix product would differ
    got = masked_kernel_attention(phi_q, phi_k, v, mask)
    np.testing.assert_allclose(got, _loop_masked(phi_q, phi_k, v, mask), rtol=RTOL)
    # the bug of docs/papers.md Sec. 5 (mask applied as a matrix product) gives something else
    a = phi_q @ phi_k.T
    wrong = ((a @ mask) @ v) / (a @ mask).sum(-1, keepdims=True)
    assert not np.allclose(got, wrong)


def test_masked_kernel_attention_without_mask_equals_all_ones_and_supports_batches():
    rng = _rng(2)
    phi_q, phi_k, v = rng.random((2, 3, 5, 4)) + 0.1, rng.random((2, 3, 5, 4)) + 0.1, rng.standard_normal((2, 3, 5, 2))
    got = masked_kernel_attention(phi_q, phi_k, v)
    np.testing.assert_allclose(got, masked_kernel_attention(phi_q, phi_k, v, np.ones((5, 5))), rtol=RTOL)
    for b in range(2):
        for h in range(3):
            np.testing.assert_allclose(got[b, h], _loop_masked(phi_q[b, h], phi_k[b, h], v[b, h], np.ones((5, 5))), rtol=RTOL)


def test_masked_kernel_attention_zero_row_raises():
    rng = _rng(3)
    phi = rng.random((4, 2)) + 0.1
    mask = np.ones((4, 4))
    mask[2] = 0
    with pytest.raises(reference.DenominatorError, match="query 2 sees no key"):
        masked_kernel_attention(phi, phi, rng.standard_normal((4, 2)), mask)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_is_def_2_1(causal):
    rng = _rng(4)
    n, d = 6, 4
    q, k, v = rng.standard_normal((n, d)) * 3, rng.standard_normal((n, d)) * 3, rng.standard_normal((n, 2))
    logits_mask = np.where(causal_mask(n) > 0, 0.0, -np.inf) if causal else None
    got = softmax_attention(q, k, v, logits_mask)
    expected = np.zeros((n, 2))
    for i in range(n):
        js = range(i + 1) if causal else range(n)
        w = np.array([np.exp(q[i] @ k[j] / np.sqrt(d)) for j in js])
        expected[i] = sum(wj * v[j] for wj, j in zip(w, js)) / w.sum()
    np.testing.assert_allclose(got, expected, rtol=RTOL)


def test_softmax_attention_is_stable_for_large_logits():
    """The row-max shift keeps exp finite where a naive exp(1000) would overflow."""
    q = np.array([[100.0, 0.0], [0.0, 100.0]])
    v = np.array([[1.0], [2.0]])
    out = softmax_attention(q, q, v)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, v, rtol=RTOL)  # each row's own key dominates by exp(-5000)


def test_reference_package_exports():
    assert reference.masked_kernel_attention is masked_kernel_attention
    assert reference.softmax_attention is softmax_attention


# --------------------------------------------------------------------- rows that see no key (C3)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), blind_bits=st.integers(0, 63), seed=st.integers(0, 2**16), batch=st.booleans())
def test_no_key_zero_gives_exact_zeros_and_leaves_other_rows_alone(n, blind_bits, seed, batch):
    """no_key="zero": rows whose mask is all zero (kernel) or all -inf (softmax) are exactly 0; every
    other row equals the definition computed entry by entry. The default raises for the same input."""
    rng = _rng(seed)
    blind = np.array([(blind_bits >> i) & 1 for i in range(n)], dtype=bool)
    mask = rng.random((n, n)) + 0.05
    mask[blind] = 0.0
    phi_q, phi_k = rng.random((n, 3)) + 0.1, rng.random((n, 3)) + 0.1
    q, k, v = rng.standard_normal((n, 3)), rng.standard_normal((n, 3)), rng.standard_normal((n, 2))
    logits_mask = np.where(mask > 0, np.log(np.where(mask > 0, mask, 1.0)), -np.inf)
    if batch:  # the blind rows only in the second sample
        mask, logits_mask = np.stack([np.ones((n, n)), mask]), np.stack([np.zeros((n, n)), logits_mask])
    kernel = masked_kernel_attention(phi_q, phi_k, v, mask, no_key="zero")
    soft = softmax_attention(q, k, v, logits_mask, no_key="zero")
    for out in (kernel, soft):
        last = out[-1] if batch else out
        assert (last[blind] == 0.0).all() and not np.signbit(last[blind]).any()
        assert np.isfinite(out).all()
    for i in np.flatnonzero(~blind):
        m = mask[-1] if batch else mask
        a = m[i] * (phi_k @ phi_q[i])
        np.testing.assert_allclose((kernel[-1] if batch else kernel)[i], a @ v / a.sum(), rtol=RTOL)
        w = m[i] * np.exp(k @ q[i] / np.sqrt(3))  # exp(log M + s) = M exp(s)
        np.testing.assert_allclose((soft[-1] if batch else soft)[i], w @ v / w.sum(), rtol=1e-10)
    if batch:  # the first sample sees every key: the plain definitions
        np.testing.assert_allclose(kernel[0], masked_kernel_attention(phi_q, phi_k, v), rtol=RTOL)
        np.testing.assert_allclose(soft[0], softmax_attention(q, k, v), rtol=RTOL)
    if blind.any():
        for call in (lambda: masked_kernel_attention(phi_q, phi_k, v, mask),
                     lambda: softmax_attention(q, k, v, logits_mask, no_key="raise")):
            with pytest.raises(reference.DenominatorError, match='sees no key.*no_key="zero"'):
                call()
    else:  # nothing blind: both policies give the same, bit for bit
        assert np.array_equal(kernel, masked_kernel_attention(phi_q, phi_k, v, mask))
        assert np.array_equal(soft, softmax_attention(q, k, v, logits_mask))


def test_no_key_zero_ignores_non_finite_values_of_unseen_keys():
    """A blind row's output is exactly 0 even where v holds inf (0 * inf would be NaN). (A row that
    sees other keys gets 0 * inf = NaN from such a key, as the definition's sum says.)"""
    v = np.array([[np.inf], [1.0]])
    mask = np.array([[0.0, 0.0], [1.0, 1.0]])
    with np.errstate(invalid="ignore"):
        out = masked_kernel_attention(np.ones((2, 1)), np.ones((2, 1)), v, mask, no_key="zero")
        soft = softmax_attention(np.ones((2, 1)), np.ones((2, 1)), v, np.where(mask > 0, 0.0, -np.inf), no_key="zero")
    assert out[0, 0] == 0.0 and soft[0, 0] == 0.0
    assert out[1, 0] == np.inf and soft[1, 0] == np.inf


def test_broadcast_masks_flag_blind_rows_per_query():
    """A (N_q, 1) mask or logits_mask broadcasts over keys: a zero (-inf) entry blinds that query."""
    rng = _rng(5)
    phi, v = rng.random((3, 2)) + 0.1, rng.standard_normal((3, 2))
    col = np.array([[1.0], [0.0], [2.0]])
    out = masked_kernel_attention(phi, phi, v, col, no_key="zero")
    assert (out[1] == 0).all()
    np.testing.assert_allclose(out[[0, 2]], masked_kernel_attention(phi, phi, v)[[0, 2]], rtol=RTOL)
    with pytest.raises(reference.DenominatorError, match="query 1 sees no key"):
        softmax_attention(phi, phi, v, np.where(col > 0, 0.0, -np.inf))


def test_a_row_that_sees_keys_but_sums_to_zero_still_raises_under_no_key_zero():
    """phi_q_i = 0 with a full mask row: not a no-key row, so no_key="zero" does not hide it."""
    rng = _rng(6)
    phi_q, phi_k = rng.random((3, 2)) + 0.1, rng.random((3, 2)) + 0.1
    phi_q[1] = 0.0
    for no_key in ("raise", "zero"):
        with pytest.raises(reference.DenominatorError, match="see keys but their masked kernel sums to exactly 0"):
            masked_kernel_attention(phi_q, phi_k, rng.standard_normal((3, 2)), no_key=no_key)
    signed = np.array([[1.0, -1.0]])  # phi_q . phi_k_j: +1 and -1 cancel exactly
    with pytest.raises(reference.DenominatorError, match="signed terms cancel"):
        masked_kernel_attention(np.ones((1, 1)), np.array([[1.0], [-1.0]]), np.ones((2, 1)),
                                np.abs(signed), no_key="zero")


def test_denominator_error_is_an_arithmetic_error_not_a_zero_division():
    assert issubclass(reference.DenominatorError, ArithmeticError)
    assert not issubclass(reference.DenominatorError, ZeroDivisionError)
    from reference.errors import DenominatorError
    assert DenominatorError is reference.DenominatorError
