"""Graph diffusion-kernel masks M = exp(-lambda T), dense (choromanski22 Sec. 4, Thm. 4.1; docs/papers.md Sec. 3).

For a weighted undirected graph W (n, n), W >= 0 symmetric, T is one of the three generators of
Thm. 4.1 (KINDS; ``generator_matrix``): L = D - W, L D^-1 or -W, D the weighted degrees; lambda
>= 0 is the diffusion time. M is formed by scipy.linalg.expm: O(n^3) time, O(n^2) memory, the
ground truth for fast/masks/diffusion.py, which never forms M. ``random_walk_series`` sums the
Markov form of exp(-lambda L D^-1), for the identity's check.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from reference._checks import integer, real_scalar
from reference.budget import check_dense_budget
from reference.graphs import adjacency, weighted_degree

#: The generators T of Thm. 4.1: L = D - W, L D^-1, -W.
KINDS = ("laplacian", "random-walk", "adjacency")


def check_kind(kind: object) -> str:
    """kind as given when it is one of KINDS, else ValueError naming kind. O(1).

        >>> from reference.masks.diffusion import check_kind
        >>> check_kind("random-walk")
        'random-walk'
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (T = D - W, L D^-1, -W), got {kind!r}")
    return kind


def check_lam(lam: object) -> float:
    """A diffusion time as a float: a finite real number >= 0 (TypeError for a non-real, ValueError
    naming lam otherwise). O(1).

        >>> from reference.masks.diffusion import check_lam
        >>> check_lam(2)
        2.0
    """
    value = real_scalar("lam", lam)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"lam must be a finite diffusion time >= 0, got {value!r}")
    return value


def _dense_w(adj) -> np.ndarray:
    a = adjacency(adj, name="adj")
    check_dense_budget(a.shape[0], "diffusion generator")
    return a.toarray()


def generator_matrix(adj, kind: str = "laplacian") -> np.ndarray:
    """The generator T (n, n) float64 of ``kind`` for the graph ``adj`` (anything
    reference.graphs.adjacency accepts: scipy.sparse, dense (n, n), networkx; validated there).

    laplacian: D - W; random-walk: (D - W) D^+ (D^+ the pseudo-inverse: isolated columns are 0);
    adjacency: -W. A self-loop w_ii adds w_ii to d_i and to W_ii, so it cancels on L's diagonal.

    Raises ValueError for an unknown kind and what reference.graphs.adjacency raises (naming adj);
    MemoryError over the dense budget. O(n^2).

        >>> import numpy as np
        >>> from reference.masks.diffusion import generator_matrix
        >>> edge = np.array([[0.0, 2.0], [2.0, 0.0]])
        >>> generator_matrix(edge).tolist(), generator_matrix(edge, "random-walk").tolist()
        ([[2.0, -2.0], [-2.0, 2.0]], [[1.0, -1.0], [-1.0, 1.0]])
    """
    kind = check_kind(kind)
    w = _dense_w(adj)
    d = w.sum(axis=1)
    lap = np.diag(d) - w
    if kind == "laplacian":
        return lap
    if kind == "random-walk":
        d_plus = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        return lap * d_plus[None, :]  # column j scaled by 1/d_j
    return -w


def diffusion_mask(adj, lam: float, kind: str = "laplacian") -> np.ndarray:
    """M = exp(-lam T) (n, n) float64 by scipy.linalg.expm; lam a finite real >= 0.

    laplacian: symmetric, doubly stochastic (rows and columns sum to 1), entrywise >= 0;
    random-walk: column-stochastic, >= 0; adjacency: exp(lam W) >= 0, symmetric (Thm. 4.1).

    Raises as check_lam and generator_matrix. Pade with scaling and squaring: O(n^3).

        >>> import numpy as np
        >>> from reference.masks.diffusion import diffusion_mask
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> m = diffusion_mask(path, 0.5)
        >>> bool(np.allclose(m.sum(axis=0), 1.0)), bool(np.allclose(m, m.T)), bool((m > 0).all())
        (True, True, True)
    """
    lam = check_lam(lam)
    t = generator_matrix(adj, kind)
    return scipy.linalg.expm(-lam * t)


def random_walk_series(adj, lam: float, terms: int) -> np.ndarray:
    """e^-lam sum_{i=0}^{terms} lam^i / i! (W D^+ + E_iso)^i, the Markov form of exp(-lam L D^-1):
    a Poisson(lam) number of steps of the natural random walk (E_iso: ones on the diagonal at the
    isolated nodes, where the walker stays). terms >= 0 is the last power kept; the omitted tail
    has 1-norm P(Poisson(lam) > terms). Returns (n, n) float64.

    Raises as check_lam and generator_matrix; TypeError/ValueError for a terms that is not an
    int >= 0. O(terms n^3).

        >>> import numpy as np
        >>> from reference.masks.diffusion import diffusion_mask, random_walk_series
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> bool(np.allclose(random_walk_series(path, 0.5, 30), diffusion_mask(path, 0.5, "random-walk")))
        True
    """
    lam = check_lam(lam)
    terms = integer("terms", terms, minimum=0)
    w = _dense_w(adj)
    d = weighted_degree(adjacency(adj, name="adj"))
    d_plus = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    step = w * d_plus[None, :] + np.diag((d == 0).astype(np.float64))
    out = np.zeros_like(w)
    power = np.eye(w.shape[0])
    coeff = 1.0
    for i in range(terms + 1):
        if i:
            power = step @ power
            coeff *= lam / i
        out += coeff * power
    return math.exp(-lam) * out
