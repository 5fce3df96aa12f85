"""Canonical undirected adjacency matrices for reference/ (NumPy + SciPy; the twin of fast/graphs.py).

``adjacency(graph)`` reads any graph input of docs/papers.md Sec. 3 ("How maskbench computes
them") as W, a canonical (n, n) float64 ``scipy.sparse.csr_matrix``, W = W^T >= 0; ``degree``,
``weighted_degree`` and ``normalized_adjacency`` (reid25's W = D^-1/2 A D^-1/2) derive from it.
Everything is O(n + E) sparse work.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["adjacency", "degree", "weighted_degree", "normalized_adjacency", "SYMMETRY_RTOL"]

#: Relative tolerance under which W[i, j] and W[j, i] count as equal.
SYMMETRY_RTOL = 1e-12


def _is_networkx(graph: object) -> bool:
    return type(graph).__module__.split(".")[0] == "networkx"


def adjacency(graph: Any, *, symmetrize: bool = False, name: str = "graph") -> sp.csr_matrix:
    """W (n, n) float64 csr_matrix, canonical (duplicates summed, indices sorted, explicit zeros
    eliminated) and validated, from scipy.sparse, a dense ndarray (n, n) or a networkx graph.

    The rules are those of fast's Graph.from_any, implemented independently:

    - inputs: any scipy.sparse matrix or array (n, n), a dense ndarray (n, n), a networkx graph
      (``networkx.to_scipy_sparse_array`` in ``G.nodes`` order, attribute "weight", default 1;
      networkx is imported only when one comes).
    - entries finite and >= 0; n >= 1. Self-loops, isolated nodes and several components are fine.
    - W must equal W^T: entries that agree to a relative SYMMETRY_RTOL = 1e-12 count as equal and
      the larger is kept (exact symmetry after round-off); otherwise ValueError naming one
      offending pair, unless ``symmetrize=True``, which uses max(W, W^T) entrywise.

    ``name`` is the argument's name in errors. Raises TypeError for another input type, complex or
    object entries or a non-bool symmetrize; ValueError for a non-square or empty matrix, a
    negative or non-finite weight, or an asymmetric W. O(n + E) (a dense input: O(n^2)).

        >>> import numpy as np
        >>> from reference.graphs import adjacency
        >>> w = adjacency(np.array([[0.0, 2.0], [2.0, 0.0]]))
        >>> w.shape, w.nnz, w.toarray().tolist()
        ((2, 2), 2, [[0.0, 2.0], [2.0, 0.0]])
        >>> adjacency(np.array([[0.0, 1.0], [0.0, 0.0]]), symmetrize=True).nnz
        2
    """
    if not isinstance(symmetrize, bool):
        raise TypeError(f"symmetrize must be a bool, got {type(symmetrize).__name__}")
    if sp.issparse(graph):
        a = graph
    elif isinstance(graph, np.ndarray):
        if graph.ndim != 2:
            raise ValueError(f"{name} as a dense adjacency must have shape (n, n), got {graph.shape}")
        a = graph
    elif _is_networkx(graph):
        import networkx as nx

        if graph.number_of_nodes() == 0:
            raise ValueError(f"{name} must have n >= 1 nodes, got an empty networkx graph")
        a = nx.to_scipy_sparse_array(graph, nodelist=list(graph.nodes), weight="weight", dtype=np.float64,
                                     format="coo")
    else:
        raise TypeError(f"{name} must be a scipy.sparse matrix, a dense ndarray (n, n) or a networkx graph, "
                        f"got {type(graph).__name__}")
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be square (n, n), got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError(f"{name} must have n >= 1 nodes, got shape {a.shape}")
    dtype = a.dtype
    if dtype == object or np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"{name} must have real entries, got dtype {dtype}")
    w = sp.csr_matrix(a, dtype=np.float64, copy=True)
    w.sum_duplicates()  # also sorts indices
    if not np.isfinite(w.data).all():
        k = int(np.flatnonzero(~np.isfinite(w.data))[0])
        i = int(np.searchsorted(w.indptr, k, side="right") - 1)
        raise ValueError(f"{name}: edge weights must be finite, got {float(w.data[k])!r} at entry ({i}, {int(w.indices[k])})")
    if (w.data < 0).any():
        k = int(np.flatnonzero(w.data < 0)[0])
        i = int(np.searchsorted(w.indptr, k, side="right") - 1)
        raise ValueError(f"{name}: edge weights must be >= 0 (the graph kernels need W >= 0), got "
                         f"{float(w.data[k])!r} at entry ({i}, {int(w.indices[k])})")
    w.eliminate_zeros()
    t = sp.csr_matrix(w.T)
    if symmetrize:
        out = w.maximum(t)
    else:
        diff = abs(w - t)
        bound = w.maximum(t) * SYMMETRY_RTOL
        bad = (diff - bound).tocoo()
        over = bad.data > 0
        if over.any():
            k = int(np.flatnonzero(over)[0])
            i, j = int(bad.row[k]), int(bad.col[k])
            raise ValueError(f"{name} is not symmetric (W[{i}, {j}] = {float(w[i, j])!r} but W[{j}, {i}] = {float(w[j, i])!r}); "
                             "pass symmetrize=True to use max(W, W^T)")
        out = w.maximum(t)  # exactly symmetric after round-off-sized differences
    out = sp.csr_matrix(out, dtype=np.float64)
    out.sum_duplicates()
    out.eliminate_zeros()
    out.sort_indices()
    return out


def degree(adj: sp.spmatrix) -> np.ndarray:
    """Stored neighbours of each node (n,) int64 of a canonical (n, n) adjacency (a self-loop counts
    1; weights do not matter). O(n).

        >>> import numpy as np
        >>> from reference.graphs import adjacency, degree
        >>> degree(adjacency(np.array([[1.0, 3.0], [3.0, 0.0]]))).tolist()
        [2, 1]
    """
    a = sp.csr_matrix(adj)
    return np.diff(a.indptr).astype(np.int64)


def weighted_degree(adj: sp.spmatrix) -> np.ndarray:
    """Row sums d_i = sum_j W_ij (n,) float64 of an (n, n) adjacency. O(n + E).

        >>> import numpy as np
        >>> from reference.graphs import adjacency, weighted_degree
        >>> weighted_degree(adjacency(np.array([[1.0, 3.0], [3.0, 0.0]]))).tolist()
        [4.0, 3.0]
    """
    return np.asarray(sp.csr_matrix(adj, dtype=np.float64).sum(axis=1)).ravel()


def normalized_adjacency(adj: sp.spmatrix) -> sp.csr_matrix:
    """D^-1/2 W D^-1/2 entrywise: w_ij / sqrt(d_i d_j), d the weighted degrees (same sparsity).

    Computed as w_ij / (sqrt(d_i) sqrt(d_j)) so that d_i d_j cannot overflow (weights > ~1e154) or
    underflow (< ~1e-162); the result is still exactly symmetric (the same two factors). This is
    reid25's common choice of W; its spectral radius is at most 1. adj (n, n) -> (n, n) csr_matrix.
    O(n + E).

        >>> import numpy as np
        >>> from reference.graphs import adjacency, normalized_adjacency
        >>> path = adjacency(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
        >>> np.round(normalized_adjacency(path).toarray()[1], 4).tolist()
        [0.7071, 0.0, 0.7071]
    """
    a = sp.csr_matrix(adj, dtype=np.float64, copy=True)
    d = weighted_degree(a)
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    r = np.sqrt(d)
    a.data = a.data / (r[rows] * r[a.indices])
    return a
