"""The rooted forest in level order that every tree mask works on, and the checks they share
(choromanski22 Sec. 3.3, 6; docs/papers.md Sec. 2).

``Forest`` roots a forest once (O(N log N) set-up) and stores its nodes in level order, with its
permutations and per-level parent edges as fast.segments plans, so every tree recursion is
O(depth) tensor operations and no tree mask adds with atomics on CUDA. ``forest_diameter`` gives
the diameter that decides between Lemma 6.2 and Lemma 6.1 (Cor. 6.4). Details: docs/papers.md,
fast.masks.tree.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import torch

from fast.operator import SymmetricMaskOperator
from fast.segments import IndexAdd, segment_max
from fast.validation import check_allocation, check_positive_int, check_tokens


class Forest:
    """A rooted forest in level order (set up once per graph, reused by every product).

    Build with ``from_parent``, ``from_edge_index``, ``from_scipy`` or ``from_edges`` (each checks
    the input is a forest with finite non-negative edge lengths: ValueError naming the argument).
    Each tree is rooted at its smallest node. Attributes (NumPy; ``tensors(device)`` gives torch
    versions): n; order (n,) node ids in level order (roots first); position (n,) its inverse;
    parent_pos (n,) level-order position of each position's parent (-1 for roots); weight (n,) edge
    length to the parent in level order; level_starts (depth + 2,); height (edges) and
    weighted_height; tree_of (n,) the tree of each node id; num_trees. O(N log N) set-up.

    >>> from fast import Forest
    >>> forest = Forest.from_parent([-1, 0, 0, 1, -1])      # trees {0, 1, 2, 3} and {4}
    >>> forest.n, forest.num_trees, forest.height, forest.roots().tolist()
    (5, 2, 2, [0, 4])
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
        tree_pos = np.zeros(n, dtype=np.int64)
        self.num_trees = int(counts[0])
        tree_pos[:self.num_trees] = np.arange(self.num_trees)
        for lo, hi in zip(self.level_starts[1:-1], self.level_starts[2:]):
            root_dist[lo:hi] = root_dist[self.parent_pos[lo:hi]] + self.weight[lo:hi]
            tree_pos[lo:hi] = tree_pos[self.parent_pos[lo:hi]]
        self.weighted_height = float(root_dist.max()) if n else 0.0
        self.tree_of = np.empty(n, dtype=np.int64)
        self.tree_of[order] = tree_pos
        self._tensors: dict = {}
        self._plans: dict = {}

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
        n = check_positive_int("n", n)
        if e.size and (e.min() < 0 or e.max() >= n):
            raise ValueError(f"edge_index entries must lie in [0, n={n})")
        w = _weights(weights, e.shape[1], "weights (one per edge)")
        lo, hi = np.minimum(e[0], e[1]), np.maximum(e[0], e[1])
        _, first, which = np.unique(lo * n + hi, return_index=True, return_inverse=True)  # both directions: one edge
        which = which.reshape(-1)
        clash = np.flatnonzero(w != w[first][which])  # an edge listed again with another length
        if clash.size:
            i, j = int(clash[0]), int(first[which[clash[0]]])
            raise ValueError(f"weights: edge {int(lo[i])}-{int(hi[i])} is listed twice (edge_index columns {j} and {i}) "
                             f"with different lengths {float(w[j])!r} and {float(w[i])!r}; list it once, or both ways with one length")
        return cls.from_edges(lo[first], hi[first], w[first], n)

    @classmethod
    def from_scipy(cls, adjacency) -> "Forest":
        """A symmetric scipy.sparse adjacency whose entries are edge lengths."""
        a = sp.csr_matrix(adjacency, dtype=np.float64)
        if a.shape[0] != a.shape[1] or a.shape[0] == 0:
            raise ValueError(f"adjacency must be square and non-empty, got shape {a.shape}")
        if not np.isfinite(a.data).all():
            raise ValueError("adjacency entries (edge lengths) must be finite, got NaN or inf")
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
        check_allocation(f"n = {n}", (n + 1,), torch.int64, copies=6, what="the forest's per-node arrays")
        if (u == v).any():
            raise ValueError("a forest has no self-loops")
        if np.isnan(w).any():
            raise ValueError(f"edge weights (lengths) must be finite and non-negative, got NaN at {int(np.isnan(w).sum())} edges")
        if not np.isfinite(w).all() or (w < 0).any():
            bad = w[~np.isfinite(w) | (w < 0)]
            raise ValueError(f"edge weights (lengths) must be finite and non-negative, got {float(bad[0])!r}")
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

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(child, parent) node ids of every edge, each (n - trees,), in level order of the child."""
        has = np.flatnonzero(self.parent_pos >= 0)
        return self.order[has], self.order[self.parent_pos[has]]

    def roots(self) -> np.ndarray:
        """Node ids of the roots (one per tree, the tree's smallest node), in level order."""
        return self.order[self.parent_pos < 0]

    def node_depths(self) -> np.ndarray:
        """(n,) depth (edges to its root) of every node id."""
        depth = np.empty(self.n, dtype=np.int64)
        depth[self.order] = np.repeat(np.arange(self.height + 1), np.diff(self.level_starts))
        return depth

    def tensors(self, device) -> dict:
        """The level-order index arrays as int64 tensors on ``device`` (cached)."""
        key = str(device)
        if key not in self._tensors:
            self._tensors[key] = {
                "order": torch.as_tensor(self.order, device=device),
                "position": torch.as_tensor(self.position, device=device),
                "parent_pos": torch.as_tensor(self.parent_pos, device=device),
                "tree_of": torch.as_tensor(self.tree_of, device=device),
            }
        return self._tensors[key]

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-tree max of FAVOR+ key exponents z (..., n, m) by node id -> (..., n, 1). Every tree mask
        is 0 between trees, so one constant per tree cancels exactly in the attention ratio (like
        PackingMask's per-segment max) and a quiet tree can never underflow under a loud one. O(n m).
        """
        check_tokens("z", z, self.n)
        row = z.amax(-1)  # (..., n)
        tree_of = self.tensors(z.device)["tree_of"]
        top = segment_max(row, tree_of, self.num_trees, dim=-1)  # (..., trees)
        return top.gather(-1, tree_of.expand(row.shape)).unsqueeze(-1)

    def levels(self):
        """(depth, start, stop) of each level in level order, roots (depth 0) first."""
        s = self.level_starts
        return [(k, int(s[k]), int(s[k + 1])) for k in range(len(s) - 1)]

    def to_level_order(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., n, c) by node id -> (..., n, c) in level order (a gather; its backward through
        fast.segments: index_add_ itself on CPU, no atomic add on CUDA)."""
        return self._permutation("order").take(x, dim=-2)

    def from_level_order(self, y: torch.Tensor) -> torch.Tensor:
        """Inverse of ``to_level_order``."""
        return self._permutation("position").take(y, dim=-2)

    def _permutation(self, which: str) -> IndexAdd:
        """order or position as a fast.segments plan (planned once, any device)."""
        if which not in self._plans:
            self._plans[which] = IndexAdd(torch.as_tensor(getattr(self, which)))
        return self._plans[which]

    def level_plans(self) -> list:
        """Per depth k >= 1, the edges from level k up to level k - 1 as fast.segments plans (built
        once; index_add_ and index_select themselves on CPU, no atomic add on CUDA): ``(local,
        position)``, IndexAdds of each level-k node's parent by its index within level k - 1 (sums
        into, gathers from, a (..., n_(k-1), ...) tensor) and by its level-order position (into, from,
        a whole (..., n, c) tensor in place). Index 0 (the roots) is None."""
        if "levels" not in self._plans:
            plans = [None]
            for k, lo, hi in self.levels()[1:]:
                parent = torch.as_tensor(self.parent_pos[lo:hi])
                plans.append((IndexAdd(parent - int(self.level_starts[k - 1])), IndexAdd(parent)))
            self._plans["levels"] = plans
        return self._plans["levels"]


def _weights(weights, size: int, what: str) -> np.ndarray:
    if weights is None:
        return np.ones(size)
    raw = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights)
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise TypeError(f"{what} must be real numbers (an int or float array of shape ({size},)), "
                        f"got dtype {raw.dtype}: {weights!r:.60}")
    w = raw.astype(np.float64)
    if w.shape != (size,):
        raise ValueError(f"{what} must have shape ({size},), got {w.shape}")
    if np.isnan(w).any():
        raise ValueError(f"{what} must be finite and non-negative, got NaN at {int(np.isnan(w).sum())} of {size} entries "
                         f"(first at index {int(np.flatnonzero(np.isnan(w))[0])})")
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


def forest_diameter(forest: Forest) -> int:
    """The largest number of edges on a path within one tree of ``forest`` (max over its trees; edge
    lengths are ignored). Two breadth-first passes for all trees at once, O(n) (choromanski22
    Cor. 6.4). TypeError unless forest is a Forest.

    >>> from fast import Forest, forest_diameter
    >>> forest_diameter(Forest.from_parent([-1, 0, 0, 1, -1]))       # the path 3-1-0-2
    3
    """
    check_forest(forest)
    n = forest.n
    if forest.height == 0:
        return 0
    child, parent = forest.edges()
    pattern = sp.coo_matrix((np.ones(child.size), (child, parent)), shape=(n, n)).tocsr()
    _, labels = csgraph.connected_components(pattern, directed=False)
    depth = forest.node_depths()
    by_depth = np.argsort(-depth, kind="stable")
    ends = by_depth[np.unique(labels[by_depth], return_index=True)[1]]  # deepest node per tree
    rows = np.concatenate([child, parent, np.full(ends.size, n)])
    cols = np.concatenate([parent, child, ends])
    g = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n + 1, n + 1)).tocsr()
    dist = csgraph.shortest_path(g, method="D", directed=True, unweighted=True, indices=n)
    return int(dist[np.isfinite(dist)].max()) - 1


