"""Feature maps phi: R^d -> R^m, dense NumPy (float64).

All maps act on the last axis: x has shape (..., N, d) and phi(x) has shape (..., N, m).
Projection matrices W have shape (m, d); their rows are the random directions w_k.

Softmax kernel identities (choromanski22 Sec. 2; wu22 Eq. 4, Lemma 1):
    FAVOR+:      phi(x) = exp(W x - |x|^2 / 2) / sqrt(m),       E[phi(x).phi(y)] = exp(x.y)
    hyperbolic:  phi(x) = [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m)
    trig RFF:    phi(x) = exp(|x|^2 / 2) [cos(W x), sin(W x)] / sqrt(m)   (may be negative)

A map with a projection costs O(N m d); the deterministic maps O(N d).
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
    still marginally N(0, I_d) and the estimator stays unbiased (Performer Sec. 2.4, Thm. 2).

    Raises TypeError for a non-int m or d, a non-Generator rng or a non-bool orthogonal;
    ValueError for m or d < 1. O(m d) draws; orthogonal adds ceil(m / d) QRs of d x d, O(m d^2).

        >>> import numpy as np
        >>> from reference.features import gaussian_projection
        >>> w = gaussian_projection(3, 3, np.random.default_rng(0), orthogonal=True)
        >>> gram = w @ w.T
        >>> w.shape, bool(np.allclose(gram - np.diag(np.diag(gram)), 0))
        ((3, 3), True)
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
    """FAVOR+ positive random features phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) (Performer Lemma 1,
    wu22 Eq. 4): x (..., N, d), w (m, d) -> (..., N, m), float64, entrywise > 0 (0 on underflow).

    E[phi(x) . phi(y)] = exp(x . y) for rows of w ~ N(0, I_d). Raises TypeError for complex or
    non-numeric input, ValueError for a w that is not (m >= 1, d). O(N m d).

        >>> import numpy as np
        >>> from reference.features import favor_plus
        >>> favor_plus(np.zeros((2, 3)), np.ones((4, 3)))  # exp(0) / sqrt(4)
        array([[0.5, 0.5, 0.5, 0.5],
               [0.5, 0.5, 0.5, 0.5]])
    """
    x, w = _with_projection(x, w)
    m = w.shape[0]
    return np.exp(x @ w.T - 0.5 * np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(m)


def hyperbolic(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Hyperbolic positive features [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m) (Performer
    Lemma 1): x (..., N, d), w (m, d) -> (..., N, 2m), float64, entrywise > 0.

    Unbiased for exp(x . y), like favor_plus. Raises as favor_plus does. O(N m d).

        >>> import numpy as np
        >>> from reference.features import hyperbolic
        >>> phi = hyperbolic(np.zeros((2, 3)), np.ones((4, 3)))
        >>> phi.shape, float(np.round(phi[0, 0], 4))  # exp(0) / sqrt(8)
        ((2, 8), 0.3536)
    """
    x, w = _with_projection(x, w)
    m = w.shape[0]
    proj = x @ w.T
    half = 0.5 * np.sum(x * x, axis=-1, keepdims=True)
    return np.concatenate([np.exp(proj - half), np.exp(-proj - half)], axis=-1) / np.sqrt(2 * m)


def trig_rff(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Trigonometric random Fourier features exp(|x|^2 / 2) [cos(W x), sin(W x)] / sqrt(m), unbiased
    for exp(x . y) (Performer Sec. 2.3): x (..., N, d), w (m, d) -> (..., N, 2m), float64.

    Entries may be negative, so the attention denominator may vanish. Raises as favor_plus does.
    O(N m d).

        >>> import numpy as np
        >>> from reference.features import trig_rff
        >>> phi = trig_rff(np.zeros((2, 3)), np.ones((4, 3)))
        >>> phi.shape, phi[0].tolist()  # cos(0) / sqrt(4), then sin(0)
        ((2, 8), [0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    """
    x, w = _with_projection(x, w)
    m = w.shape[0]
    proj = x @ w.T
    scale = np.exp(0.5 * np.sum(x * x, axis=-1, keepdims=True)) / np.sqrt(m)
    return np.concatenate([np.cos(proj), np.sin(proj)], axis=-1) * scale


def relu(x: np.ndarray) -> np.ndarray:
    """ReLU features max(x, 0) (reid25 uses them throughout): (..., N, d) -> (..., N, d), float64.

    Raises TypeError for complex or non-numeric input. O(N d).

        >>> from reference.features import relu
        >>> relu([[-1.0, 2.0]]).tolist()
        [[0.0, 2.0]]
    """
    return np.maximum(real_array("x", x), 0.0)


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """ELU(x) + 1 (Katharopoulos et al. 2020, Eq. 7): x + 1 for x > 0, exp(x) otherwise; (..., N, d)
    -> (..., N, d), float64, strictly positive (until exp underflows).

    Raises TypeError for complex or non-numeric input. O(N d).

        >>> from reference.features import elu_plus_one
        >>> elu_plus_one([[0.0, 2.0]]).tolist()
        [[1.0, 3.0]]
    """
    x = real_array("x", x)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def identity(x: np.ndarray) -> np.ndarray:
    """phi(x) = x as float64, (..., N, d) -> (..., N, d) (no positivity: the denominator may vanish).

    Raises TypeError for complex or non-numeric input. O(N d) (a copy only when the dtype changes).

        >>> from reference.features import identity
        >>> identity([[1, -2]]).tolist()
        [[1.0, -2.0]]
    """
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
    """Apply the feature map called ``name`` (a key of FEATURE_MAPS) to x (..., N, d); w (m, d) is
    needed by "favor+", "hyperbolic" and "trig" and ignored by the others.

    Raises ValueError naming the map for an unknown name or a missing w; otherwise what the map
    raises. Cost: the map's, O(N m d) or O(N d).

        >>> import numpy as np
        >>> from reference.features import feature_map
        >>> feature_map("favor+", np.zeros((2, 3)), np.ones((4, 3))).shape, feature_map("relu", [[-1.0]]).tolist()
        ((2, 4), [[0.0]])
    """
    if not isinstance(name, str) or name not in FEATURE_MAPS:
        raise ValueError(f"feature map must be one of {sorted(FEATURE_MAPS)}, got {name!r}")
    fn, needs_w = FEATURE_MAPS[name]
    if needs_w:
        if w is None:
            raise ValueError(f"feature map {name!r} needs a projection matrix w of shape (m, d)")
        return fn(x, w)
    return fn(x)  # a w given to a map without projection is ignored (callers loop over all maps)
