"""Errors raised by fast/ (kept apart so every module below the drivers can raise them)."""
from __future__ import annotations


class DenominatorError(ArithmeticError):
    """An attention denominator den_i = phi_q_i^T sum_j M_ij phi_k_j that cannot be divided by.

    Raised instead of dividing (fast.algebra.divide), so no NaN, inf or round-off-sized quotient
    is produced quietly, where den_i

    - is not finite (the terms overflowed);
    - is zero or subnormal (below the dtype's smallest normal number: features that underflow
      on every visible key, or that are zero);
    - lies within round-off of zero relative to the terms it sums (they cancel: signed features
      such as TrigRFF or Identity, or a mask with negative entries; docs/papers.md, "fast.attention");
    - belongs to a query that sees no key (its mask row is all zero, e.g. a fully padded sample;
      a logits_mask row of all -inf for softmax_attention) while ``no_key="raise"`` (the
      default); the message says so and names ``no_key="zero"``, which outputs 0 there instead.

    The message says how many queries failed, which case, and what to do.

    >>> import torch
    >>> from fast import DenominatorError, linear_attention
    >>> try:                                   # phi_q = 0: every denominator is 0
    ...     linear_attention(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 1))
    ... except DenominatorError as error:
    ...     print(str(error).split(":")[0])
    attention denominator refused at 2 of 2 query positions
    """
