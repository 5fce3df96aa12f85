"""Feature maps phi: R^d -> R^m as torch modules, (..., N, d) -> (..., N, m).

Softmax-kernel estimators (choromanski22 Sec. 2; wu22 Eq. 4, Lemma 1), rows w_k of W (m, d):
    FavorPlus:   phi(x) = exp(W x - |x|^2/2) / sqrt(m),   E[phi(x).phi(y)] = exp(x.y)
    Hyperbolic:  [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m)
    TrigRFF:     exp(|x|^2/2) [cos W x, sin W x] / sqrt(m)  (unbiased, not positive)
Deterministic: ReLU, EluPlusOne (ELU(x) + 1), Identity.

Positive maps are stabilised (``stabilize=True``): exp(z - c), c the per-row max for queries and,
for keys, one constant per (batch, head) slice or a mask's ``key_stabilizer`` (never a max across
the batch); the constants cancel in attention (docs/papers.md Sec. 0, "Stabiliser").
Half-precision inputs compute in float32. FAVOR+ costs one GEMM and about one elementwise pass:
O(N m d). Derivations: docs/papers.md, "fast.features".
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fast.validation import (FLOAT_DTYPES, check_allocation, check_floating, check_positive_int, check_tensor,
                             compute_dtype)


def gaussian_projection(
    m: int,
    d: int,
    *,
    orthogonal: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draw W (m, d) with rows w_k ~ N(0, I_d) from an explicit generator (Performer).

    orthogonal=True: blocks of d orthonormal rows (QR of a Gaussian, Haar sign fix), each row
    rescaled to an independent chi(d) norm (Performer's ORF, Thm. 2), so marginals stay N(0, I_d).
    m, d: positive ints (NumPy integers too); generator: a torch.Generator or None (a fresh
    OS-seeded one; torch's global RNG is never read); dtype: float16/bfloat16/float32/float64.
    O(m d), plus O(m d^2) for the QR of orthogonal=True. Raises TypeError naming ``generator`` or
    ``dtype``, ValueError naming m or d, MemoryError naming them when (m, d) would not fit in memory.

    >>> import torch
    >>> from fast.features import gaussian_projection
    >>> w = gaussian_projection(4, 4, orthogonal=True, generator=torch.Generator().manual_seed(0))
    >>> gram = w @ w.T                                # orthogonal rows: a diagonal Gram matrix
    >>> tuple(w.shape), torch.allclose(gram, torch.diag(gram.diagonal()), atol=1e-5)
    ((4, 4), True)
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
    # drawn in float64; orthogonal=True also draws ceil(m / d) d x d blocks and their QR
    check_allocation(f"m = {m}, d = {d}", (m + (-(-m // d) * d if orthogonal else 0), d), torch.float64, gen_device,
                     copies=2, what="the Gaussian projection draws")
    g = torch.randn(m, d, generator=generator, device=gen_device, dtype=torch.float64)
    if orthogonal:
        blocks = -(-m // d)
        gauss = torch.randn(blocks, d, d, generator=generator, device=gen_device, dtype=torch.float64)
        q, r = torch.linalg.qr(gauss)  # batched: one rotation per block of d rows
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar sign fix
        rows = q.transpose(-1, -2).reshape(blocks * d, d)[:m]
        g = rows * g.norm(dim=1, keepdim=True)  # chi(d) lengths from an independent Gaussian
    return g.to(device=device, dtype=dtype)


def half_sq_norm(x: torch.Tensor, half: float) -> torch.Tensor:
    """half * |x|^2 per row, (..., N, d) -> (..., N, 1), O(N d): one read pass, no (N, d) temporary.

    >>> import torch
    >>> from fast.features import half_sq_norm
    >>> half_sq_norm(torch.tensor([[3., 4.], [1., 0.]]), 0.5).tolist()
    [[12.5], [0.5]]
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if x.requires_grad and torch.is_grad_enabled():
        return norm.square() * half  # vector_norm's backward reads its result: no in-place step
    return norm.square_().mul_(half)


