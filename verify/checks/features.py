"""features/<map>-*: random feature maps estimate exp(x.y) without bias, with the stated variance.

One table row per random feature map (FEATURE_MAPS: fast/ constructor, reference/ function, the
exact moments of one feature product). A row gets two checks, for both implementations:

    features/<map>-unbiased  E[phi(x).phi(y)] = exp(x.y), iid rows and orthogonal rows (ORF)
    features/<map>-variance  Var[phi(x).phi(y)] = the closed form of the row, iid rows

The estimator of every map is Z = (1/m) sum_k Y(w_k), a mean of m feature products of one row
w_k ~ N(0, I_d) each (verify/stats.py derives the moments of Y):

    trig RFF    Y = exp((|x|^2 + |y|^2)/2) cos(w.(x - y)),  Var Z = (1/2m) exp(|x|^2 + |y|^2) (1 - exp(-|x - y|^2))^2
    hyperbolic  Y = exp(-(|x|^2 + |y|^2)/2) cosh(w.(x + y)), Var Z = (1/2m) exp(-(|x|^2 + |y|^2)) (exp(|x + y|^2) - 1)^2
    FAVOR+      Y = exp(w.(x + y) - (|x|^2 + |y|^2)/2),     (Performer Lemma 1; checked as performer/prf-*)

Design (shared with performer/prf-*): R independent projections per implementation, drawn at once
as one (R m, d) matrix (iid rows are iid; ORF rows come in independent orthogonal blocks of d, so
R slices of m = 2d rows are R independent ORF draws). One draw of W serves every map of the table
(the cache below), so the maps cost one feature evaluation each. The map is applied to CHUNK
draws of W at once; its 1/sqrt(R m) normalisation is undone by R, and the features of the first
draw alone are compared with the batched ones (so a normalisation that is not 1/sqrt(m) per draw
cannot hide).

Tolerances are bounds with alpha = verify.stats.check_alpha split (Bonferroni) over the cases
(2 implementations x 3 pairs, x 2 row kinds for the mean):
- bounded Y (trig: |Y| <= exp((|x|^2 + |y|^2)/2)): Bernstein with the exact variance and that bound;
- unbounded Y (hyperbolic: cosh of a Gaussian, heavy-tailed): median of means with the exact sigma.
The variance check compares the mean of (Z - exp(x.y))^2 with the formula, with the exact
Var[(Z - exp(x.y))^2] (verify.stats.squared_error_variance) as sigma. For orthogonal rows the
variance is not claimed, so the mean check uses the worst case for dependent rows,
Var Z <= Var Y (Cauchy-Schwarz: Var((1/m) sum Y_k) <= ((1/m) sum sd Y_k)^2), i.e. the m = 1 sigma.
Each row has its own |x| = |y| (``norm``), chosen so that the variance radius is <= ~20 % of the
variance: a doubled variance (rows reused) or a wrong normalisation fails by a wide margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import fast
import reference.features as ref_features
from results.check import Check, Context, Outcome, judged
from verify.problems import rng_for
from verify.stats import (bernstein_radius, check_alpha, hyperbolic_single_moments, hyperbolic_variance,
                          median_of_means, mom_groups, mom_radius, prf_single_moments, prf_variance,
                          squared_error_variance, trig_single_moments, trig_variance)

D = 8  # input width
M = 16  # rows of W per draw: two orthogonal blocks of d
COSINES = (0.6, 0.0, -0.6)  # angles between x and y: exp(x.y) above, at and below 1
IMPLS = ("fast", "reference")
DRAWS = {True: 100_000, False: 400_000}  # quick / full
CHUNK = 25_000  # draws per feature evaluation (memory)
PAIR_SALT = 30
PROJECTION_SALT = 31  # + 1 for orthogonal rows


@dataclass(frozen=True)
class FeatureMapSpec:
    """One random feature map of exp(x.y) and the exact moments of its estimator.

    fast(W) -> a fast.FeatureMap for the projection W (m, d) (float64 tensor), called as
    fmap(x, is_query=...) on x (P, d); reference(x, W) -> features (P, width * m), NumPy. Both lay
    the features out as ``width`` blocks of m columns, block j column k belonging to row w_k
    (e.g. [cos(W x), sin(W x)]), so the product phi(x).phi(y) splits into per-row terms.
    moments(x, y, p) = E[Y^p] of one feature product Y (p = 1..4); variance(x, y, m) = Var Z of
    the iid m-row estimate, in closed form (tests/verify/test_stats.py checks it against the
    moments); bound(x, y) = sup |Y| where Y is bounded (Bernstein), None where it is not
    (median of means). orthogonal_sigma: "worst" (Var Z <= Var Y for dependent rows: assumes
    nothing) or "iid" (ORF variance <= iid variance, a theorem that some other check tests).
    """

    name: str
    title: str
    source: str
    fast: Callable[[torch.Tensor], torch.nn.Module]
    reference: Callable[[np.ndarray, np.ndarray], np.ndarray]
    width: int
    moments: Callable[[np.ndarray, np.ndarray, int], float]
    variance: Callable[[np.ndarray, np.ndarray, int], float]
    formula: str
    norm: float
    bound: Callable[[np.ndarray, np.ndarray], float] | None = None
    orthogonal_sigma: str = "worst"


def _trig_bound(x: np.ndarray, y: np.ndarray) -> float:
    """sup |exp((|x|^2 + |y|^2)/2) cos(.)|."""
    return math.exp(0.5 * float(x @ x + y @ y))


FAVOR_PLUS = FeatureMapSpec(
    name="favor+", title="FAVOR+ positive random features", source="Performer Lemma 1; wu22 Lemma 1",
    fast=lambda w: fast.FavorPlus(w, stabilize=False), reference=ref_features.favor_plus, width=1,
    moments=prf_single_moments, variance=prf_variance,
    formula="Var = (1/m) exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2))", norm=0.8, orthogonal_sigma="iid")
TRIG_RFF = FeatureMapSpec(
    name="trig-rff", title="trigonometric random Fourier features",
    source="Rahimi & Recht 2007; Performer Sec. 2 (derived: verify/stats.py)",
    fast=lambda w: fast.TrigRFF(w), reference=ref_features.trig_rff, width=2,
    moments=trig_single_moments, variance=trig_variance,
    formula="Var = (1/2m) exp(|x|^2 + |y|^2) (1 - exp(-|x-y|^2))^2", norm=0.8, bound=_trig_bound)
HYPERBOLIC = FeatureMapSpec(
    name="hyperbolic", title="hyperbolic positive random features",
    source="Performer Sec. 2 (derived: verify/stats.py)",
    fast=lambda w: fast.Hyperbolic(w, stabilize=False), reference=ref_features.hyperbolic, width=2,
    moments=hyperbolic_single_moments, variance=hyperbolic_variance,
    formula="Var = (1/2m) exp(-(|x|^2 + |y|^2)) (exp(|x+y|^2) - 1)^2", norm=0.5)

#: Every map whose estimator is drawn; a new random feature map adds one row here.
FEATURE_MAPS: dict[str, FeatureMapSpec] = {s.name: s for s in (FAVOR_PLUS, TRIG_RFF, HYPERBOLIC)}
#: Rows whose checks live in another family (same estimates): FAVOR+ keeps its performer/prf-* ids.
CHECKED_ELSEWHERE = {"favor+": "performer/prf-*"}


def pairs(seed: int, norm: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, y) with |x| = |y| = norm and x.y = norm^2 cos for each of COSINES, in random orientations."""
    rng = rng_for(seed, PAIR_SALT)
    out = []
    for cos in COSINES:
        basis, _ = np.linalg.qr(rng.standard_normal((D, 2)))
        e1, e2 = basis[:, 0], basis[:, 1]
        out.append((norm * e1, norm * (cos * e1 + math.sqrt(1 - cos * cos) * e2)))
    return out


