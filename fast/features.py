"""Feature maps phi: R^d -> R^m as torch modules, (..., N, d) -> (..., N, m).

Softmax-kernel estimators (choromanski22 Sec. 2; wu22 Eq. 4, Lemma 1), rows w_k of W (m, d):
    FavorPlus:   phi(x) = exp(W x - |x|^2/2) / sqrt(m),   E[phi(x).phi(y)] = exp(x.y)
    Hyperbolic:  [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m)
    TrigRFF:     exp(|x|^2/2) [cos W x, sin W x] / sqrt(m)  (unbiased, not positive)
Deterministic: ReLU, EluPlusOne (ELU(x) + 1), Identity.

Stabiliser (positive maps, ``stabilize=True``): exp(z - c) with c the per-row max of z for
queries and, for keys, the max over all keys and features of ONE (batch, head) slice, or a
mask's ``key_stabilizer(z)`` (max over the keys each query can see: real keys for padding, the
own segment for packing) so that a key hidden by the mask cannot underflow the visible ones.
All these constants cancel in the normalised output; a max across the batch would not (one
sample's underflow would depend on another's inputs), so it is never taken. A mask whose queries
see different key sets (causal prefixes) may return per-key constants that its ``attend`` undoes
(``rescales_keys``, fast.masks.base); only fast.favor_attention uses them that way.
``FavorPlus.exponentials`` gives the features without their 1/sqrt(m) (largest stabilised entry
exactly 1), which fast.favor_attention feeds to its guard.
Half-precision inputs are projected and exponentiated in float32 (features come out float32).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fast.validation import FLOAT_DTYPES, check_floating, check_positive_int, check_tensor, compute_dtype


def gaussian_projection(
    m: int,
    d: int,
    *,
    orthogonal: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draw W (m, d) with rows w_k ~ N(0, I_d) from an explicit generator.

    orthogonal=True: blocks of d orthonormal rows (QR of a Gaussian, Haar sign fix), each row
    rescaled to an independent chi(d) norm (Performer's ORF), so marginals stay N(0, I_d).
    m, d: positive ints (NumPy integers too); generator: a torch.Generator or None (a fresh
    OS-seeded one; torch's global RNG is never read); dtype: float16/bfloat16/float32/float64.
    TypeError names ``generator`` or ``dtype`` for anything else; ValueError names m or d.
    """
    m = check_positive_int("m", m)
    d = check_positive_int("d", d)
    if generator is not None and not isinstance(generator, torch.Generator):
        kind = type(generator)
        got = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"
        raise TypeError("generator must be a torch.Generator or None (e.g. torch.Generator().manual_seed(seed); "
                        f"integer seeds and NumPy generators are not accepted), got {got}")
    if not isinstance(dtype, torch.dtype) or dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be a real floating torch.dtype (float16/bfloat16/float32/float64), got {dtype!r}")
    if generator is None:  # a fresh OS-seeded generator: never read or advance torch's global RNG
        generator = torch.Generator()
        generator.seed()
    gen_device = generator.device
    g = torch.randn(m, d, generator=generator, device=gen_device, dtype=torch.float64)
    if orthogonal:
        blocks = -(-m // d)
        gauss = torch.randn(blocks, d, d, generator=generator, device=gen_device, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)  # batched: one rotation per block of d rows
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar sign fix
        rows = q.transpose(-1, -2).reshape(blocks * d, d)[:m]
        g = rows * g.norm(dim=1, keepdim=True)  # chi(d) lengths from an independent Gaussian
    return g.to(device=device, dtype=dtype)


class FeatureMap(nn.Module):
    """Base class: ``forward(x, is_query)`` maps (..., N, d) to (..., N, m).

    ``is_query`` only matters for the stabiliser of the positive random feature maps.
    """

    positive: bool = False

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class _Projected(FeatureMap):
    def __init__(self, projection: torch.Tensor, stabilize: bool = True):
        super().__init__()
        check_tensor("projection", projection, min_dim=2)
        if projection.dim() != 2:
            raise ValueError(f"projection must have shape (m, d), got {tuple(projection.shape)}")
        self.register_buffer("projection", projection)
        self.stabilize = stabilize

    @property
    def m(self) -> int:
        return self.projection.shape[0]

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x in its compute dtype, x W^T): half precisions work in float32."""
        check_tensor("x", x, min_dim=2, check_finite=False)
        if x.shape[-1] != self.projection.shape[1]:
            raise ValueError(
                f"x has feature width {x.shape[-1]} but projection expects d={self.projection.shape[1]}"
            )
        x = x.to(compute_dtype(x.dtype))
        return x, x @ self.projection.to(x.dtype).T

    def _exp(self, z: torch.Tensor, is_query: bool, key_stabilizer=None) -> torch.Tensor:
        """exp(z - c) with the stabiliser's constants c (detached) when ``stabilize``."""
        if self.stabilize:
            if is_query:
                c = z.amax(dim=-1, keepdim=True)
            elif key_stabilizer is not None:
                c = key_stabilizer(z)
            else:
                c = z.amax(dim=(-2, -1), keepdim=True)
            z = z - c.detach()
        return torch.exp(z)


class FavorPlus(_Projected):
    """FAVOR+ positive random features (wu22 Eq. 4), (..., N, d) -> (..., N, m)."""

    positive = True

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, m); key_stabilizer(z) -> per-key constants (see module doc)."""
        return self.exponentials(x, is_query, key_stabilizer) / math.sqrt(self.m)

    def exponentials(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """sqrt(m) phi(x) = exp(W x - |x|^2/2 - c): the features without their 1/sqrt(m), (..., N, d) -> (..., N, m).

        Stabilised, the largest entry of each query row (and of each key slice, or of the keys
        sharing one constant of ``key_stabilizer``) is exactly 1. fast.favor_attention uses these:
        the factor 1/sqrt(m) cancels in attention's ratio, and without it the denominator is
        measured against the largest features (its guard refuses a den below float's normal range).
        """
        x, p = self._project(x)
        z = p - 0.5 * (x * x).sum(-1, keepdim=True)
        return self._exp(z, is_query, key_stabilizer)


class Hyperbolic(_Projected):
    """Hyperbolic positive random features, (..., N, d) -> (..., N, 2m)."""

    positive = True

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, 2m)."""
        x, p = self._project(x)
        half = 0.5 * (x * x).sum(-1, keepdim=True)
        z = torch.cat([p - half, -p - half], dim=-1)
        return self._exp(z, is_query, key_stabilizer) / math.sqrt(2 * self.m)


class TrigRFF(_Projected):
    """Trigonometric random Fourier features of exp(x.y), (..., N, d) -> (..., N, 2m).

    Not positive: the attention denominator can vanish or turn negative.
    """

    def __init__(self, projection: torch.Tensor):
        super().__init__(projection, stabilize=False)

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, 2m)."""
        x, p = self._project(x)
        scale = torch.exp(0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(self.m)
        return torch.cat([torch.cos(p), torch.sin(p)], dim=-1) * scale


class ReLU(FeatureMap):
    """phi(x) = max(x, 0), m = d (reid25's choice). Rows of all-negative x give phi = 0."""

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        return torch.relu(x)


class EluPlusOne(FeatureMap):
    """phi(x) = ELU(x) + 1 > 0, m = d (Katharopoulos et al. 2020)."""

    positive = True

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        return torch.nn.functional.elu(x) + 1.0


class Identity(FeatureMap):
    """phi(x) = x; the denominator may vanish."""

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        return x
