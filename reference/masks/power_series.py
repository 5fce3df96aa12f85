"""Power-series graph masks M_alpha = sum_k alpha_k W^k, dense (reid25 Sec. 3; docs/papers.md Sec. 3).

W is a weighted adjacency (n, n), W >= 0 symmetric (reid25's common choice:
reference.graphs.normalized_adjacency); alpha = (alpha_0, ..., alpha_K) the coefficients of a
truncated series. The module holds the dense mask (O(K E n)), the factorisation M_alpha =
Phi Phi^T through ``deconvolve`` / ``convolve`` (what the GRF features estimate), the named
kernels' coefficients (``heat_alpha``, ``diffusion_alpha``, ``regularised_laplacian_alpha``) and
the convergence check of a series on a graph (``check_series_radius``, O(n^3)).
"""
from __future__ import annotations

import math

import numpy as np

from reference._checks import integer, real_array, real_scalar
from reference.budget import check_dense_budget
from reference.graphs import adjacency


def check_alpha(alpha, name: str = "alpha") -> np.ndarray:
    """alpha as a float64 vector (K + 1,), K >= 0, finite (TypeError for complex or non-numeric
    input, ValueError for another shape or NaN/inf, naming ``name``). O(K).

        >>> from reference.masks.power_series import check_alpha
        >>> check_alpha([1, 0.5]).tolist()
        [1.0, 0.5]
    """
    a = real_array(name, alpha)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of coefficients (K + 1,), got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return a


def power_series_mask(w_adj, alpha) -> np.ndarray:
    """M = sum_k alpha_k W^k (n, n) float64, W = the dense weighted adjacency of ``w_adj`` (anything
    reference.graphs.adjacency accepts, used as given: pass normalized_adjacency(adj) for reid25's W).

    Raises as check_alpha and reference.graphs.adjacency (naming w_adj); MemoryError over the
    dense budget. K sparse-dense products: O(K E n).

        >>> import numpy as np
        >>> from reference.masks.power_series import power_series_mask
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])
        >>> power_series_mask(edge, [1.0, 2.0, 3.0]).tolist()  # I + 2 W + 3 W^2, W^2 = I
        [[4.0, 2.0], [2.0, 4.0]]
    """
    a = check_alpha(alpha)
    w_sparse = adjacency(w_adj, name="w_adj")
    check_dense_budget(w_sparse.shape[0], "power-series mask", copies=3)
    n = w_sparse.shape[0]
    out = np.zeros((n, n))
    power = np.eye(n)
    for k, coeff in enumerate(a):
        if k:
            power = np.asarray(w_sparse @ power)  # W^k = W W^(k-1): a sparse-dense product, O(E N) per term
        out += coeff * power
    return out


def deconvolve(alpha) -> np.ndarray:
    """f (K + 1,) with sum_{p=0..k} f_p f_{k-p} = alpha_k for k = 0..K (the positive root f_0 > 0).

    Needs alpha_0 > 0 (ValueError naming alpha_0 otherwise: alpha_0 = (Phi Phi^T)'s W^0 coefficient = f_0^2).
    Then M_alpha = Phi Phi^T with Phi = sum_k f_k W^k (reid25 Sec. 3). Raises as check_alpha too.
    O(K^2).

        >>> import numpy as np
        >>> from reference.masks.power_series import deconvolve, heat_alpha
        >>> np.round(deconvolve(heat_alpha(2.0, 3)), 4).tolist()  # the heat kernel: f_k = (beta/2)^k / k!
        [1.0, 1.0, 0.5, 0.1667]
    """
    a = check_alpha(alpha)
    if not a[0] > 0:
        raise ValueError(f"deconvolve needs alpha_0 > 0 (f_0 = sqrt(alpha_0)), got alpha_0 = {a[0]!r}")
    f = np.zeros_like(a)
    f[0] = math.sqrt(a[0])
    for k in range(1, a.shape[0]):
        f[k] = (a[k] - sum(f[p] * f[k - p] for p in range(1, k))) / (2.0 * f[0])
    return f


def convolve(f, k_max: int | None = None) -> np.ndarray:
    """alpha_k = sum_{p=0..k} f_p f_{k-p} for k = 0..k_max (default 2 K, the full square of the
    polynomial of degree K = len(f) - 1, so that Phi Phi^T = M_alpha exactly): (k_max + 1,) float64,
    the inverse of ``deconvolve``. Raises as check_alpha (naming f), and for a k_max that is not an
    int >= 0. O(K k_max).

        >>> from reference.masks.power_series import convolve
        >>> convolve([1.0, 1.0]).tolist()  # (1 + x)^2
        [1.0, 2.0, 1.0]
    """
    f = check_alpha(f, "f")
    big_k = f.shape[0] - 1
    k_max = 2 * big_k if k_max is None else integer("k_max", k_max, minimum=0)
    out = np.zeros(k_max + 1)
    for k in range(k_max + 1):
        out[k] = sum(f[p] * f[k - p] for p in range(max(0, k - big_k), min(k, big_k) + 1))
    return out


