"""Claims of reid25 about graph random features (GRF; docs/papers.md Sec. 3).

The fast path is what users run: ``fast.walks.sample_walks`` draws the walks and
``fast.masks.grf`` builds G and the mask operators; the truth is dense (NumPy, this module's exact
moments below and ``reference.masks.grf``).

reid25/unbiased            E[M_hat] = (sum_k f_k W^k)^2 entrywise, M_hat = G_q G_k^T with
                           independent query- and key-side ensembles (Eq. 10). Bernstein radius per
                           entry from the EXACT variance of M_hat_ij (below) and the sure bound
                           |M_hat_ij| <= c^2.
reid25/theorem-3.1         P(|phi_i.phi_j - M_ij| > t) <= 2 exp(-t^2 n^3 / (2 (2n-1)^2 c^4)): exceedance
                           counts over independent trials, violation only where the one-sided
                           Clopper-Pearson lower bound exceeds the bound; tightness (k/R) / B(t).
reid25/lemma-3.2           nnz(phi_hat(v_i)) <= n ceil(b) + 1 with probability >= 1 - delta
                           (Clopper-Pearson on the exceedance count), and the mean nnz stays in a band
                           independent of N (2-D grids N = 2^8..2^12 quick, ..2^14 full).
reid25/rate                ||M_hat - M||_F / ||M||_F against walks n (2..256): the log-log slope's CI
                           holds the slope of the exact error law sqrt((a/n + b/n^2)) / ||M|| over the same
                           grid (-1/2 as n grows; -0.5085 over this grid, the offset reported).
reid25/diagonal-bias       a shared ensemble (G_q = G_k) biases the diagonal by exactly tr Cov(phi_i),
                           independent ensembles do not; off-diagonals unbiased in both.
reid25/algorithm-2         grf-asym (fast GRFAsymMask in fast.masked_linear_attention) equals its
                           dense twin on identical walks; Algorithm 2 as printed (/ (S_i n)) is off by
                           exactly the factor n (erratum: the printed form must fail, the corrected pass).
reid25/variance-reduction  antithetic termination, repelling walks and both together keep the mean and
                           cut the total variance E||M_hat - M||_F^2 below the iid walkers' exact value
                           (itself measured against the formula in the same check).

Exact moments (``exact_moments``). One walk from i gives x = sum_{t <= T} f_t load_t e_{u_t}
(T = min(K, i_max), K = len(f) - 1). A hop u -> v happens with probability (1 - p) / d_u and
multiplies the load by W_uv d_u / (1 - p), so E[load_t 1{u_t = a}] = (W^t)_ia and
E[load_t^2 1{u_t = a}] = (B^t)_ia with B_uv = W_uv^2 d_u / (1 - p); for t < s the Markov property
gives E[load_t load_s 1{u_t = a, u_s = b}] = (B^t)_ia (W^(s-t))_ab. Hence mu_i = E x = row i of
Phi = sum_t f_t W^t and the single-walk covariance C_i = E[x x^T] - mu_i mu_i^T exactly. With n iid
walkers phi_i = mean of n such x, and for independent phi_i, phi'_j (independent ensembles, or
i != j in one ensemble):

    Var(phi_i . phi'_j) = (mu_j^T C_i mu_j + mu_i^T C_j mu_i) / n + <C_i, C_j>_F / n^2,
    E[phi_i . phi_i] = |mu_i|^2 + tr(C_i) / n          (one shared ensemble: the diagonal bias).

Sure bounds: |load_t| <= r^t with r = max_{uv} W_uv d_u / (1 - p), so ||phi_i||_1 <= c =
sum_{t <= T} |f_t| r^t (Thm 3.1's c) and |M_hat_ij| <= c^2, |M_ij| <= c^2.

Draws: R independent draws are R disjoint copies of the small graph in one graph (a block-diagonal
W), sampled by ONE call of the fast sampler (walks of different nodes are independent); the R
blocks of M_hat come out of one ``GRFMask.matmul`` with a stack of identity blocks.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.sparse as sp
import torch
from scipy import stats

from fast.attention import masked_linear_attention
from fast.graphs import as_graph
from fast.masks.grf import GRFAsymMask, GRFMask, grf_features
from fast.walks import sample_walks
from measure.timing import fit_exponent
from reference.attention import masked_kernel_attention
from reference.graphs import adjacency, degree, normalized_adjacency
from reference.masks.grf import grf_asym_attention, grf_asym_attention_printed, grf_asym_mask
from results.check import Check, Context, Outcome, judged
from verify.plots import plot, series
from verify.problems import erdos_renyi, grid_graph, path_graph, rng_for
from verify.stats import bernstein_radius, check_alpha, clopper_pearson_lower

SOURCE = "reid25"


# ------------------------------------------------------------------------------ settings


def heat_f(beta: float, k_max: int) -> np.ndarray:
    """f_k = (beta / 2)^k / k!, k = 0..k_max: Phi = sum f_k W^k truncates exp(beta W / 2), M ~ exp(beta W)."""
    return np.array([(beta / 2) ** k / math.factorial(k) for k in range(k_max + 1)])


@dataclasses.dataclass(frozen=True)
class Setting:
    """A small graph W (scipy CSR, the weighted adjacency the walks run on) and a GRF estimator on it."""

    name: str
    adj: sp.csr_matrix
    f: np.ndarray
    p_halt: float
    n_walkers: int
    i_max: int | None

    @property
    def n(self) -> int:
        return self.adj.shape[0]

    def describe(self) -> dict:
        return {"graph": self.name, "N": self.n, "f": [float(v) for v in self.f], "p_halt": self.p_halt,
                "n_walkers": self.n_walkers, "i_max": self.i_max}


def grid_setting(n_walkers: int = 4) -> Setting:
    """The ViT patch graph of reid25 in small: a 4 x 4 grid, W = D^-1/2 A D^-1/2, heat f (beta = 1),
    p_halt = 0.5, i_max = 3 (degrees 2, 3, 4)."""
    return Setting("grid 4x4, normalized adjacency", normalized_adjacency(grid_graph((4, 4))), heat_f(1.0, 3), 0.5,
                   n_walkers, 3)


def irregular_setting() -> Setting:
    """An irregular 12-node graph: Erdos-Renyi plus a self-loop and an isolated node, normalized
    adjacency, signed f, p_halt = 0.3, n = 2 walkers, no cap (only prefixes t <= 3 count)."""
    a = erdos_renyi(11, 0.3, seed=5).tolil()
    a[0, 0] = 1.0  # a self-loop: counts 1 in the degree, the walker may stay
    a = sp.block_diag([a.tocsr(), sp.csr_matrix((1, 1))], format="csr")  # node 11 isolated
    adj = normalized_adjacency(adjacency(a))
    return Setting("Erdos-Renyi 11 + self-loop + isolated node, normalized adjacency", adj,
                   np.array([0.8, -0.5, 0.3, -0.2]), 0.3, 2, None)


def regular_setting(n_walkers: int, f: tuple[float, ...] = (1.0, 1.0), n_nodes: int = 6,
                    p_halt: float = 0.5) -> Setting:
    """Thm 3.1 in its regime: a cycle C_N with W = (1 - p) A / 2, so every load is exactly 1
    (r = max W d / (1 - p) = 1) and c = sum |f_k|, the smallest c a given f allows."""
    cyc = path_graph(n_nodes).tolil()
    cyc[0, n_nodes - 1] = cyc[n_nodes - 1, 0] = 1.0
    adj = adjacency(cyc.tocsr() * ((1 - p_halt) / 2))
    return Setting(f"cycle C_{n_nodes}, W = (1 - p) A / 2 (loads 1)", adj, np.asarray(f, float), p_halt, n_walkers,
                   len(f) - 1)


# ------------------------------------------------------------------------------ exact moments


def top_prefix(s: Setting) -> int:
    """T = min(K, i_max): the longest prefix that counts."""
    k = len(s.f) - 1
    return k if s.i_max is None else min(k, s.i_max)


def load_rate(s: Setting) -> float:
    """r = max over stored entries of W_uv d_u / (1 - p_halt): the largest factor one hop puts on a load."""
    a = sp.csr_matrix(s.adj)
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    if a.nnz == 0:
        return 0.0
    return float(np.max(np.abs(a.data) * degree(a)[rows]) / (1 - s.p_halt))


def c_constant(s: Setting) -> float:
    """Thm 3.1's c = sum_{k <= T} |f_k| r^k (>= ||phi_i||_1 surely, so |M_hat_ij| <= c^2)."""
    r = load_rate(s)
    return float(sum(abs(s.f[k]) * r**k for k in range(top_prefix(s) + 1)))


