"""Sequence masks as operators: causal, packing, padding (choromanski22 Sec. 3.1; docs/papers.md
Sec. 0, "Cheap masks").

All act on x (..., N, c) in O(N c) (causal ``attend``: O(N C (m + d) + N m d)) and never build
N x N. The ``attend`` of causal and padding are autograd Functions that save only phi_q, phi_k, v
(and small (..., N, 1) key weights or constants) and form their intermediates again in backward,
so training memory is O(N (m + d)). The causal scan's derivation (chunks, key constants, the
chunk rule) is in docs/papers.md, fast.masks.sequence.
"""
from __future__ import annotations

import math

import torch

from fast.algebra import rows_dot, weighted_rows
from fast.kernels.dispatch import use_causal_kernel
from fast.operator import MaskOperator, SymmetricMaskOperator
from fast.prefix import running_max
from fast.segments import Segments, segment_max
from fast.validation import (broadcast_shape, check_allocation, check_key_log_scale, check_positive_int, check_tokens,
                             compute_dtype)


def check_mask_batch(name: str, mask_shape: tuple, x: torch.Tensor, what: str) -> tuple[int, ...]:
    """The batching rule of per-token mask data (segment_ids, key_mask) of shape (..., N) against an
    input x (..., N, c): the mask is unbatched (N,), or it has exactly as many leading dims as x and
    they broadcast (e.g. (B, 1, N) for x (B, H, N, c)). Returns the broadcast leading dims. O(ndim).

    Raises ValueError naming the mask's argument (``name``), both shapes and the fix for a (B, N)
    mask against (B, H, N, c) inputs (it would broadcast B against H) or against unbatched (N, c)
    inputs, and for leading dims that do not broadcast.

    >>> import torch
    >>> from fast.masks.sequence import check_mask_batch
    >>> check_mask_batch("key_mask", (2, 1, 5), torch.ones(2, 3, 5, 4), "input x")
    (2, 3)
    """
    mask_lead, x_lead = tuple(mask_shape[:-1]), tuple(x.shape[:-2])
    if mask_lead and len(mask_lead) != len(x_lead):
        raise ValueError(
            f"{name} of shape {tuple(mask_shape)} has {len(mask_lead)} leading (batch) dim(s) but the {what} of shape "
            f"{tuple(x.shape)} has {len(x_lead)}: a batched {name} needs exactly one leading dim per leading dim of "
            f"the inputs, 1 where it is shared (e.g. {name}[:, None, :], of shape (B, 1, N), for inputs "
            f"(B, H, N, d)); or use an unbatched {name} of shape (N,) for every sample")
    out = []
    for a, b in zip(x_lead, mask_lead or (1,) * len(x_lead)):
        if a != b and 1 not in (a, b):
            raise ValueError(f"{name} of shape {tuple(mask_shape)} does not broadcast against the {what} of shape "
                             f"{tuple(x.shape)}: leading dims {mask_lead} vs {x_lead} (each must be equal or 1)")
        out.append(max(a, b) if 1 in (a, b) else a)
    return tuple(out)


