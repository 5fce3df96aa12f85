"""FAVOR+ exponentials as Triton kernels (Performer Lemma 1; fast.features.favor_exponentials is
their twin and fallback): the driver's features for a mask whose key constants are a function of
the keys' row maxima (fast.attention's favor_attention with a mask, e.g. CausalMask).

For rows x (R, d) (every (batch, head) slice's tokens, one projection w (m, d) for all), with
p = x w^T (R, m) and n = half |x|^2 (R, 1):

    queries:  phi_q = exp(p - max_a p_a)                 (the norm term cancels in attention)
    keys:     rows  = max_a p_a - n,   c = row_fn(rows),   phi_k = exp((p - n) - c),

the same operations in the same order as favor_exponentials, so every exponent is <= 0 where c
bounds the rows (each fl(p_a - n) <= fl(max_a p_a - n) = rows <= c). The queries take one kernel
(the row maximum over m in registers, then the exponentials); the keys two, around ``row_fn`` in
torch (a running maximum over N for CausalMask, a slice maximum by default): the first writes
rows and n, the second the features. p is formed twice rather than stored: d is small, and it
saves the (R, m) matrix's write and read. In PyTorch the same features take a GEMM, a row
maximum, a norm and two or three elementwise passes over (R, m) each.

Backward from the saved x, w and the features (dp = dphi phi):
d x = dp w - 2 half (sum_a dp_a) x for keys (the queries' shift and the keys' c are constants),
d w = dp^T x. For m <= MAX_BM one kernel forms both in one read of dphi, phi and x: each program
walks a strided set of row blocks, writes their d x and keeps its share of d w (m x d) in
registers, and the GRAD_PROGRAMS shares are summed by torch (a fixed order: the same bits every
run). In PyTorch the same gradients take an elementwise product, two GEMMs, a row sum and two
elementwise passes, each a pass over (R, m) or (R, d). Wider m, and double backward (create_graph),
take those PyTorch operations, which are differentiable again.

Work O(R m d) in products, memory O(R m) for the features; float32 products keep float32
accuracy on tensor cores (tf32x3, as fast.kernels.causal_scan), float64 is IEEE.
"""
from __future__ import annotations

from typing import Callable

import torch

from fast.features import exponential_grads
from fast.kernels.dispatch import MAX_WIDTH, dot_precision, require_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch features serve everywhere (fast.kernels.dispatch)
    triton = None

__all__ = ["favor_kernel_features"]

#: Rows per program, and the most columns of the projection per step (m is walked in blocks of
#: BM = the least power of two >= m, at least 16 and at most MAX_BM: one block for m <= 128, where
#: the queries' products are formed once, not once for the maximum and once for the features).
BLOCK_ROWS = 64
MAX_BM = 128
#: The backward kernel's programs (at most; fewer where there are fewer row blocks): each keeps one
#: m x d share of d w, so this many shares (16 MiB at m = d = 64 in float32) are summed at the end.
GRAD_PROGRAMS = 1024


