"""The mechanism registry: one record per mechanism; tests, verify, asv and reports iterate it.

Register a new mechanism once (``register(Mechanism(...))``) in the module of its family and it
appears everywhere. Ids are stable (DESIGN.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

#: Complexity classes a fast path can claim (DESIGN.md).
COMPLEXITY_CLASSES = ("N", "N log N", "N log^2 N", "N diam", "N^2")

Runner = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class Mechanism:
    """One mechanism: how to make inputs, the dense truth, the fast path and its dense twin.

    make_problem(n, seed) -> Problem: deterministic NumPy inputs.
    reference(problem) -> ndarray: float64, dense.
    fast_setup(problem, device, dtype) -> runner: converts inputs and builds the mask operator
        (untimed); calling runner() computes the output (timed), a Tensor of reference's shape.
    dense_setup: the same for the O(N^2) torch twin (None where the mechanism is dense itself).
    dense_mask(problem) -> (N, N) ndarray for the mask gallery, or None.
    fast_sizes / dense_sizes: N grids for sweeps (powers of two, METHODS.md).
    size_rule(n) -> the largest admissible N <= n, for mechanisms defined only at some N (the
        hypercube needs 2^k); None: every N >= 1. Use ``admissible(n)`` before make_problem
        wherever N is not from the mechanism's own grids.
    extra_factor(problem) -> float: for complexity "N diam", the problem's diameter; the
        complexity check fits time / extra_factor against N (class N).
    """

    id: str
    title: str
    source: str
    complexity: str
    make_problem: Callable
    reference: Callable
    fast_setup: Callable[..., Runner]
    dense_setup: Callable[..., Runner] | None = None
    dense_mask: Callable | None = None
    exact: bool = True
    fast_sizes: tuple[int, ...] = tuple(2**p for p in range(7, 18))
    dense_sizes: tuple[int, ...] = tuple(2**p for p in range(7, 15))
    quick_fast_sizes: tuple[int, ...] = tuple(2**p for p in range(7, 17))
    quick_dense_sizes: tuple[int, ...] = tuple(2**p for p in range(7, 14))
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    size_rule: Callable[[int], int] | None = None
    extra_factor: Callable | None = None

    def __post_init__(self):
        if self.complexity not in COMPLEXITY_CLASSES:
            raise ValueError(f"complexity must be one of {COMPLEXITY_CLASSES}, got {self.complexity!r}")
        if (self.complexity == "N diam") != (self.extra_factor is not None):
            raise ValueError("complexity 'N diam' needs extra_factor (the diameter), and only it")

    def admissible(self, n: int) -> int:
        """The N to use for a requested n: n itself unless ``size_rule`` says otherwise."""
        return n if self.size_rule is None else self.size_rule(n)

    def fast(self, problem, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Run the fast path once on ``problem``."""
        return self.fast_setup(problem, device, dtype)()

    def dense(self, problem, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Run the dense torch twin once (ValueError if there is none)."""
        if self.dense_setup is None:
            raise ValueError(f"mechanism {self.id!r} has no dense twin (it is dense itself)")
        return self.dense_setup(problem, device, dtype)()


_REGISTRY: dict[str, Mechanism] = {}


def register(mech: Mechanism) -> Mechanism:
    """Add a mechanism; ids are unique."""
    if mech.id in _REGISTRY:
        raise ValueError(f"mechanism id {mech.id!r} is already registered")
    _REGISTRY[mech.id] = mech
    return mech


def _load_families() -> None:
    # Importing a family module registers its mechanisms. One line per family.
    import verify.mechanisms.sequence  # noqa: F401
    import verify.mechanisms.positional  # noqa: F401
    import verify.mechanisms.tree  # noqa: F401


def mechanisms() -> list[Mechanism]:
    """All registered mechanisms, in registration order."""
    _load_families()
    return list(_REGISTRY.values())


def get(mech_id: str) -> Mechanism:
    """The mechanism with this id (KeyError listing the known ids)."""
    _load_families()
    try:
        return _REGISTRY[mech_id]
    except KeyError:
        raise KeyError(f"unknown mechanism {mech_id!r}; known: {', '.join(_REGISTRY)}") from None


def relative_error(reference: np.ndarray, candidate) -> float:
    """Relative Frobenius error |c - r|_F / |r|_F (never a per-entry max ratio, NOTES.md Sec. 5)."""
    c = candidate.detach().cpu().double().numpy() if isinstance(candidate, torch.Tensor) else np.asarray(candidate)
    r = np.asarray(reference, dtype=np.float64)
    if c.shape != r.shape:
        raise ValueError(f"shape mismatch: reference {r.shape} vs candidate {c.shape}")
    return float(np.linalg.norm(c - r) / max(np.linalg.norm(r), np.finfo(float).tiny))