def slice_max(rows: torch.Tensor) -> torch.Tensor:
    """The keys' default constant from their row maxima (..., N, 1): the max over ONE (batch, head)
    slice, (..., 1, 1), O(N) (never across the batch). fast.favor_blockwise calls it too, so both
    FAVOR+ paths take one rule.

    >>> import torch
    >>> from fast.features import slice_max
    >>> slice_max(torch.tensor([[[1.], [3.]], [[-2.], [0.]]])).flatten().tolist()
    [3.0, 0.0]
    """
    return rows.amax(-2, keepdim=True)


#: row_max halves the columns only from this many entries on: below it the halving's log2(m) calls
#: cost more than the slow reduction (m = 16, 2 threads: 2^10 entries 14.5 us against 2.4 us for
#: amax, 2^14 19.9 against 16.3, 2^16 35.7 against 40.9, 2^18 106 against 125).
ROW_MAX_HALVING_FROM = 2**15


def row_max(p: torch.Tensor) -> torch.Tensor:
    """max_j p_ij per row, (..., N, m) -> (..., N, 1), O(N m): the FAVOR+ stabilisers' row maxima.

    Equals ``p.amax(-1, keepdim=True)`` exactly (a max rounds nothing; NaN propagates). On the CPU
    at widths below 64 other than 32, from ROW_MAX_HALVING_FROM entries on, it halves the columns
    with elementwise maxima (log2 m passes over shrinking slices) instead: torch 2.13's inner
    reduction over a short row runs without vectors there (N = 2^12, H = 4, one thread: m = 16
    234 us against 98 us, m = 24 456 against 147, m = 48 341 against 203; m = 32 and 64 reduce
    fast, 76 and 103 us). Read it detached: it is for constants, not gradients.

    >>> import torch
    >>> from fast.features import row_max
    >>> row_max(torch.tensor([[1., 5., 2.], [-3., -1., -2.]])).flatten().tolist()
    [5.0, -1.0]
    """
    width = p.shape[-1]
    if p.device.type != "cpu" or width >= 64 or width % 32 == 0 or p.numel() < ROW_MAX_HALVING_FROM:
        return p.amax(-1, keepdim=True)
    while width > 1:  # fresh tensors from the first step on: p itself is never written
        h = width // 2
        top = torch.maximum(p[..., :h], p[..., h:2 * h])
        if width % 2:  # the odd column joins the first
            torch.maximum(top[..., :1], p[..., 2 * h:], out=top[..., :1])
        p, width = top, h
    return p


def exp_(z: torch.Tensor) -> torch.Tensor:
    """exp(z) in place (returns z), O(numel): the FAVOR+ features' exponential, for exponents z <= 0.

    On the CPU as 2^(z log2 e), forward and backward (two in-place steps): torch 2.13's exp runs 2.7x
    slower there than its exp2 (float32, 2^18 numbers, one thread: 181 us against 67 us with the
    multiply; float64 378 against 162). Rounding z log2 e moves the exponent by about |z| u, below
    the round-off z already carries from the GEMM and the shifts (about |x . w| u + n u), so the
    relative error is at most (2 |z| + 4) u instead of a few u (float32, |z| <= 80: 3.7e-6 at
    worst; tests/fast/test_features.py). The stabilisers' guarantee holds: z <= 0 gives
    z log2 e <= 0 after rounding, so every result is in [0, 1], and 2^0 = 1 exactly. On another
    device it is exp_ (GPU exp is not the cost). Raises nothing of its own.

    >>> import torch
    >>> from fast.features import exp_
    >>> z = torch.tensor([0.0, -1.0, -30.0])
    >>> torch.allclose(exp_(z.clone()), torch.exp(z), rtol=1e-6), float(exp_(torch.zeros(1)))
    (True, 1.0)
    """
    if z.device.type != "cpu":
        return z.exp_()
    # the same steps with or without autograd, so a result never depends on requires_grad
    return z.mul_(_LOG2_E).exp2_()


