"""Tree-distance masks M_ij = f(dist_T(i, j)) as operators (choromanski22 Sec. 3.3, 6; NOTES.md Sec. 2).

``Forest`` roots a forest once (setup, O(N) in SciPy's C breadth-first search plus O(N log N)
vectorised pointer doubling for depths) and stores its nodes in level order, so every recursion
below is O(depth) tensor operations on contiguous slices, with no per-node Python loop. Entries
between different trees are 0.

TreeExpMask (Lemma 3.5, weighted forests, f(z) = exp(a z + b)), O(N c) per product:
    phase I (bottom-up)  s_i = e^b x_i + sum_{c child of i} e^{a w(i,c)} s_c
    phase II (top-down)  w_root = s_root,  w_i = e^{a w(i,p)} w_p + (1 - e^{2 a w(i,p)}) s_i
so that w_i = sum_j exp(a dist(i, j) + b) x_j. (The printed Eqs. 11, 15, 16 drop the factor a
in the exponents; that recursion is wrong, see verify's choromanski22/lemma-3.5.)
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import torch

from fast.validation import check_tokens, compute_dtype


class Forest:
    """A rooted forest in level order (setup once per graph, reused by every product).

    Build with ``from_parent``, ``from_edge_index`` or ``from_scipy``. Attributes (numpy, setup
    side; ``tensors(device)`` gives the torch versions):
        n            number of nodes
        order (n,)   node ids in level order (roots first, then depth 1, ...)
        position (n,) inverse of order: node id -> level-order position
        parent_pos (n,) level-order position of each position's parent (-1 for roots)
        weight (n,)  edge length to the parent in level order (0 for roots)
        level_starts (depth + 2,) positions where each depth level starts (and the end)
        height       max depth (edges); weighted_height: max root distance
    """

    def __init__(self, parent: np.ndarray, weight: np.ndarray):
        n = parent.size
        depth = _depths(parent)
        order = np.argsort(depth, kind="stable")
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        p = parent[order]
        self.n = n
        self.order = order
        self.position = position
        self.parent_pos = np.where(p >= 0, position[np.maximum(p, 0)], -1)
        self.weight = np.where(p >= 0, weight[order], 0.0)
        counts = np.bincount(depth, minlength=int(depth.max()) + 1)
        self.level_starts = np.concatenate([[0], np.cumsum(counts)])
        self.height = int(depth.max())
        root_dist = np.zeros(n)
        for lo, hi in zip(self.level_starts[1:-1], self.level_starts[2:]):
            root_dist[lo:hi] = root_dist[self.parent_pos[lo:hi]] + self.weight[lo:hi]
        self.weighted_height = float(root_dist.max()) if n else 0.0
        self._tensors: dict = {}

    # ----------------------------------------------------------------------- constructors

    @classmethod
    def from_parent(cls, parent, weights=None) -> "Forest":
        """parent (n,) ints, -1 for roots; weights (n,) edge length to the parent (default 1)."""
        p = np.asarray(parent.cpu() if isinstance(parent, torch.Tensor) else parent)
        if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer):
            raise ValueError(f"parent must be a non-empty 1-D integer array (-1 for roots), got {p.dtype} {p.shape}")
        n = p.size
        if ((p < -1) | (p >= n)).any() or (p == np.arange(n)).any():
            raise ValueError("parent entries must be -1 (root) or another node's index in [0, n)")
        w = _weights(weights, n, "weights (edge length to the parent)")
        child = np.flatnonzero(p >= 0)
        return cls.from_edges(child, p[child], w[child], n)

    @classmethod
    def from_edge_index(cls, edge_index, n: int | None = None, weights=None) -> "Forest":
        """edge_index (2, E) ints (each undirected edge once or both ways), weights (E,), n nodes."""
        e = np.asarray(edge_index.cpu() if isinstance(edge_index, torch.Tensor) else edge_index)
        if e.ndim != 2 or e.shape[0] != 2 or not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"edge_index must be a (2, E) integer array, got {e.dtype} {e.shape}")
        if n is None:
            if not e.size:
                raise ValueError("n must be given for an edge_index without edges")
            n = int(e.max()) + 1
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if e.size and (e.min() < 0 or e.max() >= n):
            raise ValueError(f"edge_index entries must lie in [0, n={n})")
        w = _weights(weights, e.shape[1], "weights (one per edge)")
        lo, hi = np.minimum(e[0], e[1]), np.maximum(e[0], e[1])
        _, first = np.unique(lo * n + hi, return_index=True)  # both directions: one edge
        return cls.from_edges(lo[first], hi[first], w[first], int(n))

    @classmethod
    def from_scipy(cls, adjacency) -> "Forest":
        """A symmetric scipy.sparse adjacency whose entries are edge lengths."""
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        if a.shape[0] != a.shape[1] or a.shape[0] == 0:
            raise ValueError(f"adjacency must be square and non-empty, got shape {a.shape}")
        if (a != a.T).nnz:
            raise ValueError("adjacency must be symmetric (an undirected forest)")
        upper = sp.triu(a, k=1).tocoo()
        if a.diagonal().any():
            raise ValueError("a forest has no self-loops; adjacency has a non-zero diagonal")
        return cls.from_edges(upper.row, upper.col, upper.data, a.shape[0])

    @classmethod
    def from_edges(cls, u: np.ndarray, v: np.ndarray, w: np.ndarray, n: int) -> "Forest":
        """Undirected edges (u_k, v_k) of length w_k, each once: checks it is a forest, roots it."""
        u, v, w = (np.asarray(a) for a in (u, v, w))
        if (u == v).any():
            raise ValueError("a forest has no self-loops")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("edge weights (lengths) must be finite and non-negative")
        pattern = sp.coo_matrix((np.ones(2 * u.size), (np.concatenate([u, v]), np.concatenate([v, u]))),
                                shape=(n, n)).tocsr()
        components, labels = csgraph.connected_components(pattern, directed=False)
        if u.size != n - components:
            raise ValueError(f"not a forest: {u.size} edges on {n} nodes in {components} components (a cycle)")
        # root each tree at its smallest node; breadth-first predecessors give the parents
        parent = np.full(n, -1, dtype=np.int64)
        roots = np.unique(labels, return_index=True)[1]
        if u.size:
            # one BFS over a virtual super-root joined to every tree's root: O(n) in C
            rows = np.concatenate([u, v, np.full(roots.size, n)])
            cols = np.concatenate([v, u, roots])
            g = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n + 1, n + 1)).tocsr()
            _, pred = csgraph.breadth_first_order(g, n, directed=True, return_predecessors=True)
            parent = np.where(pred[:n] == n, -1, pred[:n]).astype(np.int64)
        weight_of = sp.coo_matrix((np.concatenate([w, w]), (np.concatenate([u, v]), np.concatenate([v, u]))),
                                  shape=(n, n)).tocsr()
        child = np.flatnonzero(parent >= 0)
        weight = np.zeros(n)
        weight[child] = np.asarray(weight_of[child, parent[child]]).ravel()
        return cls(parent, weight)

    # ----------------------------------------------------------------------- helpers

    def tensors(self, device) -> dict:
        """The level-order index arrays as int64 tensors on ``device`` (cached)."""
        key = str(device)
        if key not in self._tensors:
            self._tensors[key] = {
                "order": torch.as_tensor(self.order, device=device),
                "position": torch.as_tensor(self.position, device=device),
                "parent_pos": torch.as_tensor(self.parent_pos, device=device),
            }
        return self._tensors[key]

    def levels(self):
        """(depth, start, stop) of each level in level order, roots (depth 0) first."""
        s = self.level_starts
        return [(k, int(s[k]), int(s[k + 1])) for k in range(len(s) - 1)]

    def to_level_order(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., n, c) by node id -> (..., n, c) in level order."""
        return x.index_select(-2, self.tensors(x.device)["order"])

    def from_level_order(self, y: torch.Tensor) -> torch.Tensor:
        """Inverse of ``to_level_order``."""
        return y.index_select(-2, self.tensors(y.device)["position"])


