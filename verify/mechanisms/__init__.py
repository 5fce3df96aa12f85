"""The loader: importing this package registers every mechanism family (one module each).

    from verify.mechanisms import mechanisms, get

verify.registry holds the record types and the store and imports no family, so there is no
import cycle: family modules import verify.registry, this package imports the families.
A new family adds one import line below.
"""
from __future__ import annotations

from verify.mechanisms import sequence, tree, positional, graph, latent  # noqa: F401  (registration side effects; this order is the ids' order)
from verify.registry import Mechanism, lookup, registered


def mechanisms() -> list[Mechanism]:
    """Every registered mechanism, in registration order."""
    return registered()


def get(mech_id: str) -> Mechanism:
    """The mechanism with this id (KeyError listing the known ids)."""
    return lookup(mech_id)


__all__ = ["mechanisms", "get"]
