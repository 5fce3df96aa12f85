"""Random-walk graph node kernel (RWGNK, GKAT) mask: choromanski22 Sec. 4.2, Eq. 5 (docs/papers.md
Sec. 3). Dense twin: reference/masks/rwgnk.py (with the closed form and the Thm. 4.2 bounds).

Psi (N, N) is sparse, row h = f_h / |f_h|_2^alpha with the discounted visit frequencies f_h of
h's walks; the mask K = Psi Psi^T applies to x (..., N, c) as Psi (Psi^T x) in O(nnz(Psi) c).
The FAVOR+ ``attend`` is stabilised per key as GRFMask's (fast.masks.grf). Details:
docs/papers.md, fast.masks.rwgnk.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from fast.graphs import as_graph
from fast.operator import SymmetricMaskOperator
from fast.masks.explicit import SparseMask
from fast.masks.grf import ScaledWalkMatrix, StabilisedProduct, WalkPrefixes, as_walks, stabilising_factors
from fast.segments import Segments, segment_max
from fast.sparse import csr_matrix, row_pointers
from fast.stabilizers import LocallyStabilised, plain_attend


def _lam(lam: object) -> float:
    if isinstance(lam, torch.Tensor) and lam.requires_grad:
        raise TypeError("lam of RWGNK is not learnable here (Psi is built once from the walks with lam^t "
                        "weights): pass a number or a tensor that does not require grad")
    if isinstance(lam, torch.Tensor) and lam.numel() == 1:
        lam = float(lam)
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
        raise TypeError(f"lam must be a real number (the discount per hop), got {type(lam).__name__}")
    lam = float(lam)
    if not lam >= 0 or lam == float("inf"):
        raise ValueError(f"lam must be a finite real >= 0 (the discount per hop), got {lam!r}")
    return lam


def _alpha(alpha: object) -> int:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or alpha not in (0, 1):
        raise ValueError(f"alpha must be 0 or 1 (Psi(h) = f_h / |f_h|^alpha), got {alpha!r}")
    return int(alpha)


def rwgnk_features(graph: Any, walks: Any, lam: float, alpha: int = 0) -> torch.Tensor:
    """Psi as a torch sparse CSR tensor (N, N) float64 on the graph's device (choromanski22 Eq. 5):
    entries (h, u_t, lam^t / n) summed per (h, column); alpha = 1 divides each row by its 2-norm.
    O(total walk length log). Raises what as_graph and as_walks raise, TypeError / ValueError
    naming lam (a finite real >= 0, not learnable) or alpha (0 or 1), ValueError when a walk
    steps off the graph's edges, and ValueError naming lam when alpha = 0 and lam^t overflows
    float64 (saying which lam and which walk length would do; alpha = 1 is finite for any lam).

    >>> import torch
    >>> from fast import sample_walks
    >>> from fast.masks.rwgnk import rwgnk_features
    >>> path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    >>> walks = sample_walks(path, 2, fixed_length=1, choice="weighted", generator=torch.Generator().manual_seed(0))
    >>> rwgnk_features(path, walks, 0.5).to_dense().sum(1).tolist()     # 1 + lam per walk of one hop
    [1.5, 1.5, 1.5]
    """
    graph = as_graph(graph)
    lam, alpha = _lam(lam), _alpha(alpha)
    walks = as_walks(walks, graph)
    walks.validate(graph)  # every hop follows an edge (the frequencies do not read the weights)
    n = graph.n
    walker, t = walks.positions()
    key = (walker // walks.n_walkers) * n + walks.nodes
    pairs, inverse = torch.unique(key, sorted=True, return_inverse=True)
    disc = torch.pow(torch.tensor(lam, dtype=torch.float64, device=t.device), t.to(torch.float64)) / walks.n_walkers
    # segment sums (fast.segments), not index_add_: no atomics, the same Psi bits on every CUDA run
    sums = Segments(inverse, pairs.numel())
    values = sums.sum(disc, dim=0)
    rows, cols = pairs // n, pairs % n  # rows sorted: pairs are
    by_row = Segments(rows, n, sorted=True)
    finite = bool(torch.isfinite(values).all())
    if alpha == 1:
        if not finite:  # lam^t overflowed, but f_h / |f_h| is finite: the sums in units of each row's largest term
            log_disc = t.to(torch.float64) * math.log(lam)
            row_of = (walker // walks.n_walkers)
            top = segment_max(log_disc, row_of, n, dim=0)
            values = sums.sum(torch.exp(log_disc - top[row_of]), dim=0)
        # |f_h| in units of 2^e, 2^e near row h's largest entry: exact scaling, so the squares neither
        # overflow (lam^t > 1e154) nor underflow, and the quotient keeps its bits where they did not
        _, e = torch.frexp(segment_max(values, rows, n, dim=0))
        scaled = torch.ldexp(values, -e[rows])
        norm2 = by_row.sum(scaled * scaled, dim=0)
        values = scaled / norm2.sqrt()[rows]  # every row holds f_h(h) > 0: never 0
    elif not finite:
        longest = int(walks.length.max())
        limit = math.log(torch.finfo(torch.float64).max / (longest + 1))
        raise ValueError(f"lam = {lam!r}: the discounted visit frequencies lam^t / n_walkers of rwgnk's Psi overflow "
                         f"float64 (lam^{longest} for the longest walk, {longest} hops). With these walks lam <= "
                         f"{math.exp(limit / max(longest, 1)):.4g} keeps them finite; with this lam, walks of at most "
                         f"{max(0, math.floor(limit / math.log(lam)))} hops (sample_walks(..., i_max=...)); or alpha=1 "
                         f"(each row normalised, finite for any lam). Thm. 4.2 needs lam <= 1")
    # Psi is handed out (``RWGNKMask.psi``): torch's global invariant switch applies, as it always did
    return csr_matrix(row_pointers(rows, n), cols, values, n, check_invariants=None)


class RWGNKMask(LocallyStabilised, SymmetricMaskOperator):
    """K_hat = Psi Psi^T (choromanski22 Eq. 5): symmetric, nonnegative, O(nnz(Psi) c) per product.

    graph: what ``fast.graphs.as_graph`` accepts; walks: sampled on it (``choice="weighted"`` on a
    weighted graph); lam >= 0 (Thm. 4.2 needs lam <= 1); alpha in {0, 1}; errors as
    ``rwgnk_features``. Psi is built once (a SparseMask: CSR per device and dtype, its transpose
    once). ``matmul`` (= ``rmatmul``) takes x (..., N, c). Attributes: n, lam, alpha, psi, nnz.

    >>> import torch
    >>> from fast import RWGNKMask, sample_walks
    >>> path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    >>> walks = sample_walks(path, 2, p_halt=0.5, choice="weighted", generator=torch.Generator().manual_seed(0))
    >>> op = RWGNKMask(path, walks, 0.5)
    >>> psi = op.psi.matmul(torch.eye(3, dtype=torch.float64))             # Psi, dense
    >>> x = torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    >>> torch.allclose(op.matmul(x), psi @ psi.T @ x)
    True
    """

    nonnegative = True

    def __init__(self, graph: Any, walks: Any, lam: float, alpha: int = 0):
        self.lam, self.alpha = _lam(lam), _alpha(alpha)
        psi = rwgnk_features(graph, walks, lam, alpha)
        crow = psi.crow_indices()
        counts = crow[1:] - crow[:-1]
        self._nnz_per_row = counts.cpu()
        self.psi = SparseMask(psi, name="Psi")
        self.n = self.psi.n
        self.nnz = self.psi.nnz
        # Psi's structure for the stabilised attend (rows, columns, transposition; one "prefix
        # length" whose coefficient is the constant 1): the values are Psi's, fixed
        rows = torch.repeat_interleave(torch.arange(self.n, device=crow.device), counts)
        cols = psi.col_indices()
        self._prefixes = WalkPrefixes(self.n, rows, cols, torch.zeros_like(cols), psi.values(), 1)
        self._one = torch.ones(1, dtype=torch.float64, device=crow.device)

    def _attend_stabilised(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                           c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 with K = Psi Psi^T: Psi's values times
        fast.masks.grf.stabilising_factors on both sides (as GRFMask's); gradients reach phi_q, phi_k, v.
        """
        work = phi_k.dtype
        p = self._prefixes
        values = p.bases(c.device, work)
        valid = values != 0  # lam = 0 stores zeros for the prefixes of length >= 1
        factor_q, factor_k = stabilising_factors(c, p, valid, p, valid)
        one = self._one.to(c.device)
        op = StabilisedProduct(self.n, c.shape[0], ScaledWalkMatrix(p, one, None, values, factor_q),
                               ScaledWalkMatrix(p, one, None, values, factor_k), [])
        return plain_attend(op, phi_q, phi_k, v)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """K x = Psi (Psi^T x) for x (..., N, c) -> (..., N, c)."""
        return self.psi.matmul(self.psi.rmatmul(x))

    def nnz_stats(self) -> dict:
        """Stored entries per row of Psi, {"mean", "max"}."""
        return {"mean": self.nnz / self.n, "max": int(self._nnz_per_row.max())}

    @property
    def nnz_per_row(self) -> torch.Tensor:
        """Stored entries of each row of Psi, (N,) int64."""
        return self._nnz_per_row
