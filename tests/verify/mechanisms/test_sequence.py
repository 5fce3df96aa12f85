"""verify/mechanisms/sequence.py: the problems of the sequence records are what they claim."""
from __future__ import annotations

import numpy as np
import pytest

from reference.masks import sequence as ref_masks
from verify.mechanisms import sequence as S
from verify.mechanisms import get


@pytest.mark.parametrize("n", [1, 2, 300, 1100])
def test_packing_problem_segments(n):
    p = S.packing_problem(n, seed=3)
    ids = p.extras["segment_ids"]
    assert ids.shape == (n,) and ids[0] == 0
    assert np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1)  # contiguous, consecutive labels
    assert ids.max() + 1 == max(min(n, 4), n // 256)  # one per 256 tokens, at least min(n, 4)
    np.testing.assert_array_equal(get("packing").dense_mask(p), ref_masks.packing_mask(ids))


@pytest.mark.parametrize("n", [1, 10, 500])
def test_padding_problem_keeps_a_60_to_90_percent_prefix(n):
    p = S.padding_problem(n, seed=4)
    km = p.extras["key_mask"]
    length = int(km.sum())
    assert km.dtype == bool and np.array_equal(km, np.arange(n) < length)
    assert length >= 1
    if n >= 10:
        assert 0.6 * n - 0.5 <= length <= 0.9 * n + 0.5
