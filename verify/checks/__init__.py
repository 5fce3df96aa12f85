"""Check families. Each module exposes ``checks() -> list[Check]``; the runner collects them all."""
from __future__ import annotations

from verify.result import Check


def all_checks() -> list[Check]:
    """Every check of every family, in a stable order."""
    from verify.checks import (complexity, equivalence, features, graph, grf, guards, latent, numerics, perf,
                               performer, positional, reproducibility, scale, tree)

    out: list[Check] = []
    for family in (equivalence, guards, numerics, reproducibility, performer, features, positional, tree, graph, grf,
                   latent, complexity, perf, scale):
        out.extend(family.checks())
    return out
