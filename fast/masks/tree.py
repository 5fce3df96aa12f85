"""Tree-distance masks M_ij = f(dist_T(i, j)) as operators (choromanski22 Sec. 3.3, 6; docs/papers.md Sec. 2).

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
from typing import Sequence, Union

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import torch

from fast.fft import fast_fft_size
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


# =========================================================================================
# Any f on unweighted forests: Lemma 6.2 (O(n diam c)) and Lemma 6.1 (O(n log^2 n c)).
# =========================================================================================

#: Bound on the transient buffers of one product step (bytes); more columns / rows are chunked.
#: Small enough that the buffers come from the allocator's heap rather than fresh pages (fresh
#: large mappings cost a page fault per 4 KiB; 256 MiB made the n = 2^16 path product 2x slower).
DEFAULT_MAX_CHUNK_BYTES = 32 * 2**20


def _check_unweighted(forest: Forest, who: str) -> None:
    if not isinstance(forest, Forest):
        raise TypeError(f"forest must be a fast.masks.tree.Forest, got {type(forest).__name__}")
    edges = forest.parent_pos >= 0
    if not np.all(forest.weight[edges] == 1.0):
        raise ValueError(f"{who} needs an unweighted forest (every edge length 1); this forest has edge lengths "
                         f"in [{forest.weight[edges].min():.3g}, {forest.weight[edges].max():.3g}]. Use TreeExpMask "
                         "for exp-affine f on weighted forests, or rebuild the Forest without weights.")


#: f(0), ..., f(n - 1): a floating tensor (may require grad), or anything np.asarray takes.
FTable = Union[torch.Tensor, np.ndarray, Sequence[float]]


def _check_f(f: FTable, n: int) -> torch.Tensor:
    """f (n,) = f(0), ..., f(n - 1) as a floating tensor (kept as given, so it may require grad)."""
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


def _check_chunk_bytes(max_chunk_bytes: int) -> int:
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, numbers.Integral) or max_chunk_bytes <= 0:
        raise ValueError(f"max_chunk_bytes must be a positive integer, got {max_chunk_bytes!r}")
    return int(max_chunk_bytes)


def _edges(forest: Forest) -> tuple[np.ndarray, np.ndarray]:
    """(child, parent) node ids of every edge."""
    has = np.flatnonzero(forest.parent_pos >= 0)
    return forest.order[has], forest.order[forest.parent_pos[has]]


def _node_depths(forest: Forest) -> np.ndarray:
    """Depth (edges to its root) of every node id."""
    depth = np.empty(forest.n, dtype=np.int64)
    depth[forest.order] = np.repeat(np.arange(forest.height + 1), np.diff(forest.level_starts))
    return depth


def forest_diameter(forest: Forest) -> int:
    """The largest number of edges on a path within one tree of ``forest`` (max over its trees).

    Two breadth-first passes (choromanski22 Cor. 6.4), all trees at once, O(n) in SciPy's C
    csgraph: the deepest node of each tree (depths come with the level order: the first pass from
    the root) is an end of a longest path of that tree; one multi-source BFS from all those ends
    gives each tree's eccentricity of that end = its diameter. Edge lengths are ignored (hops).
    """
    if not isinstance(forest, Forest):
        raise TypeError(f"forest must be a fast.masks.tree.Forest, got {type(forest).__name__}")
    n = forest.n
    if forest.height == 0:
        return 0
    child, parent = _edges(forest)
    pattern = sp.coo_matrix((np.ones(child.size), (child, parent)), shape=(n, n)).tocsr()
    _, labels = csgraph.connected_components(pattern, directed=False)
    depth = _node_depths(forest)
    by_depth = np.argsort(-depth, kind="stable")
    ends = by_depth[np.unique(labels[by_depth], return_index=True)[1]]  # deepest node per tree
    rows = np.concatenate([child, parent, np.full(ends.size, n)])
    cols = np.concatenate([parent, child, ends])
    g = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n + 1, n + 1)).tocsr()
    dist = csgraph.shortest_path(g, method="D", directed=True, unweighted=True, indices=n)
    return int(dist[np.isfinite(dist)].max()) - 1


class TreeDiamMask:
    """M_ij = f(dist(i, j)) on an unweighted forest, 0 across trees; O(n diam c) (Lemma 6.2).

    forest: an unweighted ``Forest`` (all edge lengths 1, else ValueError); f: (n,) tensor (or
    array) f(0), ..., f(n - 1), finite, any sign; it may require grad. ``matmul`` takes x (..., n, c).

    With the forest rooted (level order) and T_i the subtree of i:
        g_i[l] = sum_{j in T_i, dist(i, j) = l} x_j:  g_i[0] = x_i,  g_i[l] = sum_{c child of i} g_c[l - 1]
        h_i[l] = sum_{j, dist(i, j) = l} x_j:         h_root = g_root,  h_i = g_i + shift(h_p(i) - shift(g_i))
        (M x)_i = sum_l f(l) h_i[l]                   (Eqs. 27-29; shift(z)[0] = 0, shift(z)[l] = z[l - 1])
    h_p(i)[l - 1] counts the nodes at distance l from i through its parent, except those of T_i at
    depth l - 2 below i, which the second shift removes. Both passes go level by level: one
    index_add (children into parents) or index_select (parents to children) per depth.

    Storage (H the height): g of a depth-k node has length H - k + 1 (its subtree is no deeper);
    h is stored by s = l - k + H in an array of length 2H + 1 (no node is farther
    than H + k from a depth-k node). In s the shift by the parent vanishes, h_i[s] = h_p(i)[s] +
    g_i[s] - g_i[s - 2] (g placed at its own s), so each level is one index_select of the parents'
    h plus two in-place slice updates of g's (short) length, and (M x)_i = sum_l f(l) h_i[H - k + l].
    Work O(n H c) = O(n diam c) (diam >= H). Memory: all g (sum_k n_k (H - k + 1) c <= n (H + 1) c)
    plus h of two adjacent levels (n_k (2H + 1) c each) without autograd; with autograd (x or f
    requiring grad) every level's h is kept: n (2H + 1) c. Columns are processed in chunks whose
    no-grad buffers stay under ``max_chunk_bytes`` (default 32 MiB; at least one column).
    Half precision inputs compute in float32.
    """

    def __init__(self, forest: Forest, f: FTable, *, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES):
        _check_unweighted(forest, "TreeDiamMask")
        self.forest = forest
        self.n = forest.n
        self.f = _check_f(f, self.n)
        self.max_chunk_bytes = _check_chunk_bytes(max_chunk_bytes)
        self.height = forest.height
        self.diameter = forest_diameter(forest)
        counts = np.diff(forest.level_starts)
        H = self.height
        level_h = counts * (2 * H + 1)
        pairs = max([int(a + b) for a, b in zip(level_h, level_h[1:])] + [int(level_h[0])])
        #: numbers per column held at the peak of a no-grad product (all g, two levels of h, out)
        self.elems_per_column = int(np.dot(counts, H + 1 - np.arange(H + 1))) + pairs + 2 * self.n
        self._local_parents: dict = {}

    def _parents(self, device: torch.device | str) -> list:
        """Per depth k >= 1: each node's parent as an index into level k - 1 (cached per device)."""
        key = str(device)
        if key not in self._local_parents:
            f = self.forest
            self._local_parents[key] = [None] + [
                torch.as_tensor(f.parent_pos[lo:hi] - f.level_starts[k - 1], device=device)
                for k, lo, hi in f.levels()[1:]]
        return self._local_parents[key]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): two passes over the depths, O(n diam c) work."""
        check_tokens("x", x, self.n)
        out_dtype, work = x.dtype, compute_dtype(x.dtype)
        lead, c = x.shape[:-2], x.shape[-1]
        xs = self.forest.to_level_order(x.to(work).reshape(-1, self.n, c))  # (B, n, c) in level order
        f = self.f.to(device=x.device, dtype=work)
        f = torch.nn.functional.pad(f, (0, max(0, 2 * self.height + 1 - self.n)))  # f(l) = 0 past n - 1
        per_col = xs.shape[0] * self.elems_per_column * xs.element_size()
        step = max(1, self.max_chunk_bytes // per_col)
        out = torch.cat([self._levels(xs[..., j:j + step], f) for j in range(0, c, step)], dim=-1)
        return self.forest.from_level_order(out).reshape(*lead, self.n, c).to(out_dtype)

    def _levels(self, xs: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """The two passes on xs (B, n, c) in level order; returns (B, n, c) in level order."""
        parents = self._parents(xs.device)
        levels = self.forest.levels()
        H = self.height
        B, _, c = xs.shape
        g: list = [None] * (H + 1)
        for k, lo, hi in reversed(levels):  # bottom-up: g_i[0] = x_i, g_i[1:] = sum of the children's g
            xk = xs[:, lo:hi].unsqueeze(-2)  # (B, n_k, 1, c)
            if k == H:
                g[k] = xk
            else:
                below = xs.new_zeros(B, hi - lo, H - k, c).index_add_(1, parents[k + 1], g[k + 1])
                g[k] = torch.cat([xk, below], dim=-2)
        h = xs.new_zeros(B, levels[0][2], 2 * H + 1, c)
        h[:, :, H:] = g[0]  # roots: h = g, at s = l + H
        outs = [torch.matmul(f[None, :H + 1], h[:, :, H:]).squeeze(-2)]
        for k, lo, hi in levels[1:]:
            h = h.index_select(1, parents[k])  # h_p(i)[s]: the parent's term, already shifted
            h[:, :, H - k:2 * H - 2 * k + 1] += g[k]  # + g_i[l]
            stop = min(2 * H - 2 * k + 3, 2 * H + 1)
            h[:, :, H - k + 2:stop] -= g[k][:, :, :stop - (H - k + 2)]  # - g_i[l - 2]
            outs.append(torch.matmul(f[None, :H + k + 1], h[:, :, H - k:]).squeeze(-2))
        return torch.cat(outs, dim=1)


def _preorder(n: int, child: np.ndarray, parent: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Node ids in depth-first preorder (each tree after the previous one), O(n).

    An explicit stack over children grouped by parent (one argsort). scipy's
    csgraph.depth_first_order is O(degree^2) on high-degree nodes (a star at 2^17: ~10 s).
    """
    by_parent = np.argsort(parent, kind="stable")
    kids = child[by_parent].tolist()
    starts = np.searchsorted(parent[by_parent], np.arange(n + 1)).tolist()
    out: list = []
    stack = roots[::-1].tolist()
    while stack:
        u = stack.pop()
        out.append(u)
        stack.extend(reversed(kids[starts[u]:starts[u + 1]]))
    return np.asarray(out, dtype=np.int64)


