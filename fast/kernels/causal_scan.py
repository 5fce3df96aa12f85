"""The chunked causal scan of CausalMask.attend as Triton kernels, forward and backward
(choromanski22 Sec. 3.1; docs/papers.md, fast.masks.sequence; docs/design.md, "The Triton causal
scan"). The PyTorch scan (fast.masks.sequence) is its twin and its fallback.

For phi_q, phi_k (S, N, m) and v (S, N, d) (S = the flattened leading dims), with key constants c
(S, N) and their running maxima r_i = max_{j <= i} c_j (c = 0 without stabiliser), the kernel
returns

    num_i = sum_{j <= i} exp(c_j - r_i) (phi_q_i . phi_k_j) v_j,    den_i = the same with v_j = 1,

the true (num_i, den_i) times exp(-r_i) when phi_k_j = phi_true_j exp(-c_j). Tokens are cut into
chunks of C, and the chunks into P segments (``segment_plan``: enough programs to fill the GPU;
P = 1 for long slices of many heads, and on a CPU). One program per (slice, block of BD value
columns, segment) walks its segment's chunks in order keeping the running state
S_t = sum_{j in chunks <= t} exp(c_j - E_t) phi_k_j v_j^T (BM x BD, float32) and z_t (the same with
v_j = 1), E_t = r at the last token of chunk t; it starts from the state the earlier segments
leave, the sum of their totals (a first, parallel kernel: each segment's sum of
exp(c_j - E_p) phi_k_j [v_j, 1]^T in units of its own last E_p), each brought to the segment's
units by exp(E_p' - E_{p-1}) <= 1. For chunk t:

    num = [(q k^T) o W] v + diag(exp(E_{t-1} - r_i)) q S_{t-1},   W_ij = exp(c_j - r_i) [j <= i],
    S_t = exp(E_{t-1} - E_t) S_{t-1} + (diag(exp(c_j - E_t)) k)^T v.

Every factor is exp of a non-positive number (r is a running maximum), so none overflows: the
guarantee of the PyTorch scan's decayed route, without its one-reference shortcut. The backward
kernel runs the same scan for dq (the state of phi_k [v, 1]^T) and the reverse scan for dk, dv (the
state of phi_q [g_num, g_den]^T in units of E_t, segments starting from the totals of the
segments after them), each program writing its value block's share of dq and dk, which are summed
after (one term per block).

Work O(N C (m + d) + N m d + P^2 m d) per slice (the PyTorch scan's, plus one more pass over k, v
for the segment totals when P > 1, and P^2 / 2 total reads); memory O(N (m + d)) saved for
backward (the inputs), O(N m d / BD + P m d) transient. Inputs of float32, bfloat16 or float16 are read
in their dtype and computed in float32 (float64 in float64); the outputs are rounded to the input
dtype at the end (by torch: to nearest).
Float32 products keep float32 accuracy (three TF32 products on tensor cores, "tf32x3") unless
torch's own float32 matmuls may use TF32 (torch.backends.cuda.matmul.allow_tf32), when one TF32
product serves; half-precision inputs take TF32 products, which hold their values exactly.
"""
from __future__ import annotations

from typing import Callable

import torch

from fast.kernels.dispatch import MAX_WIDTH, dot_precision, require_triton
from fast.prefix import running_max
from fast.validation import check_key_log_scale

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch scan serves everywhere (fast.kernels.dispatch)
    triton = None

__all__ = ["causal_scan", "kernel_blocks", "segment_plan"]


