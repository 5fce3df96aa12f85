"""TreeExpMask: M_ij = exp(a dist(i, j) + b) on a weighted forest (choromanski22 Lemma 3.5, with
the factor a the printed Eqs. 11, 15, 16 drop; docs/papers.md Sec. 2).

O(N c) per product: a bottom-up and a top-down pass over the levels of the ``Forest``, its sums
into parents accumulated in float64 through the forest's fast.segments plans (no atomic add on
CUDA). The recursion and its precision: docs/papers.md, fast.masks.tree.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from fast.algebra import default_block_cols, features_per_block, masked_products
from fast.operator import SymmetricMaskOperator
from fast.masks.tree.forest import Forest, check_forest
from fast.validation import compute_dtype

#: The dtype of phase I's sums (children into parents) of a TreeExpMask product, whatever the input dtype
#: (docs/papers.md, fast.masks.tree: "Precision of the tree products").
ACCUMULATE_DTYPE = torch.float64


class TreeExpMask(SymmetricMaskOperator):
    """M_ij = exp(a dist(i, j) + b) within each tree of ``forest``, 0 across trees (Lemma 3.5).

    forest: a ``Forest`` (weighted allowed); a, b: finite reals (TypeError / ValueError naming
    them). a < 0 (decay with distance) is the stable case; a > 0 amplifies round-off by
    exp(2 a H) (H the weighted height), so it is refused (ValueError) when u exp(2 a H) exceeds
    ``max_amplified_roundoff`` (default 1e-6) and computed in float64 otherwise. ``matmul`` (=
    ``rmatmul``) takes x (..., n, c), O(n c), and applies e^b last; ``attend`` leaves e^b out (it
    cancels), so attention works for every finite b. Sums accumulate in float64
    (``ACCUMULATE_DTYPE``; docs/papers.md, fast.masks.tree).

    >>> import torch
    >>> from fast import Forest, TreeExpMask
    >>> forest = Forest.from_parent([-1, 0, 1, 2], weights=[0.0, 1.0, 2.0, 0.5])   # a weighted path
    >>> where = torch.tensor([0.0, 1.0, 3.0, 3.5], dtype=torch.float64)             # distance from node 0
    >>> dense = torch.exp(-0.5 * (where[:, None] - where[None]).abs())
    >>> x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> torch.allclose(TreeExpMask(forest, a=-0.5).matmul(x), dense @ x)
    True
    """

    #: exp(...) > 0: every entry is positive (between trees 0).
    nonnegative = True

    def __init__(self, forest: Forest, a: float, b: float = 0.0, *, max_amplified_roundoff: float = 1e-6):
        check_forest(forest)
        for name, val in (("a", a), ("b", b), ("max_amplified_roundoff", max_amplified_roundoff)):
            if isinstance(val, bool) or not isinstance(val, numbers.Real):
                raise TypeError(f"{name} must be a finite real number, got {type(val).__name__} {val!r:.60}")
            if not math.isfinite(val):
                raise ValueError(f"{name} must be a finite real number, got {val!r}")
        if not max_amplified_roundoff > 0:
            raise ValueError(f"max_amplified_roundoff must be a positive number (the largest accepted relative "
                             f"round-off u exp(2 a H) for a > 0), got {max_amplified_roundoff!r}")
        self.forest, self.a, self.b = forest, float(a), float(b)
        self.max_amplified_roundoff = float(max_amplified_roundoff)
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

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-tree max of the FAVOR+ key exponents z (..., n, m) -> (..., n, 1) (Forest.key_stabilizer)."""
        return self.forest.key_stabilizer(z)

    def _edge_factors(self, device, dtype):
        key = (str(device), dtype)
        if key not in self._factors:
            w = torch.as_tensor(self.forest.weight, device=device, dtype=dtype)
            down = torch.exp(self.a * w)  # e^{a w(i, p)}
            self._factors[key] = (down.unsqueeze(-1), (-torch.expm1(2 * self.a * w)).unsqueeze(-1))
        return self._factors[key]

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): two passes over the levels, O(n c) work."""
        out_dtype = x.dtype
        work = compute_dtype(x.dtype) if self._min_dtype is None else self._min_dtype
        f = self.forest
        plans = f.level_plans()  # per level, the edges to the parents (fast.segments: no atomic add on CUDA)
        down, keep = self._edge_factors(x.device, work)
        # phase I on x (e^b is applied last), its sums in float64: no float32 atomic add (ACCUMULATE_DTYPE)
        s = f.to_level_order(x.to(ACCUMULATE_DTYPE))
        levels = f.levels()
        for k, lo, hi in reversed(levels[1:]):  # deepest level first: children into parents
            plans[k][1].add_into(s, s[..., lo:hi, :] * down[lo:hi], dim=-2)  # s.index_add_(-2, parent_pos, ...)
        s = s.to(work)
        w = torch.empty_like(s)
        _, lo0, hi0 = levels[0]
        w[..., lo0:hi0, :] = s[..., lo0:hi0, :]  # roots: their subtree is their tree
        for k, lo, hi in levels[1:]:
            w[..., lo:hi, :] = down[lo:hi] * plans[k][1].take(w, dim=-2) + keep[lo:hi] * s[..., lo:hi, :]
        if abs(self.b) <= 80.0:  # e^b last; it fits every compute dtype (float32 to e^88.7)
            w = w * math.exp(self.b) if self.b != 0.0 else w
        else:  # inf (or 0) only where M x itself overflows (underflows)
            w = _times_exp(w, self.b)
        return f.from_level_order(w).to(out_dtype)

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 for exp(a dist) (b left out: the products of M
        times the positive constant e^-b, which cancels in num / den), for phi_q, phi_k (..., N, m) and
        v (..., N, d): the generic blocked path (fast.algebra.masked_products, memory-lean backward
        through rmatmul = matmul) on the operator with b = 0, so that no b overflows or underflows.
        """
        unit = self if self.b == 0.0 else self._without_b()
        return masked_products(phi_q, phi_k, v, unit, features_per_block(default_block_cols(v), v.shape[-1]))

    def _without_b(self) -> "TreeExpMask":
        """This mask with b = 0 (same forest, a and cached factors), built once."""
        if getattr(self, "_unit", None) is None:
            unit = object.__new__(TreeExpMask)
            unit.__dict__.update(self.__dict__)
            unit.b, unit._unit = 0.0, None
            self._unit = unit
        return self._unit


def _times_exp(w: torch.Tensor, b: float) -> torch.Tensor:
    """w e^b in w's dtype without forming e^b (which overflows float64 from b ~ 709.8): in float64,
    by factors e^{+-700} (at most 3: a non-zero double times e^2100 overflows, times e^-2100 is 0),
    so entries that are 0 stay 0 (never 0 * inf) and the rest overflow or underflow only as w e^b does."""
    out = w.double()
    step = 700.0 if b > 0 else -700.0
    for _ in range(3):
        if abs(b) <= 700.0:
            break
        out, b = out * math.exp(step), b - step
    return (out * math.exp(max(-700.0, min(700.0, b)))).to(w.dtype)
