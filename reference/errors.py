"""Errors raised by reference/ (NumPy only; fast/ has its own, fast.DenominatorError)."""
from __future__ import annotations


class DenominatorError(ArithmeticError):
    """A normalised attention row has no denominator: it sees no key (its mask row is all zero, or
    every logit is -inf), or its masked kernel sums to exactly 0 for another reason.

    A subclass of ArithmeticError, as ZeroDivisionError is, so ``except ArithmeticError`` catches
    both. Rows that see no key can be given exactly 0 instead with ``no_key="zero"``.
    """
