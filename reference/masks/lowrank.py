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

from reference.budget import check_dense_budget
from reference.features import favor_plus


def _finite_matrix(name: str, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return a


def low_rank_mask(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """M = left @ right: left (N, r), right (r, N) -> (N, N)."""
    left, right = _finite_matrix("left", left), _finite_matrix("right", right)
    if left.shape[1] != right.shape[0] or left.shape[0] != right.shape[1]:
        raise ValueError(f"left (N, r) and right (r, N) do not match: {left.shape} and {right.shape}")
    check_dense_budget(left.shape[0], "low-rank mask")
    return left @ right


def sinusoidal_encodings(n: int, num_freqs: int = 4, scale: float = 0.7, base: float = 10_000.0) -> np.ndarray:
    """p_i = (scale / sqrt(K)) [cos(omega_k i), sin(omega_k i)]_k, omega_k = base^(-k/K): (n, 2K).

    |p_i| = scale for every i, and p_i . p_j = (scale^2 / K) sum_k cos(omega_k (i - j)).
    """
    if n <= 0 or num_freqs <= 0:
        raise ValueError(f"n and num_freqs must be positive, got n={n}, num_freqs={num_freqs}")
    omega = base ** (-np.arange(num_freqs) / num_freqs)
    angle = np.arange(n)[:, None] * omega[None, :]
    return scale / np.sqrt(num_freqs) * np.concatenate([np.cos(angle), np.sin(angle)], axis=1)


def stochastic_rpe_factors(encodings: np.ndarray, projection: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phi(P) (N, r), phi(P)^T (r, N)) with FAVOR+ features of W = projection (r, d_p)."""
    p = _finite_matrix("encodings", encodings)
    w = _finite_matrix("projection", projection)
    if w.shape[1] != p.shape[1]:
        raise ValueError(f"projection must have shape (r, {p.shape[1]}) for encodings {p.shape}, got {w.shape}")
    phi = favor_plus(p, w)
    return phi, phi.T


def stochastic_rpe_expected_mask(encodings: np.ndarray) -> np.ndarray:
    """The exact mask the stochastic RPE estimates: M_ij = exp(p_i . p_j), (N, N)."""
    p = _finite_matrix("encodings", encodings)
    check_dense_budget(p.shape[0], "stochastic RPE mask")
    return np.exp(p @ p.T)