# =========================================================================================
# Checks shared by the tree masks (the token input goes through fast.validation.check_tokens).
# =========================================================================================

#: Bound on the transient buffers of one product step (bytes); more columns / rows are chunked.
#: Small enough that the buffers come from the allocator's heap rather than fresh pages (fresh
#: large mappings cost a page fault per 4 KiB; 256 MiB made the n = 2^16 path product 2x slower).
DEFAULT_MAX_CHUNK_BYTES = 32 * 2**20

#: f(0), ..., f(n - 1): a floating tensor (may require grad), or anything np.asarray takes.
FTable = Union[torch.Tensor, np.ndarray, Sequence[float]]


def check_forest(forest: object) -> Forest:
    """``forest`` itself when it is a Forest, else TypeError naming forest (a parent array or
    adjacency is not one: build it with Forest.from_*). O(1).

    >>> from fast.masks.tree.forest import check_forest
    >>> check_forest([-1, 0])
    Traceback (most recent call last):
    ...
    TypeError: forest must be a fast.masks.tree.Forest, got list
    """
    if not isinstance(forest, Forest):
        raise TypeError(f"forest must be a fast.masks.tree.Forest, got {type(forest).__name__}")
    return forest


def check_unweighted(forest: object, who: str) -> Forest:
    """``forest`` itself when it is a Forest whose edges all have length 1 (Lemmas 6.1 / 6.2 count
    hops), else ValueError naming ``who`` and the edge lengths (TypeError for a non-Forest). O(n).

    >>> from fast import Forest
    >>> from fast.masks.tree.forest import check_unweighted
    >>> check_unweighted(Forest.from_parent([-1, 0], weights=[0.0, 2.0]), "TreeDCMask")
    Traceback (most recent call last):
    ...
    ValueError: TreeDCMask needs an unweighted forest (every edge length 1); ...
    """
    check_forest(forest)
    edges = forest.parent_pos >= 0
    if not np.all(forest.weight[edges] == 1.0):
        raise ValueError(f"{who} needs an unweighted forest (every edge length 1); this forest has edge lengths "
                         f"in [{forest.weight[edges].min():.3g}, {forest.weight[edges].max():.3g}]. Use TreeExpMask "
                         "for exp-affine f on weighted forests, or rebuild the Forest without weights.")
    return forest


