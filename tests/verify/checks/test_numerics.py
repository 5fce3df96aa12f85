"""verify/checks/numerics.py: numerics/<id> fails on planted silent errors, on a stabiliser shared
across the batch and on refusals of representable denominators, and passes on correct paths;
the ratio that decides whether a refusal is allowed, on cases computed by hand."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import fast
from fast.errors import DenominatorError
from results.check import Context
from verify.checks import numerics
from verify.favor import favor_mechanism, favor_problem, favor_tensors
from verify.mechanisms import get, mechanisms

#: Small sweeps: one N, one d; d = 64 makes the FAVOR+ exponents of the std-8 heads ~200 below
#: those of the std-0.5 heads (|x|^2 / 2 ~ 256 at x = q / 64^(1/4)), past float32's range.
N = 32
D = 64
F32 = (("float32", torch.float32),)
HEADS = len(numerics.STDS) * numerics.draws_per_std(N)


def sweep(mech, dims=(D,), dtypes=F32):
    return numerics.run_sweep(mech, (N,), seed=0, dims=dims, dtypes=dtypes)


def cell(outcome, std, dtype="float32", d=D):
    (c,) = [c for c in outcome.details["cells"] if (c["dtype"], c["std"], c["d"]) == (dtype, std, d)]
    return c


def wrapped(base_id: str, new_id: str, wrap) -> object:
    """The record ``base_id`` with fast_setup(problem, device, dtype) -> wrap(problem, dtype, runner)."""
    base = get(base_id)

    def setup(problem, device, dtype, requires_grad=False):
        return wrap(problem, dtype, base.fast_setup(problem, device, dtype, requires_grad))

    return dataclasses.replace(base, id=new_id, fast_setup=setup)


# ------------------------------------------------------------------------------ planted mechanisms


def _perturb_one_row(problem, dtype, runner):
    """float32: row 3 of the last head (a std-8 head) off by exactly 1% (a silent error)."""
    def run():
        out = runner()
        if dtype == torch.float32:
            out = out.clone()
            out[0, -1, 3] *= 1.01
        return out
    return run


def _refuse_loud_queries(problem, dtype, runner):
    """float32: DenominatorError whenever a query entry exceeds 24 (only the std-8 heads have one)."""
    def run():
        if dtype == torch.float32 and np.abs(problem.q).max() > 24:
            raise DenominatorError("planted: refuses loud queries")
        return runner()
    return run


def _refuse_batches(problem, dtype, runner):
    """float32: DenominatorError for any call with more than one head, never for one head alone."""
    def run():
        if dtype == torch.float32 and problem.q.shape[1] > 1:
            raise DenominatorError("planted: refuses batches")
        return runner()
    return run


def _no_bf16(problem, dtype, runner):
    def run():
        if dtype == torch.bfloat16:
            raise TypeError("planted: no bfloat16 path")
        return runner()
    return run


class AllOnes:
    """The all-ones mask (every query sees every key) with a choice of key stabiliser:
    "head": the max over the keys and features of each (batch, head) slice (correct);
    "batch": the max over the whole batch (the planted bug: one head's scale underflows another's)."""

    nonnegative = True

    def __init__(self, n: int, stabiliser: str):
        self.n, self.stabiliser = n, stabiliser

    def matmul(self, x):
        return x.sum(dim=-2, keepdim=True).expand(x.shape)

    def key_stabilizer(self, z):
        if self.stabiliser == "batch":
            return z.amax()
        return z.amax(dim=(-2, -1), keepdim=True)


def _all_ones(stabiliser: str):
    return favor_mechanism(f"planted-all-ones-{stabiliser}", f"all-ones mask, {stabiliser} stabiliser", "test", "N",
                           problem=favor_problem, dense_mask=lambda p: np.ones((p.n, p.n)),
                           fast_mask=lambda p, device: AllOnes(p.n, stabiliser))


def _first_query_sees_nothing(p):
    m = np.ones((p.n, p.n))
    m[0] = 0.0
    return m


NO_KEY = favor_mechanism("planted-no-key", "query 0 sees no key", "test", "N", problem=favor_problem,
                         dense_mask=_first_query_sees_nothing,
                         fast_mask=lambda p, device: torch.as_tensor(_first_query_sees_nothing(p), device=device))


# ------------------------------------------------------------------------------ the check fails


def test_a_silently_wrong_row_fails():
    out = sweep(wrapped("linear", "planted-row", _perturb_one_row))
    assert out.status == "fail"
    assert out.statistic == 1.0  # one row of one head, nothing else
    assert cell(out, 8.0)["silent"] == 1 and cell(out, 8.0)["worst_row_error"] == pytest.approx(0.01, rel=1e-3)
    assert all(cell(out, s)["silent"] == 0 for s in numerics.STDS[:-1])
    assert any("1 of" in r and "silently" in r for r in out.details["reasons"])


def test_a_stabiliser_across_the_batch_fails_and_the_per_head_one_passes():
    bad = sweep(_all_ones("batch"))
    assert bad.status == "fail" and bad.statistic > 0
    loud = cell(bad, 8.0)
    assert loud["silent"] + loud["disallowed"] > 0  # the std-8 heads' features underflow
    good = sweep(_all_ones("head"))
    assert good.status == "pass" and good.statistic == 0.0, good.details["reasons"]
    assert all(c["refusals"] == 0 and c["silent"] == 0 for c in good.details["cells"])


def test_a_refusal_of_normal_denominators_fails_and_is_localised_to_its_heads():
    out = sweep(wrapped("linear", "planted-refusal", _refuse_loud_queries))
    assert out.status == "fail"
    rows = numerics.draws_per_std(N) * N
    assert cell(out, 8.0)["refusals"] == cell(out, 8.0)["disallowed"] == rows
    assert cell(out, 8.0)["min_log2_ratio_refused"] > -126
    assert all(cell(out, s)["refusals"] == 0 for s in numerics.STDS[:-1])  # the other heads were judged
    assert out.statistic == rows
    assert any("refused (DenominatorError)" in r for r in out.details["reasons"])


def test_a_refusal_that_depends_on_the_batch_counts_every_head():
    out = sweep(wrapped("linear", "planted-batch-refusal", _refuse_batches))
    assert out.status == "fail" and out.statistic == HEADS * N
    assert all(c["batch_dependent_refusals"] == c["refusals"] == c["rows"] for c in out.details["cells"])
    assert any("no head alone" in r for r in out.details["reasons"])


def test_a_missing_bfloat16_path_fails_with_its_reason():
    out = numerics.run_sweep(wrapped("linear", "planted-no-bf16", _no_bf16), (N,), dims=(16,))
    assert out.status == "fail"
    assert out.details["totals"]["bfloat16"]["errors"] == HEADS * N
    assert out.details["totals"]["float32"]["errors"] == 0
    assert any("TypeError: planted: no bfloat16 path" in r for r in out.details["reasons"])


def test_any_refusal_of_a_mechanism_without_favor_features_is_disallowed():
    out = sweep(wrapped("softmax", "planted-softmax", _refuse_loud_queries))
    assert out.status == "fail" and not out.details["linear"]
    assert cell(out, 8.0)["disallowed"] == cell(out, 8.0)["refusals"] > 0


# ------------------------------------------------------------------------------ the check passes


def test_a_query_that_sees_no_key_may_refuse():
    """Every call refuses (query 0's denominator is 0); ratio_0 = 0 < 2^-126 makes each allowed."""
    out = sweep(NO_KEY)
    assert out.status == "pass" and out.statistic == 0.0, out.details["reasons"]
    for c in out.details["cells"]:
        assert c["refusals"] == c["rows"] and c["disallowed"] == 0 and c["reference_disallowed"] == 0
        assert c["min_log2_ratio_refused"] == -math.inf


def test_a_correct_path_passes_in_both_dtypes():
    """d = 16: the scale d^(-1/4) = 1/2 is exact in bfloat16 (no extra input rounding inside)."""
    out = numerics.run_sweep(_all_ones("head"), (N,), dims=(16,))
    assert out.status == "pass" and out.statistic == 0.0, out.details["reasons"]
    tot = out.details["totals"]
    assert set(tot) == {"float32", "bfloat16"} and all(t["rows"] == HEADS * N for t in tot.values())
    assert tot["float32"]["worst_row_error"] < 1e-4 < tot["bfloat16"]["worst_row_error"] < 1e-2


# ------------------------------------------------------------------------------ declaration, inputs


def test_one_check_per_registered_mechanism_and_the_value_overflow_check():
    checks = numerics.checks()
    assert [c.id for c in checks] == [f"numerics/{m.id}" for m in mechanisms()] + ["numerics/value-overflow"]
    for c in checks[:-1]:
        assert (c.kind, c.threshold, c.compare, c.unit, c.quick) == ("numerics", 0.0, "<=", "count", True)
    # a comparison with the exact result, like equivalence's (the report's numerics heatmaps read cells)
    assert (checks[-1].kind, checks[-1].threshold, checks[-1].unit) == ("equivalence", 1.0, "ratio")


def test_value_overflow_takes_the_rescaled_branches(monkeypatch):
    """The check's inputs reach the redo of every caller of fast.scaling it names (each would be a dead
    case otherwise), and the real code passes on them."""
    import fast.attention
    import fast.latent.nodeformer
    import fast.latent.simple_attention
    import fast.masks.diffusion
    import fast.operator

    calls: dict[str, int] = {}
    for module in (fast.attention, fast.operator, fast.latent.simple_attention, fast.latent.nodeformer,
                   fast.masks.diffusion):
        original = module.times_pow2

        def spy(x, e, _name=module.__name__, _original=original):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(x, e)

        monkeypatch.setattr(module, "times_pow2", spy)
    ids = ("gdk", "toeplitz-1d", "difformer", "sgformer", "expm_action", "relational_bias")
    res = numerics.value_overflow_check(ids).evaluate(Context(quick=True))
    assert res.status == "pass", res.details["reasons"]
    assert set(calls) == {"fast.attention", "fast.operator", "fast.latent.simple_attention", "fast.latent.nodeformer",
                          "fast.masks.diffusion"}, calls


def test_the_check_runs_through_its_declaration(monkeypatch):
    monkeypatch.setattr(numerics, "QUICK_SIZES", (N,))
    monkeypatch.setattr(numerics, "DIMS", (16,))
    res = numerics.check_for(_all_ones("head")).evaluate(Context(quick=True))
    assert res.status == "pass" and res.kind == "numerics" and res.unit == "count"
    assert len(res.details["cells"]) == 2 * len(numerics.STDS)


def test_inputs_have_the_stated_scales_and_bf16_rounding_is_exact():
    q, k, v, w = numerics.draw_inputs(512, 16, 2, seed=0)
    assert q.shape == k.shape == v.shape == (1, 10, 512, 16) and w.shape == (numerics.FEATURES, 16)
    stds = q.reshape(10, -1).std(axis=1)
    assert np.allclose(stds, np.repeat(numerics.STDS, 2), rtol=0.1)
    r = numerics.round_to_bf16(q)
    assert np.array_equal(numerics.round_to_bf16(r), r)  # idempotent: already bfloat16 values
    assert np.max(np.abs(r - q) / np.abs(q)) <= 2.0**-8
    again = numerics.draw_inputs(512, 16, 2, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v, w), again))


