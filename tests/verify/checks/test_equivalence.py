"""verify/checks/equivalence.py: one check per mechanism over every variant, on batched problems
compared slice by slice, with the update and learnable protocols; a planted bug (in the default
variant, in one other variant only, in one small slice only, in the protocol's second call or in
the gradient) makes it fail. The planted fast/ bugs of issue 9 are in test_equivalence_planted.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from results.check import Context
from verify import favor
from verify.checks import equivalence
from verify.favor import favor_fast_setup, favor_mechanism, favor_problem, mask_tensor
from verify.mechanisms import get, mechanisms
from verify.registry import EQUIVALENCE_BATCH, Variant


def _check(mech):
    return equivalence.check_for(mech)


def test_one_check_per_mechanism():
    checks = equivalence.checks()
    assert [c.id for c in checks] == [f"equivalence/{m.id}" for m in mechanisms()]
    assert all(c.kind == "equivalence" and c.quick for c in checks)
    assert all((c.threshold, c.compare, c.unit) == (1.0, "<=", "ratio") for c in checks)
    assert [c.source for c in checks] == [m.source for m in mechanisms()]


def test_check_passes_on_the_real_mechanism():
    check = next(c for c in equivalence.checks() if c.id == "equivalence/linear")
    res = check.evaluate(Context(quick=True))
    assert res.status == "pass" and res.kind == "equivalence" and res.id == "equivalence/linear"
    assert res.statistic <= res.threshold == 1.0 and res.compare == "<=" and res.unit == "ratio"
    assert res.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert res.details["float32_max_rel_error"] <= equivalence.TOL["float32"]
    # the statistic is the worst error over its tolerance
    assert res.statistic == max(res.details[f"{d}_max_rel_error"] / equivalence.TOL[d] for d in equivalence.TOL)
    assert list(res.details["variants"]) == ["default"] and res.details["reasons"] == []
    assert res.details["batch"] == list(EQUIVALENCE_BATCH)
    component = res.details["worst_component"]
    assert component in equivalence.TOL
    assert res.details["worst_slice"].startswith(f"{component}/N=") and "(b=" in res.details["worst_slice"]


def test_every_variant_is_checked_and_the_statistic_is_the_worst():
    mech = get("causal")
    out = equivalence._run(mech, Context(quick=True))
    assert out.status == "pass"
    variants = out.details["variants"]
    assert list(variants) == [v.name for v in mech.all_variants]
    assert len(variants) >= 4
    assert out.statistic == max(v["normalised_error"] for v in variants.values())
    assert variants[out.details["worst_variant"]]["normalised_error"] == out.statistic
    assert out.details["float64_max_rel_error"] == max(v["float64_max_rel_error"] for v in variants.values())
    for v in variants.values():
        assert v["protocol"] == "plain"
        assert v["normalised_error"] == max(v[f"{d}_max_rel_error"] / equivalence.TOL[d] for d in equivalence.TOL)
        assert set(v["errors"]) == {f"{d}/N={n}" for d in ("float64", "float32") for n in equivalence.QUICK_SIZES}


def test_problems_are_batched_with_the_equivalence_batch():
    real = get("linear")
    seen = []

    def problem(n, seed, *, batch=()):
        seen.append(batch)
        return real.make_problem(n, seed, batch=batch)

    equivalence._run(dataclasses.replace(real, make_problem=problem), Context(quick=True))
    assert seen and all(b == EQUIVALENCE_BATCH for b in seen)


# ------------------------------------------------------------------------------ per-slice errors


def test_slice_errors_are_per_slice():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 2, 5, 3)) * np.array([1e-3, 1e-1, 1e1, 1e3]).reshape(2, 2, 1, 1)
    got = ref.copy()
    got[0, 0] *= 1 + 1e-3  # the smallest slice off by 1e-3: a global norm would see ~1e-9
    errs = equivalence.slice_errors(ref, torch.as_tensor(got))
    assert errs.shape == (4,)
    assert errs[0] == pytest.approx(1e-3, rel=1e-6) and np.all(errs[1:] == 0)
    global_error = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert global_error < 1e-8  # what a whole-tensor relative error would have reported
    assert equivalence.slice_errors(ref[0, 0], got[0, 0]).shape == (1,)  # unbatched: one slice
    got[1, 1, 0, 0] = np.nan
    assert np.isnan(equivalence.slice_errors(ref, got)[3])
    with pytest.raises(ValueError, match="shape mismatch"):
        equivalence.slice_errors(ref, got[..., :2])


def test_slice_label_names_batch_and_head():
    assert equivalence.slice_label(0) == "(b=0, h=0)"
    assert equivalence.slice_label(1) == "(b=0, h=1)"
    assert equivalence.slice_label(3) == "(b=1, h=1)"
    assert equivalence.slice_label(5, (2, 3)) == "(b=1, h=2)"


def _wrong(real, factor, only_family=None, only_slice=None):
    def setup(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype, requires_grad)
        off = only_family is None or problem.extras.get("tag") == only_family

        def wrong():
            out = run()
            if only_slice is None:
                return out * factor
            scale = torch.ones(out.shape[:-2], dtype=out.dtype).flatten()
            scale[only_slice] = factor
            return out * scale.reshape(*out.shape[:-2], 1, 1)

        return wrong if off else run
    return setup


def test_check_fails_on_a_planted_bug():
    """A fast path off by a relative 1e-6 (far above float64 round-off) must fail the check."""
    real = get("linear")
    res = _check(dataclasses.replace(real, fast_setup=_wrong(real, 1 + 1e-6))).evaluate(Context(quick=True))
    assert res.status == "fail"
    assert res.statistic > res.threshold
    assert res.statistic == pytest.approx(1e-6 / equivalence.TOL["float64"], rel=1e-2)
    assert res.details["worst_component"] == "float64"
    assert res.details["reasons"] and "float64 relative error" in res.details["reasons"][0]


def test_a_bug_in_the_smallest_slice_alone_fails_the_check():
    """Off by 1e-6 in the slice whose values are 1e-3 (norm ~1e-6 of the whole): per-slice errors
    see 1e-6, a whole-tensor error would see ~1e-12 and pass."""
    real = get("linear")
    res = _check(dataclasses.replace(real, fast_setup=_wrong(real, 1 + 1e-6, only_slice=0))).evaluate(Context())
    assert res.status == "fail" and res.details["float64_max_rel_error"] == pytest.approx(1e-6, rel=1e-3)
    assert res.statistic == pytest.approx(1e-6 / equivalence.TOL["float64"], rel=1e-3)
    assert "(b=0, h=0)" in res.details["worst_slice"]
    assert all("(b=0, h=0)" in r for r in res.details["reasons"])


def test_a_bug_in_one_non_default_variant_fails_the_check():
    """Two variants; the fast path is wrong only on the second: the check must see it."""
    real = get("linear")

    def problem(n, seed, *, batch=(), tag="good"):
        p = real.make_problem(n, seed, batch=batch)
        p.extras["tag"] = tag
        return p

    mech = dataclasses.replace(real, id="linear-two-variants", make_problem=problem,
                               variants=(Variant("good", params={"tag": "good"}),
                                         Variant("bad", params={"tag": "bad"})),
                               fast_setup=_wrong(real, 1 + 1e-6, only_family="bad"))
    res = _check(mech).evaluate(Context(quick=True))
    assert res.status == "fail" and res.details["worst_variant"] == "bad"
    assert res.details["variants"]["good"]["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert all("variant 'bad'" in r for r in res.details["reasons"])


def test_check_fails_on_float32_alone():
    """float64 exact, float32 off by 1e-3: fails, and the reason names float32."""
    real = get("linear")

    def setup(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype)
        return (lambda: run() * (1 + 1e-3)) if dtype == torch.float32 else run

    res = _check(dataclasses.replace(real, fast_setup=setup)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic > res.threshold
    assert res.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert res.details["worst_component"] == "float32" and res.details["worst_slice"].startswith("float32/")
    assert res.details["reasons"] and all("float32" in r for r in res.details["reasons"])


def test_check_fails_when_dtype_is_not_kept():
    real = get("linear")

    def wrong_dtype(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype)
        return lambda: run().to(torch.float64)

    with pytest.raises(TypeError, match="returned torch.float64 for torch.float32"):
        equivalence._run(dataclasses.replace(real, fast_setup=wrong_dtype), Context(quick=True))


def test_a_denominator_error_is_a_failure_not_a_crash():
    """A fast path that refuses the problem (DenominatorError) fails with an infinite error."""
    import fast

    real = get("linear")

    def refusing(problem, device, dtype, requires_grad=False):
        def run():
            raise fast.DenominatorError("planted")
        return run

    res = _check(dataclasses.replace(real, fast_setup=refusing)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic == float("inf")
    assert "DenominatorError: planted" in res.details["reasons"][0]


# ------------------------------------------------------------------------------ the profile


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 37, 300])
def test_batched_problems_differ_by_orders_of_magnitude(n, seed):
    """Values span 1e-3 .. 1e3 across slices; the quiet slice's FAVOR+ key exponents lie >= 110
    below every other slice's (float32 underflows at -103.3) and span < 20 within the slice."""
    p = favor_problem(n, seed, batch=EQUIVALENCE_BATCH)
    plain = favor_problem(n, seed)
    assert p.q.shape == p.k.shape == p.v.shape == (*EQUIVALENCE_BATCH, n, 16)
    scale = np.sqrt((p.v.reshape(4, -1) ** 2).mean(1))
    assert scale[-1] / scale[0] > 1e5
    z = (p.k / 2) @ p.projection.T - (p.k ** 2).sum(-1, keepdims=True) / 8  # favor_attention's exponents
    top = z.reshape(4, -1).max(1)
    quiet = favor.QUIET_SLICE
    assert np.delete(top, quiet).min() - top[quiet] > 110
    zq = z.reshape(4, n, -1)[quiet]
    assert (zq.max(0) - zq.min(0)).max() < 20
    np.testing.assert_array_equal(p.projection, plain.projection)
    np.testing.assert_allclose(np.linalg.norm(p.q, axis=-1), 1.0)  # queries keep norm 1


