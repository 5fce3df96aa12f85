"""Unmasked FAVOR+ attention with the features formed a block of rows at a time.

favor_attention(q, k, v, W) with mask=None is linear attention (choromanski22 Eq. 3) on the
stabilised FAVOR+ exponentials (fast.features.favor_exponentials). The keys enter only through
S = sum_j phi_k_j v_j^T (m, d) and z = sum_j phi_k_j (m), kept under a running max, and each query
only through its own row, so ``favor_products`` forms the features a block of rows at a time, in
forward and backward: q, k (..., N, d_qk), v (..., N, d) -> (..., N, d) in O(N m (d_qk + d)) time
and, beyond the inputs, the output plus one block of memory (no (N, m) feature matrix).
``favor_naive`` is the whole-tensor twin. The derivation, the block plan and the backward's
formulas: docs/papers.md, "fast.favor_blockwise".
"""
from __future__ import annotations

import math

import torch

from fast import features
from fast.algebra import guard_flag, rows_dot
from fast.validation import compute_dtype, finite_flag

#: A block of favor_attention's (mask=None) features holds at most 1/FAVOR_BLOCKS of them where
#: the bytes range below allows (the memory bound: extra memory ~ the output plus 2/FAVOR_BLOCKS
#: of one (N, m) feature matrix) ...
FAVOR_BLOCKS = 8
#: ... and between these many bytes of (rows, m) features, by device type: on CPU one block's
#: temporaries stay in cache (2 MiB: 8192 rows at m = 64 in float32; 1-4 MiB ran 10-25% faster than
#: 16 MiB at N = 2^16, 8 heads, d = m = 64, one thread); on a GPU a block fills the device and the
#: per-block dispatch (~20 kernels) stays negligible (32-256 MiB; below 32 MiB of features in all,
#: one block).
FAVOR_BLOCK_BYTES = {"cpu": (2 * 2**20, 2 * 2**20)}
FAVOR_BLOCK_BYTES_DEFAULT = (32 * 2**20, 256 * 2**20)


