"""Experiments the report charts besides the sweeps: FAVOR+ error vs m, FAVOR+ attention against
exact softmax, and the mask gallery.

Each returns a results.schema record (FavorError, FavorAccuracy, Gallery) that measure writes
to the results JSON; reports/ only draws them.

FAVOR+ error vs m (docs/papers.md Sec. 0). For one fixed pair (x, y) the FAVOR+ estimate
phi(x).phi(y) of SM(x, y) = exp(x.y) is unbiased with variance (Performer Lemma 1, wu22 Lemma 1)

    Var = (1/m) exp(|x+y|^2) SM(x,y)^2 (1 - exp(-|x+y|^2))      (verify.stats.prf_variance),

so its RMSE is sqrt(Var), a line of slope -1/2 on log-log axes. We draw many independent
projections per m (iid and orthogonal, reference.features.gaussian_projection) and compare the
empirical RMSE, with a CI, to that line; orthogonal features should sit on or below it.
NumPy only, seeded Generators, no global RNG.

FAVOR+ attention against exact softmax. The kernel's error above is for one pair; what a user
sees is the attention output, a ratio of two sums of such estimates. favor_accuracy draws
q, k ~ N(0, std^2 I_d), v ~ N(0, I_d) at d = 64, one orthogonal projection per (seed, m), and
reports ||favor_attention - softmax_attention||_F / ||softmax_attention||_F, with and without a
causal mask. The logits q.k / sqrt(d) then have standard deviation std^2, and the estimator's
relative variance grows like exp(|x+y|^2) ~ exp(4 std^2 sqrt(d)) (the formula above with
x = q / d^(1/4)), so the error climbs steeply with std and falls only like m^(-1/2).

Mask gallery. Every mechanism computes out_i = sum_j M_ij K(q_i, k_j) v_j / sum_j M_ij K(q_i, k_j);
the gallery holds M itself, ``mech.dense_mask(mech.problem(n, seed))`` (default variant) at
n = ``mech.admissible(64)``, matrix included.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
from scipy import stats

from results.schema import FavorAccuracy, FavorAccuracyCurve, FavorError, FavorErrorCurve, Gallery, MaskPanel

FAVOR_D = 16  # input width, as in the registry's sequence problems
FAVOR_NORM = 0.7  # |x| = |y| = 0.7, |x+y|^2 ~ 1: the relative error is visible but moderate
FAVOR_DRAWS = {True: 1000, False: 4000}  # quick, full
#: favor_accuracy's grid: d, the q, k standard deviations, the m, and (N, seeds) per (quick, full).
ACCURACY_D = 64
ACCURACY_STD = tuple(2.0 ** (k / 2) for k in range(-8, 1))  # 1/16 to 1 in half-octaves
ACCURACY_M = (16, 64, 128, 256, 512)
ACCURACY_SIZE = {True: (512, 2), False: (1024, 4)}
GALLERY_N = 64  # a power of two (hypercube masks) and a square (8 x 8 grid masks)
GALLERY_SEED = 0


# ------------------------------------------------------------------------------ FAVOR+ error


def feature_grid(max_m: int = 256, points: int = 15) -> list[int]:
    """Geometric grid of m from 2 to ``max_m`` (distinct integers)."""
    return sorted({int(round(v)) for v in np.geomspace(2, max_m, points)})


def fixed_pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed (x, y): random directions in R^16 with norms 0.7, from a seeded Generator."""
    from verify.problems import rng_for

    rng = rng_for(seed, 900)
    x, y = rng.standard_normal(FAVOR_D), rng.standard_normal(FAVOR_D)
    return FAVOR_NORM * x / np.linalg.norm(x), FAVOR_NORM * y / np.linalg.norm(y)


def _rmse_ci(sq_err: np.ndarray, z: float) -> tuple[float, float, float]:
    # CLT on the mean squared error (many draws), mapped through sqrt; the lower end clamps at 0.
    mse, se = sq_err.mean(), sq_err.std(ddof=1) / np.sqrt(len(sq_err))
    return float(np.sqrt(mse)), float(np.sqrt(max(mse - z * se, 0.0))), float(np.sqrt(mse + z * se))


