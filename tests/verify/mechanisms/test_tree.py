"""verify/mechanisms/tree.py: the forests behind tree-exp, tree-dc and tree-diam are what they claim,
and the three records' dense masks are the fast operators' masks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse.csgraph as csgraph
import torch

from fast.masks.tree import Forest, TreeDCMask, TreeDiamMask, forest_diameter
from reference.masks import tree as ref_tree
from verify.mechanisms import tree as M
from verify.registry import Mechanism, get


def _part_sizes(n: int, max_chain: int | None = None) -> list[int]:
    """mixed_forest's declared component sizes (path, star, caterpillar, binary, random x2)."""
    sizes = M.component_sizes(n, max_chain)
    assert sum(sizes) == n and min(sizes) >= 0
    return sizes


def _components(parent: np.ndarray) -> list[np.ndarray]:
    """Node ids of each tree of the forest."""
    adj = ref_tree.forest_adjacency(parent)
    k, labels = csgraph.connected_components(adj, directed=False)
    return [np.flatnonzero(labels == c) for c in range(k)]


def _tree_facts(parent: np.ndarray) -> list[tuple[int, int, int]]:
    """(size, diameter in hops, max degree) of every tree, from the dense reference distances."""
    adj = ref_tree.forest_adjacency(parent)
    dist = ref_tree.tree_distances(adj)
    degree = np.asarray((adj != 0).sum(axis=1)).ravel()
    out = []
    for nodes in _components(parent):
        d = dist[np.ix_(nodes, nodes)]
        out.append((nodes.size, int(round(d.max())), int(degree[nodes].max(initial=0))))
    return out


@pytest.mark.parametrize("n", [1, 4, 6, 7, 600, 1001])
def test_mixed_forest_is_a_forest_with_one_tree_per_nonempty_part(n):
    parent = M.mixed_forest(n, seed=0)
    assert parent.shape == (n,) and np.issubdtype(parent.dtype, np.integer)
    adj = ref_tree.forest_adjacency(parent)  # raises on a cycle, a self-loop or a bad index
    assert adj.shape == (n, n) and adj.nnz == 2 * int((parent >= 0).sum())
    nonempty = sum(k > 0 for k in _part_sizes(n))
    assert int((parent < 0).sum()) == nonempty == len(_components(parent))
    assert sorted(len(c) for c in _components(parent)) == sorted(k for k in _part_sizes(n) if k)


@pytest.mark.parametrize("n", [600, 1001])
def test_mixed_forest_holds_every_family(n):
    sizes = _part_sizes(n)
    facts = _tree_facts(M.mixed_forest(n, seed=1))
    # the path: its own size minus one is the largest diameter of the forest
    assert max(d for _, d, _ in facts) == sizes[0] - 1
    assert (sizes[0], sizes[0] - 1, 2) in facts
    assert (sizes[1], 2, sizes[1] - 1) in facts  # the star: one hub joined to every other node
    spine = (sizes[2] + 1) // 2  # the caterpillar: a spine with one leg per spine node while nodes last
    assert any(s == sizes[2] and d in (spine - 1 + 1, spine - 1 + 2) and deg == 3 for s, d, deg in facts)
    binary_diam = 2 * int(math.log2(sizes[3])) - (0 if sizes[3] >= 3 * 2 ** (int(math.log2(sizes[3])) - 1) else 1)
    assert (sizes[3], binary_diam, 3) in facts  # complete binary tree in heap order


def test_mixed_forest_is_deterministic_per_seed_and_permuted():
    n = 600
    a, b = M.mixed_forest(n, seed=3), M.mixed_forest(n, seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, M.mixed_forest(n, seed=4))
    # unpermuted, each part lists parents before children and the roots sit at the part offsets
    child = np.flatnonzero(a >= 0)
    assert (a[child] > child).any() and (a[child] < child).any()
    offsets = np.cumsum([0] + _part_sizes(n)[:-1])
    assert not np.array_equal(np.flatnonzero(a < 0), offsets)
    # the same forest up to labels: component sizes do not depend on the seed
    assert sorted(map(len, _components(a))) == sorted(map(len, _components(M.mixed_forest(n, seed=4))))