class CausalMask(MaskOperator):
    """M_ij = 1 if j <= i (choromanski22 Sec. 3.1): causal linear attention.

    n: the number of tokens N; chunk: None (chosen per call by ``chunk_for``) or the chunk C of the
    scan; ValueError naming n or chunk unless each is a positive int. ``matmul`` is a prefix sum,
    ``rmatmul`` a suffix sum: x (..., N, c) -> (..., N, c), O(N c). ``attend(phi_q, phi_k, v)``
    (phi (..., N, m), v (..., N, d)) -> (num (..., N, d), den (..., N)) is the chunked scan:
    O(N C (m + d) + N m d) work in GEMMs, O(N (m + d)) memory kept for backward, double backward
    supported. ``key_stabilizer`` returns FAVOR+ key constants (``rescales_keys``): one per slice
    whose running max spans little, per-key running maxima otherwise, which
    ``attend(..., key_log_scale=c)`` undoes exactly, so no FAVOR+ key underflows the early keys the
    early queries see; ``attend_optimistic`` / ``attend_exact`` are the driver's routes to it
    (fast.operator; the plain scan for one constant per slice). Derivations and the chunk rule:
    docs/papers.md, fast.masks.sequence. On CUDA the scan runs as a Triton kernel where Triton
    imports (fast.kernels.causal_scan; the switch and the rule: fast.kernels.dispatch), and as the
    PyTorch scan here otherwise.

    >>> import torch
    >>> from fast import CausalMask, masked_linear_attention
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.rand(3, 6, 2, generator=g, dtype=torch.float64).unbind(0)
    >>> a = torch.ones(6, 6, dtype=torch.float64).tril() * (q @ k.T)   # M o (phi_q phi_k^T), dense
    >>> torch.allclose(masked_linear_attention(q, k, v, CausalMask(6)), a @ v / a.sum(-1, keepdim=True))
    True
    """

    #: M_ij = 1 or 0 (the guard of fast/ relies on it).
    nonnegative = True
    #: attend takes key_log_scale: the per-key constants of key_stabilizer (fast.operator).
    rescales_keys = True
    #: Key j reaches row j's products (and every later row's), in the scan and the Triton kernel
    #: alike: a non-finite phi_k_j or v_j makes num or den non-finite (0 * inf is NaN), so the
    #: driver's check of num and den covers the keys and values (fast.operator).
    attend_reaches_keys = True

    @property
    def attend_takes_half(self) -> bool:
        """attend(..., accumulate=True) takes half-precision features and values as they are and
        returns num and den in float32: the Triton kernel reads them in their dtype and sums in
        float32, the PyTorch scan works on float32 copies (fast.operator; the driver then makes no
        copies). False for a subclass that overrides attend, which may not take ``accumulate``."""
        return type(self).attend is CausalMask.attend

    #: chunk=None: the chunk is sqrt(m d) rounded to a power of two, clipped to this range.
    CHUNK_RANGE = (16, 64)
    #: chunk=None: the plain scan's backward clips the same rule to this range. It forms twice the
    #: forward's states (and their reverse scan) from the saved inputs, so fewer, larger chunks pay
    #: there: at m = d = 16 (N = 2^12..2^14, 2 threads) C = 32 took 0.75-0.9x the backward time of
    #: C = 16, while the forward was 5-12% faster at C = 16.
    BACKWARD_CHUNK_RANGE = (32, 64)
    #: key_stabilizer gives a narrow slice (its running max rising by at most factor_range) one
    #: constant, so FAVOR+ runs the plain scan there (no per-key factors: 3-5% less time for causal
    #: FAVOR+ at m = d = 16, N = 2^12..2^13 on 2 CPU threads, forward and with backward;
    #: on CUDA the plain kernel, whose backward took 28.0 ms against 41.9 ms for the decayed one at
    #: N = 2^20 on an H100). False (on the class or an instance): per-key running maxima always
    #: (measure.gpu's "favor-decayed" times that route beside "favor").
    narrow_constants = True

    def __init__(self, n: int, chunk: int | None = None):
        self.n = check_positive_int("n", n)
        self.chunk = None if chunk is None else check_positive_int("chunk", chunk)
        #: set once a call of attend_optimistic met constants wider than factor_range: later calls
        #: of that method take the decayed scan directly rather than try the narrow route first.
        self._wide = False

    def chunk_for(self, m: int, d: int, backward: bool = False) -> int:
        """The chunk C the scan uses for features of width m and values of width d (before the
        cap C <= N): ``chunk`` when given, else 2^round(log2(sqrt(m d))) within CHUNK_RANGE
        (backward: the plain scan's backward, within BACKWARD_CHUNK_RANGE)."""
        if self.chunk is not None:
            return self.chunk
        lo, hi = self.BACKWARD_CHUNK_RANGE if backward else self.CHUNK_RANGE
        return int(min(hi, max(lo, 2 ** round(0.5 * math.log2(max(1, m) * max(1, d))))))

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x = cumulative sum over tokens, x: (..., N, c)."""
        return torch.cumsum(x, dim=-2)

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x = suffix sums over tokens (sum over i >= j), x: (..., N, c)."""
        return torch.flip(torch.cumsum(torch.flip(x, dims=(-2,)), dim=-2), dims=(-2,))

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """FAVOR+ key constants from z (..., N, m) -> (..., N, 1), per (batch, head) slice from the
        running max r_j = max_{j' <= j} max_a z_j'a (the largest exponent among the keys query j
        sees): one constant R = r_N for the whole slice where r_N - r_1 <= factor_range(z.dtype) (a
        narrow slice, as unmasked FAVOR+'s slice max: its keys reach every query within e^T of
        their own scale), else c_j = r_j for each key (``narrow_constants`` False: always r_j).
        docs/papers.md, fast.masks.sequence."""
        check_tokens("z", z, self.n)
        return self._constants(z.amax(-1)).unsqueeze(-1)

    def row_key_stabilizer(self):
        """``key_stabilizer`` from the row maxima (..., N, 1) of z (the contract's row form,
        fast.operator), while key_stabilizer is CausalMask's own."""
        if self._own_stabilizer():
            return lambda rows: self._constants(rows.squeeze(-1)).unsqueeze(-1)
        return super().row_key_stabilizer()

    def _own_stabilizer(self) -> bool:
        """key_stabilizer is CausalMask's own (as defined at import; not replaced on a subclass or
        an instance)."""
        return getattr(self.key_stabilizer, "__func__", None) is _CAUSAL_KEY_STABILIZER

    def _constants(self, rows: torch.Tensor) -> torch.Tensor:
        """key_stabilizer's rule on the row maxima (..., N): R where a slice is narrow, else the
        running max (NaN and inf give the running max, whose non-finite values the driver refuses)."""
        r = running_max(rows)
        if not self.narrow_constants or r.shape[-1] == 0:
            return r
        top = r[..., -1:]
        return torch.where(top - r[..., :1] <= factor_range(rows.dtype), top.expand_as(r), r)

    def _own_constants(self) -> bool:
        """key_stabilizer is CausalMask's own with narrow_constants: its constants are one per slice
        wherever they can be, so attend_optimistic tries the plain scan first."""
        return self.narrow_constants and self._own_stabilizer()

    def _plain(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
               kernel: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(num, den) of the scan without constants: the Triton kernel or the PyTorch scan."""
        return self._kernel_scan(phi_q, phi_k, v, None) if kernel else _CausalScan.apply(phi_q, phi_k, v, self)

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, *,
               key_log_scale: torch.Tensor | None = None,
               accumulate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of causal linear attention by the chunked scan, for phi_q,
        phi_k (..., N, m) and v (..., N, d) with the same leading dims (ValueError naming the argument
        otherwise). key_log_scale: None, or detached constants c (..., N, 1) with phi_k_j =
        phi_true_j exp(-c_j); the result is then the true (num_i, den_i) times exp(-r_i), r_i =
        max_{j <= i} c_j, with every factor <= 1 (docs/papers.md, fast.masks.sequence). ValueError for
        non-finite key_log_scale. accumulate: num and den in the inputs' compute dtype (float32 for
        half precision; ``attend_takes_half``) rather than in their dtype.
        """
        self._check_attend_inputs(phi_q, phi_k, v)
        kernel = use_causal_kernel(phi_q, phi_k, v)
        if accumulate and not kernel:  # the PyTorch scan sums in its inputs' dtype: float32 copies
            work = compute_dtype(torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype))
            phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)
        if key_log_scale is None:
            return (self._kernel_scan(phi_q, phi_k, v, None, accumulate) if kernel
                    else _CausalScan.apply(phi_q, phi_k, v, self))
        c = self._check_log_scale(key_log_scale, phi_k)
        finite, narrow = torch.stack([torch.isfinite(c).all(), self._narrow(c)]).tolist()  # one host read
        if not finite:
            raise ValueError("key_log_scale contains non-finite values (NaN or inf)")
        if kernel:
            return self._kernel_scan(phi_q, phi_k, v, c, accumulate)
        return _StableCausalScan.apply(phi_q, phi_k, v, c, self, narrow)

    def _kernel_scan(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                     c: torch.Tensor | None, accumulate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(num, den) of ``attend`` by the Triton scan (fast.kernels.causal_scan; chosen by
        fast.kernels.dispatch): with constants c (..., N) always the decayed form, exact for any
        span of c; the PyTorch scan's backward serves double backward."""
        from fast.kernels.causal_scan import causal_scan  # imports Triton: only once the kernel is chosen
        return causal_scan(phi_q, phi_k, v, None if c is None else c.unsqueeze(-1), twin_backward=self._twin_backward,
                           accumulate=accumulate)

    def _twin_backward(self, phi_q, phi_k, v, c, g_num, g_den):
        """The PyTorch scan's (differentiable) backward of ``_kernel_scan`` (constants c (..., N) or None);
        half-precision inputs with float32 gradients (accumulate) go through float32 copies."""
        if g_num.dtype != phi_q.dtype:
            work = g_num.dtype
            grads = self._twin_backward(phi_q.to(work), phi_k.to(work), v.to(work),
                                        None if c is None else c.to(work), g_num, g_den.to(work))
            return tuple(g.to(t.dtype) for g, t in zip(grads, (phi_q, phi_k, v)))
        if c is None:
            return self._scan_backward(phi_q, phi_k, v, g_num, g_den)
        return self._stable_scan_backward(phi_q, phi_k, v, c, g_num, g_den)

    def _one_per_slice(self, c: torch.Tensor) -> torch.Tensor:
        """0-dim bool: every slice of the constants c (..., N) holds one value (NaN, inf: False)."""
        if c.numel() == 0:  # an empty batch: nothing to rescale
            return torch.ones((), dtype=torch.bool, device=c.device)
        # amax and amin apiece: torch 2.13's aminmax along a dim took 25 us against 8 for both at
        # (1, 4, 2^12) on the CPU; inf - inf and NaN compare False
        return (c.amax(-1) - c.amin(-1)).amax() <= 0

    def _narrow(self, c: torch.Tensor) -> torch.Tensor:
        """0-dim bool: every slice of the constants c (..., N) has r_N - r_1 <= factor_range(dtype), r
        their running max: the one-reference route is exact (docs/papers.md, fast.masks.sequence).
        """
        spread = c.amax(-1) - c[..., 0]
        if spread.numel() == 0:  # an empty batch: nothing to rescale
            return torch.ones((), dtype=torch.bool, device=c.device)
        return spread.amax() <= factor_range(c.dtype)  # NaN: False

    def attend_optimistic(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                          key_log_scale: torch.Tensor) -> tuple[object, torch.Tensor | None]:
        """((num, den), exact) for fast.favor_attention without a host read (the contract's optimistic
        attend, fast.operator), unless this instance has met wide constants (then the exact scan and
        exact None). With key_stabilizer's own constants (``narrow_constants``) the plain scan (on
        CUDA the plain kernel), exact where the constants are one per slice, which ``exact`` (0-dim
        bool) says; with other constants the one-reference route, exact where they are narrow (on
        the kernel, the decayed kernel). A subclass that overrides ``attend`` gets the contract's
        default instead.
        """
        if type(self).attend is not CausalMask.attend:
            return super().attend_optimistic(phi_q, phi_k, v, key_log_scale)
        kernel = use_causal_kernel(phi_q, phi_k, v)
        if self._wide or (kernel and not self._own_constants()):  # the decayed scan: exact for any constants
            return self._attend_scaled(phi_q, phi_k, v, key_log_scale), None
        self._check_attend_inputs(phi_q, phi_k, v)
        c = self._check_log_scale(key_log_scale, phi_k)
        if self._own_constants():  # one constant per slice (a narrow one): it cancels, the plain scan is exact
            num, den = self._plain(phi_q, phi_k, v, kernel)
            # exact, and every den normal: otherwise attend_exact redoes it in each query's own units
            return (num, den), self._one_per_slice(c) & _normal_floor(den)
        return _StableCausalScan.apply(phi_q, phi_k, v, c, self, True), self._narrow(c)

    def attend_exact(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                     key_log_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num, den) after ``attend_optimistic``'s flag read False: where the constants are one per
        slice (key_stabilizer's own, narrow slices, some den below the normal range) the plain scan
        in each query's own units (``_plain_in_query_units``); otherwise the decayed scan, which this
        instance keeps to afterwards (exact either way, and cheaper for a wide call).
        """
        if type(self).attend is not CausalMask.attend:
            return super().attend_exact(phi_q, phi_k, v, key_log_scale)
        c = self._check_log_scale(key_log_scale, phi_k)
        if self._own_constants() and bool(self._one_per_slice(c)):  # (a host read: the rare path)
            return self._plain_in_query_units(phi_q, phi_k, v)
        self._wide = True
        return self._attend_scaled(phi_q, phi_k, v, key_log_scale)

    def _plain_in_query_units(self, phi_q: torch.Tensor, phi_k: torch.Tensor,
                              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num, den) of the plain scan on keys with one constant R per slice, multiplied by
        f_i = 1 / max_{j <= i} max_a phi_k_ja = exp(R - r_i) in [1, e^T] on a narrow slice: in units of
        each query's largest visible key, as the scan with per-key constants returns them, so a den
        below the normal range in units of R but not in its own is kept (the per-query factor the
        contract allows; docs/papers.md, fast.masks.sequence)."""
        num, den = self._plain(phi_q, phi_k, v, use_causal_kernel(phi_q, phi_k, v))
        with torch.no_grad():
            top = running_max(phi_k.detach().amax(-1))
            f = torch.where(top > 0, top.reciprocal(), torch.ones_like(top)).to(den.dtype)
        return num * f.unsqueeze(-1), den * f

    def _check_attend_inputs(self, phi_q: object, phi_k: object, v: object) -> None:
        for name, t in (("phi_q", phi_q), ("phi_k", phi_k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.shape[-2] != self.n:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (..., N, c) with N = {self.n} tokens (the mask's n) "
                                 f"on axis -2, got {got}")
        if phi_q.shape[-1] != phi_k.shape[-1] or phi_q.shape[:-1] != phi_k.shape[:-1] or phi_k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"phi_q, phi_k (..., N, m) and v (..., N, d) must share their leading dims, N and m, got "
                             f"{tuple(phi_q.shape)}, {tuple(phi_k.shape)} and {tuple(v.shape)}")

    def _attend_scaled(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                       key_log_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attend(phi_q, phi_k, v, key_log_scale=c) without its host read of c's finiteness (the driver
        checks its inputs once per call).
        """
        self._check_attend_inputs(phi_q, phi_k, v)
        c = self._check_log_scale(key_log_scale, phi_k)
        if use_causal_kernel(phi_q, phi_k, v):
            return self._kernel_scan(phi_q, phi_k, v, c)
        return _StableCausalScan.apply(phi_q, phi_k, v, c, self, False)

    def _one_reference(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key factors exp(c_j - R) (..., N, 1), query factors exp(R - r_i) (..., N)), R = max_j c_j per
        slice: the one-reference route; <= 1 and in [1, exp(T)] where ``_narrow``.
        """
        r = running_max(c)
        top = r[..., -1:]
        return torch.exp(c - top).unsqueeze(-1), torch.exp(top - r)

    def _check_log_scale(self, c: object, phi_k: torch.Tensor) -> torch.Tensor:
        """key_log_scale as a detached (..., N) tensor of phi_k's leading dims and dtype (shape only)."""
        return check_key_log_scale(c, phi_k, self.n)

    def _chunks(self, *tensors: torch.Tensor, chunk: int) -> tuple[int, list[torch.Tensor]]:
        """(chunk C = min(chunk, N), each (..., N, c) zero-padded to a multiple of C and viewed as (..., N/C, C, c))."""
        n, c = self.n, min(chunk, self.n)
        pad = (-n) % c
        if pad:  # zero keys add nothing; padded queries are cut off by the caller
            tensors = tuple(torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in tensors)
        return c, [t.unflatten(-2, (-1, c)) for t in tensors]

    def _scan(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.n
        # (..., nc, C, m), (..., nc, C, m), (..., nc, C, d)
        c, (q, k, vv) = self._chunks(phi_q, phi_k, v, chunk=self.chunk_for(phi_q.shape[-1], v.shape[-1]))
        # without autograd (inside the Function) the (N, C) blocks are updated in place: one at a time
        scores = _tril(q @ k.transpose(-1, -2), not torch.is_grad_enabled())  # intra-chunk block
        num = scores @ vv
        den = scores.sum(-1)
        del scores
        kv = k.transpose(-1, -2) @ vv  # (..., nc, m, d) chunk totals
        ksum = k.sum(-2)  # (..., nc, m)
        # exclusive prefix over chunks = the running state each chunk starts from
        state = _exclusive_sum(kv)
        zstate = _exclusive_sum(ksum.unsqueeze(-1)).squeeze(-1)  # (..., nc, m)
        del kv, ksum
        cross = rows_dot(q, zstate)  # a GEMV per chunk, as one output row (fast.algebra)
        if torch.is_grad_enabled():
            num = num + q @ state
            den = den + cross
        else:
            num = _add_product_(num, q, state)
            den = den.add_(cross)
        num = num.flatten(-3, -2)[..., :n, :]
        den = den.flatten(-2)[..., :n]
        return num, den

    def _scan_backward(self, phi_q, phi_k, v, g_num, g_den):
        """Gradients (dq, dk, dv) of (num, den) = _scan(phi_q, phi_k, v) for (g_num (..., N, d),
        g_den (..., N)): the transposed scan (docs/papers.md, fast.masks.sequence), in chunks of
        ``chunk_for(m, d, backward=True)``. Without double backward the C x C blocks are formed in
        place, one alive at a time.
        """
        n = self.n
        c, (q, k, vv, gn) = self._chunks(phi_q, phi_k, v, g_num,
                                         chunk=self.chunk_for(phi_q.shape[-1], v.shape[-1], backward=True))
        gd = self._chunks(g_den.unsqueeze(-1), chunk=c)[1][0]  # (..., nc, C, 1)
        inplace = not torch.is_grad_enabled()  # True unless create_graph (double backward)
        scores = _tril(q @ k.transpose(-1, -2), inplace)
        dv = scores.transpose(-1, -2) @ gn
        del scores
        d_scores = gn @ vv.transpose(-1, -2)
        d_scores = _tril(d_scores.add_(gd) if inplace else d_scores + gd, inplace)
        dq = d_scores @ k
        dk = d_scores.transpose(-1, -2) @ q
        del d_scores
        state = _exclusive_sum(k.transpose(-1, -2) @ vv)  # (..., nc, m, d)
        zstate = _exclusive_sum(k.sum(-2).unsqueeze(-1)).squeeze(-1)  # (..., nc, m)
        d_state = _exclusive_sum(q.transpose(-1, -2) @ gn, reverse=True)  # (..., nc, m, d)
        d_zstate = _exclusive_sum(weighted_rows(q, gd.squeeze(-1)).unsqueeze(-1), reverse=True).squeeze(-1)  # (..., nc, m)
        if inplace:
            dq = _add_product_(dq, gn, state.transpose(-1, -2)).add_(gd * zstate.unsqueeze(-2))
            del state
            dk = _add_product_(dk, vv, d_state.transpose(-1, -2)).add_(d_zstate.unsqueeze(-2))
            dv = _add_product_(dv, k, d_state)
        else:
            dq = dq + gn @ state.transpose(-1, -2) + gd * zstate.unsqueeze(-2)
            dk = dk + vv @ d_state.transpose(-1, -2) + d_zstate.unsqueeze(-2)
            dv = dv + k @ d_state
        return tuple(t.flatten(-3, -2)[..., :n, :] for t in (dq, dk, dv))

    # ----------------------------------------------------------- the scan with key constants

    def _stable_parts(self, phi_q, phi_k, v, c):
        """Chunked views and scale factors of the scan with key constants c (..., N): C, (q, k, vb, cj, r,
        E, E_prev) with q, k (..., nc, C, m), vb = [v, 1] (..., nc, C, d + 1) (the denominator is the
        numerator's extra column), cj and their running max r (..., nc, C), E (..., nc) r at each
        chunk's last token and E_prev E of the previous chunk. Padded tokens repeat the last constant.
        """
        n = self.n
        r = running_max(c)
        vb = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        C, (q, k, vb) = self._chunks(phi_q, phi_k, vb, chunk=self.chunk_for(phi_q.shape[-1], v.shape[-1]))
        pad = (-n) % C
        if pad:
            c = torch.cat([c, c[..., -1:].expand(*c.shape[:-1], pad)], dim=-1)
            r = torch.cat([r, r[..., -1:].expand(*r.shape[:-1], pad)], dim=-1)
        cj, r = c.unflatten(-1, (-1, C)), r.unflatten(-1, (-1, C))
        E = r[..., -1]
        E_prev = torch.cat([r[..., :1, 0], E[..., :-1]], dim=-1)
        return C, (q, k, vb, cj, r, E, E_prev)

    def _weights(self, cj, r, C):
        """exp(c_j - r_i) for j <= i in the chunk, 0 above the diagonal: (..., nc, C, C), all <= 1."""
        # exp first: an entry above the diagonal may overflow to inf, and tril_ writes 0 over it
        return _tril((cj.unsqueeze(-2) - r.unsqueeze(-1)).exp_(), True)

    def _stable_scan(self, phi_q, phi_k, v, c, narrow: bool = False):
        """(num, den) of ``attend`` with key constants c (..., N): see its docstring. narrow: the
        one-reference route (exact where ``_narrow(c)``; docs/papers.md, fast.masks.sequence)."""
        n, d = self.n, v.shape[-1]
        if narrow:
            fk, fq = self._one_reference(c)
            num, den = self._scan(phi_q, phi_k * fk, v)
            if torch.is_grad_enabled():
                return num * fq.unsqueeze(-1), den * fq
            return num.mul_(fq.unsqueeze(-1)), den.mul_(fq)
        C, (q, k, vb, cj, r, E, E_prev) = self._stable_parts(phi_q, phi_k, v, c)
        inplace = not torch.is_grad_enabled()
        w = self._weights(cj, r, C)
        scores = q @ k.transpose(-1, -2)
        scores = scores.mul_(w) if inplace else scores * w
        del w
        out = scores @ vb  # (..., nc, C, d + 1): intra-chunk numerator and denominator
        del scores
        # chunk totals in units of E_t, states by the decayed scan, read in units of r_i
        totals = (k * torch.exp(cj - E.unsqueeze(-1)).unsqueeze(-1)).transpose(-1, -2) @ vb  # (..., nc, m, d + 1)
        state = _decayed_exclusive(totals, E_prev, E)  # S_{t-1}, in units of E_{t-1}
        del totals
        fq = torch.exp(E_prev.unsqueeze(-1) - r).unsqueeze(-1)  # (..., nc, C, 1), <= 1
        out = _add_product_(out, q * fq, state) if inplace else out + (q * fq) @ state
        out = out.flatten(-3, -2)[..., :n, :]
        return out[..., :d], out[..., d]

    def _stable_scan_backward(self, phi_q, phi_k, v, c, g_num, g_den, narrow: bool = False):
        """Gradients (dq, dk, dv) of _stable_scan(phi_q, phi_k, v, c) for (g_num, g_den); c is a constant.
        The transposed scan with the forward's factors, every one exp of a non-positive number
        (docs/papers.md, fast.masks.sequence: dq, dk, dv and the reverse decayed states R_t).
        """
        n, d = self.n, v.shape[-1]
        if narrow:  # the plain scan's gradients on the rescaled keys and upstream gradients
            fk, fq = self._one_reference(c)
            dq, dk, dv = self._scan_backward(phi_q, phi_k * fk, v, g_num * fq.unsqueeze(-1), g_den * fq)
            return dq, dk * fk, dv
        C, (q, k, vb, cj, r, E, E_prev) = self._stable_parts(phi_q, phi_k, v, c)
        G = torch.cat([g_num, g_den.unsqueeze(-1)], dim=-1)
        G = self._chunks(G, chunk=C)[1][0]  # (..., nc, C, d + 1)
        inplace = not torch.is_grad_enabled()
        w = self._weights(cj, r, C)
        scores = q @ k.transpose(-1, -2)
        scores = scores.mul_(w) if inplace else scores * w
        dv = scores.transpose(-1, -2) @ G[..., :d]
        del scores
        d_scores = G @ vb.transpose(-1, -2)
        d_scores = d_scores.mul_(w) if inplace else d_scores * w
        del w
        dq = d_scores @ k
        dk = d_scores.transpose(-1, -2) @ q
        del d_scores
        fq = torch.exp(E_prev.unsqueeze(-1) - r).unsqueeze(-1)  # (..., nc, C, 1)
        fk = torch.exp(cj - E.unsqueeze(-1)).unsqueeze(-1)  # (..., nc, C, 1)
        state = _decayed_exclusive((k * fk).transpose(-1, -2) @ vb, E_prev, E)  # S_{t-1}
        qf = q * fq
        dq = dq + fq * (G @ state.transpose(-1, -2))
        del state
        back = _decayed_exclusive(qf.transpose(-1, -2) @ G, E_prev, E, reverse=True)  # (..., nc, m, d + 1), R_t
        dk = dk + fk * (vb @ back.transpose(-1, -2))
        dv = dv + fk * (k @ back[..., :d])
        return tuple(t.flatten(-3, -2)[..., :n, :] for t in (dq, dk, dv))


#: CausalMask.key_stabilizer as defined at import: one patched in later is called on z like any other.
_CAUSAL_KEY_STABILIZER = CausalMask.key_stabilizer


def _running_max(rows: torch.Tensor) -> torch.Tensor:
    """The running max of row maxima r (..., N, 1) of z: CausalMask.key_stabilizer's constants with
    narrow_constants False, in the row form."""
    return running_max(rows.squeeze(-1)).unsqueeze(-1)


class _CausalScan(torch.autograd.Function):
    """CausalMask's chunked scan saving only its inputs; see CausalMask._scan_backward."""

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, mask):
        ctx.mask = mask
        ctx.save_for_backward(phi_q, phi_k, v)
        return mask._scan(phi_q, phi_k, v)

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v = ctx.saved_tensors
        dq, dk, dv = ctx.mask._scan_backward(phi_q, phi_k, v, g_num, g_den)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None)


class _StableCausalScan(torch.autograd.Function):
    """CausalMask's scan with key constants c (..., N): saves phi_q, phi_k, v and c only; c gets no
    gradient. narrow (a Python bool): the one-reference route, forward and backward alike."""

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, c, mask, narrow):
        ctx.mask, ctx.narrow = mask, narrow
        ctx.save_for_backward(phi_q, phi_k, v, c)
        return mask._stable_scan(phi_q, phi_k, v, c, narrow)

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v, c = ctx.saved_tensors
        dq, dk, dv = ctx.mask._stable_scan_backward(phi_q, phi_k, v, c.detach(), g_num, g_den, ctx.narrow)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None, None)


