"""Graph diffusion-kernel masks M = exp(-lambda T), dense (choromanski22 Sec. 4, Thm. 4.1; docs/papers.md Sec. 3).

For a weighted undirected graph W (n, n), W >= 0 symmetric, with weighted degrees d_i = sum_j W_ij
and D = diag(d), the three generators of Thm. 4.1 are

    "laplacian"    T = L = D - W
    "random-walk"  T = L D^-1 = I - W D^-1   (column j of L D^-1 is L e_j / d_j; for an isolated
                                             node, d_j = 0, that column is L e_j = 0, so D^-1 is
                                             read as the pseudo-inverse: the column is 0)
    "adjacency"    T = -W

and the mask is M = exp(-lambda T) for a diffusion time lambda >= 0. Here everything is dense:
T as an (n, n) array and M by scipy.linalg.expm (Pade with scaling and squaring), O(n^3). This is
the ground truth for fast/masks/diffusion.py, which never forms M.

Markov view (papers.md Sec. 3): exp(-lambda L D^-1) = e^-lambda sum_i lambda^i / i! (W D^-1)^i, a
Poisson(lambda) number of steps of the natural random walk (W D^-1 is column-stochastic on the
non-isolated nodes). ``random_walk_series`` sums that series directly, for the identity's check.
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
    """kind as given when it is one of KINDS, else ValueError naming kind."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (T = D - W, L D^-1, -W), got {kind!r}")
    return kind


def check_lam(lam: object) -> float:
    """A diffusion time: a finite real number >= 0 (TypeError for a non-real, ValueError otherwise)."""
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
    random-walk: column-stochastic, >= 0; adjacency: exp(lam W) >= 0, symmetric."""
    lam = check_lam(lam)
    t = generator_matrix(adj, kind)
    return scipy.linalg.expm(-lam * t)


def random_walk_series(adj, lam: float, terms: int) -> np.ndarray:
    """e^-lam sum_{i=0}^{terms} lam^i / i! (W D^+ + E_iso)^i, the Markov form of exp(-lam L D^-1):
    a Poisson(lam) number of steps of the natural random walk (E_iso: ones on the diagonal at the
    isolated nodes, where the walker stays). terms >= 0 is the last power kept; the omitted tail
    has 1-norm P(Poisson(lam) > terms)."""
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
