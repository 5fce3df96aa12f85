"""Errors raised by fast/ (kept apart so every module below the drivers can raise them)."""
from __future__ import annotations


class DenominatorError(ArithmeticError):
    """The attention denominator phi_q_i^T sum_j M_ij phi_k_j vanished or is not finite.

    Raised instead of dividing, so no NaN or inf is produced quietly. Typical causes: every key
    of a row masked out (a fully padded sample), features that underflow, a mask or feature map
    that is not positive.
    """