def favor_error(draws: int = 2000, max_m: int = 256, seed: int = 0, progress: bool = False,
                confidence: float = 0.95, grid: Iterable[int] | None = None) -> FavorError:
    """Run the experiment: ``draws`` independent projections per (m, kind), m on ``grid``
    (default ``feature_grid(max_m)``). Each curve's slope is a log-log least-squares fit with a
    Student-t ``confidence`` interval."""
    from tqdm.auto import tqdm

    from reference.features import favor_plus, gaussian_projection
    from verify.problems import rng_for
    from verify.stats import prf_variance

    if draws < 2:
        raise ValueError(f"draws must be >= 2 (an RMSE CI needs a spread), got {draws}")
    x, y = fixed_pair(seed)
    exact = float(np.exp(x @ y))
    grid = sorted({int(m) for m in grid}) if grid is not None else feature_grid(max_m)
    if len(grid) < 3 or grid[0] < 1:
        raise ValueError(f"grid must hold >= 3 distinct m >= 1 (a slope with a CI), got {grid}")
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    res = FavorError(list(map(float, x)), list(map(float, y)), exact, draws, grid,
                     [float(np.sqrt(prf_variance(x, y, m))) for m in grid])
    xy = np.stack([x, y])  # (2, d): one favor_plus call gives both feature vectors
    with tqdm(total=2 * len(grid), desc="favor+ error", unit="m", disable=not progress) as bar:
        for k, orthogonal in enumerate((False, True)):
            rmse, low, high = [], [], []
            for m in grid:
                # An independent stream per (kind, m), so adding an m never changes the others.
                rng = rng_for(seed, 901, k, m)
                est = np.empty(draws)
                for r in range(draws):
                    phi = favor_plus(xy, gaussian_projection(m, FAVOR_D, rng, orthogonal=orthogonal))
                    est[r] = phi[0] @ phi[1]
                a, lo, hi = _rmse_ci((est - exact) ** 2, z)
                rmse.append(a), low.append(lo), high.append(hi)
                bar.update(1)
            fit = stats.linregress(np.log(grid), np.log(rmse))
            half = stats.t.ppf(0.5 + confidence / 2, len(grid) - 2) * fit.stderr
            res.curves.append(FavorErrorCurve("orthogonal" if orthogonal else "iid", list(grid), rmse, low, high,
                                              float(fit.slope), float(fit.slope - half), float(fit.slope + half)))
    return res


# ------------------------------------------------------------------------------ FAVOR+ accuracy


