"""TreeDiamMask: M_ij = f(dist(i, j)) for any f on an unweighted forest in O(N diam c)
(choromanski22 Lemma 6.2, Eqs. 27-29; docs/papers.md Sec. 2).
"""
from __future__ import annotations

import numpy as np
import torch

from fast.masks.tree.forest import (DEFAULT_MAX_CHUNK_BYTES, DistanceFunctionMask, Forest, FTable, check_f,
                                   check_unweighted, forest_diameter)
from fast.validation import check_positive_int, check_tokens, compute_dtype

#: The dtype of the children-into-parents sums (segment sums) of a TreeDiamMask product, whatever
#: the input dtype (docs/papers.md, fast.masks.tree: "Precision of the tree products").
ACCUMULATE_DTYPE = torch.float64


class TreeDiamMask(DistanceFunctionMask):
    """M_ij = f(dist(i, j)) on an unweighted forest, 0 across trees; O(n diam c) (Lemma 6.2,
    Eqs. 27-29: depth arrays g bottom-up, h top-down, (M x)_i = sum_l f(l) h_i[l]).

    forest: an unweighted ``Forest`` (ValueError otherwise, ``check_unweighted``); f: (n,) tensor (or
    array) f(0), ..., f(n - 1), finite, any sign, may require grad (``check_f``). ``matmul`` (=
    ``rmatmul``) and ``abs_matmul`` (with |f|) take x (..., n, c). Memory O(n diam c) with autograd,
    less without; columns are chunked under ``max_chunk_bytes`` (ValueError unless a positive int).
    Half precision computes in float32; the children-into-parents sums accumulate in float64
    (``ACCUMULATE_DTYPE``). Derivation, storage and precision: docs/papers.md, fast.masks.tree.

    >>> import torch
    >>> from fast import Forest, TreeDiamMask
    >>> path = Forest.from_parent([-1] + list(range(7)))                    # a path of 8 nodes
    >>> g = torch.Generator().manual_seed(0)
    >>> f = torch.randn(8, generator=g, dtype=torch.float64)
    >>> i = torch.arange(8)
    >>> x = torch.rand(8, 2, generator=g, dtype=torch.float64)
    >>> torch.allclose(TreeDiamMask(path, f).matmul(x), f[(i[:, None] - i[None]).abs()] @ x)
    True
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
                # fast.segments: no atomic add on CUDA; and float64 (ACCUMULATE_DTYPE)
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
