"""verify/checks/equivalence.py: one check per mechanism, and a planted bug makes it fail."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from verify.checks import equivalence
from verify.registry import get, mechanisms
from verify.result import Context


def test_one_check_per_mechanism():
    ids = [c.id for c in equivalence.checks()]
    assert ids == [f"equivalence/{m.id}" for m in mechanisms()]
    assert all(c.kind == "equivalence" and c.quick for c in equivalence.checks())


def test_check_passes_on_the_real_mechanism():
    res = equivalence._run(get("linear"), Context(quick=True))
    assert res.status == "pass" and res.kind == "equivalence"
    assert res.statistic <= res.threshold == equivalence.TOL["float64"]
    assert res.details["float32_max_rel_error"] <= equivalence.TOL["float32"]


def test_check_fails_on_a_planted_bug():
    """A fast path off by a relative 1e-6 (far above float64 round-off) must fail the check."""
    real = get("linear")

    def wrong_setup(problem, device, dtype):
        run = real.fast_setup(problem, device, dtype)
        return lambda: run() * (1 + 1e-6)

    res = equivalence._run(dataclasses.replace(real, fast_setup=wrong_setup), Context(quick=True))
    assert res.status == "fail"
    assert res.statistic > res.threshold


def test_check_fails_when_dtype_is_not_kept():
    real = get("linear")

    def wrong_dtype(problem, device, dtype):
        run = real.fast_setup(problem, device, dtype)
        return lambda: run().to(torch.float64)

    with pytest.raises(TypeError, match="returned torch.float64 for torch.float32"):
        equivalence._run(dataclasses.replace(real, fast_setup=wrong_dtype), Context(quick=True))