def _projection(impl: str, orthogonal: bool, draws: int, seed: int):
    """W (draws M, d) float64 from the implementation's own sampler (torch tensor or ndarray)."""
    salt = PROJECTION_SALT + int(orthogonal)
    if impl == "fast":
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, salt]).generate_state(1)[0]))
        return fast.gaussian_projection(draws * M, D, orthogonal=orthogonal, generator=gen, dtype=torch.float64)
    if impl == "reference":
        return ref_features.gaussian_projection(draws * M, D, rng_for(seed, salt), orthogonal=orthogonal)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _features(spec: FeatureMapSpec, impl: str, w, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phi(x), phi(y)) as float64 arrays (P, width * rows of w); x plays the query."""
    if impl == "fast":
        fmap = spec.fast(w)
        fx = fmap(torch.as_tensor(x), is_query=True)
        fy = fmap(torch.as_tensor(y), is_query=False)
        return fx.detach().numpy(), fy.detach().numpy()
    return spec.reference(x, w), spec.reference(y, w)


def _products(spec: FeatureMapSpec, impl: str, w, draws: int, seed: int) -> np.ndarray:
    """Z (draws, P): the m-row estimate phi(x).phi(y) of each draw (block of M rows of w), per pair.

    Draws are evaluated CHUNK at a time (peak memory ~ width * CHUNK * M * P doubles, not draws)."""
    ps = pairs(seed, spec.norm)
    x = np.stack([p[0] for p in ps])  # (P, d)
    y = np.stack([p[1] for p in ps])
    out = np.empty((draws, len(ps)))
    for start in range(0, draws, CHUNK):
        r = min(CHUNK, draws - start)
        out[start:start + r] = _chunk_products(spec, impl, w[start * M:(start + r) * M], r, x, y)
    return out


def _chunk_products(spec: FeatureMapSpec, impl: str, w, r: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Z (r, P) for the r draws of w (r M rows)."""
    p = len(x)
    fx, fy = _features(spec, impl, w, x, y)
    expected = (p, spec.width * r * M)
    if fx.shape != expected or fy.shape != expected:
        raise AssertionError(f"{spec.name} ({impl}): features have shape {fx.shape}, {fy.shape}; expected {expected} "
                             f"(width {spec.width} x {r * M} rows)")
    # the map normalises by 1/sqrt(r m) (or sqrt(2 r m)); each draw's estimate by 1/sqrt(m): the
    # features of the first draw computed alone must equal the batched ones times sqrt(r)
    first, _ = _features(spec, impl, w[:M], x, y)
    batched = fx.reshape(p, spec.width, r, M)[:, :, 0, :].reshape(p, spec.width * M)
    if not np.allclose(first, batched * math.sqrt(r), rtol=1e-12, atol=0):
        raise AssertionError(f"{spec.name} ({impl}): the features of one draw of m = {M} rows are not the batched "
                             f"features times sqrt(R) (normalisation not 1/sqrt(m) per draw, or not laid out as "
                             f"{spec.width} blocks of m columns)")
    return (fx * fy * r).reshape(p, spec.width, r, M).sum(axis=(1, 3)).T


