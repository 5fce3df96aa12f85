"""Random-walk graph node kernel (RWGNK, GKAT) mask: choromanski22 Sec. 4.2, Eq. 5.

Psi (N, N) sparse, row h = f_h / |f_h|_2^alpha (alpha in {0, 1}) with the frequency vector
f_h(i) = (1/n) sum over h's walks and their prefixes ending at i of lam^t (walks sampled with
``choice="weighted"``, i.e. from P = D^-1 W, on weighted graphs). The mask is K = Psi Psi^T (one
ensemble on both sides, as Eq. 5), applied as Psi (Psi^T x) in O(nnz(Psi) c). E[f_h] =
e_h^T (I - rho P)^-1, rho = (1 - p) lam, for uncapped halting walks (reference.masks.rwgnk has
the closed form and the Thm. 4.2 bounds).

Per-key stabilisation (``rescales_keys``): as GRFMask's (fast.masks.grf, module doc), with
G_q = G_k = Psi: ``key_stabilizer`` returns c_j = max_a z_ja per key, and ``attend(...,
key_log_scale=c)`` weights Psi's stored entries by exp(c_j - s_u) on the key side (s_u = max of
c_j over the rows j with Psi[j, u] != 0) and by exp(s_u - r_i) on the query side (r_i = max of
s_u over row i's entries), so (num_i, den_i) are the true ones times exp(-r_i). Psi >= 0, so the
mask is nonnegative and the per-key constants always apply.
"""
from __future__ import annotations

import numbers
from typing import Any

import torch

from fast.graphs import as_graph
from fast.operator import SymmetricMaskOperator
from fast.masks.explicit import SparseMask
from fast.masks.grf import ScaledWalkMatrix, StabilisedProduct, WalkPrefixes, as_walks, stabilising_factors
from fast.segments import Segments
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
    """Psi as a torch sparse CSR tensor (N, N) float64 on the graph's device (Eq. 5).

    Entries (h, u_t, lam^t / n) summed per (h, column); alpha = 1 divides each row by its 2-norm."""
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
    values = Segments(inverse, pairs.numel()).sum(disc, dim=0)
    rows, cols = pairs // n, pairs % n  # rows sorted: pairs are
    if alpha == 1:
        norm2 = Segments(rows, n, sorted=True).sum(values * values, dim=0)
        values = values / norm2.sqrt()[rows]  # every row holds f_h(h) >= 1: never 0
    # Psi is handed out (``RWGNKMask.psi``): torch's global invariant switch applies, as it always did
    return csr_matrix(row_pointers(rows, n), cols, values, n, check_invariants=None)


class RWGNKMask(LocallyStabilised, SymmetricMaskOperator):
    """K_hat = Psi Psi^T (choromanski22 Eq. 5): symmetric, nonnegative, O(nnz(Psi) c) per product.

    graph: what ``fast.graphs.as_graph`` accepts; walks: sampled on it (``choice="weighted"`` on a
    weighted graph); lam >= 0 (Thm. 4.2 needs lam <= 1); alpha in {0, 1}. Psi is built once (a
    SparseMask: CSR per device and dtype, its transpose once). Attributes: n, lam, alpha, psi."""

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
        """(num (..., N, d), den (..., N)) of Algorithm 1 with K = Psi Psi^T.

        phi_q, phi_k: (..., N, m); v: (..., N, d), the same leading (batch, head) dims.
        c (S, N), detached (LocallyStabilised.attend) (phi_k_j = phi_true_j exp(-c_j)): Psi's
        values times the per-slice factors of fast.masks.grf.stabilising_factors on both sides
        (module doc), num_i = exp(-r_i) sum_j K_ij (phi_q_i . phi_true_j) v_j, den_i likewise;
        gradients reach phi_q, phi_k and v."""
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
