"""verify/registry.py and the loader verify.mechanisms: the records are well formed (variants,
scale flags, cost factors, metrics), and every mechanism's fast path equals its reference on small
random problems, every variant included (float64 to 1e-10, float32 to 1e-4 relative Frobenius
error: helpers.EQUIV_TOL)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers import EQUIV_TOL
from verify import registry
from verify.mechanisms import get, mechanisms
from verify.registry import COMPLEXITY_CLASSES, COST_FACTOR_CLASSES, Variant, register, relative_error

MECHS = mechanisms()
IDS = [m.id for m in MECHS]
#: N = 1, below the causal chunk (64), a non-multiple of it, and above 512 (two packed segments)
SIZES = (1, 9, 70, 530)


def test_ids_unique_and_stable():
    assert len(IDS) == len(set(IDS))
    assert {"softmax", "linear", "causal", "packing", "padding"} <= set(IDS)
    assert [m.id for m in mechanisms()] == IDS  # repeated loading registers nothing twice


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_record_fields(mech):
    assert mech.complexity in COMPLEXITY_CLASSES
    assert mech.title and mech.source
    for sizes in (mech.fast_sizes, mech.dense_sizes, mech.quick_fast_sizes, mech.quick_dense_sizes):
        assert list(sizes) == sorted(set(sizes))
        assert all(n > 0 and n & (n - 1) == 0 for n in sizes)  # powers of two (docs/methods.md)
    assert get(mech.id) is mech


def _sizes_ok(sizes) -> bool:
    return list(sizes) == sorted(set(sizes)) and all(n > 0 and n & (n - 1) == 0 for n in sizes)


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_variants_are_well_formed(mech):
    variants = mech.all_variants
    assert variants and mech.default_variant == variants[0] and mech.variant() == variants[0]
    assert len({v.name for v in variants}) == len(variants)
    for v in variants:
        assert isinstance(v, Variant) and mech.variant(v.name) == v
        for impl in ("fast", "dense"):
            for quick in (True, False):
                sizes = mech.sizes(impl, quick, v)
                assert sizes and _sizes_ok(sizes), (v.name, impl, quick)
                assert mech.sizes(impl, quick, v.name) == sizes
        # the quick grid never goes beyond the full one
        assert max(mech.sizes("fast", True, v)) <= max(mech.sizes("fast", False, v))
    with pytest.raises(KeyError, match="has no variant 'no-such'"):
        mech.variant("no-such")


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_every_variants_problem_builds_at_small_n(mech):
    for v in mech.all_variants:
        for n in (1, 2, 9):
            n = mech.admissible(n)
            p = mech.problem(n, 3, v)
            assert p.n == n and p.q.shape[-2] == n
            assert mech.reference(p).shape == (n, mech.output_columns or p.v.shape[-1])
            if mech.dense_mask is not None:
                assert mech.dense_mask(p).shape == (n, n)
    # the default variant's problem is make_problem's own: callers without a variant agree
    default, plain = mech.problem(16, 1), mech.make_problem(16, 1)
    assert default.extras.keys() == plain.extras.keys()
    for key in default.extras:
        assert np.array_equal(default.extras[key], plain.extras[key])


@pytest.mark.parametrize("mech", [m for m in MECHS if len(m.all_variants) > 1], ids=lambda m: m.id)
def test_variants_are_different_problems(mech):
    """Each declared variant changes the problem (else it would time the same thing twice)."""
    seen = []
    for v in mech.all_variants:
        p = mech.problem(64, 0, v)
        key = tuple(np.asarray(p.extras[k]).tobytes() for k in sorted(p.extras))
        if v.protocol != "plain":  # update/learnable rerun a plain variant's problem under another protocol
            assert key in seen, v.name
            continue
        assert key not in seen, v.name
        seen.append(key)


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_cost_factors_and_metrics(mech):
    if mech.complexity in COST_FACTOR_CLASSES:
        assert mech.cost_factor is not None and mech.cost_factor_name
    else:
        assert mech.cost_factor is None
    for v in mech.all_variants:
        p = mech.problem(mech.admissible(64), 0, v)
        if mech.cost_factor is not None:
            assert float(mech.cost_factor(p)) >= 1
        if mech.metrics is not None:
            metrics = mech.metrics(p)
            assert metrics and all(np.isfinite(float(x)) for x in metrics.values())
            for name in metrics:
                if name.endswith(" bound"):
                    assert name[: -len(" bound")] in metrics  # "X bound" bounds metric X
                    assert metrics[name[: -len(" bound")]] <= metrics[name]


def test_n_plus_e_is_a_cost_factor_class():
    """ "N + E" (a graph's nodes plus stored edges) is "N" times the cost factor (N + |E|) / N: the
    record must declare that factor, the time line is N x factor = N + |E|, and the slope tested
    on time / factor is the class "N"'s."""
    from verify.checks.complexity import claim_rule, tested_class
    from measure.scale_worker import class_size

    assert "N + E" in COMPLEXITY_CLASSES and COST_FACTOR_CLASSES["N + E"] == "N"
    assert tested_class("N + E") == "N" and claim_rule("N + E") == claim_rule("N")
    base = get("linear")
    fields = dict(id="x", title="t", source="s", make_problem=base.make_problem, reference=base.reference,
                  fast_setup=base.fast_setup)
    with pytest.raises(ValueError, match="N \\+ E"):
        registry.Mechanism(complexity="N + E", **fields)  # no cost factor
    with pytest.raises(ValueError, match="cost_factor_name"):
        registry.Mechanism(complexity="N + E", cost_factor=lambda p: 3.0, **fields)
    made = registry.Mechanism(complexity="N + E", cost_factor=lambda p: 3.0, cost_factor_name="(N+E)/N", **fields)
    assert made.cost_factor(None) == 3.0
    n, edges = 1000, 4000  # a 4-regular graph stores 2 x 2 N entries
    assert class_size("N + E", n, cost_factor=(n + edges) / n) == pytest.approx(n + edges)
    with pytest.raises(ValueError, match="cost factor"):
        class_size("N + E", n)
    with pytest.raises(ValueError, match="complexity must be one of"):
        registry.Mechanism(complexity="N + V", **fields)


def test_scale_flags():
    assert {m.id for m in MECHS if m.scale} == {"linear", "causal", "block-toeplitz", "tree-exp", "grf", "nodeformer",
                                                "sgformer"}
    assert {m.id for m in MECHS if m.scale_train} == {"linear", "causal", "block-toeplitz", "grf", "nodeformer",
                                                      "sgformer"}


def test_register_refuses_duplicate_id(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    existing = get("linear")
    with pytest.raises(ValueError, match="'linear' is already registered"):
        register(existing)
    with pytest.raises(ValueError, match="already registered"):
        register(dataclasses.replace(existing, title="another title"))
    new = dataclasses.replace(existing, id="linear-copy")
    assert register(new) is new
    assert get("linear-copy") is new
    assert mechanisms()[-1] is new  # registration order


def test_register_a_new_record_leaves_the_real_registry_alone():
    assert "linear-copy" not in IDS
    with pytest.raises(KeyError):
        get("linear-copy")


def test_get_unknown_lists_known_ids():
    with pytest.raises(KeyError, match=r"unknown mechanism 'no-such'; known: .*softmax.*padding") as info:
        get("no-such")
    for mech_id in IDS:
        assert mech_id in str(info.value)


def test_mechanism_rejects_unknown_complexity():
    base = get("linear")
    with pytest.raises(ValueError, match="complexity must be one of"):
        dataclasses.replace(base, complexity="N^1.5")


def test_mechanism_without_dense_twin_says_so():
    softmax = get("softmax")
    assert softmax.dense_setup is None
    with pytest.raises(ValueError, match="no dense twin"):
        softmax.dense(softmax.make_problem(4, 0))


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_fast_setup_requires_grad(mech):
    """requires_grad=True: the runner's output has a graph down to q, k, v (scale/<id>-train)."""
    p = mech.problem(mech.admissible(16), 0)
    out = mech.fast_setup(p, "cpu", torch.float64, requires_grad=True)()
    assert out.requires_grad
    out.sum().backward()
    assert mech.fast_setup(p, "cpu", torch.float64)().requires_grad is False
    plain = mech.fast_setup(p, "cpu", torch.float64)()
    torch.testing.assert_close(out.detach(), plain, rtol=0, atol=0)


def test_relative_error():
    r = np.array([[3.0, 4.0]])
    assert relative_error(r, r) == 0.0
    assert relative_error(r, np.array([[3.0, 4.0 + 0.5]])) == pytest.approx(0.1, rel=1e-15)
    assert relative_error(r, torch.tensor([[3.0, 3.5]], dtype=torch.float64)) == pytest.approx(0.1, rel=1e-15)
    assert relative_error(np.zeros(2), np.zeros(2)) == 0.0
    with pytest.raises(ValueError, match="shape mismatch"):
        relative_error(r, r.T)


# ----------------------------------------------------------------- fast == reference, per id


@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_make_problem_is_deterministic(mech):
    n = mech.admissible(33)
    a, b, c = mech.make_problem(n, 5), mech.make_problem(n, 5), mech.make_problem(n, 6)
    assert a.n == n
    for name in ("q", "k", "v", "projection"):
        x, y, z = getattr(a, name), getattr(b, name), getattr(c, name)
        if x is None:
            continue
        assert np.array_equal(x, y)
        assert not np.allclose(x, z)
    assert a.extras.keys() == b.extras.keys()
    for key in a.extras:
        assert np.array_equal(a.extras[key], b.extras[key])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("mech", MECHS, ids=IDS)
def test_fast_matches_reference(mech, n):
    n = mech.admissible(n)
    problem = mech.problem(n, seed=n)
    expected = mech.reference(problem)
    assert expected.dtype == np.float64 and np.isfinite(expected).all()
    for dtype in (torch.float64, torch.float32):
        got = mech.fast(problem, "cpu", dtype)
        assert got.dtype == dtype
        assert relative_error(expected, got) <= EQUIV_TOL[dtype]


VARIANT_CASES = [(m, v) for m in MECHS for v in m.all_variants[1:]]


@pytest.mark.parametrize("mech, variant", VARIANT_CASES, ids=[f"{m.id}-{v.name}" for m, v in VARIANT_CASES])
def test_fast_matches_reference_on_every_variant(mech, variant):
    for n in (1, 70):
        problem = mech.problem(mech.admissible(n), 4, variant)
        expected = mech.reference(problem)
        for dtype in (torch.float64, torch.float32):
            assert relative_error(expected, mech.fast(problem, "cpu", dtype)) <= EQUIV_TOL[dtype]
        if mech.dense_setup is not None:
            assert relative_error(expected, mech.dense(problem, "cpu", torch.float64)) <= EQUIV_TOL[torch.float64]


@pytest.mark.parametrize("mech", [m for m in MECHS if m.dense_setup is not None], ids=lambda m: m.id)
def test_dense_twin_matches_reference(mech):
    problem = mech.make_problem(mech.admissible(70), seed=1)
    got = mech.dense(problem, "cpu", torch.float64)
    assert relative_error(mech.reference(problem), got) <= EQUIV_TOL[torch.float64]


@pytest.mark.parametrize("mech", [m for m in MECHS if m.dense_mask is not None], ids=lambda m: m.id)
def test_dense_mask_is_nonnegative_n_by_n(mech):
    n = mech.admissible(20)
    problem = mech.make_problem(n, seed=2)
    mask = mech.dense_mask(problem)
    assert mask.shape == (n, n)
    assert (mask >= 0).all() and (mask.sum(axis=1) > 0).all()  # every query sees some key
