"""verify/registry.py: the records are well formed, and every mechanism's fast path equals its
reference on small random problems (float64 to 1e-10, float32 to 1e-4 relative Frobenius error:
helpers.EQUIV_TOL)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers import EQUIV_TOL
from verify import registry
from verify.registry import COMPLEXITY_CLASSES, get, mechanisms, register, relative_error

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
    problem = mech.make_problem(n, seed=n)
    expected = mech.reference(problem)
    assert expected.dtype == np.float64 and np.isfinite(expected).all()
    for dtype in (torch.float64, torch.float32):
        got = mech.fast(problem, "cpu", dtype)
        assert got.dtype == dtype
        assert relative_error(expected, got) <= EQUIV_TOL[dtype]


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