def test_unbatched_problems_are_the_plain_draws():
    from verify.problems import qkv

    p = favor_problem(37, 3)
    q, k, v = qkv(37, 16, 16, seed=3)
    for a, b in ((p.q, q), (p.k, k), (p.v, v)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="batch dims"):
        favor_problem(5, 0, batch=(2, 0))


def test_quiet_direction_is_below_every_feature():
    for seed in range(20):
        w = np.random.default_rng(seed).standard_normal((16, 16))
        assert (w @ favor.quiet_direction(w)).max() < 0


# ------------------------------------------------------------------------------ protocols


def _toeplitz(variant: str):
    mech = get("toeplitz-1d")
    return dataclasses.replace(mech, variants=(mech.variant(variant),))


def test_update_protocol_passes_and_moves_the_output():
    out = equivalence._run(_toeplitz("update"), Context(quick=True))
    assert out.status == "pass", out.details["reasons"]
    v = out.details["variants"]["update"]
    assert v["protocol"] == "update"
    assert {f"float64/N={n}/updated" for n in (37, 300)} <= set(v["errors"])
    assert v["update_move"]["N=300"] >= equivalence.UPDATE_MIN_MOVE
    # the updated call is compared with the UPDATED reference, far from the old one
    assert all(x > 1e-3 for k, x in v["updated_vs_old_reference"].items() if not k.endswith("N=1"))


