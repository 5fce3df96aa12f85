"""Graph diffusion kernel of the hypercube {0,1}^k, dense (choromanski22 Sec. 4.1; docs/papers.md Sec. 1).

Node i is the k-bit binary word of i, n = 2^k nodes; two nodes are adjacent when their words
differ in one bit, and dist(i, j) = popcount(i xor j). exp(-lambda L) is proportional to
tanh(lambda)^dist(i, j); the mask drops the constant: M_ij = tanh(lambda)^dist(i, j), O(n^2 k).
``diffusion_kernel`` (expm, O(n^3)) is the check, on any graph: on a path of 3+ nodes its
diagonal is not constant, the erratum of the printed "d-dimensional grids" claim.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from reference._checks import integer, real_array, real_scalar
from reference.budget import check_dense_budget


def hypercube_dimension(n: int) -> int:
    """k with n = 2^k: n an int (TypeError otherwise, floats included), a power of two (ValueError
    naming n otherwise). O(1).

        >>> from reference.masks.hypercube import hypercube_dimension
        >>> hypercube_dimension(8), hypercube_dimension(1)
        (3, 0)
    """
    n = integer("n", n, minimum=None)
    if n <= 0 or n & (n - 1):
        raise ValueError(f"a hypercube has N = 2^k nodes; n must be a power of two, got {n!r}")
    return n.bit_length() - 1


def hypercube_distance(n: int) -> np.ndarray:
    """Hamming distances popcount(i xor j) between the n = 2^k nodes: (n, n) ints. Raises as
    hypercube_dimension, and MemoryError over the dense budget. O(n^2 k).

        >>> from reference.masks.hypercube import hypercube_distance
        >>> hypercube_distance(4).tolist()
        [[0, 1, 1, 2], [1, 0, 2, 1], [1, 2, 0, 1], [2, 1, 1, 0]]
    """
    k = hypercube_dimension(n)
    check_dense_budget(n, "hypercube distance")
    x = np.arange(n)[:, None] ^ np.arange(n)[None, :]
    return sum((x >> b) & 1 for b in range(k)) if k else np.zeros((1, 1), dtype=np.int64)


def hypercube_adjacency(n: int) -> np.ndarray:
    """Adjacency of the hypercube on n = 2^k nodes: (n, n) float64, 1 where the words differ in one
    bit. Raises as hypercube_distance. O(n^2 k).

        >>> from reference.masks.hypercube import hypercube_adjacency
        >>> hypercube_adjacency(4).sum(axis=1).tolist()  # every node has k = 2 neighbours
        [2.0, 2.0, 2.0, 2.0]
    """
    return (hypercube_distance(n) == 1).astype(np.float64)


def hypercube_mask(n: int, lam: float) -> np.ndarray:
    """M_ij = tanh(lam)^dist(i, j), (n, n) float64 (choromanski22 Sec. 4.1): exp(-lam L) of the
    hypercube up to the constant (e^-lam cosh lam)^k, which cancels in attention. lam a finite real
    > 0 (ValueError naming lam otherwise; TypeError for a non-real); n as hypercube_dimension.
    O(n^2 k).

        >>> import numpy as np
        >>> from reference.masks.hypercube import diffusion_kernel, hypercube_adjacency, hypercube_mask
        >>> m = hypercube_mask(4, 0.5)  # k = 2 bits
        >>> float(np.round(m[0, 3], 4))  # tanh(0.5)^2
        0.2136
        >>> constant = (np.exp(-0.5) * np.cosh(0.5)) ** 2
        >>> bool(np.allclose(m * constant, diffusion_kernel(hypercube_adjacency(4), 0.5)))
        True
    """
    lam = real_scalar("lam", lam)
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(f"lam must be a positive finite diffusion time, got {lam!r}")
    return np.tanh(lam) ** hypercube_distance(n)


def diffusion_kernel(adjacency: np.ndarray, lam: float) -> np.ndarray:
    """exp(-lam L), L = D - A, (n, n) float64 for a dense symmetric adjacency (n, n), n >= 1, finite
    real entries; lam a finite real number. Via scipy.linalg.expm, O(n^3). For any graph, so that
    the grid erratum of choromanski22 Sec. 4.1 can be shown (docs/papers.md Sec. 1).

    Raises TypeError for non-real input; ValueError for NaN/inf, a non-finite lam, a non-square,
    empty or asymmetric adjacency; MemoryError over the dense budget.

        >>> import numpy as np
        >>> from reference.masks.hypercube import diffusion_kernel
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> k = diffusion_kernel(path, 0.5)
        >>> bool(np.isclose(k[0, 0], k[1, 1])), bool(np.allclose(k.sum(axis=1), 1.0))  # a side-3 grid: diagonal varies
        (False, True)
    """
    a = real_array("adjacency", adjacency, finite=True)
    lam = real_scalar("lam", lam)
    if not np.isfinite(lam):
        raise ValueError(f"lam must be a finite diffusion time, got {lam!r}")
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"adjacency must be a square (n, n) matrix with n >= 1, got shape {a.shape}")
    if not np.allclose(a, a.T):
        raise ValueError("adjacency must be symmetric (an undirected graph), got a non-symmetric matrix")
    check_dense_budget(a.shape[0], "diffusion kernel")
    lap = np.diag(a.sum(1)) - a
    return scipy.linalg.expm(-lam * lap)
