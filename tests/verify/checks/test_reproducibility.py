"""verify/checks/reproducibility.py: reproducibility/<id> and reproducibility/samplers pass on the
real code, and fail on planted samplers and fast paths that read global RNG state, ignore their
generator, or draw from a fresh OS-seeded one."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import fast
from results.check import Context
from verify.checks import reproducibility as R
from verify.mechanisms import get, mechanisms

REAL = ("linear", "causal", "packing", "padding", "low-rank", "toeplitz-1d")


@pytest.fixture(autouse=True)
def _restore_global_rngs():
    """The planted bugs advance global RNGs on purpose: give the other tests their states back."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


def test_one_check_per_random_mechanism_and_the_samplers():
    ids = [c.id for c in R.checks()]
    assert ids == [f"reproducibility/{m.id}" for m in mechanisms() if m.draw is not None] + ["reproducibility/samplers"]
    assert "reproducibility/softmax" not in ids  # no random part
    for c in R.checks():
        assert (c.threshold, c.compare, c.unit, c.kind, c.quick) == (0.0, "<=", R.UNIT, "reproducibility", True)
    with pytest.raises(ValueError, match="no draw"):
        R.check_for(get("softmax"))


@pytest.mark.parametrize("mech_id", REAL)
def test_passes_on_the_real_code(mech_id):
    res = R.check_for(get(mech_id)).evaluate(Context(quick=True))
    assert res.status == "pass", res.details["reasons"]
    assert res.statistic == 0.0
    assert res.details["same_seed_differs"] == [] and res.details["global_states_moved"] == []
    assert res.details["other_seed_differs"] == ["fast output"]
    assert "problem.projection" in res.details["other_seed_problem_differs"]
    assert res.details["other_seed_relative_difference"] > 1e-3


def test_samplers_pass_on_the_real_code():
    res = R.samplers_check().evaluate(Context(quick=True))
    assert res.status == "pass", res.details["reasons"]
    assert [r["sampler"] for r in res.details["samplers"]] == [s.name for s in R.SAMPLERS]
    assert all(r["ok"] and r["other_seed_differs"] == ["output 0"] for r in res.details["samplers"])


def test_global_state_snapshot_sees_every_generator():
    for advance, name in ((lambda: torch.rand(1), "torch (CPU)"), (lambda: np.random.rand(), "numpy"),
                          (lambda: random.random(), "python")):
        before = R.GlobalState.take()
        assert before.moved(R.GlobalState.take()) == []
        advance()
        moved = before.moved(R.GlobalState.take())
        assert len(moved) == 1 and moved[0].startswith(name)


def test_bitwise_equal_and_differing_arrays():
    a = np.array([1.0, np.nan])
    assert R.bitwise_equal(a, a.copy()) and not R.bitwise_equal(a, np.array([1.0, 0.0]))
    assert not R.bitwise_equal(a, a.astype(np.float32))
    t = torch.tensor([1.0, float("nan")])
    assert R.bitwise_equal(t, t.clone()) and not R.bitwise_equal(t, torch.tensor([1.0, 2.0]))
    p = get("linear").problem(5, 0)
    q = dataclasses.replace(p, projection=np.nextafter(p.projection, np.inf))  # one ulp off
    assert R.differing_arrays(p, p) == [] and R.differing_arrays(p, q) == ["projection"]


# ------------------------------------------------------------------------------ planted samplers


def _global_projection(m, d, *, orthogonal=False, generator=None, device=None, dtype=torch.float32):
    """gaussian_projection that ignores its generator and reads torch's global RNG."""
    return torch.randn(m, d, dtype=torch.float64).to(device=device, dtype=dtype)


