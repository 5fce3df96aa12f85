"""Feature maps phi: R^d -> R^m, dense NumPy (float64).

All maps act on the last axis: x has shape (..., N, d) and phi(x) has shape (..., N, m).
Projection matrices W have shape (m, d); their rows are the random directions w_k.

Softmax kernel identities (choromanski22 Sec. 2; wu22 Eq. 4, Lemma 1):
    FAVOR+:      phi(x) = exp(W x - |x|^2 / 2) / sqrt(m),       E[phi(x).phi(y)] = exp(x.y)
    hyperbolic:  phi(x) = [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m)
    trig RFF:    phi(x) = exp(|x|^2 / 2) [cos(W x), sin(W x)] / sqrt(m)   (may be negative)
"""
from __future__ import annotations

import numpy as np

from reference._checks import describe, generator, integer, real_array


def gaussian_projection(m: int, d: int, rng: np.random.Generator, orthogonal: bool = False) -> np.ndarray:
    """Draw an (m, d) projection with rows w_k ~ N(0, I_d).

    m, d: ints >= 1 (a float such as 4.0 is refused, not truncated). rng: a
    numpy.random.Generator; None (OS entropy) and int seeds are refused with TypeError so that
    every draw says where its randomness comes from: pass np.random.default_rng(seed).

    orthogonal=True: blocks of d mutually orthogonal rows (QR of a Gaussian matrix, signs fixed
    so the rotation is Haar), each row rescaled to an independent chi(d) norm, so every row is
    still marginally N(0, I_d) and the estimator stays unbiased.
    """
    m, d = integer("m", m), integer("d", d)
    rng = generator("rng", rng)
    if not isinstance(orthogonal, (bool, np.bool_)):
        raise TypeError(f"orthogonal must be a bool, got {describe(orthogonal)}")
    if not orthogonal:
        return rng.standard_normal((m, d))
    blocks = -(-m // d)
    q, r = np.linalg.qr(rng.standard_normal((blocks, d, d)))  # stacked QR, one per block
    q = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[:, None, :]  # Haar-distributed rotations
    rows = np.swapaxes(q, -1, -2).reshape(blocks * d, d)[:m]  # rows of each block orthonormal
    norms = np.linalg.norm(rng.standard_normal((m, d)), axis=1)  # chi(d) lengths
    return rows * norms[:, None]


def _with_projection(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (..., d) and w (m, d) as real float64 arrays with matching d and m >= 1."""
    x, w = real_array("x", x), real_array("w", w)
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., N, d), got shape {x.shape}")
    if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"w must be a projection of shape (m, d) = (m >= 1, {x.shape[-1]}) for x of shape "
                         f"{x.shape}, got shape {w.shape}")
    return x, w


def favor_plus(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """FAVOR+ positive random features, (..., N, d) -> (..., N, m). Performer Lemma 1 / wu22 Eq. 4."""
    x, w = _with_projection(x, w)
    m = w.shape[0]
    return np.exp(x @ w.T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(m)


def hyperbolic(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Hyperbolic positive features, (..., N, d) -> (..., N, 2m)."""
    x, w = _with_projection(x, w)
    m = w.shape[0]
    proj = x @ w.T
    half = 0.5 * np.sum(x * x, axis=-1, keepdims=True)
    return np.concatenate([np.exp(proj - half), np.exp(-proj - half)], axis=-1) / np.sqrt(2 * m)


def trig_rff(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Trigonometric random Fourier features for exp(x.y), (..., N, d) -> (..., N, 2m)."""
    x, w = _with_projection(x, w)
    m = w.shape[0]
    proj = x @ w.T
    scale = np.exp(0.5 * np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(m)
    return np.concatenate([np.cos(proj), np.sin(proj)], axis=-1) * scale


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU features (reid25 uses them throughout), m = d."""
    return np.maximum(real_array("x", x), 0.0)


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """ELU(x) + 1 (Katharopoulos et al. 2020), m = d, strictly positive."""
    x = real_array("x", x)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def identity(x: np.ndarray) -> np.ndarray:
    """phi(x) = x (no positivity: the denominator may vanish)."""
    return real_array("x", x)


#: name -> (function, needs a projection matrix)
FEATURE_MAPS = {
    "favor+": (favor_plus, True),
    "hyperbolic": (hyperbolic, True),
    "trig": (trig_rff, True),
    "relu": (relu, False),
    "elu+1": (elu_plus_one, False),
    "identity": (identity, False),
}


def feature_map(name: str, x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Apply the feature map called ``name`` (a key of FEATURE_MAPS)."""
    if not isinstance(name, str) or name not in FEATURE_MAPS:
        raise ValueError(f"feature map must be one of {sorted(FEATURE_MAPS)}, got {name!r}")
    fn, needs_w = FEATURE_MAPS[name]
    if needs_w:
        if w is None:
            raise ValueError(f"feature map {name!r} needs a projection matrix w of shape (m, d)")
        return fn(x, w)
    return fn(x)  # a w given to a map without projection is ignored (callers loop over all maps)
