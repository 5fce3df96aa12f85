"""verify/checks/choromanski22/positional.py: the structural helper is exact, the four checks pass on the real
code, and planted bugs make the deterministic ones fail."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fast
from reference.masks import toeplitz as ref_toeplitz
from results.check import Context
from verify.checks import all_checks
from verify.checks.choromanski22 import positional as P

seeds = st.integers(0, 2**31 - 1)
grid_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)

DOCUMENTED = {
    "choromanski22/lemma-3.3": "bound",
    "choromanski22/section-4.1": "bound",
    "choromanski22/section-4.1-grid": "erratum",
    "choromanski22/section-3.4": "statistical",
}


def _block(shape, rng, integers=False):
    want = tuple(2 * s - 1 for s in shape)
    table = rng.integers(-50, 50, want).astype(float) if integers else rng.standard_normal(want)
    return ref_toeplitz.block_toeplitz_mask(shape, table)


# ------------------------------------------------------------------- block_toeplitz_deviation


@given(shape=grid_shapes, seed=seeds)
def test_deviation_is_zero_for_block_toeplitz(shape, seed):
    assert P.block_toeplitz_deviation(_block(shape, np.random.default_rng(seed)), shape) == 0.0


@given(shape=grid_shapes, seed=seeds, a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_deviation_detects_a_changed_entry_iff_its_offset_repeats(shape, seed, a, b):
    """Changing M[a, b] by eps breaks the structure exactly when offset x_a - y_b occurs for more
    than one pair, i.e. prod_k (n_k - |delta_k|) > 1; the deviation is then |eps| (integer table:
    exact). An offset that occurs once (e.g. the corner M[0, N-1]) is a free parameter."""
    m = _block(shape, np.random.default_rng(seed), integers=True)
    n = m.shape[0]
    a, b = a % n, b % n
    delta = np.subtract(np.unravel_index(a, shape), np.unravel_index(b, shape))
    multiplicity = math.prod(s - abs(int(d)) for s, d in zip(shape, delta))
    m[a, b] += 0.25
    assert P.block_toeplitz_deviation(m, shape) == (0.25 if multiplicity > 1 else 0.0)


@pytest.mark.parametrize("shape", [(3,), (7,), (3, 5), (5, 3), (2, 3, 4), (3, 1, 2)])
def test_deviation_detects_reordered_nodes(shape):
    rng = np.random.default_rng(1)
    m = _block(shape, rng)
    n = m.shape[0]
    swap = np.arange(n)
    swap[[0, 1]] = [1, 0]
    assert P.block_toeplitz_deviation(m[np.ix_(swap, swap)], shape) > 0.1
    perm = np.random.default_rng(2).permutation(n)
    assert P.block_toeplitz_deviation(m[np.ix_(perm, perm)], shape) > 0.1
    if len(set(shape)) > 1:
        colmajor = np.arange(n).reshape(shape).transpose(*range(len(shape) - 1, -1, -1)).ravel()
        assert P.block_toeplitz_deviation(m[np.ix_(colmajor, colmajor)], shape) > 0.1


def test_deviation_of_a_one_level_matrix_is_the_toeplitz_defect():
    m = ref_toeplitz.toeplitz_mask(np.arange(7.0))
    assert P.block_toeplitz_deviation(m, (4,)) == 0.0
    m[2, 1] += 3.0
    assert P.block_toeplitz_deviation(m, (4,)) == 3.0


def test_deviation_rejects_levels_of_another_size():
    with pytest.raises(ValueError, match="levels"):
        P.block_toeplitz_deviation(np.zeros((6, 6)), (4,))
    with pytest.raises(ValueError, match="levels"):
        P.block_toeplitz_deviation(np.zeros((6, 6)), (2, 2))


# ------------------------------------------------------------------------------- the checks


def _evaluate(check_id: str, ctx: Context | None = None):
    check = next(c for c in P.checks() if c.id == check_id)
    return check.evaluate(ctx or Context(quick=True, seed=0))


def test_checks_are_the_documented_ones_and_registered():
    got = {c.id: c.kind for c in P.checks()}
    assert got == DOCUMENTED
    assert all(c.quick for c in P.checks())
    assert set(DOCUMENTED) <= {c.id for c in all_checks()}
    assert all(c.compare and c.threshold is not None for c in P.checks())
    assert {c.id: c.compare for c in P.checks()}["choromanski22/section-4.1-grid"] == ">"  # an erratum: must exceed


@pytest.mark.parametrize("check", P.checks(), ids=lambda c: c.id)
def test_check_passes_at_seed_0(check):
    res = check.evaluate(Context(quick=True, seed=0))
    assert (res.id, res.kind, res.title, res.source) == (check.id, DOCUMENTED[check.id], check.title, check.source)
    assert res.details["reasons"] == []
    assert res.status == "pass", res.details
    assert math.isfinite(res.statistic) and res.threshold is not None
    if res.kind == "erratum":
        assert res.statistic > res.threshold  # the printed claim fails by more than the floor
    else:
        assert res.statistic <= res.threshold
    res.to_dict()  # serialisable


def test_lemma_33_fails_on_column_major_order(monkeypatch):
    real = ref_toeplitz.block_toeplitz_mask

    def column_major(shape, table, **kw):
        m = real(shape, table, **kw)
        order = np.arange(m.shape[0]).reshape(shape).transpose(*range(len(shape) - 1, -1, -1)).ravel()
        return m[np.ix_(order, order)]

    monkeypatch.setattr(P.ref_toeplitz, "block_toeplitz_mask", column_major)
    res = _evaluate("choromanski22/lemma-3.3")
    assert res.status == "fail" and res.statistic > 0
    assert any("dense reference mask deviates" in r for r in res.details["reasons"])


def test_section_41_fails_on_a_wrong_diffusion_time(monkeypatch):
    real = fast.HypercubeDiffusionMask
    monkeypatch.setattr(P.fast, "HypercubeDiffusionMask", lambda n, lam: real(n, lam * 1.001))
    res = _evaluate("choromanski22/section-4.1")
    assert res.status == "fail" and res.statistic > res.threshold and res.reasons


def test_lemma_33_fails_when_the_controls_cannot_fail(monkeypatch):
    """A deviation measure that sees nothing (always 0) passes the reference but not the controls."""
    monkeypatch.setattr(P, "block_toeplitz_deviation", lambda m, levels: 0.0)
    res = _evaluate("choromanski22/lemma-3.3")
    assert res.status == "fail" and res.statistic == 0.0
    assert len(res.details["reasons"]) == 1 and "negative control" in res.details["reasons"][0]