def _fresh_projection(m, d, *, orthogonal=False, generator=None, device=None, dtype=torch.float32):
    """gaussian_projection that ignores its generator for a fresh OS-seeded one."""
    g = torch.Generator()
    g.seed()
    return torch.randn(m, d, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def _fixed_projection(m, d, *, orthogonal=False, generator=None, device=None, dtype=torch.float32):
    """gaussian_projection that ignores its generator for a fixed seed."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(m, d, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def test_a_sampler_reading_the_global_rng_fails(monkeypatch):
    monkeypatch.setattr(fast, "gaussian_projection", _global_projection)
    res = R.samplers_check().evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic > res.threshold
    bad = {r["sampler"] for r in res.details["samplers"] if not r["ok"]}
    assert bad == {"fast.gaussian_projection iid", "fast.gaussian_projection orthogonal"}
    fast_rows = [r for r in res.details["samplers"] if r["sampler"].startswith("fast.")]
    assert all(r["global_states_moved"] == ["torch (CPU) global RNG"] and r["same_seed_differs"] for r in fast_rows)
    # and every mechanism drawing through it fails too (favor_draw calls fast.gaussian_projection)
    mres = R.check_for(get("causal")).evaluate(Context(quick=True))
    assert mres.status == "fail"
    assert mres.details["global_states_moved"] == ["torch (CPU) global RNG"]
    assert "fast output" in mres.details["same_seed_differs"]


@pytest.mark.parametrize("bug, reason", [(_fresh_projection, "same seed, different bits"),
                                         (_fixed_projection, "seed s + 1 gave the same ")])
def test_a_sampler_ignoring_its_generator_fails(monkeypatch, bug, reason):
    monkeypatch.setattr(fast, "gaussian_projection", bug)
    for res in (R.samplers_check().evaluate(Context(quick=True)), R.check_for(get("linear")).evaluate(Context(quick=True))):
        assert res.status == "fail"
        assert any(reason in r for r in res.details["reasons"])
        assert not any("global RNG" in r for r in res.details["reasons"])


def test_a_reference_sampler_reading_numpys_global_rng_fails(monkeypatch):
    import reference.features as ref_features

    real = ref_features.gaussian_projection
    monkeypatch.setattr(ref_features, "gaussian_projection",
                        lambda m, d, rng, orthogonal=False: real(m, d, rng, orthogonal) + 0 * np.random.rand())
    res = R.samplers_check().evaluate(Context(quick=True))
    assert res.status == "fail"
    assert {r["sampler"] for r in res.details["samplers"] if not r["ok"]} == {
        "reference.features.gaussian_projection iid", "reference.features.gaussian_projection orthogonal"}
    assert all("numpy global RNG (np.random)" in r for r in res.details["reasons"])


# ------------------------------------------------------------------------------ planted fast paths


@pytest.mark.parametrize("touch, name", [(lambda: torch.rand(1), "torch (CPU) global RNG"),
                                         (lambda: np.random.rand(), "numpy global RNG (np.random)"),
                                         (lambda: random.random(), "python random module")])
def test_a_fast_path_touching_a_global_rng_fails(touch, name):
    """A runner that draws from a global RNG for nothing: outputs stay reproducible, the state moves."""
    real = get("causal")

    def setup(problem, device, dtype, requires_grad=False):
        run = real.fast_setup(problem, device, dtype, requires_grad)

        def runner():
            touch()
            return run()
        return runner

    res = R.check_for(dataclasses.replace(real, fast_setup=setup)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic == 1.0
    assert res.details["same_seed_differs"] == [] and res.details["global_states_moved"] == [name]


def test_a_fast_path_ignoring_the_draw_fails():
    """A linear fast path that caches its projection by shape (the first W it sees): the draw
    follows its generator (problem.projection changes with the seed) and outputs are reproducible,
    but seed s + 1 gives the same output. A changed problem alone must not pass condition 2."""
    real = get("linear")
    cache = {}

    def setup(problem, device, dtype, requires_grad=False):
        w = cache.setdefault(problem.projection.shape, problem.projection)
        return real.fast_setup(dataclasses.replace(problem, projection=w), device, dtype, requires_grad)

    res = R.check_for(dataclasses.replace(real, fast_setup=setup)).evaluate(Context(quick=True))
    assert res.status == "fail" and res.statistic == 1.0
    assert res.details["reasons"] == [R.SAME_OUTPUT]
    assert res.details["same_seed_differs"] == [] and res.details["global_states_moved"] == []
    assert res.details["other_seed_differs"] == []
    assert res.details["other_seed_problem_differs"] == ["problem.projection"]
    assert res.details["other_seed_relative_difference"] == 0.0
