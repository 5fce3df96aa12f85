"""Low-rank masks, dense: M = M1 M2 and the stochastic RPE (choromanski22 Sec. 3.4).

A mask that is (in expectation) a product of an N x r and an r x N matrix costs O(N r) per
column to apply. The stochastic relative-position encoding (RPE) used here is a softmax-kernel
mask over positional encodings p_i,

    M_ij = exp(p_i . p_j),

factorised with FAVOR+ positive random features, M_hat = phi(P) phi(P)^T (r = number of
features), which is positive and unbiased: E[M_hat_ij] = M_ij (Performer Lemma 1). With the
sinusoidal encodings below, p_i . p_j = (s^2 / K) sum_k cos(omega_k (i - j)) depends on i - j
only, so the exact M is a (relative-position) Toeplitz mask and M_hat an unbiased low-rank
estimate of it.
"""
from __future__ import annotations

import numpy as np

from reference._checks import integer, real_array, real_scalar
from reference.budget import check_dense_budget
from reference.features import favor_plus

#: exp(x) is finite in float64 for x <= this (log of the largest float64).
_MAX_EXPONENT = float(np.log(np.finfo(np.float64).max))


def _finite_matrix(name: str, a: np.ndarray) -> np.ndarray:
    a = real_array(name, a)
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return a


def low_rank_mask(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """M = left @ right: left (N, r), right (r, N) -> (N, N) float64 (choromanski22 Sec. 3.4).

    Raises TypeError for complex or non-numeric factors; ValueError for factors that are not
    non-empty 2-D, not finite or do not match, or a product that overflows; MemoryError over the
    dense budget. O(N^2 r).

        >>> import numpy as np
        >>> from reference.masks.lowrank import low_rank_mask
        >>> low_rank_mask(np.ones((3, 1)), np.full((1, 3), 2.0)).tolist()
        [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """
    left, right = _finite_matrix("left", left), _finite_matrix("right", right)
    if left.shape[1] != right.shape[0] or left.shape[0] != right.shape[1]:
        raise ValueError(f"left (N, r) and right (r, N) do not match: {left.shape} and {right.shape}")
    check_dense_budget(left.shape[0], "low-rank mask")
    with np.errstate(over="ignore"):  # checked below
        m = left @ right
    if not np.isfinite(m).all():
        raise ValueError("left @ right overflows float64 (finite factors, an infinite product): scale left and right down")
    return m


def sinusoidal_encodings(n: int, num_freqs: int = 4, scale: float = 0.7, base: float = 10_000.0) -> np.ndarray:
    """p_i = (scale / sqrt(K)) [cos(omega_k i), sin(omega_k i)]_k, omega_k = base^(-k/K): (n, 2K).

    |p_i| = scale for every i, and p_i . p_j = (scale^2 / K) sum_k cos(omega_k (i - j)): a
    function of i - j, so exp(p_i . p_j) is a Toeplitz mask. n, num_freqs: ints >= 1 (TypeError for
    non-ints, ValueError below 1); scale: a finite real; base: a finite real > 0 (ValueError
    naming them otherwise). O(n K).

        >>> import numpy as np
        >>> from reference.masks.lowrank import sinusoidal_encodings
        >>> p = sinusoidal_encodings(5, num_freqs=2, scale=0.7)
        >>> p.shape, bool(np.allclose(np.linalg.norm(p, axis=1), 0.7))
        ((5, 4), True)
    """
    n, num_freqs = integer("n", n), integer("num_freqs", num_freqs)
    scale, base = real_scalar("scale", scale), real_scalar("base", base)
    if not np.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if not np.isfinite(base) or base <= 0:
        raise ValueError(f"base must be a finite real > 0, got {base!r}")
    omega = base ** (-np.arange(num_freqs) / num_freqs)
    angle = np.arange(n)[:, None] * omega[None, :]
    return scale / np.sqrt(num_freqs) * np.concatenate([np.cos(angle), np.sin(angle)], axis=1)


def stochastic_rpe_factors(encodings: np.ndarray, projection: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phi(P) (N, r), phi(P)^T (r, N)) with FAVOR+ features of W = projection (r, d_p), encodings P
    (N, d_p): the factors of the stochastic RPE mask M_hat = phi(P) phi(P)^T, positive and unbiased
    for exp(p_i . p_j) (choromanski22 Sec. 3.4; Performer Lemma 1).

    Raises TypeError for complex input; ValueError for non-finite or mismatched arrays, or
    features that overflow. O(N r d_p).

        >>> import numpy as np
        >>> from reference.features import gaussian_projection
        >>> from reference.masks.lowrank import sinusoidal_encodings, stochastic_rpe_factors
        >>> p = sinusoidal_encodings(6)
        >>> left, right = stochastic_rpe_factors(p, gaussian_projection(16, p.shape[1], np.random.default_rng(0)))
        >>> left.shape, right.shape, bool((left > 0).all())
        ((6, 16), (16, 6), True)
    """
    p = _finite_matrix("encodings", encodings)
    w = _finite_matrix("projection", projection)
    if w.shape[1] != p.shape[1]:
        raise ValueError(f"projection must have shape (r, {p.shape[1]}) for encodings {p.shape}, got {w.shape}")
    with np.errstate(over="ignore"):  # checked below
        phi = favor_plus(p, w)
    if not np.isfinite(phi).all():
        raise ValueError("the FAVOR+ features exp(W p_i - |p_i|^2 / 2) / sqrt(r) of these encodings and projection "
                         "overflow float64: scale the encodings or the projection down")
    return phi, phi.T


def stochastic_rpe_expected_mask(encodings: np.ndarray) -> np.ndarray:
    """The exact mask the stochastic RPE estimates: M_ij = exp(p_i . p_j), (N, N).

    Raises ValueError (naming encodings) when some p_i . p_j exceeds log(float64 max) ~ 709.78:
    that entry of the mask is not a float64 number (the largest term is p_i . p_i = |p_i|^2); also
    for non-finite or non-2-D encodings; MemoryError over the dense budget. O(N^2 d_p).

        >>> import numpy as np
        >>> from reference.masks.lowrank import sinusoidal_encodings, stochastic_rpe_expected_mask
        >>> m = stochastic_rpe_expected_mask(sinusoidal_encodings(4, scale=0.7))
        >>> float(np.round(m[0, 0], 4)), bool(np.allclose(m[1, 2], m[0, 1]))  # exp(0.49); Toeplitz
        (1.6323, True)
    """
    p = _finite_matrix("encodings", encodings)
    check_dense_budget(p.shape[0], "stochastic RPE mask")
    gram = p @ p.T
    if not (gram <= _MAX_EXPONENT).all():
        raise ValueError(f"encodings give exp(p_i . p_j) beyond float64's range: the largest p_i . p_j is "
                         f"{gram.max():.6g} > {_MAX_EXPONENT:.6g} (|p_i| up to {np.sqrt(_MAX_EXPONENT):.4g} is "
                         f"representable); scale the encodings down")
    return np.exp(gram)
