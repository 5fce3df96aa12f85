"""The one-reference route of CausalMask's scan with key constants (issue 11).

exp(c_j - r_i) = exp(c_j - R) exp(R - r_i) with R the slice's largest constant: where every
slice's running max spans at most T = factor_range(dtype) (``_narrow``), the scan with key
constants is the plain scan on rescaled keys, its results rescaled per query. ``attend`` decides
with its one host read; fast.favor_attention takes the route optimistically
(``attend_optimistic``), checks the condition with its one combined flag, and redoes the
products with the decayed scan where it fails (a key far louder than the earlier ones), after
which the mask instance keeps to the decayed scan (``_wide``). FAVOR+'s own constants give a narrow
slice one constant, so its optimistic route is the plain scan (``narrow_constants``).
"""
from __future__ import annotations

import math

import pytest
import torch

import fast
from fast import CausalMask
from fast.masks import sequence
from fast.masks.sequence import factor_range
from tests.helpers import assert_unchanged, dense_causal_units, gen, positive, randn


def _routes(monkeypatch) -> list:
    """Record the route (True: one reference) of every stable scan, forward and backward, and
    ("plain", pass) for the plain scan FAVOR+ takes on constants that are one per slice."""
    seen = []
    fwd, bwd = CausalMask._stable_scan, CausalMask._stable_scan_backward
    plain = sequence._CausalScan

    class PlainSpy(plain):
        @staticmethod
        def forward(ctx, *args):
            seen.append(("plain", "forward"))
            return plain.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            seen.append(("plain", "backward"))
            return plain.backward(ctx, *grads)

    monkeypatch.setattr(sequence, "_CausalScan", PlainSpy)

    def spy_fwd(self, q, k, v, c, narrow=False):
        seen.append(("forward", narrow))
        return fwd(self, q, k, v, c, narrow)

    def spy_bwd(self, q, k, v, c, gn, gd, narrow=False):
        seen.append(("backward", narrow))
        return bwd(self, q, k, v, c, gn, gd, narrow)

    monkeypatch.setattr(CausalMask, "_stable_scan", spy_fwd)
    monkeypatch.setattr(CausalMask, "_stable_scan_backward", spy_bwd)
    return seen


