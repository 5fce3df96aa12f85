"""tree_mask_operator: the choice between Lemma 6.2 and Lemma 6.1 by the diameter (choromanski22 Cor. 6.4)."""
from __future__ import annotations

import math

from fast.masks.tree.diam import TreeDiamMask
from fast.masks.tree.forest import Forest, FTable, check_unweighted, forest_diameter
from fast.masks.tree.separator import TreeDCMask


def tree_mask_operator(forest: Forest, f: FTable, *, method: str = "auto") -> TreeDiamMask | TreeDCMask:
    """M_ij = f(dist(i, j)) on an unweighted forest as an operator: TreeDiamMask or TreeDCMask.

    f: (n,) f(0), ..., f(n - 1). method: "diam" (Lemma 6.2, O(n diam c)), "dc" (Lemma 6.1,
    O(n log^2 n c)) or "auto": by Cor. 6.4 the diameter algorithm when diam <= log2(n)^2, else the
    separator recursion (diam by two BFS passes, O(n)). ValueError naming method for another value;
    the masks' own errors for the forest and f.

    >>> import torch
    >>> from fast import Forest, tree_mask_operator
    >>> path = Forest.from_parent([-1] + list(range(15)))                    # diameter 15 <= log2(16)^2
    >>> type(tree_mask_operator(path, torch.ones(16))).__name__
    'TreeDiamMask'
    """
    if method not in ("auto", "diam", "dc"):
        raise ValueError(f"method must be 'auto', 'diam' or 'dc', got {method!r}")
    if method == "auto":
        check_unweighted(forest, "tree_mask_operator")
        method = "diam" if forest_diameter(forest) <= math.log2(forest.n) ** 2 else "dc"
    return TreeDiamMask(forest, f) if method == "diam" else TreeDCMask(forest, f)
