"""Deterministic problem generators: token inputs and graph families (scipy.sparse CSR).

Every generator takes an explicit seed and returns NumPy/SciPy data, so reference/ and fast/
consume the very same draws.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree


@dataclass
class Problem:
    """Inputs of one mechanism instance.

    q, k: (*batch, N, d_qk); v: (*batch, N, d); projection: (m, d_qk) or None;
    extras: mechanism-specific data (segment ids, key masks, graphs, grid shapes, ...).
    """

    n: int
    seed: int
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    projection: np.ndarray | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def rng_for(seed: int, *salt: int) -> np.random.Generator:
    """An independent generator for (seed, salt...) that never touches global state."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, salt)]))


def qkv(
    n: int,
    d_qk: int = 16,
    d: int = 16,
    *,
    batch: tuple[int, ...] = (),
    norm: float = 1.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K (*batch, n, d_qk) with every row of Euclidean norm ``norm``; V (*batch, n, d) ~ N(0, 1).

    Controlling the norms keeps positive random features in a range where their variance is
    known to be moderate (Performer: Var grows like exp(|x + y|^2)).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = rng_for(seed, 1)

    def unit_rows(shape):
        # norm * x / np.linalg.norm(x, axis=-1, keepdims=True), bit for bit (the same products, the
        # same add.reduce over the last axis, the same two roundings per entry), in place: at
        # N = 2^20 the formula's three full-size temporaries cost as much as drawing x
        x = rng.standard_normal(shape)
        length = np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True))
        np.multiply(norm, x, out=x)
        np.divide(x, length, out=x)
        return x

    return unit_rows((*batch, n, d_qk)), unit_rows((*batch, n, d_qk)), rng.standard_normal((*batch, n, d))


# ---------------------------------------------------------------------------------- graphs


def _symmetric_csr(rows: np.ndarray, cols: np.ndarray, n: int) -> sp.csr_matrix:
    a = sp.coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n)).tocsr()
    a = ((a + a.T) > 0).astype(np.float64)
    a.setdiag(0)
    a.eliminate_zeros()
    return a.tocsr()


def path_graph(n: int) -> sp.csr_matrix:
    """Path 0 - 1 - ... - (n-1), adjacency (n, n)."""
    i = np.arange(n - 1)
    return _symmetric_csr(i, i + 1, n)


def grid_graph(shape: tuple[int, ...]) -> sp.csr_matrix:
    """d-dimensional grid graph (4-/6-neighbourhood), nodes in row-major order."""
    shape = tuple(int(s) for s in shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"grid shape must be non-empty positive ints, got {shape}")
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    rows, cols = [], []
    for axis in range(len(shape)):
        a = np.take(idx, range(shape[axis] - 1), axis=axis).ravel()
        b = np.take(idx, range(1, shape[axis]), axis=axis).ravel()
        rows.append(a)
        cols.append(b)
    return _symmetric_csr(np.concatenate(rows), np.concatenate(cols), idx.size)


def random_tree(n: int, seed: int = 0) -> sp.csr_matrix:
    """Uniform random recursive tree (``tree_parent("random recursive", ...)``) as an adjacency."""
    parent = tree_parent("random recursive", n, rng_for(seed, 2))
    child = np.flatnonzero(parent >= 0)
    return _symmetric_csr(parent[child], child, n)


