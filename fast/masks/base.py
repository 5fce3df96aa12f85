"""The MaskOperator protocol (after Scenic's Performer ``Mask.act``).

A mask operator stands for an N x N matrix M that is never built. It offers

    n: int                          the number of tokens N
    matmul(x) -> M @ x              x: (..., N, c) -> (..., N, c), sub-quadratic in N

and optionally

    attend(phi_q, phi_k, v) -> (num, den)
        num: (..., N, d) = sum_j M_ij (phi_q_i . phi_k_j) v_j
        den: (..., N)    = sum_j M_ij (phi_q_i . phi_k_j)

a specialised form of Algorithm 1 (e.g. the chunked causal scan) that
fast.masked_linear_attention prefers when present. It returns numerator and denominator
separately so that the driver guards the division in one place.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class MaskOperator(Protocol):
    """Anything with ``n`` and ``matmul``; see the module docstring."""

    n: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Return M @ x for x of shape (..., N, c)."""
        ...
