"""verify/checks/guards.py: guard/<id> passes on the real code, and fails on planted denominator
guards that are missing, absolute, epsilon-padded or relative to the whole batch."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fast
import fast.attention
from fast.errors import DenominatorError
from results.check import Context
from verify.checks import guards
from verify.mechanisms import get, mechanisms

#: Cheap records covering the driver's paths: no mask (two GEMMs), attend (causal scan, padding's
#: GEMMs, Toeplitz FFT with its own round-off guard), the generic blocked path (low-rank,
#: hypercube), packing's per-segment stabiliser.
REAL = ("linear", "causal", "packing", "padding", "toeplitz-1d", "low-rank", "hypercube-gdk")


def test_one_check_per_linear_mechanism():
    checks = guards.checks()
    assert [c.id for c in checks] == [f"guard/{m.id}" for m in mechanisms() if m.linear]
    assert "guard/softmax" not in [c.id for c in checks]  # dense: no denominator guard of its own
    for c in checks:
        assert (c.threshold, c.compare, c.unit, c.kind, c.quick) == (0.0, "<=", guards.UNIT, "guard", True)
    with pytest.raises(ValueError, match="linear=True"):
        guards.check_for(get("softmax"))


def test_the_table_has_fire_and_silent_cases():
    expects = {c.expect for c in guards.CASES}
    assert expects == set(guards.EXPECTATIONS)
    assert len({c.name for c in guards.CASES}) == len(guards.CASES)
    with pytest.raises(ValueError, match="expect must be one of"):
        guards.GuardCase("x", "maybe", lambda q, k, at: (q, k))


@pytest.mark.parametrize("mech_id", ("linear", "padding", "packing", "toeplitz-1d"))
def test_the_features_are_the_fast_paths_own(mech_id):
    """The guard drives the features fast.favor_attention forms: the unedited call is the fast path."""
    mech = get(mech_id)
    problem = mech.problem(mech.admissible(37), 0, batch=guards.EQUIVALENCE_BATCH)
    phi_q, phi_k, v, op = guards.features(mech, problem, "cpu", torch.float64)
    assert torch.equal(fast.masked_linear_attention(phi_q, phi_k, v, op), mech.fast(problem, "cpu", torch.float64))


def test_slice_errors_cover_the_real_rows_only():
    g = torch.Generator().manual_seed(0)
    e = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    got = e.clone()
    real = np.ones((2, 3, 5), dtype=bool)
    real[1, 2, 4] = False
    got[1, 2, 4] = float("nan")  # a padded query's output: ignored
    got[0, 1, 0] *= 1.5
    err = guards.slice_errors(e, got, real)
    assert err.shape == (6,) and np.isfinite(err).all()
    assert np.count_nonzero(err) == 1 and err[1] == pytest.approx(
        0.5 * float(e[0, 1, 0].norm() / e[0, 1].norm()), rel=1e-12)
    real[1, 2, 4] = True
    assert np.isnan(guards.slice_errors(e, got, real)[5])  # a NaN in a real row is never a pass


def test_edits_never_touch_their_inputs_and_hit_one_slice():
    q = torch.rand(2, 2, 5, 3, dtype=torch.float64) + 0.1
    k = torch.rand(2, 2, 5, 3, dtype=torch.float64) + 0.1
    q0, k0 = q.clone(), k.clone()
    at = guards.Target((1, 0), query=2, key=4, dtype="float64")
    for case in guards.CASES:
        eq, ek = case.edit(q, k, at)
        assert torch.equal(q, q0) and torch.equal(k, k0), case.name
        assert eq.shape == q.shape and ek.shape == k.shape
    zq, _ = next(c for c in guards.CASES if c.name == "zero query").edit(q, k, at)
    assert (zq[1, 0, 2] == 0).all() and int((zq == 0).sum()) == 3
    s = guards.SCALE_EXP["float64"]
    _, per_k = next(c for c in guards.CASES if c.name == "keys scaled per slice").edit(q, k, at)
    per_q, _ = next(c for c in guards.CASES if c.name == "queries scaled per slice").edit(q, k, at)
    for got, base, first in ((per_k, k, -s), (per_q, q, s)):
        ratio = (got / base).reshape(4, -1)
        assert torch.equal(ratio.amin(1), ratio.amax(1))  # one power of two per slice
        assert ratio[0, 0] == 2.0 ** first and ratio[-1, 0] == 2.0 ** -first


def test_real_tokens_follow_the_key_mask():
    mech = get("padding")
    p = mech.problem(40, 0, batch=(2, 2))
    real = guards.real_tokens(p)
    assert real.shape == (2, 2, 40)
    assert np.array_equal(real, np.broadcast_to(np.asarray(p.extras["key_mask"], dtype=bool), (2, 2, 40)))
    assert not real.all() and real[..., 0].all()
    at = guards.pick_target(real, "float32", np.random.default_rng(0))
    assert real[(*at.slice, at.query)] and real[(*at.slice, at.key)]


@pytest.mark.parametrize("mech_id", REAL)
def test_passes_on_the_real_code(mech_id):
    res = guards.check_for(get(mech_id)).evaluate(Context(quick=True))
    assert res.status == "pass", res.details["reasons"]
    assert res.statistic == 0.0 and res.details["reasons"] == []
    rows = res.details["cases"]
    assert len(rows) == len(guards.CASES) * 2 * len(guards.QUICK_SIZES)
    assert {r["case"] for r in rows} == {c.name for c in guards.CASES}
    # the fire cases really raised and the silent ones really compared
    assert all(r["outcome"].startswith("DenominatorError") for r in rows if r["case"] == "zero query")
    assert all("max_slice_error" in r for r in rows if r["expect"] == "silent")
    assert res.details["max_silent_slice_error"] <= guards.SCALE_TOL["float32"]


# ------------------------------------------------------------------------------ planted guards


def _unguarded(num, den, **_):  # the real divide also takes floor, no_key, policy
    return num / den.unsqueeze(-1)


def _absolute(num, den, **_):
    if bool(((den == 0) | ~torch.isfinite(den) | (den.abs() < 1e-12)).any()):
        raise DenominatorError("den < 1e-12")
    return num / den.unsqueeze(-1)


def _epsilon(num, den, **_):
    if bool(((den == 0) | ~torch.isfinite(den)).any()):
        raise DenominatorError("den vanished")
    return num / (den + 1e-6).unsqueeze(-1)


def _batch_relative(num, den, **_):
    if bool(((den == 0) | ~torch.isfinite(den) | (den.abs() < 1e-30 * den.abs().max())).any()):
        raise DenominatorError("den small relative to the batch's largest")
    return num / den.unsqueeze(-1)


@pytest.mark.parametrize("mech_id", ["linear", "causal"])
def test_a_removed_guard_fails(monkeypatch, mech_id):
    """divide without its check: a vanished den gives NaN (0/0), an overflowing one NaN (inf/inf)."""
    monkeypatch.setattr(fast.attention, "divide", _unguarded)
    res = guards.check_for(get(mech_id)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic > res.threshold
    failed = {r["case"] for r in res.details["cases"] if not r["ok"]}
    assert failed == {"zero query", "overflowing denominator"}
    zero = [r for r in res.details["cases"] if r["case"] == "zero query"]
    assert all("NaN" in r["outcome"] for r in zero)
    assert any("'zero query' (must raise DenominatorError): returned" in reason for reason in res.details["reasons"])


SCALED = {"keys scaled per slice", "queries scaled per slice"}


@pytest.mark.parametrize("bug", [_absolute, _epsilon, _batch_relative])
def test_an_eager_guard_fails_the_silent_cases(monkeypatch, bug):
    """den < 1e-12 raising, den + 1e-6, den < 1e-30 max(den over the batch) raising: valid inputs
    with tiny (or, next to them, huge) features are refused or distorted."""
    monkeypatch.setattr(fast.attention, "divide", bug)
    res = guards.check_for(get("linear")).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic == 2 * len(SCALED)  # both dtypes
    assert {r["case"] for r in res.details["cases"] if not r["ok"]} == SCALED


def test_a_guard_that_raises_a_plain_error_fails_the_fire_case(monkeypatch):
    """A vanished den must be a DenominatorError (callers catch it by type), not any exception."""
    def wrong_type(num, den, **_):
        if bool(((den == 0) | ~torch.isfinite(den)).any()):
            raise ZeroDivisionError("den")
        return num / den.unsqueeze(-1)

    monkeypatch.setattr(fast.attention, "divide", wrong_type)
    res = guards.check_for(get("linear")).evaluate(Context(quick=True))
    assert res.status == "fail"
    assert any("ZeroDivisionError" in r for r in res.details["reasons"])


def test_a_guard_whose_own_arithmetic_overflows_fails(monkeypatch):
    """Toeplitz's round-off floor from a float32 norm: |phi_k col|_2 of features ~2^64 squares to
    2^128 > float32's max, the floor is inf and valid inputs are refused (found by this check)."""
    from fast.masks.toeplitz import _ROUNDOFF_C, BlockToeplitzMask

    def float32_bound(self, x):
        u = torch.finfo(x.dtype).eps / 2
        size = math.log2(max(2, math.prod(self.n_fft)))
        tnorm = float(torch.linalg.vector_norm(self.table.detach().double()))
        return _ROUNDOFF_C * u * size * tnorm * torch.linalg.vector_norm(x, dim=-2)

    monkeypatch.setattr(BlockToeplitzMask, "roundoff_bound", float32_bound)
    res = guards.check_for(get("toeplitz-1d")).evaluate(Context(quick=True))
    assert res.status == "fail"
    assert {(r["case"], r["dtype"]) for r in res.details["cases"] if not r["ok"]} == {("keys scaled per slice", "float32")}
