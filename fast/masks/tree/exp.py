"""TreeExpMask: M_ij = exp(a dist(i, j) + b) on a weighted forest (choromanski22 Lemma 3.5; docs/papers.md Sec. 2).

O(N c) per product, two passes over the levels of the ``Forest``:
    phase I (bottom-up)  s_i = e^b x_i + sum_{c child of i} e^{a w(i,c)} s_c
    phase II (top-down)  w_root = s_root,  w_i = e^{a w(i,p)} w_p + (1 - e^{2 a w(i,p)}) s_i
so that w_i = sum_j exp(a dist(i, j) + b) x_j. (The printed Eqs. 11, 15, 16 drop the factor a
in the exponents; that recursion is wrong, see verify's choromanski22/lemma-3.5.) Each level's
sums into its parents and gathers from them go through the forest's fast.segments plans
(Forest.level_plans): no atomic add on CUDA, forward or backward (the same bits at every run).
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
#: (TreeExpMask's docstring, "Precision").
ACCUMULATE_DTYPE = torch.float64


class TreeExpMask(SymmetricMaskOperator):
    """M_ij = exp(a dist(i, j) + b) within each tree of ``forest``, 0 across trees (Lemma 3.5).

    a, b: real numbers. a < 0 (decay with distance) is the stable case. For a > 0 the recursion
    multiplies by e^{a w} going down and subtracts (1 - e^{2 a w}) s_i: relative round-off grows
    like exp(2 a H) (H the weighted height), and e^{a H} overflows for large a H. The operator
    refuses a > 0 when u exp(2 a H) > ``max_amplified_roundoff`` (a positive number, default
    1e-6, u the unit round-off of float64; float32 inputs are computed in float64 then) rather
    than return noise.

    b only scales every entry by e^b. ``matmul`` returns M x itself: it applies e^b last, so the
    result is inf only where M x itself overflows the dtype (e^b alone overflows float64 from
    b ~ 709.8, float32 from b ~ 88.7). ``attend`` (what masked_linear_attention and
    favor_attention use) leaves e^b out altogether: it cancels in num / den, so attention works
    for every finite b.

    Precision: phase I (children into parents; index_add_ on CPU, segment sums on CUDA, where
    index_add_ was an atomic add) accumulates in float64 (``ACCUMULATE_DTYPE``), phase II runs in
    the compute dtype. float32 atomic adds on
    CUDA flush subnormal inputs and results to zero (PTX ISA, atom/red.add.f32 without .noftz;
    float64 ones keep them): subtree sums of inputs below 2^-126 (FAVOR+ key features at large
    q, k span far more than float32's normal range) would vanish on CUDA where CPU arithmetic
    (gradual underflow) keeps them. Cost for float32 inputs (one thread, 64 columns, CPU time,
    against float32 sums): 1.04-1.31x on the mixed forest, 1.04-1.08x on a path, N = 2^12 .. 2^15.
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
        # phase I on x (e^b is applied last), its sums in float64: no float32 atomic add (class doc)
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
        """(num (..., N, d), den (..., N)) of Algorithm 1 for exp(a dist) (b left out), i.e. the
        products of M times the one positive constant e^-b, which cancels in num / den.

        phi_q, phi_k: (..., N, m); v: (..., N, d). The generic blocked path
        (fast.algebra.masked_products: memory-lean backward through rmatmul = matmul) with the
        default block size, on the operator with b = 0, so that no b overflows or underflows.
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