_LOG2_E = 1.0 / math.log(2.0)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def favor_exponentials(
    x: torch.Tensor, w: torch.Tensor, half: float, *, is_query: bool, stabilize: bool = True,
    key_stabilizer=None, row_stabilizer=None, query_norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The stabilised FAVOR+ exponentials exp(x w^T - half |x|^2 - c) (Performer Lemma 1), O(N m d).

    x: (..., N, d) and w: (m, d) in one compute dtype (a scale of x folds into w and ``half``:
    fast.favor_attention passes w = d^(-1/4) W and half = d^(-1/2) / 2). Returns (features
    (..., N, m), c or None, the norm term half |x|^2 (..., N, 1) or None), c detached. The constants:
    queries (``is_query``) the row max, so the largest entry is exactly 1 (query_norm=False: the norm
    term, which cancels in attention, is never formed); keys the per-slice max of the row maxima, or
    ``row_stabilizer(rows)`` (..., N, 1), or a mask's ``key_stabilizer(z)``; stabilize=False none.
    Shift and exp run in place on the GEMM's fresh output; under autograd one Function saves x, w
    and the features and gives their gradient (``exponential_grads``), so do not modify the
    features in place. The norm term n keeps its own graph. The cases in full: docs/papers.md,
    "fast.features".

    >>> import torch
    >>> from fast.features import favor_exponentials
    >>> g = torch.Generator().manual_seed(0)
    >>> x, w = torch.randn(5, 3, generator=g), torch.randn(4, 3, generator=g)
    >>> phi, c, n = favor_exponentials(x, w, 0.5, is_query=False)
    >>> z = x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)       # keys: one constant, max z
    >>> torch.allclose(phi, torch.exp(z - z.max())), tuple(c.shape), round(float(phi.max()), 4)
    (True, (1, 1), 1.0)
    """
    if not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        return _exponentials(x, w, half, is_query, stabilize, key_stabilizer, row_stabilizer, query_norm)
    # under autograd the features come from the same operations without a graph, and their gradient
    # from one Function: d p = g phi, d x = d p w - 2 h (sum_a d p_a) x, d w = d p^T x (the
    # constants c carry none), three passes where autograd through the in-place steps took about
    # eight (exp's, the log2 e factor's, the shifts', the norm's) on the CPU
    # the norm term exists except for stabilised queries without query_norm; formed here, with its
    # graph, for the caller, and handed to the operations as a constant
    n = None if (is_query and stabilize and not query_norm) else half_sq_norm(x, half)
    constants = []

    def build() -> torch.Tensor:
        phi, c, _ = _exponentials(x, w, half, is_query, stabilize, key_stabilizer, row_stabilizer, query_norm,
                                  None if n is None else n.detach())
        constants.append(c)
        return phi

    phi = _Exponentials.apply(x, w, build, None if n is None else half)
    return phi, constants[0], n


def _exponentials(x: torch.Tensor, w: torch.Tensor, half: float, is_query: bool, stabilize: bool, key_stabilizer,
                  row_stabilizer, query_norm: bool, n: torch.Tensor | None = None):
    """favor_exponentials' operations (n: the norm term, computed here when None); differentiable
    through torch's own graph when run under autograd."""
    p = x @ w.transpose(-1, -2)  # (..., N, m)
    if is_query and stabilize:
        c = row_max(p.detach())
        shift = c
        if query_norm:
            n = half_sq_norm(x, half) if n is None else n
            shift = c + (n - n.detach())  # the value is c exactly; the gradient is that of n
        return exp_(p.sub_(shift)), c, n if query_norm else None
    n = half_sq_norm(x, half) if n is None else n
    if not stabilize:
        return p.sub_(n).exp_(), None, n
    if key_stabilizer is None:
        rows = row_max(p.detach()) - n.detach()  # (..., N, 1)
        c = slice_max(rows) if row_stabilizer is None else row_stabilizer(rows)
        # (p - n) - c, never p - (n + c): each fl(p_ij - n_i) <= fl(max_j p_ij - n_i) = rows_i <= c
        # (the same rounded difference), so no exponent passes 0 where c bounds the rows. n + c
        # rounds at n's scale (|x| ~ 1e10 in float32: n ~ 1e20, ulp ~ 1e13) and exp overflowed.
        return exp_(p.sub_(n).sub_(c)), c, n
    z = p.sub_(n)
    c = key_stabilizer(z.detach()).detach()
    if _shares_memory(c, z):  # a stabiliser that returns a view of z: keep its values
        c = c.clone()
    return exp_(z.sub_(c)), c, n


