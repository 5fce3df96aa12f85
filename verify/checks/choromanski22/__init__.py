"""Claims of choromanski22 (choromanski22/<claim>), one module per part of the paper.

- positional: Toeplitz, hypercube and stochastic-RPE masks (Sec. 3.2, 3.4, 4.1);
- tree: tree masks (Sec. 3.3, 6);
- graph: graph-kernel masks, diffusion and RWGNK (Sec. 4, 4.2).
"""
from __future__ import annotations

from results.check import Check


def checks() -> list[Check]:
    """The checks of choromanski22, positional, tree and graph claims in that order.

    >>> from verify.checks.choromanski22 import checks
    >>> [c.id for c in checks()][:2]
    ['choromanski22/lemma-3.3', 'choromanski22/section-4.1']
    """
    from verify.checks.choromanski22 import graph, positional, tree

    return [*positional.checks(), *tree.checks(), *graph.checks()]