def complete_binary_tree(n: int) -> sp.csr_matrix:
    """Heap-ordered binary tree on n nodes: parent(i) = (i - 1) // 2."""
    child = np.arange(1, n)
    return _symmetric_csr((child - 1) // 2, child, n)


def erdos_renyi(n: int, p: float, seed: int = 0) -> sp.csr_matrix:
    """G(n, p), undirected, no self-loops."""
    rng = rng_for(seed, 3)
    upper = sp.random(n, n, density=p, random_state=rng, format="coo")
    keep = upper.row < upper.col
    return _symmetric_csr(upper.row[keep], upper.col[keep], n)


def knn_graph(n: int, k: int = 8, dim: int = 3, seed: int = 0) -> sp.csr_matrix:
    """Symmetrised k-nearest-neighbour graph of n uniform points in [0, 1]^dim."""
    if n < 2:  # no neighbours to find
        return sp.csr_matrix((n, n))
    rng = rng_for(seed, 4)
    pts = rng.random((n, dim))
    _, nbr = cKDTree(pts).query(pts, k=min(k + 1, n))
    rows = np.repeat(np.arange(n), nbr.shape[1] - 1)
    return _symmetric_csr(rows, nbr[:, 1:].ravel(), n)


def hypercube(k: int) -> sp.csr_matrix:
    """Hypercube {0,1}^k: 2^k nodes, edges between labels at Hamming distance 1."""
    n = 1 << k
    nodes = np.arange(n)
    rows = np.concatenate([nodes] * k) if k else np.array([], dtype=np.int64)
    cols = np.concatenate([nodes ^ (1 << b) for b in range(k)]) if k else np.array([], dtype=np.int64)
    return _symmetric_csr(rows, cols, n)


def random_regular(n: int, degree: int = 4, seed: int = 0) -> sp.csr_matrix:
    """Random ``degree``-regular simple graph on n nodes (the complete graph K_n when n <= degree).

    Pairing (configuration) model with repair: the stubs (each node ``degree`` times) are paired
    at random; pairs that make a self-loop or a repeated edge go back to the pool and are paired
    again (Steger-Wormald style), restarting from scratch when the pool gets stuck. Near-uniform
    over d-regular graphs for fixed d, O(n d) per round, ~log rounds. Needs n * degree even."""
    n = int(n)
    degree = int(degree)
    if n < 1 or degree < 0:
        raise ValueError(f"random_regular needs n >= 1 and degree >= 0, got n={n}, degree={degree}")
    if n <= degree:  # no simple graph has degree >= n: the densest one, K_n
        i, j = np.triu_indices(n, k=1)
        return _symmetric_csr(i, j, n)
    if (n * degree) % 2:
        raise ValueError(f"a {degree}-regular graph on n={n} nodes needs n * degree even, got {n * degree}")
    rng = rng_for(seed, 5)
    stubs = np.repeat(np.arange(n, dtype=np.int64), degree)
    for _ in range(1000):  # restarts
        keys = np.empty(0, dtype=np.int64)  # accepted edges, lo * n + hi, sorted
        pool, stalls = stubs, 0
        while pool.size and stalls < 20:
            perm = rng.permutation(pool)
            u, v = perm[0::2], perm[1::2]
            lo, hi = np.minimum(u, v), np.maximum(u, v)
            key = lo * n + hi
            ok = lo != hi
            order = np.argsort(key, kind="stable")
            repeat = np.zeros(key.size, dtype=bool)  # a pair met earlier in this round
            repeat[order[1:]] = key[order[1:]] == key[order[:-1]]
            ok &= ~repeat
            if keys.size:  # a pair that is already an edge (keys sorted: binary search)
                pos = np.minimum(np.searchsorted(keys, key), keys.size - 1)
                ok &= keys[pos] != key
            stalls = 0 if ok.any() else stalls + 1
            new = np.sort(key[ok])
            keys = new if not keys.size else np.insert(keys, np.searchsorted(keys, new), new)
            pool = np.concatenate([u[~ok], v[~ok]])
        if not pool.size:
            return _symmetric_csr(keys // n, keys % n, n)
    raise RuntimeError(f"random_regular(n={n}, degree={degree}) found no simple pairing in 1000 restarts")


KARATE_N = 34


def karate_graph(n: int = KARATE_N, seed: int = 0) -> sp.csr_matrix:
    """Zachary's karate club (networkx.karate_club_graph, unweighted) reaching any n >= 1: n // 34
    disjoint copies plus the subgraph induced on the first n % 34 nodes of one more copy (so
    n != 34 has several components). Deterministic; ``seed`` is accepted for GRAPHS' signature."""
    import networkx as nx  # lazily: only this family needs it

    n = int(n)
    if n < 1:
        raise ValueError(f"karate_graph needs n >= 1, got {n}")
    club = nx.karate_club_graph()
    base = sp.coo_matrix(nx.to_scipy_sparse_array(club, nodelist=range(KARATE_N), weight=None))
    copies, rest = divmod(n, KARATE_N)
    rows, cols = [], []
    for c in range(copies + 1):
        size = KARATE_N if c < copies else rest
        keep = (base.row < size) & (base.col < size)
        rows.append(base.row[keep] + c * KARATE_N)
        cols.append(base.col[keep] + c * KARATE_N)
    return _symmetric_csr(np.concatenate(rows), np.concatenate(cols), n)


# ----------------------------------------------------------------------------------- trees
# The one place where tree families are built (parent arrays: parent[i] = -1 at roots).

TREES_PER_TOKEN = 1 / 512  # random_forest: about one extra tree per 512 nodes

#: The unweighted tree families every tree check, variant and figure uses.
TREE_FAMILIES = ("path", "star", "caterpillar", "complete binary", "random recursive")


def tree_parent(family: str, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Parent array (n,) of one unweighted tree of ``family`` (parents before children; -1 at the root).

    caterpillar: a spine of ceil(n/2) nodes, each with one leg while nodes last; random recursive:
    node i joins a uniform earlier node (depth ~ e ln n; needs ``rng``).
    """
    if family == "path":
        return np.arange(-1, n - 1)
    if family == "star":
        return np.concatenate([[-1], np.zeros(n - 1, dtype=np.int64)])[:n]
    if family == "caterpillar":
        spine = (n + 1) // 2
        return np.concatenate([np.arange(-1, spine - 1), np.arange(n - spine)])
    if family == "complete binary":
        return np.concatenate([[-1], (np.arange(1, n) - 1) // 2])
    if family == "random recursive":
        if rng is None:
            raise ValueError("a random recursive tree needs rng")
        return np.concatenate([[-1], np.floor(rng.random(n - 1) * np.arange(1, n))]).astype(np.int64)
    raise ValueError(f"unknown tree family {family!r}; known: {', '.join(TREE_FAMILIES)}")


MIXED_KINDS = ("path", "star", "caterpillar", "complete binary", "random recursive", "random recursive")


def component_sizes(n: int, max_chain: int | None = None) -> list[int]:
    """mixed_forest's component sizes, in MIXED_KINDS order: n split in six, chains capped."""
    sizes = [n // 6 + (1 if i < n % 6 else 0) for i in range(6)]
    if max_chain is not None:
        for i in (0, 2):  # path, caterpillar: the excess goes to the binary tree
            extra = max(0, sizes[i] - max_chain)
            sizes[i] -= extra
            sizes[3] += extra
    return sizes


def mixed_forest(n: int, seed: int, max_chain: int | None = None) -> np.ndarray:
    """parent (n,) of one forest holding a path, a star, a caterpillar, a complete binary tree and
    two random recursive trees (about n/6 nodes each), node labels randomly permuted, so one
    problem exercises every tree family. max_chain caps the path and caterpillar (diameter
    O(log n) overall for tree-diam's sweeps); the rest goes to the binary tree."""
    rng = rng_for(seed, 63)
    parts, offset = [], 0
    sizes = component_sizes(n, max_chain)
    for kind, k in zip(MIXED_KINDS, sizes):
        if k == 0:
            continue
        p = tree_parent(kind, k, rng)
        parts.append(np.where(p >= 0, p + offset, -1))
        offset += k
    parent = np.concatenate(parts)
    perm = rng.permutation(n)  # node i of the construction becomes perm[i]
    out = np.empty(n, dtype=np.int64)
    out[perm] = np.where(parent >= 0, perm[np.maximum(parent, 0)], -1)
    return out


def random_forest(n: int, seed: int, weighted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(parent (n,), weights (n,)): random recursive trees (node i joins a uniform earlier node,
    depth ~ e ln n), a few extra roots so entries between trees (0) are exercised, and edge
    lengths uniform on [0.5, 1.5] (1 if not weighted)."""
    rng = rng_for(seed, 60)
    parent = tree_parent("random recursive", n, rng)
    roots = rng.random(n) < TREES_PER_TOKEN
    parent[roots] = -1
    weights = rng.uniform(0.5, 1.5, n) if weighted else np.ones(n)
    return parent, weights



GRAPHS = {
    "path": lambda n, seed=0: path_graph(n),
    "grid-2d": lambda n, seed=0: grid_graph(_near_square(n, 2)),
    "grid-3d": lambda n, seed=0: grid_graph(_near_square(n, 3)),
    "random-tree": random_tree,
    "binary-tree": lambda n, seed=0: complete_binary_tree(n),
    "erdos-renyi": lambda n, seed=0: erdos_renyi(n, min(1.0, 8.0 / max(n, 1)), seed),
    "knn": lambda n, seed=0: knn_graph(n, seed=seed),
    "knn4": lambda n, seed=0: knn_graph(n, k=4, seed=seed),
    "regular": lambda n, seed=0: random_regular(n, 4, seed),
    "karate": karate_graph,
    "hypercube": lambda n, seed=0: hypercube(max(0, int(round(np.log2(n))))),
}


def _near_square(n: int, dims: int) -> tuple[int, ...]:
    side = max(1, int(round(n ** (1.0 / dims))))
    return (side,) * (dims - 1) + (max(1, n // side ** (dims - 1)),)
