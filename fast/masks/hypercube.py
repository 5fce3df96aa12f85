"""Hypercube graph diffusion kernel as a Kronecker operator (choromanski22 Sec. 4.1).

Nodes of {0,1}^k are the k-bit words of 0..N-1, N = 2^k. The diffusion kernel exp(-lambda L) is,
up to the constant (e^-lambda cosh lambda)^k that cancels in attention,

    M = kron_{b = k-1..0} [[1, t], [t, 1]],   t = tanh(lambda),   M_ij = t^popcount(i xor j).

M @ x applies one 2 x 2 factor per bit: viewing the token axis as (N / 2^(b+1), 2, 2^b), the
factor mixes the two halves of axis "2": y = x + t * (x with the halves swapped). k = log2 N
passes over N c numbers: O(N c log N), no N x N matrix and no FFT. M is positive (t in (0, 1)).
"""
from __future__ import annotations

import math

import torch

from fast.validation import check_tokens, compute_dtype


def hypercube_dimension(n: int) -> int:
    """k with n = 2^k, else ValueError naming n."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n & (n - 1):
        raise ValueError(f"a hypercube has N = 2^k nodes; n must be a power of two, got {n!r}")
    return n.bit_length() - 1


class HypercubeDiffusionMask:
    """M_ij = tanh(lam)^dist(i, j) on the hypercube with n = 2^k nodes (dist = Hamming distance).

    n: a power of two; lam > 0: the diffusion time (a float, or a 0-d tensor that may require
    grad: a learnable diffusion time). ``matmul`` takes x (..., n, c).
    """

    def __init__(self, n: int, lam: float | torch.Tensor):
        self.k = hypercube_dimension(n)
        self.n = n
        if isinstance(lam, torch.Tensor):
            if lam.numel() != 1 or not lam.is_floating_point():
                raise ValueError(f"lam must be a positive scalar, got a tensor of shape {tuple(lam.shape)}")
            bad = not bool(torch.isfinite(lam)) or float(lam) <= 0
        else:
            bad = isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam <= 0
        if bad:
            raise ValueError(f"lam must be a positive finite diffusion time, got {lam!r}")
        self.lam = lam

    def t(self, device=None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The Kronecker factor's off-diagonal tanh(lam), as a 0-d tensor."""
        return torch.tanh(torch.as_tensor(self.lam, dtype=dtype, device=device))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): one 2 x 2 Kronecker factor per bit, O(n c log n)."""
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        y = x.to(compute_dtype(x.dtype))
        t = self.t(y.device, y.dtype)
        lead, c = y.shape[:-2], y.shape[-1]
        for b in range(self.k):
            # token index = high * 2^(b+1) + bit * 2^b + low: axis -3 of this view is bit b
            z = y.reshape(*lead, self.n >> (b + 1), 2, (1 << b) * c)
            y = (z + t * z.flip(-2)).reshape(*lead, self.n, c)
        return y.to(out_dtype)
