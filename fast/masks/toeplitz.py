"""Relative-position masks as FFT operators: 1-D Toeplitz and d-D block-Toeplitz (choromanski22
Sec. 3.2, Lemma 3.3, Cor. 3.4; Luo et al. 2021).

Offsets run query minus key: M_xy = f(x - y). On an n_1 x ... x n_d grid in row-major order
(d = 1 is a sequence) the offset table has shape (2 n_1 - 1, ..., 2 n_d - 1) with
``table[delta + (n - 1)] = f(delta)``; in 1-D that is coeffs[k] = xi(k - (N - 1)), offsets
-(N-1)..N-1.

M @ x is a d-D linear convolution of x (on the grid) with the table. It is computed as a
circular convolution on a grid of n_fft_k >= 2 n_k - 1 points per axis, with n_fft_k the
smallest 5-smooth number (2^a 3^b 5^c) at least 2 n_k - 1: 2N - 1 itself can be prime, and
prime-length transforms are ~3x slower (docs/methods.md). The circulant's first column is the table
rolled so that offset delta sits at delta mod n_fft; its spectrum (rfftn) is computed once per
mask, device and dtype and reused; all columns of x go through one batched rfftn/irfftn (in
chunks that bound the complex buffer to ``max_chunk_bytes``). Cost O(c prod(n_fft) log prod(n_fft))
= O(c N log N) for c columns, since prod(n_fft) <= 2^d N up to the 5-smooth rounding.

Positivity: attention needs M >= 0 (weights of an average). A table with negative entries is
accepted (the papers' learned RPE tables can be), but then a denominator can vanish or change
sign. ``attend`` reports any denominator within the FFT's round-off of zero as a
DenominatorError rather than dividing by it; tables built in log space (``from_log_table``,
M = exp(b)) are positive by construction and are the safe choice.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence

import torch

from fast.algebra import masked_products
from fast.errors import DenominatorError
from fast.fft import fast_fft_size
from fast.masks.base import MaskOperator
from fast.validation import check_positive_int, check_tokens, compute_dtype

#: Bound on the complex spectral buffer of one batched transform (bytes); more columns are chunked.
DEFAULT_MAX_CHUNK_BYTES = 256 * 2**20
#: Safety factor in the FFT round-off bound |err| <= C u log2(n_fft) |table|_2 |x|_2 (Higham, Sec. 24.1).
_ROUNDOFF_C = 8.0


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    try:
        items = tuple(shape)
    except TypeError:
        items = None
    if items is None or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in items):
        raise TypeError(f"shape must be a tuple of positive ints (n_1, ..., n_d), got {shape!r}")
    out = tuple(int(s) for s in items)
    if not out or any(s <= 0 for s in out):
        raise ValueError(f"shape must be a non-empty tuple of positive ints (an empty grid has no nodes), got {tuple(shape)}")
    return out


def _check_table(name: str, table: object, want: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(table, torch.Tensor) or not table.is_floating_point():
        raise TypeError(f"{name} must be a floating torch.Tensor of shape {want}, got {type(table).__name__}")
    if tuple(table.shape) != want:
        raise ValueError(f"{name} must have shape {want} (2 n_k - 1 offsets per axis) for grid {shape}, got {tuple(table.shape)}")
    if not bool(torch.isfinite(table).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return table


def _check_log(name: str, b: object) -> None:
    """Logits of a positive mask: floating, no NaN or +inf (-inf is allowed: weight 0)."""
    if not isinstance(b, torch.Tensor) or not b.is_floating_point():
        raise TypeError(f"{name} must be a floating torch.Tensor, got {type(b).__name__}")
    if bool(torch.isnan(b).any()) or bool((b == torch.inf).any()):
        raise ValueError(f"{name} contains NaN or +inf")


def grid_offsets(shape: Sequence[int], device=None) -> torch.Tensor:
    """Offset vectors of a table for ``shape``: (2 n_1 - 1, ..., 2 n_d - 1, d) int64."""
    shape = _check_shape(shape)
    axes = [torch.arange(-(n - 1), n, device=device) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)


def _version(t: torch.Tensor) -> int:
    """torch's in-place version counter; inference-mode tensors have none (-1: they are constants)."""
    try:
        return t._version
    except RuntimeError:
        return -1


