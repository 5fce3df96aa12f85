"""Errors raised by reference/ (NumPy only; fast/ has its own, fast.DenominatorError)."""
from __future__ import annotations


class DenominatorError(ArithmeticError):
    """A normalised attention row has no denominator: it sees no key (its mask row is all zero, or
    every logit is -inf), or its masked kernel sums to exactly 0 for another reason.

    A subclass of ArithmeticError, as ZeroDivisionError is, so ``except ArithmeticError`` catches
    both. Rows that see no key can be given exactly 0 instead with ``no_key="zero"``.

        >>> import numpy as np
        >>> from reference import DenominatorError, masked_kernel_attention
        >>> try:
        ...     masked_kernel_attention(np.ones((2, 1)), np.ones((2, 1)), np.ones((2, 1)), np.zeros((2, 2)))
        ... except DenominatorError as e:
        ...     print(type(e).__name__, isinstance(e, ArithmeticError))
        DenominatorError True
    """