def _subtree_ends(depth: np.ndarray) -> np.ndarray:
    """For a preorder depth sequence: end[p] = first q > p with depth[q] <= depth[p] (or n).

    The subtree of the node at p is positions [p, end[p]). Range minima in a sparse table and
    binary lifting: O(n log n), vectorised.
    """
    n = depth.size
    d = np.concatenate([depth, [-1]])  # sentinel: every subtree ends by n
    tables = [d]
    span = 1
    while span < n + 1:
        prev = tables[-1]
        tables.append(np.minimum(prev, prev[np.minimum(np.arange(n + 1) + span, n)]))
        span *= 2
    q = np.arange(1, n + 1)
    for j in range(len(tables) - 1, -1, -1):
        ok = tables[j][np.minimum(q, n)] > depth  # all of [q, q + 2^j) is deeper: skip it
        q = np.where(ok & (q < n), np.minimum(q + (1 << j), n), q)
    return q


#: A cross-term row multiplies by its dense p_out x p_in Hankel block (a GEMM) while
#: p_out p_in <= HANKEL_DENSE_RATIO N (N the FFT size it would need), else correlates by FFT. The
#: FFTs (plus the transposes torch makes for an FFT along the token axis) cost ~9 ns per bin and
#: column against ~0.07 ns per multiply-add in a GEMM (measured, one thread); this bounds the
#: dense rows to p <= ~256, so the asymptotic cost is unchanged.
HANKEL_DENSE_RATIO = 64