def test_max_chain_caps_the_diameter():
    n, chain = 4096, 16
    capped = M.mixed_forest(n, seed=0, max_chain=chain)
    assert forest_diameter(Forest.from_parent(capped)) <= 2 * chain + 2 * math.log2(n) + 4
    assert sorted(map(len, _components(capped))) == sorted(k for k in _part_sizes(n, chain) if k)
    assert _part_sizes(n, chain)[0] == chain and _part_sizes(n, chain)[2] == chain
    assert forest_diameter(Forest.from_parent(M.mixed_forest(n, seed=0))) == _part_sizes(n)[0] - 1
    # a cap above the part sizes changes nothing
    np.testing.assert_array_equal(M.mixed_forest(600, 2, max_chain=10_000), M.mixed_forest(600, 2))


@pytest.mark.parametrize("n", [1, 2, 300, 5000])
def test_random_forest(n):
    parent, weights = M.random_forest(n, seed=5)
    assert parent.shape == weights.shape == (n,) and parent[0] == -1
    child = np.flatnonzero(parent >= 0)
    assert np.all(parent[child] < child)  # recursive: a node joins an earlier one
    ref_tree.forest_adjacency(parent, weights=weights)
    assert weights.min() >= 0.5 and weights.max() <= 1.5
    again = M.random_forest(n, seed=5)
    np.testing.assert_array_equal(again[0], parent), np.testing.assert_array_equal(again[1], weights)
    unweighted_parent, ones = M.random_forest(n, seed=5, weighted=False)
    np.testing.assert_array_equal(unweighted_parent, parent)
    np.testing.assert_array_equal(ones, np.ones(n))
    if n >= 5000:
        assert 2 <= int((parent < 0).sum()) <= 30  # about one extra root per 512 nodes


def _fast_operator(mech_id: str, p):
    if mech_id == "tree-exp":
        return M._tree_exp_fast(p, "cpu")
    return M._any_f_fast(TreeDCMask if mech_id == "tree-dc" else TreeDiamMask)(p, "cpu")


@pytest.mark.parametrize("mech_id", ["tree-exp", "tree-dc", "tree-diam"])
@pytest.mark.parametrize("n", [1, 40, 600])
def test_dense_mask_is_the_fast_operator(mech_id, n):
    mech = get(mech_id)
    p = mech.make_problem(n, 0)
    dense = mech.dense_mask(p)
    got = _fast_operator(mech_id, p).matmul(torch.eye(n, dtype=torch.float64)).numpy()
    assert dense.shape == got.shape == (n, n)
    np.testing.assert_allclose(got, dense, rtol=1e-10, atol=1e-12)


def test_records_use_the_documented_forests():
    n = 600
    dc, diam = get("tree-dc").make_problem(n, 2), get("tree-diam").make_problem(n, 2)
    np.testing.assert_array_equal(dc.extras["parent"], M.mixed_forest(n, 2))
    np.testing.assert_array_equal(diam.extras["parent"], M.mixed_forest(n, 2, M.DIAM_CHAIN))
    np.testing.assert_array_equal(dc.extras["f"], (1.0 + np.arange(n)) ** -1.5)
    exp = get("tree-exp").make_problem(n, 2)
    np.testing.assert_array_equal(exp.extras["parent"], M.random_forest(n, 2)[0])
    assert float(exp.extras["a"]) == M.TREE_A < 0 and float(exp.extras["b"]) == M.TREE_B
    assert [get(i).complexity for i in ("tree-exp", "tree-dc", "tree-diam")] == ["N", "N log^2 N", "N diam"]
    assert M.tree_diameter(diam) == forest_diameter(Forest.from_parent(diam.extras["parent"])) >= 1


def test_complexity_n_diam_requires_extra_factor():
    base = get("tree-diam")
    fields = dict(id="x", title="t", source="s", make_problem=base.make_problem, reference=base.reference,
                  fast_setup=base.fast_setup)
    with pytest.raises(ValueError, match="N diam"):
        Mechanism(complexity="N diam", **fields)
    with pytest.raises(ValueError, match="N diam"):
        Mechanism(complexity="N", extra_factor=M.tree_diameter, **fields)
    assert Mechanism(complexity="N diam", extra_factor=M.tree_diameter, **fields).extra_factor is M.tree_diameter
    assert base.extra_factor is M.tree_diameter and get("tree-dc").extra_factor is None
