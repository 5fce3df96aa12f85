"""reference/masks/tree.py: forest inputs, distances against a hand BFS, f vectors, bad input."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import scipy.sparse as sp

from reference.masks import tree as T


def _bfs_distances(parent: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Independent all-pairs distances: BFS over an adjacency list built from the parent array."""
    n = parent.size
    nbrs = collections.defaultdict(list)
    for i, p in enumerate(parent):
        if p >= 0:
            nbrs[i].append((p, weights[i]))
            nbrs[p].append((i, weights[i]))
    out = np.full((n, n), np.inf)
    for s in range(n):
        out[s, s] = 0.0
        queue = collections.deque([s])
        while queue:
            u = queue.popleft()
            for v, w in nbrs[u]:
                if out[s, v] == np.inf:
                    out[s, v] = out[s, u] + w
                    queue.append(v)
    return out


def _forest(n: int, seed: int):
    rng = np.random.default_rng(seed)
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    parent[rng.random(n) < 0.1] = -1
    return parent, rng.uniform(0.5, 1.5, n)


@pytest.mark.parametrize("n, seed", [(1, 0), (2, 1), (9, 2), (40, 3)])
def test_distances_match_bfs_for_all_input_forms(n, seed):
    parent, w = _forest(n, seed)
    expected = _bfs_distances(parent, w)
    child = np.flatnonzero(parent >= 0)
    forms = [T.forest_adjacency(parent, weights=w),
             T.forest_adjacency(edge_index=np.stack([child, parent[child]]), weights=w[child], n=n),
             T.forest_adjacency(edge_index=np.stack([np.r_[child, parent[child]], np.r_[parent[child], child]]),
                                weights=np.r_[w[child], w[child]], n=n)]
    forms.append(T.forest_adjacency(adjacency=forms[0]))
    for adj in forms:
        np.testing.assert_allclose(T.tree_distances(adj), expected, rtol=1e-12)


def test_mask_is_zero_across_trees_and_f_elsewhere():
    parent = np.array([-1, 0, 1, -1, 3])
    adj = T.forest_adjacency(parent)
    f = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    m = T.tree_mask(adj, f)
    assert m[0, 2] == 3.0 and m[2, 0] == 3.0 and m[3, 4] == 4.0 and m[0, 0] == 5.0
    assert m[0, 3] == 0 and m[4, 2] == 0
    np.testing.assert_allclose(T.exp_affine_mask(adj, -0.5, 0.1)[0, 2], np.exp(-1.0 + 0.1))
    assert T.diameter(adj) == 2.0


def test_zero_length_edges_still_connect():
    adj = T.forest_adjacency(np.array([-1, 0, 1]), weights=np.array([0.0, 0.0, 2.0]))
    d = T.tree_distances(adj)
    assert d[0, 1] == pytest.approx(0.0, abs=1e-300) and d[0, 2] == pytest.approx(2.0) and np.isfinite(d).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(edge_index=np.array([[0, 1, 2], [1, 2, 0]])), "not a forest"),
    (dict(edge_index=np.array([[0], [0]]), n=2), "self-loop"),
    (dict(parent=np.array([-1, 0]), weights=np.array([1.0, -1.0])), "non-negative"),
    (dict(parent=np.array([-1, 0]), weights=np.array([1.0, np.nan])), "finite"),
    (dict(parent=np.array([-1, 0]), weights=np.array([1.0])), "weights must have shape"),
    (dict(parent=np.array([-1, 5])), "parent entries"),
    (dict(parent=np.array([1, 0])), "not a forest"),
    (dict(adjacency=sp.csr_matrix(np.array([[0, 1.0], [0, 0]]))), "symmetric"),
    (dict(), "exactly one"),
])
def test_bad_forests_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        T.forest_adjacency(**kwargs)


def test_f_vector_checks():
    adj = T.forest_adjacency(np.array([-1, 0, 1]))
    with pytest.raises(ValueError, match=r"f must have shape \(3,\)"):
        T.tree_mask(adj, np.ones(2))
    with pytest.raises(ValueError, match="non-finite"):
        T.tree_mask(adj, np.array([1.0, np.inf, 1.0]))
    weighted = T.forest_adjacency(np.array([-1, 0, 1]), weights=np.array([1.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="unweighted"):
        T.tree_mask(weighted, np.ones(3))