def kernel_blocks(m: int, d: int, backward: bool = False,
                  dtype: torch.dtype | None = None) -> tuple[int, int, int, int]:
    """(C, BM, BD, warps) of the forward (or ``backward``) kernel for widths m, d <= MAX_WIDTH and
    inputs of ``dtype`` (None: float32's choice): the chunk length, the feature block (all m
    features, a power of two >= 16), the value block (the grid's second axis runs over ceil(d / BD)
    of them) and the warps per program. For m, d <= 64 they are the fastest of
    ``python -m measure.kernel_tuning``'s candidates on one H100 (2026-11-28, B = 1, H = 8,
    m = d = 64, N = 2^14 and 2^17): 4 warps, not 8 (forward 30-40% and forward + backward 40-45%
    faster at N = 2^17); float32's forward takes chunks of 16 (its three TF32 products per dot make
    the C x C part dear: 14% faster than 32 at 2^17, within the noise at 2^14), half precision's 32;
    the backward chunks of 16 and one value block of 64 (no per-block share of dq, dk to sum).
    Wider features take smaller chunks and blocks, chosen from ptxas's spill counts on sm_90 (not
    yet timed). ValueError naming m or d beyond MAX_WIDTH. O(1).

    >>> from fast.kernels.causal_scan import kernel_blocks
    >>> kernel_blocks(64, 64), kernel_blocks(64, 64, backward=True), kernel_blocks(20, 3), kernel_blocks(256, 256)
    ((16, 64, 64, 4), (16, 64, 64, 4), (16, 32, 16, 4), (16, 256, 16, 8))
    >>> import torch
    >>> kernel_blocks(64, 64, dtype=torch.bfloat16)
    (32, 64, 64, 4)
    """
    for name, width in (("m (the feature width)", m), ("d (the value width)", d)):
        if not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"{name} must be in [1, {MAX_WIDTH}] for the Triton causal scan, got {width}")
    bm = max(16, _next_power_of_2(m))
    if bm <= 64:
        half = dtype in (torch.bfloat16, torch.float16)
        chunk = 32 if half and not backward else 16
        return chunk, bm, max(16, min(_next_power_of_2(d), 64)), 4
    return 16, bm, max(16, min(_next_power_of_2(d), 32 if bm <= 128 else 16)), 8


def _next_power_of_2(x: int) -> int:
    """The least power of two >= x (x >= 1), as triton.next_power_of_2, without importing Triton."""
    return 1 << (int(x) - 1).bit_length()


