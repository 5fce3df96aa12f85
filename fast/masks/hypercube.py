"""Hypercube graph diffusion kernel as a Kronecker operator (choromanski22 Sec. 4.1).

Nodes of {0,1}^k are the k-bit words of 0..N-1, N = 2^k. The diffusion kernel exp(-lambda L) is,
up to the constant (e^-lambda cosh lambda)^k that cancels in attention,

    M = kron_{b = k-1..0} [[1, t], [t, 1]],   t = tanh(lambda),   M_ij = t^popcount(i xor j).

M @ x applies the factors a group of g bits at a time: kron of g 2 x 2 factors is the 2^g x 2^g
matrix K_g[a, b] = t^popcount(a xor b), and viewing the token axis as (N / 2^(b+g), 2^g, 2^b) it
acts on the middle axis (a batched GEMM). ceil(k / g) passes over N c numbers with 2^g flops per
number each: O(N c 2^g log(N) / g) = O(N c log N) for fixed g; g = 5 (32 x 32 factors) replaces
five memory-bound passes (one per bit) by one batched GEMM. No N x N matrix and no FFT; M is
positive (t in (0, 1)).
"""
from __future__ import annotations

import numbers

import torch

from fast.operator import SymmetricMaskOperator
from fast.validation import check_diffusion_time, check_tokens, compute_dtype

#: Bits per Kronecker pass: the 2^g x 2^g factor applied as one batched GEMM.
GROUP_BITS = 5


def hypercube_dimension(n: int) -> int:
    """k with n = 2^k (the hypercube's dimension), else ValueError naming n.

    >>> from fast.masks.hypercube import hypercube_dimension
    >>> hypercube_dimension(8), hypercube_dimension(1)
    (3, 0)
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0 or int(n) & (int(n) - 1):
        raise ValueError(f"a hypercube has N = 2^k nodes; n must be a power of two, got {n!r}")
    return int(n).bit_length() - 1


def _check_lam(lam: object) -> float | torch.Tensor:
    """fast.validation.check_diffusion_time: lam > 0, a tensor kept as given."""
    return check_diffusion_time(lam, positive=True)


class HypercubeDiffusionMask(SymmetricMaskOperator):
    """M_ij = tanh(lam)^dist(i, j) on the hypercube with n = 2^k nodes (dist = Hamming distance).

    n: a power of two (Python or NumPy int); lam > 0: the diffusion time (a real number, a 0-d
    NumPy array, or a one-element tensor, which may require grad: a learnable diffusion time;
    an integer tensor is converted to float). ``matmul`` takes x (..., n, c).

    Sign: M is the heat kernel exp(-lam L) up to a positive constant; per bit the kernel of the
    2-node graph is e^-lam [[cosh lam, sinh lam], [sinh lam, cosh lam]], so its off-diagonal
    ratio tanh(lam) and every entry tanh(lam)^dist are >= 0 exactly when lam >= 0. ``nonnegative``
    is read from the current lam (a learnable lam updated in place to a negative value makes
    the entries of odd distance negative); ``abs_matmul`` is the product with |tanh(lam)|.
    matmul, rmatmul (M is symmetric): O(n c log n). ValueError names ``n`` (not a power of two) or
    ``lam`` (not a positive finite number).

    >>> import torch
    >>> from fast import HypercubeDiffusionMask
    >>> op = HypercubeDiffusionMask(8, 0.5)
    >>> dist = torch.tensor([[bin(i ^ j).count("1") for j in range(8)] for i in range(8)])  # Hamming
    >>> dense = torch.tanh(torch.tensor(0.5, dtype=torch.float64)) ** dist
    >>> torch.allclose(op.matmul(torch.eye(8, dtype=torch.float64)), dense)
    True
    """

    def __init__(self, n: int, lam: float | torch.Tensor):
        self.k = hypercube_dimension(n)
        self.n = int(n)
        self.lam = _check_lam(lam)

    @property
    def nonnegative(self) -> bool:
        """True when tanh(lam) >= 0, i.e. lam >= 0 (read from the current lam)."""
        lam = self.lam.detach() if isinstance(self.lam, torch.Tensor) else self.lam
        return float(lam) >= 0

    def t(self, device=None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The Kronecker factor's off-diagonal tanh(lam), as a 0-d tensor."""
        return torch.tanh(torch.as_tensor(self.lam, dtype=dtype, device=device)).reshape(())

    def group_factor(self, bits: int, device=None, dtype: torch.dtype = torch.float64, *,
                     absolute: bool = False) -> torch.Tensor:
        """K_bits = kron of ``bits`` factors [[1, t], [t, 1]]: (2^bits, 2^bits), K[a, b] = t^popcount(a xor b)
        (absolute=True: |t| instead of t)."""
        a = torch.arange(1 << bits, device=device)
        x = a[:, None] ^ a[None, :]
        dist = sum((x >> b) & 1 for b in range(bits)) if bits else torch.zeros_like(x)
        t = self.t(device, dtype)
        return (t.abs() if absolute else t) ** dist.to(dtype)

    def _product(self, x: torch.Tensor, absolute: bool) -> torch.Tensor:
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        y = x.to(compute_dtype(x.dtype))
        lead, c = y.shape[:-2], y.shape[-1]
        factors: dict[int, torch.Tensor] = {}
        b = 0
        while b < self.k:
            g = min(GROUP_BITS, self.k - b)
            if g not in factors:
                factors[g] = self.group_factor(g, y.device, y.dtype, absolute=absolute)
            # token index = high * 2^(b+g) + mid * 2^b + low: axis -2 of this view is "mid"
            z = y.reshape(*lead, self.n >> (b + g), 1 << g, (1 << b) * c)
            y = (factors[g] @ z).reshape(*lead, self.n, c)
            b += g
        return y.to(out_dtype)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): GROUP_BITS bits per batched GEMM, O(n c log n)."""
        return self._product(x, absolute=False)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """|M| @ x for x (..., n, c) -> (..., n, c): the same passes with |tanh(lam)| (contract C1)."""
        return self._product(x, absolute=True)