_CACHE: dict = {}  # (spec, impl, orthogonal, draws, seed) -> Z; holds one (draws, seed) at a time


def estimates(spec: FeatureMapSpec, impl: str, orthogonal: bool, draws: int, seed: int) -> np.ndarray:
    """Z (draws, P): independent m-row estimates of exp(x.y) for each pair of ``pairs(seed, spec.norm)``.

    A miss draws W once and evaluates every map of FEATURE_MAPS (and ``spec``) on it, so the
    table's maps share the draws (each check's bound holds on its own; sharing only correlates
    the checks, which the Bonferroni sum over the suite allows).
    """
    key = (spec, impl, orthogonal, draws, seed)
    if key not in _CACHE:
        if any(k[3:] != (draws, seed) for k in _CACHE):
            _CACHE.clear()  # a new seed or size: do not hoard the old estimates (seed sweeps)
        w = _projection(impl, orthogonal, draws, seed)
        for s in {spec, *FEATURE_MAPS.values()}:
            k = (s, impl, orthogonal, draws, seed)
            if k not in _CACHE:
                _CACHE[k] = _products(s, impl, w, draws, seed)
    return _CACHE[key]


def _mean_radius(spec: FeatureMapSpec, x: np.ndarray, y: np.ndarray, sigma: float, n: int, delta: float) -> float:
    """Radius for the mean of n independent estimates of exp(x.y) with sd <= sigma."""
    if spec.bound is None:
        return mom_radius(sigma, n, delta)
    return bernstein_radius(sigma, spec.bound(x, y) + math.exp(float(x @ y)), n, delta)


def _estimate(spec: FeatureMapSpec, sample: np.ndarray, delta: float) -> float:
    """The plain mean for bounded terms (Bernstein), the median of means otherwise."""
    if spec.bound is None:
        return median_of_means(sample, mom_groups(delta))
    return float(np.mean(sample))


