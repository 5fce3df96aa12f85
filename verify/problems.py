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
        x = rng.standard_normal(shape)
        return norm * x / np.linalg.norm(x, axis=-1, keepdims=True)

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
    """Uniform random recursive tree: node i > 0 attaches to a uniform earlier node."""
    rng = rng_for(seed, 2)
    child = np.arange(1, n)
    parent = np.floor(rng.random(n - 1) * child).astype(np.int64)  # uniform on 0..i-1, vectorised
    return _symmetric_csr(parent, child, n)


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


GRAPHS = {
    "path": lambda n, seed=0: path_graph(n),
    "grid-2d": lambda n, seed=0: grid_graph(_near_square(n, 2)),
    "grid-3d": lambda n, seed=0: grid_graph(_near_square(n, 3)),
    "random-tree": random_tree,
    "binary-tree": lambda n, seed=0: complete_binary_tree(n),
    "erdos-renyi": lambda n, seed=0: erdos_renyi(n, min(1.0, 8.0 / max(n, 1)), seed),
    "knn": lambda n, seed=0: knn_graph(n, seed=seed),
    "hypercube": lambda n, seed=0: hypercube(max(0, int(round(np.log2(n))))),
}


def _near_square(n: int, dims: int) -> tuple[int, ...]:
    side = max(1, int(round(n ** (1.0 / dims))))
    return (side,) * (dims - 1) + (max(1, n // side ** (dims - 1)),)