def _weights(weights, size: int, what: str) -> np.ndarray:
    if weights is None:
        return np.ones(size)
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.shape != (size,):
        raise ValueError(f"{what} must have shape ({size},), got {w.shape}")
    return w


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node by pointer doubling: O(n log height), vectorised."""
    n = parent.size
    idx = np.arange(n)
    jump = np.where(parent >= 0, parent, idx)  # roots point at themselves
    depth = (parent >= 0).astype(np.int64)  # distance to ``jump``
    for _ in range(max(1, n.bit_length()) + 1):
        nxt = jump[jump]
        if np.array_equal(nxt, jump):
            return depth
        depth = depth + depth[jump]
        jump = nxt
    raise ValueError("parent array has a cycle")


class TreeExpMask:
    """M_ij = exp(a dist(i, j) + b) within each tree of ``forest``, 0 across trees (Lemma 3.5).

    a, b: real numbers. a < 0 (decay with distance) is the stable case. For a > 0 the recursion
    multiplies by e^{a w} going down and subtracts (1 - e^{2 a w}) s_i: relative round-off grows
    like exp(2 a H) (H the weighted height), and e^{a H} overflows for large a H. The operator
    refuses a > 0 when u exp(2 a H) > ``max_amplified_roundoff`` (default 1e-6, u the unit
    round-off of float64; float32 inputs are computed in float64 then) rather than return noise.
    """

    def __init__(self, forest: Forest, a: float, b: float = 0.0, *, max_amplified_roundoff: float = 1e-6):
        if not isinstance(forest, Forest):
            raise TypeError(f"forest must be a fast.masks.tree.Forest, got {type(forest).__name__}")
        for name, val in (("a", a), ("b", b)):
            if isinstance(val, bool) or not isinstance(val, numbers.Real) or not math.isfinite(val):
                raise ValueError(f"{name} must be a finite real number, got {val!r}")
        self.forest, self.a, self.b = forest, float(a), float(b)
        self.n = forest.n
        amplification = 2 * self.a * forest.weighted_height
        if self.a > 0 and amplification + math.log(np.finfo(np.float64).eps / 2) > math.log(max_amplified_roundoff):
            raise ValueError(
                f"a = {a} > 0 on a tree of weighted height {forest.weighted_height:.3g}: the top-down phase amplifies "
                f"round-off by exp(2 a H) = e^{amplification:.1f}, beyond max_amplified_roundoff={max_amplified_roundoff} "
                "(float64). Use a <= 0, a shallower rooting, or the dense reference.")
        self._factors: dict = {}
        # a > 0 needs float64 even for float32 inputs (see the class docstring)
        self._min_dtype = torch.float64 if self.a > 0 else None

    def _edge_factors(self, device, dtype):
        key = (str(device), dtype)
        if key not in self._factors:
            w = torch.as_tensor(self.forest.weight, device=device, dtype=dtype)
            down = torch.exp(self.a * w)  # e^{a w(i, p)}
            self._factors[key] = (down.unsqueeze(-1), (-torch.expm1(2 * self.a * w)).unsqueeze(-1))
        return self._factors[key]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): two passes over the levels, O(n c) work."""
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        work = compute_dtype(x.dtype) if self._min_dtype is None else self._min_dtype
        f = self.forest
        parent_pos = f.tensors(x.device)["parent_pos"]
        down, keep = self._edge_factors(x.device, work)
        s = f.to_level_order(x.to(work)) * math.exp(self.b)  # phase I starts from e^b x_i
        levels = f.levels()
        for _, lo, hi in reversed(levels[1:]):  # deepest level first: children into parents
            s.index_add_(-2, parent_pos[lo:hi], s[..., lo:hi, :] * down[lo:hi])
        w = torch.empty_like(s)
        _, lo0, hi0 = levels[0]
        w[..., lo0:hi0, :] = s[..., lo0:hi0, :]  # roots: their subtree is their tree
        for _, lo, hi in levels[1:]:
            w[..., lo:hi, :] = down[lo:hi] * w.index_select(-2, parent_pos[lo:hi]) + keep[lo:hi] * s[..., lo:hi, :]
        return f.from_level_order(w).to(out_dtype)
