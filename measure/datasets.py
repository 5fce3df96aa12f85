"""Small node-classification graphs for the training demo (measure.training): no download.

Every data set is plain NumPy (and a scipy.sparse adjacency on request), built from a seeded
``numpy.random.Generator`` (never the global RNG state), with fixed train / val / test splits:

``sbm``
    A planted-partition stochastic block model: ``classes`` equal blocks, an edge between two
    nodes of one block with probability ``p_in``, of two blocks with ``p_out`` (p_in > p_out:
    homophilous). Features: a class mean mu_c (standard normal in R^F, scaled to norm
    ``signal``) plus N(0, I_F) noise, so features alone classify only part of the nodes and the
    graph carries the rest.
``karate``
    networkx's karate club (Zachary 1977): 34 members, 78 friendships; label = the club each
    member joined after the split ("Mr. Hi" 0, "Officer" 1). Features: the identity (one-hot
    node id, 34 columns), Kipf and Welling's choice for a featureless graph: a node's features
    say nothing about any other node, so a model that ignores the graph (the MLP) cannot do
    better than chance on unseen nodes; everything comes through the graph.
``knn``
    wu22's protocol for data without a graph (Sec. 5.2, image and text classification): the
    input graph is the k-nearest-neighbour graph of the feature vectors themselves (symmetrised,
    no self-loops). The points: each class a mixture of ``clusters`` Gaussian clusters in R^F
    (centres N(0, spread^2/2 I), unit noise), with only 10% of the labels for training: a
    classifier of single points must learn a multimodal class from few examples, while the k-NN
    graph joins the points of one cluster and carries the labels along it.

No data set from an installed package is used: scikit-learn (its digits / iris) is not a
dependency here, and networkx's other bundled graphs have no node labels.

Every builder draws everything from its ``seed``: measure.training passes the run's seed, so its
seeds vary the SBM's graph and features, the k-NN data's points and graph, and every split
(karate: one graph, only the split varies).

Splits: per class, a fixed fraction of the nodes (stratified, shuffled by the generator) goes
to train, another to val, the rest to test (SPLIT, KARATE_SPLIT, KNN_SPLIT give the fractions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

#: (train, val) fractions per class; the rest is test. Karate is tiny: a larger train share.
SPLIT = (0.3, 0.2)
KARATE_SPLIT = (0.4, 0.2)
#: k-NN data: few labels (the semi-supervised setting of wu22 Sec. 5.2, where the graph helps most)
KNN_SPLIT = (0.1, 0.2)


@dataclass
class GraphData:
    """One node-classification problem.

    features (N, F) float32; labels (N,) int64 in [0, num_classes); edge_index (2, E) int64,
    symmetric (both directions stored), no self-loops, no duplicates; masks (N,) bool, disjoint,
    covering every node. ``graph``: how the input graph was made (what the report prints).
    """

    name: str
    title: str
    description: str
    graph: str
    features: np.ndarray
    labels: np.ndarray
    edge_index: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    seed: int
    params: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_edges(self) -> int:
        """Undirected edges (each stored twice in edge_index)."""
        return int(self.edge_index.shape[1] // 2)

    def adjacency(self) -> sp.csr_matrix:
        """The 0/1 symmetric adjacency (N, N) as CSR, float64, no self-loops."""
        n = self.n
        a = sp.csr_matrix((np.ones(self.edge_index.shape[1]), (self.edge_index[0], self.edge_index[1])),
                          shape=(n, n))
        a.sum_duplicates()
        a.data[:] = 1.0
        return a

    def edge_homophily(self) -> float:
        """Fraction of stored edges joining two nodes of the same class."""
        if self.edge_index.shape[1] == 0:
            return float("nan")
        return float(np.mean(self.labels[self.edge_index[0]] == self.labels[self.edge_index[1]]))


def _rng(seed: int, salt: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return np.random.default_rng([int(seed), salt])


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _check_prob(name: str, value) -> float:
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return v


def symmetric_edge_index(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """(2, E) int64 of the symmetric closure of the pairs, self-loops and duplicates dropped,
    sorted by (row, col)."""
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    keep = rows != cols
    r = np.concatenate([rows[keep], cols[keep]])
    c = np.concatenate([cols[keep], rows[keep]])
    key = np.unique(r * n + c)
    return np.stack([key // n, key % n]).astype(np.int64)


def stratified_split(labels: np.ndarray, fractions: tuple[float, float], rng: np.random.Generator):
    """(train, val, test) boolean masks: per class, round(f * size) nodes to train and to val
    (at least one each where the class has >= 3 nodes), the rest to test."""
    f_train, f_val = fractions
    if not (0 < f_train and 0 <= f_val and f_train + f_val < 1):
        raise ValueError(f"split fractions must satisfy 0 < train, 0 <= val, train + val < 1, got {fractions}")
    n = len(labels)
    train, val, test = (np.zeros(n, bool) for _ in range(3))
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k_train = max(1, int(round(f_train * len(idx)))) if len(idx) >= 3 else 1
        k_val = max(1, int(round(f_val * len(idx)))) if len(idx) >= 3 and f_val > 0 else 0
        train[idx[:k_train]] = True
        val[idx[k_train:k_train + k_val]] = True
        test[idx[k_train + k_val:]] = True
    return train, val, test


def sbm(n: int = 200, classes: int = 3, p_in: float = 0.09, p_out: float = 0.018, feature_dim: int = 16,
        signal: float = 1.0, seed: int = 0) -> GraphData:
    """Planted partition: ``classes`` blocks of (nearly) equal size, edges with p_in inside a
    block and p_out across, features mu_c + N(0, I) with |mu_c| = ``signal`` (module doc).
    Expected degree ~ p_in N / C + p_out N (C - 1) / C (6 + 2.4 = 8.4 at the defaults)."""
    n = _check_int("n", n, 2)
    classes = _check_int("classes", classes, 2)
    feature_dim = _check_int("feature_dim", feature_dim, 1)
    p_in, p_out = _check_prob("p_in", p_in), _check_prob("p_out", p_out)
    rng = _rng(seed, 1)
    labels = np.repeat(np.arange(classes), -(-n // classes))[:n]
    labels = labels[rng.permutation(n)].astype(np.int64)
    iu, ju = np.triu_indices(n, k=1)
    prob = np.where(labels[iu] == labels[ju], p_in, p_out)
    hit = rng.random(len(iu)) < prob
    edge_index = symmetric_edge_index(iu[hit], ju[hit], n)
    means = rng.standard_normal((classes, feature_dim))
    means *= signal / np.linalg.norm(means, axis=1, keepdims=True)
    x = means[labels] + rng.standard_normal((n, feature_dim))
    train, val, test = stratified_split(labels, SPLIT, rng)
    return GraphData("sbm", "planted partition (SBM)",
                     f"{classes} near-equal blocks of {n} nodes, p_in {p_in:g}, p_out {p_out:g}; features: class mean "
                     f"of norm {signal:g} + N(0, I_{feature_dim})",
                     "the planted-partition graph", x.astype(np.float32), labels, edge_index, train, val, test,
                     classes, int(seed), {"n": n, "classes": classes, "p_in": p_in, "p_out": p_out,
                                          "feature_dim": feature_dim, "signal": signal})


def karate(seed: int = 0) -> GraphData:
    """networkx's karate club: labels = the club after the split, features = identity (module doc).
    ``seed`` only draws the split (the graph is fixed)."""
    import networkx as nx

    rng = _rng(seed, 2)
    g = nx.karate_club_graph()
    nodes = sorted(g.nodes())
    n = len(nodes)
    labels = np.array([0 if g.nodes[u]["club"] == "Mr. Hi" else 1 for u in nodes], dtype=np.int64)
    e = np.array([(u, v) for u, v in g.edges()], dtype=np.int64).T
    edge_index = symmetric_edge_index(e[0], e[1], n)
    x = np.eye(n, dtype=np.float32)
    train, val, test = stratified_split(labels, KARATE_SPLIT, rng)
    return GraphData("karate", "karate club", "Zachary's karate club (networkx): 34 members, label = club after "
                     "the split; features: identity (one-hot node id)", "the friendship graph", x, labels,
                     edge_index, train, val, test, 2, int(seed), {"n": n})


def knn_graph(x: np.ndarray, k: int) -> np.ndarray:
    """(2, E) symmetric k-nearest-neighbour graph of the rows of x (Euclidean; a node is not its
    own neighbour; ties broken by index). Dense O(N^2 F): for the demo's N of a few hundred."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise ValueError(f"x must be a finite 2-d array (N, F), got shape {x.shape}")
    n = x.shape[0]
    k = _check_int("k", k, 1)
    if k >= n:
        raise ValueError(f"k must be < N = {n}, got {k}")
    sq = (x * x).sum(1)
    dist = sq[:, None] + sq[None, :] - 2 * x @ x.T
    np.fill_diagonal(dist, np.inf)
    nbr = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return symmetric_edge_index(np.repeat(np.arange(n), k), nbr.ravel(), n)


