"""Tree-distance masks, dense: M_ij = f(dist_T(i, j)) on a forest (choromanski22 Sec. 3.3, 6).

dist_T is the (weighted) path length in the forest; nodes in different trees get M_ij = 0.
A forest may be given as a parent array (parent[i] = -1 for a root), a scipy.sparse adjacency
(symmetric, weights = edge lengths) or an edge_index (2, E) with optional weights. Distances
come from scipy.sparse.csgraph.shortest_path (all pairs, dense, O(n^2 log n)): the ground truth
the fast recursions are checked against.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from reference._checks import describe, function_values, integer, real_array, real_scalar
from reference.budget import check_dense_budget

#: exp(x) is finite in float64 for x <= this (log of the largest float64).
_MAX_EXPONENT = float(np.log(np.finfo(np.float64).max))


def forest_adjacency(parent: np.ndarray | None = None, *, adjacency=None, edge_index: np.ndarray | None = None,
                     weights: np.ndarray | None = None, n: int | None = None) -> sp.csr_matrix:
    """A symmetric CSR adjacency (n, n) of a forest from exactly one of the three input forms.

    parent: (n,) ints, -1 for roots; weights (n,) edge length to the parent (ignored at roots).
    adjacency: scipy.sparse or dense (n, n), symmetric, entries = edge lengths.
    edge_index: (2, E) ints, each undirected edge once or in both directions (then with equal
    weights); weights (E,); n an int >= 1.
    Raises ValueError for a cycle, a self-loop, a negative or non-finite length, bad shapes, an
    edge listed twice with different weights, not exactly one input form; TypeError for float or
    bool ids, complex weights. O(n + E) (a dense adjacency: O(n^2)).

        >>> import numpy as np
        >>> from reference.masks.tree import forest_adjacency
        >>> forest_adjacency(np.array([-1, 0, 0])).toarray().tolist()  # a root and two children
        [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
        >>> forest_adjacency(edge_index=np.array([[0], [1]]), weights=np.array([2.5]), n=3).nnz
        2
    """
    given = [x is not None for x in (parent, adjacency, edge_index)]
    if sum(given) != 1:
        raise ValueError("give exactly one of parent, adjacency, edge_index")
    if parent is not None:
        p = np.asarray(parent)
        if p.dtype.kind not in "iu":
            raise TypeError(f"parent must be a non-empty 1-D integer array (-1 for roots), got {describe(p)}")
        if p.ndim != 1 or p.size == 0:
            raise ValueError(f"parent must be a non-empty 1-D integer array (-1 for roots), got shape {p.shape}")
        n = p.size
        if ((p < -1) | (p >= n)).any() or (p == np.arange(n)).any():
            raise ValueError("parent entries must be -1 (root) or another node's index in [0, n)")
        child = np.flatnonzero(p >= 0)
        w = np.ones(n) if weights is None else real_array("weights", weights)
        if w.shape != (n,):
            raise ValueError(f"weights must have shape ({n},) (edge length to the parent), got {w.shape}")
        rows, cols, vals = child, p[child], w[child]
    elif edge_index is not None:
        e = np.asarray(edge_index)
        if e.dtype.kind not in "iu":
            raise TypeError(f"edge_index must be a (2, E) integer array, got {describe(e)}")
        if e.ndim != 2 or e.shape[0] != 2:
            raise ValueError(f"edge_index must be a (2, E) integer array, got shape {e.shape}")
        if n is not None:
            n = integer("n", n)
        elif e.size:
            n = int(e.max()) + 1
        else:
            raise ValueError("n must be given (an int >= 1) for an edge_index without edges")
        if e.size and (e.min() < 0 or e.max() >= n):
            raise ValueError(f"edge_index entries must lie in [0, n={n})")
        vals = np.ones(e.shape[1]) if weights is None else real_array("weights", weights)
        if vals.shape != (e.shape[1],):
            raise ValueError(f"weights must have shape ({e.shape[1]},) (one per edge), got {vals.shape}")
        # an edge listed in both directions is one undirected edge: keep (min, max) once
        lo, hi = np.minimum(e[0], e[1]), np.maximum(e[0], e[1])
        _, first, group = np.unique(lo * n + hi, return_index=True, return_inverse=True)
        differs = (vals != vals[first][group]) & ~(np.isnan(vals) & np.isnan(vals[first][group]))
        if differs.any():
            j = int(np.flatnonzero(differs)[0])
            raise ValueError(f"edge ({int(lo[j])}, {int(hi[j])}) is listed more than once in edge_index with "
                             f"different weights {float(vals[first][group][j])!r} and {float(vals[j])!r}: give each "
                             f"undirected edge one weight")
        rows, cols, vals = lo[first], hi[first], vals[first]
        if (rows == cols).any():
            raise ValueError("a forest has no self-loops; edge_index has one")
    else:
        raw = adjacency if sp.issparse(adjacency) else np.asarray(adjacency)
        if raw.dtype.kind not in "biuf":
            raise TypeError(f"adjacency must hold real edge lengths, got dtype {raw.dtype}")
        a = sp.csr_matrix(raw, dtype=np.float64)
        if a.shape[0] != a.shape[1] or a.shape[0] == 0:
            raise ValueError(f"adjacency must be square and non-empty, got shape {a.shape}")
        if abs(a - a.T).max() > 0:
            raise ValueError("adjacency must be symmetric (an undirected forest)")
        if a.diagonal().any():
            raise ValueError("a forest has no self-loops; adjacency has a non-zero diagonal")
        n = a.shape[0]
        upper = sp.triu(a, k=1).tocoo()
        rows, cols, vals = upper.row, upper.col, upper.data
    if not np.isfinite(vals).all() or (vals < 0).any():
        raise ValueError("edge weights (lengths) must be finite and non-negative")
    adj = sp.coo_matrix((np.concatenate([vals, vals]), (np.concatenate([rows, cols]), np.concatenate([cols, rows]))),
                        shape=(n, n)).tocsr()
    components, _ = csgraph.connected_components(_pattern(rows, cols, n), directed=False)
    if len(rows) != n - components:
        raise ValueError(f"not a forest: {len(rows)} edges on {n} nodes in {components} components (a cycle)")
    return adj


def _pattern(rows: np.ndarray, cols: np.ndarray, n: int) -> sp.csr_matrix:
    """The unweighted edge pattern (zero-length edges still connect)."""
    ones = np.ones(2 * len(rows))
    return sp.coo_matrix((ones, (np.concatenate([rows, cols]), np.concatenate([cols, rows]))), shape=(n, n)).tocsr()


def tree_distances(adjacency: sp.spmatrix) -> np.ndarray:
    """All-pairs path lengths (n, n) in the forest; inf between trees (csgraph.shortest_path).

    adjacency: a square (n, n) matrix of real non-negative edge lengths, n >= 1 (as built by
    forest_adjacency, which checks that it is a forest). Raises TypeError for non-real entries,
    ValueError for a non-square or empty matrix, MemoryError over the dense budget. Dense
    all-pairs Dijkstra: O(n^2 log n) on a forest.

        >>> import numpy as np
        >>> from reference.masks.tree import forest_adjacency, tree_distances
        >>> tree_distances(forest_adjacency(np.array([-1, 0, 1, -1]))).tolist()[0]  # a path 0-1-2 and node 3
        [0.0, 1.0, 2.0, inf]
    """
    raw = adjacency if sp.issparse(adjacency) else np.asarray(adjacency)
    if raw.dtype.kind not in "biuf":
        raise TypeError(f"adjacency must hold real edge lengths, got dtype {raw.dtype}")
    if len(raw.shape) != 2 or raw.shape[0] != raw.shape[1] or raw.shape[0] == 0:
        raise ValueError(f"adjacency must be a square (n, n) matrix with n >= 1, got shape {raw.shape}")
    a = sp.csr_matrix(raw, dtype=np.float64)
    check_dense_budget(a.shape[0], "tree distances")
    coo = a.tocoo()
    # csgraph treats explicit zeros as missing edges: lengths of exactly 0 become a tiny epsilon
    # and are rounded away below (tree distances are sums of the given lengths)
    data = np.where(coo.data == 0, np.finfo(float).tiny, coo.data)
    return csgraph.shortest_path(sp.csr_matrix((data, (coo.row, coo.col)), shape=a.shape), directed=False)


def tree_mask(adjacency: sp.spmatrix, f: Callable[[np.ndarray], np.ndarray] | np.ndarray) -> np.ndarray:
    """M_ij = f(dist(i, j)) within a tree, 0 across trees: (n, n).

    f: a callable on a 1-D array of finite distances returning one finite real per distance (or a
    scalar), or a vector (f(0), ..., f(n-1)) for an unweighted forest (integer distances index it).
    A callable returning NaN, inf, complex values or the wrong shape is refused, naming f; a
    vector f of the wrong shape, with NaN/inf, or on a weighted forest raises ValueError.
    choromanski22 Sec. 6 (Lemmas 6.1 and 6.2 apply it fast). Dense: O(n^2 log n).

        >>> import numpy as np
        >>> from reference.masks.tree import forest_adjacency, tree_mask
        >>> adj = forest_adjacency(np.array([-1, 0, 1, -1]))
        >>> tree_mask(adj, lambda d: 0.5 ** d)[0].tolist(), tree_mask(adj, np.array([3.0, 2.0, 1.0, 0.0]))[0].tolist()
        ([1.0, 0.5, 0.25, 0.0], [3.0, 2.0, 1.0, 0.0])
    """
    dist = tree_distances(adjacency)
    finite = np.isfinite(dist)
    out = np.zeros_like(dist)
    if callable(f):
        d = dist[finite]
        out[finite] = function_values("f", f(d), d.shape, "the finite tree distances")
    else:
        table = real_array("f", f)
        n = dist.shape[0]
        if table.shape != (n,):
            raise ValueError(f"f must have shape ({n},): f(0), ..., f(n - 1), got {table.shape}")
        if not np.isfinite(table).all():
            raise ValueError("f contains non-finite values")
        d = dist[finite]
        if not np.allclose(d, np.round(d)):
            raise ValueError("a vector f needs an unweighted forest (integer distances)")
        out[finite] = table[np.round(d).astype(np.int64)]
    return out


def exp_affine_mask(adjacency: sp.spmatrix, a: float, b: float) -> np.ndarray:
    """M_ij = exp(a dist(i, j) + b) within a tree, 0 across trees (Lemma 3.5's f): (n, n).

    a, b: finite reals. Raises ValueError naming a and b when some a dist + b exceeds
    log(float64 max) ~ 709.78 (that mask entry is not a float64 number; b only scales M, so a
    smaller b gives the same attention), or when a or b is not finite; TypeError for non-reals.
    choromanski22 Lemma 3.5 applies it in O(n); here dense, O(n^2 log n).

        >>> import numpy as np
        >>> from reference.masks.tree import exp_affine_mask, forest_adjacency
        >>> m = exp_affine_mask(forest_adjacency(np.array([-1, 0, 1])), a=-np.log(2.0), b=0.0)
        >>> np.round(m[0], 4).tolist()
        [1.0, 0.5, 0.25]
    """
    a, b = real_scalar("a", a), real_scalar("b", b)
    if not (np.isfinite(a) and np.isfinite(b)):
        raise ValueError(f"a and b must be finite, got a={a!r}, b={b!r}")
    dist = tree_distances(adjacency)
    finite = np.isfinite(dist)
    exponent = a * dist[finite] + b
    if exponent.max() > _MAX_EXPONENT:
        raise ValueError(f"exp(a dist + b) overflows float64 for a={a!r}, b={b!r}: the largest exponent is "
                         f"{exponent.max():.6g} > {_MAX_EXPONENT:.6g}; lower b (it only scales the mask) or a")
    out = np.zeros_like(dist)
    out[finite] = np.exp(exponent)
    return out


def diameter(adjacency: sp.spmatrix) -> float:
    """The largest finite distance in the forest of an (n, n) adjacency, a float (dense all-pairs,
    O(n^2 log n); the fast side uses two BFS passes). Raises as tree_distances.

        >>> import numpy as np
        >>> from reference.masks.tree import diameter, forest_adjacency
        >>> diameter(forest_adjacency(np.array([-1, 0, 1, -1])))
        2.0
    """
    d = tree_distances(adjacency)
    return float(d[np.isfinite(d)].max())