def favor_kernel_features(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, half: float,
                          row_fn: Callable[[torch.Tensor], torch.Tensor]
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phi_q (..., N_q, m), phi_k (..., N, m), c (the keys' constants, detached, row_fn's shape),
    n (..., N, 1) the keys' norm term, detached) for q, k (..., N, d) and w_q, w_k (m, d) of one
    floating dtype and device with d <= MAX_WIDTH (module doc). row_fn: the keys' constants from
    their row maxima rows (..., N, 1), broadcastable to them (CausalMask: their running maximum).
    Differentiable in q, k, w_q, w_k. O(R m d).

    Raises ValueError naming the argument for mismatched shapes, dtypes or devices or d beyond
    MAX_WIDTH; RuntimeError where Triton cannot run on the tensors' device.

    >>> import torch
    >>> from fast.kernels.favor_features import favor_kernel_features
    >>> from fast.kernels.dispatch import use_feature_kernel
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, w = torch.randn(2, 10, 4, generator=g), torch.randn(2, 10, 4, generator=g), torch.randn(8, 4, generator=g)
    >>> if use_feature_kernel(q, w):                    # CUDA and Triton (or forced under the interpreter)
    ...     phi_q, phi_k, c, n = favor_kernel_features(q, k, w, w, 0.5, lambda r: r.amax(-2, keepdim=True))
    ...     ok = bool(phi_k.max() <= 1) and torch.allclose(phi_q, torch.exp(q @ w.T - (q @ w.T).amax(-1, True)))
    ... else:                                           # elsewhere fast.features.favor_exponentials runs
    ...     ok = True
    >>> ok
    True
    """
    _check(q=q, k=k, w_q=w_q, w_k=w_k)
    phi_q = _QueryFeatures.apply(q, w_q)
    rows, n = _key_rows(k, w_k, half)
    c = row_fn(rows).detach()
    phi_k = _KeyFeatures.apply(k, w_k, half, c)
    return phi_q, phi_k, c, n


def _check(**tensors: torch.Tensor) -> None:
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating tensor (..., c), got {got}")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"q, k, w_q and w_k must share one dtype and device, got {name} {t.dtype} on {t.device} "
                             f"against {first.dtype} on {first.device}")
    d = first.shape[-1]
    if not 1 <= d <= MAX_WIDTH or any(t.shape[-1] != d for t in tensors.values()):
        raise ValueError(f"q, k (..., N, d) and w_q, w_k (m, d) must share d <= {MAX_WIDTH}, got "
                         + ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items()))
    if tensors["w_q"].shape != tensors["w_k"].shape or tensors["w_q"].dim() != 2:
        raise ValueError(f"w_q and w_k must both be (m, d), got {tuple(tensors['w_q'].shape)} and "
                         f"{tuple(tensors['w_k'].shape)}")
    require_triton(first, "the Triton FAVOR+ features", imported=triton is not None)


def _launch(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, int, int, int, dict]:
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    r, d = rows.shape
    m = w.shape[0]
    bd = max(16, 1 << (d - 1).bit_length())
    bm = max(16, min(MAX_BM, 1 << (m - 1).bit_length()))
    meta = {"BR": BLOCK_ROWS, "BM": bm, "BD": bd, "PRECISION": dot_precision(x),
            "ACC": tl.float64 if x.dtype == torch.float64 else tl.float32, "num_warps": 4}
    return rows, r, m, d, meta


def _query_forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rows, r, m, d, meta = _launch(x, w)
    phi = torch.empty(r, m, dtype=x.dtype, device=x.device)
    if r:
        _query_kernel[(triton.cdiv(r, BLOCK_ROWS),)](rows, w.contiguous(), phi, r, m, d, **meta)
    return phi.reshape(*x.shape[:-1], m)


def _key_rows(x: torch.Tensor, w: torch.Tensor, half: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows = max_a p_a - n, n = half |x|^2), each (..., N, 1), detached."""
    rows, r, m, d, meta = _launch(x, w)
    out = torch.empty(r, dtype=x.dtype, device=x.device)
    n = torch.empty(r, dtype=x.dtype, device=x.device)
    if r:
        _key_rows_kernel[(triton.cdiv(r, BLOCK_ROWS),)](rows, w.detach().contiguous(), out, n, r, m, d, float(half),
                                                        **meta)
    shape = (*x.shape[:-1], 1)
    return out.reshape(shape), n.reshape(shape)


def _key_forward(x: torch.Tensor, w: torch.Tensor, half: float, c: torch.Tensor) -> torch.Tensor:
    rows, r, m, d, meta = _launch(x, w)
    cc = c.detach().to(x.dtype).expand(*x.shape[:-1], 1).reshape(-1).contiguous()
    phi = torch.empty(r, m, dtype=x.dtype, device=x.device)
    if r:
        _key_kernel[(triton.cdiv(r, BLOCK_ROWS),)](rows, w.contiguous(), cc, phi, r, m, d, float(half), **meta)
    return phi.reshape(*x.shape[:-1], m)


def _input_grads(ctx, g_phi: torch.Tensor, x: torch.Tensor, w: torch.Tensor, phi: torch.Tensor,
                 half: float | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(d x, d w) from dp = g_phi phi (module doc); half None for the queries (no norm term): the
    kernel for m <= MAX_BM outside double backward, the PyTorch operations otherwise."""
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_x or need_w):
        return None, None
    if w.shape[0] <= MAX_BM and not torch.is_grad_enabled():
        return _kernel_grads(g_phi, x, w, phi, half, need_x, need_w)
    return exponential_grads(g_phi, x, w, phi, half, need_x, need_w)


def _kernel_grads(g_phi: torch.Tensor, x: torch.Tensor, w: torch.Tensor, phi: torch.Tensor, half: float | None,
                  need_x: bool, need_w: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``_input_grads`` by ``_grad_kernel`` (m <= MAX_BM): d x (..., N, d) in x's dtype where need_x,
    d w (m, d) where need_w (the programs' shares summed in the accumulation dtype), else None."""
    rows, r, m, d, meta = _launch(x, w)
    # a program holds w and its share of d w (BM x BD each) beside the row block's tiles: twice the
    # threads for 128 columns keeps those in registers
    meta["num_warps"] = 8 if meta["BM"] > 64 else 4
    dx = torch.empty(r, d, dtype=x.dtype, device=x.device) if need_x else None
    blocks = triton.cdiv(r, BLOCK_ROWS)
    programs = max(1, min(blocks, GRAD_PROGRAMS))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    shares = torch.empty(programs, m, d, dtype=acc, device=x.device) if need_w else None
    if r:
        g = g_phi.reshape(r, m).contiguous()
        f = phi.reshape(r, m).contiguous()
        _grad_kernel[(programs,)](g, f, rows, w.detach().contiguous(), dx if need_x else rows,
                                  shares if need_w else rows, r, m, d, blocks, programs,
                                  0.0 if half is None else float(half), HAS_NORM=half is not None,
                                  NEED_X=need_x, NEED_W=need_w, **meta)
    elif need_w:
        shares.zero_()
    return (None if dx is None else dx.reshape(x.shape),
            None if shares is None else shares.sum(0).to(w.dtype))


class _QueryFeatures(torch.autograd.Function):
    """phi_q = exp(x w^T - max_a (x w^T)_a); the shift is a constant (it cancels in attention)."""

    @staticmethod
    def forward(ctx, x, w):
        phi = _query_forward(x, w)
        ctx.save_for_backward(x, w, phi)
        return phi

    @staticmethod
    def backward(ctx, g_phi):
        x, w, phi = ctx.saved_tensors
        return _input_grads(ctx, g_phi, x, w, phi, None)


class _KeyFeatures(torch.autograd.Function):
    """phi_k = exp((x w^T - half |x|^2) - c) for constants c (..., N, 1)."""

    @staticmethod
    def forward(ctx, x, w, half, c):
        phi = _key_forward(x, w, half, c)
        ctx.half = half
        ctx.save_for_backward(x, w, phi)
        return phi

    @staticmethod
    def backward(ctx, g_phi):
        x, w, phi = ctx.saved_tensors
        dx, dw = _input_grads(ctx, g_phi, x, w, phi, ctx.half)
        return dx, dw, None, None


if triton is not None:
    @triton.jit
    def _program_rows(R, D, BR: tl.constexpr, BD: tl.constexpr):
        """This program's rows (BR of the R, as int64 offsets) and the d columns, with their masks."""
        offs_r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
        offs_d = tl.arange(0, BD)
        return offs_r, offs_r < R, offs_d, offs_d < D

    @triton.jit
    def _block_products(X, W, offs_r, r_ok, offs_d, d_ok, j, M, D, BM: tl.constexpr, PRECISION: tl.constexpr,
                        ACC: tl.constexpr):
        """(p, column mask) for columns j BM .. j BM + BM - 1 of the rows' products x w^T."""
        offs_m = j * BM + tl.arange(0, BM)
        m_ok = offs_m < M
        x = tl.load(X + offs_r[:, None] * D + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
        w = tl.load(W + offs_m[:, None] * D + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
        return tl.dot(x, tl.trans(w), input_precision=PRECISION), offs_m, m_ok

    @triton.jit
    def _row_max(X, W, offs_r, r_ok, offs_d, d_ok, M, D, BR: tl.constexpr, BM: tl.constexpr,
                 PRECISION: tl.constexpr, ACC: tl.constexpr):
        top = tl.full((BR,), float("-inf"), ACC)
        for j in range(0, tl.cdiv(M, BM)):
            p, offs_m, m_ok = _block_products(X, W, offs_r, r_ok, offs_d, d_ok, j, M, D, BM, PRECISION, ACC)
            top = tl.maximum(top, tl.max(tl.where(m_ok[None, :], p, float("-inf")), axis=1))
        return top

    # R varies with every call: not specialised, so a new length compiles nothing new
    @triton.jit(do_not_specialize=["R"])
    def _query_kernel(X, W, PHI, R, M, D, BR: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                      PRECISION: tl.constexpr, ACC: tl.constexpr):
        offs_r, r_ok, offs_d, d_ok = _program_rows(R, D, BR, BD)
        if M <= BM:  # one block: the products once, for the maximum and the features
            p, offs_m, m_ok = _block_products(X, W, offs_r, r_ok, offs_d, d_ok, 0, M, D, BM, PRECISION, ACC)
            top = tl.max(tl.where(m_ok[None, :], p, float("-inf")), axis=1)
            tl.store(PHI + offs_r[:, None] * M + offs_m[None, :], tl.exp(p - top[:, None]).to(PHI.dtype.element_ty),
                     mask=r_ok[:, None] & m_ok[None, :])
        else:
            top = _row_max(X, W, offs_r, r_ok, offs_d, d_ok, M, D, BR, BM, PRECISION, ACC)
            for j in range(0, tl.cdiv(M, BM)):
                p, offs_m, m_ok = _block_products(X, W, offs_r, r_ok, offs_d, d_ok, j, M, D, BM, PRECISION, ACC)
                phi = tl.exp(p - top[:, None])
                tl.store(PHI + offs_r[:, None] * M + offs_m[None, :], phi.to(PHI.dtype.element_ty),
                         mask=r_ok[:, None] & m_ok[None, :])

    @triton.jit
    def _half_norm(X, offs_r, r_ok, offs_d, d_ok, D, half, ACC: tl.constexpr):
        x = tl.load(X + offs_r[:, None] * D + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
        return tl.sum(x * x, axis=1) * half

    @triton.jit(do_not_specialize=["R"])
    def _key_rows_kernel(X, W, ROWS, NORM, R, M, D, half, BR: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                         PRECISION: tl.constexpr, ACC: tl.constexpr):
        offs_r, r_ok, offs_d, d_ok = _program_rows(R, D, BR, BD)
        n = _half_norm(X, offs_r, r_ok, offs_d, d_ok, D, half, ACC)
        top = _row_max(X, W, offs_r, r_ok, offs_d, d_ok, M, D, BR, BM, PRECISION, ACC)
        tl.store(ROWS + offs_r, (top - n).to(ROWS.dtype.element_ty), mask=r_ok)
        tl.store(NORM + offs_r, n.to(NORM.dtype.element_ty), mask=r_ok)

    @triton.jit(do_not_specialize=["R", "BLOCKS"])
    def _grad_kernel(G, PHI, X, W, DX, DW, R, M, D, BLOCKS, PROGRAMS, half, HAS_NORM: tl.constexpr,
                     NEED_X: tl.constexpr, NEED_W: tl.constexpr, BR: tl.constexpr, BM: tl.constexpr,
                     BD: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
        """Row blocks pid, pid + PROGRAMS, ...: dp = g phi, their d x = dp w (- 2 half (sum_a dp_a) x),
        and this program's share of d w = dp^T x into DW[pid] (M <= BM: one block of columns)."""
        pid = tl.program_id(0)
        offs_m = tl.arange(0, BM)
        offs_d = tl.arange(0, BD)
        m_ok, d_ok = offs_m < M, offs_d < D
        w = tl.load(W + offs_m[:, None] * D + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
        dw = tl.zeros((BM, BD), ACC)
        for block in range(pid, BLOCKS, PROGRAMS):
            offs_r = (block * BR + tl.arange(0, BR)).to(tl.int64)
            r_ok = offs_r < R
            rm = r_ok[:, None] & m_ok[None, :]
            g = tl.load(G + offs_r[:, None] * M + offs_m[None, :], mask=rm, other=0.0).to(ACC)
            phi = tl.load(PHI + offs_r[:, None] * M + offs_m[None, :], mask=rm, other=0.0).to(ACC)
            dp = g * phi
            rd = r_ok[:, None] & d_ok[None, :]
            x = tl.load(X + offs_r[:, None] * D + offs_d[None, :], mask=rd, other=0.0).to(ACC)
            if NEED_X:
                dx = tl.dot(dp, w, input_precision=PRECISION)
                if HAS_NORM:
                    dx = dx - (2.0 * half) * tl.sum(dp, axis=1)[:, None] * x
                tl.store(DX + offs_r[:, None] * D + offs_d[None, :], dx.to(DX.dtype.element_ty), mask=rd)
            if NEED_W:
                dw += tl.dot(tl.trans(dp), x, input_precision=PRECISION)
        if NEED_W:
            tl.store(DW + pid * M * D + offs_m[:, None] * D + offs_d[None, :], dw, mask=m_ok[:, None] & d_ok[None, :])

    @triton.jit(do_not_specialize=["R"])
    def _key_kernel(X, W, C, PHI, R, M, D, half, BR: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                    PRECISION: tl.constexpr, ACC: tl.constexpr):
        offs_r, r_ok, offs_d, d_ok = _program_rows(R, D, BR, BD)
        n = _half_norm(X, offs_r, r_ok, offs_d, d_ok, D, half, ACC)
        c = tl.load(C + offs_r, mask=r_ok, other=0.0).to(ACC)
        for j in range(0, tl.cdiv(M, BM)):
            p, offs_m, m_ok = _block_products(X, W, offs_r, r_ok, offs_d, d_ok, j, M, D, BM, PRECISION, ACC)
            phi = tl.exp((p - n[:, None]) - c[:, None])  # (p - n) - c: favor_exponentials' order
            tl.store(PHI + offs_r[:, None] * M + offs_m[None, :], phi.to(PHI.dtype.element_ty),
                     mask=r_ok[:, None] & m_ok[None, :])
