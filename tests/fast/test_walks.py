"""fast/walks.py: the vectorised walk sampler and the Walks container.

Statistical tests use fixed seeds (so they are deterministic); each threshold is the one a test
would use with fresh seeds at a false-failure rate of at most ALPHA = 1e-6 per assertion
(chi-square goodness of fit / homogeneity p-values, or 5-sigma normal bounds, 5.7e-7 two-sided).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy import stats

from fast.graphs import as_graph
from fast.walks import Walks, sample_walks
from reference import walks as ref_walks
from tests.helpers import DEVICES, cuda_only
from verify import problems as P

ALPHA = 1e-6


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gof_pvalue(counts, probs) -> float:
    """Chi-square goodness of fit of observed counts to probabilities, bins with expected < 5
    pooled into the last kept bin (the test's validity condition)."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    assert abs(probs.sum() - 1) < 1e-12 and counts.shape == probs.shape
    exp = probs * counts.sum()
    keep = exp >= 5
    c = np.append(counts[keep], counts[~keep].sum())
    e = np.append(exp[keep], exp[~keep].sum())
    if e[-1] < 5:  # merge the small pooled bin into the smallest kept one
        j = int(np.argmin(e[:-1]))
        c[j] += c[-1]
        e[j] += e[-1]
        c, e = c[:-1], e[:-1]
    return float(stats.chisquare(c, e).pvalue)


def homogeneity_pvalue(a, b) -> float:
    """Chi-square test that two count vectors over the same bins come from one distribution
    (bins with fewer than 10 observations in total are pooled)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    small = (a + b) < 10
    a = np.append(a[~small], a[small].sum())
    b = np.append(b[~small], b[small].sum())
    keep = (a + b) > 0
    return float(stats.chi2_contingency(np.stack([a[keep], b[keep]]))[1])


def geometric_pmf(p: float, k_max: int, cap: int | None = None) -> np.ndarray:
    """P(L = k), k = 0..k_max, with the last bin holding P(L >= k_max) (or the cap's mass)."""
    k = np.arange(k_max + 1)
    pmf = (1 - p) ** k * p
    pmf[-1] = (1 - p) ** k_max
    return pmf


def weighted_test_graph() -> sp.csr_matrix:
    """7 nodes: a weighted triangle 0-1-2 with a self-loop on 2, a pendant 3 on 0, a weighted
    star 4 - {5, 6}, and nothing else; plus isolated node 7."""
    rows = [0, 1, 1, 2, 0, 2, 2, 0, 3, 4, 5, 4, 6]
    cols = [1, 0, 2, 1, 2, 0, 2, 3, 0, 5, 4, 6, 4]
    vals = [1.0, 1.0, 2.0, 2.0, 0.5, 0.5, 3.0, 1.5, 1.5, 1.0, 1.0, 4.0, 4.0]
    return sp.csr_matrix((vals, (rows, cols)), shape=(8, 8))


def first_hops(w: Walks) -> torch.Tensor:
    """u_1 of every walk (-1 where the walk has no hop)."""
    out = torch.full((w.num_walks,), -1, dtype=torch.int64)
    has = w.length > 0
    out[has] = w.nodes[w.offsets[:-1][has] + 1]
    return out


# ------------------------------------------------------------------------- exact properties

MODES = [
    dict(p_halt=0.4),
    dict(p_halt=0.4, i_max=3),
    dict(p_halt=0.2, i_max=0),
    dict(fixed_length=6),
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
    g = as_graph(a)
    n_walkers = 4
    w = sample_walks(g, n_walkers, generator=gen(1), **kw)
    w.validate(g)  # shapes, offsets, node-major starts, and every hop follows a stored edge
    W = 8 * n_walkers
    assert w.n_nodes == 8 and w.n_walkers == n_walkers and w.num_walks == W
    assert w.length.dtype == w.offsets.dtype == w.nodes.dtype == torch.int64
    assert w.p_halt == kw.get("p_halt", 0.0)
    assert w.offsets[0] == 0 and torch.equal(w.offsets[1:], torch.cumsum(w.length + 1, 0))
    assert torch.equal(w.nodes[w.offsets[:-1]], torch.arange(W) // n_walkers)
    assert torch.equal(w.start, torch.arange(W) // n_walkers)
    cap = min(c for c in (kw.get("i_max"), kw.get("fixed_length"), 10**9) if c is not None)
    assert int(w.length.max()) <= cap
    isolated = w.start == 7
    assert (w.length[isolated] == 0).all()
    if "fixed_length" in kw:
        assert (w.length[~isolated] == cap).all()
    # hops() and positions() describe the same walks
    src, dst = w.hops()
    assert src.numel() == int(w.length.sum()) and (g.edge_weight(src, dst) > 0).all()
    walker, t = w.positions()
    assert torch.equal(w.nodes[w.offsets[walker] + t], w.nodes)
    assert (t <= w.length[walker]).all()


def test_self_loop_only_node_stays_and_n_one():
    g = as_graph(torch.tensor([[0], [0]]))  # n = 1 with a self-loop
    w = sample_walks(g, 3, fixed_length=4, generator=gen(0))
    assert w.nodes.tolist() == [0] * 15
    w = sample_walks(as_graph(torch.zeros(2, 0, dtype=torch.int64), n=1), 2, p_halt=0.1, generator=gen(0))
    assert w.length.tolist() == [0, 0] and w.nodes.tolist() == [0, 0]


def test_accepts_any_graph_input():
    a = P.path_graph(5)
    w1 = sample_walks(a, 2, p_halt=0.3, generator=gen(3))
    w2 = sample_walks(as_graph(a), 2, p_halt=0.3, generator=gen(3))
    assert torch.equal(w1.nodes, w2.nodes)


def test_generator_determinism_and_global_rng_untouched():
    a = P.grid_graph((5, 5))
    state = torch.random.get_rng_state()
    w1 = sample_walks(a, 3, p_halt=0.3, generator=gen(7))
    w2 = sample_walks(a, 3, p_halt=0.3, generator=gen(7))
    w3 = sample_walks(a, 3, p_halt=0.3, generator=gen(8))
    w4 = sample_walks(a, 3, p_halt=0.3)  # a fresh OS-seeded generator
    w5 = sample_walks(a, 3, p_halt=0.3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(w1.nodes, w2.nodes) and torch.equal(w1.length, w2.length)
    assert not torch.equal(w1.length, w3.length)
    w4.validate(as_graph(a))
    assert not (torch.equal(w4.length, w5.length) and torch.equal(w4.nodes, w5.nodes))


# ------------------------------------------------------------------------- statistics


def test_halting_lengths_are_geometric():
    p, n_walkers = 0.3, 20
    g = as_graph(P.path_graph(1000) + sp.eye(1000, format="csr"))  # no node without neighbours
    w = sample_walks(g, n_walkers, p_halt=p, generator=gen(11))
    L = w.length.numpy()
    counts = np.bincount(np.minimum(L, 25), minlength=26)
    assert gof_pvalue(counts, geometric_pmf(p, 25)) > ALPHA
    mean, var = (1 - p) / p, (1 - p) / p**2
    assert abs(L.mean() - mean) < 5 * np.sqrt(var / L.size)


def test_capped_lengths():
    p, cap = 0.3, 2
    g = as_graph(P.grid_graph((30, 30)))
    L = sample_walks(g, 20, p_halt=p, i_max=cap, generator=gen(12)).length.numpy()
    probs = np.array([p, (1 - p) * p, (1 - p) ** 2])
    assert gof_pvalue(np.bincount(L, minlength=3), probs) > ALPHA


def test_uniform_neighbour_marginals():
    # node 0 of a star with 6 leaves and a self-loop: 7 stored neighbours, all equally likely
    rows = [0] * 7 + list(range(1, 7))
    cols = list(range(7)) + [0] * 6
    g = as_graph(sp.csr_matrix((np.ones(13), (rows, cols)), shape=(7, 7)))
    w = sample_walks(g, 7000, fixed_length=1, generator=gen(13))
    hop = first_hops(w)[: 7000].numpy()  # the walkers of node 0
    assert gof_pvalue(np.bincount(hop, minlength=7), np.full(7, 1 / 7)) > ALPHA
    assert (first_hops(w)[7000:] == 0).all()  # a leaf's only neighbour


def test_weighted_choice_is_proportional_to_weights():
    # a weighted star at the far end of a large node range (tests the float64 search keys there)
    n = 200_000
    c = n - 5
    leaves = np.arange(n - 4, n)
    wts = np.array([1.0, 2.0, 3.0, 4.0])
    a = sp.csr_matrix((np.concatenate([wts, wts]), (np.concatenate([np.full(4, c), leaves]),
                                                    np.concatenate([leaves, np.full(4, c)]))), shape=(n, n))
    g = as_graph(a)
    w = sample_walks(g, 1, fixed_length=1, choice="weighted", generator=gen(14))
    assert (w.length[: c] == 0).all()
    w = sample_walks(as_graph(a[c - 10:, c - 10:]), 10000, fixed_length=1, choice="weighted", generator=gen(15))
    hop = first_hops(w)[10 * 10000: 11 * 10000].numpy()  # walkers of the centre (index 10 of the slice)
    counts = np.bincount(hop - 11, minlength=4)
    assert gof_pvalue(counts, wts / wts.sum()) > ALPHA
    # and uniform choice on the same node ignores the weights
    w = sample_walks(as_graph(a[c - 10:, c - 10:]), 10000, fixed_length=1, generator=gen(16))
    counts = np.bincount(first_hops(w)[10 * 10000: 11 * 10000].numpy() - 11, minlength=4)
    assert gof_pvalue(counts, np.full(4, 0.25)) > ALPHA


def test_weighted_choice_whole_graph_matches_transition_matrix():
    a = weighted_test_graph()
    n_walkers = 8000
    w = sample_walks(a, n_walkers, fixed_length=1, choice="weighted", generator=gen(17))
    hop = first_hops(w).numpy()
    P_ = a.toarray() / np.maximum(a.toarray().sum(axis=1, keepdims=True), 1e-300)
    for i in range(7):
        h = hop[i * n_walkers:(i + 1) * n_walkers]
        nbrs = np.flatnonzero(P_[i])
        counts = np.array([(h == j).sum() for j in nbrs])
        assert counts.sum() == n_walkers
        if nbrs.size > 1:
            assert gof_pvalue(counts, P_[i, nbrs]) > ALPHA


def test_weighted_choice_is_not_swamped_by_heavy_edges_elsewhere():
    """Node 2's two neighbours have weight 1 each while edge {0, 1} weighs 1e17 (earlier rows):
    the per-row cumulative fractions must not come from a global cumulative sum of raw weights
    (1e17 + 1 - 1e17 = 0: every walker went to one neighbour). 5-sigma binomial bound on the split."""
    rows, cols = [0, 1, 2, 3, 2, 4], [1, 0, 3, 2, 4, 2]
    for heavy in (1e17, 1e300):
        a = sp.csr_matrix(([heavy, heavy, 1.0, 1.0, 1.0, 1.0], (rows, cols)), shape=(5, 5))
        n_walkers = 20000
        w = sample_walks(a, n_walkers, fixed_length=1, choice="weighted", generator=gen(41))
        hop = first_hops(w)[2 * n_walkers: 3 * n_walkers]
        to3 = int((hop == 3).sum())
        assert to3 + int((hop == 4).sum()) == n_walkers
        assert abs(to3 - n_walkers / 2) <= 5 * np.sqrt(n_walkers / 4)
        assert (first_hops(w)[:n_walkers] == 1).all() and (first_hops(w)[n_walkers: 2 * n_walkers] == 0).all()


def test_antithetic_half_pairs_exactly_one_halts_first():
    g = as_graph(P.grid_graph((20, 20)))
    w = sample_walks(g, 10, p_halt=0.5, antithetic=True, generator=gen(18))
    L = w.length.numpy().reshape(-1, 2)
    # u < 1/2 exactly when (u + 1/2) mod 1 >= 1/2: one of each pair halts before the first hop
    assert np.all((L[:, 0] == 0) != (L[:, 1] == 0))


def test_antithetic_pairs_never_halt_together_and_keep_geometric_marginals():
    p = 0.3
    g = as_graph(P.grid_graph((40, 50)))
    w = sample_walks(g, 10, p_halt=p, antithetic=True, generator=gen(19))
    L = w.length.numpy().reshape(-1, 2)
    # with p <= 1/2, u < p and (u + 1/2) mod 1 < p are exclusive: the pair never stops at one step
    assert np.all(L[:, 0] != L[:, 1])
    for side in (0, 1):
        counts = np.bincount(np.minimum(L[:, side], 25), minlength=26)
        assert gof_pvalue(counts, geometric_pmf(p, 25)) > ALPHA
    # negatively correlated: under independence r ~ N(0, 1/N); 5 sigma below 0
    r = np.corrcoef(L[:, 0], L[:, 1])[0, 1]
    assert r < -5 / np.sqrt(len(L))
    # independent walkers (no antithetic) show no such correlation
    L2 = sample_walks(g, 10, p_halt=p, generator=gen(20)).length.numpy().reshape(-1, 2)
    assert abs(np.corrcoef(L2[:, 0], L2[:, 1])[0, 1]) < 5 / np.sqrt(len(L2))
    assert np.any(L2[:, 0] == L2[:, 1])


def test_antithetic_with_cap_ties_only_at_the_cap():
    g = as_graph(P.grid_graph((10, 10)))
    L = sample_walks(g, 8, p_halt=0.25, i_max=3, antithetic=True, generator=gen(21)).length.numpy().reshape(-1, 2)
    tie = L[:, 0] == L[:, 1]
    assert np.all(L[tie] == 3) and tie.any()


def _neighbour_position(g, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Index of v in u's sorted neighbour list."""
    return torch.searchsorted(g.keys(), u * g.n + v) - g.crow[u]


def test_repelling_walkers_take_distinct_neighbours_with_uniform_marginals():
    g = as_graph(P.random_regular(3000, 4, seed=1))
    n_walkers = 4
    w = sample_walks(g, n_walkers, fixed_length=2, repelling=True, generator=gen(22))
    hop = first_hops(w).reshape(-1, n_walkers)
    assert torch.equal(torch.sort(hop, dim=1).values, g.col.reshape(-1, 4))  # each node's 4 walkers: all 4 neighbours
    pos = _neighbour_position(g, w.start, first_hops(w)).reshape(-1, n_walkers)
    # one offset per group, rank r: walker r takes (o + r) mod deg
    assert torch.equal(pos, (pos[:, :1] + torch.arange(n_walkers)) % 4)
    for r in range(n_walkers):
        assert gof_pvalue(np.bincount(pos[:, r].numpy(), minlength=4), np.full(4, 0.25)) > ALPHA
    # the second hop: walkers on one node (from one start) again split; marginal uniform
    second = w.nodes[w.offsets[:-1] + 2]
    pos2 = _neighbour_position(g, first_hops(w), second)
    assert gof_pvalue(np.bincount(pos2.numpy(), minlength=4), np.full(4, 0.25)) > ALPHA


def test_repelling_larger_groups_cover_every_neighbour():
    g = as_graph(P.random_regular(500, 4, seed=2))
    w = sample_walks(g, 6, fixed_length=1, repelling=True, generator=gen(23))
    hop = first_hops(w).reshape(-1, 6)
    for i in range(0, 500, 37):
        counts = torch.bincount(hop[i], minlength=g.n)[g.col[g.crow[i]:g.crow[i + 1]]]
        assert sorted(counts.tolist()) == [1, 1, 2, 2]  # 6 walkers over 4 neighbours: 2 + 2 + 1 + 1


def test_repelling_with_halting_separates_the_walkers_that_move():
    g = as_graph(P.random_regular(2000, 4, seed=3))
    w = sample_walks(g, 4, p_halt=0.4, repelling=True, generator=gen(24))
    hop = first_hops(w).reshape(-1, 4)
    for row in hop.tolist():
        moved = [h for h in row if h >= 0]
        assert len(moved) == len(set(moved))
    assert ((hop >= 0).sum(dim=1) >= 2).any()
    L = w.length.numpy()
    assert gof_pvalue(np.bincount(np.minimum(L, 20), minlength=21), geometric_pmf(0.4, 20)) > ALPHA


# ------------------------------------------------------------------------- fast vs reference


def _histograms(nodes, offsets, length, n_nodes, n_walkers, k_max):
    start = np.arange(len(length)) // n_walkers
    L = np.minimum(length, k_max)
    by_length = np.bincount(start * (k_max + 1) + L, minlength=n_nodes * (k_max + 1))
    has = length >= 2
    first = np.full(len(length), n_nodes)
    first[length >= 1] = nodes[offsets[:-1][length >= 1] + 1]
    second = np.full(len(length), n_nodes)
    second[has] = nodes[offsets[:-1][has] + 2]
    m = n_nodes + 1
    by_first = np.bincount(start * m + first, minlength=n_nodes * m)
    by_path = np.bincount((start * m + first) * m + second, minlength=n_nodes * m * m)
    return by_length, by_first, by_path


@pytest.mark.parametrize("kw", [
    dict(p_halt=0.35),
    dict(p_halt=0.35, choice="weighted"),
    dict(p_halt=0.3, i_max=3, antithetic=True),
    dict(fixed_length=2, repelling=True),
    dict(p_halt=0.25, antithetic=True, repelling=True),
], ids=["uniform", "weighted", "antithetic", "repelling", "antithetic+repelling"])
def test_fast_and_reference_agree_in_distribution(kw):
    a = weighted_test_graph()
    n_walkers = 4000
    fw = sample_walks(a, n_walkers, generator=gen(25), **kw).to_numpy()
    rw = ref_walks.sample_walks(a, n_walkers, np.random.default_rng(25), **kw)
    f = _histograms(fw["nodes"], fw["offsets"], fw["length"], 8, n_walkers, 8)
    r = _histograms(rw.nodes, rw.offsets, rw.length, 8, n_walkers, 8)
    for hf, hr in zip(f, r):
        assert homogeneity_pvalue(hf, hr) > ALPHA
    # the pair structure: antithetic pairs tie only at the cap in both
    if kw.get("antithetic"):
        for L in (fw["length"], rw.length):
            L = L.reshape(-1, 2)[: 7 * n_walkers // 2]  # not the isolated node
            tie = L[:, 0] == L[:, 1]
            assert np.all(L[tie] == kw.get("i_max", -1))


# ------------------------------------------------------------------------- Walks container


def _small_walks():
    return sample_walks(P.path_graph(3), 2, p_halt=0.3, generator=gen(30))


def test_from_arrays_round_trip_numpy_and_tensors_and_reference():
    w = _small_walks()
    d = w.to_numpy()
    assert set(d) == {"n_nodes", "n_walkers", "p_halt", "length", "offsets", "nodes"}
    assert all(isinstance(d[k], np.ndarray) for k in ("length", "offsets", "nodes"))
    w2 = Walks.from_arrays(**d)
    assert torch.equal(w2.nodes, w.nodes) and torch.equal(w2.offsets, w.offsets) and w2.p_halt == w.p_halt
    w3 = Walks.from_arrays(n_nodes=3, n_walkers=2, p_halt=0.3, length=w.length.int(), offsets=w.offsets, nodes=w.nodes)
    assert w3.length.dtype == torch.int64
    r = ref_walks.sample_walks(P.path_graph(3), 2, np.random.default_rng(0), fixed_length=2)
    w4 = Walks.from_arrays(**r.as_dict())
    assert w4.p_halt == 0.0 and w4.length.tolist() == [2] * 6
    with pytest.raises(Exception):
        w.n_nodes = 4  # frozen


def _fields(**change):
    d = dict(n_nodes=2, n_walkers=1, p_halt=0.5, length=np.array([1, 0]), offsets=np.array([0, 2, 3]),
             nodes=np.array([0, 1, 1]))
    d.update(change)
    return d


@pytest.mark.parametrize("change,exc,match", [
    (dict(n_nodes=0), ValueError, "n_nodes must be >= 1, got 0"),
    (dict(n_walkers=1.0), TypeError, "n_walkers must be an int, got float"),
    (dict(p_halt=1.0), ValueError, r"p_halt must be a float in \[0, 1\)"),
    (dict(length=np.array([1, 0, 0])), ValueError, r"length must have shape \(n_nodes \* n_walkers,\) = \(2,\), got \(3,\)"),
    (dict(length=np.array([1.0, 0.0])), TypeError, "length must hold integers, got dtype float64"),
    (dict(offsets=np.array([0, 2])), ValueError, r"offsets must have shape \(W \+ 1,\) = \(3,\)"),
    (dict(offsets=np.array([0, 1, 3])), ValueError, r"offsets\[1\] = 1, expected 2"),
    (dict(length=np.array([2, -1]), offsets=np.array([0, 3, 3])), ValueError, "length must be >= 0, got -1"),
    (dict(nodes=np.array([0, 1])), ValueError, r"nodes must have shape \(offsets\[-1\],\) = \(3,\), got \(2,\)"),
    (dict(nodes=np.array([0, 2, 1])), ValueError, r"nodes must lie in \[0, n_nodes=2\), got values in \[0, 2\]"),
    (dict(nodes=np.array([0, 1, 0])), ValueError, r"walker 1 must start at node 1 .* got nodes\[offsets\[1\]\] = 0"),
    (dict(nodes=torch.tensor([0.0, 1.0, 1.0])), TypeError, "nodes must hold integers"),
])
def test_from_arrays_validation(change, exc, match):
    Walks.from_arrays(**_fields())  # the unchanged fields are valid
    with pytest.raises(exc, match=match):
        Walks.from_arrays(**_fields(**change))


def test_validate_against_a_graph():
    w = Walks.from_arrays(**_fields())
    w.validate(P.path_graph(2))
    with pytest.raises(ValueError, match="hop 0 -> 1 does not follow an edge of graph"):
        w.validate(sp.csr_matrix((2, 2)))
    with pytest.raises(ValueError, match="graph has 3 nodes but the walks have n_nodes=2"):
        w.validate(P.path_graph(3))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(n_walkers=0, p_halt=0.5), ValueError, "n_walkers must be >= 1, got 0"),
    (dict(n_walkers=2.0, p_halt=0.5), TypeError, "n_walkers must be an int, got float"),
    (dict(n_walkers=True, p_halt=0.5), TypeError, "n_walkers must be an int, got bool"),
    (dict(n_walkers=2, p_halt=0.0), ValueError, r"p_halt must be a float in \(0, 1\), got 0.0"),
    (dict(n_walkers=2, p_halt=1), ValueError, r"p_halt must be a float in \(0, 1\), got 1"),
    (dict(n_walkers=2, p_halt="0.5"), ValueError, r"p_halt must be a float in \(0, 1\)"),
    (dict(n_walkers=2), ValueError, "give exactly one of p_halt .* got p_halt=None, fixed_length=None"),
    (dict(n_walkers=2, p_halt=0.5, fixed_length=3), ValueError, "give exactly one of p_halt"),
    (dict(n_walkers=2, fixed_length=-1), ValueError, "fixed_length must be >= 0, got -1"),
    (dict(n_walkers=2, p_halt=0.5, i_max=-2), ValueError, "i_max must be >= 0, got -2"),
    (dict(n_walkers=2, p_halt=0.5, i_max=2.5), TypeError, "i_max must be an int, got float"),
    (dict(n_walkers=3, p_halt=0.5, antithetic=True), ValueError, "n_walkers must be even, got 3"),
    (dict(n_walkers=2, fixed_length=2, antithetic=True), ValueError, "antithetic termination needs halting walks"),
    (dict(n_walkers=2, p_halt=0.5, repelling=True, choice="weighted"), ValueError, 'repelling walks need choice="uniform"'),
    (dict(n_walkers=2, p_halt=0.5, choice="greedy"), ValueError, r"choice must be one of \('uniform', 'weighted'\), got 'greedy'"),
    (dict(n_walkers=2, p_halt=0.5, antithetic=1), TypeError, "antithetic must be a bool"),
    (dict(n_walkers=2, p_halt=0.5, generator=np.random.default_rng(0)), TypeError, "generator must be a torch.Generator"),
])
def test_sampler_bad_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        sample_walks(P.path_graph(3), **kw)


def test_sampler_refuses_non_graphs():
    with pytest.raises(TypeError, match="graph must be a Graph"):
        sample_walks("path", 2, p_halt=0.5)
    with pytest.raises(ValueError, match="not symmetric"):
        sample_walks(torch.tensor([[0], [1]]), 2, p_halt=0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_device_sampler_matches_cpu_in_distribution(device):
    """Walks sampled from a Graph on ``device`` with a generator there stay there, follow the graph's edges,
    and match the CPU sampler fed the scipy matrix (another seed) in distribution (homogeneity tests)."""
    a = weighted_test_graph()
    g = as_graph(a, device=device)
    for kw in (dict(p_halt=0.35), dict(p_halt=0.35, choice="weighted"), dict(fixed_length=2, repelling=True),
               dict(p_halt=0.3, i_max=3, antithetic=True)):
        wd = sample_walks(g, 2000, generator=torch.Generator(device=device).manual_seed(0), **kw)
        assert wd.device.type == device and wd.length.device.type == device and wd.offsets.device.type == device
        wd.validate(g)
        d = wd.to_numpy()
        wr = sample_walks(a, 2000, generator=gen(1), **kw).to_numpy()
        f = _histograms(d["nodes"], d["offsets"], d["length"], 8, 2000, 8)
        r = _histograms(wr["nodes"], wr["offsets"], wr["length"], 8, 2000, 8)
        for hf, hr in zip(f, r):
            assert homogeneity_pvalue(hf, hr) > ALPHA
    w = sample_walks(g, 2, p_halt=0.5)  # a fresh generator on the graph's device
    assert w.device.type == device


@cuda_only
def test_cuda_generator_on_another_device_is_refused():
    """Needs two devices with a generator each (the meta device has none): a CPU generator with a CUDA
    graph and a CUDA generator with a CPU graph are both refused, naming the graph's device."""
    a = weighted_test_graph()
    with pytest.raises(ValueError, match="generator must be on the graph's device"):
        sample_walks(as_graph(a, device="cuda"), 2, p_halt=0.5, generator=gen(0))
    with pytest.raises(ValueError, match="generator must be on the graph's device"):
        sample_walks(a, 2, p_halt=0.5, generator=torch.Generator(device="cuda").manual_seed(0))


# ------------------------------------------------------------------ refused before walking (issue 24)

CYCLE6 = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 4, 5]])


def test_a_tiny_p_halt_without_i_max_is_refused_not_walked():
    """p_halt = 1e-12 would walk ~1e12 hops (the issue's hang): refused at once, naming p_halt and
    i_max and what to pass; i_max makes the same call cheap, and its walks stop at i_max."""
    import time

    from fast.walks import MAX_WALK_STEPS

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"p_halt = 1e-12 makes walks of 1e\+12 hops on average.*MAX_WALK_STEPS = "
                                         r"100000\. Pass i_max <= 100000 .* or p_halt >= "):
        sample_walks(CYCLE6, 2, p_halt=1e-12)
    with pytest.raises(ValueError, match=r"p_halt = 1e-12 with i_max = 1000000 "):
        sample_walks(CYCLE6, 2, p_halt=1e-12, i_max=10**6)
    with pytest.raises(ValueError, match=r"fixed_length = 1000000 takes 1000000 steps, more than MAX_WALK_STEPS"):
        sample_walks(CYCLE6, 1, fixed_length=10**6)
    assert time.perf_counter() - start < 5.0
    walks = sample_walks(CYCLE6, 2, p_halt=1e-12, i_max=50, generator=gen(0))
    assert walks.length.tolist() == [50] * 12 and MAX_WALK_STEPS == 100_000
    # the estimate is the longest walk's: p_halt = 1e-3 on 12 walkers walks a few thousand hops, allowed
    assert int(sample_walks(CYCLE6, 2, p_halt=1e-3, generator=gen(1)).length.max()) < 20_000


def test_absurd_walker_counts_are_refused_before_allocating():
    with pytest.raises(MemoryError, match=r"n_walkers = 1000000000000000 on 6 nodes asks for the walks .*TiB"):
        sample_walks(CYCLE6, 10**15, fixed_length=2)
    with pytest.raises(MemoryError, match=r"n_walkers = 1000000000000 on 6 nodes"):
        sample_walks(CYCLE6, 10**12, p_halt=0.5)
