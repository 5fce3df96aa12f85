"""performer/prf-*: FAVOR+ positive random features are unbiased with the stated variance.

Claim (Performer Lemma 1; wu22 Lemma 1; docs/papers.md Sec. 0): for rows w ~ N(0, I_d),
    Z = phi(x).phi(y) = (1/m) sum_k exp(w_k.(x+y) - (|x|^2 + |y|^2)/2),   E Z = SM(x, y) = exp(x.y),
    Var Z = (1/m) exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2)),
and orthogonal random features (ORF) are unbiased with variance no larger (Performer Thm. 2).

Design: R independent projections per implementation (fast/ torch and reference/ NumPy), each
an (m, d) block structure, drawn at once as one (R m, d) matrix: iid rows are iid, and ORF rows
come in independent orthogonal blocks of d, so slicing R blocks of m = 2d rows gives R
independent ORF draws. Tolerances are median-of-means radii (finite variance suffices: the
estimates are sums of log-normals, heavy-tailed), with the exact variance of Z for the mean
and the exact variance of (Z - SM)^2 for the variance. alpha per check from verify.stats,
split (Bonferroni) over 2 implementations x 3 (x, y) pairs. For ORF the iid sigma is used as
the sigma bound: that is Performer Thm. 2's claim, which prf-variance-orf checks.
The draws and the estimator are verify.checks.features' (FAVOR+ is a row of its table, whose
other maps get features/<map>-* checks from the same draws).
"""
from __future__ import annotations

import math

import numpy as np

from results.check import Check, Context, Outcome, judged
from verify.checks import features
from verify.checks.features import FAVOR_PLUS
from verify.stats import (check_alpha, median_of_means, mom_groups, mom_radius, prf_squared_error_variance,
                          prf_variance)

NORM = FAVOR_PLUS.norm  # |x| = |y|: |x+y|^2 <= 2.56 keeps the 4th moment (for the variance check) moderate
IMPLS = features.IMPLS
COSINES = features.COSINES
DRAWS = features.DRAWS  # quick / full
D, M = features.D, features.M


def pairs(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, y) with |x| = |y| = NORM and x.y = NORM^2 cos, in a random orientation."""
    return features.pairs(seed, NORM)


def estimates(impl: str, orthogonal: bool, draws: int, seed: int) -> np.ndarray:
    """Z (draws, pairs): independent m-feature FAVOR+ estimates of exp(x.y) for each pair (the
    draws of verify.checks.features, shared with the other feature maps)."""
    return features.estimates(FAVOR_PLUS, impl, orthogonal, draws, seed)


def _run(ctx: Context, orthogonal: bool, what: str) -> Outcome:
    alpha = check_alpha(ctx.quick)
    cases = len(IMPLS) * len(COSINES)
    delta = alpha / cases
    draws = DRAWS[ctx.quick]
    rows, stats, worst = [], [], -math.inf
    for impl in IMPLS:
        z = estimates(impl, orthogonal, draws, ctx.seed)
        for j, (x, y) in enumerate(pairs(ctx.seed)):
            sm = math.exp(float(x @ y))
            var = prf_variance(x, y, M)
            if what == "unbiased":
                est = median_of_means(z[:, j], mom_groups(delta))
                radius = mom_radius(math.sqrt(var), draws, delta)
                stat = abs(est - sm) / radius
                rows.append({"impl": impl, "cos": COSINES[j], "exact": sm, "mom_estimate": est,
                             "radius": radius, "relative_radius": radius / sm})
            else:
                u = (z[:, j] - sm) ** 2
                est = median_of_means(u, mom_groups(delta))
                radius = mom_radius(math.sqrt(prf_squared_error_variance(x, y, M)), draws, delta)
                # iid: two-sided against the formula; ORF: one-sided, no larger than iid
                stat = (abs(est - var) if not orthogonal else est - var) / radius
                rows.append({"impl": impl, "cos": COSINES[j], "formula_iid": var, "mom_variance": est,
                             "sample_variance": float(u.mean()), "ratio_to_iid": est / var, "radius": radius})
            worst = max(worst, stat)
            stats.append(stat)
    ok = worst <= 1.0
    reasons = [] if ok else [f"{r['impl']} at cos {r['cos']}: |estimate - claim| / radius = {s:.3g} > 1"
                             for r, s in zip(rows, stats) if not s <= 1.0]
    return judged(ok, worst, reasons,
                  statistic="max over cases of |estimate - claim| / radius (one-sided for ORF variance)",
                  alpha=alpha, delta_per_case=delta, draws=draws, m=M, d=D, norm=NORM,
                  bound="median of means, k = ceil(8 ln(1/delta)) groups, radius 2 sigma / sqrt(n/k)", cases=rows)


CLAIM = {
    ("unbiased", False): "E[phi(x).phi(y)] = exp(x.y), iid rows",
    ("unbiased", True): "E[phi(x).phi(y)] = exp(x.y), orthogonal rows",
    ("variance", False): "Var = (1/m) exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2)), iid rows",
    ("variance", True): "orthogonal-feature variance <= the iid variance",
}
SOURCE = {"unbiased": "Performer Lemma 1; wu22 Lemma 1", "variance": "Performer Lemma 1, Thm. 2"}


def checks() -> list[Check]:
    out = []
    for what in ("unbiased", "variance"):
        for orthogonal in (False, True):
            kind = "orf" if orthogonal else "iid"
            out.append(Check(f"performer/prf-{what}-{kind}", CLAIM[(what, orthogonal)], SOURCE[what], "statistical",
                             run=lambda ctx, o=orthogonal, w=what: _run(ctx, o, w), threshold=1.0, compare="<=",
                             unit="ratio"))
    return out
