"""Sequence masks: causal, packing, padding (choromanski22 Sec. 3.1, Fig. 2), dense (N, N).

(The 2022 paper's Fig. 2 caption swaps the labels "padding" and "packing".)
"""
from __future__ import annotations

import numpy as np

from reference.budget import check_dense_budget


def causal_mask(n: int) -> np.ndarray:
    """M_ij = 1 if j <= i else 0, shape (n, n)."""
    check_dense_budget(n, "causal mask")
    return np.tril(np.ones((n, n)))


def packing_mask(segment_ids: np.ndarray) -> np.ndarray:
    """M_ij = 1 if segment_ids[i] == segment_ids[j]: no attention across packed sequences.

    segment_ids: (..., N) integers -> (..., N, N).
    """
    s = np.asarray(segment_ids)
    check_dense_budget(s.shape[-1], "packing mask")
    return (s[..., :, None] == s[..., None, :]).astype(np.float64)


def padding_mask(key_mask: np.ndarray) -> np.ndarray:
    """M_ij = 1 if key j is real: (..., N) bool -> (..., N, N). Every query sees only real keys."""
    km = np.asarray(key_mask, dtype=bool)
    n = km.shape[-1]
    check_dense_budget(n, "padding mask")
    return np.broadcast_to(km[..., None, :], km.shape[:-1] + (n, n)).astype(np.float64)
