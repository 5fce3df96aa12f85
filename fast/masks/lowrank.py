"""Low-rank masks: M = M1 M2 from factors, and the stochastic RPE (choromanski22 Sec. 3.4).

M @ x = M1 (M2 x): O(N r c) for rank r, never N x N. The stochastic relative-position encoding
is the softmax-kernel mask M_ij = exp(p_i . p_j) over positional encodings p_i, replaced by its
FAVOR+ random-feature factorisation M_hat = phi(P) phi(P)^T (r features): positive, and unbiased,
E M_hat = M (Performer Lemma 1). Sinusoidal p_i make p_i . p_j a function of i - j, so the
expected mask is a relative-position (Toeplitz) mask.

Factors with negative entries give a mask that need not be positive: attention denominators can
then vanish or turn negative (masked_linear_attention reports a vanishing one).
"""
from __future__ import annotations

import torch

from fast.features import FavorPlus
from fast.operator import MaskOperator
from fast.validation import broadcast_shape, check_tensor, check_tokens, compute_dtype


class LowRankMask(MaskOperator):
    """M = left @ right with left (..., N, r) and right (..., r, N); the factors' leading dims
    broadcast with each other and with x's in ``matmul`` (one mask per (batch, head) slice, or one
    for all). ``nonnegative`` is read from the current factors (True when both are >= 0);
    ``abs_matmul`` gives |left| (|right| x) >= |M| x entrywise for the driver's denominator guard.
    matmul, rmatmul: O(N r c). TypeError / ValueError name ``left`` / ``right`` (not floating,
    NaN or inf, shapes that do not match, leading dims that do not broadcast, two devices) or ``x``.

    >>> import torch
    >>> from fast import LowRankMask
    >>> g = torch.Generator().manual_seed(0)
    >>> a, b, x = torch.rand(6, 2, generator=g), torch.rand(2, 6, generator=g), torch.rand(6, 3, generator=g)
    >>> op = LowRankMask(a, b)
    >>> torch.allclose(op.matmul(x), (a @ b) @ x), op.rank, op.nonnegative
    (True, 2, True)
    """

    def __init__(self, left: torch.Tensor, right: torch.Tensor):
        check_tensor("left", left)
        check_tensor("right", right)
        if left.shape[-1] != right.shape[-2] or left.shape[-2] != right.shape[-1]:
            raise ValueError(f"left (..., N, r) and right (..., r, N) do not match: {tuple(left.shape)} and {tuple(right.shape)}")
        if left.device != right.device:
            raise ValueError(f"left and right must be on one device, got {left.device} and {right.device}")
        try:
            self._lead = broadcast_shape(tuple(left.shape[:-2]), tuple(right.shape[:-2]))
        except ValueError:
            raise ValueError(f"left (..., N, r) and right (..., r, N) must have leading (batch) dims that broadcast, "
                             f"got left {tuple(left.shape)} and right {tuple(right.shape)}") from None
        self.left, self.right = left, right
        self.n, self.rank = left.shape[-2], left.shape[-1]

    @property
    def nonnegative(self) -> bool:
        """True when both factors are entrywise >= 0 (then M >= 0); read from the current factors."""
        return bool((self.left.detach() >= 0).all()) and bool((self.right.detach() >= 0).all())

    @classmethod
    def stochastic_rpe(cls, encodings: torch.Tensor, projection: torch.Tensor) -> "LowRankMask":
        """M_hat = phi(P) phi(P)^T, FAVOR+ features with W = projection (r, d_p) of encodings P (..., N, d_p).

        Unstabilised features: E M_hat_ij = exp(p_i . p_j) exactly (a stabiliser would rescale M).
        Rank r; the factors cost O(N r d_p). ValueError names ``projection`` for a width other than
        d_p.

        >>> import torch
        >>> from fast import LowRankMask
        >>> g = torch.Generator().manual_seed(0)
        >>> rpe = LowRankMask.stochastic_rpe(torch.randn(6, 3, generator=g), torch.randn(4, 3, generator=g))
        >>> rpe.n, rpe.rank, rpe.nonnegative
        (6, 4, True)
        """
        check_tensor("encodings", encodings)
        check_tensor("projection", projection)
        if projection.shape[-1] != encodings.shape[-1]:
            raise ValueError(f"projection must have shape (r, {encodings.shape[-1]}) for encodings "
                             f"{tuple(encodings.shape)}, got {tuple(projection.shape)}")
        phi = FavorPlus(projection.to(encodings.dtype), stabilize=False)(encodings)
        return cls(phi, phi.transpose(-1, -2))

    def _factors(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
        """(left, right) on x's device in x's compute dtype, after checking x (..., N, c) against them."""
        check_tokens("x", x, self.n)
        lead = tuple(x.shape[:-2])
        try:
            broadcast_shape(self._lead, lead)
        except ValueError:
            raise ValueError(f"x's leading (batch) dims {lead} (x has shape {tuple(x.shape)}) do not broadcast "
                             f"with the factors' {self._lead} (left {tuple(self.left.shape)}, right "
                             f"{tuple(self.right.shape)}): give factors with leading dims 1 or equal to x's") from None
        work = compute_dtype(x.dtype)
        left, right = (f.to(device=x.device, dtype=work) for f in (self.left, self.right))
        return left, right, work

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x = left (right x) for x (..., N, c) -> (..., N, c), O(N r c)."""
        left, right, work = self._factors(x)
        return (left @ (right @ x.to(work))).to(x.dtype)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x = right^T (left^T x) for x (..., N, c) -> (..., N, c), O(N r c)."""
        left, right, work = self._factors(x)
        return (right.mT @ (left.mT @ x.to(work))).to(x.dtype)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """|left| (|right| x) for x (..., N, c) -> (..., N, c), O(N r c): the product with
        B = |left| |right| >= |left right| = |M| entrywise (contract C1), so the driver's guard sees
        the scale of terms that cancel inside M."""
        left, right, work = self._factors(x)
        return (left.abs() @ (right.abs() @ x.to(work))).to(x.dtype)