def run_unbiased(spec: FeatureMapSpec, ctx: Context) -> Outcome:
    """E Z = exp(x.y) for iid and orthogonal rows, both implementations, every pair."""
    alpha = check_alpha(ctx.quick)
    kinds = (False, True)
    delta = alpha / (len(IMPLS) * len(kinds) * len(COSINES))
    draws = DRAWS[ctx.quick]
    rows, stats = [], []
    for impl in IMPLS:
        for orthogonal in kinds:
            z = estimates(spec, impl, orthogonal, draws, ctx.seed)
            for j, (x, y) in enumerate(pairs(ctx.seed, spec.norm)):
                sm = math.exp(float(x @ y))
                var_y = spec.variance(x, y, 1)
                worst = orthogonal and spec.orthogonal_sigma == "worst"
                sigma = math.sqrt(var_y if worst else var_y / M)
                est = _estimate(spec, z[:, j], delta)
                radius = _mean_radius(spec, x, y, sigma, draws, delta)
                stats.append(abs(est - sm) / radius)
                rows.append({"impl": impl, "rows": "orthogonal" if orthogonal else "iid", "cos": COSINES[j],
                             "exact": sm, "estimate": est, "radius": radius, "relative_radius": radius / sm,
                             "sigma": sigma, "sigma_is": "worst case (m = 1)" if worst else "exact iid"})
    return _judged(spec, rows, stats, alpha, delta, draws, "max over cases of |estimate - exp(x.y)| / radius")


def run_variance(spec: FeatureMapSpec, ctx: Context) -> Outcome:
    """E (Z - exp(x.y))^2 = spec.variance (iid rows), both implementations, every pair."""
    alpha = check_alpha(ctx.quick)
    delta = alpha / (len(IMPLS) * len(COSINES))
    draws = DRAWS[ctx.quick]
    rows, stats = [], []
    for impl in IMPLS:
        z = estimates(spec, impl, False, draws, ctx.seed)
        for j, (x, y) in enumerate(pairs(ctx.seed, spec.norm)):
            sm = math.exp(float(x @ y))
            var = spec.variance(x, y, M)
            sigma_u = math.sqrt(squared_error_variance(tuple(spec.moments(x, y, p) for p in (1, 2, 3, 4)), M))
            u = (z[:, j] - sm) ** 2
            est = _estimate(spec, u, delta)
            if spec.bound is None:
                radius = mom_radius(sigma_u, draws, delta)
            else:  # 0 <= u <= (sup|Z| + exp(x.y))^2, so |u - Var| <= max of the two ends
                top = (spec.bound(x, y) + sm) ** 2
                radius = bernstein_radius(sigma_u, max(top - var, var), draws, delta)
            stats.append(abs(est - var) / radius)
            rows.append({"impl": impl, "cos": COSINES[j], "formula": var, "estimate": est,
                         "sample_variance": float(u.mean()), "ratio_to_formula": est / var, "radius": radius,
                         "relative_radius": radius / var})
    return _judged(spec, rows, stats, alpha, delta, draws, "max over cases of |estimated variance - formula| / radius")


def _judged(spec: FeatureMapSpec, rows: list[dict], stats: list[float], alpha: float, delta: float, draws: int,
            statistic: str) -> Outcome:
    worst = max(stats)
    ok = worst <= 1.0
    reasons = [] if ok else [f"{r['impl']} {r.get('rows', 'iid')} rows at cos {r['cos']}: |estimate - claim| / "
                             f"radius = {s:.3g} > 1 (estimate {r['estimate']:.5g})"
                             for r, s in zip(rows, stats) if not s <= 1.0]
    bound = ("median of means, k = ceil(8 ln(1/delta)) groups, radius 2 sigma / sqrt(n/k)" if spec.bound is None
             else "Bernstein with the exact variance and the map's bound sup |Y|")
    return judged(ok, worst, reasons, statistic=statistic, alpha=alpha, delta_per_case=delta, draws=draws, m=M, d=D,
                  norm=spec.norm, bound=bound, cases=rows)


def checks_for(spec: FeatureMapSpec) -> list[Check]:
    """features/<name>-unbiased and features/<name>-variance for one table row."""
    return [
        Check(f"features/{spec.name}-unbiased", f"{spec.title}: E[phi(x).phi(y)] = exp(x.y), iid and orthogonal rows",
              spec.source, "statistical", run=lambda ctx: run_unbiased(spec, ctx), threshold=1.0, compare="<=",
              unit="ratio"),
        Check(f"features/{spec.name}-variance", f"{spec.title}: {spec.formula}, iid rows", spec.source, "statistical",
              run=lambda ctx: run_variance(spec, ctx), threshold=1.0, compare="<=", unit="ratio"),
    ]


def checks() -> list[Check]:
    out: list[Check] = []
    for name, spec in FEATURE_MAPS.items():
        if name not in CHECKED_ELSEWHERE:
            out.extend(checks_for(spec))
    return out
