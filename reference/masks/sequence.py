"""Sequence masks: causal, packing, padding (choromanski22 Sec. 3.1, Fig. 2), dense (N, N).

(The 2022 paper's Fig. 2 caption swaps the labels "padding" and "packing".) O(N^2) each.
"""
from __future__ import annotations

import numpy as np

from reference._checks import describe, integer
from reference.budget import check_dense_budget


def causal_mask(n: int) -> np.ndarray:
    """M_ij = 1 if j <= i else 0, shape (n, n) float64; n an int >= 1 (choromanski22 Sec. 3.1).

    Raises TypeError for a non-int n (4.0 and True included), ValueError for n < 1, MemoryError
    over the dense budget. O(n^2).

        >>> from reference.masks.sequence import causal_mask
        >>> causal_mask(3).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    n = integer("n", n)
    check_dense_budget(n, "causal mask")
    return np.tril(np.ones((n, n)))


def packing_mask(segment_ids: np.ndarray) -> np.ndarray:
    """M_ij = 1 if segment_ids[i] == segment_ids[j]: no attention across packed sequences.

    segment_ids: (..., N) integers (any labels), N >= 1 -> (..., N, N) float64. Float ids are
    refused (TypeError; a NaN id would equal no id, not even its own), and so are bool ids;
    ValueError for N = 0 or a 0-d array; MemoryError over the dense budget. O(N^2) per slice.

        >>> from reference.masks.sequence import packing_mask
        >>> packing_mask([0, 0, 1]).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    s = np.asarray(segment_ids)
    if s.dtype.kind not in "iu":
        nan = " containing NaN (a NaN id equals no id, not even itself)" if s.dtype.kind == "f" and np.isnan(s).any() else ""
        raise TypeError(f"segment_ids must be an integer array of shape (..., N), got {describe(s)}{nan}")
    if s.ndim < 1 or s.shape[-1] == 0:
        raise ValueError(f"segment_ids must have shape (..., N) with N >= 1, got shape {s.shape}")
    check_dense_budget(s.shape[-1], "packing mask")
    return (s[..., :, None] == s[..., None, :]).astype(np.float64)


def padding_mask(key_mask: np.ndarray) -> np.ndarray:
    """M_ij = 1 if key j is real: (..., N) bool, N >= 1 -> (..., N, N). Every query sees only real keys.

    key_mask must be boolean (True = a real key); 0/1 numbers are refused (TypeError) as in
    fast.PaddingMask, so that a float mask of weights is not silently read as "nonzero = real".
    ValueError for N = 0 or a 0-d array; MemoryError over the dense budget. O(N^2) per slice.

        >>> from reference.masks.sequence import padding_mask
        >>> padding_mask([True, True, False]).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    """
    km = np.asarray(key_mask)
    if km.dtype != np.bool_:
        raise TypeError(f"key_mask must be a boolean array of shape (..., N) (True = a real key), got {describe(km)}")
    if km.ndim < 1 or km.shape[-1] == 0:
        raise ValueError(f"key_mask must have shape (..., N) with N >= 1, got shape {km.shape}")
    n = km.shape[-1]
    check_dense_budget(n, "padding mask")
    return np.broadcast_to(km[..., None, :], km.shape[:-1] + (n, n)).astype(np.float64)
