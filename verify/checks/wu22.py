"""Claims of wu22 (NodeFormer) about the kernelized Gumbel-softmax (docs/papers.md Sec. 4).

Kernel convention of THESE checks (the paper's, not the library driver's): the FAVOR+ features of
x / sqrt(tau) estimate exp(x.y / tau),

    K(q, k) = phi(q / sqrt(tau)) . phi(k / sqrt(tau)),   E_W K = exp(q.k / tau),

with phi = reference.features.favor_plus and W = reference.features.gaussian_projection (iid rows
w ~ N(0, I_d)). There is NO d^(1/4) scaling here (the library's layers feed q d^(-1/4); these checks
feed the paper's inputs to favor_plus directly). Everything is NumPy with explicit, seeded
Generators (verify.problems.rng_for); nothing here needs fast/ or torch.

wu22/lemma-1         E K = exp(q.k/tau) and Var K = (1/m) exp(|x+y|^2) SM(x,y)^2 (1 - exp(-|x+y|^2)),
                     x = q/sqrt(tau), y = k/sqrt(tau), SM = exp(x.y), at tau = 1, 1/2, 1/4: median of
                     means of R independent m-feature estimates, radius from the EXACT sigma (the mean:
                     Var K; the variance: Var[(K - SM)^2] from the exact moments E Y^p of one product).
wu22/theorem-1       (erratum) P(|K - kappa| > sqrt(exp(6 r / tau) / (m eps))) <= eps. The proof bounds
                     |x+y|^2 + 2 x.y <= 6 r / tau, which needs |q|^2, |k|^2 <= r: r must bound the
                     SQUARED norms. Read as printed (r bounds the norms), the bound fails for r > 1: on
                     q = k, |q| = r (the pair that maximises the variance), the one-sided
                     Clopper-Pearson lower bound on P(Delta > bound) exceeds eps. The witnesses: once
                     kappa = exp(r^2/tau) exceeds the printed bound exp(3r/tau)/sqrt(m eps) (r >= 3 at
                     m = 16, eps = 1/4), the heavy-tailed estimate (log-variance 4 r^2/tau per feature) sits
                     far below its mean in almost every draw, so Delta ~ kappa > bound nearly always.
                     With r = the squared norm the bound holds (Chebyshev, exact variance <= exp(6 r / tau) / m)
                     and the check shows it, with the (1 - eps)-quantile of Delta against both readings.
wu22/lemma-2         P(x_i + g_i > x_j + g_j) = sigmoid(x_i - x_j) for Gumbel g: a Bernstein radius
                     (sigma^2 = p (1 - p), bounded indicators) per difference x_i - x_j.
wu22/lemma-3         Concrete / Gumbel-softmax y = softmax((log alpha + g) / tau): the argmax frequency is
                     alpha / sum alpha at every tau (Pearson chi-square against its 1 - delta quantile),
                     the samples approach one-hot as tau -> 0 (mean max coordinate increasing over the tau
                     grid, each step beyond its empirical Bernstein radii), and E[1 - max_j y_j] <= (N - 1) tau /
                     (1 - tau) (derived below) at every tau < 1.
wu22/theorem-2       the kernelized Gumbel-softmax c_uv = K_uv e^{g_v/tau} / sum_w K_uw e^{g_w/tau} (Eq. 7,
                     log space: log K + g/tau, never overflows) with m = 2^16 features and one W:
                     (i) given W the argmax law is exactly softmax_v(tau log K_uv) at every tau (Gumbel-max:
                     argmax(log K + g/tau) = argmax(tau log K + g)); per-key Bernstein radius;
                     (iii) the argmax frequency is within its TV radius (1/2 the sum of the per-key radii) plus
                     tanh(tau rho / 2) of softmax(q.k), rho = rf_log_error_bound (derived below from Lemma 1's
                     relative variance, NOT the measured TV(softmax(tau log K), softmax(q.k)), which would make the
                     sub-test follow from (i)), at every tau where rho is finite (here tau = 4 and 2: the bound
                     grows as tau shrinks; the check fails if no tau is left). This fails on its own when the
                     random-feature part is larger than Lemma 1 allows (e.g. the features not taken at q/sqrt(tau)).
                     (ii) REPORTED, NOT JUDGED: TV(mean_g c_u, softmax(q.k)) over tau = 4 .. 1/4 with its empirical
                     Bernstein radii, its drop and whether it is monotone. Theorem 2 is a limit statement (m -> inf
                     first, then tau -> 0); it implies no monotone approach at fixed m, and the random-feature error
                     grows as tau shrinks, so a fall over a finite grid is a property of the chosen parameters only.
                     With the exact kernel the argmax law is softmax(q.k) at EVERY tau; what tau -> 0 buys is
                     one-hot samples, and what it costs is random-feature error (relative variance
                     exp(|q+k|^2/tau)/m): m -> infinity must come first, as the theorem says.
                     Erratum (not checked separately, the check uses Lemma 2 directly): the proof's Eq. 35 ends with
                     alpha_v' / (alpha_v + alpha_v'); 1 / (1 + exp(log alpha_v' - log alpha_v)) is
                     alpha_v / (alpha_v + alpha_v') (a typo in the proof; the theorem's statement is unaffected).
wu22/large-tau       as tau grows, max_v |c_uv - 1/N| falls to 0 (eval mode, and one fixed Gumbel draw) and
                     stays under the bound derived below from the exact exp kernel's logit spread plus a
                     high-probability bound on the random-feature error log(K/SM) (m = 1024, one W for all tau);
                     it must also fall tenfold over the grid.
wu22/gumbel-unbiased for FIXED Gumbel noise g, the Eq. 7 numerator A_hat = sum_v K_uv e^{g_v/tau} v_v and
                     denominator B_hat = sum_v K_uv e^{g_v/tau} are unbiased over W for Eq. 6's exact A, B
                     (median of means with the exact covariance of the K_uv), while the ratio R = A_hat/B_hat is
                     biased: (a) some bias beyond its empirical Bernstein radius (R is a convex combination of the
                     values, so bounded by their range), and (b) every bias (per query and value column) within the
                     EXACT interval [(v_min Var B - Cov(A, B)) / B^2, (v_max Var B - Cov(A, B)) / B^2] widened by that
                     radius (derived below; Var B, Cov(A, B) exact from the Lemma 1-type second moments). One value
                     column is the indicator of the key carrying most of Var B: there the interval nearly fixes the
                     sign of the bias (a sign error in Cov is refused). The second-order delta method
                     (A/B Var B - Cov) / B^2 is reported only (measured: 0.75-0.85 of it on the mixed columns).
                     Over the noise itself E[exp(g/tau)] = Gamma(1 - 1/tau) for tau > 1 and is INFINITE
                     for tau <= 1: unbiasedness is over the random features, conditional on g.

Statistics (docs/methods.md): each statistical check has alpha = verify.stats.check_alpha(quick)
(1e-8 quick, 1e-5 full) split (Bonferroni) over its sub-tests (delta_per_case in details); every
check reports one statistic, a ratio <= 1 to pass (measured deviation / its radius or bound), and
its reasons. Fixed seeds: verify.problems.rng_for(ctx.seed, SALT, ...).

Derivations used above.
- Lemma 3 one-hot bound. X_j = log alpha_j + g_j, k = argmax, E_j = exp(-X_j) ~ Exp(alpha_j), so
  E_(1) ~ Exp(A) (A = sum alpha) independent of k and E_(2) = E_(1) + F, F ~ Exp(B), B = A - alpha_k.
  For j != k, y_j / y_k = exp((X_j - X_k)/tau) <= R^(1/tau), R = E_(1)/E_(2), hence
  1 - max y = sum_{j != k} y_j <= (N - 1) R^s, s = 1/tau. P(R > r) = B(1 - r)/(A r + B(1 - r))
  <= (1 - r)/r, so E R^s = int_0^1 s r^(s-1) P(R > r) dr <= s int (r^(s-2) - r^(s-1)) dr = 1/(s - 1).
- Large-tau bound. Logits L_v = q.k_v/tau + g_v/tau + e_v, e_v = log(K_v / exp(q.k_v/tau)); with
  spread S = max L - min L, c_v lies in [1/(1 + (N-1) e^S), 1/(1 + (N-1) e^-S)]. |e_v| <= rho w.p.
  >= 1 - delta: K/SM = mean of m iid U = exp(s G - s^2/2), s^2 = |q + k_v|^2 / tau, E U = 1, E U^2 = e^{s^2}.
  On max_f |G_f| <= t0 (failure <= 2 m Q(t0)) every U lies in [exp(-s t0 - s^2/2), exp(s t0 - s^2/2)];
  the U clipped to that interval have mean within Q(t0 - s) + Q(t0) of 1 and variance <= e^{s^2} - 1, so
  Bernstein bounds |K/SM - 1| <= t and rho = max(-log(1 - t), log(1 + t)).
- Theorem 2 random-feature part. tau log K_v = q.k_v + tau e_v with |e_v| <= rho for every key (each key's event
  at delta), so log(softmax(tau log K)_v / softmax(q.k)_v) = tau e_v - const spans at most s = 2 tau rho. Two laws
  whose log-ratio spans s are at most tanh(s/4) apart in TV (extreme: two atoms, mass x at the top, x = 1/(1 + e^{s/2})),
  hence TV(softmax(tau log K), softmax(q.k)) <= tanh(tau rho / 2); with (i) the frequency's TV radius adds on.
- Ratio bias interval. D = B_hat - B, R = A_hat/B_hat. 1/B_hat = 1/B - D/B^2 + D^2/(B^2 B_hat) exactly, so
  E R = A/B - Cov(A_hat, B_hat)/B^2 + E[R D^2]/B^2, and B_hat > 0 with R in [v_min, v_max] gives
  v_min Var B <= E[R D^2] <= v_max Var B.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from reference.features import favor_plus, gaussian_projection
from results.check import Check, Context, Outcome, judged
from verify.plots import plot, series
from verify.problems import rng_for
from verify.stats import (bernstein_radius, check_alpha, clopper_pearson_lower, median_of_means, mom_groups,
                          mom_radius, prf_single_moments, squared_error_variance)

SOURCE = "wu22"
SALT = 1300  # rng_for(seed, SALT + check number, ...)
D = 4  # query/key dimension of the small problems


# ------------------------------------------------------------------------------ shared pieces


def gumbel(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard Gumbel noise g = -log(-log U), U ~ Uniform(0, 1) clamped into [tiny, 1 - 2^-53] so g is finite."""
    u = np.clip(rng.random(shape), np.finfo(np.float64).tiny, 1.0 - 2.0**-53)
    return -np.log(-np.log(u))


