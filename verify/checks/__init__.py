"""Check families. Each module exposes ``checks() -> list[Check]``; the runner collects them all.

Generic families, named by kind, hold one check per registered mechanism (``check_for(mech)``):
equivalence, guards, numerics, reproducibility, complexity, perf, scale; features holds one row
per random feature map; layers one check per nn.Module layer of fast.latent.layers; sampling one
per sampler that fast/ calls on its own (walks, Gumbel noise, the projections NodeFormerConv draws);
numerics also holds value-overflow (every driver and mask product at values near the dtype's
maximum, whose intermediate sums overflow, against the exact result). Paper claims are named after their
paper, as their check ids are: choromanski22 (a subpackage: positional, tree and graph claims),
reid25, wu22, performer. distributed holds one check per sharded case of verify.sharding (sharded
attention on 2 and 4 gloo ranks against one process).
"""
from __future__ import annotations

from results.check import Check


def all_checks() -> list[Check]:
    """Every check of every family, in a stable order."""
    from verify.checks import (choromanski22, complexity, distributed, equivalence, features, guards, layers, numerics,
                               perf, performer, reid25, reproducibility, sampling, scale, wu22)

    out: list[Check] = []
    for family in (equivalence, layers, guards, numerics, reproducibility, sampling, performer, features,
                   choromanski22, reid25, wu22, distributed, complexity, perf, scale):
        out.extend(family.checks())
    return out
