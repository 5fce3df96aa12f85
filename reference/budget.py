"""A memory budget for dense matrices, so that a too-large problem is refused, not OOM-killed."""
from __future__ import annotations

import os

from reference._checks import integer

#: Default budget for one dense N x N float64 matrix (bytes). Override with the environment
#: variable MASKBENCH_REFERENCE_BUDGET (bytes).
DEFAULT_BUDGET = 2 * 1024**3

#: The environment variable that overrides DEFAULT_BUDGET.
BUDGET_VARIABLE = "MASKBENCH_REFERENCE_BUDGET"


def dense_budget() -> int:
    """The byte budget for one dense matrix: env MASKBENCH_REFERENCE_BUDGET or 2 GiB.

    The variable holds a positive whole number of bytes in decimal ("4294967296"; underscores and
    surrounding spaces allowed); unset or empty means the default.

    Raises:
        ValueError: a malformed value (naming the variable and the value), e.g. "2GiB", "1.5", "-1", "0".

    O(1). The default is 2 GiB; whatever the variable says, the budget is a positive int:

        >>> from reference.budget import DEFAULT_BUDGET, dense_budget
        >>> DEFAULT_BUDGET == 2 * 1024**3, dense_budget() > 0
        (True, True)
    """
    raw = os.environ.get(BUDGET_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_BUDGET
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ValueError(f"the environment variable {BUDGET_VARIABLE} must be a positive whole number of bytes "
                         f"(e.g. {DEFAULT_BUDGET} for 2 GiB), got {raw!r}")
    return value


def check_dense_budget(n: int, what: str = "dense N x N matrix", copies: int = 1) -> None:
    """Raise MemoryError if ``copies`` float64 N x N matrices would exceed the budget.

    Raises:
        MemoryError: naming N, the bytes needed and the budget.
        TypeError, ValueError: n not an int >= 0, copies not an int >= 1, a malformed
            MASKBENCH_REFERENCE_BUDGET.

    O(1): it allocates nothing. Under the default 2 GiB budget N = 1000 passes (8 MB) and N = 10^6
    (8 TB) does not:

        >>> from reference.budget import check_dense_budget
        >>> check_dense_budget(1000) is None
        True
        >>> check_dense_budget(10**6, "causal mask")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        MemoryError: reference refuses N=1000000: the causal mask needs ... GiB, over the budget of ...
    """
    n = integer("n", n, minimum=0)
    copies = integer("copies", copies, minimum=1)
    need = copies * 8 * n * n
    budget = dense_budget()
    if need > budget:
        raise MemoryError(
            f"reference refuses N={n}: the {what} needs {need / 2**30:.2f} GiB, over the "
            f"budget of {budget / 2**30:.2f} GiB (set {BUDGET_VARIABLE} to raise it)"
        )
