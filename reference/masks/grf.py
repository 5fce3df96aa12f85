"""Graph random features (GRF), dense: reid25 Algorithm 1 / Eq. 10, and asymmetric GRFs (App. D).

The features G (N, N) (row i is phi_hat(v_i) of Eq. 10) estimate Phi = sum_k f_k W^k from random
walks, so that G_q G_k^T estimates the power-series mask M_alpha = Phi Phi^T
(reference.masks.power_series); ``grf_expected_*`` are the exact targets, and Algorithm 2 of
App. D is kept as printed and as corrected (docs/papers.md Sec. 3, its erratum). Walks are data:
a reference.walks.Walks or a dict of its fields. Readable loops over the walks, O(N n_walkers L)
for L hops per walk, and dense (N, N) results (products O(N^3)).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from reference._checks import describe, integer, real_array, real_scalar
from reference.budget import check_dense_budget
from reference.graphs import adjacency, degree

_WALK_FIELDS = ("n_nodes", "n_walkers", "p_halt", "length", "offsets", "nodes")


def walk_arrays(walks, n: int, name: str = "walks") -> dict:
    """The fields of ``walks`` (a Walks object or a dict of its fields) as plain NumPy/Python values,
    checked against a graph of n nodes: n_nodes == n, n_walkers >= 1, 0 <= p_halt < 1, length (W,),
    offsets (W + 1,) consistent with length, nodes (offsets[-1],) in [0, n), walk w starting at
    node w // n_walkers. Raises TypeError/ValueError naming ``name`` and the field. O(N n_walkers L).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference.masks.grf import walk_arrays
        >>> fields = walk_arrays(walks, 2)
        >>> fields["n_walkers"], fields["offsets"].tolist()
        (2, [0, 2, 4, 6, 8])
    """
    get = (lambda k: walks[k]) if isinstance(walks, Mapping) else (lambda k: getattr(walks, k))
    try:
        raw = {k: get(k) for k in _WALK_FIELDS}
    except (KeyError, AttributeError) as e:
        raise TypeError(f"{name} must be a Walks object or a dict with fields {', '.join(_WALK_FIELDS)}; "
                        f"{describe(walks)} lacks {e}") from None
    n_nodes = integer(f"{name}.n_nodes", raw["n_nodes"])
    n_walkers = integer(f"{name}.n_walkers", raw["n_walkers"])
    if n_nodes != n:
        raise ValueError(f"{name} were sampled on a graph of {n_nodes} nodes, but the graph has {n} nodes")
    p_halt = real_scalar(f"{name}.p_halt", raw["p_halt"])
    if not 0.0 <= p_halt < 1.0:
        raise ValueError(f"{name}.p_halt must be in [0, 1) (0 for fixed-length walks), got {p_halt!r}")
    arrays = {}
    for k in ("length", "offsets", "nodes"):
        a = np.asarray(raw[k])
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"{name}.{k} must be a 1-D integer array, got {describe(a)}")
        arrays[k] = a.astype(np.int64)
    length, offsets, nodes = arrays["length"], arrays["offsets"], arrays["nodes"]
    count = n_nodes * n_walkers
    if length.shape != (count,) or offsets.shape != (count + 1,):
        raise ValueError(f"{name}: length must have shape ({count},) and offsets ({count + 1},) for "
                         f"{n_nodes} nodes x {n_walkers} walkers, got {length.shape} and {offsets.shape}")
    if (length < 0).any() or offsets[0] != 0 or (np.diff(offsets) != length + 1).any():
        raise ValueError(f"{name}: offsets must start at 0 and step by length + 1 (lengths >= 0)")
    if nodes.shape != (offsets[-1],):
        raise ValueError(f"{name}.nodes must have offsets[-1] = {offsets[-1]} entries, got {nodes.shape}")
    if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
        raise ValueError(f"{name}.nodes must lie in [0, {n}), got values in [{nodes.min()}, {nodes.max()}]")
    if (nodes[offsets[:-1]] != np.arange(count) // n_walkers).any():
        raise ValueError(f"{name}: walk w must start at node w // n_walkers (node-major walkers)")
    return {"n_nodes": n_nodes, "n_walkers": n_walkers, "p_halt": p_halt,
            "length": length, "offsets": offsets, "nodes": nodes}


def modulation(name: str, f) -> np.ndarray:
    """f (or alpha) as a non-empty, finite 1-D float64 array (f_0, ..., f_K) (K + 1,): TypeError for
    complex or non-numeric input, ValueError for another shape or NaN/inf, naming ``name``. O(K).

        >>> from reference.masks.grf import modulation
        >>> modulation("f", [1, 0.5]).tolist()
        [1.0, 0.5]
    """
    a = real_array(name, f)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence (f_0, ..., f_K), got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return a


def _hop_weight(dense: np.ndarray, a: int, b: int, name: str) -> float:
    w = dense[a, b]
    if w == 0:
        raise ValueError(f"{name}: a walk steps from node {a} to node {b}, which is not an edge of the graph")
    return float(w)


def grf_features(adj, walks, f) -> np.ndarray:
    """G (N, N): row i is phi_hat(v_i) of reid25 Eq. 10 (the features of Algorithm 1), a readable loop.

    adj: the weighted adjacency W (scipy.sparse or dense (N, N), symmetric, >= 0); walks: sampled
    on it with uniform neighbour choice; f: (K + 1,) modulation, prefixes longer than K hops are
    not counted. Entry (i, u_t) gains f_t load_t / n_walkers for every prefix of every walk of i,
    load_t = prod_{s < t} W[u_s, u_{s+1}] deg(u_s) / (1 - p_halt) (load_0 = 1): the prefix's weight
    over its probability, so E[G] = ``grf_expected_features``.

    Raises as walk_arrays, modulation and reference.graphs.adjacency; ValueError when a walk steps
    off the graph's edges; MemoryError over the dense budget. O(N n_walkers min(L, K)) plus an
    (N, N) array.

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference.masks.grf import grf_features
        >>> grf_features(edge, walks, [1.0, 0.5]).tolist()  # = I + 0.5 W: no variance on one edge
        [[1.0, 0.5], [0.5, 1.0]]
    """
    adj = adjacency(adj)
    n = adj.shape[0]
    f = modulation("f", f)
    w = walk_arrays(walks, n)
    check_dense_budget(n, "GRF features")
    dense, deg = adj.toarray(), degree(adj)
    n_walkers, p_halt = w["n_walkers"], w["p_halt"]
    g = np.zeros((n, n))
    for walk in range(n * n_walkers):
        i = walk // n_walkers
        path = w["nodes"][w["offsets"][walk]:w["offsets"][walk + 1]]
        load = 1.0
        for t, u in enumerate(path[:f.size]):  # prefixes of at most K = len(f) - 1 hops
            if t > 0:  # one more hop: its edge weight over the probability of taking it
                prev = path[t - 1]
                load = load * (_hop_weight(dense, prev, u, "walks") * deg[prev] / (1.0 - p_halt))
            g[i, u] += f[t] * load / n_walkers
    return g


def grf_mask(adj, walks_q, walks_k, f) -> np.ndarray:
    """M_hat = G_q G_k^T (N, N) (Eq. 10 and Sec. 3.2): unbiased for M_alpha = Phi Phi^T when the
    query-side and key-side ensembles are independent. walks_k=None uses walks_q on both sides
    (one shared ensemble: the diagonal is biased upwards by the variance of each row).

    Raises as grf_features. O(N n_walkers L) for the features and O(N^3) for the dense product.

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference.masks.grf import grf_mask
        >>> grf_mask(edge, walks, None, [1.0, 0.5]).tolist()
        [[1.25, 1.0], [1.0, 1.25]]
    """
    gq = grf_features(adj, walks_q, f)
    gk = gq if walks_k is None else grf_features(adj, walks_k, f)
    return gq @ gk.T


def grf_asym_mask(adj, walks, alpha) -> np.ndarray:
    """M_hat = Phi1 = G (N, N) with f^(1) = alpha (App. D, Eq. 24): the key side is one-hot. Raises
    as grf_features. O(N n_walkers L).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference.masks.grf import grf_asym_mask
        >>> grf_asym_mask(edge, walks, [1.0, 2.0]).tolist()
        [[1.0, 2.0], [2.0, 1.0]]
    """
    return grf_features(adj, walks, alpha)


def grf_expected_features(adj, f, i_max: int | None = None) -> np.ndarray:
    """E[G] = sum_{k <= K'} f_k W^k (N, N) with K' = len(f) - 1, capped at i_max when given (the
    longest walk: a p_halt walk's cap, or a fixed length). The exact target of ``grf_features``:
    each prefix's load is its weight over its probability, so the expectation is the capped series.

    Raises as modulation and reference.graphs.adjacency; for an i_max that is not an int >= 0;
    MemoryError over the dense budget. O(K N^3).

        >>> import numpy as np
        >>> from reference.masks.grf import grf_expected_features
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> grf_expected_features(path, [1.0, 0.5, 0.25])[0].tolist()  # I + W / 2 + W^2 / 4
        [1.25, 0.5, 0.25]
        >>> grf_expected_features(path, [1.0, 0.5, 0.25], i_max=1)[0].tolist()
        [1.0, 0.5, 0.0]
    """
    adj = adjacency(adj)
    f = modulation("f", f)
    top = f.size - 1 if i_max is None else min(f.size - 1, integer("i_max", i_max, minimum=0))
    check_dense_budget(adj.shape[0], "GRF expected features", copies=2)
    dense = adj.toarray()
    power, out = np.eye(adj.shape[0]), np.zeros_like(dense)
    for k in range(top + 1):
        out += f[k] * power
        power = power @ dense
    return out


def grf_expected_mask(adj, f, i_max: int | None = None) -> np.ndarray:
    """E[G_q] E[G_k]^T (N, N): the expectation of ``grf_mask`` with independent ensembles (Eq. 10),
    that is M_alpha with alpha = convolve(f) when nothing is capped. Raises as
    grf_expected_features. O(K N^3).

        >>> import numpy as np
        >>> from reference.masks.grf import grf_expected_mask
        >>> from reference.masks.power_series import convolve, power_series_mask
        >>> path = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> bool(np.allclose(grf_expected_mask(path, [1.0, 0.5]), power_series_mask(path, convolve([1.0, 0.5]))))
        True
    """
    phi = grf_expected_features(adj, f, i_max)
    return phi @ phi.T


def _algorithm2(adj, walks, alpha, phi_q, phi_k, v, printed: bool):
    adj = adjacency(adj)
    n = adj.shape[0]
    alpha = modulation("alpha", alpha)
    w = walk_arrays(walks, n)
    phi_q, phi_k, v = (real_array(k, a, finite=True) for k, a in (("phi_q", phi_q), ("phi_k", phi_k), ("v", v)))
    if phi_q.ndim != 2 or phi_k.shape != phi_q.shape or phi_q.shape[0] != n or v.ndim != 2 or v.shape[0] != n:
        raise ValueError(f"phi_q, phi_k must be (N, m) and v (N, d) with N = {n}, got {phi_q.shape}, "
                         f"{phi_k.shape} and {v.shape}")
    dense, deg = adj.toarray(), degree(adj)
    n_walkers, p_halt = w["n_walkers"], w["p_halt"]
    out = np.zeros((n, v.shape[1]))
    for i in range(n):                                  # line 2
        acc, s = np.zeros(v.shape[1]), 0.0               # lines 3-4
        for r in range(n_walkers):                      # line 5
            walk = i * n_walkers + r
            path = w["nodes"][w["offsets"][walk]:w["offsets"][walk + 1]]
            load = 1.0
            for t, j in enumerate(path[:alpha.size]):   # line 6 (alpha_t defined for t <= i_max)
                if t > 0:
                    prev = path[t - 1]
                    load = load * (_hop_weight(dense, prev, j, "walks") * deg[prev] / (1.0 - p_halt))
                a = float(phi_q[i] @ phi_k[j])
                acc += a * alpha[t] * load * v[j]       # line 7
                s += a * alpha[t] * load                # line 8
        if s == 0:
            raise ZeroDivisionError(f"Algorithm 2: S_{i} = 0 (node {i} sees no key)")
        out[i] = acc / (s * n_walkers) if printed else acc / s  # line 11 (printed: / (S_i x n))
    return out


def grf_asym_attention_printed(adj, walks, alpha, phi_q, phi_k, v) -> np.ndarray:
    """Algorithm 2 (reid25 App. D) exactly as printed: out_i = f_i / (S_i x n), (N, d).

    f_i = sum over node i's walks and prefixes t of (phi_q_i . phi_k_{u_t}) alpha_t load_t v_{u_t},
    S_i the same without v. Off by the factor 1/n (the erratum): compare ``grf_asym_attention``.
    phi_q, phi_k: (N, m) feature maps; v: (N, d).

    Raises as grf_features; ValueError for non-finite or mis-shaped phi_q, phi_k, v;
    ZeroDivisionError when S_i = 0. O(N n_walkers min(L, K) (m + d)).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference.masks.grf import grf_asym_attention, grf_asym_attention_printed
        >>> phi, v = np.ones((2, 1)), np.array([[1.0], [3.0]])
        >>> printed = grf_asym_attention_printed(edge, walks, [1.0, 1.0], phi, phi, v)
        >>> bool(np.allclose(printed * 2, grf_asym_attention(edge, walks, [1.0, 1.0], phi, phi, v)))  # n = 2
        True
    """
    return _algorithm2(adj, walks, alpha, phi_q, phi_k, v, printed=True)


def grf_asym_attention(adj, walks, alpha, phi_q, phi_k, v) -> np.ndarray:
    """Algorithm 2 correctly normalised, out_i = f_i / S_i (N, d): equal to the masked linear
    attention sum_j M_ij (phi_q_i . phi_k_j) v_j / sum_j M_ij (phi_q_i . phi_k_j) with
    M = ``grf_asym_mask`` (the 1/n of Eq. 10 cancels between numerator and S_i). phi_q, phi_k:
    (N, m); v: (N, d) -> (N, d).

    Raises as grf_asym_attention_printed. O(N n_walkers min(L, K) (m + d)).

        >>> import numpy as np
        >>> from reference.walks import sample_walks
        >>> edge = np.array([[0.0, 1.0], [1.0, 0.0]])  # one edge: every 1-hop walk crosses it
        >>> walks = sample_walks(edge, 2, np.random.default_rng(0), fixed_length=1)
        >>> from reference import masked_kernel_attention
        >>> from reference.masks.grf import grf_asym_attention, grf_asym_mask
        >>> phi, v = np.ones((2, 1)), np.array([[1.0], [3.0]])
        >>> out = grf_asym_attention(edge, walks, [1.0, 1.0], phi, phi, v)
        >>> out.tolist(), bool(np.allclose(out, masked_kernel_attention(phi, phi, v, grf_asym_mask(edge, walks, [1.0, 1.0]))))
        ([[2.0], [2.0]], True)
    """
    return _algorithm2(adj, walks, alpha, phi_q, phi_k, v, printed=False)
