"""Random-walk graph node kernels (RWGNK, GKAT), dense: choromanski22 Sec. 4.2, Eq. 5 and Thm. 4.2.

From each node h run n walks (halting with probability p before each hop, or of a fixed length;
the next node is drawn from P = D^-1 W, D the weighted degrees: ``choice="weighted"``, which is
uniform on unweighted graphs). The frequency vector

    f_h(i) = (1/n) sum_{walks of h} sum_{prefixes u_0..u_t ending at u_t = i} lam^t

estimates E[f_h] = e_h^T sum_t (rho P)^t, rho = (1 - p) lam, that is e_h^T (I - rho P)^-1 for
uncapped halting walks; sum_{t <= tau} (lam P)^t with a fixed number tau of hops. Eq. 5:
Psi(h) = f_h / |f_h|_2^alpha (alpha in {0, 1}) and K(k, l) = Psi(k) . Psi(l), K = Psi Psi^T.
For alpha = 0 the exact kernel is K = (I - rho P)^-1 (I - rho P)^-T (``rwgnk_closed_form``);
Thm. 4.2 (0 <= lam <= 1, 0 < p < 1) bounds it elementwise,
Gamma(rho / d_max W) <= K <= Gamma(rho / d_min W), Gamma(X) = sum_i (i + 1) X^i = (I - X)^-2.
With one ensemble on both sides (Eq. 5) the Monte Carlo K is biased (the diagonal, and the
normalisation when alpha = 1); its rows are what the fast operator multiplies by.
"""
from __future__ import annotations

import numbers

import numpy as np

from reference._checks import integer, real_array, real_scalar
from reference.budget import check_dense_budget
from reference.graphs import adjacency, weighted_degree
from reference.masks.grf import walk_arrays


def _lam(lam) -> float:
    value = real_scalar("lam", lam)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"lam must be a finite real >= 0 (the discount per hop), got {value!r}")
    return value


def _alpha(alpha) -> int:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or alpha not in (0, 1):
        raise ValueError(f"alpha must be 0 or 1 (Psi(h) = f_h / |f_h|^alpha), got {alpha!r}")
    return int(alpha)


def rwgnk_frequencies(adj, walks, lam) -> np.ndarray:
    """F (N, N): row h is the frequency vector f_h of Eq. 5, averaged over h's n walks."""
    adj = adjacency(adj)
    n = adj.shape[0]
    lam = _lam(lam)
    w = walk_arrays(walks, n)
    check_dense_budget(n, "RWGNK features")
    dense = adj.toarray()
    n_walkers = w["n_walkers"]
    freq = np.zeros((n, n))
    for walk in range(n * n_walkers):
        h = walk // n_walkers
        path = w["nodes"][w["offsets"][walk]:w["offsets"][walk + 1]]
        for t, i in enumerate(path):
            if t > 0 and dense[path[t - 1], i] == 0:
                raise ValueError(f"walks: a walk steps from node {path[t - 1]} to node {i}, which is not an "
                                 "edge of the graph")
            freq[h, i] += lam**t / n_walkers
    return freq


def _normalise(freq: np.ndarray, alpha: int) -> np.ndarray:
    if alpha == 0:
        return freq
    norms = np.sqrt((freq**2).sum(axis=1, keepdims=True))
    return freq / np.where(norms > 0, norms, 1.0)  # never 0 in practice: f_h(h) >= lam^0 = 1


def rwgnk_features(adj, walks, lam, alpha=0) -> np.ndarray:
    """Psi (N, N): row h is f_h / |f_h|_2^alpha (Eq. 5), alpha in {0, 1}."""
    alpha = _alpha(alpha)
    return _normalise(rwgnk_frequencies(adj, walks, lam), alpha)


def rwgnk_mask(adj, walks, lam, alpha=0) -> np.ndarray:
    """K_hat = Psi Psi^T (N, N), one ensemble on both sides as Eq. 5."""
    psi = rwgnk_features(adj, walks, lam, alpha)
    return psi @ psi.T


def transition_matrix(adj) -> np.ndarray:
    """P = D^-1 W (N, N) dense, D the weighted degrees; the row of an isolated node is 0 (it halts)."""
    adj = adjacency(adj)
    d = weighted_degree(adj)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    return inv[:, None] * adj.toarray()


def spectral_radius(x: np.ndarray) -> float:
    """max |eigenvalue| of a square matrix."""
    return float(np.abs(np.linalg.eigvals(x)).max()) if x.size else 0.0