def exact_moments(s: Setting) -> tuple[np.ndarray, np.ndarray]:
    """(mu (N, N), C (N, N, N)): mu[i] = E x for one walk of node i (row i of Phi = sum f_t W^t),
    C[i] = E[x x^T] - mu_i mu_i^T its covariance (module docstring)."""
    a = sp.csr_matrix(s.adj)
    w = a.toarray()
    d = degree(a).astype(float)
    b = (w * w) * d[:, None] / (1 - s.p_halt)
    top = top_prefix(s)
    n = s.n
    wp = [np.eye(n)]
    bp = [np.eye(n)]
    for _ in range(top):
        wp.append(wp[-1] @ w)
        bp.append(bp[-1] @ b)
    f = s.f
    mu = sum(f[t] * wp[t] for t in range(top + 1))
    second = np.zeros((n, n, n))
    for t in range(top + 1):
        bt = bp[t]  # bt[i, a] = E[load_t^2 1{u_t = a}] for walks of i
        second[:, np.arange(n), np.arange(n)] += f[t] ** 2 * bt
        for u in range(t + 1, top + 1):
            cross = f[t] * f[u] * bt[:, :, None] * wp[u - t][None, :, :]  # [i, a, b] = (B^t)_ia (W^(u-t))_ab
            second += cross + cross.transpose(0, 2, 1)
    cov = second - mu[:, :, None] * mu[:, None, :]
    return mu, cov


def independent_variance(mu: np.ndarray, cov: np.ndarray, n_walkers: int) -> np.ndarray:
    """Var(phi_i . phi'_j) (N, N) for independent phi_i, phi'_j, each a mean of n iid walks."""
    quad = np.einsum("ja,iab,jb->ij", mu, cov, mu)  # mu_j^T C_i mu_j
    inner = np.einsum("iab,jab->ij", cov, cov)
    return (quad + quad.T) / n_walkers + inner / n_walkers**2


def exact_mask(mu: np.ndarray) -> np.ndarray:
    """M = Phi Phi^T = (sum_t f_t W^t)^2 for symmetric W."""
    return mu @ mu.T


# ------------------------------------------------------------------------------ draws


def copies_graph(s: Setting, copies: int):
    """R disjoint copies of the setting's graph as one fast Graph (block-diagonal W)."""
    return as_graph(sp.kron(sp.identity(copies, format="csr"), sp.csr_matrix(s.adj), format="csr"))


#: Walkers per ensemble sampled at once: bounds the memory of one batch of copies.
CHUNK_WALKERS = 1 << 20


