"""Random-walk graph node kernels (RWGNK, GKAT), dense: choromanski22 Sec. 4.2, Eq. 5 and Thm. 4.2.

From walks drawn with P = D^-1 W (``choice="weighted"`` of reference.walks), the frequency
vectors f_h (rows of F (N, N)) give Psi(h) = f_h / |f_h|_2^alpha and the mask K = Psi Psi^T of
Eq. 5 (one ensemble on both sides, as the paper writes it). The exact kernel
(``rwgnk_closed_form``) and the elementwise bounds of Thm. 4.2 (``thm42_bounds``) are here too
(docs/papers.md Sec. 3). Loops over the walks cost O(N n_walkers L); the dense closed forms
O(N^3).
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
    """F (N, N): row h is the frequency vector f_h of Eq. 5, averaged over h's n walks:
    f_h(i) = (1/n) sum over the prefixes u_0..u_t of h's walks that end at u_t = i of lam^t.
    lam a finite real >= 0 (the discount per hop).

    Raises ValueError for a bad lam or a walk that steps off the graph's edges; as walk_arrays and
    reference.graphs.adjacency; MemoryError over the dense budget. O(N n_walkers L).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1, choice="weighted")
        >>> from reference.masks.rwgnk import rwgnk_frequencies
        >>> rwgnk_frequencies(edge, walks, 0.5).tolist()
        [[1.0, 0.5], [0.5, 1.0]]
    """
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
    """Psi (N, N): row h is f_h / |f_h|_2^alpha (Eq. 5), alpha in {0, 1} (ValueError naming alpha
    otherwise). Raises as rwgnk_frequencies. O(N n_walkers L + N^2).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1, choice="weighted")
        >>> from reference.masks.rwgnk import rwgnk_features
        >>> np.round(rwgnk_features(edge, walks, 0.5, alpha=1)[0], 4).tolist()  # [1, 0.5] / |[1, 0.5]|
        [0.8944, 0.4472]
    """
    alpha = _alpha(alpha)
    return _normalise(rwgnk_frequencies(adj, walks, lam), alpha)


def rwgnk_mask(adj, walks, lam, alpha=0) -> np.ndarray:
    """K_hat = Psi Psi^T (N, N), one ensemble on both sides as Eq. 5 (so the diagonal, and for
    alpha = 1 the normalisation, are biased). Raises as rwgnk_features. O(N n_walkers L + N^3).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1, choice="weighted")
        >>> from reference.masks.rwgnk import rwgnk_mask
        >>> rwgnk_mask(edge, walks, 0.5).tolist()
        [[1.25, 1.0], [1.0, 1.25]]
    """
    psi = rwgnk_features(adj, walks, lam, alpha)
    return psi @ psi.T


def transition_matrix(adj) -> np.ndarray:
    """P = D^-1 W (N, N) dense, D the weighted degrees; the row of an isolated node is 0 (it halts).
    Raises as reference.graphs.adjacency. O(N^2).

        >>> import numpy as np
        >>> from reference.masks.rwgnk import transition_matrix
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> transition_matrix(path)[1].tolist()
        [0.5, 0.0, 0.5]
    """
    adj = adjacency(adj)
    d = weighted_degree(adj)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    return inv[:, None] * adj.toarray()


def spectral_radius(x: np.ndarray) -> float:
    """max |eigenvalue| of a square (n, n) array, a float (0.0 for an empty one); dense eigvals,
    O(n^3). numpy's LinAlgError for a non-square input.

        >>> import numpy as np
        >>> from reference.masks.rwgnk import spectral_radius
        >>> round(spectral_radius(np.array([[0.0, 2.0], [0.5, 0.0]])), 6)
        1.0
    """
    return float(np.abs(np.linalg.eigvals(x)).max()) if x.size else 0.0


def rwgnk_expected_frequencies(adj, lam, *, p_halt=None, i_max=None, fixed_length=None) -> np.ndarray:
    """E[F] (N, N), row h = E[f_h]: sum_{t <= i_max} (rho P)^t with rho = (1 - p_halt) lam
    ((I - rho P)^-1 without a cap), or sum_{t <= fixed_length} (lam P)^t.

    Exactly one of p_halt (in (0, 1)) and fixed_length (int >= 0); i_max (int >= 0) only with p_halt.
    ValueError when the uncapped series diverges (spectral radius of rho P >= 1), naming it; also
    for a bad lam, p_halt, i_max or fixed_length; MemoryError over the dense budget. O(N^3)
    (times the number of terms when capped).

        >>> import numpy as np
        >>> from reference.masks.rwgnk import rwgnk_expected_frequencies
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> rwgnk_expected_frequencies(edge, 0.5, fixed_length=1).tolist()  # I + 0.5 P
        [[1.0, 0.5], [0.5, 1.0]]
        >>> np.round(rwgnk_expected_frequencies(edge, 1.0, p_halt=0.5), 4).tolist()  # (I - P / 2)^-1
        [[1.3333, 0.6667], [0.6667, 1.3333]]
    """
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
    (``rwgnk_expected_frequencies``). Raises as rwgnk_expected_frequencies, and ValueError for an
    alpha other than 0 or 1. O(N^3).

        >>> import numpy as np
        >>> from reference.masks.rwgnk import rwgnk_closed_form
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> rwgnk_closed_form(edge, 0.5, fixed_length=1).tolist()
        [[1.25, 1.0], [1.0, 1.25]]
    """
    alpha = _alpha(alpha)
    psi = _normalise(rwgnk_expected_frequencies(adj, lam, p_halt=p_halt, i_max=i_max, fixed_length=fixed_length), alpha)
    return psi @ psi.T


def gamma(x) -> np.ndarray:
    """Gamma(X) = sum_i (i + 1) X^i = (I - X)^-2 for a square X with spectral radius < 1 (Thm. 4.2).

    ValueError naming the spectral radius when it is >= 1 (the series diverges), or for a
    non-square or non-finite X; TypeError for complex input. O(n^3).

        >>> import numpy as np
        >>> from reference.masks.rwgnk import gamma
        >>> np.round(gamma(0.5 * np.eye(2)), 4).tolist()  # (1 - 1/2)^-2
        [[4.0, 0.0], [0.0, 4.0]]
    """
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
    None when vacuous: rho specrad(W) / d_min >= 1 (the series diverges). Returns (N, N) arrays.

    Raises TypeError for non-real lam or p_halt, as reference.graphs.adjacency, and MemoryError
    over the dense budget. O(N^3).

        >>> import numpy as np
        >>> from reference.masks.rwgnk import rwgnk_closed_form, thm42_bounds
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> lower, upper = thm42_bounds(path, 1.0, 0.5)
        >>> k = rwgnk_closed_form(path, 1.0, p_halt=0.5)
        >>> bool((lower <= k + 1e-12).all()), bool((k <= upper + 1e-12).all())
        (True, True)
    """
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