def check_f(f: FTable, n: int) -> torch.Tensor:
    """f (n,) = f(0), ..., f(n - 1) as a floating tensor (a floating tensor is kept as given, so it may
    require grad; anything else becomes float64). TypeError for complex or non-numeric f, ValueError
    naming f for another shape or NaN / inf. O(n).

    >>> from fast.masks.tree.forest import check_f
    >>> check_f([1, 0.5, 0.25], 3).dtype
    torch.float64
    """
    if isinstance(f, torch.Tensor):
        if f.is_complex():
            raise TypeError(f"f must be a real tensor, got {f.dtype}")
        t = f if f.is_floating_point() else f.to(torch.float64)
    else:
        try:
            t = torch.as_tensor(np.asarray(f, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(f"f must be a tensor (or array) of shape ({n},): f(0), ..., f(n - 1)") from err
    if tuple(t.shape) != (n,):
        raise ValueError(f"f must have shape ({n},): f(0), ..., f(n - 1) for the n = {n} nodes, got {tuple(t.shape)}")
    if not bool(torch.isfinite(t.detach()).all()):
        raise ValueError("f contains non-finite values (NaN or inf)")
    return t


class DistanceFunctionMask(SymmetricMaskOperator):
    """The shared members of the masks M_ij = f(dist(i, j)) on an unweighted forest (0 across trees),
    TreeDiamMask and TreeDCMask, which set ``forest`` and the table ``f`` (n,): ``nonnegative``
    (read from f at each call) and the per-tree ``key_stabilizer``. M is symmetric, so rmatmul =
    matmul.

    >>> import torch
    >>> from fast import Forest, TreeDiamMask
    >>> from fast.masks.tree.forest import DistanceFunctionMask
    >>> op = TreeDiamMask(Forest.from_parent([-1, 0, 1]), torch.tensor([1.0, -0.5, 0.25]))
    >>> isinstance(op, DistanceFunctionMask), op.nonnegative
    (True, False)
    """

    forest: Forest
    f: torch.Tensor

    @property
    def nonnegative(self) -> bool:
        """True when f >= 0 (then every entry f(dist) is; entries between trees are 0). Read from
        f at each call, so an in-place change of a learnable f is followed."""
        return bool((self.f.detach() >= 0).all())

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-tree max of the FAVOR+ key exponents z (..., n, m) -> (..., n, 1) (Forest.key_stabilizer)."""
        return self.forest.key_stabilizer(z)