def _fft_size(m: int) -> int:
    """The smallest 5-smooth integer >= m (a size pocketfft / cuFFT transform fast)."""
    return fast_fft_size(m)


class TreeDCMask:
    """M_ij = f(dist(i, j)) on an unweighted forest, 0 across trees; O(n log^2 n c) (Lemma 6.1).

    forest: an unweighted ``Forest``; f: (n,) tensor (or array) f(0), ..., f(n - 1), finite, any
    sign, may require grad. ``matmul`` takes x (..., n, c). dense_threshold: subproblems with at
    most max(dense_threshold, 2) nodes are dense blocks. max_chunk_bytes bounds the transient
    buffers of one step of the product (default 32 MiB; at least one row or block per step).

    Balanced separator recursion (planned once, in __init__). For a tree T with more than
    dense_threshold nodes take a centroid v (every component of T - v has <= |T|/2 nodes), split
    those components by size into two groups and set T_1 = {v} + group 1, T_2 = {v} + group 2
    (each <= 2(|T| - 1)/3 + 1 nodes; V(T_1) u V(T_2) = V(T), V(T_1) n V(T_2) = {v}). This is the
    paper's two-vertex separator argument with one vertex and 2/3 in place of 9/10. With
    s^k_i = sum_{j in T_k} f(dist(i, j)) x_j (Eq. 26) computed recursively,

        (M x)_i = s^1_i + z^2[dist(i, v)]      for i in T_1 - {v}
        (M x)_i = s^2_i + z^1[dist(i, v)]      for i in T_2 - {v}
        (M x)_v = s^1_v + s^2_v - f(0) x_v     (v counted in both)
        z^k[a] = sum_b f(a + b) y^k[b],  y^k[b] = sum_{j in T_k - {v}, dist(j, v) = b} x_j

    since a path from T_1 - {v} to T_2 - {v} passes v. z = H y with the Hankel matrix
    H_ab = f(a + b) is a correlation with f, done by FFT (rfft/irfft of size N >= a_max + b_max + 1,
    5-smooth, so nothing wraps): z[a] = irfft(rfft(y) conj(rfft(f[:N])))[N - a]. Short rows (padded
    lengths p_a p_b <= HANKEL_DENSE_RATIO N, so p <= ~256) multiply by the Hankel block itself, a
    batched GEMM that is faster there. Subproblems of at most dense_threshold nodes (and trees of
    a forest that small, packed together) use the dense block f(dist) with distances counted
    within the block. The recursion depth is O(log n) (<= log_{3/2} n); each level costs
    O(n log n c) in FFTs and O(n c) in scatters and gathers, the leaves O(n dense_threshold c):
    O(n log^2 n c) in all. The plan (index and distance arrays, in preorder so that subproblems are
    contiguous ranges) takes O(n log n) memory and set-up; ``recursion_depth``, ``num_subproblems``
    (separator splits plus dense blocks), ``num_dense_blocks`` and ``num_fft_rows`` describe it.
    Memory of a product: the plan, x and the output, plus buffers bounded by ``max_chunk_bytes``
    (without autograd; with it, every step's buffers are kept, O(n log n c) in all). Half
    precision inputs compute in float32.
    """

    def __init__(self, forest: Forest, f: FTable, *, dense_threshold: int = 64,
                 max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES):
        _check_unweighted(forest, "TreeDCMask")
        if isinstance(dense_threshold, bool) or not isinstance(dense_threshold, numbers.Integral) or dense_threshold <= 0:
            raise ValueError(f"dense_threshold must be a positive integer, got {dense_threshold!r}")
        self.forest = forest
        self.n = forest.n
        self.f = _check_f(f, self.n)
        self.dense_threshold = int(dense_threshold)
        self.max_chunk_bytes = _check_chunk_bytes(max_chunk_bytes)
        self._plan()
        self._tensors: dict = {}

    # ----------------------------------------------------------------------- plan (set-up)

    def _plan(self) -> None:
        fo, n = self.forest, self.forest.n
        limit = max(self.dense_threshold, 2)  # two nodes cannot be split in two smaller trees
        # preorder labels: every subtree is a contiguous range [p, p + size)
        child, parent = _edges(fo)
        roots = fo.order[fo.parent_pos < 0]
        pre_node = _preorder(n, child, parent, roots)
        label = np.empty(n, dtype=np.int64)
        label[pre_node] = np.arange(n)
        parent_node = np.full(n, -1, dtype=np.int64)
        parent_node[child] = parent
        par = np.where(parent_node[pre_node] >= 0, label[np.maximum(parent_node[pre_node], 0)], -1)
        depth = _node_depths(fo)[pre_node]
        end = _subtree_ends(depth)
        has = np.flatnonzero(par >= 0)
        if not (np.all(par[has] < has) and np.all(has < end[par[has]])):  # a preorder, as built
            raise RuntimeError("depth-first order is not a preorder; cannot plan the separator recursion")
        self._end, self._depth, self._par = end, depth, par

        cross: list = []  # (N, src labels, src dists, tgt labels, tgt dists) per Hankel product
        leaves: list = []  # (labels, dist matrix with -1 across trees) per dense block
        splits = np.zeros(n, dtype=np.int64)
        max_depth, count = 0, 0
        # trees of a forest small enough for a dense block: packed consecutively (preorder ranges)
        root_pos = np.flatnonzero(par < 0)
        sizes = end[root_pos] - root_pos
        stack: list = []
        run: list = []  # preorder ranges of small trees going into one dense block
        run_size = 0
        for r, s in zip(root_pos.tolist(), sizes.tolist()):
            if s > limit:
                stack.append((np.arange(r, r + s), 0))
                continue
            if run and run_size + s > limit:
                leaves.append(self._dense_block(np.concatenate(run)))
                run, run_size = [], 0
            run.append(np.arange(r, r + s))
            run_size += s
        if run:
            leaves.append(self._dense_block(np.concatenate(run)))
        count += len(leaves)
        while stack:
            s_lab, level = stack.pop()
            count += 1
            max_depth = max(max_depth, level)
            if s_lab.size <= limit:
                leaves.append(self._dense_block(s_lab))
                continue
            v, t1, t2, side1, side2 = self._split(s_lab)
            splits[v] += 1
            cross.extend(self._hankel_rows(side1, side2))
            stack.append((t1, level + 1))
            stack.append((t2, level + 1))
        self.recursion_depth = max_depth
        self.num_subproblems = count
        self.num_dense_blocks = len(leaves)
        self._assemble(pre_node, label, cross, leaves, splits)

    def _split(self, s_lab: np.ndarray) -> tuple:
        """Centroid split of the connected subset s_lab (sorted preorder labels) of one tree."""
        m = s_lab.size
        hi = np.searchsorted(s_lab, self._end[s_lab])  # the local subtree of s_lab[i] is [i, hi[i])
        size = hi - np.arange(m)
        heavy = np.flatnonzero(2 * size > m)  # a chain from the top; its lowest node is a centroid
        ci = int(heavy[np.argmin(size[heavy])])
        v = int(s_lab[ci])
        ce = int(hi[ci])
        kids = ci + 1 + np.flatnonzero(self._par[s_lab[ci + 1:ce]] == v)
        part = np.full(m, kids.size, dtype=np.int64)  # part kids.size: the component above v
        part[ci + 1:ce] = np.repeat(np.arange(kids.size), size[kids])
        part_size = np.append(size[kids], m - size[ci])
        # distances to v: below v by depth; above v through the lowest common ancestor on v's chain
        dist = self._depth[s_lab] - self._depth[v]
        chain = np.flatnonzero((s_lab <= v) & (self._end[s_lab] > v))  # top .. v, by depth
        outside = np.concatenate([np.arange(ci), np.arange(ce, m)])
        if outside.size:
            p = s_lab[outside]
            i1 = np.searchsorted(s_lab[chain], p, side="right") - 1
            i2 = np.searchsorted(-self._end[s_lab[chain]], -p, side="left") - 1
            lca_depth = self._depth[s_lab[0]] + np.minimum(i1, i2)
            dist[outside] = self._depth[p] + self._depth[v] - 2 * lca_depth
        # two groups: a prefix of the components by decreasing size, the one whose total is closest
        # to (m - 1) / 2. Each component has <= m / 2 nodes, so the largest prefix totalling
        # <= 2 (m - 1) / 3 leaves both groups in [(m - 1) / 3, 2 (m - 1) / 3]; the closest is as good.
        by_size = np.argsort(-part_size, kind="stable")
        total = np.cumsum(part_size[by_size])[:-1]  # prefixes of 1 .. parts - 1 components
        k = int(np.argmin(np.abs(2 * total - (m - 1)))) + 1
        group_of = np.ones(part_size.size, dtype=np.int64)
        group_of[by_size[:k]] = 0
        grp = group_of[part]
        grp[ci] = -1
        in1, in2 = grp == 0, grp == 1
        t1, t2 = s_lab[in1 | (grp < 0)], s_lab[in2 | (grp < 0)]
        return v, t1, t2, (s_lab[in1], dist[in1]), (s_lab[in2], dist[in2])

    def _hankel_rows(self, side1: tuple, side2: tuple) -> list:
        """The two cross-term rows of a split: (key, src labels, y bins, tgt labels, z bins).

        Row "T_2 into T_1" sums x over T_2 - {v} by distance b into y, and node i of T_1 - {v}
        reads z[a] = sum_b f(a + b) y[b] at a = dist(i, v); "T_1 into T_2" likewise. A key
        (kind, z length, y length) says how: kind 0 multiplies by the Hankel matrix
        H[a - 1, b - 1] = f(a + b) (a <= p_out, b <= p_in, powers of two) as a dense GEMM, used
        while p_out p_in <= HANKEL_DENSE_RATIO N; kind 1 correlates with f by FFTs of size N
        (y at bin b, z[a] at bin N - a, see _cross_terms).
        """
        (lab1, d1), (lab2, d2) = side1, side2
        m1, m2 = int(d1.max()), int(d2.max())
        n_fft = _fft_size(m1 + m2 + 1)
        p1, p2 = 1 << (m1 - 1).bit_length(), 1 << (m2 - 1).bit_length()
        if p1 * p2 <= HANKEL_DENSE_RATIO * n_fft:
            return [((0, p1, p2), lab2, d2 - 1, lab1, d1 - 1), ((0, p2, p1), lab1, d1 - 1, lab2, d2 - 1)]
        key = (1, n_fft, n_fft)
        return [(key, lab2, d2, lab1, n_fft - d1), (key, lab1, d1, lab2, n_fft - d2)]

    def _dense_block(self, s_lab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances within the block (labels sorted in preorder; -1 across trees).

        anc[a, u]: s_lab[a] is an ancestor-or-self of s_lab[u]; the block holds every ancestor
        of its nodes up to each tree's top, so dist(u, w) = |anc(u)| + |anc(w)| - 2 |anc(u) n anc(w)|.
        """
        anc = ((s_lab[:, None] <= s_lab[None, :]) & (s_lab[None, :] < self._end[s_lab][:, None])).astype(np.float64)
        common = anc.T @ anc
        depth = anc.sum(0)
        dist = np.rint(depth[:, None] + depth[None, :] - 2 * common).astype(np.int64)
        dist[common == 0] = -1
        return s_lab, dist

    def _assemble(self, pre_node: np.ndarray, label: np.ndarray, cross: list, leaves: list,
                  splits: np.ndarray) -> None:
        """Flatten the plan into index arrays (preorder labels): Hankel rows by key, dense blocks by size."""
        n = self.n
        cross.sort(key=lambda r: r[0])
        self._row_key = [r[0] for r in cross]
        z_len = np.array([k[1] for k in self._row_key], dtype=np.int64)
        y_len = np.array([k[2] for k in self._row_key], dtype=np.int64)
        self._y_start = np.concatenate([[0], np.cumsum(y_len)]).astype(np.int64)
        self._z_start = np.concatenate([[0], np.cumsum(z_len)]).astype(np.int64)
        self._w_start = np.concatenate([[0], np.cumsum(np.maximum(y_len, z_len))]).astype(np.int64)
        src_len = np.array([r[1].size for r in cross], dtype=np.int64)
        tgt_len = np.array([r[3].size for r in cross], dtype=np.int64)
        self._src_off = np.concatenate([[0], np.cumsum(src_len)]).astype(np.int64)
        self._tgt_off = np.concatenate([[0], np.cumsum(tgt_len)]).astype(np.int64)
        cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if cross else (lambda parts: np.zeros(0, np.int64))
        self._plan_np = {
            "src_node": cat([r[1] for r in cross]),
            "src_bin": cat([r[2] for r in cross]) + np.repeat(self._y_start[:-1], src_len),
            "tgt_node": cat([r[3] for r in cross]),
            "tgt_bin": cat([r[4] for r in cross]) + np.repeat(self._z_start[:-1], tgt_len),
            "splits": splits,
            "pre_node": pre_node,  # x by node id -> x in preorder
            "label": label,  # and back
        }
        # steps never mix keys: the first row of each key
        self._key_change = np.array([i for i in range(1, len(cross)) if cross[i][0] != cross[i - 1][0]], dtype=np.int64)
        self.num_fft_rows = sum(k[0] == 1 for k in self._row_key)
        # dense blocks, bucketed by padded size (a power of two): node n and index n of f are padding
        buckets: dict = {}
        for s_lab, dist in leaves:
            buckets.setdefault(1 << (s_lab.size - 1).bit_length(), []).append((s_lab, dist))
        self._blocks = []
        for size, items in sorted(buckets.items()):
            nodes = np.full((len(items), size), n, dtype=np.int64)
            dists = np.full((len(items), size, size), n, dtype=np.int32)  # int32: half the memory
            for b, (s_lab, dist) in enumerate(items):
                m = s_lab.size
                nodes[b, :m] = s_lab
                dists[b, :m, :m] = np.where(dist >= 0, dist, n)
            self._blocks.append((size, nodes, dists))

    def _device_plan(self, device: torch.device | str) -> dict:
        key = str(device)
        if key not in self._tensors:
            t = {k: torch.as_tensor(v, device=device) for k, v in self._plan_np.items()}
            t["blocks"] = [(size, torch.as_tensor(nodes, device=device), torch.as_tensor(dists, device=device))
                           for size, nodes, dists in self._blocks]
            self._tensors[key] = t
        return self._tensors[key]

    # ----------------------------------------------------------------------- product

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): dense blocks, Hankel FFTs, the f(0) fix at the v's."""
        check_tokens("x", x, self.n)
        out_dtype, work = x.dtype, compute_dtype(x.dtype)
        lead, c, n = x.shape[:-2], x.shape[-1], self.n
        plan = self._device_plan(x.device)
        # preorder: every subproblem is a few contiguous ranges, so the gathers below stay local
        xs = x.to(work).reshape(-1, n, c).index_select(1, plan["pre_node"])
        f = self.f.to(device=x.device, dtype=work)
        grad = torch.is_grad_enabled() and (xs.requires_grad or f.requires_grad)
        out = self._cross_terms(xs, f, self._dense_blocks(xs, f, plan), grad)[:, :n]
        out = out - f[0] * plan["splits"].to(work)[:, None] * xs  # v was in both halves of its split
        return out.index_select(1, plan["label"]).reshape(*lead, n, c).to(out_dtype)

    def _dense_blocks(self, xs: torch.Tensor, f: torch.Tensor, plan: dict) -> torch.Tensor:
        """sum over dense blocks of f(dist) @ x[block], scattered back: (B, n, c)."""
        B, n, c = xs.shape
        xp = torch.cat([xs, xs.new_zeros(B, 1, c)], dim=1)  # row n: padding
        out = xs.new_zeros(B, n + 1, c)
        f_ext = torch.cat([f, f.new_zeros(1)])  # f_ext[n] = 0: padding and pairs across trees
        item = xs.element_size()
        for size, nodes, dists in plan["blocks"]:
            step = max(1, self.max_chunk_bytes // (size * item * (3 * B * c + size)))
            for b0 in range(0, nodes.shape[0], step):
                idx = nodes[b0:b0 + step].reshape(-1)
                xb = xp.index_select(1, idx).view(B, -1, size, c)
                out.index_add_(1, idx, torch.matmul(f_ext[dists[b0:b0 + step]], xb).view(B, -1, c))
        return out

    def _cross_terms(self, xs: torch.Tensor, f: torch.Tensor, out: torch.Tensor, grad: bool) -> torch.Tensor:
        """Adds the Hankel products through the separators to out (B, n, c); returns it.

        Rows (one per side of a split) are sorted by key and processed in steps of one key that
        fit ``max_chunk_bytes``: y (B, rows, y length, c) by index_add of x at distance bins, then
        z = H y (dense rows) or z = irfft(rfft(y) conj(rfft(f[:N]))) (FFT rows: a correlation,
        z[a] at bin N - a), gathered at the targets' bins and added to their rows.
        """
        B, n, c = xs.shape
        plan = self._device_plan(xs.device)
        budget = max(1, self.max_chunk_bytes // (6 * B * c * xs.element_size()))
        ops: dict = {}  # per key: the Hankel matrix, or conj(rfft(f[:N])) as (N // 2 + 1, 1)
        rows, r0, change = len(self._row_key), 0, self._key_change
        while r0 < rows:
            kind, z_len, y_len = key = self._row_key[r0]
            r1 = int(np.searchsorted(self._w_start, self._w_start[r0] + budget, side="right")) - 1
            nxt = change[np.searchsorted(change, r0, side="right"):]
            r1 = min(max(r1, r0 + 1), int(nxt[0]) if nxt.size else rows)
            y0, z0 = int(self._y_start[r0]), int(self._z_start[r0])
            s0, s1 = int(self._src_off[r0]), int(self._src_off[r1])
            t0, t1 = int(self._tgt_off[r0]), int(self._tgt_off[r1])
            y = xs.new_zeros(B, (r1 - r0) * y_len, c).index_add_(
                1, plan["src_bin"][s0:s1] - y0, xs.index_select(1, plan["src_node"][s0:s1]))
            y = y.view(B, r1 - r0, y_len, c)
            if key not in ops:
                if kind == 0:
                    a = torch.arange(1, z_len + 1, device=xs.device)
                    b = torch.arange(1, y_len + 1, device=xs.device)
                    fp = torch.nn.functional.pad(f, (0, max(0, z_len + y_len + 1 - n)))
                    ops[key] = fp[a[:, None] + b[None, :]]  # H[a - 1, b - 1] = f(a + b)
                else:
                    spec = torch.fft.rfft(torch.nn.functional.pad(f[:z_len], (0, max(0, z_len - n))))
                    ops[key] = spec.conj().resolve_conj()[:, None]
            if kind == 0:
                z = torch.matmul(ops[key], y)
            else:
                spec = torch.fft.rfft(y, dim=2)
                spec = spec * ops[key] if grad else spec.mul_(ops[key])
                z = torch.fft.irfft(spec, n=z_len, dim=2)
            z = z.reshape(B, (r1 - r0) * z_len, c).contiguous()
            out.index_add_(1, plan["tgt_node"][t0:t1], z.index_select(1, plan["tgt_bin"][t0:t1] - z0))
            r0 = r1
        return out


def tree_mask_operator(forest: Forest, f: FTable, *, method: str = "auto") -> TreeDiamMask | TreeDCMask:
    """M_ij = f(dist(i, j)) on an unweighted forest as an operator with ``n`` and ``matmul``.

    f: (n,) f(0), ..., f(n - 1). method: "diam" (TreeDiamMask, Lemma 6.2, O(n diam c)), "dc"
    (TreeDCMask, Lemma 6.1, O(n log^2 n c)) or "auto": by Cor. 6.4 the diameter algorithm when
    diam <= log2(n)^2 (diam = o(log^2 n)), else the separator recursion; diam by two BFS passes
    (``forest_diameter``).
    """
    if method not in ("auto", "diam", "dc"):
        raise ValueError(f"method must be 'auto', 'diam' or 'dc', got {method!r}")
    if method == "auto":
        _check_unweighted(forest, "tree_mask_operator")
        method = "diam" if forest_diameter(forest) <= math.log2(forest.n) ** 2 else "dc"
    return TreeDiamMask(forest, f) if method == "diam" else TreeDCMask(forest, f)
