"""Dense attention, float64 (choromanski22 Def. 2.1 and Eq. 2).

Shapes: q, k (..., N, d_qk); v (..., N, d); masks (N, N) or broadcastable (..., N, N).
"""
from __future__ import annotations

import numpy as np

from reference.budget import check_dense_budget


def softmax_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, logits_mask: np.ndarray | None = None
) -> np.ndarray:
    """Att = D^-1 A V, A = exp(logits_mask + Q K^T / sqrt(d_qk)), D = diag(A 1).

    logits_mask: additive, (N, N) or broadcastable; -inf excludes a pair.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    check_dense_budget(q.shape[-2], "softmax logits", copies=2)
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if logits_mask is not None:
        logits = logits + logits_mask
    logits = logits - logits.max(axis=-1, keepdims=True)  # row-wise: cancels in D^-1 A
    a = np.exp(logits)
    return (a @ v) / a.sum(axis=-1, keepdims=True)


def masked_kernel_attention(
    phi_q: np.ndarray, phi_k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    """Masked kernel attention with the feature kernel (choromanski22 Eq. 2, Algorithm 1 identity).

    out_i = sum_j M_ij (phi_q_i . phi_k_j) v_j / sum_j M_ij (phi_q_i . phi_k_j).

    phi_q, phi_k: (..., N, m); v: (..., N, d); mask: (N, N) (broadcast) or None for all ones.
    This is the obviously right O(N^2 m) form that fast.masked_linear_attention must equal.
    """
    phi_q, phi_k, v = (np.asarray(a, dtype=np.float64) for a in (phi_q, phi_k, v))
    check_dense_budget(phi_q.shape[-2], "masked kernel matrix", copies=2)
    a = phi_q @ np.swapaxes(phi_k, -1, -2)
    if mask is not None:
        a = a * mask  # Hadamard product, never a matrix product
    den = a.sum(axis=-1, keepdims=True)
    if np.any(den == 0):
        raise ZeroDivisionError("masked kernel attention: a row of the masked kernel sums to 0")
    return (a @ v) / den
