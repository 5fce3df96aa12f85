"""Registry records: tree-exp, tree-dc, tree-diam (choromanski22 Lemma 3.5, 6.1, 6.2; docs/papers.md Sec. 2).

Problems are FAVOR+ attention (favor_problem) with a tree-distance mask on a random forest whose
parent array and edge lengths live in problem.extras, so reference/ (dense csgraph distances)
and fast/ (the level-order recursion) build the same mask.
"""
from __future__ import annotations

import numpy as np

import torch

from fast.masks.tree import Forest, TreeDCMask, TreeDiamMask, TreeExpMask, forest_diameter
from reference.masks import tree as ref_tree
from verify.mechanisms.sequence import favor_dense_setup, favor_fast_setup, favor_problem, favor_reference
from verify.problems import (MIXED_KINDS, TREE_FAMILIES, Problem, component_sizes, mixed_forest,  # noqa: F401
                             random_forest, rng_for, tree_parent)
from verify.registry import Mechanism, register

TREE_A = -0.3  # f(z) = exp(a z + b): decay with distance (the stable sign, Lemma 3.5)
TREE_B = 0.2
#: Quick sweeps stop at 2^15 (fast) and 2^12 (dense): three tree mechanisms must fit verify --quick.
QUICK = dict(quick_fast_sizes=tuple(2**p for p in range(8, 16)), quick_dense_sizes=tuple(2**p for p in range(7, 13)))



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
    dense_mask=_tree_exp_dense, **QUICK,
    notes=f"Weighted random recursive forest, a = {TREE_A}, b = {TREE_B}; corrected Eqs. 11, 15, 16.",
))


# ------------------------------------------------------------------ any f: tree-dc, tree-diam


def tree_f(n: int) -> np.ndarray:
    """f(l) = (1 + l)^-1.5: positive, and not exp-affine (so only Lemma 6.1/6.2 apply)."""
    return (1.0 + np.arange(n)) ** -1.5


def _any_f_problem(max_chain):
    def make(n: int, seed: int) -> Problem:
        return favor_problem(n, seed, parent=mixed_forest(n, seed, max_chain), f=tree_f(n))
    return make


def _any_f_dense(p: Problem) -> np.ndarray:
    return ref_tree.tree_mask(ref_tree.forest_adjacency(p.extras["parent"]), p.extras["f"])


def _any_f_fast(cls):
    def make(p: Problem, device):
        return cls(Forest.from_parent(p.extras["parent"]), torch.as_tensor(p.extras["f"], device=device))
    return make


#: tree-diam's path and caterpillar components are capped so the forest's diameter is O(log N)
#: (binary and random trees): its sweep then measures O(N log N); paths are lemma-6.2's business.
DIAM_CHAIN = 16


def tree_diameter(p: Problem) -> float:
    """diam of the problem's forest (edges), for the "N diam" complexity class."""
    return float(max(1, forest_diameter(Forest.from_parent(p.extras["parent"]))))


register(Mechanism(
    id="tree-dc", title="Tree mask f(dist), separator divide and conquer + FFT Hankel", source="choromanski22 Lemma 6.1",
    complexity="N log^2 N", make_problem=_any_f_problem(None), reference=lambda p: favor_reference(p, _any_f_dense(p)),
    fast_setup=favor_fast_setup(_any_f_fast(TreeDCMask)), dense_setup=favor_dense_setup(_any_f_dense),
    dense_mask=_any_f_dense, **QUICK,
    notes="Mixed forest (path, star, caterpillar, binary, random trees), f(l) = (1 + l)^-1.5.",
))
register(Mechanism(
    id="tree-diam", title="Tree mask f(dist), depth arrays", source="choromanski22 Lemma 6.2",
    complexity="N diam", make_problem=_any_f_problem(DIAM_CHAIN), reference=lambda p: favor_reference(p, _any_f_dense(p)),
    fast_setup=favor_fast_setup(_any_f_fast(TreeDiamMask)), dense_setup=favor_dense_setup(_any_f_dense),
    dense_mask=_any_f_dense, cost_factor=tree_diameter, cost_factor_name="diam", **QUICK,
    notes=f"Mixed forest with path and caterpillar capped at {DIAM_CHAIN} nodes (diam O(log N)), f(l) = (1 + l)^-1.5.",
))