def draw_masks(s: Setting, copies: int, generator: torch.Generator, *, n_walkers: int | None = None,
               shared: bool = False, antithetic: bool = False, repelling: bool = False) -> np.ndarray:
    """(copies, N, N) independent draws of M_hat (GRFMask: G_q G_k^T, or G G^T with shared=True)
    by the fast sampler and operator on disjoint copies of the graph, CHUNK_WALKERS walkers at a time."""
    n_walkers = s.n_walkers if n_walkers is None else n_walkers
    per_chunk = max(1, CHUNK_WALKERS // (s.n * n_walkers))
    out = np.empty((copies, s.n, s.n))
    for start in range(0, copies, per_chunk):
        stop = min(copies, start + per_chunk)
        out[start:stop] = _draw_chunk(s, stop - start, generator, n_walkers, shared, antithetic, repelling)
    return out


def _draw_chunk(s: Setting, copies: int, generator: torch.Generator, n_walkers: int, shared: bool, antithetic: bool,
                repelling: bool) -> np.ndarray:
    g = copies_graph(s, copies)
    kw = dict(p_halt=s.p_halt, i_max=s.i_max, antithetic=antithetic, repelling=repelling, generator=generator)
    f = torch.as_tensor(s.f, dtype=torch.float64)
    walks_q = sample_walks(g, n_walkers, **kw)
    feats_q = grf_features(g, walks_q, f)
    feats_k = None
    if not shared:
        walks_k = sample_walks(g, n_walkers, **kw)
        feats_k = grf_features(g, walks_k, f)
    op = GRFMask(feats_q, feats_k)
    x = torch.eye(s.n, dtype=torch.float64).repeat(copies, 1)  # block r of M_hat = rows r N..(r+1) N of M_hat x
    with torch.no_grad():
        y = op.matmul(x)
    return y.reshape(copies, s.n, s.n).numpy()


def _generator(seed: int, *salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng_for(seed, 120, *salt).integers(2**62)))


