"""Dense torch twins: the O(N^2) computation in the same framework and dtype as fast/.

Used for the complexity charts and crossover N (a fair race needs one framework on both sides);
they live in verify/ because fast/ never builds an N x N matrix.
"""
from __future__ import annotations

import torch


def dense_masked_attention(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """out = (M ⊙ phi_q phi_k^T) v / (M ⊙ phi_q phi_k^T) 1; mask (N, N) or None. O(N^2 (m + d))."""
    a = phi_q @ phi_k.transpose(-1, -2)
    if mask is not None:
        a = a * mask
    return (a @ v) / a.sum(-1, keepdim=True)