def exponential_grads(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, phi: torch.Tensor, half: float | None,
                      need_x: bool = True, need_w: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d x, d w) of the FAVOR+ exponentials phi = exp(x w^T - n - c) (..., N, m) for the gradient g of
    phi, constants c and n = half |x|^2 (half None: no norm term, the queries' shift), O(N m d):
    d p = g phi, d x = d p w - 2 half (sum_a d p_a) x (..., N, d), d w = d p^T x (m, d) summed over
    the leading dims. Under grad mode (double backward) in differentiable operations; otherwise
    with in-place steps. None where not needed.

    >>> import torch
    >>> from fast.features import exponential_grads
    >>> x, w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True), torch.randn(4, 3, dtype=torch.float64)
    >>> phi = torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True))
    >>> g = torch.randn(5, 4, dtype=torch.float64)
    >>> dx, _ = exponential_grads(g, x.detach(), w, phi.detach(), 0.5, need_w=False)
    >>> torch.allclose(dx, torch.autograd.grad(phi, x, g)[0])
    True
    """
    dp = g * phi
    dx = dw = None
    if need_x:
        dx = dp @ w
        if half is not None:
            rows = dp.sum(-1, keepdim=True)
            dx = dx - (2.0 * half) * rows * x if torch.is_grad_enabled() else dx.addcmul_(rows, x, value=-2.0 * half)
    if need_w:
        dw = dp.reshape(-1, dp.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1])
    return dx, dw


class _Exponentials(torch.autograd.Function):
    """phi = ``build()`` (favor_exponentials' operations, no graph) with the gradient of
    exp(x w^T - n - c) (``exponential_grads``); saves x, w and phi; double backward through the
    differentiable form."""

    @staticmethod
    def forward(ctx, x, w, build, half):
        phi = build()
        ctx.half = half
        ctx.save_for_backward(x, w, phi)
        return phi

    @staticmethod
    def backward(ctx, g):
        x, w, phi = ctx.saved_tensors
        dx, dw = exponential_grads(g, x, w, phi, ctx.half, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return dx, dw, None, None


class FeatureMap(nn.Module):
    """Base class: ``forward(x, is_query)`` maps (..., N, d) to (..., N, m).

    ``is_query`` only matters for the stabiliser of the positive random feature maps; ``positive``
    says that every feature is >= 0 (masked_linear_attention may then promise features_nonnegative).

    >>> import torch
    >>> from fast.features import FeatureMap
    >>> class Square(FeatureMap):
    ...     positive = True
    ...     def forward(self, x, is_query=False):
    ...         return x * x
    >>> Square()(torch.tensor([[-2., 3.]])).tolist()
    [[4.0, 9.0]]
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

    def _checked(self, x: torch.Tensor) -> torch.Tensor:
        """x in its compute dtype (half precisions work in float32; no copy otherwise), its width checked."""
        check_tensor("x", x, min_dim=2, check_finite=False)
        if x.shape[-1] != self.projection.shape[1]:
            raise ValueError(
                f"x has feature width {x.shape[-1]} but projection expects d={self.projection.shape[1]}"
            )
        return x.to(compute_dtype(x.dtype))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x in its compute dtype, x W^T): half precisions work in float32."""
        x = self._checked(x)
        return x, x @ self.projection.to(x.dtype).T

    def _exp(self, z: torch.Tensor, is_query: bool, key_stabilizer=None) -> torch.Tensor:
        """exp(z - c) with the stabiliser's constants c (detached) when ``stabilize``."""
        if self.stabilize:
            if is_query:
                c = row_max(z.detach())
            elif key_stabilizer is not None:
                c = key_stabilizer(z)
            else:
                c = z.amax(dim=(-2, -1), keepdim=True)
            z = z - c.detach()
        return torch.exp(z)


