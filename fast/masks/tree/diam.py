"""TreeDiamMask: M_ij = f(dist(i, j)) for any f on an unweighted forest in O(N diam c)
(choromanski22 Lemma 6.2, Eqs. 27-29; docs/papers.md Sec. 2)."""
from __future__ import annotations

import numpy as np
import torch

from fast.masks.tree.forest import (DEFAULT_MAX_CHUNK_BYTES, DistanceFunctionMask, Forest, FTable, check_f,
                                   check_unweighted, forest_diameter)
from fast.validation import check_positive_int, check_tokens, compute_dtype

#: The dtype of the children-into-parents sums (segment sums) of a TreeDiamMask product, whatever
#: the input dtype (TreeDiamMask's docstring, "Precision").
ACCUMULATE_DTYPE = torch.float64


class TreeDiamMask(DistanceFunctionMask):
    """M_ij = f(dist(i, j)) on an unweighted forest, 0 across trees; O(n diam c) (Lemma 6.2).

    forest: an unweighted ``Forest`` (all edge lengths 1, else ValueError); f: (n,) tensor (or
    array) f(0), ..., f(n - 1), finite, any sign; it may require grad. ``matmul`` takes x (..., n, c).

    With the forest rooted (level order) and T_i the subtree of i:
        g_i[l] = sum_{j in T_i, dist(i, j) = l} x_j:  g_i[0] = x_i,  g_i[l] = sum_{c child of i} g_c[l - 1]
        h_i[l] = sum_{j, dist(i, j) = l} x_j:         h_root = g_root,  h_i = g_i + shift(h_p(i) - shift(g_i))
        (M x)_i = sum_l f(l) h_i[l]                   (Eqs. 27-29; shift(z)[0] = 0, shift(z)[l] = z[l - 1])
    h_p(i)[l - 1] counts the nodes at distance l from i through its parent, except those of T_i at
    depth l - 2 below i, which the second shift removes. Both passes go level by level: one
    segment sum (children into parents) or gather (parents to children) per depth, through the
    forest's fast.segments plans (Forest.level_plans): no atomic add on CUDA, forward or backward,
    so the same inputs give the same bits at every run.

    Storage (H the height): g of a depth-k node has length H - k + 1 (its subtree is no deeper);
    h is stored by s = l - k + H in an array of length 2H + 1 (no node is farther
    than H + k from a depth-k node). In s the shift by the parent vanishes, h_i[s] = h_p(i)[s] +
    g_i[s] - g_i[s - 2] (g placed at its own s), so each level is one index_select of the parents'
    h plus two in-place slice updates of g's (short) length, and (M x)_i = sum_l f(l) h_i[H - k + l].
    Work O(n H c) = O(n diam c) (diam >= H). Memory: all g (sum_k n_k (H - k + 1) c <= n (H + 1) c)
    plus h of two adjacent levels (n_k (2H + 1) c each) without autograd; with autograd (x or f
    requiring grad) every level's h is kept: n (2H + 1) c. Columns are processed in chunks whose
    no-grad buffers stay under ``max_chunk_bytes`` (default 32 MiB; at least one column).
    Half precision inputs compute in float32.

    Precision: the children-into-parents sums accumulate in float64 (``ACCUMULATE_DTYPE``) and are
    rounded once to the compute dtype. They were index_add_, an atomic add on CUDA, and float32
    atomic adds flush subnormal inputs and results to zero (PTX ISA, atom/red.add.f32 without .noftz;
    float64 ones keep them), and FAVOR+ key features span far more than float32's normal range
    at large q, k: terms below 2^-126 that a normal row of M x still needs vanished on CUDA
    (numerics/tree-diam at N = 512, d = 128, q, k std 8, seed 4, CUDA's atomics emulated on CPU:
    2 rows off by up to 0.26%, no refusal), while CPU arithmetic (gradual underflow) keeps them.
    Cost for float32 inputs (one thread, 64 columns, CPU time, against float32 sums): 1.13-1.30x
    on the mixed forest, 1.05-1.12x on a complete binary tree (N = 2^12 .. 2^15), ~1.15x on a
    path (N = 2^10, 2^11).
    """

    def __init__(self, forest: Forest, f: FTable, *, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES):
        check_unweighted(forest, "TreeDiamMask")
        self.forest = forest
        self.n = forest.n
        self.f = check_f(f, self.n)
        self.max_chunk_bytes = check_positive_int("max_chunk_bytes", max_chunk_bytes)
        self.height = forest.height
        self.diameter = forest_diameter(forest)
        counts = np.diff(forest.level_starts)
        H = self.height
        level_h = counts * (2 * H + 1)
        pairs = max([int(a + b) for a, b in zip(level_h, level_h[1:])] + [int(level_h[0])])
        #: numbers per column held at the peak of a no-grad product (all g, two levels of h, out)
        self.elems_per_column = int(np.dot(counts, H + 1 - np.arange(H + 1))) + pairs + 2 * self.n

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): two passes over the depths, O(n diam c) work."""
        return self._product(x, self.f)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """B @ x with B_ij = |f|(dist(i, j)) >= |M_ij| (0 across trees): the same product with |f|
        (fast.operator: the guard's scale of the terms a denominator sums when f has both signs)."""
        return self._product(x, self.f.detach().abs())

    def _product(self, x: torch.Tensor, f_table: torch.Tensor) -> torch.Tensor:
        """M @ x for the table f_table (n,) in place of f."""
        check_tokens("x", x, self.n)
        out_dtype, work = x.dtype, compute_dtype(x.dtype)
        lead, c = x.shape[:-2], x.shape[-1]
        xs = self.forest.to_level_order(x.to(work).reshape(-1, self.n, c))  # (B, n, c) in level order
        f = f_table.to(device=x.device, dtype=work)
        f = torch.nn.functional.pad(f, (0, max(0, 2 * self.height + 1 - self.n)))  # f(l) = 0 past n - 1
        per_col = xs.shape[0] * self.elems_per_column * xs.element_size()
        step = max(1, self.max_chunk_bytes // per_col)
        out = torch.cat([self._levels(xs[..., j:j + step], f) for j in range(0, c, step)], dim=-1)
        return self.forest.from_level_order(out).reshape(*lead, self.n, c).to(out_dtype)

    def _levels(self, xs: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """The two passes on xs (B, n, c) in level order; returns (B, n, c) in level order."""
        parents = [None if p is None else p[0] for p in self.forest.level_plans()]  # parent within level k - 1
        levels = self.forest.levels()
        H = self.height
        B, _, c = xs.shape
        g: list = [None] * (H + 1)
        for k, lo, hi in reversed(levels):  # bottom-up: g_i[0] = x_i, g_i[1:] = sum of the children's g
            xk = xs[:, lo:hi].unsqueeze(-2)  # (B, n_k, 1, c)
            if k == H:
                g[k] = xk
            else:
                # fast.segments: no atomic add on CUDA; and float64 (class doc, "Precision")
                below = xs.new_zeros(B, hi - lo, H - k, c, dtype=ACCUMULATE_DTYPE)
                below = parents[k + 1].add_into(below, g[k + 1].to(ACCUMULATE_DTYPE), dim=1).to(xs.dtype)
                g[k] = torch.cat([xk, below], dim=-2)
        h = xs.new_zeros(B, levels[0][2], 2 * H + 1, c)
        h[:, :, H:] = g[0]  # roots: h = g, at s = l + H
        outs = [torch.matmul(f[None, :H + 1], h[:, :, H:]).squeeze(-2)]
        for k, lo, hi in levels[1:]:
            h = parents[k].take(h, dim=1)  # h_p(i)[s]: the parent's term, already shifted (a gather)
            h[:, :, H - k:2 * H - 2 * k + 1] += g[k]  # + g_i[l]
            stop = min(2 * H - 2 * k + 3, 2 * H + 1)
            h[:, :, H - k + 2:stop] -= g[k][:, :, :stop - (H - k + 2)]  # - g_i[l - 2]
            outs.append(torch.matmul(f[None, :H + k + 1], h[:, :, H - k:]).squeeze(-2))
        return torch.cat(outs, dim=1)