def causal_scan(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, key_log_scale: torch.Tensor | None = None,
                *, twin_backward: Callable | None = None, accumulate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(num (..., N, d), den (..., N)) of causal linear attention by the Triton scan (module doc),
    for phi_q, phi_k (..., N, m) and v (..., N, d) of one floating dtype and device, m, d <=
    MAX_WIDTH: the function of CausalMask.attend. key_log_scale: None, or per-key constants
    (..., N, 1) (finite: CausalMask.attend checks), undone as the PyTorch scan does (every factor
    <= 1; the result is the true (num_i, den_i) times exp(-r_i)). Differentiable in phi_q, phi_k,
    v; twin_backward: a differentiable callable (phi_q, phi_k, v, c, g_num, g_den) -> (dq, dk, dv)
    (c (..., N) or None) used for double backward, where the kernels' backward is not
    differentiable (RuntimeError without it). accumulate: return num and den in the accumulation
    dtype (float32 for half-precision inputs) rather than rounded to the inputs' (the driver's
    route, fast.operator's ``attend_takes_half``); their gradients are then read in float32 too.
    O(N C (m + d) + N m d) work.

    Raises ValueError naming the argument for mismatched shapes, dtypes or devices and widths
    beyond MAX_WIDTH; RuntimeError where Triton is not installed or cannot run on the tensors'
    device (a CPU tensor without TRITON_INTERPRET=1 set before Triton's import).

    >>> import torch
    >>> from fast.kernels.causal_scan import causal_scan
    >>> from fast.kernels.dispatch import use_causal_kernel
    >>> q = torch.rand(2, 40, 16, generator=torch.Generator().manual_seed(0))
    >>> dense = (q @ q.mT).tril()                     # M o (phi_q phi_k^T)
    >>> if use_causal_kernel(q, q, q):                # CUDA and Triton (or forced under the interpreter)
    ...     num, den = causal_scan(q, q, q)
    ...     ok = torch.allclose(den, dense.sum(-1), rtol=1e-4) and torch.allclose(num, dense @ q, rtol=1e-4)
    ... else:                                         # elsewhere CausalMask.attend runs the PyTorch scan
    ...     ok = True
    >>> ok
    True
    """
    _check_inputs(phi_q, phi_k, v)
    c = None if key_log_scale is None else check_key_log_scale(key_log_scale, phi_k, phi_k.shape[-2])
    return _TritonCausalScan.apply(phi_q, phi_k, v, c, twin_backward, accumulate)


def _check_inputs(phi_q: object, phi_k: object, v: object) -> None:
    for name, t in (("phi_q", phi_q), ("phi_k", phi_k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            got = (f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"{name} must be a floating tensor (..., N, c), got {got}")
    if phi_q.shape != phi_k.shape or phi_k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"phi_q, phi_k (..., N, m) and v (..., N, d) must share their leading dims and N (and phi_q, "
                         f"phi_k their m), got {tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}")
    if not phi_q.dtype == phi_k.dtype == v.dtype:
        raise ValueError(f"phi_q, phi_k and v must share one dtype, got {phi_q.dtype}, {phi_k.dtype} and {v.dtype}")
    if not phi_q.device == phi_k.device == v.device:
        raise ValueError(f"phi_q, phi_k and v must be on one device, got {phi_q.device}, {phi_k.device} and {v.device}")
    kernel_blocks(phi_q.shape[-1], v.shape[-1])  # the widths
    require_triton(phi_q, "the Triton causal scan", imported=triton is not None)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, *t.shape[-2:]).contiguous()


def _constants(c: torch.Tensor | None, acc: torch.dtype, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(c, r) as contiguous (S, N) tensors in the accumulation dtype, r the running max of c
    (fast.prefix: on CUDA by doubling, where torch.cummax's scan with indices was slow)."""
    if c is None:
        return None, None
    c = c.reshape(-1, n).to(acc).contiguous()
    return c, running_max(c).contiguous()


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _TritonCausalScan(torch.autograd.Function):
    """causal_scan's autograd: saves phi_q, phi_k, v (and c); backward runs the backward kernel, or
    twin_backward under create_graph (double backward)."""

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, c, twin_backward, accumulate):
        ctx.twin_backward = twin_backward
        constants = _constants(c, _acc_dtype(v.dtype), phi_q.shape[-2])  # (S, N) each: kept for backward
        ctx.save_for_backward(phi_q, phi_k, v, c, *constants)
        return _forward(phi_q, phi_k, v, constants, accumulate)

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v, c, *constants = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the kernels' backward is not differentiable
            if ctx.twin_backward is None:
                raise RuntimeError("double backward through the Triton causal scan needs its twin_backward (the "
                                   "PyTorch scan's; CausalMask.attend passes it)")
            dq, dk, dv = ctx.twin_backward(phi_q, phi_k, v, c, g_num, g_den)
        else:
            dq, dk, dv = _backward(phi_q, phi_k, v, constants, g_num, g_den)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None, None)