class FavorPlus(_Projected):
    """FAVOR+ positive random features (Performer Lemma 1; wu22 Eq. 4), (..., N, d) -> (..., N, m).

    phi(x) = exp(W x - |x|^2/2) / sqrt(m) for projection W (m, d), stabilised by default (module
    doc); E[phi(x).phi(y)] = exp(x.y). O(N m d). Stabilised features stay exact and finite where
    |x|^2 / 2 itself overflows (float32 |x| >~ 1.8e19: the norm term is then formed as differences
    between rows). ValueError names ``projection`` (not (m, d)) or ``x`` (wrong width d; W x, or
    every row norm of a slice, beyond the dtype's maximum).

    >>> import torch
    >>> from fast.features import FavorPlus, gaussian_projection
    >>> g = torch.Generator().manual_seed(0)
    >>> w, x = gaussian_projection(8, 3, generator=g), torch.randn(5, 3, generator=g)
    >>> phi = FavorPlus(w, stabilize=False)(x)
    >>> dense = torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / 8 ** 0.5
    >>> tuple(phi.shape), torch.allclose(phi, dense)
    ((5, 8), True)
    """

    positive = True

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, m); key_stabilizer(z) -> per-key constants (docs/papers.md
        Sec. 0, "Stabiliser")."""
        return self.exponentials(x, is_query, key_stabilizer) / math.sqrt(self.m)

    def exponentials(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """sqrt(m) phi(x) = exp(W x - |x|^2/2 - c): the features without their 1/sqrt(m), (..., N, d) -> (..., N, m).

        Stabilised, the largest entry of each query row and of each key slice is exactly 1, every
        entry at most 1 (keys of any finite |x|^2 / 2 included); that of the keys sharing one
        constant of ``key_stabilizer`` is 1 up to round-off.
        fast.favor_attention uses these: the factor 1/sqrt(m) cancels in attention's ratio, and
        without it the denominator is measured against the largest features (its guard refuses a
        den below float's normal range). One GEMM and about one elementwise pass (``favor_exponentials``).
        """
        x = self._checked(x)
        w = self.projection.to(x.dtype)
        out, _, n = favor_exponentials(x, w, 0.5, is_query=is_query, stabilize=self.stabilize,
                                       key_stabilizer=key_stabilizer)
        # |x|^2 / 2 overflows (float32 |x| >~ 1.8e19) where the stabilised features do not: the
        # constant then meets inf - inf. One read of the (N, 1) norm term tells; the rare path forms
        # the exponents without it (_overflowed_norm_exponentials).
        if self.stabilize and n is not None and not bool(torch.isfinite(n).all()):
            out = _overflowed_norm_exponentials(x, w, is_query, key_stabilizer)
        return out


def _overflowed_norm_exponentials(x: torch.Tensor, w: torch.Tensor, is_query: bool,
                                  key_stabilizer=None) -> torch.Tensor:
    """FavorPlus.exponentials (stabilised) where some |x|^2 / 2 overflows: the same numbers, formed
    without n = |x|^2 / 2. Queries: exp(p - max_a p) (n cancels; its gradient, x, enters through the
    zero-valued (x - x') . x', x' = x detached). Keys: z' = p - (n_j - n_0) with n_0 = r_0^2 / 2 of the
    slice's smallest row norm r_0 (detached) and n_j - n_0 = (r_j - r_0)(r_j + r_0) / 2, which overflows
    only where the exact feature underflows to 0; every constant is a maximum of exponents, so
    exp(z' - c(z')) = exp(z - c(z)). Row norms r_j = s_j |x_j / s_j|, s_j = max |x_j| (no overflow); the
    gradient of n_j (x_j) enters through a zero-valued term, as the queries' does.
    ValueError naming x when W x or even the smallest row norm of a slice overflows."""
    p = x @ w.transpose(-1, -2)
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"x is too large for FAVOR+ features in {x.dtype}: its projection W x overflows "
                         f"(largest |x| entry {float(x.detach().abs().amax()):.3g}); rescale x or compute in float64")
    if is_query:
        xd = x.detach()
        shift = p.detach().amax(-1, keepdim=True) + ((x - xd) * xd).sum(-1, keepdim=True)
        return (p - shift).exp()
    xd = x.detach()
    top = xd.abs().amax(-1, keepdim=True)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    r = torch.linalg.vector_norm(xd / safe, dim=-1, keepdim=True) * safe  # (..., N, 1)
    r0 = r.amin(-2, keepdim=True)  # (..., 1, 1)
    if not bool(torch.isfinite(r0).all()):
        raise ValueError("x has a (batch, head) slice whose every row norm |x_j| overflows its dtype "
                         f"({x.dtype}): FAVOR+ features exp(W x - |x|^2 / 2) are undefined there; rescale x "
                         "or compute in float64")
    # the value of n_j - n_0, with the gradient of n_j (x_j) through a zero-valued term: differentiating
    # the product itself would form r_j^2 on the way back, which overflows as n does
    z = p - (0.5 * (r - r0) * (r + r0) + ((x - xd) * xd).sum(-1, keepdim=True))
    if key_stabilizer is None:
        c = slice_max(z.detach().amax(-1, keepdim=True))
    else:
        c = key_stabilizer(z.detach()).detach()
    return (z - c).exp()


class Hyperbolic(_Projected):
    """Hyperbolic positive random features (Performer; docs/papers.md Sec. 0), (..., N, d) -> (..., N, 2m).

    phi(x) = [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m), O(N m d); errors as FavorPlus.

    >>> import torch
    >>> from fast.features import Hyperbolic, gaussian_projection
    >>> g = torch.Generator().manual_seed(0)
    >>> w, x = gaussian_projection(4, 3, generator=g), torch.randn(5, 3, generator=g)
    >>> half = (x * x).sum(-1, keepdim=True) / 2
    >>> dense = torch.cat([torch.exp(x @ w.T - half), torch.exp(-x @ w.T - half)], -1) / 8 ** 0.5
    >>> torch.allclose(Hyperbolic(w, stabilize=False)(x), dense)
    True
    """

    positive = True

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, 2m)."""
        x, p = self._project(x)
        half = 0.5 * (x * x).sum(-1, keepdim=True)
        z = torch.cat([p - half, -p - half], dim=-1)
        return self._exp(z, is_query, key_stabilizer) / math.sqrt(2 * self.m)


class TrigRFF(_Projected):
    """Trigonometric random Fourier features of exp(x.y) (Performer), (..., N, d) -> (..., N, 2m).

    phi(x) = exp(|x|^2/2) [cos W x, sin W x] / sqrt(m), O(N m d); never stabilised. Not positive:
    the attention denominator can vanish or turn negative. Errors as FavorPlus.

    >>> import torch
    >>> from fast.features import TrigRFF, gaussian_projection
    >>> g = torch.Generator().manual_seed(0)
    >>> w, x = gaussian_projection(4, 3, generator=g), torch.randn(5, 3, generator=g)
    >>> scale = torch.exp((x * x).sum(-1, keepdim=True) / 2) / 4 ** 0.5
    >>> torch.allclose(TrigRFF(w)(x), torch.cat([torch.cos(x @ w.T), torch.sin(x @ w.T)], -1) * scale)
    True
    """

    def __init__(self, projection: torch.Tensor):
        super().__init__(projection, stabilize=False)

    def forward(self, x: torch.Tensor, is_query: bool = False, key_stabilizer=None) -> torch.Tensor:
        """x (..., N, d) -> (..., N, 2m)."""
        x, p = self._project(x)
        scale = torch.exp(0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(self.m)
        return torch.cat([torch.cos(p), torch.sin(p)], dim=-1) * scale


class ReLU(FeatureMap):
    """phi(x) = max(x, 0), (..., N, d) -> (..., N, d), O(N d) (reid25's choice). Rows of all-negative
    x give phi = 0. TypeError / ValueError name ``x`` (not a floating tensor).

    >>> import torch
    >>> from fast.features import ReLU
    >>> ReLU()(torch.tensor([[-1., 2.]])).tolist()
    [[0.0, 2.0]]
    """

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        return torch.relu(x)


class _EluPlusOneFn(torch.autograd.Function):
    """y = ELU(x) + 1 = e + max(x, 0) with e = exp(min(x, 0)); dy/dx = e (1 for x > 0, exp(x)
    otherwise), so backward reads only e (double backward forms it again from x). Forward: two
    clamps, an in-place exponential (``exp_``: on the CPU 2^(z log2 e), 0.14 ms against 0.36 ms for
    torch's exp on 2^20 numbers, 2 threads, relative error (2 |z| + 4) u) and an add (torch's ELU
    runs a scalar expm1 on CPU). e is saved, not y: a caller may modify y in place."""

    @staticmethod
    def forward(ctx, x):
        e = exp_(torch.clamp(x, max=0.0))
        ctx.save_for_backward(x, e)
        return torch.clamp(x, min=0.0).add_(e)

    @staticmethod
    def backward(ctx, grad):
        x, e = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: e again, as a function of x
            e = torch.exp(torch.clamp(x, max=0.0))
        return grad * e


def _elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """ELU(x) + 1 written for torch.compile (one fused kernel, forward and backward); the
    derivative at 0 is exp(0) = 1, as ELU's. exp of min(x, 0): the branch not taken must stay
    finite, or its backward gives 0 * inf = NaN for x > 88 (float32)."""
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


_compiled_elu_plus_one = None


def _compiled() -> object:
    global _compiled_elu_plus_one
    if _compiled_elu_plus_one is None:
        _compiled_elu_plus_one = torch.compile(_elu_plus_one)
    return _compiled_elu_plus_one


class EluPlusOne(FeatureMap):
    """phi(x) = ELU(x) + 1 >= 0, (..., N, d) -> (..., N, d), O(N d) (Katharopoulos et al. 2020).

    Computed as exp(min(x, 0)) + max(x, 0), equal to torch's elu(x) + 1 up to round-off, with a
    backward that keeps only exp(min(x, 0)) (docs/papers.md, "fast.features"). compiled=True
    (opt-in): torch.compile of the map, one fused kernel; the first call compiles, and it needs
    torch.compile's toolchain. TypeError names ``compiled`` (not a bool) or ``x``.

    >>> import torch
    >>> from fast.features import EluPlusOne
    >>> x = torch.linspace(-3, 3, 7)
    >>> torch.allclose(EluPlusOne()(x), torch.nn.functional.elu(x) + 1), bool((EluPlusOne()(x) > 0).all())
    (True, True)
    """

    positive = True

    def __init__(self, compiled: bool = False):
        super().__init__()
        if not isinstance(compiled, bool):
            raise TypeError(f"compiled must be a bool, got {type(compiled).__name__}")
        self.compiled = compiled

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        if self.compiled:
            return _compiled()(x)
        return _EluPlusOneFn.apply(x)


class Identity(FeatureMap):
    """phi(x) = x, (..., N, d) -> (..., N, d): signed features, so the denominator may vanish.

    >>> import torch
    >>> from fast.features import Identity
    >>> x = torch.tensor([[-1., 2.]])
    >>> torch.equal(Identity()(x), x)
    True
    """

    def forward(self, x: torch.Tensor, is_query: bool = False) -> torch.Tensor:
        check_floating("x", x)
        return x