def sigmoid(x):
    return special.expit(x)


def lemma2_probability(xi: float, xj: float) -> float:
    """wu22 Lemma 2: P(x_i + g_i > x_j + g_j) = 1 / (1 + exp(-(x_i - x_j)))."""
    return float(sigmoid(xi - xj))


def lemma1_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """wu22 Lemma 1 (Performer Lemma 2): Var = (1/m) exp(|x+y|^2) SM(x,y)^2 (1 - exp(-|x+y|^2))."""
    s2 = float(np.sum((x + y) ** 2))
    return math.exp(s2 + 2.0 * float(x @ y)) * -math.expm1(-s2) / m


def kernel_values(q: np.ndarray, k: np.ndarray, w: np.ndarray, tau: float) -> np.ndarray:
    """K (Q, N) = phi(q / sqrt(tau)) . phi(k / sqrt(tau)) for q (Q, d), k (N, d), W (m, d): estimates exp(q.k/tau)."""
    s = 1.0 / math.sqrt(tau)
    return favor_plus(q * s, w) @ favor_plus(k * s, w).T


def concrete(log_alpha: np.ndarray, g: np.ndarray, tau: float) -> np.ndarray:
    """Concrete / Gumbel-softmax samples softmax((log alpha + g) / tau) (..., N), in log space."""
    z = (log_alpha + g) / tau
    return np.exp(z - special.logsumexp(z, axis=-1, keepdims=True))


def kernelized_gumbel_log_weights(log_k: np.ndarray, g: np.ndarray, tau: float) -> np.ndarray:
    """log c (S, N) of wu22 Eq. 7 for one query: log c_v = log K_v + g_v / tau - LSE_w(log K_w + g_w / tau).
    log_k (N,) the log kernel values of the row, g (S, N) one noise row per sample. Never overflows."""
    z = log_k[None, :] + g / tau
    return z - special.logsumexp(z, axis=-1, keepdims=True)


def unit_pair(rng: np.random.Generator, norm_q: float, norm_k: float, cos: float, d: int = D):
    """(q, k) with |q| = norm_q, |k| = norm_k, cos(q, k) = cos, in a random orientation."""
    basis, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    e1, e2 = basis[:, 0], basis[:, 1]
    return norm_q * e1, norm_k * (cos * e1 + math.sqrt(max(0.0, 1 - cos * cos)) * e2)


def keys_at_cosines(rng: np.random.Generator, norm: float, cosines, d: int = D):
    """q (d,) and keys (N, d), all of norm ``norm``, with cos(q, k_v) = cosines[v]."""
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    q = norm * basis[:, 0]
    keys = []
    for v, c in enumerate(cosines):
        other = basis[:, 1 + v % (d - 1)]
        keys.append(norm * (c * basis[:, 0] + math.sqrt(max(0.0, 1 - c * c)) * other))
    return q, np.array(keys)


#: Projection rows drawn at once by prf_estimates: bounds its memory (full mode draws millions of rows).
CHUNK_ROWS = 1 << 20


