"""reference/walks.py: the readable walk sampler and the Walks record.

Statistical checks use fixed seeds; each threshold is what a test with fresh seeds would use at
a false-failure rate of at most ALPHA = 1e-6 per assertion (chi-square p-values, 5-sigma bounds).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from reference.graphs import adjacency
from reference.walks import Walks, sample_walks
from verify import problems as P

ALPHA = 1e-6


def gof_pvalue(counts, probs) -> float:
    """Chi-square goodness of fit; bins with expected count < 5 pooled."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    exp = probs * counts.sum()
    keep = exp >= 5
    c = np.append(counts[keep], counts[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum())
    if e[-1] < 5:
        j = int(np.argmin(e[:-1]))
        c[j] += c[-1]
        e[j] += e[-1]
        c, e = c[:-1], e[:-1]
    return float(stats.chisquare(c, e).pvalue)


def geometric_pmf(p: float, k_max: int) -> np.ndarray:
    k = np.arange(k_max + 1)
    pmf = (1 - p) ** k * p
    pmf[-1] = (1 - p) ** k_max  # the last bin: L >= k_max
    return pmf


def weighted_test_graph() -> sp.csr_matrix:
    """A weighted triangle 0-1-2 (self-loop on 2), pendant 3 on 0, star 4 - {5, 6}, isolated 7."""
    rows = [0, 1, 1, 2, 0, 2, 2, 0, 3, 4, 5, 4, 6]
    cols = [1, 0, 2, 1, 2, 0, 2, 3, 0, 5, 4, 6, 4]
    vals = [1.0, 1.0, 2.0, 2.0, 0.5, 0.5, 3.0, 1.5, 1.5, 1.0, 1.0, 4.0, 4.0]
    return sp.csr_matrix((vals, (rows, cols)), shape=(8, 8))


def first_hops(w: Walks) -> np.ndarray:
    out = np.full(w.num_walks, -1)
    has = w.length > 0
    out[has] = w.nodes[w.offsets[:-1][has] + 1]
    return out


MODES = [
    dict(p_halt=0.4),
    dict(p_halt=0.4, i_max=3),
    dict(p_halt=0.2, i_max=0),
    dict(fixed_length=5),
    dict(fixed_length=0),
    dict(fixed_length=5, i_max=2),
    dict(p_halt=0.5, antithetic=True),
    dict(p_halt=0.3, i_max=4, antithetic=True, repelling=True),
    dict(fixed_length=3, repelling=True),
    dict(p_halt=0.3, choice="weighted"),
    dict(fixed_length=4, choice="weighted"),
]


@pytest.mark.parametrize("kw", MODES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_exact_properties(kw):
    a = weighted_test_graph()
    w = sample_walks(a, 4, np.random.default_rng(1), **kw)
    w.validate(a)  # every hop follows a stored edge
    assert w.n_nodes == 8 and w.n_walkers == 4 and w.num_walks == 32
    assert w.p_halt == kw.get("p_halt", 0.0)
    assert w.length.dtype == w.offsets.dtype == w.nodes.dtype == np.int64
    np.testing.assert_array_equal(w.offsets, np.concatenate([[0], np.cumsum(w.length + 1)]))
    np.testing.assert_array_equal(w.nodes[w.offsets[:-1]], np.arange(32) // 4)
    cap = min(c for c in (kw.get("i_max"), kw.get("fixed_length"), 10**9) if c is not None)
    assert w.length.max() <= cap
    isolated = np.arange(32) // 4 == 7
    assert np.all(w.length[isolated] == 0)
    if "fixed_length" in kw:
        assert np.all(w.length[~isolated] == cap)
    for i in range(32):
        path = w.walk(i)
        assert path[0] == i // 4 and len(path) == w.length[i] + 1
        assert all(a[s, t] > 0 for s, t in zip(path[:-1], path[1:]))


def test_deterministic_given_rng():
    a = P.grid_graph((4, 4))
    w1 = sample_walks(a, 3, np.random.default_rng(5), p_halt=0.3)
    w2 = sample_walks(a, 3, np.random.default_rng(5), p_halt=0.3)
    w3 = sample_walks(a, 3, np.random.default_rng(6), p_halt=0.3)
    np.testing.assert_array_equal(w1.nodes, w2.nodes)
    assert not np.array_equal(w1.length, w3.length)


def test_accepts_dense_and_networkx():
    import networkx as nx

    w = sample_walks(np.array([[0, 1.0], [1.0, 0]]), 2, np.random.default_rng(0), fixed_length=3)
    assert w.nodes.tolist() == [0, 1, 0, 1] * 2 + [1, 0, 1, 0] * 2
    w = sample_walks(nx.path_graph(3), 1, np.random.default_rng(0), fixed_length=1)
    assert w.nodes.tolist()[2:4] == [1, 0] or w.nodes.tolist()[2:4] == [1, 2]


def test_halting_lengths_are_geometric():
    p = 0.3
    a = P.path_graph(300) + sp.eye(300, format="csr")
    L = sample_walks(a, 30, np.random.default_rng(2), p_halt=p).length
    assert gof_pvalue(np.bincount(np.minimum(L, 25), minlength=26), geometric_pmf(p, 25)) > ALPHA
    assert abs(L.mean() - (1 - p) / p) < 5 * np.sqrt((1 - p) / p**2 / L.size)


def test_uniform_and_weighted_choice_marginals():
    a = weighted_test_graph()
    n_walkers = 6000
    for choice in ("uniform", "weighted"):
        w = sample_walks(a, n_walkers, np.random.default_rng(3), fixed_length=1, choice=choice)
        hop = first_hops(w)
        dense = a.toarray()
        for i in range(7):
            nbrs = np.flatnonzero(dense[i])
            h = hop[i * n_walkers:(i + 1) * n_walkers]
            counts = np.array([(h == j).sum() for j in nbrs])
            assert counts.sum() == n_walkers
            probs = dense[i, nbrs] / dense[i, nbrs].sum() if choice == "weighted" else np.full(nbrs.size, 1 / nbrs.size)
            if nbrs.size > 1:
                assert gof_pvalue(counts, probs) > ALPHA


def test_antithetic_exact_pair_structure_and_marginals():
    a = P.grid_graph((10, 10))
    L = sample_walks(a, 10, np.random.default_rng(4), p_halt=0.5, antithetic=True).length.reshape(-1, 2)
    assert np.all((L[:, 0] == 0) != (L[:, 1] == 0))  # u < 1/2 xor (u + 1/2) mod 1 < 1/2
    p = 0.3
    L = sample_walks(P.grid_graph((20, 20)), 20, np.random.default_rng(5), p_halt=p, antithetic=True).length.reshape(-1, 2)
    assert np.all(L[:, 0] != L[:, 1])  # exclusive halting events while both walk (p <= 1/2)
    for side in (0, 1):
        assert gof_pvalue(np.bincount(np.minimum(L[:, side], 20), minlength=21), geometric_pmf(p, 20)) > ALPHA
    assert np.corrcoef(L[:, 0], L[:, 1])[0, 1] < -5 / np.sqrt(len(L))


def test_repelling_distinct_neighbours_and_uniform_marginals():
    a = P.random_regular(1500, 4, seed=4)
    adj = adjacency(a)
    w = sample_walks(a, 4, np.random.default_rng(6), fixed_length=1, repelling=True)
    hop = first_hops(w).reshape(-1, 4)
    np.testing.assert_array_equal(np.sort(hop, axis=1), adj.indices.reshape(-1, 4))
    pos = np.array([[np.searchsorted(adj.indices[adj.indptr[i]:adj.indptr[i + 1]], h) for h in row]
                    for i, row in enumerate(hop)])
    np.testing.assert_array_equal(pos, (pos[:, :1] + np.arange(4)) % 4)  # (o + rank) mod deg
    for r in range(4):
        assert gof_pvalue(np.bincount(pos[:, r], minlength=4), np.full(4, 0.25)) > ALPHA
    w = sample_walks(a, 6, np.random.default_rng(7), fixed_length=1, repelling=True)
    for row in first_hops(w).reshape(-1, 6)[:50]:
        assert sorted(np.unique(row, return_counts=True)[1].tolist()) == [1, 1, 2, 2]


# ------------------------------------------------------------------------- Walks record


def _fields(**change):
    d = dict(n_nodes=2, n_walkers=1, p_halt=0.5, length=np.array([1, 0]), offsets=np.array([0, 2, 3]),
             nodes=np.array([0, 1, 1]))
    d.update(change)
    return d


@pytest.mark.parametrize("change,exc,match", [
    (dict(n_nodes=0), ValueError, "n_nodes must be >= 1, got 0"),
    (dict(n_walkers=1.5), TypeError, "n_walkers must be an int, got float"),
    (dict(p_halt=-0.1), ValueError, r"p_halt must be a float in \[0, 1\)"),
    (dict(length=np.array([1, 0, 0])), ValueError, r"length must have shape \(n_nodes \* n_walkers,\) = \(2,\)"),
    (dict(length=np.array([1.0, 0.0])), TypeError, "length must be an integer array, got dtype float64"),
    (dict(offsets=np.array([0, 2])), ValueError, r"offsets must have shape \(W \+ 1,\) = \(3,\)"),
    (dict(offsets=np.array([0, 1, 3])), ValueError, r"offsets\[1\] = 1, expected 2"),
    (dict(length=np.array([2, -1]), offsets=np.array([0, 3, 3])), ValueError, "length must be >= 0, got -1"),
    (dict(nodes=np.array([0, 1])), ValueError, r"nodes must have shape \(offsets\[-1\],\) = \(3,\)"),
    (dict(nodes=np.array([0, -1, 1])), ValueError, r"nodes must lie in \[0, n_nodes=2\), got values in \[-1, 1\]"),
    (dict(nodes=np.array([0, 1, 0])), ValueError, r"walker 1 must start at node 1 .* got nodes\[offsets\[1\]\] = 0"),
])
def test_walks_validation(change, exc, match):
    Walks(**_fields())
    with pytest.raises(exc, match=match):
        Walks(**_fields(**change))


def test_validate_against_adjacency_and_as_dict():
    w = Walks(**_fields())
    w.validate(P.path_graph(2))
    with pytest.raises(ValueError, match="hop 0 -> 1 of walker 0 does not follow an edge of adj"):
        w.validate(sp.csr_matrix((2, 2)))
    with pytest.raises(ValueError, match=r"adj has shape \(3, 3\) but the walks have n_nodes=2"):
        w.validate(P.path_graph(3))
    d = w.as_dict()
    w2 = Walks(**d)
    np.testing.assert_array_equal(w2.nodes, w.nodes)
    assert w2.p_halt == 0.5 and w.walk(0).tolist() == [0, 1] and w.walk(1).tolist() == [1]


@pytest.mark.parametrize("kw,exc,match", [
    (dict(n_walkers=0, p_halt=0.5), ValueError, "n_walkers must be >= 1, got 0"),
    (dict(n_walkers=np.int64(2), p_halt=0.5, rng=None), TypeError, "rng must be a numpy.random.Generator"),
    (dict(n_walkers=2, p_halt=0.5, rng=0), TypeError, "rng must be a numpy.random.Generator .* got int"),
    (dict(n_walkers=2, p_halt=1.0), ValueError, r"p_halt must be a float in \(0, 1\), got 1.0"),
    (dict(n_walkers=2), ValueError, "give exactly one of p_halt"),
    (dict(n_walkers=2, p_halt=0.5, fixed_length=1), ValueError, "give exactly one of p_halt"),
    (dict(n_walkers=2, fixed_length=-1), ValueError, "fixed_length must be >= 0"),
    (dict(n_walkers=2, p_halt=0.5, i_max=-1), ValueError, "i_max must be >= 0"),
    (dict(n_walkers=3, p_halt=0.5, antithetic=True), ValueError, "n_walkers must be even, got 3"),
    (dict(n_walkers=2, fixed_length=1, antithetic=True), ValueError, "antithetic termination needs halting walks"),
    (dict(n_walkers=2, p_halt=0.5, repelling=True, choice="weighted"), ValueError, "repelling walks need"),
    (dict(n_walkers=2, p_halt=0.5, choice="x"), ValueError, "choice must be one of"),
    (dict(n_walkers=2, p_halt=0.5, repelling="yes"), TypeError, "repelling must be a bool"),
])
def test_sampler_bad_arguments(kw, exc, match):
    rng = kw.pop("rng", np.random.default_rng(0))
    with pytest.raises(exc, match=match):
        sample_walks(P.path_graph(3), rng=rng, **kw)


def test_sampler_refuses_bad_graphs():
    with pytest.raises(TypeError, match="adj must be a scipy.sparse matrix"):
        sample_walks("g", 1, np.random.default_rng(0), p_halt=0.5)
    with pytest.raises(ValueError, match=r"adj is not symmetric"):
        sample_walks(np.array([[0, 1.0], [0, 0]]), 1, np.random.default_rng(0), p_halt=0.5)