def _copying(real):
    """The record with a fast mask that copies its parameter (a contract violation: no in-place
    update reaches the operator)."""
    def fast_mask(p, device):
        coeffs = mask_tensor(p.extras["coeffs"], device)
        return real.fast_mask(dataclasses.replace(p, extras={**p.extras, "coeffs": coeffs.detach().clone()}), device)
    return dataclasses.replace(real, fast_setup=favor_fast_setup(fast_mask))


def test_update_protocol_fails_on_a_copied_parameter():
    res = _check(_copying(_toeplitz("update"))).evaluate(Context(quick=True))
    assert res.status == "fail" and res.details["float64_max_rel_error"] > 1e-3 and res.statistic > 1
    assert any("stale cache or a copied parameter" in r for r in res.details["reasons"])


def test_update_that_moves_nothing_fails():
    """mask_params naming an entry neither path reads: the protocol would test nothing."""
    def problem(n, seed, *, batch=()):
        return favor_problem(n, seed, batch=batch, ignored=np.ones(3))

    mech = favor_mechanism("ignored-param", "t", "s", "N", problem=problem, dense_mask=None, fast_mask=None,
                           mask_params=("ignored",), variants=(Variant("update", sweep=False, protocol="update"),))
    res = _check(mech).evaluate(Context(quick=True))
    # the one reason that fails a check whose statistic is within its threshold (documented)
    assert res.status == "fail" and res.statistic <= res.threshold
    assert any("tests nothing" in r for r in res.details["reasons"])


