"""Relative-position masks as FFT operators: 1-D Toeplitz and d-D block-Toeplitz (choromanski22
Sec. 3.2, Lemma 3.3, Cor. 3.4; Luo et al. 2021; docs/papers.md Sec. 1).

Offsets run query minus key: M_xy = f(x - y). On an n_1 x ... x n_d grid in row-major order (d = 1
is a sequence) the table has shape (2 n_1 - 1, ..., 2 n_d - 1) with ``table[delta + (n - 1)] =
f(delta)``; in 1-D, coeffs (2N - 1,) over offsets -(N-1)..N-1. M @ x is a circular convolution of
a 5-smooth size by batched FFTs, x (..., N, c) -> (..., N, c) in O(c N log N). The transforms run
in float64 by default (``transform_dtype``): an FFT's round-off is normwise, which float32 would
let swamp small FAVOR+ denominators. A table with negative entries is accepted; ``nonnegative``,
``abs_matmul`` and ``roundoff_bound`` let the driver's guard refuse a vanishing denominator.
Derivation, precision and the round-off bound: docs/papers.md, fast.masks.toeplitz.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence

import torch

from fast.algebra import masked_products
from fast.fft import fast_fft_size
from fast.operator import MaskOperator
from fast.validation import check_allocation, check_positive_int, check_tokens, compute_dtype

#: Bound on the complex spectral buffer of one batched transform (bytes); more columns are chunked.
DEFAULT_MAX_CHUNK_BYTES = 256 * 2**20
#: Real dtype of the transforms for float32 and half inputs (float64 inputs always use float64).
DEFAULT_TRANSFORM_DTYPE = torch.float64
#: Constant of the first-order FFT-convolution bound |err| <= C u log2(n_fft) |table|_1 |x_col|_2
#: (docs/papers.md, fast.masks.toeplitz derives it: 3 transforms x 6.7 u per level + 4 u, rounded up).
_ROUNDOFF_C = 24.0
#: Most axes handed to one torch.fft call: MKL refuses transforms of 8 or more axes, so a grid of
#: more axes is transformed in groups of this many (the d-D DFT is separable).
_FFT_AXES_PER_CALL = 3


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
        what = f"a tensor of dtype {table.dtype}" if isinstance(table, torch.Tensor) else type(table).__name__
        raise TypeError(f"{name} must be a floating torch.Tensor of shape {want}, got {what}")
    if tuple(table.shape) != want:
        raise ValueError(f"{name} must have shape {want} (2 n_k - 1 offsets per axis) for grid {shape}, got {tuple(table.shape)}")
    if not bool(torch.isfinite(table).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return table


def _check_log(name: str, b: object) -> None:
    """Logits of a positive mask: floating, no NaN or +inf (-inf is allowed: weight 0)."""
    if not isinstance(b, torch.Tensor) or not b.is_floating_point():
        what = f"a tensor of dtype {b.dtype}" if isinstance(b, torch.Tensor) else type(b).__name__
        raise TypeError(f"{name} must be a floating torch.Tensor, got {what}")
    if bool(torch.isnan(b).any()) or bool((b == torch.inf).any()):
        raise ValueError(f"{name} contains NaN or +inf")


def _check_float_dtype(name: str, dtype: object, allowed=(torch.float16, torch.bfloat16, torch.float32, torch.float64)):
    if not isinstance(dtype, torch.dtype) or dtype not in allowed:
        raise TypeError(f"{name} must be one of {', '.join(str(a) for a in allowed)}, got {dtype!r}")
    return dtype


def _values_of(f: Callable, arg: torch.Tensor, what: str, dtype: torch.dtype) -> torch.Tensor:
    """f(arg) checked: a tensor (or a number / array) of arg's shape or a scalar, real, finite ->
    a ``dtype`` tensor of arg's shape. ``what`` names arg in the errors."""
    if not callable(f):
        raise TypeError(f"f must be a callable mapping a tensor of {what} to values, got {type(f).__name__}")
    values = f(arg)
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(values, device=arg.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"f must return a real tensor of shape {tuple(arg.shape)} (one value per entry of the "
                            f"{what}) or a scalar, got {type(values).__name__} ({exc})") from None
    integral = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    if values.is_complex() or not (values.is_floating_point() or values.dtype in integral):
        raise TypeError(f"f must return real values (a float, int or bool tensor) of shape {tuple(arg.shape)}, "
                        f"got dtype {values.dtype}")
    if values.dim() != 0 and tuple(values.shape) != tuple(arg.shape):
        raise ValueError(f"f must return a tensor of shape {tuple(arg.shape)} (one value per entry of the {what}) "
                         f"or a scalar, got shape {tuple(values.shape)}")
    if values.device != arg.device:
        raise ValueError(f"f must return a tensor on {arg.device} (the device of the {what}), got {values.device}")
    values = values.to(dtype)
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"f returned non-finite values (NaN or inf, after conversion to {dtype}) on the {what}")
    return values.expand(arg.shape).contiguous()  # a scalar becomes a table of its own (writable in place)