def rwgnk_expected_frequencies(adj, lam, *, p_halt=None, i_max=None, fixed_length=None) -> np.ndarray:
    """E[F] (N, N), row h = E[f_h]: sum_{t <= i_max} (rho P)^t with rho = (1 - p_halt) lam
    ((I - rho P)^-1 without a cap), or sum_{t <= fixed_length} (lam P)^t.

    Exactly one of p_halt (in (0, 1)) and fixed_length (int >= 0); i_max (int >= 0) only with p_halt.
    ValueError when the uncapped series diverges (spectral radius of rho P >= 1), naming it."""
    adj = adjacency(adj)
    lam = _lam(lam)
    if (p_halt is None) == (fixed_length is None):
        raise ValueError("give exactly one of p_halt (halting walks) and fixed_length (walks of that many hops), "
                         f"got p_halt={p_halt!r} and fixed_length={fixed_length!r}")
    n = adj.shape[0]
    check_dense_budget(n, "RWGNK closed form", copies=3)
    p = transition_matrix(adj)
    if fixed_length is not None:
        if i_max is not None:
            raise ValueError(f"i_max caps halting walks only; with fixed_length it must be None, got {i_max!r}")
        rho, top = lam, integer("fixed_length", fixed_length, minimum=0)
    else:
        p_halt = real_scalar("p_halt", p_halt)
        if not 0.0 < p_halt < 1.0:
            raise ValueError(f"p_halt must be in (0, 1), got {p_halt!r}")
        rho = (1.0 - p_halt) * lam
        top = None if i_max is None else integer("i_max", i_max, minimum=0)
    if top is None:
        radius = rho * spectral_radius(p)
        if radius >= 1:
            raise ValueError(f"the series sum_t (rho P)^t diverges: rho = (1 - p_halt) lam = {rho:.6g} and the "
                             f"spectral radius of rho P is {radius:.6g} >= 1")
        return np.linalg.inv(np.eye(n) - rho * p)
    power, out = np.eye(n), np.zeros((n, n))
    for _ in range(top + 1):
        out += power
        power = rho * (power @ p)
    return out


def rwgnk_closed_form(adj, lam, *, p_halt=None, i_max=None, fixed_length=None, alpha=0) -> np.ndarray:
    """The kernel of the exact features, Psi Psi^T with Psi(h) = E[f_h] / |E[f_h]|^alpha (N, N).

    alpha = 0 (default): (I - rho P)^-1 (I - rho P)^-T for uncapped halting walks, rho = (1 - p) lam,
    P = D^-1 W (choromanski22 Sec. 4.2); with i_max or fixed_length the truncated sums
    (``rwgnk_expected_frequencies``)."""
    alpha = _alpha(alpha)
    psi = _normalise(rwgnk_expected_frequencies(adj, lam, p_halt=p_halt, i_max=i_max, fixed_length=fixed_length), alpha)
    return psi @ psi.T


def gamma(x) -> np.ndarray:
    """Gamma(X) = sum_i (i + 1) X^i = (I - X)^-2 for a square X with spectral radius < 1 (Thm. 4.2).

    ValueError naming the spectral radius when it is >= 1 (the series diverges)."""
    x = real_array("X", x, finite=True)
    if x.ndim != 2 or x.shape[0] != x.shape[1]:
        raise ValueError(f"X must be a square matrix, got shape {x.shape}")
    radius = spectral_radius(x)
    if radius >= 1:
        raise ValueError(f"Gamma(X) = sum_i (i + 1) X^i diverges: the spectral radius of X is {radius:.6g} >= 1")
    inv = np.linalg.inv(np.eye(x.shape[0]) - x)
    return inv @ inv


def thm42_bounds(adj, lam, p_halt) -> tuple[np.ndarray, np.ndarray | None]:
    """(lower, upper) = (Gamma(rho / d_max W), Gamma(rho / d_min W)) of Thm. 4.2, rho = (1 - p) lam.

    The theorem needs 0 <= lam <= 1 and 0 < p_halt < 1 (ValueError otherwise) and holds for
    K = ``rwgnk_closed_form(adj, lam, p_halt=p_halt)`` (alpha = 0, no cap), elementwise. d are the
    weighted degrees over the nodes with neighbours (an isolated node's rows are 0 on every side, as
    rho/d W and rho P agree there), so rho W / d_max <= rho P <= rho W / d_min entrywise. upper is
    None when vacuous: rho specrad(W) / d_min >= 1 (the series diverges)."""
    adj = adjacency(adj)
    lam = real_scalar("lam", lam)
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1] for Thm. 4.2 (choromanski22 assumes 0 <= lambda <= 1), got {lam!r}")
    p_halt = real_scalar("p_halt", p_halt)
    if not 0.0 < p_halt < 1.0:
        raise ValueError(f"p_halt must be in (0, 1) for Thm. 4.2, got {p_halt!r}")
    rho = (1.0 - p_halt) * lam
    n = adj.shape[0]
    check_dense_budget(n, "Thm. 4.2 bounds", copies=3)
    d = weighted_degree(adj)
    d = d[d > 0]
    dense = adj.toarray()
    if d.size == 0:  # no edges: K = I and both bounds are I
        return np.eye(n), np.eye(n)
    lower = gamma(rho / d.max() * dense)
    if rho * spectral_radius(dense) / d.min() >= 1:
        return lower, None
    return lower, gamma(rho / d.min() * dense)