def segment_plan(chunks: int, programs: int, device: torch.device) -> tuple[int, int]:
    """(P, chunks per segment): the token axis of each slice is cut into P segments of whole
    chunks scanned in parallel, each from the state the segments before it leave (summed from
    their totals, module doc). On CUDA P fills about PROGRAMS_PER_SM programs per multiprocessor
    over ``programs`` = slices x value blocks, with at least MIN_SEGMENT_CHUNKS chunks per segment;
    SEGMENTS (an int) forces P (the tests, under the interpreter); elsewhere P = 1. O(1).

    >>> import torch
    >>> from fast.kernels.causal_scan import segment_plan
    >>> segment_plan(100, 8, torch.device("cpu"))
    (1, 100)
    """
    if SEGMENTS is not None:
        p = max(1, min(int(SEGMENTS), chunks))
    elif device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        p = max(1, min(-(-PROGRAMS_PER_SM * sms // programs), chunks // MIN_SEGMENT_CHUNKS))
    else:
        p = 1
    per = -(-chunks // p)
    return -(-chunks // per), per


#: Segments per slice: None (chosen by segment_plan from the GPU's size) or an int that forces it.
SEGMENTS: int | None = None
#: segment_plan's aim: programs per multiprocessor, and the fewest chunks a segment gets.
PROGRAMS_PER_SM = 4
MIN_SEGMENT_CHUNKS = 8


def _launch_args(v: torch.Tensor) -> dict:
    acc = _acc_dtype(v.dtype)
    return {"PRECISION": dot_precision(v), "ACC": tl.float64 if acc == torch.float64 else tl.float32}


def _totals(a, b, c, r, gd, plan, blocks, m, d, reverse: bool, config: tuple[int, int, int, int], **launch):
    """Each segment's total (S, P, m, d) and its column of ones or g_den (S, P, m) (module doc), in
    the chunks and value blocks of ``config`` (kernel_blocks) of the pass they serve; None, None for
    one segment (nothing comes before or after it)."""
    segments, per = plan
    if segments == 1:
        return None, None
    s, n = a.shape[0], a.shape[1]
    acc = _acc_dtype(b.dtype)
    tot = torch.zeros(s, segments, m, d, dtype=acc, device=a.device)
    ztot = torch.zeros(s, segments, m, dtype=acc, device=a.device)
    chunk, bm, bd, warps = config
    _totals_kernel[(s, blocks, segments)](a, b, a if c is None else c, a if r is None else r, a if gd is None else gd,
                                          tot, ztot, n, m, d, segments, per, CHUNK=chunk, BM=bm, BD=bd,
                                          STABLE=c is not None, REVERSE=reverse, num_warps=warps, **launch)
    return tot, ztot


def _forward(phi_q, phi_k, v, constants, accumulate: bool = False):
    (n, m), d = phi_q.shape[-2:], v.shape[-1]
    acc = _acc_dtype(v.dtype)
    # written in the accumulation dtype and rounded by torch: to nearest, where Triton's interpreter
    # truncates a float32 -> bfloat16 conversion (so the tests see what a GPU computes)
    num = torch.empty(v.shape, dtype=acc, device=v.device)
    den = torch.empty(v.shape[:-1], dtype=acc, device=v.device)
    if num.numel() == 0:
        return (num, den) if accumulate else (num.to(v.dtype), den.to(v.dtype))
    q, k, vv = _flat(phi_q), _flat(phi_k), _flat(v)
    c, r = constants  # (S, N) in the accumulation dtype, or None, None
    config = chunk, bm, bd, warps = kernel_blocks(m, d, dtype=v.dtype)
    blocks = triton.cdiv(d, bd)
    plan = segment_plan(triton.cdiv(n, chunk), q.shape[0] * blocks, q.device)
    launch = _launch_args(v)
    tot, ztot = _totals(k, vv, c, r, None, plan, blocks, m, d, False, config, **launch)
    _forward_kernel[(q.shape[0], blocks, plan[0])](
        q, k, vv, q if c is None else c, q if r is None else r, num if tot is None else tot,
        den if ztot is None else ztot, num, den, n, m, d, plan[0], plan[1],
        CHUNK=chunk, BM=bm, BD=bd, STABLE=c is not None, num_warps=warps, **launch)
    return (num, den) if accumulate else (num.to(v.dtype), den.to(v.dtype))


def _backward(phi_q, phi_k, v, constants, g_num, g_den):
    n, m, d = phi_q.shape[-2], phi_q.shape[-1], v.shape[-1]
    if phi_q.numel() == 0 or v.numel() == 0:
        return torch.zeros_like(phi_q), torch.zeros_like(phi_k), torch.zeros_like(v)
    q, k, vv = _flat(phi_q), _flat(phi_k), _flat(v)
    # read in their own dtype (the kernel sums in float32): float32 gradients of accumulated outputs
    # are not rounded to the inputs' half precision first
    gn = _flat(g_num)
    gd = g_den.reshape(-1, n).contiguous()
    acc = _acc_dtype(v.dtype)
    c, r = constants  # (S, N) in the accumulation dtype, or None, None
    config = chunk, bm, bd, warps = kernel_blocks(m, d, backward=True, dtype=v.dtype)
    blocks = triton.cdiv(d, bd)
    s = q.shape[0]
    plan = segment_plan(triton.cdiv(n, chunk), s * blocks, q.device)
    launch = _launch_args(v)
    tot, ztot = _totals(k, vv, c, r, None, plan, blocks, m, d, False, config, **launch)  # of k [v, 1]^T
    rtot, rztot = _totals(q, gn, c, r, gd, plan, blocks, m, d, True, config, **launch)  # of q [g_num, g_den]^T
    # each value block's share of dq and dk (summed below); dv is per block already
    dq = torch.empty(blocks, s, n, m, dtype=acc, device=q.device)
    dk = torch.empty(blocks, s, n, m, dtype=acc, device=q.device)
    dv = torch.empty(s, n, d, dtype=acc, device=q.device)
    _backward_kernel[(s, blocks, plan[0])](
        q, k, vv, q if c is None else c, q if r is None else r, gn, gd,
        dv if tot is None else tot, gd if ztot is None else ztot, dv if rtot is None else rtot,
        gd if rztot is None else rztot, dq, dk, dv, n, m, d, s * n, plan[0], plan[1],
        CHUNK=chunk, BM=bm, BD=bd, STABLE=c is not None, num_warps=warps, **launch)
    # one value block (d <= BD) wrote the whole of dq and dk: no sum, no copy
    dq, dk = (dq.sum(0), dk.sum(0)) if blocks > 1 else (dq[0], dk[0])
    return (dq.reshape(phi_q.shape).to(phi_q.dtype), dk.reshape(phi_k.shape).to(phi_k.dtype),
            dv.reshape(v.shape).to(v.dtype))


if triton is not None:
    @triton.jit
    def _chunk_factors(C, R, rows, causal, t, N, CHUNK: tl.constexpr, ACC: tl.constexpr):
        """For chunk t: W (CHUNK x CHUNK) = exp(c_j - r_i) on j <= i, else 0; the query factors
        exp(E_{t-1} - r_i), the key factors exp(c_j - E_t) and the state's decay exp(E_{t-1} - E_t),
        all exp of numbers <= 0 (rows past N repeat the last token's constants)."""
        idx = tl.minimum(rows, N - 1)
        cj = tl.load(C + idx).to(ACC)
        ri = tl.load(R + idx).to(ACC)
        e = tl.load(R + tl.minimum(t * CHUNK + CHUNK, N) - 1).to(ACC)
        e_prev = tl.load(R + tl.maximum(t * CHUNK - 1, 0)).to(ACC)
        w = tl.exp(tl.where(causal, cj[None, :] - ri[:, None], float("-inf")))
        return w, tl.exp(e_prev - ri), tl.exp(cj - e), tl.exp(e_prev - e)

    @triton.jit
    def _segment_end(R, p, N, SEG_CHUNKS, CHUNK: tl.constexpr, ACC: tl.constexpr):
        """r at the last token of segment p (its E); r_0 for p = -1 (as E_prev of the first chunk)."""
        return tl.load(R + tl.maximum(tl.minimum((p + 1) * SEG_CHUNKS * CHUNK, N) - 1, 0)).to(ACC)

    @triton.jit
    def _incoming(T, Z, R, p, lo, hi, pd, offs_m, offs_d, m_ok, d_ok, N, M, D, SEG_CHUNKS, FORWARD: tl.constexpr,
                  CHUNK: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, STABLE: tl.constexpr, ACC: tl.constexpr):
        """The state segment p starts from: the totals of segments lo..hi-1, each brought to p's
        units (forward: E of segment p - 1, from totals in units of their own E; reverse: E of
        segment p, from totals in units of the E before them), every factor <= 1. The column of ones
        or g_den is value block 0's (pd), as in the scans: 0 in the other blocks."""
        z_ok = offs_m < tl.where(pd == 0, M, 0)
        state = tl.zeros((BM, BD), dtype=ACC)
        zstate = tl.zeros((BM,), dtype=ACC)
        if STABLE:
            e_here = _segment_end(R, p - 1 if FORWARD else p, N, SEG_CHUNKS, CHUNK, ACC)
        for pp in range(lo, hi):
            tile = tl.load(T + pp * M * D + offs_m[:, None] * D + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :],
                           other=0.0).to(ACC)
            zt = tl.load(Z + pp * M + offs_m, mask=z_ok, other=0.0).to(ACC)
            if STABLE:
                if FORWARD:
                    f = tl.exp(_segment_end(R, pp, N, SEG_CHUNKS, CHUNK, ACC) - e_here)
                else:
                    f = tl.exp(e_here - _segment_end(R, pp - 1, N, SEG_CHUNKS, CHUNK, ACC))
                state += tile * f
                zstate += zt * f
            else:
                state += tile
                zstate += zt
        return state, zstate

    # N and the segment sizes vary with every call: not specialised, so a new length compiles nothing new
    @triton.jit(do_not_specialize=["N", "SEGS", "SEG_CHUNKS"])
    def _totals_kernel(A, B, C, R, GD, T, Z, N, M, D, SEGS, SEG_CHUNKS, CHUNK: tl.constexpr, BM: tl.constexpr,
                       BD: tl.constexpr, STABLE: tl.constexpr, REVERSE: tl.constexpr, PRECISION: tl.constexpr,
                       ACC: tl.constexpr):
        # segment p's total of a [b, w]^T: forward a = phi_k, b = v, w = 1, in units of the segment's
        # own E (factors exp(c_j - E_p)); reverse a = phi_q, b = g_num, w = g_den, in units of the E
        # before it (factors exp(E_{p-1} - r_i))
        s = tl.program_id(0).to(tl.int64)
        pd = tl.program_id(1)
        p = tl.program_id(2)
        offs_c = tl.arange(0, CHUNK)
        offs_m = tl.arange(0, BM)
        offs_d = pd * BD + tl.arange(0, BD)
        m_ok = offs_m < M
        d_ok = offs_d < D
        A += s * N * M
        B += s * N * D
        C += s * N
        R += s * N
        GD += s * N
        T += (s * SEGS + p) * M * D
        Z += (s * SEGS + p) * M
        first = p * SEG_CHUNKS
        last = tl.minimum(first + SEG_CHUNKS, tl.cdiv(N, CHUNK))
        if STABLE:
            e_ref = _segment_end(R, p - 1 if REVERSE else p, N, SEG_CHUNKS, CHUNK, ACC)
        total = tl.zeros((BM, BD), dtype=ACC)
        ztotal = tl.zeros((BM,), dtype=ACC)
        for t in range(first, last):
            rows = (t * CHUNK + offs_c).to(tl.int64)
            r_ok = rows < N
            a = tl.load(A + rows[:, None] * M + offs_m[None, :], mask=r_ok[:, None] & m_ok[None, :], other=0.0).to(ACC)
            b = tl.load(B + rows[:, None] * D + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
            if STABLE:
                idx = tl.minimum(rows, N - 1)
                if REVERSE:
                    a = a * tl.exp(e_ref - tl.load(R + idx).to(ACC))[:, None]
                else:
                    a = a * tl.exp(tl.load(C + idx).to(ACC) - e_ref)[:, None]
            total += tl.dot(tl.trans(a), b, input_precision=PRECISION)
            if REVERSE:
                ztotal += tl.sum(a * tl.load(GD + rows, mask=r_ok, other=0.0).to(ACC)[:, None], axis=0)
            else:
                ztotal += tl.sum(a, axis=0)
        tl.store(T + offs_m[:, None] * D + offs_d[None, :], total, mask=m_ok[:, None] & d_ok[None, :])
        tl.store(Z + offs_m, ztotal, mask=offs_m < tl.where(pd == 0, M, 0))  # the same in every block: block 0's

    # N and the segment sizes vary with every call: not specialised, so a new length compiles nothing new
    @triton.jit(do_not_specialize=["N", "SEGS", "SEG_CHUNKS"])
    def _forward_kernel(Q, K, V, C, R, T, Z, NUM, DEN, N, M, D, SEGS, SEG_CHUNKS, CHUNK: tl.constexpr,
                        BM: tl.constexpr, BD: tl.constexpr, STABLE: tl.constexpr, PRECISION: tl.constexpr,
                        ACC: tl.constexpr):
        s = tl.program_id(0).to(tl.int64)
        pd = tl.program_id(1)
        p = tl.program_id(2)
        offs_c = tl.arange(0, CHUNK)
        offs_m = tl.arange(0, BM)
        offs_d = pd * BD + tl.arange(0, BD)
        m_ok = offs_m < M
        d_ok = offs_d < D
        Q += s * N * M
        K += s * N * M
        V += s * N * D
        NUM += s * N * D
        DEN += s * N
        C += s * N
        R += s * N
        T += s * SEGS * M * D
        Z += s * SEGS * M
        causal = offs_c[:, None] >= offs_c[None, :]
        n_den = tl.where(pd == 0, N, 0)  # the tokens whose den this program writes: value block 0's
        state, zstate = _incoming(T, Z, R, p, 0, p, pd, offs_m, offs_d, m_ok, d_ok, N, M, D, SEG_CHUNKS, True,
                                  CHUNK, BM, BD, STABLE, ACC)
        first = p * SEG_CHUNKS
        for t in range(first, tl.minimum(first + SEG_CHUNKS, tl.cdiv(N, CHUNK))):
            rows = (t * CHUNK + offs_c).to(tl.int64)
            r_ok = rows < N
            q = tl.load(Q + rows[:, None] * M + offs_m[None, :], mask=r_ok[:, None] & m_ok[None, :], other=0.0).to(ACC)
            k = tl.load(K + rows[:, None] * M + offs_m[None, :], mask=r_ok[:, None] & m_ok[None, :], other=0.0).to(ACC)
            v = tl.load(V + rows[:, None] * D + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(ACC)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            if STABLE:
                w, fq, fk, decay = _chunk_factors(C, R, rows, causal, t, N, CHUNK, ACC)
                scores = scores * w
                qs = q * fq[:, None]
                ks = k * fk[:, None]
            else:
                scores = tl.where(causal, scores, 0.0)
                qs = q
                ks = k
            num = tl.dot(scores, v, input_precision=PRECISION) + tl.dot(qs, state, input_precision=PRECISION)
            den = tl.sum(scores, axis=1) + tl.sum(qs * zstate[None, :], axis=1)
            tl.store(NUM + rows[:, None] * D + offs_d[None, :], num.to(NUM.dtype.element_ty),
                     mask=r_ok[:, None] & d_ok[None, :])
            tl.store(DEN + rows, den.to(DEN.dtype.element_ty), mask=rows < n_den)
            if STABLE:
                state = state * decay + tl.dot(tl.trans(ks), v, input_precision=PRECISION)
                zstate = zstate * decay + tl.sum(ks, axis=0)
            else:
                state += tl.dot(tl.trans(k), v, input_precision=PRECISION)
                zstate += tl.sum(k, axis=0)

    # N and the segment sizes vary with every call: not specialised, so a new length compiles nothing new
    @triton.jit(do_not_specialize=["N", "SN", "SEGS", "SEG_CHUNKS"])
    def _backward_kernel(Q, K, V, C, R, GN, GD, T, Z, U, UZ, DQ, DK, DV, N, M, D, SN, SEGS, SEG_CHUNKS,
                         CHUNK: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, STABLE: tl.constexpr,
                         PRECISION: tl.constexpr, ACC: tl.constexpr):
        s = tl.program_id(0).to(tl.int64)
        pd = tl.program_id(1)
        p = tl.program_id(2)
        offs_c = tl.arange(0, CHUNK)
        offs_m = tl.arange(0, BM)
        offs_d = pd * BD + tl.arange(0, BD)
        m_ok = offs_m < M
        d_ok = offs_d < D
        Q += s * N * M
        K += s * N * M
        V += s * N * D
        GN += s * N * D
        DV += s * N * D
        GD += s * N
        C += s * N
        R += s * N
        T += s * SEGS * M * D
        Z += s * SEGS * M
        U += s * SEGS * M * D
        UZ += s * SEGS * M
        DQ += (pd.to(tl.int64) * SN + s * N) * M  # this value block's share of dq, dk
        DK += (pd.to(tl.int64) * SN + s * N) * M
        causal = offs_c[:, None] >= offs_c[None, :]
        n_den = tl.where(pd == 0, N, 0)  # the den column [v, 1] belongs to value block 0
        first = p * SEG_CHUNKS
        last = tl.minimum(first + SEG_CHUNKS, tl.cdiv(N, CHUNK))
        # dq_i = sum_{j <= i} W_ij (G_i . [v_j, 1]) k_j: the forward scan of k [v, 1]^T
        state, zstate = _incoming(T, Z, R, p, 0, p, pd, offs_m, offs_d, m_ok, d_ok, N, M, D, SEG_CHUNKS, True,
                                  CHUNK, BM, BD, STABLE, ACC)
        for t in range(first, last):
            rows = (t * CHUNK + offs_c).to(tl.int64)
            r_ok = rows < N
            qm = r_ok[:, None] & m_ok[None, :]
            dm = r_ok[:, None] & d_ok[None, :]
            k = tl.load(K + rows[:, None] * M + offs_m[None, :], mask=qm, other=0.0).to(ACC)
            v = tl.load(V + rows[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(ACC)
            g = tl.load(GN + rows[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(ACC)
            gd = tl.load(GD + rows, mask=rows < n_den, other=0.0).to(ACC)
            ds = tl.dot(g, tl.trans(v), input_precision=PRECISION) + gd[:, None]
            cross = tl.dot(g, tl.trans(state), input_precision=PRECISION) + gd[:, None] * zstate[None, :]
            if STABLE:
                w, fq, fk, decay = _chunk_factors(C, R, rows, causal, t, N, CHUNK, ACC)
                ds = ds * w
                cross = cross * fq[:, None]
                ks = k * fk[:, None]
            else:
                ds = tl.where(causal, ds, 0.0)
                ks = k
            dq = tl.dot(ds, k, input_precision=PRECISION) + cross
            tl.store(DQ + rows[:, None] * M + offs_m[None, :], dq.to(DQ.dtype.element_ty), mask=qm)
            if STABLE:
                state = state * decay + tl.dot(tl.trans(ks), v, input_precision=PRECISION)
                zstate = zstate * decay + tl.sum(ks, axis=0)
            else:
                state += tl.dot(tl.trans(k), v, input_precision=PRECISION)
                zstate += tl.sum(k, axis=0)
        # dk_j, dv_j: the reverse scan of q [g, g_den]^T, kept in units of E_t
        state, zstate = _incoming(U, UZ, R, p, p + 1, SEGS, pd, offs_m, offs_d, m_ok, d_ok, N, M, D, SEG_CHUNKS, False,
                                  CHUNK, BM, BD, STABLE, ACC)
        for tt in range(0, last - first):
            t = last - 1 - tt
            rows = (t * CHUNK + offs_c).to(tl.int64)
            r_ok = rows < N
            qm = r_ok[:, None] & m_ok[None, :]
            dm = r_ok[:, None] & d_ok[None, :]
            q = tl.load(Q + rows[:, None] * M + offs_m[None, :], mask=qm, other=0.0).to(ACC)
            k = tl.load(K + rows[:, None] * M + offs_m[None, :], mask=qm, other=0.0).to(ACC)
            v = tl.load(V + rows[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(ACC)
            g = tl.load(GN + rows[:, None] * D + offs_d[None, :], mask=dm, other=0.0).to(ACC)
            gd = tl.load(GD + rows, mask=rows < n_den, other=0.0).to(ACC)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            ds = tl.dot(g, tl.trans(v), input_precision=PRECISION) + gd[:, None]
            if STABLE:
                w, fq, fk, decay = _chunk_factors(C, R, rows, causal, t, N, CHUNK, ACC)
                scores = scores * w
                ds = ds * w
                ks = k * fk[:, None]
                qs = q * fq[:, None]
                dk_cross = (tl.dot(v, tl.trans(state), input_precision=PRECISION) + zstate[None, :]) * fk[:, None]
            else:
                scores = tl.where(causal, scores, 0.0)
                ds = tl.where(causal, ds, 0.0)
                ks = k
                qs = q
                dk_cross = tl.dot(v, tl.trans(state), input_precision=PRECISION) + zstate[None, :]
            dv = tl.dot(tl.trans(scores), g, input_precision=PRECISION) + tl.dot(ks, state, input_precision=PRECISION)
            dk = tl.dot(tl.trans(ds), q, input_precision=PRECISION) + dk_cross
            tl.store(DV + rows[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=dm)
            tl.store(DK + rows[:, None] * M + offs_m[None, :], dk.to(DK.dtype.element_ty), mask=qm)
            if STABLE:
                state = state * decay + tl.dot(tl.trans(qs), g, input_precision=PRECISION)
                zstate = zstate * decay + tl.sum(qs * gd[:, None], axis=0)
            else:
                state += tl.dot(tl.trans(q), g, input_precision=PRECISION)
                zstate += tl.sum(q * gd[:, None], axis=0)