def test_favor_exponents_are_the_features_of_favor_attention():
    p = favor_problem(8, 0)
    q, k, v, w = favor_tensors(p, "cpu", torch.float64)
    z = numerics.favor_exponents(p.q, p.projection)
    phi = np.exp(z) / math.sqrt(w.shape[0])
    phi_q, _ = fast.favor_features(q, k, w)  # stabilised: one positive constant per query row
    ratio = phi / phi_q.numpy()
    assert np.allclose(ratio, ratio[:, :1])


# ------------------------------------------------------------------------------ the ratio by hand


def test_log_ratio_on_a_case_computed_by_hand():
    # phi_q = [[1, 1/2], [2, 1], [1, 1]], phi_k = [[1, 1/4], [4, 1], [8, 8]], key 2 hidden from
    # queries 0 and 1 (so its features 8 must not set their scale), query 2 sees nothing.
    zq = np.log([[1.0, 0.5], [2.0, 1.0], [1.0, 1.0]])
    zk = np.log([[1.0, 0.25], [4.0, 1.0], [8.0, 8.0]])
    m = np.array([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [0.0, 0.0, 0.0]])
    # row 0: D = 1 (1 + 1/8) = 1.125, over max phi_q 1 x visible max phi_k 1 x max M 1
    # row 1: D = 0.5 (2 + 1/4) + 2 (8 + 1) = 19.125, over 2 x 4 x 2 = 16
    got = numerics.log_ratio(zq, zk, m, block=2)
    assert np.allclose(np.exp(got[:2]), [1.125, 19.125 / 16], rtol=1e-14)
    assert got[2] == -np.inf


def test_log_ratio_has_no_underflow_and_handles_signs():
    # terms exp(-500): far below float64's exp range once summed naively with exp(0) scales
    zq = np.array([[0.0, -500.0]])
    zk = np.array([[-500.0, 0.0]])
    assert numerics.log_ratio(zq, zk, None)[0] == pytest.approx(math.log(2.0) - 500.0, abs=1e-12)
    # a signed mask: 2 * 1 - 1 * 1 = 1 over max|M| 2 -> 1/2; an exact cancellation -> -inf
    zq, zk = np.zeros((2, 1)), np.zeros((2, 1))
    got = numerics.log_ratio(zq, zk, np.array([[2.0, -1.0], [1.0, -1.0]]))
    assert got[0] == pytest.approx(math.log(0.5)) and got[1] == -np.inf
    assert numerics.LOG_TINY == pytest.approx(math.log(2.0**-126))
