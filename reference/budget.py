"""A memory budget for dense matrices, so that a too-large problem is refused, not OOM-killed."""
from __future__ import annotations

import os

#: Default budget for one dense N x N float64 matrix (bytes). Override with the environment
#: variable MASKBENCH_REFERENCE_BUDGET (bytes).
DEFAULT_BUDGET = 2 * 1024**3


def dense_budget() -> int:
    """The byte budget for one dense matrix (env MASKBENCH_REFERENCE_BUDGET or 2 GiB)."""
    raw = os.environ.get("MASKBENCH_REFERENCE_BUDGET")
    return int(raw) if raw else DEFAULT_BUDGET


def check_dense_budget(n: int, what: str = "dense N x N matrix", copies: int = 1) -> None:
    """Raise MemoryError if ``copies`` float64 N x N matrices would exceed the budget.

    Raises:
        MemoryError: naming N, the bytes needed and the budget.
    """
    need = copies * 8 * int(n) * int(n)
    budget = dense_budget()
    if need > budget:
        raise MemoryError(
            f"reference refuses N={n}: the {what} needs {need / 2**30:.2f} GiB, over the "
            f"budget of {budget / 2**30:.2f} GiB (set MASKBENCH_REFERENCE_BUDGET to raise it)"
        )