def default_block_rows(rows: int, m: int, element_size: int, device: torch.device | str = "cpu") -> int:
    """Rows per block, counted over all (batch, head) slices together, for ``rows`` rows in all
    (B H N) and m features of ``element_size`` bytes on ``device``: 1/FAVOR_BLOCKS of the features,
    clamped to the device type's FAVOR_BLOCK_BYTES range, at least one row. O(1).

    >>> from fast.favor_blockwise import default_block_rows
    >>> default_block_rows(2**23, 64, 4, "cpu"), default_block_rows(2**23, 64, 4, "cuda")  # m = 64, float32
    (8192, 1048576)
    """
    lo, hi = FAVOR_BLOCK_BYTES.get(torch.device(device).type, FAVOR_BLOCK_BYTES_DEFAULT)
    row_bytes = m * element_size
    target = min(max(-(-rows * row_bytes // FAVOR_BLOCKS), lo), hi)
    return max(1, target // row_bytes)


#: Rows a batched GEMM reduces over in one piece (``_gram``).
GRAM_ROWS = 4096


def _gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b per slice: a (l, n, m), b (l, n, c) contiguous -> (l, m, c). cuBLAS's batched GEMM does
    not split a long reduction (on an H200, two slices of 2^20 rows ran far slower as one batched
    GEMM than as one GEMM per slice), so for l > 1 and n > GRAM_ROWS the rows are cut into pieces of
    GRAM_ROWS that become batch entries (a view when GRAM_ROWS divides n, summed after), else one
    GEMM per slice. l = 1 and short blocks: one bmm (the CPU's 2 MiB blocks at m = 64 never reach
    GRAM_ROWS per slice with l > 1)."""
    slices, n, m = a.shape
    if slices == 1 or n <= GRAM_ROWS:
        return torch.bmm(a.transpose(1, 2), b)
    if n % GRAM_ROWS == 0:
        pieces = slices * (n // GRAM_ROWS)
        part = torch.bmm(a.reshape(pieces, GRAM_ROWS, m).transpose(1, 2), b.reshape(pieces, GRAM_ROWS, b.shape[-1]))
        return part.view(slices, n // GRAM_ROWS, m, b.shape[-1]).sum(1)
    return torch.stack([a[i].transpose(0, 1) @ b[i] for i in range(slices)])


def _plan(slices: int, n: int, rows: int) -> list[tuple[int, int, int, int]]:
    """Blocks (l0, l1, a, b): slices l0:l1, rows a:b of each, at most ``rows`` rows in all (but
    one row at least) and contiguous in a (slices, n, .) tensor: whole slices when a slice fits,
    else row ranges of one slice."""
    if n == 0 or slices == 0:
        return []
    if rows >= n:
        per = rows // n
        return [(l, min(slices, l + per), 0, n) for l in range(0, slices, per)]
    return [(l, l + 1, a, min(n, a + rows)) for l in range(slices) for a in range(0, n, rows)]


def _slab(t: torch.Tensor, slices: int) -> torch.Tensor:
    """(..., n, c) -> (slices, n, c): a view when the leading dims merge (contiguous inputs), else
    a copy (one pass, n c numbers per slice)."""
    return t.reshape(slices, t.shape[-2], t.shape[-1])


def _projected(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (l, n, d) @ w^T (m, d) -> (l, n, m), one 2-D GEMM over the block's rows (x is contiguous)."""
    return (x.reshape(-1, x.shape[-1]) @ w.transpose(-1, -2)).view(*x.shape[:-1], w.shape[0])


def _query_features(x: torch.Tensor, w_q: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """phi = exp(x W'^T - rowmax) (l, n, m) in the work dtype, x a block of queries (compute dtype)."""
    p = _projected(x, w_q)
    return features.exp_(p.sub_(features.row_max(p))).to(work)


def _key_features(x: torch.Tensor, w_k: torch.Tensor, half: float, c: torch.Tensor) -> torch.Tensor:
    """phi = exp((x W'^T - n) - c) (l, n, m), x a block of keys (compute dtype), c (l, 1, 1); n then c,
    as fast.features.favor_exponentials (n + c rounds at n's scale: inf features at huge keys)."""
    return features.exp_(_projected(x, w_k).sub_(features.half_sq_norm(x, half)).sub_(c))


def _key_state(k3, v3, w_k, half: float, rows: int, work: torch.dtype):
    """(S (L, m, d), z (L, m), C (L, 1, 1), the keys' largest n_j (0-dim)) in one pass over blocks
    of keys, with the running max where a slice spans several blocks (docs/papers.md,
    "fast.favor_blockwise")."""
    slices, n = k3.shape[0], k3.shape[1]
    m, d = w_k.shape[0], v3.shape[-1]
    s = torch.zeros((slices, m, d), dtype=work, device=k3.device)
    z = torch.zeros((slices, m), dtype=work, device=k3.device)
    c = torch.full((slices, 1, 1), -torch.inf, dtype=w_k.dtype, device=k3.device)
    n_max = torch.zeros((), dtype=w_k.dtype, device=k3.device)
    for l0, l1, a, b in _plan(slices, n, rows):
        x = k3[l0:l1, a:b].to(w_k.dtype)
        p = _projected(x, w_k)
        norms = features.half_sq_norm(x, half)
        n_max = torch.maximum(n_max, norms.amax())  # NaN propagates: the finiteness flag of k
        old = c[l0:l1]
        new = torch.maximum(old, features.slice_max(features.row_max(p) - norms))  # NaN propagates too
        scale = torch.exp(old - new).to(work)  # 0 on a slice's first block (old = -inf)
        c[l0:l1] = new
        phi = features.exp_(p.sub_(norms).sub_(new)).to(work)  # n then c: each exponent <= 0 (fast.features)
        s[l0:l1].mul_(scale).add_(_gram(phi, v3[l0:l1, a:b].to(work)))
        z[l0:l1].mul_(scale.squeeze(-1)).add_(phi.sum(-2))
        del x, p, phi  # before the next block's are allocated: one block alive at a time
    return s, z, c, n_max


def _query_pass(q3, w_q, s, z, rows: int, work: torch.dtype, normalise: bool):
    """(num or out (L, n, d), den (L, n)) of queries q3 (L, n, d_qk) on the state S (L, m, d), z (L, m),
    a block of rows at a time; normalise: out = num / den, unguarded (in place)."""
    slices, n_q, d = q3.shape[0], q3.shape[1], s.shape[-1]
    out = torch.empty((slices, n_q, d), dtype=work, device=q3.device)
    den = torch.empty((slices, n_q), dtype=work, device=q3.device)
    for l0, l1, a, b in _plan(slices, n_q, rows):
        phi = _query_features(q3[l0:l1, a:b].to(w_q.dtype), w_q, work)
        # the operations of fast.algebra's linear_products on the block: with the keys in one block,
        # favor_attention(q, k, v, W) equals masked_linear_attention(*favor_features(q, k, W), v) bit
        # for bit (m a power of 4), which verify's guard check relies on
        num = torch.bmm(phi, s[l0:l1], out=out[l0:l1, a:b])
        den_b = rows_dot(phi, z[l0:l1])
        den[l0:l1, a:b] = den_b
        if normalise:
            num.div_(den_b.unsqueeze(-1))
        del phi, num, den_b
    return out, den


def _forward(q, k, v, w_q, w_k, half: float, rows: int, work: torch.dtype):
    """(out (..., N_q, d), den (..., N_q), S, z, C, flag): the blocked forward, no autograd."""
    lead, slices = q.shape[:-2], math.prod(q.shape[:-2])
    q3, k3, v3 = _slab(q, slices), _slab(k, slices), _slab(v, slices)
    n_q, d = q.shape[-2], v.shape[-1]
    s, z, c, n_max = _key_state(k3, v3, w_k, half, rows, work)
    out, den = _query_pass(q3, w_q, s, z, rows, work, normalise=True)
    # finite |k_j|^2 and S (every entry of v and phi_k reaches S; q reaches den), den in range, and
    # out finite (one read pass: num_i reaches den_i max |v|, which can overflow where out does not)
    flag = (n_max < torch.inf) & finite_flag(s, out) & guard_flag(den, None, positive=True)
    return out.view(*lead, n_q, d), den.view(*lead, n_q), s, z, c, flag


def favor_naive(q, k, v, w_q, w_k, half: float, c: torch.Tensor | None = None) -> torch.Tensor:
    """The whole-tensor form of unmasked FAVOR+ attention (the blocked path's readable twin,
    differentiable): both (N, m) feature matrices at once, O(N m (d_qk + d)) time and O(N m) memory.
    c: the keys' constant (..., 1, 1), detached (None: the per-slice max, computed here). Arguments
    and dtypes as ``favor_products``; returns out (..., N_q, d), unguarded.

    >>> import torch
    >>> from fast.favor_blockwise import favor_naive
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(5, 4, generator=g) for _ in range(3))
    >>> w = torch.randn(8, 4, generator=g)
    >>> phi_q = torch.exp(q @ w.T - (q @ w.T).max(-1, keepdim=True).values)      # stabilised per query
    >>> phi_k = torch.exp(k @ w.T - 0.25 * (k * k).sum(-1, keepdim=True))      # h = 0.25, c = 0 here
    >>> a = phi_q @ phi_k.T
    >>> torch.allclose(favor_naive(q, k, v, w, w, 0.25, c=torch.zeros(1, 1)), a @ v / a.sum(-1, keepdim=True))
    True
    """
    work = compute_dtype(torch.promote_types(torch.promote_types(w_q.dtype, w_k.dtype), v.dtype))
    x, y = q.to(w_q.dtype), k.to(w_k.dtype)
    a = x @ w_q.transpose(-1, -2)
    phi_q = torch.exp(a - a.detach().amax(-1, keepdim=True)).to(work)
    b = y @ w_k.transpose(-1, -2)
    n = half * (y * y).sum(-1, keepdim=True)
    if c is None:
        c = features.slice_max(b.detach().amax(-1, keepdim=True) - n.detach())
    phi_k = torch.exp(b - n - c.detach()).to(work)
    num = phi_q @ (phi_k.transpose(-1, -2) @ v.to(work))
    return num / rows_dot(phi_q, phi_k.sum(-2)).unsqueeze(-1)


def _key_grads(k, v, w_k, half: float, c, ds, dz, rows: int, need: tuple[bool, bool, bool]):
    """(dk, dv, dW'_k), each None where not needed, of S = sum_j phi_k_j v_j^T and z = sum_j phi_k_j
    given dS (L, m, d) and dz (L, 1, m), phi_k = exp(b - n - c) re-formed a block of keys at a time."""
    need_k, need_v, need_wk = need
    slices, work = ds.shape[0], ds.dtype
    k3, v3 = _slab(k, slices), _slab(v, slices)
    dk = torch.empty(k3.shape, dtype=w_k.dtype, device=k.device) if need_k else None
    dv = torch.empty(v3.shape, dtype=work, device=v.device) if need_v else None
    dwk = torch.zeros_like(w_k) if need_wk else None
    for l0, l1, a, b in _plan(slices, k.shape[-2], rows):
        x = k3[l0:l1, a:b].to(w_k.dtype)
        phi = _key_features(x, w_k, half, c[l0:l1]).to(work)
        if need_v:
            torch.bmm(phi, ds[l0:l1], out=dv[l0:l1, a:b])
        if need_k or need_wk:  # d b = phi * (dS v_j + dz)
            db = torch.baddbmm(dz[l0:l1], v3[l0:l1, a:b].to(work), ds[l0:l1].transpose(-1, -2))
            db = db.mul_(phi).to(w_k.dtype)
            if need_k:  # dk_j = W'^T d b_j - 2 h k_j (1 . d b_j)
                out = dk[l0:l1, a:b]
                torch.mm(db.view(-1, db.shape[-1]), w_k, out=out.view(-1, k.shape[-1]))
                out.addcmul_(x, db.sum(-1, keepdim=True), value=-2.0 * half)
            if need_wk:
                dwk.add_(db.reshape(-1, db.shape[-1]).transpose(-1, -2) @ x.reshape(-1, x.shape[-1]))
            del db
        del x, phi
    dk = None if dk is None else dk.view(k.shape).to(k.dtype)
    dv = None if dv is None else dv.view(v.shape).to(v.dtype)
    return dk, dv, dwk


class _FavorBlockwise(torch.autograd.Function):
    """(out, den, flag) of ``favor_products``; saves q, k, v, W', den and S, z, C; backward by blocks
    (docs/papers.md, "fast.favor_blockwise", "Training")."""

    @staticmethod
    def forward(ctx, q, k, v, w_q, w_k, half, rows, work):
        out, den, s, z, c, flag = _forward(q, k, v, w_q, w_k, half, rows, work)
        ctx.save_for_backward(q, k, v, w_q, w_k, den, s, z, c)
        ctx.half, ctx.rows = half, rows
        ctx.mark_non_differentiable(den, flag)
        return out, den, flag

    @staticmethod
    def backward(ctx, g_out, _g_den, _g_flag):
        q, k, v, w_q, w_k, den, s, z, c = ctx.saved_tensors
        half, rows = ctx.half, ctx.rows
        need = ctx.needs_input_grad[:5]
        lead, slices = q.shape[:-2], math.prod(q.shape[:-2])
        if torch.is_grad_enabled():  # double backward: differentiate the whole-tensor twin
            inputs = [t for t, n in zip((q, k, v, w_q, w_k), need) if n]
            out = favor_naive(q, k, v, w_q, w_k, half, c.view(*lead, 1, 1))
            got = iter(torch.autograd.grad(out, inputs, g_out, create_graph=True, allow_unused=True))
            return (*[next(got) if n else None for n in need], None, None, None)
        need_q, need_k, need_v, need_wq, need_wk = need
        work, d = s.dtype, v.shape[-1]
        keys = need_k or need_v or need_wk
        q3, g3, den3 = _slab(q, slices), _slab(g_out, slices), den.reshape(slices, -1, 1)
        # gradients in the compute dtypes (float32 for half inputs), cast to the inputs' at the end
        dq = torch.empty(q3.shape, dtype=w_q.dtype, device=q.device) if need_q else None
        dwq = torch.zeros_like(w_q) if need_wq else None
        # d[S | z] += phi^T [G / den | e], one GEMM per block (e = d den)
        dsz = torch.zeros((slices, s.shape[1], d + 1), dtype=work, device=s.device) if keys else None
        s_t, zr = s.transpose(-1, -2), z.unsqueeze(-2)
        for l0, l1, a, b in _plan(slices, q.shape[-2], rows):
            x = q3[l0:l1, a:b].to(w_q.dtype)
            phi = _query_features(x, w_q, work)
            g, r = g3[l0:l1, a:b], den3[l0:l1, a:b].reciprocal()  # (l, n, d), 1 / den (l, n, 1)
            t = torch.bmm(g, s_t[l0:l1])  # S G_i (l, n, m)
            t.mul_(phi)  # phi * (S G_i): its row sums are G_i . num_i
            e = t.sum(-1, keepdim=True).mul_(r).mul_(r).neg_()  # d den_i = -(G_i . out_i) / den_i
            if keys:
                ge = torch.empty((*g.shape[:-1], d + 1), dtype=work, device=g.device)
                torch.mul(g, r, out=ge[..., :d])
                ge[..., d:] = e
                dsz[l0:l1].add_(_gram(phi, ge))
                del ge
            if need_q or need_wq:  # d a = phi * (S G_i / den_i + e_i z)
                da = t.mul_(r).add_(phi.mul_(zr[l0:l1]).mul_(e)).to(w_q.dtype)
                if need_q:
                    torch.mm(da.view(-1, da.shape[-1]), w_q, out=dq[l0:l1, a:b].view(-1, q.shape[-1]))
                if need_wq:
                    dwq.add_(da.reshape(-1, da.shape[-1]).transpose(-1, -2) @ x.reshape(-1, x.shape[-1]))
                del da
            del x, phi, t, e
        dk = dv = dwk = None
        if keys:
            ds, dz = dsz[..., :d], dsz[..., d:].transpose(-1, -2)  # (L, m, d), (L, 1, m)
            dk, dv, dwk = _key_grads(k, v, w_k, half, c, ds, dz, rows, (need_k, need_v, need_wk))
        dq = None if dq is None else dq.view(q.shape).to(q.dtype)
        return dq, dk, dv, dwq, dwk, None, None, None


def favor_products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                   half: float, *, block_rows: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (..., N_q, d), den (..., N_q), flag) of unmasked FAVOR+ attention, a block of rows at a time.

    q: (..., N_q, d_qk); k: (..., N, d_qk); v: (..., N, d), the same leading dims (checked by the
    caller); w_q, w_k: W' = d_qk^(-1/4) W (m, d_qk) in the compute dtypes of q and k (the same
    tensor when those agree); half: the norm term's factor h. out and den are in the work dtype
    (float32 for half inputs), out = num / den UNGUARDED: the caller reads ``flag`` (0-dim bool:
    the keys' squared norms, S and out finite, every den_i in [finfo.tiny, finfo.max]) in its one
    host read and refuses the call when it is False, or, for finite inputs whose S or numerators
    overflowed (values near the dtype's maximum), calls again on v 2^-s (fast.scaling). block_rows: rows per block (None:
    ``default_block_rows``). Differentiable in q, k, v, w_q, w_k, with a blocked backward.
    Cost: O((N_q + N) m (d_qk + d)), as the two-GEMM form; memory one block beyond the output.

    >>> import torch
    >>> from fast.favor_blockwise import favor_naive, favor_products
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(2, 8, 4, generator=g) for _ in range(3))
    >>> w = torch.randn(16, 4, generator=g) * 4 ** -0.25
    >>> out, den, flag = favor_products(q, k, v, w, w, 0.25, block_rows=3)     # several blocks
    >>> tuple(out.shape), bool(flag), torch.allclose(out, favor_naive(q, k, v, w, w, 0.25), atol=1e-6)
    ((2, 8, 4), True, True)
    """
    work = compute_dtype(torch.promote_types(torch.promote_types(w_q.dtype, w_k.dtype), v.dtype))
    if block_rows is None:
        slices = math.prod(q.shape[:-2])
        block_rows = default_block_rows(slices * max(q.shape[-2], k.shape[-2]), w_q.shape[0], w_q.element_size(),
                                        q.device)
    args = (q, k, v, w_q, w_k, half, block_rows, work)
    if torch.is_grad_enabled() and any(t.requires_grad for t in args[:5]):
        return _FavorBlockwise.apply(*args)
    with torch.no_grad():
        out, den, *_, flag = _forward(*args)
    return out, den, flag


class _KeyState(torch.autograd.Function):
    """(S, z, C, n_max) of ``favor_key_state``; saves k, v, W' and C; backward by blocks (``_key_grads``)."""

    @staticmethod
    def forward(ctx, k, v, w_k, half, rows, work):
        slices = math.prod(k.shape[:-2])
        s, z, c, n_max = _key_state(_slab(k, slices), _slab(v, slices), w_k, half, rows, work)
        ctx.save_for_backward(k, v, w_k, c)
        ctx.half, ctx.rows = half, rows
        ctx.mark_non_differentiable(c, n_max)
        lead = k.shape[:-2]
        return s.view(*lead, *s.shape[1:]), z.view(*lead, z.shape[-1]), c.view(*lead, 1, 1), n_max

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_s, g_z, _g_c, _g_n):
        k, v, w_k, c = ctx.saved_tensors
        slices = c.shape[0]
        ds = g_s.reshape(slices, *g_s.shape[-2:]).contiguous()
        dz = g_z.reshape(slices, 1, g_z.shape[-1]).contiguous()
        dk, dv, dwk = _key_grads(k, v, w_k, ctx.half, c, ds, dz, ctx.rows, tuple(ctx.needs_input_grad[:3]))
        return dk, dv, dwk, None, None, None


class _QueryProducts(torch.autograd.Function):
    """(num, den) of ``favor_query_products``; saves q, W', S, z; backward by blocks."""

    @staticmethod
    def forward(ctx, q, w_q, s, z, rows, work):
        slices = math.prod(q.shape[:-2])
        num, den = _query_pass(_slab(q, slices), w_q, s.reshape(slices, *s.shape[-2:]),
                               z.reshape(slices, z.shape[-1]), rows, work, normalise=False)
        ctx.save_for_backward(q, w_q, s, z)
        ctx.rows = rows
        return num.view(*q.shape[:-1], s.shape[-1]), den.view(q.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_num, g_den):
        q, w_q, s, z = ctx.saved_tensors
        need_q, need_wq, need_s, need_z = ctx.needs_input_grad[:4]
        slices, d = math.prod(q.shape[:-2]), s.shape[-1]
        work = s.dtype
        q3, s3, z3 = _slab(q, slices), s.reshape(slices, *s.shape[-2:]), z.reshape(slices, 1, z.shape[-1])
        g_num = torch.zeros_like(q3[..., :1]).expand(*q3.shape[:-1], d) if g_num is None else g_num
        g_den = torch.zeros_like(q3[..., 0]) if g_den is None else g_den
        gn, gd = _slab(g_num.to(work), slices), g_den.to(work).reshape(slices, -1, 1)
        dq = torch.empty(q3.shape, dtype=w_q.dtype, device=q.device) if need_q else None
        dwq = torch.zeros_like(w_q) if need_wq else None
        # d[S | z] = phi^T [g_num | g_den], one GEMM per block
        dsz = torch.zeros((slices, s3.shape[1], d + 1), dtype=work, device=q.device) if need_s or need_z else None
        s_t = s3.transpose(-1, -2)
        for l0, l1, a, b in _plan(slices, q.shape[-2], ctx.rows):
            x = q3[l0:l1, a:b].to(w_q.dtype)
            phi = _query_features(x, w_q, work)
            g, e = gn[l0:l1, a:b], gd[l0:l1, a:b]  # (l, n, d), (l, n, 1)
            if dsz is not None:
                dsz[l0:l1].add_(_gram(phi, torch.cat([g, e], -1)))
            if need_q or need_wq:  # d a = phi * (S g_num_i + g_den_i z); the row max is a constant that
                # cancels in num / den, so it carries no gradient (as fast.features)
                da = torch.bmm(g, s_t[l0:l1]).add_(z3[l0:l1] * e).mul_(phi).to(w_q.dtype)
                if need_q:
                    torch.mm(da.view(-1, da.shape[-1]), w_q, out=dq[l0:l1, a:b].view(-1, q.shape[-1]))
                if need_wq:
                    dwq.add_(da.reshape(-1, da.shape[-1]).transpose(-1, -2) @ x.reshape(-1, x.shape[-1]))
                del da
            del x, phi
        ds = dz = None
        if dsz is not None:
            ds = dsz[..., :d].reshape(s.shape) if need_s else None
            dz = dsz[..., d].reshape(z.shape) if need_z else None
        dq = None if dq is None else dq.view(q.shape).to(q.dtype)
        return dq, dwq, ds, dz, None, None


def _rows(slices: int, n: int, w: torch.Tensor, device: torch.device, block_rows: int | None) -> int:
    return default_block_rows(slices * n, w.shape[0], w.element_size(), device) if block_rows is None else block_rows


def favor_key_state(k: torch.Tensor, v: torch.Tensor, w_k: torch.Tensor, half: float, *,
                    block_rows: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The keys' half of ``favor_products``, a block of keys at a time: (S (..., m, d), z (..., m),
    C (..., 1, 1), n_max (0-dim)) with phi_k_j = exp(w_k k_j - h |k_j|^2 - C) (Performer Lemma 1),
    S = sum_j phi_k_j v_j^T, z = sum_j phi_k_j (choromanski22 Eq. 3's right product) and C the
    per-slice max of the exponents (kept as a running max over blocks), n_max the largest h |k_j|^2
    (inf or NaN: a key's norm overflowed; the caller falls back). For a caller that adds states of
    several key sets (fast.distributed: rescale each by exp(C - C_all) first). Shapes and dtypes as
    ``favor_products``; S and z in the work dtype, differentiable in k, v, w_k (blocked backward,
    once: no double backward). O(N m (d_qk + d)) time, one block of memory beyond S.

    >>> import torch
    >>> from fast.favor_blockwise import favor_key_state, favor_query_products, favor_products
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(2, 8, 4, generator=g) for _ in range(3))
    >>> w = torch.randn(16, 4, generator=g) * 4 ** -0.25
    >>> s, z, c, n_max = favor_key_state(k, v, w, 0.25, block_rows=3)
    >>> num, den = favor_query_products(q, w, s, z, block_rows=3)
    >>> torch.allclose(num / den.unsqueeze(-1), favor_products(q, k, v, w, w, 0.25)[0], atol=1e-6)
    True
    """
    work = compute_dtype(torch.promote_types(w_k.dtype, v.dtype))
    rows = _rows(math.prod(k.shape[:-2]), k.shape[-2], w_k, k.device, block_rows)
    return _KeyState.apply(k, v, w_k, half, rows, work)


def favor_query_products(q: torch.Tensor, w_q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, *,
                         block_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries' half of ``favor_products``, a block of queries at a time: (num (..., N_q, d),
    den (..., N_q)) = (phi_q S, phi_q z) with phi_q_i = exp(w_q q_i - max) (the row max: a constant
    that cancels in num / den and carries no gradient), on a state S (..., m, d), z (..., m) in the
    work dtype (``favor_key_state``'s, or a sum of several). Unguarded: the caller divides (e.g.
    fast.algebra.divide). Differentiable in q, w_q, s, z (blocked backward, once). O(N_q m (d_qk + d))
    time, one block of memory beyond num and den.

    >>> import torch
    >>> from fast.favor_blockwise import favor_query_products
    >>> num, den = favor_query_products(torch.zeros(3, 2), torch.zeros(4, 2), torch.ones(4, 5), torch.ones(4))
    >>> tuple(num.shape), den.tolist()      # every feature exp(0 - 0) = 1: den = 1 . z = 4
    ((3, 5), [4.0, 4.0, 4.0])
    """
    rows = _rows(math.prod(q.shape[:-2]), q.shape[-2], w_q, q.device, block_rows)
    return _QueryProducts.apply(q, w_q, s, z, rows, s.dtype)