def prf_estimates(x: np.ndarray, ys: np.ndarray, m: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Z (draws, P): ``draws`` independent m-feature FAVOR+ estimates of exp(x.y_p). Each chunk of R draws is one
    (R m, d) projection (draw r = rows r m .. (r+1) m - 1); favor_plus's 1/sqrt(R m) is undone by R."""
    out = np.empty((draws, len(ys)))
    per_chunk = max(1, CHUNK_ROWS // m)
    for start in range(0, draws, per_chunk):
        r = min(per_chunk, draws - start)
        w = gaussian_projection(r * m, x.shape[-1], rng)
        fx = favor_plus(x[None, :], w)[0]  # (r m,)
        fy = favor_plus(ys, w)  # (P, r m)
        out[start:start + r] = ((fy * fx[None, :]).reshape(len(ys), r, m).sum(axis=-1) * r).T
    return out


def empirical_bernstein_radius(x: np.ndarray, span: float, delta: float) -> float:
    """Radius t with P(|mean - mu| > t) <= delta for n iid draws x in an interval of length ``span``
    (Maurer & Pontil 2009, empirical Bernstein, two-sided): sqrt(2 V L / n) + 7 span L / (3 (n - 1)),
    V the unbiased sample variance, L = ln(4 / delta)."""
    n = len(x)
    log_term = math.log(4 / delta)
    return math.sqrt(2 * float(np.var(x, ddof=1)) * log_term / n) + 7 * span * log_term / (3 * (n - 1))


def tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def softmax(z: np.ndarray) -> np.ndarray:
    return np.exp(z - special.logsumexp(z))


# ------------------------------------------------------------------------------ wu22/lemma-1

L1_TAUS = (1.0, 0.5, 0.25)
L1_COSINES = (-0.6, 0.2, 0.8)
L1_NORM = 0.25  # |q| = |k|: |x + y|^2 = 2 0.0625 (1 + cos) / tau <= 0.9, so the 4th moment stays moderate
L1_M = 32
L1_DRAWS = {True: 40_000, False: 400_000}


def _lemma_1(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    cases = 2 * len(L1_TAUS) * len(L1_COSINES)
    delta = alpha / cases
    draws = L1_DRAWS[ctx.quick]
    groups = mom_groups(delta)
    rows, worst, reasons = [], 0.0, []
    rng_pairs = rng_for(ctx.seed, SALT + 1)
    pairs = [unit_pair(rng_pairs, L1_NORM, L1_NORM, c) for c in L1_COSINES]
    ratio_lo, ratio_hi, ratio_mid, xs = [], [], [], []
    for t, tau in enumerate(L1_TAUS):
        s = 1.0 / math.sqrt(tau)
        for j, (q, k) in enumerate(pairs):
            x, y = q * s, k * s
            z = prf_estimates(x, y[None, :], L1_M, draws, rng_for(ctx.seed, SALT + 1, t, j))[:, 0]
            sm = math.exp(float(x @ y))
            exact_var = math.exp(2 * float(x @ y)) * (math.exp(float(np.sum((x + y) ** 2))) - 1) / L1_M
            claim_var = lemma1_variance(x, y, L1_M)
            est_mean = median_of_means(z, groups)
            r_mean = mom_radius(math.sqrt(exact_var), draws, delta)
            u = (z - sm) ** 2
            est_var = median_of_means(u, groups)
            r_var = mom_radius(math.sqrt(squared_error_variance(tuple(prf_single_moments(x, y, p)
                                                                      for p in (1, 2, 3, 4)), L1_M)), draws, delta)
            s_mean = abs(est_mean - sm) / r_mean
            s_var = abs(est_var - claim_var) / r_var
            worst = max(worst, s_mean, s_var)
            tag = f"tau = {tau:g}, cos = {L1_COSINES[j]:g}"
            if not s_mean <= 1.0:
                reasons.append(f"{tag}: mean {est_mean:.5g} vs exp(q.k/tau) = {sm:.5g}, {s_mean:.3g} radii away")
            if not s_var <= 1.0:
                reasons.append(f"{tag}: variance {est_var:.4g} vs Lemma 1's {claim_var:.4g}, {s_var:.3g} radii away")
            ratio_mid.append(est_var / claim_var)
            ratio_lo.append((est_var - r_var) / claim_var)
            ratio_hi.append((est_var + r_var) / claim_var)
            xs.append(float(np.sum((x + y) ** 2)))
            rows.append({"tau": tau, "cos": L1_COSINES[j], "x_plus_y_sq": xs[-1], "exp_qk_over_tau": sm,
                         "mom_mean": est_mean, "mean_radius": r_mean, "mean_ratio": s_mean,
                         "lemma1_variance": claim_var, "mom_variance": est_var, "sample_variance": float(u.mean()),
                         "variance_radius": r_var, "variance_ratio_ci": [ratio_lo[-1], ratio_hi[-1]],
                         "variance_over_formula": ratio_mid[-1], "variance_stat": s_var})
    order = np.argsort(xs)
    plots = [plot("wu22 Lemma 1: measured variance / formula", "|x + y|^2 (x = q/sqrt(tau), y = k/sqrt(tau))",
                  "variance ratio", [series("median of means / Lemma 1 (radius as bars)", np.array(xs)[order],
                                            np.array(ratio_mid)[order], lower=np.array(ratio_lo)[order],
                                            upper=np.array(ratio_hi)[order]),
                                     series("1 (the claim)", [min(xs), max(xs)], [1.0, 1.0], kind="bound")],
                  ylog=False)]
    return judged(not reasons, worst, reasons,
                  statistic="max over (tau, pair, mean/variance) of |median of means - claim| / radius",
                  bound="median of means, k = ceil(8 ln(1/delta)) groups, radius 2 sigma / sqrt(n/k), sigma exact",
                  alpha=alpha, delta_per_case=delta, draws=draws, m=L1_M, d=D, norm=L1_NORM, taus=list(L1_TAUS),
                  kernel="phi(q/sqrt(tau)).phi(k/sqrt(tau)) estimates exp(q.k/tau) (no d^(1/4) scaling)",
                  plots=plots, cases=rows)


# ------------------------------------------------------------------------------ wu22/theorem-1

T1_TAUS = (1.0, 0.5)
T1_R = (0.5, 0.8, 1.2, 1.6, 2.0, 2.5, 3.0, 3.5)  # |q| = |k| (the norm)
T1_M = 16
T1_EPS = 0.25
T1_DRAWS = {True: 4_000, False: 40_000}


def theorem1_bound(r: float, tau: float, m: int, eps: float) -> float:
    """wu22 Thm. 1: sqrt(exp(6 r / tau) / (m eps))."""
    return math.sqrt(math.exp(6.0 * r / tau) / (m * eps))


def r_printed(q: np.ndarray, k: np.ndarray) -> float:
    """Thm. 1 as printed: r bounds the norms |q|, |k|."""
    return max(float(np.linalg.norm(q)), float(np.linalg.norm(k)))


def r_corrected(q: np.ndarray, k: np.ndarray) -> float:
    """The erratum: r bounds the SQUARED norms |q|^2, |k|^2 (what the proof's |q+k|^2 <= 4r uses)."""
    return max(float(q @ q), float(k @ k))


def _quantile_ci(x: np.ndarray, level: float, conf: float) -> tuple[float, float, float]:
    """(estimate, lower, upper) of the level-quantile of x: order statistics with a binomial CI."""
    xs = np.sort(x)
    n = len(xs)
    lo_i = int(stats.binom.ppf((1 - conf) / 2, n, level))
    hi_i = int(stats.binom.isf((1 - conf) / 2, n, level))
    return float(np.quantile(xs, level)), float(xs[max(lo_i - 1, 0)]), float(xs[min(hi_i, n - 1)])


def _theorem_1(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    cases = 2 * len(T1_TAUS) * len(T1_R)
    delta = alpha / cases
    draws = T1_DRAWS[ctx.quick]
    rows, reasons = [], []
    worst_corrected, best_printed = 0.0, 0.0
    plots = []
    rng_dirs = rng_for(ctx.seed, SALT + 2)
    for t, tau in enumerate(T1_TAUS):
        qs, qlo, qhi, bp, bc = [], [], [], [], []
        for i, r in enumerate(T1_R):
            e = rng_dirs.standard_normal(D)
            q = r * e / np.linalg.norm(e)
            k = q.copy()  # aligned, equal norms: |x+y|^2 + 2 x.y = 6 |q|^2 / tau, the largest variance for |q| = r
            s = 1.0 / math.sqrt(tau)
            z = prf_estimates(q * s, (k * s)[None, :], T1_M, draws, rng_for(ctx.seed, SALT + 2, t, i))[:, 0]
            kappa = math.exp(float(q @ k) / tau)
            dev = np.abs(z - kappa)
            b_print = theorem1_bound(r_printed(q, k), tau, T1_M, T1_EPS)
            b_corr = theorem1_bound(r_corrected(q, k), tau, T1_M, T1_EPS)
            k_print, k_corr = int((dev > b_print).sum()), int((dev > b_corr).sum())
            lo_print = clopper_pearson_lower(k_print, draws, 1 - delta)
            lo_corr = clopper_pearson_lower(k_corr, draws, 1 - delta)
            worst_corrected = max(worst_corrected, lo_corr / T1_EPS)
            best_printed = max(best_printed, lo_print / T1_EPS)
            if not lo_corr <= T1_EPS:
                reasons.append(f"tau = {tau:g}, |q| = |k| = {r:g}: the corrected bound (r = squared norm) "
                               f"{b_corr:.4g} is exceeded in {k_corr} of {draws} draws; Clopper-Pearson lower "
                               f"bound {lo_corr:.3g} > eps = {T1_EPS:g}")
            est, lo, hi = _quantile_ci(dev, 1 - T1_EPS, 0.95)
            qs.append(est), qlo.append(lo), qhi.append(hi), bp.append(b_print), bc.append(b_corr)
            rows.append({"tau": tau, "norm": r, "kappa": kappa, "bound_printed": b_print, "bound_corrected": b_corr,
                         "exceed_printed": k_print, "exceed_corrected": k_corr, "cp_lower_printed": lo_print,
                         "cp_lower_corrected": lo_corr, "quantile": est, "quantile_ci95": [lo, hi],
                         "exact_sd": math.sqrt(lemma1_variance(q * s, k * s, T1_M)),
                         "printed_violated": lo_print > T1_EPS})
        plots.append(plot(f"wu22 Thm. 1 at tau = {tau:g}: (1 - eps)-quantile of |K - kappa|, eps = {T1_EPS:g}, "
                          f"m = {T1_M}, q = k", "|q| = |k|", "|phi.phi - kappa|",
                          [series("measured (1 - eps)-quantile (95% CI)", T1_R, qs, lower=qlo, upper=qhi),
                           series("bound, r = |q| (as printed)", T1_R, bp, kind="bound"),
                           series("bound, r = |q|^2 (erratum)", T1_R, bc, kind="bound")], xlog=False))
    if not best_printed > 1.0:
        reasons.append(f"the printed reading (r = norm) is never violated beyond its CI (best Clopper-Pearson lower "
                       f"bound / eps = {best_printed:.3g} <= 1): the erratum is not shown")
    return judged(not reasons, worst_corrected, reasons,
                  statistic="max over (tau, |q|) of the one-sided Clopper-Pearson lower bound on P(Delta > bound) / "
                            "eps, bound sqrt(exp(6 r / tau) / (m eps)) with r = the squared norm (erratum)",
                  printed="r bounds |q|, |k|", corrected="r bounds |q|^2, |k|^2",
                  printed_best_cp_lower_over_eps=best_printed,
                  printed_violated_at=[{"tau": c["tau"], "norm": c["norm"]} for c in rows if c["printed_violated"]],
                  alpha=alpha, delta_per_case=delta, draws=draws, m=T1_M, eps=T1_EPS, d=D, plots=plots, cases=rows)


# ------------------------------------------------------------------------------ wu22/lemma-2

L2_PAIRS = ((0.0, 0.0), (0.5, 0.0), (-1.0, 0.0), (2.0, -0.5), (1.0, 4.0))
L2_DRAWS = {True: 200_000, False: 2_000_000}


def _lemma_2(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    delta = alpha / len(L2_PAIRS)
    n = L2_DRAWS[ctx.quick]
    rows, worst, reasons = [], 0.0, []
    for i, (xi, xj) in enumerate(L2_PAIRS):
        g = gumbel(rng_for(ctx.seed, SALT + 3, i), (2, n))
        wins = int(np.sum(xi + g[0] > xj + g[1]))
        p = lemma2_probability(xi, xj)
        radius = bernstein_radius(math.sqrt(p * (1 - p)), 1.0, n, delta)
        stat = abs(wins / n - p) / radius
        worst = max(worst, stat)
        pval = float(stats.binomtest(wins, n, p).pvalue)
        if not stat <= 1.0:
            reasons.append(f"x_i = {xi:g}, x_j = {xj:g}: frequency {wins / n:.5f} vs sigmoid(x_i - x_j) = {p:.5f}, "
                           f"{stat:.3g} radii away (binomial p-value {pval:.3g})")
        rows.append({"x_i": xi, "x_j": xj, "claim": p, "frequency": wins / n, "radius": radius, "ratio": stat,
                     "binomial_pvalue": pval})
    return judged(not reasons, worst, reasons,
                  statistic="max over pairs of |frequency - sigmoid(x_i - x_j)| / Bernstein radius",
                  bound="Bernstein, sigma^2 = p (1 - p), indicators in [0, 1]",
                  alpha=alpha, delta_per_case=delta, draws=n, cases=rows)


# ------------------------------------------------------------------------------ wu22/lemma-3

L3_ALPHA = np.array([4.0, 2.0, 1.0, 0.6, 0.4])
L3_TAUS = (2.0, 1.0, 0.5, 0.25, 0.1, 0.05)
L3_DRAWS = {True: 100_000, False: 1_000_000}


def lemma3_one_hot_bound(n: int, tau: float) -> float:
    """E[1 - max_j y_j] <= (N - 1) tau / (1 - tau) for tau < 1 (module docstring); 1 - 1/N otherwise."""
    return (n - 1) * tau / (1 - tau) if tau < 1 else 1.0 - 1.0 / n


def _lemma_3(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    n_taus = len(L3_TAUS)
    cases = 2 * n_taus  # chi-square per tau; an empirical Bernstein radius per tau (the steps and the bound use it)
    delta = alpha / cases
    n = L3_DRAWS[ctx.quick]
    k = len(L3_ALPHA)
    target = L3_ALPHA / L3_ALPHA.sum()
    log_alpha = np.log(L3_ALPHA)
    crit = float(stats.chi2.isf(delta, k - 1))
    rows, reasons, stats_all = [], [], []
    means, radii = [], []
    for t, tau in enumerate(L3_TAUS):
        y = concrete(log_alpha, gumbel(rng_for(ctx.seed, SALT + 4, t), (n, k)), tau)
        counts = np.bincount(np.argmax(y, axis=1), minlength=k)
        chi2 = float(np.sum((counts - n * target) ** 2 / (n * target)))
        top = y.max(axis=1)
        mean_max = float(top.mean())
        h = empirical_bernstein_radius(top, 1 - 1 / k, delta)  # max coordinate in [1/N, 1]
        means.append(mean_max), radii.append(h)
        bound = lemma3_one_hot_bound(k, tau)
        s_chi = chi2 / crit
        s_bound = (1 - mean_max - h) / bound if tau < 1 else 0.0
        stats_all += [s_chi, s_bound]
        if not s_chi <= 1.0:
            reasons.append(f"tau = {tau:g}: argmax counts {counts.tolist()} vs alpha / sum alpha "
                           f"{target.round(4).tolist()}"
                           f": chi-square {chi2:.4g} > {crit:.4g} (1 - delta quantile, {k - 1} dof)")
        if not s_bound <= 1.0:
            reasons.append(f"tau = {tau:g}: mean 1 - max y = {1 - mean_max:.4g} exceeds (N - 1) tau / (1 - tau) = "
                           f"{bound:.4g} beyond the radius {h:.3g}")
        rows.append({"tau": tau, "argmax_frequency": (counts / n).tolist(), "chi2": chi2, "chi2_critical": crit,
                     "chi2_pvalue": float(stats.chi2.sf(chi2, k - 1)), "mean_max": mean_max,
                     "one_hot_bound": bound, "radius": h})
    for t in range(n_taus - 1):
        step = means[t + 1] - means[t]
        s_step = (radii[t] + radii[t + 1]) / step if step > 0 else math.inf
        stats_all.append(s_step)
        rows[t + 1]["step_from_previous"] = step
        if not s_step <= 1.0:
            reasons.append(f"mean max coordinate did not increase beyond its radii from tau = {L3_TAUS[t]:g} "
                           f"({means[t]:.4f}) to {L3_TAUS[t + 1]:g} ({means[t + 1]:.4f})")
    plots = [plot("wu22 Lemma 3: Concrete samples approach one-hot", "tau", "E[1 - max_j y_j]",
                  [series("measured", L3_TAUS, [1 - v for v in means]),
                   series("(N - 1) tau / (1 - tau)", [x for x in L3_TAUS if x < 1],
                          [lemma3_one_hot_bound(k, x) for x in L3_TAUS if x < 1], kind="bound")])]
    return judged(not reasons, max(stats_all), reasons,
                  statistic="max of chi-square / its 1 - delta quantile (argmax law, per tau), (mean 1 - max y - "
                            "radius) / (N - 1) tau / (1 - tau), and radii / step of the mean max coordinate",
                  alpha=alpha, delta_per_case=delta, draws=n, alpha_vector=L3_ALPHA.tolist(), plots=plots, cases=rows)


# ------------------------------------------------------------------------------ wu22/theorem-2

T2_TAUS = (4.0, 2.0, 1.0, 0.5, 0.25)
T2_COSINES = (0.5, 0.3, 0.0, -0.3, -0.6, -1.0)
T2_NORM = 0.8  # logits q.k_v = 0.64 cos in [-0.64, 0.32]; |q + k_v|^2 <= 1.92
T2_M = 1 << 16
T2_SAMPLES = {True: 200_000, False: 1_000_000}


def rf_softmax_tv_bound(rho: float, tau: float) -> float:
    """Bound on TV(softmax(tau log K), softmax(q.k)) when every |log(K_v / exp(q.k_v / tau))| <= rho: the logits
    tau log K_v = q.k_v + tau e_v move by d_v in [-tau rho, tau rho], so log(p'_v / p_v) = d_v - LSE shift ranges
    over an interval of width s <= 2 tau rho, and two laws whose log-ratio spans a width s are at most tanh(s / 4)
    apart in total variation (the two-point extreme: mass x at the top of the range, optimum x = 1 / (1 + e^{s/2}))."""
    return math.tanh(tau * rho / 2) if math.isfinite(rho) else 1.0


def _theorem_2(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    n_keys = len(T2_COSINES)
    n_taus = len(T2_TAUS)
    # per key and tau: a Bernstein radius (argmax law given W) and the random-feature log-error event (rho)
    cases = 2 * n_keys * n_taus
    delta = alpha / cases
    s_count = T2_SAMPLES[ctx.quick]
    q, keys = keys_at_cosines(rng_for(ctx.seed, SALT + 5), T2_NORM, T2_COSINES)
    logits = keys @ q
    p = softmax(logits)
    w = gaussian_projection(T2_M, D, rng_for(ctx.seed, SALT + 5, 1))
    rows, reasons, stat_all = [], [], []
    tv_mean, tv_mean_radius, tv_freq, tv_freq_radius, tv_rf, rf_bound, one_minus_max = [], [], [], [], [], [], []
    for t, tau in enumerate(T2_TAUS):
        log_k = np.log(kernel_values(q[None, :], keys, w, tau)[0])
        p_w = softmax(tau * log_k)  # the argmax law given W (Gumbel-max)
        g = gumbel(rng_for(ctx.seed, SALT + 5, 2, t), (s_count, n_keys))
        log_c = kernelized_gumbel_log_weights(log_k, g, tau)
        freq = np.bincount(np.argmax(log_c, axis=1), minlength=n_keys) / s_count
        c = np.exp(log_c)
        cbar = c.mean(axis=0)
        # (i) the argmax law given W
        radii = np.array([bernstein_radius(math.sqrt(pv * (1 - pv)), 1.0, s_count, delta) for pv in p_w])
        s_freq = float(np.max(np.abs(freq - p_w) / radii))
        stat_all.append(s_freq)
        if not s_freq <= 1.0:
            reasons.append(f"tau = {tau:g}: argmax frequency {freq.round(4).tolist()} vs softmax(tau log K) "
                           f"{p_w.round(4).tolist()}: {s_freq:.3g} radii away")
        # (iii) the argmax frequency vs softmax(q.k): sampling radius + the DERIVED random-feature bound
        rho = max(rf_log_error_bound(float(np.sum((q + kv) ** 2)) / tau, T2_M, delta) for kv in keys)
        tv_freq.append(tv(freq, p)), tv_freq_radius.append(0.5 * float(radii.sum())), tv_rf.append(tv(p_w, p))
        rf_bound.append(rf_softmax_tv_bound(rho, tau))
        s_cat = None
        if math.isfinite(rho):  # no claim where the random-feature error is not bounded at this delta and m
            s_cat = tv_freq[-1] / (tv_freq_radius[-1] + rf_bound[-1])
            stat_all.append(s_cat)
            if not s_cat <= 1.0:
                reasons.append(f"tau = {tau:g}: TV(argmax frequency, softmax(q.k)) = {tv_freq[-1]:.4g} > sampling "
                               f"radius {tv_freq_radius[-1]:.3g} + random-feature bound {rf_bound[-1]:.3g} "
                               f"(rho = {rho:.3g})")
        # (ii) reported, not judged: the relaxed weights vs the categorical law
        tv_mean.append(tv(cbar, p))
        tv_mean_radius.append(0.5 * sum(empirical_bernstein_radius(c[:, v], 1.0, delta) for v in range(n_keys)))
        one_minus_max.append(float(1 - c.max(axis=1).mean()))
        rf_rel_sd = [math.sqrt(math.expm1(float(np.sum((q + kv) ** 2)) / tau) / T2_M) for kv in keys]
        rows.append({"tau": tau, "argmax_frequency": freq.tolist(), "argmax_law_given_W": p_w.tolist(),
                     "mean_c": cbar.tolist(), "tv_mean_c_softmax": tv_mean[-1], "tv_mean_c_radius": tv_mean_radius[-1],
                     "tv_frequency_softmax": tv_freq[-1], "tv_frequency_radius": tv_freq_radius[-1],
                     "tv_rf_law_softmax": tv_rf[-1], "rf_log_error_bound": rho if math.isfinite(rho) else None,
                     "rf_tv_bound": rf_bound[-1] if math.isfinite(rho) else None, "categorical_stat": s_cat,
                     "rf_predicted_logit_sd": tau * max(rf_rel_sd), "mean_one_minus_max_c": one_minus_max[-1],
                     "freq_stat": s_freq})
        if t:
            rows[-1]["tv_change_from_previous"] = tv_mean[-1] - tv_mean[-2]
    if all(b >= 1.0 for b in rf_bound):  # a configuration with no claim is a check that cannot fail
        reasons.append("the random-feature bound is infinite at every tau: part (iii) makes no claim")
    plots = [plot("wu22 Thm. 2: kernelized Gumbel-softmax vs softmax(q.k)", "tau", "total variation",
                  [series("TV(E_g c_u, softmax) (radius as bars; reported)", T2_TAUS, tv_mean,
                          lower=[a - r if a > r else math.nan for a, r in zip(tv_mean, tv_mean_radius)],
                          upper=np.add(tv_mean, tv_mean_radius)),
                   series("TV(argmax frequency, softmax)", T2_TAUS, tv_freq),
                   series("TV(softmax(tau log K), softmax): the random-feature part", T2_TAUS, tv_rf, kind="line"),
                   series("sampling radius + derived random-feature bound", T2_TAUS,
                          [r + b if b < 1 else math.nan for r, b in zip(tv_freq_radius, rf_bound)], kind="bound"),
                   series("E[1 - max_v c_uv]", T2_TAUS, one_minus_max, kind="line")])]
    drop = tv_mean[0] - tv_mean[-1]
    return judged(not reasons, max(stat_all), reasons,
                  statistic="max of: per-key |argmax frequency - softmax(tau log K)| / Bernstein radius (every tau); "
                            "TV(argmax frequency, softmax(q.k)) / (TV radius + tanh(tau rho / 2)), rho the derived "
                            "random-feature log-error bound (the taus where rho is finite)",
                  alpha=alpha, delta_per_case=delta, samples=s_count, m=T2_M, d=D, logits=logits.tolist(),
                  softmax=p.tolist(), tv_mean_c_at_smallest_tau=tv_mean[-1],
                  tv_mean_c_drop=drop, tv_mean_c_drop_over_radii=drop / (tv_mean_radius[0] + tv_mean_radius[-1]),
                  tv_mean_c_monotone=bool(np.all(np.diff(tv_mean) < 0)),
                  note="given W the argmax law is exactly softmax(tau log K) at every tau (Gumbel-max); its distance "
                       "to softmax(q.k) is the random-feature error, which grows as tau shrinks (relative variance "
                       "exp(|q+k|^2/tau)/m): the m -> infinity limit must come first (the paper's Remark), and the "
                       "derived bound is finite only at the larger taus. The curve TV(E_g c_u, softmax) is REPORTED, "
                       "not judged: Theorem 2 is a limit and implies no monotone approach at fixed m",
                  plots=plots, cases=rows)


# ------------------------------------------------------------------------------ wu22/large-tau

LT_TAUS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0)
LT_COSINES = (0.9, 0.4, 0.0, -0.5, -0.9)
LT_NORM = 1.0
LT_M = 1024


def rf_log_error_bound(s2: float, m: int, delta: float) -> float:
    """rho with P(|log(K / SM)| > rho) <= delta for the m-feature FAVOR+ estimate K of SM, s2 = |x + y|^2
    (module docstring): K / SM = mean of m iid U = exp(s G - s^2/2), G ~ N(0, 1). On |G_f| <= t0 for all f
    (failure <= 2 m Q(t0) = delta / 2) every U lies in [lo, b] = exp(-+s t0 - s^2/2), so the mean equals that of
    the clipped U, whose mean is within Q(t0 - s) + Q(t0) of 1 and whose variance is <= e^{s^2} - 1; Bernstein
    (range b - lo) at delta / 2 does the rest."""
    s = math.sqrt(s2)
    t0 = float(stats.norm.isf(delta / (4 * m)))
    lo, hi = math.exp(-s * t0 - s2 / 2), math.exp(s * t0 - s2 / 2)
    shift = float(stats.norm.sf(t0 - s) + stats.norm.sf(t0))
    t = bernstein_radius(math.sqrt(math.expm1(s2)), hi - lo, m, delta / 2) + shift
    if t >= 1:
        return math.inf
    return max(-math.log1p(-t), math.log1p(t))


def large_tau_bound(spread: float, n: int) -> float:
    """max_v |c_v - 1/N| when the logits spread over at most ``spread``."""
    return max(1 / (1 + (n - 1) * math.exp(-spread)) - 1 / n, 1 / n - 1 / (1 + (n - 1) * math.exp(spread)))


def _large_tau(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    n = len(LT_COSINES)
    modes = ("eval (no noise)", "one Gumbel draw")
    delta = alpha / (n * len(LT_TAUS))  # the RF error bound, per key and tau (shared by both modes)
    q, keys = keys_at_cosines(rng_for(ctx.seed, SALT + 6), LT_NORM, LT_COSINES)
    w = gaussian_projection(LT_M, D, rng_for(ctx.seed, SALT + 6, 1))  # one W for every tau, as in a trained layer
    g = gumbel(rng_for(ctx.seed, SALT + 6, 2), (n,))
    exact = keys @ q
    rows, reasons, stat_all = [], [], []
    devs = {mode: [] for mode in modes}
    bounds = {mode: [] for mode in modes}
    for tau in LT_TAUS:
        log_k = np.log(kernel_values(q[None, :], keys, w, tau)[0])
        rho = max(rf_log_error_bound(float(np.sum((q + kv) ** 2)) / tau, LT_M, delta) for kv in keys)
        for mode, noise in zip(modes, (np.zeros(n), g)):
            log_c = kernelized_gumbel_log_weights(log_k, noise[None, :], tau)[0]
            dev = float(np.max(np.abs(np.exp(log_c) - 1 / n)))
            base = exact / tau + noise / tau
            devs[mode].append(dev)
            if not math.isfinite(rho):  # the random-feature error is not bounded at this delta: no claim
                bounds[mode].append(None)
                rows.append({"mode": mode, "tau": tau, "max_dev": dev, "bound": None, "rf_log_error_bound": None,
                             "ratio": None})
                continue
            bound = large_tau_bound(float(base.max() - base.min()) + 2 * rho, n)
            bounds[mode].append(bound)
            s = dev / bound
            stat_all.append(s)
            if not s <= 1.0:
                reasons.append(f"{mode}, tau = {tau:g}: max |c - 1/N| = {dev:.4g} > bound {bound:.4g}")
            rows.append({"mode": mode, "tau": tau, "max_dev": dev, "bound": bound, "rf_log_error_bound": rho,
                         "ratio": s})
    for mode in modes:
        d = devs[mode]
        if not d[-1] < d[0] / 10:
            reasons.append(f"{mode}: max |c - 1/N| did not fall tenfold over tau {LT_TAUS[0]:g} .. {LT_TAUS[-1]:g} "
                           f"({d[0]:.4g} -> {d[-1]:.4g})")
    plots = [plot("wu22 Remark: weights approach 1/N as tau grows", "tau", "max_v |c_uv - 1/N|",
                  [series(f"measured, {mode}", LT_TAUS, devs[mode]) for mode in modes]
                  + [series(f"bound, {mode}", LT_TAUS, [math.nan if b is None else b for b in bounds[mode]],
                            kind="bound") for mode in modes])]
    monotone = {mode: bool(np.all(np.diff(devs[mode]) < 0)) for mode in modes}
    return judged(not reasons, max(stat_all), reasons,
                  statistic="max over (tau, mode) of max_v |c_uv - 1/N| / bound (exact-kernel logit spread + 2 rho, "
                            "rho the random-feature log-error bound at delta; no claim where rho is unbounded)",
                  alpha=alpha, delta_per_case=delta, m=LT_M, d=D, norm=LT_NORM, monotone_decreasing=monotone,
                  plots=plots, cases=rows)


# ------------------------------------------------------------------------------ wu22/gumbel-unbiased

GU_TAU = 0.5
GU_COSINES = (0.8, 0.3, -0.2, -0.7, 0.0)
GU_NORM = 0.45
GU_M = 16
GU_QUERIES = 2
# value columns: two mixed-sign ones, and the indicator of the key at cos 0.8 (its weight c_u0), the key that carries
# most of Var B_hat: there Cov(A, B) / Var B is near the top of the column's range, so the interval below pins the sign
GU_VALUES = np.array([[2.0, -1.0, 1.0], [-1.0, 2.0, 0.0], [0.5, 1.5, 0.0], [-2.0, 0.0, 0.0], [1.0, -0.5, 0.0]])
GU_GUMBEL_QUANTILES = (0.6, 0.35, 0.5, 0.7, 0.45)
GU_DRAWS = {True: 40_000, False: 400_000}


def gumbel_numerator_weights(g: np.ndarray, tau: float) -> np.ndarray:
    """exp((g_v - max g) / tau): the Gumbel factor of Eq. 6/7 (one common scale, which cancels in the ratio)."""
    return np.exp((g - g.max()) / tau)


def ratio_bias_interval(v_min: float, v_max: float, b: float, var_b: float, cov_ab: float) -> tuple[float, float]:
    """Exact interval for E[A_hat / B_hat] - A / B (E A_hat = A, E B_hat = B > 0, B_hat > 0, and A_hat / B_hat a
    convex combination of values in [v_min, v_max]): 1 / B_hat = 1/B - D/B^2 + D^2 / (B^2 B_hat), D = B_hat - B, so
    E[R] - A/B = (-Cov(A_hat, B_hat) + E[R D^2]) / B^2 with E[R D^2] in [v_min Var B, v_max Var B]."""
    return (v_min * var_b - cov_ab) / b**2, (v_max * var_b - cov_ab) / b**2


def delta_method_bias(ratio: float, b: float, var_b: float, cov_ab: float) -> float:
    """Second-order delta method for E[A_hat / B_hat] - A / B (reported, not judged): (A/B Var B - Cov(A, B)) / B^2,
    i.e. the interval's E[R D^2] read as A/B Var B."""
    return (ratio * var_b - cov_ab) / b**2


def kernel_covariance(x: np.ndarray, ys: np.ndarray, m: int) -> np.ndarray:
    """Cov(K_v, K_w) (N, N) of the m-feature FAVOR+ estimates K_v of exp(x.y_v) sharing one W:
    (E[Y_v Y_w] - SM_v SM_w) / m, E[Y_v Y_w] = exp(|2x + y_v + y_w|^2 / 2 - |x|^2 - (|y_v|^2 + |y_w|^2) / 2)."""
    s = 2 * x[None, None, :] + ys[:, None, :] + ys[None, :, :]
    n2 = np.sum(ys * ys, axis=1)
    second = np.exp(0.5 * np.sum(s * s, axis=-1) - x @ x - 0.5 * (n2[:, None] + n2[None, :]))
    sm = np.exp(ys @ x)
    return (second - np.outer(sm, sm)) / m


def _gumbel_unbiased(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    dv = GU_VALUES.shape[1]
    # the problem is a fixed construction (the seed only turns it, which changes no distribution): q0 at the
    # keys' reference direction, q1 at 0.6 of it; the Gumbel draw g fixed at quantiles (one value per key)
    q0, keys = keys_at_cosines(rng_for(ctx.seed, SALT + 7), GU_NORM, GU_COSINES)
    other = keys[GU_COSINES.index(0.0)] / GU_NORM  # the key at cos 0: orthogonal to q0
    queries = [q0, 0.6 * q0 + 0.8 * GU_NORM * other]
    values = GU_VALUES
    g = -np.log(-np.log(np.asarray(GU_GUMBEL_QUANTILES)))  # ONE fixed noise row, shared by every query (per key)
    a = gumbel_numerator_weights(g, GU_TAU)
    draws = GU_DRAWS[ctx.quick]
    cases = GU_QUERIES * (1 + 2 * dv)  # denominator; numerator and ratio (one radius) per value column
    delta = alpha / cases
    groups = mom_groups(delta)
    s = 1.0 / math.sqrt(GU_TAU)
    rows, reasons, stat_all, significance = [], [], [], []
    for i, q in enumerate(queries):
        x, ys = q * s, keys * s
        k_hat = prf_estimates(x, ys, GU_M, draws, rng_for(ctx.seed, SALT + 7, 1, i))  # (draws, N)
        sm = np.exp(ys @ x)  # exp(q.k_v / tau)
        cov = kernel_covariance(x, ys, GU_M)
        b_hat = k_hat @ a
        b = float(sm @ a)
        var_b = float(a @ cov @ a)
        r_b = mom_radius(math.sqrt(var_b), draws, delta)
        s_b = abs(median_of_means(b_hat, groups) - b) / r_b
        stat_all.append(s_b)
        if not s_b <= 1.0:
            reasons.append(f"query {i}: denominator estimate {median_of_means(b_hat, groups):.5g} vs exact {b:.5g}, "
                           f"{s_b:.3g} radii away")
        row = {"query": i, "denominator_exact": b, "denominator_mom": median_of_means(b_hat, groups),
               "denominator_radius": r_b, "denominator_ratio": s_b, "columns": []}
        for j in range(dv):
            av = a * values[:, j]
            a_hat = k_hat @ av
            num = float(sm @ av)
            var_a = float(av @ cov @ av)
            cov_ab = float(av @ cov @ a)
            r_a = mom_radius(math.sqrt(var_a), draws, delta)
            s_a = abs(median_of_means(a_hat, groups) - num) / r_a
            ratio = a_hat / b_hat
            exact_ratio = num / b
            bias = float(ratio.mean() - exact_ratio)
            span = float(values[:, j].max() - values[:, j].min())  # the ratio is a convex combination of v_.j
            r_ratio = empirical_bernstein_radius(ratio, span, delta)
            lo, hi = ratio_bias_interval(float(values[:, j].min()), float(values[:, j].max()), b, var_b, cov_ab)
            predicted = delta_method_bias(exact_ratio, b, var_b, cov_ab)
            s_sig = r_ratio / abs(bias) if bias != 0 else math.inf
            s_int = abs(bias - (lo + hi) / 2) / ((hi - lo) / 2 + r_ratio)  # <= 1 iff bias in [lo - r, hi + r]
            stat_all += [s_a, s_int]
            significance.append(s_sig)
            tag = f"query {i}, value column {j}"
            if not s_a <= 1.0:
                reasons.append(f"{tag}: numerator estimate {median_of_means(a_hat, groups):.5g} vs exact {num:.5g}, "
                               f"{s_a:.3g} radii away")
            if not s_int <= 1.0:
                reasons.append(f"{tag}: ratio bias {bias:.4g} outside the exact interval [{lo:.4g}, {hi:.4g}] "
                               f"widened by its radius {r_ratio:.3g}")
            row["columns"].append({"numerator_exact": num, "numerator_mom": median_of_means(a_hat, groups),
                                   "numerator_radius": r_a, "numerator_ratio": s_a, "ratio_exact": exact_ratio,
                                   "ratio_mean": float(ratio.mean()), "ratio_bias": bias, "ratio_radius": r_ratio,
                                   "bias_interval": [lo, hi], "interval_stat": s_int,
                                   "delta_method_bias": predicted, "bias_over_prediction": bias / predicted,
                                   "radius_over_bias": s_sig})
        rows.append(row)
    best = min(significance)
    stat_all.append(best)
    if not best <= 1.0:
        reasons.append(f"no ratio bias beyond its radius (smallest radius / |bias| = {best:.3g}): the ratio's bias "
                       "is not shown")
    return judged(not reasons, max(stat_all), reasons,
                  statistic="max of: |MoM - exact| / radius (numerator, denominator); |bias - interval midpoint| / "
                            "(interval half-width + radius) per ratio (<= 1 iff the bias is in the exact interval "
                            "widened by the radius); min over ratios of radius / |bias| (some bias significant)",
                  bound="median of means with the exact covariance of the K_v (numerator, denominator); empirical "
                        "Bernstein on the ratio (a convex combination of the values: bounded by their range)",
                  bias_interval="E[A/B] - A/B in [(v_min Var B - Cov(A, B)) / B^2, (v_max Var B - Cov(A, B)) / B^2] "
                                "(exact: 1/B_hat = 1/B - D/B^2 + D^2/(B^2 B_hat), R = A_hat/B_hat in [v_min, v_max])",
                  delta_method="reported: E[A/B] - A/B ~ (A/B Var B - Cov(A, B)) / B^2",
                  noise_note="E[exp(g/tau)] = Gamma(1 - 1/tau) for tau > 1, infinite for tau <= 1: unbiased over W, "
                             "conditional on g",
                  alpha=alpha, delta_per_case=delta, draws=draws, m=GU_M, tau=GU_TAU, d=D, gumbel=g.tolist(),
                  values=values.tolist(),
                  cases=rows)


# ------------------------------------------------------------------------------ registry


def checks() -> list[Check]:
    kw = dict(threshold=1.0, compare="<=", unit="ratio")
    return [
        Check("wu22/lemma-1", "PRF at the 1/sqrt(tau) scaling: E = exp(q.k/tau), Var = Lemma 1's", "wu22 Lemma 1 "
              "(App. B, Prop. 1)", "statistical", _lemma_1, **kw),
        Check("wu22/theorem-1", "kernel error quantile <= sqrt(exp(6r/tau)/(m eps)) holds with r = squared norm, "
              "fails as printed (r = norm)", "wu22 Thm. 1, App. B.1", "erratum", _theorem_1, **kw),
        Check("wu22/lemma-2", "P(x_i + g_i > x_j + g_j) = sigmoid(x_i - x_j) for Gumbel noise",
              "wu22 App. B.2, Prop. 2", "statistical", _lemma_2, **kw),
        Check("wu22/lemma-3", "Concrete argmax frequency = alpha / sum alpha; samples approach one-hot as tau -> 0",
              "wu22 App. B.2, Prop. 3", "statistical", _lemma_3, **kw),
        Check("wu22/theorem-2", "kernelized Gumbel-softmax approaches the categorical softmax(q.k) as tau shrinks",
              "wu22 Thm. 2, App. B.2", "statistical", _theorem_2, **kw),
        Check("wu22/large-tau", "kernelized Gumbel-softmax weights approach 1/N as tau grows",
              "wu22 Sec. 3.2, Remark", "bound", _large_tau, **kw),
        Check("wu22/gumbel-unbiased", "Eq. 7 numerator and denominator unbiased for Eq. 6 given g; the ratio is biased",
              "wu22 Eqs. 6-7", "statistical", _gumbel_unbiased, **kw),
    ]