def _check_beta(name: str, value) -> float:
    v = real_scalar(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def heat_alpha(beta: float, k_max: int) -> np.ndarray:
    """alpha_k = beta^k / k!, k = 0..k_max: (k_max + 1,) float64, the truncated series of exp(beta W)
    (reid25's heat kernel; f_k = (beta/2)^k / k!). beta a finite real, k_max an int >= 0
    (TypeError/ValueError naming them). O(k_max).

        >>> import numpy as np
        >>> from reference.masks.power_series import heat_alpha
        >>> np.round(heat_alpha(2.0, 3), 4).tolist()
        [1.0, 2.0, 2.0, 1.3333]
    """
    beta = _check_beta("beta", beta)
    k_max = integer("k_max", k_max, minimum=0)
    out = np.ones(k_max + 1)
    for k in range(1, k_max + 1):  # beta^k / k! as a running product: no k! overflow past k = 170
        out[k] = out[k - 1] * beta / k
    return out


def diffusion_alpha(beta: float, k_max: int) -> np.ndarray:
    """alpha_k = e^-beta beta^k / k!, k = 0..k_max: exp(-beta (I - W)) = e^-beta exp(beta W) (with W
    normalised, the diffusion kernel of the normalised Laplacian I - W). beta a finite real, k_max
    an int >= 0 (TypeError/ValueError naming them). O(k_max).

        >>> import numpy as np
        >>> from reference.masks.power_series import diffusion_alpha
        >>> np.round(diffusion_alpha(1.0, 2), 4).tolist()
        [0.3679, 0.3679, 0.1839]
    """
    beta = _check_beta("beta", beta)
    return math.exp(-beta) * heat_alpha(beta, k_max)


def regularised_laplacian_radius(sigma2: float) -> float:
    """The radius of convergence (1 + sigma2) / sigma2 of sum_k sigma2^k / (1 + sigma2)^(k+1) x^k, in
    an eigenvalue x of W (inf for sigma2 = 0). sigma2 a finite real >= 0 (TypeError/ValueError
    naming sigma2 otherwise). O(1).

        >>> from reference.masks.power_series import regularised_laplacian_radius
        >>> regularised_laplacian_radius(1.0), regularised_laplacian_radius(0.0)
        (2.0, inf)
    """
    sigma2 = _check_beta("sigma2", sigma2)
    if sigma2 < 0:
        raise ValueError(f"sigma2 must be >= 0 (a regularisation strength), got {sigma2!r}")
    return math.inf if sigma2 == 0 else 1.0 + 1.0 / sigma2  # (1 + sigma2) / sigma2


def spectral_radius(w_adj) -> float:
    """max |eigenvalue| of the symmetric W of ``w_adj``, a float (dense eigvalsh, O(n^3)). Raises
    as reference.graphs.adjacency (naming w_adj); MemoryError over the dense budget.

        >>> import numpy as np
        >>> from reference.masks.power_series import spectral_radius
        >>> round(spectral_radius(np.array([[0.0, 2.0], [2.0, 0.0]])), 6)
        2.0
    """
    w_sparse = adjacency(w_adj, name="w_adj")
    check_dense_budget(w_sparse.shape[0], "spectral radius")
    return float(np.abs(np.linalg.eigvalsh(w_sparse.toarray())).max())


def check_series_radius(w_adj, radius: float, name: str = "series") -> float:
    """W's spectral radius when it is < ``radius`` (the series' radius of convergence in W's
    eigenvalues); else ValueError naming both: the power series diverges on this graph. ``name``
    names the series in the message. Raises as spectral_radius too. O(n^3).

        >>> import numpy as np
        >>> from reference.masks.power_series import check_series_radius
        >>> edge = np.array([[0.0, 2.0], [2.0, 0.0]])
        >>> round(check_series_radius(edge, 3.0), 6)
        2.0
        >>> check_series_radius(edge, 1.5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the series series diverges on this graph: it converges for spectral radius(W) < 1.5 ...
    """
    rho = spectral_radius(w_adj)
    if not rho < radius:
        raise ValueError(f"the {name} series diverges on this graph: it converges for spectral radius(W) < "
                         f"{radius!r} (its radius of convergence), but the graph's spectral radius is {rho!r}")
    return rho


def regularised_laplacian_alpha(sigma2: float, k_max: int, adj=None) -> np.ndarray:
    """alpha_k = sigma2^k / (1 + sigma2)^(k+1), k = 0..k_max: the truncated Neumann series of
    (I + sigma2 (I - W))^-1 = (1 + sigma2)^-1 (I - r W)^-1, r = sigma2 / (1 + sigma2), sigma2 >= 0.

    adj: when given, the series must converge on it (check_series_radius with
    regularised_laplacian_radius(sigma2)): ValueError naming the spectral radius and the radius.
    The series is geometric in r W, so it converges only when r specrad(W) < 1. Raises as
    regularised_laplacian_radius for sigma2 and for a k_max that is not an int >= 0. O(k_max),
    plus O(n^3) with adj.

        >>> from reference.masks.power_series import regularised_laplacian_alpha
        >>> regularised_laplacian_alpha(1.0, 3).tolist()  # 1 / 2^(k + 1)
        [0.5, 0.25, 0.125, 0.0625]
    """
    radius = regularised_laplacian_radius(sigma2)
    sigma2 = float(sigma2)
    k_max = integer("k_max", k_max, minimum=0)
    if adj is not None:
        check_series_radius(adj, radius, "regularised-Laplacian")
    return np.array([sigma2**k / (1.0 + sigma2) ** (k + 1) for k in range(k_max + 1)], dtype=np.float64)
