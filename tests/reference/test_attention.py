"""reference/attention.py against the definitions written out entry by entry (Python loops)."""
from __future__ import annotations

import numpy as np
import pytest

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
    with pytest.raises(ZeroDivisionError, match="sums to 0"):
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