def _bernstein_entries(draws: np.ndarray, exact: np.ndarray, variance: np.ndarray, bound: float,
                       delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(|mean - exact| / radius, radius), entrywise: Bernstein radius for the mean of R draws with the
    exact variance and |X - E X| <= bound surely."""
    r = draws.shape[0]
    radius = np.vectorize(lambda v: bernstein_radius(math.sqrt(max(v, 0.0)), bound, r, delta))(variance)
    return np.abs(draws.mean(axis=0) - exact) / radius, radius


def _deviation_bound(s: Setting) -> float:
    """Sure bound on |M_hat_ij - M_ij|: c^2 when f >= 0 (both lie in [0, c^2]), else 2 c^2."""
    c2 = c_constant(s) ** 2
    return c2 if (s.f >= 0).all() else 2 * c2


# ------------------------------------------------------------------------------ reid25/unbiased

UNBIASED_DRAWS = {True: 10_000, False: 100_000}


def _unbiased(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    settings = [grid_setting(), irregular_setting()]
    cases = sum(s.n**2 for s in settings)
    delta = alpha / cases
    draws = UNBIASED_DRAWS[ctx.quick]
    rows, worst, reasons = [], 0.0, []
    for k, s in enumerate(settings):
        mu, cov = exact_moments(s)
        exact = exact_mask(mu)
        var = independent_variance(mu, cov, s.n_walkers)
        m_hat = draw_masks(s, draws, _generator(ctx.seed, 1, k))
        z, radius = _bernstein_entries(m_hat, exact, var, _deviation_bound(s), delta)
        i, j = np.unravel_index(int(np.argmax(z)), z.shape)
        worst = max(worst, float(z.max()))
        rel = float(np.linalg.norm(m_hat.mean(axis=0) - exact) / np.linalg.norm(exact))
        if not z.max() <= 1.0:
            reasons.append(f"{s.name}: entry ({i}, {j}) mean {m_hat[:, i, j].mean():.4g} vs exact {exact[i, j]:.4g}, "
                           f"{z[i, j]:.3g} radii away ({int((z > 1).sum())} entries beyond their radius)")
        rows.append({**s.describe(), "c": c_constant(s), "worst_entry": [int(i), int(j)], "worst_ratio": float(z.max()),
                     "median_radius": float(np.median(radius)), "max_radius": float(radius.max()),
                     "relative_frobenius_error_of_mean": rel, "max_exact_entry": float(np.abs(exact).max())})
    return judged(not reasons, worst, reasons,
                  statistic="max over entries and settings of |mean of M_hat_ij - M_ij| / radius_ij",
                  bound="Bernstein: exact Var(M_hat_ij) (independent ensembles) and |M_hat_ij - M_ij| <= c^2 "
                        "(2 c^2 for signed f)",
                  alpha=alpha, delta_per_case=delta, draws=draws, cases=rows)


# ------------------------------------------------------------------------------ reid25/theorem-3.1

THM31_WALKERS = 64
THM31_BOUNDS = (0.3, 0.1, 0.01, 0.002)  # the B(t) at which t is placed (t = B^-1)
THM31_DRAWS = {True: 2_000, False: 20_000}


def theorem_31_bound(t: float, n: int, c: float) -> float:
    """B(t) = 2 exp(-t^2 n^3 / (2 (2n - 1)^2 c^4)) (reid25 Thm 3.1)."""
    return 2.0 * math.exp(-t * t * n**3 / (2.0 * (2 * n - 1) ** 2 * c**4))


def theorem_31_t(b: float, n: int, c: float) -> float:
    """The t with B(t) = b."""
    return math.sqrt(math.log(2.0 / b) * 2.0 * (2 * n - 1) ** 2 * c**4 / n**3)


def thm31_settings() -> list[Setting]:
    """Where c is small enough for the bound to bite: loads exactly 1 (rescaled W), i_max 1 and 2;
    and f = (1, 0.1), whose diagonal M_ii ~ 1 sits near c^2 = 1.21, so even the bound's large t
    (0.48 .. 0.92 c^2 at n = 64) is below |M_ii|: an estimator off by the size of the mask (a zero
    or halved mask) exceeds t in every draw. The bound itself is loose here (Hoeffding's constants:
    the largest deviation seen is ~0.2 t), so the check catches gross errors, not small biases
    (reid25/unbiased does)."""
    return [regular_setting(THM31_WALKERS, (1.0, 1.0)), regular_setting(THM31_WALKERS, (0.5, 0.3, 0.2)),
            regular_setting(THM31_WALKERS, (1.0, 0.1))]


def _theorem_31(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    settings = thm31_settings()
    cases = sum(s.n**2 for s in settings) * len(THM31_BOUNDS)
    delta = alpha / cases
    draws = THM31_DRAWS[ctx.quick]
    rows, worst, reasons = [], 0.0, []
    tight, tight_upper, largest_dev = 0.0, 0.0, 0.0
    for k, s in enumerate(settings):
        mu, _ = exact_moments(s)
        exact = exact_mask(mu)
        c = c_constant(s)
        dev = np.abs(draw_masks(s, draws, _generator(ctx.seed, 2, k)) - exact)
        for b in THM31_BOUNDS:
            t = theorem_31_t(b, s.n_walkers, c)
            count = (dev > t).sum(axis=0)  # (N, N) exceedances per entry
            kmax = int(count.max())
            lower = clopper_pearson_lower(kmax, draws, 1 - delta)
            # 95% one-sided Clopper-Pearson upper bound: how loose the bound is at least, as a number to read
            upper = float(stats.beta.ppf(0.95, kmax + 1, draws - kmax)) if kmax < draws else 1.0
            stat = lower / b
            worst = max(worst, stat)
            tight = max(tight, kmax / draws / b)
            tight_upper = max(tight_upper, upper / b)
            largest_dev = max(largest_dev, float(dev.max()) / t)
            if not lower <= b:
                i, j = np.unravel_index(int(np.argmax(count)), count.shape)
                reasons.append(f"{s.name}, f = {[float(v) for v in s.f]}: entry ({i}, {j}) exceeds t = {t:.3g} "
                               f"in {kmax} of {draws} "
                               f"draws; Clopper-Pearson lower bound {lower:.3g} > B(t) = {b:g}")
            rows.append({**s.describe(), "c": c, "t": t, "t_over_c2": t / c**2, "bound": b, "max_exceedances": kmax,
                         "total_exceedances": int(count.sum()), "cp_lower": lower, "tightness": kmax / draws / b,
                         "tightness_upper95": upper / b, "max_deviation": float(dev.max())})
    return judged(not reasons, worst, reasons,
                  statistic="max over (setting, entry, t) of the one-sided Clopper-Pearson lower bound on "
                            "P(|M_hat_ij - M_ij| > t) divided by B(t) = 2 exp(-t^2 n^3 / (2 (2n-1)^2 c^4))",
                  tightness_ratio=tight, tightness_ratio_upper95=tight_upper, largest_deviation_over_t=largest_dev,
                  tightness="(k/R) / B(t), worst case; tightness_ratio_upper95 with the 95% Clopper-Pearson upper "
                            "bound on k/R; largest_deviation_over_t: max |M_hat_ij - M_ij| seen / t "
                            "(< 1: no exceedance)",
                  alpha=alpha, delta_per_case=delta, draws=draws, n_walkers=THM31_WALKERS, cases=rows)


# ------------------------------------------------------------------------------ reid25/lemma-3.2

LEMMA_DELTA = 0.01
LEMMA_WALKERS, LEMMA_P = 4, 0.5
LEMMA_LOG2N = {True: tuple(range(8, 13)), False: tuple(range(8, 15))}
LEMMA_F = heat_f(1.0, 40)  # f_t > 0 for every prefix that can occur: no entry cancels


def lemma_32_b(n: int, p: float, delta: float) -> float:
    """b = log(1 - (1 - delta)^(1/n)) / log(1 - p) (reid25 Lemma 3.2)."""
    return math.log(1 - (1 - delta) ** (1 / n)) / math.log(1 - p)


def lemma_32_bound(n: int, p: float, delta: float) -> int:
    """n ceil(b) + 1: the Lemma's nnz bound (+1 for the start node)."""
    return n * math.ceil(lemma_32_b(n, p, delta)) + 1


def nnz_band(n_nodes: int, n: int, p: float, delta: float) -> tuple[float, float]:
    """(low, high) with P(mean nnz outside) <= delta, from sure facts: 1 + 1{some walker hops} <=
    nnz_i <= 1 + (hops of node i's walks). Over N nodes the hops sum to NegBin(N n, p) (failures
    before N n halts, uncapped walks); the nodes with a hop are Binomial(N, 1 - p^n) (no isolated
    nodes, no self-loops: the first hop reaches a new node). Both limits tend to constants in N."""
    high = 1.0 + float(stats.nbinom.isf(delta / 2, n_nodes * n, p)) / n_nodes
    low = 1.0 + float(stats.binom.ppf(delta / 2, n_nodes, 1 - p**n)) / n_nodes
    return low, high


def _lemma_32(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    sizes = [2**e for e in LEMMA_LOG2N[ctx.quick]]
    bound = lemma_32_bound(LEMMA_WALKERS, LEMMA_P, LEMMA_DELTA)
    delta = alpha / (1 + len(sizes))  # the pooled exceedance test + one band per N
    rows, means, reasons = [], [], []
    exceed, total, band_stat = 0, 0, 0.0
    for k, e in enumerate(LEMMA_LOG2N[ctx.quick]):
        shape = (2 ** (e // 2), 2 ** (e - e // 2))  # exactly N = 2^e nodes
        n_nodes = shape[0] * shape[1]
        g = as_graph(normalized_adjacency(grid_graph(shape)))
        walks = sample_walks(g, LEMMA_WALKERS, p_halt=LEMMA_P, generator=_generator(ctx.seed, 3, k))
        nnz = grf_features(g, walks, torch.as_tensor(LEMMA_F)).nnz_per_row.numpy()
        low, high = nnz_band(n_nodes, LEMMA_WALKERS, LEMMA_P, delta)
        mean = float(nnz.mean())
        means.append(mean)
        exceed += int((nnz > bound).sum())
        total += n_nodes
        # position in the band: 1 at either edge, > 1 outside
        mid, half = (high + low) / 2, (high - low) / 2
        band_stat = max(band_stat, abs(mean - mid) / half)
        if not low <= mean <= high:
            reasons.append(f"N = {n_nodes}: mean nnz {mean:.3f} outside [{low:.3f}, {high:.3f}] "
                           "(a band independent of N)")
        rows.append({"N": n_nodes, "grid": list(shape), "mean_nnz": mean, "max_nnz": int(nnz.max()),
                     "exceedances": int((nnz > bound).sum()), "band": [low, high]})
    lower = clopper_pearson_lower(exceed, total, 1 - delta)
    if not lower <= LEMMA_DELTA:
        reasons.append(f"{exceed} of {total} features have nnz > {bound}: Clopper-Pearson lower bound {lower:.3g} "
                       f"> delta = {LEMMA_DELTA}")
    fit = fit_exponent(sizes, means)
    stat = max(lower / LEMMA_DELTA, band_stat)
    return judged(not reasons, stat, reasons,
                  statistic="max(Clopper-Pearson lower bound on P(nnz > n ceil(b) + 1) / delta, max over N of "
                            "|mean nnz - band centre| / band half-width)",
                  nnz_bound=bound, b=lemma_32_b(LEMMA_WALKERS, LEMMA_P, LEMMA_DELTA), lemma_delta=LEMMA_DELTA,
                  n_walkers=LEMMA_WALKERS, p_halt=LEMMA_P, exceedances=exceed, features=total,
                  exceedance_fraction=exceed / total, cp_lower=lower, mean_nnz_slope=fit.to_dict(),
                  mean_nnz_max_over_min=max(means) / min(means), alpha=alpha, delta_per_case=delta, sizes=rows,
                  plots=[plot("GRF feature sparsity vs N", "N (2-D grid)", "nonzeros per feature row",
                              [series("mean nnz", sizes, means,
                                      lower=[r["band"][0] for r in rows], upper=[r["band"][1] for r in rows]),
                               series("max nnz", sizes, [r["max_nnz"] for r in rows]),
                               series(f"Lemma 3.2 bound n ceil(b) + 1 (delta = {LEMMA_DELTA})", sizes,
                                      [bound] * len(sizes), kind="bound")], ylog=False)])


# ------------------------------------------------------------------------------ reid25/rate

RATE_WALKERS = (2, 4, 8, 16, 32, 64, 128, 256)
RATE_DRAWS = {True: 250, False: 2000}
#: The exact curve's finite-grid slope may differ from -1/2 by at most this (it is -0.5085 here).
RATE_MAX_OFFSET = 0.02


def exact_relative_mse(mu: np.ndarray, cov: np.ndarray, n: int) -> float:
    """E ||M_hat - M||_F^2 / ||M||_F^2 = (a / n + b / n^2) / ||M||^2 for n iid walkers, independent ensembles."""
    m = exact_mask(mu)
    return float(independent_variance(mu, cov, n).sum() / np.sum(m * m))


def _slope_weights(x: np.ndarray) -> np.ndarray:
    """w with LS slope = w . y for abscissae x."""
    xc = x - x.mean()
    return xc / np.sum(xc * xc)


def _rate(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    s = grid_setting()
    mu, cov = exact_moments(s)
    exact = exact_mask(mu)
    norm2 = float(np.sum(exact * exact))
    draws = RATE_DRAWS[ctx.quick]
    ns = np.array(RATE_WALKERS, dtype=float)
    mse, var_log = [], []
    for k, n in enumerate(RATE_WALKERS):
        m_hat = draw_masks(s, draws, _generator(ctx.seed, 4, k), n_walkers=n)
        e2 = np.sum((m_hat - exact) ** 2, axis=(1, 2)) / norm2  # squared relative errors, (draws,)
        mse.append(float(e2.mean()))
        # delta method: Var(log sqrt(mean e2)) = Var(e2) / (4 R mean^2)
        var_log.append(float(e2.var(ddof=1) / (4 * draws * e2.mean() ** 2)))
    x = np.log(ns)
    w = _slope_weights(x)
    y = 0.5 * np.log(mse)
    slope = float(w @ y)
    se = float(math.sqrt(np.sum(w * w * np.array(var_log))))
    z = float(stats.norm.isf(alpha / 2))
    # the exact error curve is sqrt((a / n + b / n^2) / ||M||^2) with a, b >= 0 (module docstring): slope -1/2
    # as n grows, a little steeper over a finite grid (the b / n^2 term). The fit is tested against the exact
    # curve's own least-squares slope over the same grid, and that slope's offset from -1/2 is reported.
    exact_curve = 0.5 * np.log([exact_relative_mse(mu, cov, int(n)) for n in ns])
    exact_slope = float(w @ exact_curve)
    stat = abs(slope - exact_slope) / (z * se)
    reasons = []
    if not stat <= 1.0:
        reasons.append(f"fitted slope {slope:.4f} of log relative Frobenius error vs log n is "
                       f"{abs(slope - exact_slope):.4f} from the n^-1/2 law's slope {exact_slope:.4f} over this grid, "
                       f"beyond z SE = {z:.2f} x {se:.4f}")
    if not abs(exact_slope + 0.5) <= RATE_MAX_OFFSET:  # a design guard: the grid must sit where -1/2 rules
        reasons.append(f"the exact curve's slope {exact_slope:.4f} over this grid is more than {RATE_MAX_OFFSET} "
                       "from -1/2: the grid starts too low")
    return judged(not reasons, stat, reasons,
                  statistic="|fitted slope - slope of the exact n^-1/2 law over the grid| / (z_{1-alpha/2} SE)",
                  slope=slope, ci=[slope - z * se, slope + z * se], ci_confidence=1 - alpha, se=se,
                  exact_curve_slope=exact_slope, exact_slope_offset_from_minus_half=exact_slope + 0.5,
                  minus_half_in_ci_widened_by_offset=bool(abs(slope + 0.5) <= z * se + abs(exact_slope + 0.5)),
                  n_walkers=list(RATE_WALKERS), rms_relative_error=[math.sqrt(v) for v in mse],
                  exact_rms_relative_error=[float(math.exp(v)) for v in exact_curve],
                  se_method="delta method with the empirical variance of the squared errors (normal approximation)",
                  alpha=alpha, delta_per_case=alpha, draws_per_n=draws, setting=s.describe(),
                  plots=[_rate_plot(s, [math.sqrt(v) for v in mse], [float(math.exp(v)) for v in exact_curve],
                                    math.sqrt(norm2))])


#: The per-entry exceedance probability at which reid25/rate's figure draws Theorem 3.1's deviation.
RATE_PLOT_B = 0.05


def _rate_plot(s: Setting, rms: list[float], exact_rms: list[float], mask_norm: float) -> dict:
    """Relative Frobenius error vs walkers n: measured, the exact n^-1/2 law, and what Thm 3.1
    implies: with every entry within t(n) (B(t) = RATE_PLOT_B each), |M_hat - M|_F <= N t(n)."""
    n = list(RATE_WALKERS)
    c = c_constant(s)
    thm = [s.n * theorem_31_t(RATE_PLOT_B, k, c) / mask_norm for k in n]
    return plot("GRF error vs walks", "walkers per node n", "relative Frobenius error of M_hat",
                [series("measured (RMS over draws)", n, rms), series("exact law sqrt(a/n + b/n^2)", n, exact_rms,
                                                                     kind="line"),
                 series(f"Thm 3.1: N t(n) / |M|_F at B(t) = {RATE_PLOT_B:g} per entry", n, thm, kind="bound")])


# ------------------------------------------------------------------------------ reid25/diagonal-bias

DIAG_DRAWS = {True: 20_000, False: 100_000}
DIAG_WALKERS = 2  # the bias is tr Cov / n: few walkers show it clearly


def _diagonal_bias(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    s = grid_setting(DIAG_WALKERS)
    mu, cov = exact_moments(s)
    exact = exact_mask(mu)
    n, nn = s.n_walkers, s.n
    c2 = c_constant(s) ** 2
    var = independent_variance(mu, cov, n)
    off = ~np.eye(nn, dtype=bool)
    cases = 2 * (nn * nn - nn) + 3  # off-diagonals of both, independent trace, shared trace (bias, formula)
    delta = alpha / cases
    draws = DIAG_DRAWS[ctx.quick]
    reasons = []
    ind = draw_masks(s, draws, _generator(ctx.seed, 5, 0))
    sh = draw_masks(s, draws, _generator(ctx.seed, 5, 1), shared=True)
    # off-diagonals (independent in both: different start nodes), entrywise Bernstein
    z_ind, _ = _bernstein_entries(ind, exact, var, c2, delta)
    z_sh, _ = _bernstein_entries(sh, exact, var, c2, delta)
    off_worst = {"independent": float(z_ind[off].max()), "shared": float(z_sh[off].max())}
    for name, v in off_worst.items():
        if not v <= 1.0:
            reasons.append(f"{name} ensembles: an off-diagonal mean is {v:.3g} radii from exact")
    # mean diagonal (average over nodes: the nodes' walks are independent)
    diag_exact = float(np.trace(exact) / nn)
    bias_exact = float(np.trace(cov, axis1=1, axis2=2).mean() / n)  # mean over i of tr C_i / n
    t_ind = np.einsum("rii->r", ind) / nn
    t_sh = np.einsum("rii->r", sh) / nn
    var_ind = float(np.diag(var).sum() / nn**2)
    # shared: Var ||phi_i||^2 <= E ||phi_i||^4 <= c^2 E ||phi_i||^2 (||phi||_2^2 <= ||phi||_1^2 <= c^2)
    var_sh = float(c2 * (np.diag(exact) + np.trace(cov, axis1=1, axis2=2) / n).sum() / nn**2)
    r_ind = bernstein_radius(math.sqrt(var_ind), c2, draws, delta)
    r_sh = bernstein_radius(math.sqrt(var_sh), c2, draws, delta)
    bias_ind = float(t_ind.mean()) - diag_exact
    bias_sh = float(t_sh.mean()) - diag_exact
    if not abs(bias_ind) <= r_ind:
        reasons.append(f"independent ensembles: mean diagonal off by {bias_ind:.4g}, beyond the radius {r_ind:.3g}")
    if not bias_sh > r_sh:
        reasons.append(f"shared ensemble: mean diagonal bias {bias_sh:.4g} is not beyond the radius {r_sh:.3g}")
    if not abs(bias_sh - bias_exact) <= r_sh:
        reasons.append(f"shared ensemble: mean diagonal bias {bias_sh:.4g} differs from tr Cov / n = {bias_exact:.4g} "
                       f"by more than the radius {r_sh:.3g}")
    stat = max(off_worst["independent"], off_worst["shared"], abs(bias_ind) / r_ind, abs(bias_sh - bias_exact) / r_sh,
               r_sh / bias_sh if bias_sh > 0 else math.inf)
    return judged(not reasons, stat, reasons,
                  statistic="max(off-diagonal |mean - exact| / radius (both), |independent diagonal bias| / radius, "
                            "|shared bias - tr Cov / n| / radius, radius / shared bias)",
                  shared_mean_diagonal_bias=bias_sh, predicted_bias=bias_exact, shared_radius=r_sh,
                  independent_mean_diagonal_bias=bias_ind, independent_radius=r_ind, mean_exact_diagonal=diag_exact,
                  shared_bias_per_node=(np.diagonal(sh.mean(axis=0)) - np.diag(exact)).tolist(),
                  off_diagonal_worst=off_worst, alpha=alpha, delta_per_case=delta, draws=draws, setting=s.describe())


# ------------------------------------------------------------------------------ reid25/algorithm-2

ALG2_WALKERS = (2, 4, 8)
ALG2_TOL = 1e-10  # float64, identical walks: round-off only
ALG2_PRINTED_MUST_EXCEED = 1e-2  # the printed form is off by 1 - 1/n >= 1/2


def _alg2_problem(seed: int, n_walkers: int):
    rng = rng_for(seed, 121, n_walkers)
    adj = normalized_adjacency(grid_graph((5, 5)))
    g = as_graph(adj)
    walks = sample_walks(g, n_walkers, p_halt=0.5, i_max=4, generator=_generator(seed, 6, n_walkers))
    alpha = np.array([1.0, 0.5, 0.25, 0.1, 0.05])
    m, d = 8, 8
    phi_q = np.exp(rng.standard_normal((adj.shape[0], m)) * 0.5)  # positive features
    phi_k = np.exp(rng.standard_normal((adj.shape[0], m)) * 0.5)
    v = rng.standard_normal((adj.shape[0], d))
    return adj, g, walks, alpha, phi_q, phi_k, v


def _relerr(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def _algorithm_2(ctx: Context) -> Outcome:
    rows, worst, weakest_printed, worst_scaled = [], 0.0, math.inf, 0.0
    for n in ALG2_WALKERS:
        adj, g, walks, alpha, phi_q, phi_k, v = _alg2_problem(ctx.seed, n)
        walks_np = walks.to_numpy()
        mask = grf_asym_mask(adj, walks_np, alpha)
        dense = masked_kernel_attention(phi_q, phi_k, v, mask)
        op = GRFAsymMask(grf_features(g, walks, torch.as_tensor(alpha)))
        fast_out = masked_linear_attention(torch.as_tensor(phi_q), torch.as_tensor(phi_k), torch.as_tensor(v),
                                           op).numpy()
        corrected = grf_asym_attention(adj, walks_np, alpha, phi_q, phi_k, v)
        printed = grf_asym_attention_printed(adj, walks_np, alpha, phi_q, phi_k, v)
        errs = {"fast": _relerr(fast_out, dense), "corrected_loop": _relerr(corrected, dense),
                "printed": _relerr(printed, dense), "printed_times_n": _relerr(printed * n, dense)}
        worst = max(worst, errs["fast"], errs["corrected_loop"])
        weakest_printed = min(weakest_printed, errs["printed"])
        worst_scaled = max(worst_scaled, errs["printed_times_n"])
        rows.append({"n_walkers": n, **{f"{k}_relative_error": v for k, v in errs.items()}})
    reasons = []
    if not worst <= ALG2_TOL:
        reasons.append(f"grf-asym (fast, or Algorithm 2 corrected) differs from the dense twin by {worst:.3g} "
                       f"> {ALG2_TOL:g}")
    if not weakest_printed > ALG2_PRINTED_MUST_EXCEED:
        reasons.append(f"Algorithm 2 as printed is off by only {weakest_printed:.3g} <= {ALG2_PRINTED_MUST_EXCEED:g}: "
                       "the erratum is not shown")
    if not worst_scaled <= ALG2_TOL:
        reasons.append(f"Algorithm 2 as printed, times n, differs from the dense twin by {worst_scaled:.3g}: "
                       "the error is not exactly the factor n")
    return judged(not reasons, worst / ALG2_TOL, reasons,
                  statistic="max relative Frobenius error of grf-asym (fast and corrected loop) vs dense twin / 1e-10",
                  printed="out_i = f_i / (S_i n)", corrected="out_i = f_i / S_i",
                  weakest_printed_error=weakest_printed, printed_must_exceed=ALG2_PRINTED_MUST_EXCEED,
                  printed_times_n_worst_error=worst_scaled, tolerance=ALG2_TOL, cases=rows)


# ------------------------------------------------------------------------------ reid25/variance-reduction

VR_DRAWS = {True: 10_000, False: 100_000}
VR_MODES = {"antithetic": {"antithetic": True}, "repelling": {"repelling": True},
            "antithetic+repelling": {"antithetic": True, "repelling": True}}


def _variance_reduction(ctx: Context) -> Outcome:
    alpha = check_alpha(ctx.quick)
    s = grid_setting()
    mu, cov = exact_moments(s)
    exact = exact_mask(mu)
    var_iid = independent_variance(mu, cov, s.n_walkers)
    total_iid = float(var_iid.sum())
    bound = _deviation_bound(s)
    draws = VR_DRAWS[ctx.quick]
    # cases: per mode, N^2 mean entries + 1 variance ratio; plus the iid variance against its formula
    cases = len(VR_MODES) * (s.n**2 + 1) + 1
    delta = alpha / cases
    z1 = float(stats.norm.isf(delta))       # one-sided
    z2 = float(stats.norm.isf(delta / 2))   # two-sided
    reasons, rows = [], {}
    iid = draw_masks(s, draws, _generator(ctx.seed, 7, 0))
    y = np.sum((iid - exact) ** 2, axis=(1, 2))
    iid_ratio, iid_se = float(y.mean() / total_iid), float(y.std(ddof=1) / math.sqrt(draws) / total_iid)
    if not abs(iid_ratio - 1) <= z2 * iid_se:
        reasons.append(f"iid walkers: E||M_hat - M||^2 / formula = {iid_ratio:.4f}, beyond {z2:.2f} x SE {iid_se:.4f} "
                       "from 1")
    stat = abs(iid_ratio - 1) / (z2 * iid_se)
    for k, (mode, kw) in enumerate(VR_MODES.items(), start=1):
        m_hat = draw_masks(s, draws, _generator(ctx.seed, 7, k), **kw)
        # mean: entrywise Bernstein; the coupled walkers' variance has no formula, so sigma^2 is the larger
        # of the iid formula and the sample variance (a plug-in: a few entries' variance does grow)
        sample_var = np.var(m_hat, axis=0, ddof=1)
        zmean, _ = _bernstein_entries(m_hat, exact, np.maximum(var_iid, sample_var), bound, delta)
        y = np.sum((m_hat - exact) ** 2, axis=(1, 2))
        ratio = float(y.mean() / total_iid)
        se = float(y.std(ddof=1) / math.sqrt(draws) / total_iid)
        upper = ratio + z1 * se
        entry_ratio = sample_var[var_iid > 0] / var_iid[var_iid > 0]
        rows[mode] = {"variance_ratio": ratio, "variance_ratio_upper": upper, "se": se,
                      "mean_worst_ratio": float(zmean.max()),
                      "entrywise_variance_ratio_median": float(np.median(entry_ratio)),
                      "entrywise_variance_ratio_max": float(entry_ratio.max())}
        if not zmean.max() <= 1.0:
            reasons.append(f"{mode}: an entry's mean is {zmean.max():.3g} radii from exact (the mean moved)")
        if not upper < 1.0:
            reasons.append(f"{mode}: total variance ratio {ratio:.4f} (upper bound {upper:.4f}) is not below 1")
        stat = max(stat, float(zmean.max()), upper)
    return judged(not reasons, stat, reasons,
                  statistic="max(entry mean |mean - exact| / radius, upper confidence bound of E||M_hat - M||_F^2 / "
                            "the iid formula, per mode; iid measured / formula in z SE units)",
                  antithetic_variance_ratio=rows["antithetic"]["variance_ratio"],
                  repelling_variance_ratio=rows["repelling"]["variance_ratio"],
                  both_variance_ratio=rows["antithetic+repelling"]["variance_ratio"],
                  iid_measured_over_formula=iid_ratio, iid_se=iid_se, total_iid_variance=total_iid,
                  bound="mean: Bernstein, sigma^2 = max(iid formula, sample variance) per entry; variance: normal "
                        "approximation "
                        "(empirical SE of ||M_hat - M||_F^2)",
                  alpha=alpha, delta_per_case=delta, draws=draws, modes=rows, setting=s.describe())


def checks() -> list[Check]:
    return [
        Check("reid25/unbiased", "GRF mask G_q G_k^T (independent ensembles) is unbiased for (sum f_k W^k)^2",
              "reid25 Eq. 10, Sec. 3.2", "statistical", _unbiased, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/theorem-3.1",
              "GRF concentration: P(|phi_i.phi_j - M_ij| > t) <= 2 exp(-t^2 n^3 / (2 (2n-1)^2 c^4))",
              "reid25 Thm. 3.1", "bound", _theorem_31, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/lemma-3.2", "GRF sparsity: nnz per feature <= n ceil(b) + 1 w.p. >= 1 - delta, flat in N",
              "reid25 Lemma 3.2", "bound", _lemma_32, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/rate", "GRF mask error falls like n^-1/2 in the number of walks",
              "reid25 Thm. 3.1, Sec. 3", "statistical", _rate, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/diagonal-bias",
              "a shared walk ensemble biases the GRF diagonal by tr Cov / n; independent do not",
              "reid25 Sec. 3.2", "statistical", _diagonal_bias, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/algorithm-2", "grf-asym equals its dense twin; Algorithm 2 as printed is off by the factor n",
              "reid25 App. D, Algorithm 2", "erratum", _algorithm_2, threshold=1.0, compare="<=", unit="ratio"),
        Check("reid25/variance-reduction", "antithetic and repelling walks keep the GRF mean and cut its variance",
              "reid25 Sec. 3.3", "statistical", _variance_reduction, threshold=1.0, compare="<=", unit="ratio"),
    ]
