"""Edges of the lean hot path (issue 11): what the drivers and EluPlusOne save for backward must
not be the tensors they return (a caller may modify an output in place), the compiled ELU+1 must
not differentiate an overflowing branch, an empty batch still computes, a CausalMask subclass's
own attend is called, and a broken features_nonnegative promise cannot switch a signed mask's
guard off."""
from __future__ import annotations

import pytest
import torch

import fast
from fast.features import _elu_plus_one


def _features(shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=dtype) + 0.1


@pytest.mark.parametrize("mask", [None, "causal"])
def test_output_modified_in_place_still_backpropagates(mask):
    """out.mul_(2) after the driver: backward must work and equal 2x the gradient of out."""
    pq = _features((2, 6, 3), 0).requires_grad_()
    pk, v = _features((2, 6, 3), 1), _features((2, 6, 4), 2)
    op = None if mask is None else fast.CausalMask(6)
    (fast.masked_linear_attention(pq, pk, v, mask=op)).sum().backward()
    plain = pq.grad.clone()
    pq.grad = None
    out = fast.masked_linear_attention(pq, pk, v, mask=op)
    out.mul_(2.0)
    out.sum().backward()
    torch.testing.assert_close(pq.grad, 2.0 * plain)


def test_elu_plus_one_output_modified_in_place_still_backpropagates():
    x = torch.linspace(-3.0, 3.0, 13, dtype=torch.float64, requires_grad=True)
    y = fast.EluPlusOne()(x)
    y.mul_(2.0)
    y.sum().backward()
    expected = torch.where(x > 0, torch.ones_like(x), torch.exp(x)).detach() * 2.0
    torch.testing.assert_close(x.grad, expected)


def test_compiled_elu_plus_one_function_has_finite_gradient_at_large_inputs():
    """The function torch.compile gets: exp of the untaken branch must not overflow (float32:
    exp(x) = inf above ~88.7, and its backward 0 * inf = NaN)."""
    x = torch.tensor([-2.0, 1.0, 50.0, 100.0, 1000.0], requires_grad=True)
    _elu_plus_one(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([torch.exp(torch.tensor(-2.0)).item(), 1.0, 1.0, 1.0, 1.0]))


@pytest.mark.parametrize("driver", ["favor", "favor-causal", "softmax", "linear", "causal", "causal-bfloat16",
                                    "padding-like dense"])
def test_empty_batch_returns_an_empty_output(driver):
    """Leading dims may be empty (a batch of 0): the finiteness flags must not read an empty
    tensor's min/max (torch.aminmax refuses those)."""
    q, k, v = (torch.rand(0, 8, 4) for _ in range(3))
    if driver.startswith("favor"):
        mask = fast.CausalMask(8) if driver == "favor-causal" else None
        out = fast.favor_attention(q, k, v, torch.randn(4, 4, generator=torch.Generator().manual_seed(0)), mask=mask)
    elif driver == "causal-bfloat16":  # bfloat16 features reach attend as they are (attend_takes_half)
        out = fast.masked_linear_attention(*(t.to(torch.bfloat16) for t in (q, k, v)), mask=fast.CausalMask(8))
    elif driver == "softmax":
        out = fast.softmax_attention(q, k, v)
    elif driver == "linear":
        out = fast.masked_linear_attention(q, k, v)
    elif driver == "causal":
        out = fast.masked_linear_attention(q, k, v, mask=fast.CausalMask(8))
    else:
        out = fast.masked_linear_attention(q, k, v, mask=torch.ones(8, 8))
    assert out.shape == (0, 8, 4)


def test_causal_subclass_attend_override_is_called_by_favor_attention():
    """favor_attention's private CausalMask route must not bypass a subclass's attend."""
    calls = []

    class Recorded(fast.CausalMask):
        def attend(self, phi_q, phi_k, v, *, key_log_scale=None):
            calls.append(key_log_scale is not None)
            return super().attend(phi_q, phi_k, v, key_log_scale=key_log_scale)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, generator=g) for _ in range(3))
    w = torch.randn(8, 4, generator=g)
    out = fast.favor_attention(q, k, v, w, mask=Recorded(16))
    assert calls == [True]
    torch.testing.assert_close(out, fast.favor_attention(q, k, v, w, mask=fast.CausalMask(16)))


def test_causal_subclass_with_its_own_attend_gets_float32_copies_of_bfloat16_features():
    """attend_takes_half holds for CausalMask's own attend only: a subclass's attend, which may not
    take ``accumulate``, is called as before, on float32 copies."""
    seen = []

    class Recorded(fast.CausalMask):
        def attend(self, phi_q, phi_k, v, *, key_log_scale=None):
            seen.append(phi_q.dtype)
            return super().attend(phi_q, phi_k, v, key_log_scale=key_log_scale)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(2, 16, 4, generator=g).to(torch.bfloat16) for _ in range(3))
    assert fast.CausalMask(16).attend_takes_half and not Recorded(16).attend_takes_half
    out = fast.masked_linear_attention(q, k, v, mask=Recorded(16))
    assert seen == [torch.float32] and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, fast.masked_linear_attention(q, k, v, mask=fast.CausalMask(16)))


@pytest.mark.parametrize("promise", [None, True, False])
def test_signed_mask_guard_holds_whatever_the_sign_promise(promise):
    """A signed mask whose row cancels to round-off: refused with or without a (here broken)
    promise that the features are nonnegative."""
    mask = torch.tensor([[1.0, -1.0], [0.0, 1.0]])
    phi_q = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    phi_k = torch.tensor([[1.0, -0.5], [0.5000001, 0.0]])
    with pytest.raises(fast.DenominatorError, match="round-off"):
        fast.masked_linear_attention(phi_q, phi_k, torch.eye(2), mask=mask, features_nonnegative=promise)
