"""reference.masks.grf: GRF features (reid25 Eq. 10), their expectation, Algorithm 2 and its erratum."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from reference.masks.grf import (grf_asym_attention, grf_asym_attention_printed, grf_asym_mask,
                                 grf_expected_features, grf_expected_mask, grf_features, grf_mask)


def walks_dict(n: int, n_walkers: int, p_halt: float, paths: list[list[int]]) -> dict:
    """Walks built by hand: paths[w] is walker w's node sequence (w = i * n_walkers + r)."""
    assert len(paths) == n * n_walkers
    length = np.array([len(p) - 1 for p in paths], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(length + 1)]).astype(np.int64)
    nodes = np.array([u for p in paths for u in p], dtype=np.int64)
    return {"n_nodes": n, "n_walkers": n_walkers, "p_halt": p_halt, "length": length, "offsets": offsets,
            "nodes": nodes}


def small_graph() -> sp.csr_matrix:
    """6 nodes: weighted edges, a triangle 1-2-3, a self-loop at 2, node 4 isolated, leaf 5."""
    edges = [(0, 1, 1.0), (1, 2, 2.0), (2, 3, 0.5), (1, 3, 1.5), (2, 2, 0.7), (3, 5, 1.2)]
    a = np.zeros((6, 6))
    for i, j, w in edges:
        a[i, j] = a[j, i] = w
    return sp.csr_matrix(a)


def sample(adj: sp.csr_matrix, n_walkers: int, rng: np.random.Generator, *, p_halt: float = 0.0,
           i_max: int | None = None, fixed_length: int | None = None, weighted: bool = False) -> dict:
    """A plain sampler for these tests (independent of reference.walks and fast.walks): halting
    with probability p_halt before each hop (capped at i_max hops), or fixed_length hops; the next
    node uniform over the stored neighbours (or proportional to the weights); stop at a node
    without neighbours."""
    a = adj.toarray()
    n = a.shape[0]
    cap = fixed_length if fixed_length is not None else (i_max if i_max is not None else 10**9)
    nbrs = [np.nonzero(a[u])[0] for u in range(n)]
    cdf = [np.cumsum(a[u, nb] if weighted else np.ones(nb.size)) for u, nb in enumerate(nbrs)]
    paths = []
    for i in range(n):
        for _ in range(n_walkers):
            path = [i]
            while len(path) - 1 < cap:
                u = path[-1]
                if nbrs[u].size == 0 or (fixed_length is None and rng.random() < p_halt):
                    break
                k = min(int(np.searchsorted(cdf[u], rng.random() * cdf[u][-1], side="right")), nbrs[u].size - 1)
                path.append(int(nbrs[u][k]))
            paths.append(path)
    return walks_dict(n, n_walkers, p_halt if fixed_length is None else 0.0, paths)


def enumerate_walks(adj: sp.csr_matrix, start: int, p_halt: float, i_max: int, weighted: bool = False):
    """Every walk from ``start`` with its probability: halting p_halt before each hop, capped at
    i_max hops, stopping at a node without neighbours; next node uniform (or weighted)."""
    a = adj.toarray()
    out = []

    def grow(path, prob):
        u = path[-1]
        nbrs = np.nonzero(a[u])[0]
        if len(path) - 1 == i_max or nbrs.size == 0:
            out.append((path, prob))
            return
        out.append((path, prob * p_halt))
        for v in nbrs:
            q = a[u, v] / a[u].sum() if weighted else 1.0 / nbrs.size
            grow(path + [int(v)], prob * (1 - p_halt) * q)

    grow([start], 1.0)
    return out


def single_walk_row(adj, n: int, start: int, path: list[int], p_halt: float, f) -> np.ndarray:
    """Row ``start`` of grf_features when ``start``'s only walk is ``path`` (one walker per node)."""
    paths = [[i] for i in range(n)]
    paths[start] = path
    return grf_features(adj, walks_dict(n, 1, p_halt, paths), f)[start]


