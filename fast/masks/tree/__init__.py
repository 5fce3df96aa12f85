"""Tree-distance masks M_ij = f(dist_T(i, j)) as operators (choromanski22 Sec. 3.3, 6; docs/papers.md Sec. 2).

    forest.py          Forest (a rooted forest in level order), forest_diameter, shared checks
    exp.py             TreeExpMask: f(z) = exp(a z + b) on weighted forests, O(N c) (Lemma 3.5)
    diam.py            TreeDiamMask: any f on unweighted forests, O(N diam c) (Lemma 6.2)
    separator_plan.py  SeparatorPlan: the NumPy plan of the separator recursion (no torch)
    separator.py       TreeDCMask: any f on unweighted forests, O(N log^2 N c) (Lemma 6.1)
    select.py          tree_mask_operator: Lemma 6.2 or 6.1 by the diameter (Cor. 6.4)

Entries between different trees are 0, so every tree mask's ``key_stabilizer`` is the max over
each tree's keys (``Forest.key_stabilizer``). ``nonnegative``: TreeExpMask always; TreeDiamMask
and TreeDCMask when f >= 0 (read from f at each call).
"""
from fast.masks.tree.diam import TreeDiamMask
from fast.masks.tree.exp import TreeExpMask
from fast.masks.tree.forest import (
    DEFAULT_MAX_CHUNK_BYTES,
    Forest,
    FTable,
    forest_diameter,
)
from fast.masks.tree.select import tree_mask_operator
from fast.masks.tree.separator import TreeDCMask
from fast.masks.tree.separator_plan import (
    DEFAULT_DENSE_THRESHOLD,
    HANKEL_DENSE_RATIO,
    SeparatorPlan,
)

__all__ = [
    "Forest", "TreeExpMask", "TreeDiamMask", "TreeDCMask", "SeparatorPlan", "forest_diameter",
    "tree_mask_operator", "FTable", "DEFAULT_MAX_CHUNK_BYTES", "DEFAULT_DENSE_THRESHOLD", "HANKEL_DENSE_RATIO",
]