def _normal_floor(den: torch.Tensor) -> torch.Tensor:
    """0-dim bool: every den is at least its dtype's smallest normal number (NaN: False; empty: True)."""
    if den.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=den.device)
    return den.detach().amin() >= torch.finfo(den.dtype).tiny


def factor_range(dtype: torch.dtype) -> float:
    """T = log(largest finite value of dtype) / 8: the widest span of key constants per slice for
    which CausalMask's scan factors its weights through one reference (its query factors, up to
    exp(T), stay far from overflow). O(1).

    >>> import torch
    >>> from fast.masks.sequence import factor_range
    >>> round(factor_range(torch.float32), 1), round(factor_range(torch.float64), 1)
    (11.1, 88.7)
    """
    return math.log(torch.finfo(dtype).max) / 8


def _decayed_scan(x: torch.Tensor, level: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Inclusive scan with exponential decay along axis -3 of x (..., n, a, b), in O(n) work; a new
    tensor. level (..., n) is non-decreasing; S_t = sum_{t' <= t} exp(level_t' - level_t) x_t'
    (reverse: sum_{t' >= t} exp(level_t - level_t') x_t'), every factor <= 1. Without grad mode
    ``_scan_into``; under grad mode (double backward) ``_decayed_scan_pairwise``.
    """
    if torch.is_grad_enabled() and (x.requires_grad or level.requires_grad):
        return _decayed_scan_pairwise(x, level, reverse)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return _scan_into(x, out, reverse=reverse, level=level)


def _decayed_scan_pairwise(x: torch.Tensor, level: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """``_decayed_scan`` by a differentiable pairwise (Blelloch-style) recursion: log2(n) levels of
    tensor operations, no loop over the elements (docs/papers.md, fast.masks.sequence).
    """
    n = x.shape[-3]
    if n == 1:
        return x
    if n % 2:  # one more element, zero, at the last level: changes nothing
        x = torch.cat([x, torch.zeros_like(x[..., :1, :, :])], dim=-3)
        level = torch.cat([level, level[..., -1:]], dim=-1)
    x0, x1 = x[..., 0::2, :, :], x[..., 1::2, :, :]
    l0, l1 = level[..., 0::2], level[..., 1::2]
    step = torch.exp(l0 - l1)[..., None, None]  # (..., n / 2, 1, 1), <= 1
    if not reverse:
        # pair s at level l1[s]; the scan gives S at the odd positions; even 2s adds S_{2s - 1}
        odd = _decayed_scan_pairwise(x1 + step * x0, l1)
        carry = torch.exp(l1[..., :-1] - l0[..., 1:])[..., None, None] * odd[..., :-1, :, :]
        even = torch.cat([x0[..., :1, :, :], x0[..., 1:, :, :] + carry], dim=-3)
    else:
        # pair s at level l0[s]; the scan gives S at the even positions; odd 2s + 1 adds S_{2s + 2}
        even = _decayed_scan_pairwise(x0 + step * x1, l0, reverse=True)
        carry = torch.exp(l1[..., :-1] - l0[..., 1:])[..., None, None] * even[..., 1:, :, :]
        odd = torch.cat([x1[..., :-1, :, :] + carry, x1[..., -1:, :, :]], dim=-3)
    return torch.stack([even, odd], dim=-3).flatten(-4, -3)[..., :n, :, :]


def _decayed_exclusive(x: torch.Tensor, e_prev: torch.Tensor, e: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """The exclusive decayed scans of the stable causal scan over chunk totals x (..., nc, a, b):
    forward S_{t-1} in units of E_{t-1} = e_prev_t, reverse R_t in units of E_t = e_t. The
    inclusive ``_decayed_scan`` shifted by one chunk.
    """
    if reverse:
        back = _decayed_scan(x, e_prev, reverse=True)
        return torch.cat([back[..., 1:, :, :], torch.zeros_like(back[..., :1, :, :])], dim=-3)
    state = _decayed_scan(x, e)
    return torch.cat([torch.zeros_like(state[..., :1, :, :]), state[..., :-1, :, :]], dim=-3)


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Prefix sum that excludes the current entry (shift, not subtract: no cancellation)."""
    inc = torch.cumsum(x, dim=dim)
    zero = torch.zeros_like(inc.narrow(dim, 0, 1))
    return torch.cat([zero, inc.narrow(dim, 0, inc.shape[dim] - 1)], dim=dim)


def _scan_into(x: torch.Tensor, out: torch.Tensor, reverse: bool = False,
               level: torch.Tensor | None = None) -> torch.Tensor:
    """The inclusive scan of x (..., n, a, b) along axis -3 written into ``out`` (may be x itself):
    out_t = x_t + f_t out_{t-1} (reverse: out_t = x_t + f_t out_{t+1}), f = 1 without ``level``, else
    exp(-|level step|) for a non-decreasing level (..., n). Two levels of loops over contiguous
    slices (blocks of isqrt(n), then the carries): torch.cumsum along a middle axis of a large tensor
    is strided and much slower on CPU. No autograd; returns out.
    """
    n = x.shape[-3]
    if n == 0:
        return out
    b = max(1, math.isqrt(n))
    g = n // b
    tail = n - g * b
    step = carry_factor = None
    if level is not None:
        # every factor at once (a few passes over (..., n)), so that the loops below only add:
        # step_t multiplies the neighbour inside a block, carry_factor_t the neighbouring block's carry
        gap = torch.exp(-(level[..., 1:] - level[..., :-1]).abs())  # (..., n - 1)
        one = torch.ones_like(level[..., :1])
        step = torch.cat([one, gap], dim=-1) if not reverse else torch.cat([gap, one], dim=-1)
        t = torch.arange(n, device=level.device)
        src = (t // b) * b - 1 if not reverse else torch.clamp((t // b + 1) * b, max=n - 1)
        src = torch.where(src < 0, t, src)  # the first (last) block has no carry: factor unused
        carry_factor = torch.exp(-(level - level.index_select(-1, src)).abs())[..., None, None]

    def within(src: torch.Tensor, dst: torch.Tensor, f: torch.Tensor | None, length: int) -> None:
        """The scan inside blocks: src, dst (..., blocks, length, a, b) (or without the blocks axis)."""
        first = 0 if not reverse else length - 1
        dst.select(-3, first).copy_(src.select(-3, first))
        for i in (range(1, length) if not reverse else range(length - 2, -1, -1)):
            j = i - 1 if not reverse else i + 1
            if f is None:
                torch.add(src.select(-3, i), dst.select(-3, j), out=dst.select(-3, i))
            else:
                torch.addcmul(src.select(-3, i), f.select(-1, i)[..., None, None], dst.select(-3, j),
                              out=dst.select(-3, i))

    if g:
        blocks = (-1, b)
        within(x.narrow(-3, 0, g * b).unflatten(-3, blocks), out.narrow(-3, 0, g * b).unflatten(-3, blocks),
               None if step is None else step.narrow(-1, 0, g * b).unflatten(-1, blocks), b)
    if tail:
        within(x.narrow(-3, g * b, tail), out.narrow(-3, g * b, tail),
               None if step is None else step.narrow(-1, g * b, tail), tail)
    # carries between blocks: each block (b tokens, the tail last) from its neighbour, once that is final
    starts = list(range(0, n, b))
    for s in (range(1, len(starts)) if not reverse else range(len(starts) - 2, -1, -1)):
        lo = starts[s]
        hi = min(n, lo + b)
        src_t = lo - 1 if not reverse else hi
        block, carry = out.narrow(-3, lo, hi - lo), out.narrow(-3, src_t, 1)
        if level is None:
            block.add_(carry)
        else:
            block.addcmul_(carry_factor.narrow(-3, lo, hi - lo), carry)
    return out


def _tril(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    """x (..., C, C) with the entries above each block's diagonal zeroed: in place (``inplace``) or a
    new, differentiable tensor. Unlike a product with a 0/1 mask, an inf above the diagonal becomes
    0, not NaN; and unlike masked_fill with a boolean mask, no mask is read."""
    return x.tril_() if inplace else x.tril()


def _add_product_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out += a @ b in place, batched over the leading dims (one baddbmm: no (..., C, d) temporary
    and no separate addition pass). out (..., p, r), a (..., p, q), b (..., q, r), same leading dims."""
    lead = out.shape[:-2]
    if a.shape[:-2] != lead or b.shape[:-2] != lead or not out.is_contiguous():
        return out.add_(a @ b)
    flat = out.view(-1, *out.shape[-2:])
    flat.baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
    return out


#: _exclusive_sum: x (..., n, a, b) is scanned by torch.cumsum where x.numel() * a * b is at most this.
#: torch.cumsum along the chunk axis is strided (stride a b) and its time per entry grows with the
#: stride: with torch 2.13 on CPU it beat the loops for the vectors (..., n, m, 1) (a b <= 64) and
#: for tiny (..., 16, 16, 16) states, and was 5-15x slower than them for (..., 256, 16, 16) and
#: (..., 16, 64, 64) (N = 2^12, m = d = 16 and 64: 1.0 ms against 0.18 ms, one thread).
SMALL_SCAN = 2**22


#: _exclusive_sum: states of at most this many entries (a b) are scanned by ``_exclusive_by_products``
#: where the loops would run. Steady-state medians, 2 threads, torch 2.13 CPU, (1, 4, n, a, b) float32:
#: a b = 256 (m = d = 16) n = 256: 0.095 ms against 0.178 for the loops, n = 512: 0.17 against 0.30,
#: n = 1024: 0.37 against 0.44; a b = 1024: 0.19-0.35 against 0.19-0.25, a b = 4096 up to 2x slower.
PRODUCT_SCAN_MAX = 256
#: _exclusive_by_products: blocks of at most this many states (one strictly triangular product each).
PRODUCT_SCAN_BLOCK = 16


def _exclusive_sum(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Exclusive prefix sums along axis -3 of x (..., n, a, b): S_t = sum_{s < t} x_s (reverse:
    sum_{s > t}); a new tensor. Under grad mode (double backward), and where x.numel() a b <=
    SMALL_SCAN (a narrow stride or a tiny tensor: there torch.cumsum beats the loops' Python
    overhead), torch.cumsum and a shift; small states (a b <= PRODUCT_SCAN_MAX) in blocks by
    products (``_exclusive_by_products``); otherwise the inclusive scan of x_0..x_{n-2} written
    straight into S_1..S_{n-1} (``_scan_into``: no shifted copy, no subtraction).
    """
    if (torch.is_grad_enabled() and x.requires_grad) or x.numel() * x.shape[-1] * x.shape[-2] <= SMALL_SCAN:
        if reverse:
            return _exclusive_cumsum(x.flip(-3), dim=-3).flip(-3)
        return _exclusive_cumsum(x, dim=-3)
    n = x.shape[-3]
    if x.shape[-1] * x.shape[-2] <= PRODUCT_SCAN_MAX and n % min(PRODUCT_SCAN_BLOCK, n) == 0:
        return _exclusive_by_products(x, reverse)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if not reverse:
        out.narrow(-3, 0, 1).zero_()
        _scan_into(x.narrow(-3, 0, n - 1), out.narrow(-3, 1, n - 1))
    else:
        out.narrow(-3, n - 1, 1).zero_()
        _scan_into(x.narrow(-3, 1, n - 1), out.narrow(-3, 0, n - 1), reverse=True)
    return out


def _exclusive_by_products(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """``_exclusive_sum`` of x (..., n, a, b) for n a multiple of B = min(PRODUCT_SCAN_BLOCK, n): inside
    each block of B states one product with the strictly lower (reverse: upper) triangular B x B
    matrix of ones, then each block's total carried to the later (reverse: earlier) blocks by a
    cumulative sum over the n / B totals. Four tensor operations instead of the loops' ~3 sqrt(n)
    slice operations, for B (a b) products per state: cheaper where the states are small."""
    n, a, b = x.shape[-3:]
    block = min(PRODUCT_SCAN_BLOCK, n)
    groups = n // block
    ones = torch.ones(block, block, dtype=x.dtype, device=x.device)
    tri = ones.triu_(1) if reverse else ones.tril_(-1)
    xb = x.reshape(-1, groups, block, a * b)
    out = torch.matmul(tri, xb)  # (-1, groups, block, a b): the sums inside each block
    if groups > 1:
        edge = 0 if reverse else block - 1
        totals = out[:, :, edge] + xb[:, :, edge]  # (-1, groups, a b)
        if reverse:
            carry = totals.flip(1).cumsum(1).flip(1)
            out[:, :-1] += carry[:, 1:].unsqueeze(2)
        else:
            carry = totals.cumsum(1)
            out[:, 1:] += carry[:, :-1].unsqueeze(2)
    return out.view(x.shape)


class PackingMask(SymmetricMaskOperator):
    """M_ij = 1 if segment_ids[i] == segment_ids[j]: packed sequences never attend to each other.

    segment_ids: (N,) or (..., N) integer labels (any values; need not be contiguous); batched ids
    have one leading dim per leading dim of the inputs, 1 where shared ((B, 1, N) for inputs
    (B, H, N, c); ``check_mask_batch``). TypeError for non-integer ids, ValueError for N = 0.
    ``matmul`` (= ``rmatmul``, M symmetric) is a segment sum and a gather, x (..., N, c) ->
    (..., N, c) in O(N c); ``key_stabilizer`` takes the max per segment.

    >>> import torch
    >>> from fast import PackingMask
    >>> ids = torch.tensor([7, 7, 3, 3, 3, 9])
    >>> x = torch.arange(12.).reshape(6, 2)
    >>> torch.equal(PackingMask(ids).matmul(x), (ids[:, None] == ids[None, :]).float() @ x)
    True
    """

    #: M_ij = 1 or 0.
    nonnegative = True

    def __init__(self, segment_ids: torch.Tensor):
        if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype.is_floating_point or segment_ids.dtype == torch.bool:
            raise TypeError(f"segment_ids must be an integer tensor of shape (..., N), got {segment_ids!r:.80}")
        if segment_ids.dim() < 1 or segment_ids.shape[-1] == 0:
            raise ValueError(f"segment_ids must have shape (..., N) with N >= 1, got {tuple(segment_ids.shape)}")
        self.n = segment_ids.shape[-1]
        # relabel to 0..S-1 once so that any labels work as segment indices
        labels, inverse = torch.unique(segment_ids, return_inverse=True)
        self.segment_index = inverse.to(torch.int64)
        self.num_segments = labels.numel()

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """Segment sums broadcast back to tokens, x: (..., N, c) -> (..., N, c).

        fast.segments (no atomics): the same bits on every run on CUDA too, forward and backward."""
        lead = check_mask_batch("segment_ids", tuple(self.segment_index.shape), x, "input x")
        if self.segment_index.dim() == 1:  # one packing for every slice: sums along -2, slice by slice
            seg = self._segments(())
            return seg.expand(seg.sum(x, dim=-2), dim=-2)
        flat = x.expand(*lead, *x.shape[-2:]).reshape(-1, x.shape[-1])  # (L N, c): a view when x is full
        seg = self._segments(lead)
        return seg.expand(seg.sum(flat, dim=0), dim=0).reshape(*lead, *x.shape[-2:])

    def _segments(self, lead: tuple[int, ...]) -> Segments:
        """The segments of the product (fast.segments), planned once per leading shape: for (N,) ids,
        the N tokens in num_segments segments; for batched ids, the L N rows of x (..., N, c) flattened
        with leading shape ``lead`` (L = prod(lead)), each (slice, label) pair its own segment (a
        segment of one slice never meets the same label in another slice)."""
        cache = self.__dict__.setdefault("_segment_plans", {})  # lazily: __init__ sets n, segment_index only
        if lead not in cache:
            index = self.segment_index
            if index.dim() == 1:
                cache[lead] = Segments(index, self.num_segments)
            else:
                rows = index.expand(*lead, self.n).reshape(-1, self.n)  # (L, N)
                slot = torch.arange(rows.shape[0], device=index.device)[:, None] * self.num_segments
                keys, inverse = torch.unique((rows + slot).reshape(-1), return_inverse=True)
                cache[lead] = Segments(inverse, keys.numel())
        return cache[lead]

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-segment max of z (..., N, m) -> (..., N, 1): exact, as segments never mix."""
        check_tokens("z", z, self.n)
        lead = check_mask_batch("segment_ids", tuple(self.segment_index.shape), z, "key exponents z (from k)")
        row = z.amax(-1).expand(*lead, self.n)
        index = self.segment_index.to(z.device)
        seg = segment_max(row, index, self.num_segments, dim=-1)  # (*lead, S)
        return torch.gather(seg, -1, index.expand(*lead, self.n)).unsqueeze(-1)


class PaddingMask(MaskOperator):
    """M_ij = 1 if key j is real (``key_mask[..., j]`` True): padded keys are excluded after phi.

    key_mask: (N,) or (..., N) bool (TypeError otherwise, ValueError for N = 0); a batched key_mask
    has one leading dim per leading dim of the inputs, 1 where shared ((B, 1, N) for inputs
    (B, H, N, c); ``check_mask_batch``). ``matmul`` gives every row the sum of x over real keys,
    x (..., N, c) -> (..., N, c) in O(N c); ``attend`` zeroes padded keys' features and runs two
    GEMMs. Outputs at real queries do not depend on padded tokens; padded queries get an output too,
    which callers ignore. A sample with no real key makes the denominator vanish, which
    masked_linear_attention reports.

    >>> import torch
    >>> from fast import PaddingMask
    >>> mask = PaddingMask.from_lengths(torch.tensor([2, 3]), 3)   # two samples, 3 tokens
    >>> mask.key_mask.tolist()
    [[True, True, False], [True, True, True]]
    >>> mask.matmul(torch.ones(2, 3, 1)).flatten().tolist()
    [2.0, 2.0, 2.0, 3.0, 3.0, 3.0]
    """

    #: M_ij = 1 or 0.
    nonnegative = True

    #: Named in the DenominatorError of a query that sees no key (fast.operator).
    no_key_cause = "key_mask is False at every key of their sample, a fully padded sample"

    def __init__(self, key_mask: torch.Tensor):
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be a bool tensor of shape (..., N), got {key_mask!r:.80}")
        if key_mask.dim() < 1 or key_mask.shape[-1] == 0:
            raise ValueError(f"key_mask must have shape (..., N) with N >= 1, got {tuple(key_mask.shape)}")
        self.n = key_mask.shape[-1]
        self.key_mask = key_mask

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, n: int) -> "PaddingMask":
        """Right-padded batch: sample b has ``lengths[b]`` real tokens out of n. lengths: (B,) integers
        in [0, n] (TypeError for another dtype or shape, ValueError out of range); n a positive int.
        """
        check_positive_int("n", n)
        lengths = torch.as_tensor(lengths)
        if lengths.dim() == 1:
            check_allocation(f"n = {n}", (lengths.shape[0], n), torch.bool, lengths.device, what="the key mask (B, n)")
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool or lengths.dim() != 1:
            raise TypeError(f"lengths must be a 1-D integer tensor (B,) of real-token counts, got {lengths.dtype} "
                            f"of shape {tuple(lengths.shape)}: {lengths!r:.80}")
        if bool((lengths < 0).any()) or bool((lengths > n).any()):
            raise ValueError(f"lengths must lie in [0, n={n}], got {lengths.tolist()}")
        return cls(torch.arange(n, device=lengths.device) < lengths[:, None])

    def _weights(self, x: torch.Tensor) -> torch.Tensor:
        return self.key_mask.to(device=x.device, dtype=x.dtype).unsqueeze(-1)

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """Every row gets the sum of x over real keys, x: (..., N, c) -> (..., N, c). Rank one."""
        check_mask_batch("key_mask", tuple(self.key_mask.shape), x, "input x")
        total = (x * self._weights(x)).sum(-2, keepdim=True)
        return total.expand(broadcast_shape(tuple(total.shape[:-2]), tuple(x.shape[:-2])) + tuple(x.shape[-2:]))

    def _rmatmat(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x: row j is key_mask[j] times the sum of x over all rows, x: (..., N, c)."""
        check_mask_batch("key_mask", tuple(self.key_mask.shape), x, "input x")
        return x.sum(-2, keepdim=True) * self._weights(x)

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-key constants (..., N, 1) for z (..., N, m): the max over REAL keys for real keys,
        so padded keys never set their scale; a padded key's own row max for itself (its
        features are discarded, and this keeps them finite however large)."""
        check_tokens("z", z, self.n)
        check_mask_batch("key_mask", tuple(self.key_mask.shape), z, "key exponents z (from k)")
        row = z.amax(-1, keepdim=True)
        real = self.key_mask.to(z.device).unsqueeze(-1)
        c = row.masked_fill(~real, -torch.inf).amax(-2, keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # no real key: any constant
        return torch.where(real, c, row)

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero the padded keys' features, then unmasked linear attention (two GEMMs).

        A PADDED query whose denominator is 0 (zero-filled padding with ReLU/identity features)
        in a sample that has real keys gets output 0 rather than failing the whole call; real
        queries are never guarded. In a sample without any real key every query sees no key: its
        denominators are left 0 for the driver's ``no_key`` policy (DenominatorError by default).
        Under autograd only phi_q, phi_k, v and the (..., N, 1) key weights are saved.
        """
        for name, t in (("phi_q", phi_q), ("phi_k", phi_k), ("v", v)):
            check_tokens(name, t, self.n)
            check_mask_batch("key_mask", tuple(self.key_mask.shape), t, name)
        num, den = _PaddedProducts.apply(phi_q, phi_k, v, self._weights(phi_k))
        key_mask = self.key_mask.to(den.device)
        padded_query = ~key_mask & key_mask.any(-1, keepdim=True)  # padded, in a sample with real keys
        den = torch.where(padded_query & (den == 0), torch.ones_like(den), den)
        return num, den


class _PaddedProducts(torch.autograd.Function):
    """(num, den) = (phi_q (phi_k w)^T v, phi_q (phi_k w)^T 1) for key weights w (..., N, 1).

    Saves phi_q, phi_k, v, w; backward forms phi_k w again (O(N m) transient) rather than keeping it.
    """

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, w):
        ctx.save_for_backward(phi_q, phi_k, v, w)
        phi_k = phi_k * w
        kv = phi_k.transpose(-1, -2) @ v
        num = phi_q @ kv
        den = rows_dot(phi_q, phi_k.sum(-2))
        return num, den

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v, w = ctx.saved_tensors
        kw = phi_k * w  # (..., N, m), leading dims broadcast with w's
        kv = kw.transpose(-1, -2) @ v  # (..., m, d)
        ks = kw.sum(-2)  # (..., m)
        dq = g_num @ kv.transpose(-1, -2) + g_den.unsqueeze(-1) * ks.unsqueeze(-2)
        d_kv = phi_q.transpose(-1, -2) @ g_num
        d_ks = weighted_rows(phi_q, g_den)
        dk = (v @ d_kv.transpose(-1, -2) + d_ks.unsqueeze(-2)) * w
        dv = kw @ d_kv
        need = ctx.needs_input_grad
        return (dq.sum_to_size(phi_q.shape) if need[0] else None, dk.sum_to_size(phi_k.shape) if need[1] else None,
                dv.sum_to_size(v.shape) if need[2] else None, None)
