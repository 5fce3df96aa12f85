"""Tree-distance masks M_ij = f(dist_T(i, j)) as operators (choromanski22 Sec. 3.3, 6; docs/papers.md Sec. 2).

One data structure and three algorithms, a module each:

    forest.py          Forest (a rooted forest in level order; from a parent array, an edge_index or
                       a scipy adjacency), forest_diameter, the argument checks the masks share
    exp.py             TreeExpMask: f(z) = exp(a z + b) on weighted forests, O(N c) (Lemma 3.5)
    diam.py            TreeDiamMask: any f on unweighted forests, O(N diam c) (Lemma 6.2)
    separator_plan.py  SeparatorPlan: the NumPy plan of the separator recursion (no torch)
    separator.py       TreeDCMask: any f on unweighted forests, O(N log^2 N c), the torch product
                       of a SeparatorPlan (Lemma 6.1)
    select.py          tree_mask_operator: Lemma 6.2 or 6.1 by the diameter (Cor. 6.4)

Entries between different trees of a forest are 0, so a query sees the keys of its own tree
only: every tree mask's ``key_stabilizer`` is the max over each tree's keys
(``Forest.key_stabilizer``), exact as trees never mix, and a quiet tree is never underflowed
by a loud one. ``nonnegative``: TreeExpMask always; TreeDiamMask and TreeDCMask when f >= 0
(read from f at each call). The token input of every ``matmul`` is checked by
fast.validation.check_tokens, as on the Toeplitz and generic paths.
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