def knn(n: int = 200, classes: int = 3, clusters: int = 3, feature_dim: int = 16, spread: float = 1.5, k: int = 5,
        seed: int = 0) -> GraphData:
    """Gaussian mixture without a graph; the input graph is its k-NN graph (module doc)."""
    n = _check_int("n", n, 2)
    classes = _check_int("classes", classes, 2)
    clusters = _check_int("clusters", clusters, 1)
    feature_dim = _check_int("feature_dim", feature_dim, 1)
    rng = _rng(seed, 3)
    labels = np.repeat(np.arange(classes), -(-n // classes))[:n]
    labels = labels[rng.permutation(n)].astype(np.int64)
    sub = rng.integers(0, clusters, n)
    # centres N(0, spread^2 / 2 I): two centres lie ~spread apart per coordinate
    centres = rng.standard_normal((classes, clusters, feature_dim)) * (spread / np.sqrt(2))
    x = centres[labels, sub] + rng.standard_normal((n, feature_dim))
    edge_index = knn_graph(x, k)
    train, val, test = stratified_split(labels, KNN_SPLIT, rng)
    return GraphData("knn", "k-NN of a Gaussian mixture",
                     f"{classes} classes, each a mixture of {clusters} Gaussian clusters in R^{feature_dim} (centres "
                     f"N(0, {spread:g}²/2 I), unit noise), {KNN_SPLIT[0]:.0%} of the labels for training; no input "
                     f"graph: the {k}-NN graph of the features is used (wu22 Sec. 5.2)",
                     f"the {k}-NN graph of the features", x.astype(np.float32), labels, edge_index, train, val, test,
                     classes, int(seed), {"n": n, "classes": classes, "clusters": clusters,
                                          "feature_dim": feature_dim, "spread": spread, "k": k})


#: name -> builder(seed) at the demo's sizes
DATASETS = {"sbm": sbm, "karate": karate, "knn": knn}


def load(name: str, seed: int = 0) -> GraphData:
    """One of DATASETS by name (ValueError listing them otherwise)."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name](seed=seed)
