"""TreeExpMask: M_ij = exp(a dist(i, j) + b) on a weighted forest (choromanski22 Lemma 3.5; docs/papers.md Sec. 2).

O(N c) per product, two passes over the levels of the ``Forest``:
    phase I (bottom-up)  s_i = e^b x_i + sum_{c child of i} e^{a w(i,c)} s_c
    phase II (top-down)  w_root = s_root,  w_i = e^{a w(i,p)} w_p + (1 - e^{2 a w(i,p)}) s_i
so that w_i = sum_j exp(a dist(i, j) + b) x_j. (The printed Eqs. 11, 15, 16 drop the factor a
in the exponents; that recursion is wrong, see verify's choromanski22/lemma-3.5.)
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from fast.masks.base import SymmetricMaskOperator
from fast.masks.tree.forest import Forest, check_forest
from fast.validation import check_tokens, compute_dtype


class TreeExpMask(SymmetricMaskOperator):
    """M_ij = exp(a dist(i, j) + b) within each tree of ``forest``, 0 across trees (Lemma 3.5).

    a, b: real numbers. a < 0 (decay with distance) is the stable case. For a > 0 the recursion
    multiplies by e^{a w} going down and subtracts (1 - e^{2 a w}) s_i: relative round-off grows
    like exp(2 a H) (H the weighted height), and e^{a H} overflows for large a H. The operator
    refuses a > 0 when u exp(2 a H) > ``max_amplified_roundoff`` (default 1e-6, u the unit
    round-off of float64; float32 inputs are computed in float64 then) rather than return noise.
    """

    def __init__(self, forest: Forest, a: float, b: float = 0.0, *, max_amplified_roundoff: float = 1e-6):
        check_forest(forest)
        for name, val in (("a", a), ("b", b)):
            if isinstance(val, bool) or not isinstance(val, numbers.Real) or not math.isfinite(val):
                raise ValueError(f"{name} must be a finite real number, got {val!r}")
        self.forest, self.a, self.b = forest, float(a), float(b)
        self.n = forest.n
        amplification = 2 * self.a * forest.weighted_height
        if self.a > 0 and amplification + math.log(np.finfo(np.float64).eps / 2) > math.log(max_amplified_roundoff):
            raise ValueError(
                f"a = {a} > 0 on a tree of weighted height {forest.weighted_height:.3g}: the top-down phase amplifies "
                f"round-off by exp(2 a H) = e^{amplification:.1f}, beyond max_amplified_roundoff={max_amplified_roundoff} "
                "(float64). Use a <= 0, a shallower rooting, or the dense reference.")
        self._factors: dict = {}
        # a > 0 needs float64 even for float32 inputs (see the class docstring)
        self._min_dtype = torch.float64 if self.a > 0 else None

    def _edge_factors(self, device, dtype):
        key = (str(device), dtype)
        if key not in self._factors:
            w = torch.as_tensor(self.forest.weight, device=device, dtype=dtype)
            down = torch.exp(self.a * w)  # e^{a w(i, p)}
            self._factors[key] = (down.unsqueeze(-1), (-torch.expm1(2 * self.a * w)).unsqueeze(-1))
        return self._factors[key]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): two passes over the levels, O(n c) work."""
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        work = compute_dtype(x.dtype) if self._min_dtype is None else self._min_dtype
        f = self.forest
        parent_pos = f.tensors(x.device)["parent_pos"]
        down, keep = self._edge_factors(x.device, work)
        s = f.to_level_order(x.to(work)) * math.exp(self.b)  # phase I starts from e^b x_i
        levels = f.levels()
        for _, lo, hi in reversed(levels[1:]):  # deepest level first: children into parents
            s.index_add_(-2, parent_pos[lo:hi], s[..., lo:hi, :] * down[lo:hi])
        w = torch.empty_like(s)
        _, lo0, hi0 = levels[0]
        w[..., lo0:hi0, :] = s[..., lo0:hi0, :]  # roots: their subtree is their tree
        for _, lo, hi in levels[1:]:
            w[..., lo:hi, :] = down[lo:hi] * w.index_select(-2, parent_pos[lo:hi]) + keep[lo:hi] * s[..., lo:hi, :]
        return f.from_level_order(w).to(out_dtype)