class BlockToeplitzMask(MaskOperator):
    """M_xy = table[x - y + (n - 1)] for nodes x, y of an n_1 x ... x n_d grid (row-major order).

    shape: (n_1, ..., n_d), any d >= 1 and any sides; table: (2 n_1 - 1, ..., 2 n_d - 1) floating
    (may require grad: a learnable per-offset table; its spectrum is then recomputed per call so
    gradients flow). cls_token=True prepends one token (index 0, the vision CLS token) that
    attends to and is attended by every token with weight 1; then N = prod(shape) + 1.
    ``matmul`` takes x (..., N, c). Construction validates and is O(prod(n_fft)).
    """

    _TABLE_NAME = "table"  # the argument named in errors

    def __init__(self, shape: Sequence[int], table: torch.Tensor, *, cls_token: bool = False,
                 n: int | None = None, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES):
        self.grid_shape = _check_shape(shape)
        want = tuple(2 * s - 1 for s in self.grid_shape)
        self.table = _check_table(self._TABLE_NAME, table, want, self.grid_shape)
        self.cls_token = bool(cls_token)
        self.num_grid = math.prod(self.grid_shape)
        self.n = self.num_grid + int(self.cls_token)
        if n is not None and n != self.n:
            raise ValueError(f"grid shape {self.grid_shape} has {self.num_grid} nodes"
                             f"{' + 1 CLS token' if self.cls_token else ''} = {self.n} tokens, but n={n!r}")
        self.n_fft = tuple(fast_fft_size(w) for w in want)
        if not isinstance(max_chunk_bytes, int) or max_chunk_bytes <= 0:
            raise ValueError(f"max_chunk_bytes must be a positive int, got {max_chunk_bytes!r}")
        self.max_chunk_bytes = max_chunk_bytes
        self.nonnegative = bool((self.table >= 0).all())
        self._spectra: dict = {}
        self._transposed: tuple | None = None  # (table version, the operator of M^T)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_distance(cls, shape: Sequence[int], f: Callable[[torch.Tensor], torch.Tensor], *,
                      dtype: torch.dtype = torch.float32, device=None, **kw) -> "BlockToeplitzMask":
        """M_xy = f(|x - y|_1), f mapping a ``dtype`` tensor of L1 grid distances to values."""
        dist = grid_offsets(shape, device).abs().sum(-1).to(dtype)
        values = f(dist)
        if not isinstance(values, torch.Tensor):
            values = torch.as_tensor(values, device=device)
        return cls(shape, values.to(dtype).expand(dist.shape), **kw)

    @classmethod
    def from_log_table(cls, shape: Sequence[int], log_table: torch.Tensor, **kw) -> "BlockToeplitzMask":
        """M = exp(log_table): positive whatever the (learnable) logits b (Luo et al. 2021, ViT RPE).

        -inf logits give weight 0; exp must not overflow; a constant subtracted from b cancels in the attention output.
        """
        shape = _check_shape(shape)
        _check_log("log_table", log_table)
        table = torch.exp(log_table)
        if not bool(torch.isfinite(table).all()):
            raise ValueError("exp(log_table) overflows; subtract a constant from log_table (it cancels in attention)")
        return cls(shape, table, **kw)

    # ------------------------------------------------------------------ the operator

    def spectrum(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfftn of the circulant embedding of the table: (n_fft_1, ..., n_fft_d // 2 + 1) complex."""
        learnable = self.table.requires_grad and torch.is_grad_enabled()
        # the version counter moves on every in-place update (an optimiser step): no stale spectrum
        key = (str(device), dtype, _version(self.table))
        if not learnable and key in self._spectra:
            return self._spectra[key]
        t = self.table.to(device=device, dtype=dtype)
        pad = []
        for w, nf in zip(reversed(t.shape), reversed(self.n_fft)):
            pad += [0, nf - w]
        first_col = torch.nn.functional.pad(t, pad)
        # offset delta (table index delta + n - 1) moves to circular position delta mod n_fft
        first_col = torch.roll(first_col, shifts=[-(n - 1) for n in self.grid_shape], dims=list(range(len(self.n_fft))))
        spec = torch.fft.rfftn(first_col, s=self.n_fft)
        if not learnable:
            self._spectra = {k: v for k, v in self._spectra.items() if k[2] == key[2]}
            self._spectra[key] = spec.detach()
        return spec

    def _grid_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Block-Toeplitz product on the grid part: x (..., N_grid, c) -> (..., N_grid, c)."""
        lead, c = x.shape[:-2], x.shape[-1]
        d = len(self.grid_shape)
        cols = x.transpose(-1, -2).reshape(-1, *self.grid_shape)  # (P, n_1, ..., n_d): one column each
        spec = self.spectrum(x.device, x.dtype)
        dims = tuple(range(1, d + 1))
        per_col = spec.numel() * spec.element_size() * 2  # spectrum of x and the product
        step = max(1, self.max_chunk_bytes // per_col)
        crop = (slice(None),) + tuple(slice(0, n) for n in self.grid_shape)
        if step >= cols.shape[0]:
            out = torch.fft.irfftn(torch.fft.rfftn(cols, s=self.n_fft, dim=dims) * spec, s=self.n_fft, dim=dims)[crop]
        elif torch.is_grad_enabled() and (cols.requires_grad or spec.requires_grad):
            # under autograd, writes into one buffer would make each chunk's backward copy the whole
            # gradient (CopySlices); cropped copies joined by cat split it as views instead
            out = torch.cat([torch.fft.irfftn(torch.fft.rfftn(cols[a:a + step], s=self.n_fft, dim=dims) * spec,
                                              s=self.n_fft, dim=dims)[crop].contiguous()
                             for a in range(0, cols.shape[0], step)])
        else:
            # chunks write into one buffer: a cropped view would keep the padded irfft output alive
            out = torch.empty_like(cols)
            for a in range(0, cols.shape[0], step):
                f = torch.fft.rfftn(cols[a:a + step], s=self.n_fft, dim=dims)
                out[a:a + step] = torch.fft.irfftn(f * spec, s=self.n_fft, dim=dims)[crop]
        return out.reshape(*lead, c, self.num_grid).transpose(-1, -2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., N, c) -> (..., N, c), O(c N log N); half precision runs in float32."""
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        x = x.to(compute_dtype(x.dtype))
        if not self.cls_token:
            return self._grid_matmul(x).to(out_dtype)
        cls, grid = x[..., :1, :], x[..., 1:, :]
        total = x.sum(-2, keepdim=True)  # the CLS row: weight 1 on every token
        out_grid = self._grid_matmul(grid) + cls  # every grid token also sees CLS with weight 1
        return torch.cat([total, out_grid], dim=-2).to(out_dtype)

    def transposed(self) -> "BlockToeplitzMask":
        """The operator of M^T: M^T_xy = M_yx = f(y - x), the table reversed along every axis
        (the CLS row and column are both ones). Cached per table version unless it is learnable."""
        learnable = self.table.requires_grad and torch.is_grad_enabled()
        key = _version(self.table)
        if learnable or self._transposed is None or self._transposed[0] != key:
            op = BlockToeplitzMask(self.grid_shape, self.table.flip(tuple(range(self.table.dim()))),
                                   cls_token=self.cls_token, max_chunk_bytes=self.max_chunk_bytes)
            if learnable:
                return op
            self._transposed = (key, op)
        return self._transposed[1]

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x for x (..., N, c) -> (..., N, c): the same FFT product with the reversed table."""
        return self.transposed().matmul(x)

    def roundoff_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Per-column bound on |fl(M x) - M x| (entrywise): C u log2(prod n_fft) |table|_2 |x_col|_2.

        x: (..., N, c) -> (..., c), in the dtype the product M x is computed in
        (fast.validation.compute_dtype(x.dtype): x's own for float32 and float64, what attend gets).
        The normwise FFT-convolution error bound (Higham, Sec. 24.1) with a safety factor; the CLS
        part is exact sums and adds nothing of its own. The norm is computed in float64: in
        float32 the sum of squares of features above ~1.8e19 overflows, and the guard would then
        refuse valid inputs (guard/<id>'s scaled cases).
        """
        u = torch.finfo(x.dtype).eps / 2
        size = math.log2(max(2, math.prod(self.n_fft)))
        tnorm = float(torch.linalg.vector_norm(self.table.detach().double()))
        bound = _ROUNDOFF_C * u * size * tnorm * torch.linalg.vector_norm(x.detach(), dim=-2, dtype=torch.float64)
        # The bound fits the compute dtype (returned in it: no float64 temporaries in attend). It is
        # |table|_2 |x_col|_2 times C u log2(n_fft) <= 8 * 2^-11 * 64 < 1 (u <= float16's), and
        # |table|_2 |x_col|_2 <= |table|_1 |x_col|_1, the zero-frequency term of the product's
        # spectrum for the nonnegative tables and features the guard must accept, which the
        # transform itself forms in that dtype. A bound beyond the dtype's range (inf) thus comes
        # with an overflowed product, where the guard refusing is right.
        return bound.to(compute_dtype(x.dtype))

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1: D1 = M [vec(phi_k v^T)], D2 = M phi_k.

        The m d + m columns go through batched transforms in feature blocks of about
        ``max_chunk_bytes`` of token-domain data each (the whole of D1 at once would be
        O(N m d) memory: 1.1 GiB at N = 2^20, m = d = 16 in float32, times the copies), through
        fast.algebra.masked_products: under autograd only phi_q, phi_k, v are saved and the blocks
        are transformed again in backward, one at a time; a learnable table gets its gradient.
        Raises DenominatorError where |den_i| is within the FFT round-off bound of zero (a
        vanishing or sign-flipped denominator: M or phi not positive, or round-off at the scale
        of the largest terms), rather than dividing by noise.
        """
        per_feature = math.prod(v.shape) * v.element_size()  # one feature's d columns over all tokens
        num, den = masked_products(phi_q, phi_k, v, self, max(1, self.max_chunk_bytes // max(1, per_feature)))
        with torch.no_grad():  # a test, not part of the output: nothing saved for backward
            floor = (phi_q.abs() @ self.roundoff_bound(phi_k).unsqueeze(-1)).squeeze(-1)  # no (..., N, m) temporary
            bad = den.abs() <= floor
        if bool(bad.any()):
            raise DenominatorError(
                f"attention denominator within FFT round-off of zero at {int(bad.sum())} of {den.numel()} queries "
                f"({'the mask or the features are not positive' if not self.nonnegative else 'round-off dominates'}; "
                "use a positive table, e.g. from_log_table, or float64)")
        return num, den


class ToeplitzMask(BlockToeplitzMask):
    """1-D relative-position mask M_ij = xi(i - j): coeffs (2N - 1,) over offsets -(N-1)..N-1.

    Asymmetric xi allowed; xi = 0 on negative offsets (keys after the query) is a causal RPE.
    """

    _TABLE_NAME = "coeffs"

    def __init__(self, coeffs: torch.Tensor, **kw):
        if not isinstance(coeffs, torch.Tensor) or coeffs.dim() != 1 or coeffs.numel() % 2 != 1:
            shape = tuple(coeffs.shape) if isinstance(coeffs, torch.Tensor) else type(coeffs).__name__
            raise ValueError(f"coeffs must be a 1-D tensor of odd length 2N - 1 (offsets -(N-1)..N-1), got {shape}")
        super().__init__(((coeffs.numel() + 1) // 2,), coeffs, **kw)

    @property
    def coeffs(self) -> torch.Tensor:
        return self.table

    @classmethod
    def from_function(cls, f: Callable[[torch.Tensor], torch.Tensor], n: int, *, causal: bool = False,
                      dtype: torch.dtype = torch.float32, device=None, **kw) -> "ToeplitzMask":
        """M_ij = f(|i - j|) (f maps a ``dtype`` tensor of distances to values); causal=True zeroes keys j > i."""
        n = check_positive_int("n", n)
        offsets = torch.arange(-(n - 1), n, device=device)
        values = f(offsets.abs().to(dtype))
        if not isinstance(values, torch.Tensor):
            values = torch.as_tensor(values, device=device)
        values = values.to(dtype).expand(offsets.shape)
        if causal:
            values = torch.where(offsets < 0, torch.zeros_like(values), values)
        return cls(values, **kw)

    @classmethod
    def from_log_coefficients(cls, log_coeffs: torch.Tensor, **kw) -> "ToeplitzMask":
        """M_ij = exp(b(i - j)) from b (2N - 1,): positive for any (learnable) b; -inf entries give 0."""
        _check_log("log_coeffs", log_coeffs)
        coeffs = torch.exp(log_coeffs)
        if not bool(torch.isfinite(coeffs).all()):
            raise ValueError("exp(log_coeffs) overflows; subtract a constant from log_coeffs (it cancels in attention)")
        return cls(coeffs, **kw)
