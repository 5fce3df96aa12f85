"""reference/budget.py: a too-large dense problem is refused with a clear MemoryError."""
from __future__ import annotations

import numpy as np
import pytest

from reference import budget
from reference.attention import masked_kernel_attention, softmax_attention
from reference.masks.sequence import causal_mask, packing_mask, padding_mask


def test_default_budget(monkeypatch):
    monkeypatch.delenv("MASKBENCH_REFERENCE_BUDGET", raising=False)
    assert budget.dense_budget() == budget.DEFAULT_BUDGET == 2 * 1024**3
    budget.check_dense_budget(16384)  # 16384^2 * 8 B = exactly 2 GiB: allowed
    with pytest.raises(MemoryError, match="N=16385"):
        budget.check_dense_budget(16385)


def test_budget_from_environment_boundary(monkeypatch):
    monkeypatch.setenv("MASKBENCH_REFERENCE_BUDGET", str(8 * 10 * 10))  # one 10 x 10 float64 matrix
    assert budget.dense_budget() == 800
    budget.check_dense_budget(10)
    with pytest.raises(MemoryError, match=r"N=11.*MASKBENCH_REFERENCE_BUDGET"):
        budget.check_dense_budget(11)
    with pytest.raises(MemoryError, match="N=10"):
        budget.check_dense_budget(10, copies=2)


def test_reference_functions_refuse_above_budget(monkeypatch):
    monkeypatch.setenv("MASKBENCH_REFERENCE_BUDGET", str(8 * 10 * 10))
    x = np.ones((11, 2))
    for call in (lambda: causal_mask(11), lambda: packing_mask(np.zeros(11, int)),
                 lambda: padding_mask(np.ones(11, bool)), lambda: masked_kernel_attention(x, x, x),
                 lambda: softmax_attention(x, x, x)):
        with pytest.raises(MemoryError, match="reference refuses N=11"):
            call()
    assert causal_mask(10).shape == (10, 10)  # below the budget it works
