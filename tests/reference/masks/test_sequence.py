"""reference/masks/sequence.py: the dense masks are what their definitions say."""
from __future__ import annotations

import numpy as np

from reference.masks.sequence import causal_mask, packing_mask, padding_mask


def test_causal_mask():
    for n in (1, 2, 7):
        m = causal_mask(n)
        assert m.shape == (n, n) and m.dtype == np.float64
        for i in range(n):
            for j in range(n):
                assert m[i, j] == (1.0 if j <= i else 0.0)


def test_packing_mask_arbitrary_labels_and_batches():
    ids = np.array([[7, -3, 7, 100], [0, 0, 1, 1]])
    m = packing_mask(ids)
    assert m.shape == (2, 4, 4)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                assert m[b, i, j] == float(ids[b, i] == ids[b, j])
    np.testing.assert_array_equal(m, m.swapaxes(-1, -2))


def test_padding_mask_keeps_real_key_columns():
    km = np.array([[True, False, True], [False, False, True]])
    m = padding_mask(km)
    assert m.shape == (2, 3, 3)
    for b in range(2):
        for i in range(3):
            np.testing.assert_array_equal(m[b, i], km[b].astype(float))
    m[0, 0, 0] = 5.0  # a writable copy, not a read-only broadcast view
    assert padding_mask(km)[0, 0, 0] == 1.0
