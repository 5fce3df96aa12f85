"""features/<map>-*: the feature-map checks pass on the real maps and fail on planted bugs.

Each planted bug lives in this file only (a subclass or wrapper of the real map, handed to
features.checks_for as a copy of the table row; or a sampler patched for one test), and must
fail the check of its kind at the --quick settings (seed 0). The projections are drawn once per
(implementation, row kind) for the whole module (a cache around features._projection), so the
planted maps cost one feature evaluation each.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import fast
import reference.features as ref_features
from results.check import Context
from verify.checks import all_checks, features as F

CTX = Context(quick=True, seed=0)


@pytest.fixture(scope="module", autouse=True)
def shared_projections():
    """Draw each W once for the module; the key includes the sampler so a patched one redraws."""
    original, store = F._projection, {}

    def cached(impl, orthogonal, draws, seed):
        key = (impl, orthogonal, draws, seed, fast.gaussian_projection, ref_features.gaussian_projection)
        if key not in store:
            store[key] = original(impl, orthogonal, draws, seed)
        return store[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "_projection", cached)
        yield
    store.clear()
    F._CACHE.clear()


def _run(spec, what):
    check = {c.id.rsplit("-", 1)[1]: c for c in F.checks_for(spec)}[what]
    return check.evaluate(CTX)


# ------------------------------------------------------------------ planted bugs (copies of the maps)


class TrigHalfNorm(fast.TrigRFF):
    """Normalised by 1/sqrt(2m) (the hyperbolic map's constant) instead of 1/sqrt(m)."""

    def forward(self, x, is_query=False, key_stabilizer=None):
        return super().forward(x, is_query) / math.sqrt(2)


class TrigQuerySign(fast.TrigRFF):
    """Queries [cos, -sin], keys [cos, sin] (a missing complex conjugate): estimates exp(-x.y).
    (The same sign on both sides would be the same estimator, not a bug.)"""

    def forward(self, x, is_query=False, key_stabilizer=None):
        out = super().forward(x, is_query)
        if is_query:
            out = torch.cat([out[..., : self.m], -out[..., self.m:]], dim=-1)
        return out


class HyperbolicDoubleNorm(fast.Hyperbolic):
    """Normalised by 1/sqrt(m) instead of 1/sqrt(2m)."""

    def forward(self, x, is_query=False, key_stabilizer=None):
        return super().forward(x, is_query, key_stabilizer) * math.sqrt(2)


class HyperbolicDroppedMinus(fast.Hyperbolic):
    """Second half exp(+W x - |x|^2/2): still unbiased (two FAVOR+ copies of each row), but the
    variance is FAVOR+'s, 2 / (1 - exp(-|x+y|^2)) times the hyperbolic one."""

    def forward(self, x, is_query=False, key_stabilizer=None):
        x, p = self._project(x)
        half = 0.5 * (x * x).sum(-1, keepdim=True)
        return torch.exp(torch.cat([p - half, p - half], dim=-1)) / math.sqrt(2 * self.m)


def reuse_rows(w: torch.Tensor) -> torch.Tensor:
    """Correlated features: rows 2i and 2i + 1 are the same w (m/2 directions, each used twice):
    the mean is unchanged, the variance doubles."""
    return w.reshape(-1, 2, w.shape[-1])[:, :1].expand(-1, 2, -1).reshape(w.shape)


PLANTED = {  # name -> (the table row with the bug, the check that must fail)
    "trig-normalisation": (replace(F.TRIG_RFF, fast=lambda w: TrigHalfNorm(w)), "unbiased"),
    "trig-query-sign": (replace(F.TRIG_RFF, fast=lambda w: TrigQuerySign(w)), "unbiased"),
    "trig-rows-reused": (replace(F.TRIG_RFF, fast=lambda w: fast.TrigRFF(reuse_rows(w))), "variance"),
    "trig-reference-normalisation": (
        replace(F.TRIG_RFF, reference=lambda x, w: ref_features.trig_rff(x, w) / math.sqrt(2)), "unbiased"),
    "hyperbolic-normalisation": (
        replace(F.HYPERBOLIC, fast=lambda w: HyperbolicDoubleNorm(w, stabilize=False)), "unbiased"),
    "hyperbolic-dropped-minus": (
        replace(F.HYPERBOLIC, fast=lambda w: HyperbolicDroppedMinus(w, stabilize=False)), "variance"),
    "hyperbolic-rows-reused": (
        replace(F.HYPERBOLIC, fast=lambda w: fast.Hyperbolic(reuse_rows(w), stabilize=False)), "variance"),
}


# ------------------------------------------------------------------ the table and the real maps


def test_ids_one_pair_per_row_and_favor_plus_keeps_its_performer_ids():
    ids = [c.id for c in F.checks()]
    assert ids == ["features/trig-rff-unbiased", "features/trig-rff-variance",
                   "features/hyperbolic-unbiased", "features/hyperbolic-variance"]
    every = [c.id for c in all_checks()]
    assert set(ids) <= set(every)
    assert {"performer/prf-unbiased-iid", "performer/prf-variance-orf"} <= set(every)
    assert not any(i.startswith("features/favor") for i in every)
    for c in F.checks():
        assert (c.kind, c.compare, c.threshold, c.unit) == ("statistical", "<=", 1.0, "ratio")


@pytest.mark.parametrize("spec", list(F.FEATURE_MAPS.values()), ids=list(F.FEATURE_MAPS))
def test_every_row_is_consistent(spec):
    """The closed-form variance equals (E Y^2 - (E Y)^2) / m, E Y = exp(x.y), and the fast and
    reference maps give the same features on the same W."""
    x, y = F.pairs(3, spec.norm)[0]
    assert spec.moments(x, y, 1) == pytest.approx(math.exp(float(x @ y)), rel=1e-12)
    assert spec.variance(x, y, F.M) == pytest.approx((spec.moments(x, y, 2) - spec.moments(x, y, 1) ** 2) / F.M,
                                                     rel=1e-10)
    w = np.random.default_rng(0).standard_normal((F.M, F.D))
    got = spec.fast(torch.as_tensor(w))(torch.as_tensor(x[None]), is_query=True).numpy()
    assert got.shape == (1, spec.width * F.M)
    np.testing.assert_allclose(got, spec.reference(x[None], w), rtol=1e-12)


@pytest.mark.parametrize("spec", [F.TRIG_RFF, F.HYPERBOLIC], ids=["trig-rff", "hyperbolic"])
@pytest.mark.parametrize("what", ["unbiased", "variance"])
def test_real_maps_pass(spec, what):
    r = _run(spec, what)
    assert r.status == "pass", r.reasons
    assert 0 <= r.statistic <= 1.0
    cases = r.details["cases"]
    assert len(cases) == (12 if what == "unbiased" else 6)  # 2 impls x 3 pairs (x 2 row kinds for the mean)
    assert {c["impl"] for c in cases} == {"fast", "reference"}
    assert r.details["delta_per_case"] == pytest.approx(r.details["alpha"] / len(cases))


# ------------------------------------------------------------------ planted bugs fail


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_fails_its_check(name):
    spec, what = PLANTED[name]
    r = _run(spec, what)
    assert r.status == "fail"
    assert r.statistic > 1.0
    impl = "reference" if "reference" in name else "fast"
    assert r.reasons and all(reason.startswith(impl) for reason in r.reasons), r.reasons


def test_orthogonal_rows_with_fixed_norms_fail_the_trig_mean(monkeypatch):
    """ORF rows rescaled to the constant sqrt(d) instead of independent chi(d) norms: rows no
    longer N(0, I) marginally, E cos(w.u) != exp(-|u|^2/2); only the orthogonal cases fail."""
    real = fast.gaussian_projection

    def fixed_norms(m, d, *, orthogonal=False, **kw):
        w = real(m, d, orthogonal=orthogonal, **kw)
        return w / w.norm(dim=1, keepdim=True) * math.sqrt(d) if orthogonal else w

    monkeypatch.setattr(fast, "gaussian_projection", fixed_norms)
    # a fresh cache, and only this map drawn: estimates from the real sampler must not answer, and
    # the patched draws must not reach the cache that the other tests read
    monkeypatch.setattr(F, "_CACHE", {})
    monkeypatch.setattr(F, "FEATURE_MAPS", {})
    r = _run(F.TRIG_RFF, "unbiased")
    assert r.status == "fail" and r.statistic > 1.0
    assert r.reasons and all(reason.startswith("fast orthogonal") for reason in r.reasons), r.reasons


def test_a_normalisation_that_depends_on_m_cannot_hide_in_the_batched_draws():
    """1/m instead of 1/sqrt(m): R draws batched as one W would rescale it by R; the per-draw
    comparison refuses."""
    spec = replace(F.TRIG_RFF, fast=lambda w: _Scaled(w, 1 / math.sqrt(w.shape[0])))
    with pytest.raises(AssertionError, match="not the batched"):
        F.estimates(spec, "fast", False, 2000, 0)


class _Scaled(fast.TrigRFF):
    def __init__(self, w, factor):
        super().__init__(w)
        self.factor = factor

    def forward(self, x, is_query=False, key_stabilizer=None):
        return super().forward(x, is_query) * self.factor


# ------------------------------------------------------------------ the cache (last: it drops seed 0's estimates)


def test_estimates_are_cached_for_one_seed_only():
    a = F.estimates(F.TRIG_RFF, "fast", False, 2000, 11)
    assert F.estimates(F.TRIG_RFF, "fast", False, 2000, 11) is a
    assert any(k[0] is F.HYPERBOLIC for k in F._CACHE)  # one draw of W served every map of the table
    F.estimates(F.TRIG_RFF, "fast", False, 2000, 12)
    assert all(k[3:] == (2000, 12) for k in F._CACHE)