def _constants(narrow: bool, n: int, g: torch.Generator, monotone: bool = True) -> torch.Tensor:
    """Key constants (2, n), float64 (T = 88.7): a few units apart, or with a key 1000 units louder mid-sequence."""
    c = torch.cummax(randn((2, n), g), -1).values
    if not narrow:
        c[:, n // 2 + 1:] += 1e3
    if not monotone:  # constants below the running max (not key_stabilizer's, but allowed)
        c = c - 2 * torch.rand(c.shape, generator=g, dtype=c.dtype)
    return c


@pytest.mark.parametrize("narrow", [True, False])
@pytest.mark.parametrize("monotone", [True, False])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_attend_takes_the_route_its_constants_allow_and_equals_the_dense_form(narrow, monotone, chunk, monkeypatch):
    g = gen(11)
    n = 30
    q, k, v = positive((2, n, 3), g), positive((2, n, 3), g), randn((2, n, 2), g)
    c = _constants(narrow, n, g, monotone)
    seen = _routes(monkeypatch)
    num, den = CausalMask(n, chunk=chunk).attend(q, k, v, key_log_scale=c[..., None])
    assert seen == [("forward", narrow)]
    e_num, e_den = dense_causal_units(q, k, v, c)
    assert_unchanged(num, e_num)
    assert_unchanged(den, e_den)


@pytest.mark.parametrize("narrow", [True, False])
def test_each_route_has_the_dense_gradients(narrow, monkeypatch):
    g = gen(12)
    n = 21
    q, k, v = positive((2, n, 3), g), positive((2, n, 3), g), randn((2, n, 2), g)
    c = _constants(narrow, n, g)
    gn, gd = randn((2, n, 2), g), randn((2, n), g)
    mask = CausalMask(n, chunk=4)
    seen = _routes(monkeypatch)
    grads = []
    for fn in (lambda a, b, x: mask.attend(a, b, x, key_log_scale=c[..., None]),
               lambda a, b, x: dense_causal_units(a, b, x, c)):
        a, b, x = (t.clone().requires_grad_() for t in (q, k, v))
        num, den = fn(a, b, x)
        grads.append(torch.autograd.grad((num * gn).sum() + (den * gd).sum(), (a, b, x)))
    assert seen == [("forward", narrow), ("backward", narrow)]
    for got, expected in zip(*grads):
        assert_unchanged(got, expected)


def test_the_one_reference_route_gradcheck_and_gradgradcheck(monkeypatch):
    g = gen(13)
    n = 9
    q = positive((2, n, 2), g).requires_grad_()
    k = positive((2, n, 2), g).requires_grad_()
    v = randn((2, n, 3), g).requires_grad_()
    c = _constants(True, n, g)[..., None]
    mask = CausalMask(n, chunk=4)
    seen = _routes(monkeypatch)

    def f(a, b, x):
        return mask.attend(a, b, x, key_log_scale=c)

    assert torch.autograd.gradcheck(f, (q, k, v))
    assert torch.autograd.gradgradcheck(f, (q, k, v))
    assert {narrow for _, narrow in seen} == {True}


def test_the_route_is_decided_per_call_over_every_slice():
    """r_N - r_1 <= T in every slice, T = log(max) / 8; one slice too wide refuses the route."""
    n = 8
    t32 = factor_range(torch.float32)
    assert t32 == pytest.approx(math.log(torch.finfo(torch.float32).max) / 8)
    assert factor_range(torch.float64) == pytest.approx(math.log(torch.finfo(torch.float64).max) / 8)
    mask = CausalMask(n)
    at = torch.tensor([[0.0] * (n - 1) + [t32 * 0.999]])
    above = torch.tensor([[0.0] * (n - 1) + [t32 * 1.01]])
    first_low = torch.tensor([[-t32 * 1.01] + [0.0] * (n - 1)])  # the span counts from the first key
    assert bool(mask._narrow(at)) and not bool(mask._narrow(above)) and not bool(mask._narrow(first_low))
    assert not bool(mask._narrow(torch.cat([at, above])))
    fk, fq = mask._one_reference(at)
    assert float(fk.max()) <= 1.0 and float(fq.min()) >= 1.0 and float(fq.max()) <= math.exp(t32)


def _loud_late_key(n: int, g: torch.Generator):
    """FAVOR+ inputs (1, 2, n, 4) whose key at n // 2 + 1 is far louder than the earlier keys (its
    exponent ~ 200 units above theirs in float32): the running max spans far more than T."""
    q, k, v = randn((1, 2, n, 4), g), randn((1, 2, n, 4), g), randn((1, 2, n, 3), g)
    w = randn((8, 4), g)
    w[0] = 20.0 * w[0] / w[0].norm()  # z = w_0 . k / 4^(1/4) - |k|^2 / (2 sqrt(4)): ~200 at k = 28 w_0 / |w_0|
    k[..., n // 2 + 1, :] = 1.4 * w[0]
    return q, k, v, w


def test_favor_attention_redoes_a_wide_call_with_the_decayed_scan_and_keeps_the_early_keys(monkeypatch):
    """float32 through the driver: the optimistic route is tried, its flag fails, the products are
    redone with the decayed scan (the early queries keep their keys: equal to float64), and the
    mask instance then takes the decayed scan directly."""
    g = gen(14)
    n = 40
    q, k, v, w = _loud_late_key(n, g)
    mask = CausalMask(n, chunk=8)
    seen = _routes(monkeypatch)
    out = fast.favor_attention(q.float(), k.float(), v.float(), w.float(), mask=mask)
    assert seen == [("plain", "forward"), ("forward", False)] and mask._wide
    expected = fast.favor_attention(q, k, v, w, mask=CausalMask(n, chunk=8))
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)
    seen.clear()
    again = fast.favor_attention(q.float(), k.float(), v.float(), w.float(), mask=mask)
    assert seen == [("forward", False)]
    torch.testing.assert_close(again, out, rtol=0, atol=0)


def test_the_loud_key_is_really_wide_in_float32():
    """Power for the test above: its constants span more than T in float32, so the one-reference
    route alone would underflow the early keys (their factors exp(c_j - R) are 0)."""
    g = gen(14)
    n = 40
    q, k, v, w = _loud_late_key(n, g)
    mask = CausalMask(n, chunk=8)
    z = (k.float() / 4 ** 0.25) @ w.float().t()
    c = mask.key_stabilizer(z).squeeze(-1)
    assert float((c[..., -1] - c[..., 0]).min()) > 87.0
    fk, _ = mask._one_reference(c)
    assert float(fk[..., : n // 2, :].max()) == 0.0


def test_favor_attention_takes_the_plain_scan_at_moderate_inputs_with_one_host_read(monkeypatch):
    """A narrow slice's keys share one constant (key_stabilizer), which cancels: the plain scan,
    forward and backward, equal to float64 within float32 round-off."""
    g = gen(15)
    n = 64
    q, k, v, w = randn((1, 2, n, 4), g), randn((1, 2, n, 4), g), randn((1, 2, n, 3), g), randn((8, 4), g)
    mask = CausalMask(n, chunk=8)
    seen = _routes(monkeypatch)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out = fast.favor_attention(qf, kf, vf, w.float(), mask=mask)
    out.sum().backward()
    assert seen == [("plain", "forward"), ("plain", "backward")] and not mask._wide
    a, b, x = (t.clone().requires_grad_() for t in (q, k, v))
    expected = fast.favor_attention(a, b, x, w, mask=CausalMask(n, chunk=8))
    expected.sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    for got, want in ((qf, a), (kf, b), (vf, x)):
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-3, atol=1e-4)


def test_the_plain_route_flag_asks_for_one_constant_in_every_slice():
    """attend_optimistic's flag for FAVOR+'s own constants: True only where each slice holds one
    value; a varying slice, NaN or inf (inf - inf is NaN) make it False; an empty batch is True."""
    mask = CausalMask(4)
    one = torch.tensor([[2.0] * 4, [-1.0] * 4])
    assert bool(mask._one_per_slice(one))
    assert not bool(mask._one_per_slice(torch.tensor([[2.0] * 4, [-1.0, -1.0, -1.0, -0.5]])))
    for bad in (math.nan, math.inf, -math.inf):
        assert not bool(mask._one_per_slice(torch.full((2, 4), bad)))
    assert bool(mask._one_per_slice(torch.ones(0, 4)))


def test_a_den_below_the_normal_range_in_units_of_the_slice_is_redone_in_the_querys_own(monkeypatch):
    """One constant per narrow slice puts each (num_i, den_i) in units of the slice's largest key.
    Query 0 sees only key 0, whose largest feature is e^-11 of the slice's (within T = 11.09 in
    float32: narrow); with phi_q_0 = (1e-34, 1) its den is 1.7e-39 there, below float32's smallest
    normal number, but 1e-34 in units of its own largest key. The flag fails on that den,
    attend_exact redoes the plain scan in each query's own units (the mask does not turn to the
    decayed scan), and the row is returned, equal to v_0 as in float64; without the redo the guard
    refuses it."""
    from fast.attention import _attention
    n = 8
    phi_q = torch.ones(1, n, 2)
    phi_q[0, 0] = torch.tensor([1e-34, 1.0])
    phi_k = torch.ones(1, n, 2)
    phi_k[0, :4] = torch.tensor([math.exp(-11.0), 0.0])
    v = randn((1, n, 3), gen(16), torch.float32)
    c = torch.zeros(1, n, 1)  # one constant per slice: the keys' features are in its units
    mask = CausalMask(n, chunk=4)
    assert bool(mask._one_per_slice(c[..., 0])) and float(phi_q[0, 0] @ phi_k[0, 0]) < torch.finfo(torch.float32).tiny
    calls = []
    exact = CausalMask.attend_exact
    monkeypatch.setattr(CausalMask, "attend_exact", lambda self, *a: calls.append(1) or exact(self, *a))
    out = _attention(phi_q, phi_k, v, mask, block_cols=None, no_key="raise", key_log_scale=c,
                     features_nonnegative=True)
    assert calls == [1] and not mask._wide
    torch.testing.assert_close(out[0, 0], v[0, 0], rtol=1e-5, atol=0)
    want = dense_causal_units(phi_q.double(), phi_k.double(), v.double(), c[..., 0].double())
    torch.testing.assert_close(out.double(), want[0] / want[1][..., None], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(CausalMask, "_plain_in_query_units",
                        lambda self, q, k, x: sequence._CausalScan.apply(q, k, x, self))
    with pytest.raises(fast.DenominatorError):
        _attention(phi_q, phi_k, v, CausalMask(n, chunk=4), block_cols=None, no_key="raise", key_log_scale=c,
                   features_nonnegative=True)