def test_hand_computed_loads_on_a_path():
    """Path 0-1-2: the walk 0, 1, 2 with p_halt = 1/2 has loads 1, 1 * 1 / (1/2) = 2 and 2 * 1 * 2 / (1/2) = 8."""
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float))
    w = walks_dict(3, 1, 0.5, [[0, 1, 2], [1], [2, 1]])
    g = grf_features(adj, w, [1.0, 0.5, 0.25])
    np.testing.assert_allclose(g[0], [1.0, 0.5 * 2, 0.25 * 8], rtol=1e-15)
    np.testing.assert_allclose(g[1], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(g[2], [0.0, 0.5 * 1 * 1 / 0.5, 1.0])  # from 2: one neighbour, load 2
    # f shorter than the walk: the 2-hop prefix is not counted
    np.testing.assert_allclose(grf_features(adj, w, [1.0, 0.5])[0], [1.0, 1.0, 0.0])


def test_averaging_over_walkers_and_revisits():
    """Two walkers: each contributes 1/n; a walk that revisits a node adds both prefixes."""
    adj = sp.csr_matrix(np.array([[0, 2.0], [2.0, 0]]))
    w = walks_dict(2, 2, 0.0, [[0, 1, 0], [0], [1], [1, 0]])  # fixed-length-like, p_halt = 0
    g = grf_features(adj, w, [1.0, 1.0, 1.0])
    # walker 0: loads 1, 2 * 1, 2 * 1 * 2 * 1 = 4 at nodes 0, 1, 0; walker 1: load 1 at node 0
    np.testing.assert_allclose(g[0], [(1 + 4 + 1) / 2, 2 / 2])
    np.testing.assert_allclose(g[1], [2 / 2, (1 + 1) / 2])


@pytest.mark.parametrize("p_halt,i_max", [(0.3, 3), (0.5, 2)])
def test_expectation_over_all_walks_is_the_capped_series(p_halt, i_max):
    """Summing X(walk) P(walk) over every possible walk gives sum_{k <= min(K, i_max)} f_k W^k exactly
    (weighted edges, a self-loop, an isolated node): the loads are weight / probability."""
    adj = small_graph()
    n = adj.shape[0]
    f = np.array([0.9, -0.4, 0.3, 0.2, 0.1])
    expected = np.zeros((n, n))
    for i in range(n):
        walks = enumerate_walks(adj, i, p_halt, i_max)
        assert math.isclose(sum(p for _, p in walks), 1.0, rel_tol=1e-12)
        for path, prob in walks:
            expected[i] += prob * single_walk_row(adj, n, i, path, p_halt, f)
    target = grf_expected_features(adj, f, i_max=i_max)
    np.testing.assert_allclose(expected, target, rtol=1e-12, atol=1e-12)
    # the cap matters here: the uncapped series differs
    assert np.abs(grf_expected_features(adj, f) - target).max() > 1e-3


def test_expected_features_is_the_power_series():
    adj = small_graph()
    w = adj.toarray()
    f = [0.5, 0.25, 0.125]
    np.testing.assert_allclose(grf_expected_features(adj, f), 0.5 * np.eye(6) + 0.25 * w + 0.125 * w @ w, rtol=1e-14)
    phi = grf_expected_features(adj, f)
    np.testing.assert_allclose(grf_expected_mask(adj, f), phi @ phi.T, rtol=1e-14)


def test_monte_carlo_mean_within_hoeffding_bound():
    """Mean of G over N iid walkers per node vs E[G]: each walker's row entry X_ij lies in [lo, hi]
    (from the enumeration), so P(|mean - E| > t) <= 2 exp(-2 N t^2 / (hi - lo)^2); a union bound over
    the N^2 entries at total probability 1e-6 gives t. A wrong target (no degree factor) fails it."""
    adj = small_graph()
    n, p_halt, i_max, n_walkers = adj.shape[0], 0.3, 3, 3000
    f = np.array([1.0, 0.5, 0.25, 0.125])
    lo, hi = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        rows = np.array([single_walk_row(adj, n, i, path, p_halt, f) for path, _ in enumerate_walks(adj, i, p_halt, i_max)])
        lo[i], hi[i] = rows.min(axis=0), rows.max(axis=0)
    walks = sample(adj, n_walkers, np.random.default_rng(7), p_halt=p_halt, i_max=i_max)
    mean = grf_features(adj, walks, f)
    t = (hi - lo) * math.sqrt(math.log(2 * n * n / 1e-6) / (2 * n_walkers))
    target = grf_expected_features(adj, f, i_max=i_max)
    assert (np.abs(mean - target) <= t + 1e-12).all()
    # the same test rejects the series of P = W / deg (what the loads would give without deg(u))
    d = np.maximum(np.asarray((adj != 0).sum(axis=1)).ravel(), 1)
    p = adj.toarray() / d[:, None]
    wrong = sum(f[k] * np.linalg.matrix_power(p, k) for k in range(i_max + 1))
    assert (np.abs(mean - wrong) > t).any()


def test_mask_shared_and_independent():
    adj = small_graph()
    n = adj.shape[0]
    rng = np.random.default_rng(3)
    wq, wk = sample(adj, 2, rng, p_halt=0.5), sample(adj, 2, rng, p_halt=0.5)
    f = [1.0, 0.3, 0.1]
    gq, gk = grf_features(adj, wq, f), grf_features(adj, wk, f)
    np.testing.assert_allclose(grf_mask(adj, wq, wk, f), gq @ gk.T, rtol=1e-14)
    np.testing.assert_allclose(grf_mask(adj, wq, None, f), gq @ gq.T, rtol=1e-14)
    np.testing.assert_allclose(grf_asym_mask(adj, wq, f), gq, rtol=1e-14)
    assert gq.shape == (n, n) and not np.allclose(gq, gk)


def test_algorithm2_printed_is_off_by_n():
    """Alg. 2 as printed divides by S_i x n; correctly normalised it equals the masked linear
    attention with M = grf_asym_mask, and the printed output is that divided by n."""
    adj = small_graph()
    n = adj.shape[0]
    rng = np.random.default_rng(0)
    n_walkers = 3
    walks = sample(adj, n_walkers, np.random.default_rng(1), p_halt=0.4)
    alpha = [1.0, 0.6, 0.3, 0.1]
    phi_q, phi_k, v = rng.uniform(0.1, 1, (n, 4)), rng.uniform(0.1, 1, (n, 4)), rng.normal(size=(n, 5))
    m = grf_asym_mask(adj, walks, alpha)
    a = m * (phi_q @ phi_k.T)
    dense = (a @ v) / a.sum(axis=1, keepdims=True)
    correct = grf_asym_attention(adj, walks, alpha, phi_q, phi_k, v)
    printed = grf_asym_attention_printed(adj, walks, alpha, phi_q, phi_k, v)
    np.testing.assert_allclose(correct, dense, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(printed * n_walkers, correct, rtol=1e-14)
    assert np.abs(printed - dense).max() > 0.1 * np.abs(dense).max()


def test_bad_input():
    adj = small_graph()
    w = walks_dict(6, 1, 0.5, [[i] for i in range(6)])
    with pytest.raises(ValueError, match="f must be a non-empty"):
        grf_features(adj, w, [])
    with pytest.raises(ValueError, match="f contains non-finite"):
        grf_features(adj, w, [1.0, np.nan])
    with pytest.raises(ValueError, match="f must be a non-empty 1-D"):
        grf_features(adj, w, [[1.0, 2.0]])
    with pytest.raises(ValueError, match="alpha contains non-finite"):
        grf_asym_attention(adj, w, [np.inf], np.ones((6, 2)), np.ones((6, 2)), np.ones((6, 2)))
    with pytest.raises(ValueError, match="graph of 5 nodes"):
        grf_features(adj, walks_dict(5, 1, 0.5, [[i] for i in range(5)]), [1.0])
    with pytest.raises(ValueError, match="p_halt must be in"):
        grf_features(adj, {**w, "p_halt": 1.0}, [1.0])
    bad = walks_dict(6, 1, 0.5, [[0, 2]] + [[i] for i in range(1, 6)])  # 0 - 2 is not an edge
    with pytest.raises(ValueError, match="not an edge"):
        grf_features(adj, bad, [1.0, 1.0])
    with pytest.raises(TypeError, match="lacks"):
        grf_features(adj, {k: v for k, v in w.items() if k != "nodes"}, [1.0])
    with pytest.raises(ValueError, match="start at node"):
        grf_features(adj, walks_dict(6, 1, 0.5, [[1]] + [[i] for i in range(1, 6)]), [1.0])
    with pytest.raises(ValueError, match="i_max"):
        grf_expected_features(adj, [1.0], i_max=-1)


def test_shared_ensemble_biases_only_the_diagonal():
    """Exact expectations over every walk (one walker per node): with one shared ensemble
    E[(G G^T)_ii] = |E X_i|^2 + tr Cov X_i > M_ii, while rows of distinct nodes are independent, so
    the off-diagonal entries are unbiased; with independent ensembles every entry is."""
    adj = small_graph()
    n, p_halt, i_max = adj.shape[0], 0.4, 3
    f = np.array([1.0, 0.5, 0.25, 0.125])
    mean, second = np.zeros((n, n)), np.zeros(n)
    for i in range(n):
        for path, prob in enumerate_walks(adj, i, p_halt, i_max):
            row = single_walk_row(adj, n, i, path, p_halt, f)
            mean[i] += prob * row
            second[i] += prob * row @ row
    m = grf_expected_mask(adj, f, i_max=i_max)
    np.testing.assert_allclose(mean @ mean.T, m, rtol=1e-12)  # independent ensembles: unbiased
    shared = mean @ mean.T
    np.fill_diagonal(shared, second)  # E[G_i . G_j] = E G_i . E G_j for i != j (independent rows)
    bias = np.diag(shared - m)
    assert (bias[[0, 1, 2, 3, 5]] > 1e-3).all() and bias[4] == 0  # node 4 is isolated: deterministic row
