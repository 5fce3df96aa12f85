"""verify/checks/equivalence.py: one check per mechanism over every variant, and a planted bug
(in the default variant or in one other variant only) makes it fail."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from verify.checks import equivalence
from verify.mechanisms import get, mechanisms
from verify.registry import Variant
from verify.result import Context


def _check(mech):
    return equivalence.check_for(mech)


def test_one_check_per_mechanism():
    checks = equivalence.checks()
    assert [c.id for c in checks] == [f"equivalence/{m.id}" for m in mechanisms()]
    assert all(c.kind == "equivalence" and c.quick for c in checks)
    assert all((c.threshold, c.compare, c.unit) == (equivalence.TOL["float64"], "<=", "relative") for c in checks)
    assert [c.source for c in checks] == [m.source for m in mechanisms()]


def test_check_passes_on_the_real_mechanism():
    check = next(c for c in equivalence.checks() if c.id == "equivalence/linear")
    res = check.evaluate(Context(quick=True))
    assert res.status == "pass" and res.kind == "equivalence" and res.id == "equivalence/linear"
    assert res.statistic <= res.threshold == equivalence.TOL["float64"] and res.compare == "<="
    assert res.details["float32_max_rel_error"] <= equivalence.TOL["float32"]
    assert list(res.details["variants"]) == ["default"] and res.details["reasons"] == []


def test_every_variant_is_checked_and_the_statistic_is_the_worst():
    mech = get("tree-diam")
    out = equivalence._run(mech, Context(quick=True))
    assert out.status == "pass"
    variants = out.details["variants"]
    assert list(variants) == [v.name for v in mech.all_variants]
    assert len(variants) == 6
    assert out.statistic == max(v["float64_max_rel_error"] for v in variants.values())
    assert variants[out.details["worst_variant"]]["float64_max_rel_error"] == out.statistic
    for v in variants.values():
        assert set(v["errors"]) == {f"{d}/N={n}" for d in ("float64", "float32") for n in equivalence.QUICK_SIZES}


def _wrong(real, factor, only_family=None):
    def setup(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype, requires_grad)
        off = only_family is None or problem.extras.get("tag") == only_family
        return (lambda: run() * factor) if off else run
    return setup


def test_check_fails_on_a_planted_bug():
    """A fast path off by a relative 1e-6 (far above float64 round-off) must fail the check."""
    real = get("linear")
    res = _check(dataclasses.replace(real, fast_setup=_wrong(real, 1 + 1e-6))).evaluate(Context(quick=True))
    assert res.status == "fail"
    assert res.statistic > res.threshold
    assert res.details["reasons"] and "float64 relative error" in res.details["reasons"][0]


def test_a_bug_in_one_non_default_variant_fails_the_check():
    """Two variants; the fast path is wrong only on the second: the check must see it."""
    real = get("linear")

    def problem(n, seed, tag="good"):
        p = real.make_problem(n, seed)
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
    assert res.status == "fail" and res.statistic <= res.threshold
    assert res.details["reasons"] and all("float32" in r for r in res.details["reasons"])


def test_check_fails_when_dtype_is_not_kept():
    real = get("linear")

    def wrong_dtype(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype)
        return lambda: run().to(torch.float64)

    with pytest.raises(TypeError, match="returned torch.float64 for torch.float32"):
        equivalence._run(dataclasses.replace(real, fast_setup=wrong_dtype), Context(quick=True))
