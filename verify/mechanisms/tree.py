"""Registry records: tree-exp (choromanski22 Lemma 3.5; NOTES.md Sec. 2).

Problems are FAVOR+ attention (favor_problem) with a tree-distance mask on a random forest whose
parent array and edge lengths live in problem.extras, so reference/ (dense csgraph distances)
and fast/ (the level-order recursion) build the same mask.
"""
from __future__ import annotations

import numpy as np

from fast.masks.tree import Forest, TreeExpMask
from reference.masks import tree as ref_tree
from verify.mechanisms.sequence import favor_dense_setup, favor_fast_setup, favor_problem, favor_reference
from verify.problems import Problem, rng_for
from verify.registry import Mechanism, register

TREE_A = -0.3  # f(z) = exp(a z + b): decay with distance (the stable sign, Lemma 3.5)
TREE_B = 0.2
TREES_PER_TOKEN = 1 / 512  # a forest: about one extra tree per 512 nodes


def random_forest(n: int, seed: int, weighted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(parent (n,), weights (n,)): random recursive trees (node i joins a uniform earlier node,
    depth ~ e ln n), a few extra roots so entries between trees (0) are exercised, and edge
    lengths uniform on [0.5, 1.5] (1 if not weighted)."""
    rng = rng_for(seed, 60)
    child = np.arange(1, n)
    parent = np.concatenate([[-1], np.floor(rng.random(n - 1) * child)]).astype(np.int64)
    roots = rng.random(n) < TREES_PER_TOKEN
    parent[roots] = -1
    weights = rng.uniform(0.5, 1.5, n) if weighted else np.ones(n)
    return parent, weights


def tree_exp_problem(n: int, seed: int) -> Problem:
    parent, weights = random_forest(n, seed)
    return favor_problem(n, seed, parent=parent, weights=weights, a=np.float64(TREE_A), b=np.float64(TREE_B))


def _tree_exp_dense(p: Problem) -> np.ndarray:
    adj = ref_tree.forest_adjacency(p.extras["parent"], weights=p.extras["weights"])
    return ref_tree.exp_affine_mask(adj, float(p.extras["a"]), float(p.extras["b"]))


def _tree_exp_fast(p: Problem, device) -> TreeExpMask:
    forest = Forest.from_parent(p.extras["parent"], p.extras["weights"])
    return TreeExpMask(forest, float(p.extras["a"]), float(p.extras["b"]))


register(Mechanism(
    id="tree-exp", title="Tree mask exp(a dist + b), two-phase recursion", source="choromanski22 Lemma 3.5",
    complexity="N", make_problem=tree_exp_problem, reference=lambda p: favor_reference(p, _tree_exp_dense(p)),
    fast_setup=favor_fast_setup(_tree_exp_fast), dense_setup=favor_dense_setup(_tree_exp_dense),
    dense_mask=_tree_exp_dense,
    notes=f"Weighted random recursive forest, a = {TREE_A}, b = {TREE_B}; corrected Eqs. 11, 15, 16.",
))
