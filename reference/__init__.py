"""Dense NumPy ground truth for every maskbench mechanism.

Everything here is float64, obvious and allowed to be O(N^2) or O(N^3). It never imports torch
and never imports ``fast``: the two implementations stay independent so that agreement means
something.
"""
from reference.attention import masked_kernel_attention, softmax_attention
from reference.budget import check_dense_budget
from reference.errors import DenominatorError

__all__ = ["masked_kernel_attention", "softmax_attention", "check_dense_budget", "DenominatorError"]