def test_learnable_protocol_checks_the_gradient():
    out = equivalence._run(_toeplitz("learnable"), Context(quick=True))
    assert out.status == "pass", out.details["reasons"]
    v = out.details["variants"]["learnable"]
    assert set(v["grad_rel_error"]) == {f"N={n}" for n in equivalence.QUICK_SIZES}
    assert v["grad_max_rel_error"] <= equivalence.GRAD_TOL
    assert v["normalised_errors"]["gradient"] == v["grad_max_rel_error"] / equivalence.GRAD_TOL
    assert out.statistic == max(v["normalised_errors"].values()) <= 1
    assert out.details["grad_max_rel_error"] == {"learnable": v["grad_max_rel_error"]}
    assert v["grad_unreached"] == {f"N={n}": [] for n in equivalence.QUICK_SIZES}


def test_learnable_protocol_fails_on_a_wrong_gradient():
    """Forward right, gradient scaled by 2 (a custom Function's backward off by a factor)."""
    real = _toeplitz("learnable")

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    def fast_mask(p, device):
        coeffs = mask_tensor(p.extras["coeffs"], device)
        return real.fast_mask(dataclasses.replace(p, extras={**p.extras, "coeffs": Twice.apply(coeffs)}), device)

    res = _check(dataclasses.replace(real, fast_setup=favor_fast_setup(fast_mask))).evaluate(Context(quick=True))
    assert res.status == "fail" and res.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert res.details["grad_max_rel_error"]["learnable"] > 1e-3
    assert res.statistic == res.details["grad_max_rel_error"]["learnable"] / equivalence.GRAD_TOL > 1
    assert res.details["worst_component"] == "gradient"
    assert any("gradient" in r for r in res.details["reasons"])


def test_learnable_protocol_names_the_parameters_autograd_does_not_reach():
    """Forward right, the parameter detached inside the fast path (as the memory-saving backward
    dropped both low-rank factors on the H100's torch 2.11: an output without a graph): autograd's
    gradient is 0, off by the whole derivative, and the reason says which parameter it never reached."""
    real = _toeplitz("learnable")

    def fast_mask(p, device):
        coeffs = mask_tensor(p.extras["coeffs"], device)
        return real.fast_mask(dataclasses.replace(p, extras={**p.extras, "coeffs": coeffs.detach()}), device)

    res = _check(dataclasses.replace(real, fast_setup=favor_fast_setup(fast_mask))).evaluate(Context(quick=True))
    assert res.status == "fail" and res.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    v = res.details["variants"]["learnable"]
    assert v["grad_unreached"] == {f"N={n}": ["coeffs"] for n in equivalence.QUICK_SIZES}
    assert v["grad_max_rel_error"] > 1e-3
    reason = [r for r in res.details["reasons"] if "gradient" in r]
    assert len(reason) == 1 and "autograd reached no gradient of coeffs" in reason[0], reason


@pytest.mark.parametrize("protocol", ["update", "learnable"])
def test_a_protocol_variant_whose_forward_always_raises_fails_without_a_crash(protocol):
    """Every fast call raises DenominatorError: no gradient (learnable) nor updated output (update)
    exists; the check fails with infinite errors and, learnable, says the gradient was not checked."""
    import fast

    def refusing(problem, device, dtype, requires_grad=False):
        def run():
            raise fast.DenominatorError("planted")
        return run

    res = _check(dataclasses.replace(_toeplitz(protocol), fast_setup=refusing)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic == float("inf")
    reasons = res.details["reasons"]
    assert any("DenominatorError: planted" in r for r in reasons)
    if protocol == "learnable":
        assert any("gradient not checked: the float64 forward raised at every N" in r for r in reasons), reasons
        assert res.details["grad_max_rel_error"] == {"learnable": float("inf")}
    else:
        assert not any("stale" in r for r in reasons)
