"""FAVOR+ kernel estimation error vs the number of random features m (docs/papers.md section 0).

For one fixed pair (x, y) the FAVOR+ estimate phi(x).phi(y) of SM(x, y) = exp(x.y) is unbiased
with variance (Performer; wu22 Lemma 1)

    Var = (1/m) exp(|x+y|^2) SM(x,y)^2 (1 - exp(-|x+y|^2)),

so its RMSE is sqrt(Var), a line of slope -1/2 on log-log axes. We draw many independent
projections per m (iid and orthogonal, reference.features.gaussian_projection) and compare the
empirical RMSE, with a CI, to that line. Orthogonal features should sit on or below it.
NumPy only, seeded Generators, no global RNG.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats
from tqdm.auto import tqdm

from reference.features import favor_plus, gaussian_projection
from verify.problems import rng_for

D = 16  # input width, as in the registry's sequence problems
X_NORM = Y_NORM = 0.7  # |x+y|^2 ~ 1: the relative error is visible but moderate


@dataclass
class FavorErrorCurve:
    """Empirical RMSE of one projection kind at each m, with a CI, and its log-log slope."""

    kind: str  # "iid" | "orthogonal"
    m: list[int]
    rmse: list[float]
    rmse_low: list[float]
    rmse_high: list[float]
    slope: float
    slope_low: float
    slope_high: float


@dataclass
class FavorError:
    """The experiment: inputs, exact kernel, predicted RMSE per m, and one curve per kind."""

    x: list[float]
    y: list[float]
    exact: float
    draws: int
    m: list[int]
    predicted_rmse: list[float]
    curves: list[FavorErrorCurve] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def predicted_variance(x: np.ndarray, y: np.ndarray, m: int | np.ndarray) -> np.ndarray:
    """Var of the FAVOR+ estimate of exp(x.y) with m iid features (docs/papers.md section 0)."""
    s2 = float(np.sum((x + y) ** 2))
    sm = float(np.exp(x @ y))
    return np.exp(s2) * sm**2 * (1.0 - np.exp(-s2)) / np.asarray(m, dtype=float)


def feature_grid(max_m: int = 256, points: int = 15) -> list[int]:
    """Geometric grid of m from 2 to ``max_m`` (distinct integers)."""
    return sorted({int(round(v)) for v in np.geomspace(2, max_m, points)})


def fixed_pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed (x, y): random directions in R^16 with norms 0.7, from a seeded Generator."""
    rng = rng_for(seed, 900)
    x, y = rng.standard_normal(D), rng.standard_normal(D)
    return X_NORM * x / np.linalg.norm(x), Y_NORM * y / np.linalg.norm(y)


def _rmse_ci(sq_err: np.ndarray, z: float) -> tuple[float, float, float]:
    # CLT on the mean squared error (many draws), mapped through sqrt; clamp the lower end at 0.
    mse, se = sq_err.mean(), sq_err.std(ddof=1) / np.sqrt(len(sq_err))
    return float(np.sqrt(mse)), float(np.sqrt(max(mse - z * se, 0.0))), float(np.sqrt(mse + z * se))


def favor_error(draws: int = 2000, max_m: int = 256, seed: int = 0, progress: bool = True,
                confidence: float = 0.95) -> FavorError:
    """Run the experiment: ``draws`` independent projections per (m, kind)."""
    x, y = fixed_pair(seed)
    exact = float(np.exp(x @ y))
    grid = feature_grid(max_m)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    res = FavorError(list(map(float, x)), list(map(float, y)), exact, draws, grid,
                     list(map(float, np.sqrt(predicted_variance(x, y, np.array(grid))))))
    xy = np.stack([x, y])  # (2, d): one favor_plus call gives both feature vectors
    with tqdm(total=2 * len(grid), desc="favor+ error", unit="m", disable=not progress) as bar:
        for k, orthogonal in enumerate((False, True)):
            rmse, low, high = [], [], []
            for m in grid:
                # An independent stream per (kind, m), so adding an m never changes the others.
                rng = rng_for(seed, 901, k, m)
                est = np.empty(draws)
                for r in range(draws):
                    phi = favor_plus(xy, gaussian_projection(m, D, rng, orthogonal=orthogonal))
                    est[r] = phi[0] @ phi[1]
                a, lo, hi = _rmse_ci((est - exact) ** 2, z)
                rmse.append(a), low.append(lo), high.append(hi)
                bar.update(1)
            fit = stats.linregress(np.log(grid), np.log(rmse))
            half = stats.t.ppf(0.5 + confidence / 2, len(grid) - 2) * fit.stderr
            res.curves.append(FavorErrorCurve("orthogonal" if orthogonal else "iid", list(grid), rmse, low, high,
                                              float(fit.slope), float(fit.slope - half), float(fit.slope + half)))
    return res