def favor_accuracy(n: int = 1024, seeds: int = 4, std: Iterable[float] = ACCURACY_STD,
                   m: Iterable[int] = ACCURACY_M, d: int = ACCURACY_D, orthogonal: bool = True,
                   progress: bool = False) -> FavorAccuracy:
    """FAVOR+ attention (fast.favor_attention, unmasked and with fast.CausalMask(n)) against exact
    softmax attention (fast.softmax_attention, with the causal -inf mask), float32 on CPU.

    For each seed s, std and m: q, k ~ N(0, std^2) and v ~ N(0, 1), all (n, d), and one projection
    (m, d) (fast.gaussian_projection, ``orthogonal``), from ``torch.Generator().manual_seed(s)``
    (the same q, k directions and v at every std and m, so the curves differ by std and m alone).
    Each curve holds, per std, the mean and max over seeds of ||out - exact||_F / ||exact||_F.
    Cost: O(seeds |std| |m| n (n + m) d), about 3 s at n = 512, 2 seeds on one core.

    Raises ValueError for n < 2, seeds < 1, or an empty or non-positive grid.

    >>> from measure.experiments import favor_accuracy
    >>> acc = favor_accuracy(n=32, seeds=1, std=[0.25], m=[16], d=8)
    >>> [(c.mask, c.m, len(c.error)) for c in acc.curves]
    [('none', 16, 1), ('causal', 16, 1)]
    """
    import torch
    from tqdm.auto import tqdm

    from fast import CausalMask, favor_attention, gaussian_projection, softmax_attention

    std, m = [float(s) for s in std], sorted({int(x) for x in m})
    if n < 2 or seeds < 1:
        raise ValueError(f"n must be >= 2 and seeds >= 1, got n={n}, seeds={seeds}")
    if not std or not m or min(std) <= 0 or m[0] < 1:
        raise ValueError(f"std and m must be non-empty and positive, got std={std}, m={m}")
    causal_logits = torch.zeros(n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    masks = {"none": (None, None), "causal": (CausalMask(n), causal_logits)}
    errors = {(name, mm): np.empty((seeds, len(std))) for name in masks for mm in m}
    with tqdm(total=seeds * len(std), desc="favor+ accuracy", unit="cell", disable=not progress) as bar:
        for s in range(seeds):
            g = torch.Generator().manual_seed(s)
            q0, k0, v = (torch.randn(n, d, generator=g) for _ in range(3))
            projections = {mm: gaussian_projection(mm, d, orthogonal=orthogonal, generator=g) for mm in m}
            for j, sd in enumerate(std):
                q, k = sd * q0, sd * k0
                for name, (op, logits) in masks.items():
                    exact = softmax_attention(q, k, v, logits)
                    for mm in m:
                        out = favor_attention(q, k, v, projections[mm], op)
                        errors[name, mm][s, j] = float(torch.linalg.norm(out - exact) / torch.linalg.norm(exact))
                bar.update(1)
    res = FavorAccuracy(d, n, seeds, orthogonal, std, m)
    for (name, mm), e in errors.items():
        res.curves.append(FavorAccuracyCurve(name, mm, [float(x) for x in e.mean(0)], [float(x) for x in e.max(0)]))
    return res


# ------------------------------------------------------------------------------ mask gallery


def summarise(matrix: np.ndarray) -> tuple[float, float, float]:
    """(min, max, fraction of entries != 0) of a mask, any shape."""
    m = np.asarray(matrix, dtype=np.float64)
    return float(m.min()), float(m.max()), float(np.count_nonzero(m)) / m.size


def mask_panel(mech, n: int = GALLERY_N, seed: int = GALLERY_SEED) -> MaskPanel:
    """One panel: the default variant's problem at ``mech.admissible(n)``, its dense mask, summary.

    Never raises: an exception anywhere, or a result that is not a finite, non-negative (n, n)
    matrix, becomes ``error`` ("Type: message") with no matrix.
    """
    size = n
    try:
        size = int(mech.admissible(n))
        if not 1 <= size <= n:
            raise ValueError(f"admissible({n}) returned {size}, not in [1, {n}]")
        m = np.asarray(mech.dense_mask(mech.problem(size, seed)), dtype=np.float64)
        if m.shape != (size, size):
            raise ValueError(f"dense_mask returned shape {m.shape}, expected ({size}, {size})")
        if not np.isfinite(m).all():
            raise ValueError(f"dense_mask has {int((~np.isfinite(m)).sum())} non-finite entries")
        lo, hi, nz = summarise(m)
        if lo < 0:
            raise ValueError(f"dense_mask has negative entries (min {lo:.3g})")
    except Exception as exc:  # noqa: BLE001 - one broken mask must not take the run down
        return MaskPanel(mech.id, size, error=f"{type(exc).__name__}: {exc}")
    return MaskPanel(mech.id, size, lo, hi, nz, matrix=m.tolist())


def mask_gallery(mechs, n: int = GALLERY_N, seed: int = GALLERY_SEED, progress=None) -> Gallery:
    """Panels for every mechanism in ``mechs`` whose dense_mask is not None; the others are listed
    in ``without_mask``. progress: optional tqdm-like object, ``update(1)`` per panel."""
    mechs = list(mechs)
    panels = []
    for m in mechs:
        if m.dense_mask is not None:
            panels.append(mask_panel(m, n, seed))
            if progress is not None:
                progress.update(1)
    return Gallery(n, seed, panels, [m.id for m in mechs if m.dense_mask is None])