def grid_offsets(shape: Sequence[int], device=None) -> torch.Tensor:
    """Offset vectors of a table for ``shape`` (n_1, ..., n_d): (2 n_1 - 1, ..., 2 n_d - 1, d) int64,
    entry [i_1, ..., i_d] = (i_1 - (n_1 - 1), ..., i_d - (n_d - 1)). O(prod(2 n_k) d). TypeError or
    ValueError naming shape unless it is a non-empty tuple of positive ints.

    >>> from fast.masks.toeplitz import grid_offsets
    >>> off = grid_offsets((2, 3))
    >>> tuple(off.shape), off[0, 0].tolist(), off[1, 2].tolist()
    ((3, 5, 2), [-1, -2], [0, 0])
    """
    shape = _check_shape(shape)
    check_allocation(f"shape = {shape}", (*(2 * n - 1 for n in shape), len(shape)), torch.int64, device,
                     what="the grid offsets")
    axes = [torch.arange(-(n - 1), n, device=device) for n in shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)


def _groups(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    """dims in consecutive groups of at most _FFT_AXES_PER_CALL, counted from the end (the last
    group holds dims[-1], the half-spectrum axis of rfftn)."""
    out, end = [], len(dims)
    while end > 0:
        out.insert(0, dims[max(0, end - _FFT_AXES_PER_CALL):end])
        end -= _FFT_AXES_PER_CALL
    return out


def _rfftn(x: torch.Tensor, s: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """torch.fft.rfftn(x, s, dims) for any number of axes (groups of <= _FFT_AXES_PER_CALL)."""
    if len(dims) <= _FFT_AXES_PER_CALL:
        return torch.fft.rfftn(x, s=s, dim=dims)
    size = dict(zip(dims, s))
    groups = _groups(dims)
    out = torch.fft.rfftn(x, s=[size[a] for a in groups[-1]], dim=groups[-1])  # the real half-axis last
    for g in groups[:-1]:
        out = torch.fft.fftn(out, s=[size[a] for a in g], dim=g)
    return out


def _irfftn(z: torch.Tensor, s: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """torch.fft.irfftn(z, s, dims) for any number of axes (the inverse of ``_rfftn``)."""
    if len(dims) <= _FFT_AXES_PER_CALL:
        return torch.fft.irfftn(z, s=s, dim=dims)
    size = dict(zip(dims, s))
    groups = _groups(dims)
    for g in groups[:-1]:
        z = torch.fft.ifftn(z, s=[size[a] for a in g], dim=g)
    return torch.fft.irfftn(z, s=[size[a] for a in groups[-1]], dim=groups[-1])


def _window_counts(table: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """For each grid node x: how many nodes y give a nonzero table[x - y + n - 1] (int64, grid's shape).

    Row x of M reads the table box [x, x + n - 1] on every axis: a separable box sum of the
    nonzero indicator, one cumulative sum per axis (exact in integers)."""
    counts = (table.detach() != 0).to(torch.int64)
    for axis, n in enumerate(grid):
        cs = torch.nn.functional.pad(counts.movedim(axis, -1).cumsum(-1), (1, 0))  # cs[i] = sum of the first i
        counts = (cs[..., n:2 * n] - cs[..., :n]).movedim(-1, axis)
    return counts


class BlockToeplitzMask(MaskOperator):
    """M_xy = table[x - y + (n - 1)] for nodes x, y of an n_1 x ... x n_d grid in row-major order
    (choromanski22 Lemma 3.3): relative-position masks on images (d = 2) and video (d = 3).

    shape: (n_1, ..., n_d), any d >= 1 and sides; table: (2 n_1 - 1, ..., 2 n_d - 1) floating, may
    require grad (a learnable per-offset table; never cached, so products use its current values).
    cls_token=True prepends one token (index 0) that attends to and is attended by every token with
    weight 1: N = prod(shape) + 1. transform_dtype: the real dtype of the FFTs for float32 / half
    inputs, torch.float64 (default) or torch.float32. ``matmul`` / ``rmatmul`` / ``abs_matmul``:
    x (..., N, c) -> (..., N, c) in O(c N log N); construction O(prod(n_fft)). Raises TypeError for
    a shape, table or transform_dtype of the wrong type, ValueError for a table of the wrong shape or
    with NaN / inf, and for an ``n`` that disagrees with the grid.

    >>> import torch
    >>> from fast import BlockToeplitzMask
    >>> g = torch.Generator().manual_seed(0)
    >>> table = torch.rand(3, 5, generator=g, dtype=torch.float64)       # grid (2, 3)
    >>> pos = torch.cartesian_prod(torch.arange(2), torch.arange(3))     # node coordinates, row-major
    >>> off = pos[:, None] - pos[None] + torch.tensor([1, 2])            # x - y + (n - 1)
    >>> dense = table[off[..., 0], off[..., 1]]                          # (6, 6)
    >>> x = torch.rand(6, 2, generator=g, dtype=torch.float64)
    >>> torch.allclose(BlockToeplitzMask((2, 3), table).matmul(x), dense @ x)
    True
    """

    _TABLE_NAME = "table"  # the argument named in errors

    def __init__(self, shape: Sequence[int], table: torch.Tensor, *, cls_token: bool = False,
                 n: int | None = None, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
                 transform_dtype: torch.dtype = DEFAULT_TRANSFORM_DTYPE):
        self.grid_shape = _check_shape(shape)
        want = tuple(2 * s - 1 for s in self.grid_shape)
        self.table = _check_table(self._TABLE_NAME, table, want, self.grid_shape)
        self.cls_token = bool(cls_token)
        self.num_grid = math.prod(self.grid_shape)
        self.n = self.num_grid + int(self.cls_token)
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n != self.n):
            raise ValueError(f"grid shape {self.grid_shape} has {self.num_grid} nodes"
                             f"{' + 1 CLS token' if self.cls_token else ''} = {self.n} tokens, but n={n!r}")
        self.n_fft = tuple(fast_fft_size(w) for w in want)
        self.max_chunk_bytes = check_positive_int("max_chunk_bytes", max_chunk_bytes, "a positive int (bytes)")
        self.transform_dtype = _check_float_dtype("transform_dtype", transform_dtype, (torch.float32, torch.float64))

    @property
    def no_key_cause(self) -> str:
        """Named in the DenominatorError of a query that sees no key (fast.operator)."""
        log = "log_coeffs" if self._TABLE_NAME == "coeffs" else "log_table"
        return f"{self._TABLE_NAME} is 0 at every offset they reach (a {log} entry of -inf gives 0)"

    @property
    def nonnegative(self) -> bool:
        """True when every table entry is >= 0 (then M >= 0): read from the current table."""
        return bool((self.table.detach() >= 0).all())

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_distance(cls, shape: Sequence[int], f: Callable[[torch.Tensor], torch.Tensor], *,
                      dtype: torch.dtype = torch.float32, device=None, **kw) -> "BlockToeplitzMask":
        """M_xy = f(|x - y|_1): f maps a ``dtype`` tensor of L1 grid distances (the table's shape) to
        values of that shape (or a scalar), real and finite (TypeError / ValueError naming f otherwise).
        """
        _check_float_dtype("dtype", dtype)
        dist = grid_offsets(shape, device).abs().sum(-1).to(dtype)
        return cls(shape, _values_of(f, dist, "L1 grid distances", dtype), **kw)

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

    def _work_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The real dtype the transforms of an input of ``dtype`` run in."""
        return torch.promote_types(compute_dtype(dtype), self.transform_dtype)

    def _spectrum_of(self, table: torch.Tensor, device, dtype: torch.dtype) -> torch.Tensor:
        t = table.to(device=device, dtype=torch.float64)
        pad = []
        for w, nf in zip(reversed(t.shape), reversed(self.n_fft)):
            pad += [0, nf - w]
        first_col = torch.nn.functional.pad(t, pad)
        # offset delta (table index delta + n - 1) moves to circular position delta mod n_fft
        first_col = torch.roll(first_col, shifts=[-(n - 1) for n in self.grid_shape], dims=list(range(len(self.n_fft))))
        spec = _rfftn(first_col, self.n_fft, tuple(range(len(self.n_fft))))
        return spec.to(torch.complex64 if dtype == torch.float32 else torch.complex128)

    def spectrum(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfftn of the circulant embedding of the current table: (n_fft_1, ..., n_fft_d // 2 + 1),
        complex64 for dtype float32, else complex128, computed in float64 on every call (one column's
        transform); it carries the table's gradient if the table requires grad.
        """
        return self._spectrum_of(self.table, device, dtype)

    def _grid_product(self, x: torch.Tensor, spec: torch.Tensor, work: torch.dtype,
                      out_dtype: torch.dtype) -> torch.Tensor:
        """Block-Toeplitz product on the grid part with a given spectrum: x (..., N_grid, c) -> (..., N_grid, c)
        in ``out_dtype``, the transforms in ``work`` (the real dtype matching spec)."""
        per_col = spec.numel() * spec.element_size() * 2  # spectrum of x and the product
        step = max(1, self.max_chunk_bytes // per_col)
        if torch.is_grad_enabled() and (x.requires_grad or spec.requires_grad):
            return self._grid_product_autograd(x.to(work), spec, step).to(out_dtype)
        return self._grid_product_fused(x, spec, step, work, out_dtype)

    def _grid_product_autograd(self, x: torch.Tensor, spec: torch.Tensor, step: int) -> torch.Tensor:
        """_grid_product under autograd: differentiable out-of-place steps."""
        lead, c = x.shape[:-2], x.shape[-1]
        d = len(self.grid_shape)
        cols = x.transpose(-1, -2).reshape(-1, *self.grid_shape)  # (P, n_1, ..., n_d): one column each
        dims = tuple(range(1, d + 1))
        crop = (slice(None),) + tuple(slice(0, n) for n in self.grid_shape)

        def block(a: int, b: int) -> torch.Tensor:
            return _irfftn(_rfftn(cols[a:b], self.n_fft, dims) * spec, self.n_fft, dims)[crop]

        if step >= cols.shape[0]:
            out = block(0, cols.shape[0])
        else:
            # writes into one buffer would make each chunk's backward copy the whole gradient
            # (CopySlices); cropped copies joined by cat split it as views instead
            out = torch.cat([block(a, a + step).contiguous() for a in range(0, cols.shape[0], step)])
        return out.reshape(*lead, c, self.num_grid).transpose(-1, -2)

    def _grid_product_fused(self, x: torch.Tensor, spec: torch.Tensor, step: int, work: torch.dtype,
                            out_dtype: torch.dtype) -> torch.Tensor:
        """_grid_product without autograd: per chunk of columns, one copy of x into a zero-padded
        buffer (transpose and pad in one pass), the transforms with the spectral product in place,
        and one copy of the cropped result into the output (crop, transpose and cast in one pass):
        3 passes over the padded columns besides the transforms, where the out-of-place steps take 7."""
        lead, n_grid, c = x.shape[:-2], x.shape[-2], x.shape[-1]
        d = len(self.grid_shape)
        x3 = x.reshape(-1, n_grid, c)
        out = torch.empty((x3.shape[0], n_grid, c), dtype=out_dtype, device=x.device)
        src = x3.transpose(1, 2).unflatten(-1, self.grid_shape)  # (B, c, n_1, ..., n_d) views
        dst = out.transpose(1, 2).unflatten(-1, self.grid_shape)
        dims = tuple(range(2, d + 2))
        crop = (slice(None), slice(None)) + tuple(slice(0, n) for n in self.grid_shape)
        b_step, c_step = (max(1, step // c), c) if step >= c else (1, step)
        for b0 in range(0, x3.shape[0], b_step):
            for c0 in range(0, c, c_step):
                part = src[b0:b0 + b_step, c0:c0 + c_step]
                buf = torch.empty((*part.shape[:2], *self.n_fft), dtype=work, device=x.device)
                if d == 1:
                    buf[..., n_grid:].zero_()
                else:
                    buf.zero_()
                buf[crop].copy_(part)
                f = _rfftn(buf, self.n_fft, dims)
                del buf
                f.mul_(spec)
                dst[b0:b0 + b_step, c0:c0 + c_step].copy_(_irfftn(f, self.n_fft, dims)[crop])
                del f
        return out.reshape(*lead, n_grid, c)

    def _zero_unseen_rows(self, out: torch.Tensor, table: torch.Tensor, transpose: bool) -> torch.Tensor:
        """Rows of M (of M^T) whose table entries are all 0 are exactly 0 (not FFT noise): (..., N_grid, c)."""
        if self.cls_token or bool((table != 0).all()):  # with CLS every token sees the CLS token
            return out
        t = table.flip(tuple(range(table.dim()))) if transpose else table
        unseen = (_window_counts(t, self.grid_shape) == 0).reshape(self.num_grid, 1)
        if not bool(unseen.any()):
            return out
        if out.requires_grad:  # value exactly 0 there, gradient unchanged (d/dt of a zero entry need not be 0)
            return out - out.detach() * unseen
        return out.masked_fill(unseen, 0)

    def _product(self, x: torch.Tensor, *, transpose: bool = False, absolute: bool = False) -> torch.Tensor:
        """M x, M^T x or |M| x for x (..., N, c): transforms in the work dtype, cast back to x's dtype."""
        check_tokens("x", x, self.n)
        out_dtype = x.dtype
        work = self._work_dtype(x.dtype)
        table = self.table.abs() if absolute else self.table
        spec = self._spectrum_of(table, x.device, work) if absolute else self.spectrum(x.device, work)
        if transpose:  # the circulant of the reversed table: the conjugate spectrum (a real table)
            spec = spec.conj()
        if not self.cls_token:
            return self._zero_unseen_rows(self._grid_product(x, spec, work, out_dtype), table, transpose)
        cls, grid = x[..., :1, :].to(work), x[..., 1:, :]
        total = x.sum(-2, keepdim=True, dtype=work)  # the CLS row (and column): weight 1 on every token
        out_grid = self._grid_product(grid, spec, work, work) + cls  # every grid token also sees CLS with weight 1
        return torch.cat([total, out_grid], dim=-2).to(out_dtype)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., N, c) -> (..., N, c) in x's dtype, O(c N log N); the transforms run in
        float64 (``transform_dtype``) for float32 and half x, in float64 for float64 x."""
        return self._product(x)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x for x (..., N, c) -> (..., N, c): the product with the conjugate spectrum (the
        reversed table; the CLS row and column are both ones)."""
        return self._product(x, transpose=True)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """|M| @ x for x (..., N, c) -> (..., N, c): the product with |table| (contract C1: B >= |M|,
        here B = |M|), for the driver's guard when the table has negative entries."""
        return self._product(x, absolute=True)

    def transposed(self) -> "BlockToeplitzMask":
        """A new operator of M^T: M^T_xy = M_yx = f(y - x), the table reversed along every axis (the
        CLS row and column are both ones). It holds a reversed COPY of the table (taken now): later
        in-place changes of this table do not reach it; ``rmatmul`` always reads the current table."""
        return BlockToeplitzMask(self.grid_shape, self.table.flip(tuple(range(self.table.dim()))),
                                 cls_token=self.cls_token, max_chunk_bytes=self.max_chunk_bytes,
                                 transform_dtype=self.transform_dtype)

    def _roundoff_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Per-column bound (..., c) on |fl(M x) - M x| for x (..., N, c): C u log2(prod n_fft) |table|_1
        |x_col|_2 (plus a CLS token's column-sum error), in fast.validation.compute_dtype(x.dtype); u is
        the unit round-off of the transforms. First-order and normwise; derivation in docs/papers.md,
        fast.masks.toeplitz.
        """
        xd = x.detach()
        u = torch.finfo(self._work_dtype(x.dtype)).eps / 2
        levels = math.log2(max(2, math.prod(self.n_fft)))
        t1 = float(torch.linalg.vector_norm(self.table.detach().double(), ord=1))
        bound = _ROUNDOFF_C * u * levels * t1 * torch.linalg.vector_norm(xd, dim=-2, dtype=torch.float64)
        if self.cls_token:
            bound = bound + (math.log2(self.n) + 32) * u * xd.abs().sum(-2, dtype=torch.float64)
        return bound.to(compute_dtype(x.dtype))

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1: D1 = M [vec(phi_k v^T)], D2 = M phi_k, for
        phi_q, phi_k (..., N, m) and v (..., N, d), O(m d N log N).

        The m d + m columns go through batched transforms in feature blocks of about
        ``max_chunk_bytes`` of token-domain data each, through fast.algebra.masked_products: under
        autograd only phi_q, phi_k, v are saved and a learnable table gets its gradient. The
        denominators are guarded by the driver (fast.masked_linear_attention).
        """
        work_size = torch.empty((), dtype=self._work_dtype(v.dtype)).element_size()
        per_feature = math.prod(v.shape) * work_size  # one feature's d columns over all tokens
        return masked_products(phi_q, phi_k, v, self, max(1, self.max_chunk_bytes // max(1, per_feature)))


class ToeplitzMask(BlockToeplitzMask):
    """1-D relative-position mask M_ij = xi(i - j) (choromanski22 Sec. 3.2): coeffs (2N - 1,) over
    offsets -(N-1)..N-1; ValueError naming coeffs unless it is 1-D of odd length.

    Asymmetric xi allowed; xi = 0 on negative offsets (keys after the query) is a causal RPE.
    Keywords as BlockToeplitzMask (cls_token, n, max_chunk_bytes, transform_dtype). ``matmul``:
    x (..., N, c) -> (..., N, c) in O(c N log N).

    >>> import torch
    >>> from fast import ToeplitzMask
    >>> op = ToeplitzMask.from_function(lambda dist: 0.5 ** dist, 4, dtype=torch.float64)
    >>> i = torch.arange(4, dtype=torch.float64)
    >>> x = torch.rand(4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> torch.allclose(op.matmul(x), 0.5 ** (i[:, None] - i[None]).abs() @ x), tuple(op.coeffs.shape)
    (True, (7,))
    """

    _TABLE_NAME = "coeffs"

    def __init__(self, coeffs: torch.Tensor, **kw):
        if not isinstance(coeffs, torch.Tensor) or coeffs.dim() != 1 or coeffs.numel() % 2 != 1:
            shape = tuple(coeffs.shape) if isinstance(coeffs, torch.Tensor) else type(coeffs).__name__
            raise ValueError(f"coeffs must be a 1-D tensor of odd length 2N - 1 (offsets -(N-1)..N-1), got {shape}")
        super().__init__(((coeffs.numel() + 1) // 2,), coeffs, **kw)

    @property
    def coeffs(self) -> torch.Tensor:
        """The coefficients (2N - 1,) over offsets -(N-1)..N-1 (the table itself)."""
        return self.table

    @classmethod
    def from_function(cls, f: Callable[[torch.Tensor], torch.Tensor], n: int, *, causal: bool = False,
                      dtype: torch.dtype = torch.float32, device=None, **kw) -> "ToeplitzMask":
        """M_ij = f(|i - j|): f maps a ``dtype`` tensor of the 2n - 1 distances |offset| to values of that
        shape (or a scalar), real and finite; causal=True zeroes keys j > i. ValueError naming n unless
        it is a positive int.
        """
        n = check_positive_int("n", n)
        _check_float_dtype("dtype", dtype)
        check_allocation(f"n = {n}", (2 * n - 1,), dtype, device, copies=4, what="the coefficients and their spectrum")
        offsets = torch.arange(-(n - 1), n, device=device)
        values = _values_of(f, offsets.abs().to(dtype), "distances |i - j|", dtype)
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
