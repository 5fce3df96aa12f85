"""Sequence masks as operators: causal, packing, padding (choromanski22 Sec. 3.1).

All act on x: (..., N, c) and never build N x N. The ``attend`` of causal and padding are
autograd Functions that save only phi_q, phi_k, v (and, for padding, the (..., N, 1) key
weights) and form their O(N C) / O(N m d / C) intermediates again in backward, so training
memory is O(N (m + d)) whatever the chunk C and the widths m, d.
"""
from __future__ import annotations

import torch

from fast.masks.base import MaskOperator, SymmetricMaskOperator
from fast.validation import broadcast_shape, check_positive_int, check_tokens


class CausalMask(MaskOperator):
    """M_ij = 1 if j <= i. ``matmul`` is a prefix sum; ``attend`` is the chunked scan.

    Chunked scan with chunk C: split N into N/C chunks; inside a chunk the C x C block of
    phi_q phi_k^T is masked lower-triangular and applied densely (a GEMM); across chunks each
    chunk's queries read the running state S = sum over earlier chunks of phi_k^T v (m x d) and
    z = sum phi_k (m). The states of all chunks are formed at once by a prefix sum over the
    N/C chunk totals, so the work is O(N C (m + d) + N m d) in GEMMs rather than the memory-bound
    cumsum of N outer products (~100x slower on CPU, docs/methods.md).

    Under autograd the scan saves phi_q, phi_k, v only; backward forms the chunk blocks and
    states again (its transient memory is the forward's: O(N C + N m d / C)) and applies the
    transposed scan (a reverse prefix sum over chunks), so nothing of size N C or N m d / C is
    kept between forward and backward. Backward is itself differentiable (double backward).
    """

    def __init__(self, n: int, chunk: int = 64):
        self.n = check_positive_int("n", n)
        self.chunk = check_positive_int("chunk", chunk)
        self._tri: dict = {}

    def _triangle(self, c: int, device: torch.device) -> torch.Tensor:
        # cached: building it costs ~14 ms per call on 2 threads with torch 2.13 on CPU
        key = (c, str(device))
        if key not in self._tri:
            self._tri[key] = torch.ones(c, c, dtype=torch.bool, device=device).tril()
        return self._tri[key]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x = cumulative sum over tokens, x: (..., N, c)."""
        check_tokens("x", x, self.n)
        return torch.cumsum(x, dim=-2)

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x = suffix sums over tokens (sum over i >= j), x: (..., N, c)."""
        check_tokens("x", x, self.n)
        return torch.flip(torch.cumsum(torch.flip(x, dims=(-2,)), dim=-2), dims=(-2,))

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of causal linear attention by the chunked scan.

        phi_q, phi_k: (..., N, m); v: (..., N, d), with the same leading dims (as the driver passes them).
        """
        return _CausalScan.apply(phi_q, phi_k, v, self)

    def _chunks(self, *tensors: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
        """(chunk C, each (..., N, c) zero-padded to a multiple of C and viewed as (..., N/C, C, c))."""
        n, c = self.n, min(self.chunk, self.n)
        pad = (-n) % c
        if pad:  # zero keys add nothing; padded queries are cut off by the caller
            tensors = tuple(torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in tensors)
        return c, [t.unflatten(-2, (-1, c)) for t in tensors]

    def _scan(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.n
        c, (q, k, vv) = self._chunks(phi_q, phi_k, v)  # (..., nc, C, m), (..., nc, C, m), (..., nc, C, d)
        tri = self._triangle(c, q.device)
        # without autograd (inside the Function) the (N, C) blocks are updated in place: one at a time
        fill = torch.Tensor.masked_fill if torch.is_grad_enabled() else torch.Tensor.masked_fill_
        scores = fill(q @ k.transpose(-1, -2), ~tri, 0.0)  # intra-chunk block
        num = scores @ vv
        den = scores.sum(-1)
        del scores
        kv = k.transpose(-1, -2) @ vv  # (..., nc, m, d) chunk totals
        ksum = k.sum(-2)  # (..., nc, m)
        # exclusive prefix over chunks = the running state each chunk starts from
        state = _exclusive_cumsum(kv, dim=-3)
        zstate = _exclusive_cumsum(ksum, dim=-2)
        num = num + q @ state
        den = den + (q @ zstate.unsqueeze(-1)).squeeze(-1)
        num = num.flatten(-3, -2)[..., :n, :]
        den = den.flatten(-2)[..., :n]
        return num, den

    def _scan_backward(self, phi_q, phi_k, v, g_num, g_den):
        """Gradients of (num, den) = _scan(phi_q, phi_k, v) for upstream (g_num (..., N, d), g_den (..., N)).

        Per chunk, with A = tril(Q K^T), S = exclusive prefix of K^T V, z = exclusive prefix of K^T 1:
            dA = tril(G V^T + g 1^T),  dQ = dA K + G S^T + g z^T,
            dK = dA^T Q + V dT^T + 1 dt^T,  dV = A^T G + K dT,
        where dT, dt are the exclusive SUFFIX sums over chunks of Q^T G and Q^T g. Without double
        backward, A and dA are formed in place and one at a time (one (N, C) block alive).
        """
        n = self.n
        c, (q, k, vv, gn) = self._chunks(phi_q, phi_k, v, g_num)
        gd = self._chunks(g_den.unsqueeze(-1))[1][0]  # (..., nc, C, 1)
        tri = self._triangle(c, q.device)
        inplace = not torch.is_grad_enabled()  # True unless create_graph (double backward)
        fill = torch.Tensor.masked_fill_ if inplace else torch.Tensor.masked_fill
        scores = fill(q @ k.transpose(-1, -2), ~tri, 0.0)
        dv = scores.transpose(-1, -2) @ gn
        del scores
        d_scores = gn @ vv.transpose(-1, -2)
        d_scores = fill(d_scores.add_(gd) if inplace else d_scores + gd, ~tri, 0.0)
        dq = d_scores @ k
        dk = d_scores.transpose(-1, -2) @ q
        del d_scores
        state = _exclusive_cumsum(k.transpose(-1, -2) @ vv, dim=-3)
        zstate = _exclusive_cumsum(k.sum(-2), dim=-2)
        d_state = _exclusive_cumsum((q.transpose(-1, -2) @ gn).flip(-3), dim=-3).flip(-3)  # (..., nc, m, d)
        d_zstate = _exclusive_cumsum((q * gd).sum(-2).flip(-2), dim=-2).flip(-2)  # (..., nc, m)
        dq = dq + gn @ state.transpose(-1, -2) + gd * zstate.unsqueeze(-2)
        dk = dk + vv @ d_state.transpose(-1, -2) + d_zstate.unsqueeze(-2)
        dv = dv + k @ d_state
        return tuple(t.flatten(-3, -2)[..., :n, :] for t in (dq, dk, dv))


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


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Prefix sum that excludes the current entry (shift, not subtract: no cancellation)."""
    inc = torch.cumsum(x, dim=dim)
    zero = torch.zeros_like(inc.narrow(dim, 0, 1))
    return torch.cat([zero, inc.narrow(dim, 0, inc.shape[dim] - 1)], dim=dim)


class PackingMask(SymmetricMaskOperator):
    """M_ij = 1 if segment_ids[i] == segment_ids[j]: packed sequences never attend to each other.

    segment_ids: (..., N) integer labels (any values; need not be contiguous), broadcastable to
    the leading dims of the inputs (e.g. (B, 1, N) for inputs (B, H, N, c)). M @ x is a segment
    sum followed by a gather, O(N c).
    """

    def __init__(self, segment_ids: torch.Tensor):
        if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype.is_floating_point or segment_ids.dtype == torch.bool:
            raise TypeError(f"segment_ids must be an integer tensor of shape (..., N), got {segment_ids!r:.80}")
        if segment_ids.dim() < 1 or segment_ids.shape[-1] == 0:
            raise ValueError(f"segment_ids must have shape (..., N) with N >= 1, got {tuple(segment_ids.shape)}")
        self.n = segment_ids.shape[-1]
        # relabel to 0..S-1 once so that any labels work as scatter indices
        labels, inverse = torch.unique(segment_ids, return_inverse=True)
        self.segment_index = inverse.to(torch.int64)
        self.num_segments = labels.numel()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Segment sums broadcast back to tokens, x: (..., N, c) -> (..., N, c)."""
        check_tokens("x", x, self.n)
        lead = broadcast_shape(tuple(x.shape[:-2]), tuple(self.segment_index.shape[:-1]), "x and segment_ids leading dims")
        x = x.expand(*lead, *x.shape[-2:])
        idx = self.segment_index.to(x.device).expand(*lead, self.n).unsqueeze(-1).expand(x.shape)
        sums = torch.zeros(*lead, self.num_segments, x.shape[-1], dtype=x.dtype, device=x.device)
        sums = sums.scatter_add(-2, idx, x)
        return torch.gather(sums, -2, idx)


    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-segment max of z (..., N, m) -> (..., N, 1): exact, as segments never mix."""
        row = z.amax(-1)
        lead = broadcast_shape(tuple(row.shape[:-1]), tuple(self.segment_index.shape[:-1]), "z and segment_ids leading dims")
        row = row.expand(*lead, self.n)
        idx = self.segment_index.to(z.device).expand(*lead, self.n)
        seg = torch.full((*lead, self.num_segments), -torch.inf, dtype=z.dtype, device=z.device)
        seg = seg.scatter_reduce(-1, idx, row, reduce="amax", include_self=True)
        return torch.gather(seg, -1, idx).unsqueeze(-1)


class PaddingMask(MaskOperator):
    """M_ij = 1 if key j is real (``key_mask[..., j]`` True): padded keys are excluded after phi.

    key_mask: (..., N) bool, broadcastable to the leading dims of the inputs. Outputs at real
    queries do not depend on padded tokens; padded queries get an output too (attending to the
    real keys, or 0 if their features vanish) which callers ignore. A sample with no real key makes the denominator vanish,
    which masked_linear_attention reports.
    """

    def __init__(self, key_mask: torch.Tensor):
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be a bool tensor of shape (..., N), got {key_mask!r:.80}")
        if key_mask.dim() < 1 or key_mask.shape[-1] == 0:
            raise ValueError(f"key_mask must have shape (..., N) with N >= 1, got {tuple(key_mask.shape)}")
        self.n = key_mask.shape[-1]
        self.key_mask = key_mask

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, n: int) -> "PaddingMask":
        """Right-padded batch: sample b has ``lengths[b]`` real tokens out of n. lengths: (B,)."""
        check_positive_int("n", n)
        lengths = torch.as_tensor(lengths)
        if lengths.dtype.is_floating_point or lengths.dim() != 1:
            raise TypeError(f"lengths must be a 1-D integer tensor (B,), got {lengths!r:.80}")
        if bool((lengths < 0).any()) or bool((lengths > n).any()):
            raise ValueError(f"lengths must lie in [0, n={n}], got {lengths.tolist()}")
        return cls(torch.arange(n, device=lengths.device) < lengths[:, None])

    def _weights(self, x: torch.Tensor) -> torch.Tensor:
        return self.key_mask.to(device=x.device, dtype=x.dtype).unsqueeze(-1)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Every row gets the sum of x over real keys, x: (..., N, c) -> (..., N, c). Rank one."""
        check_tokens("x", x, self.n)
        total = (x * self._weights(x)).sum(-2, keepdim=True)
        return total.expand(broadcast_shape(tuple(total.shape[:-2]), tuple(x.shape[:-2])) + tuple(x.shape[-2:]))

    def rmatmul(self, x: torch.Tensor) -> torch.Tensor:
        """M^T @ x: row j is key_mask[j] times the sum of x over all rows, x: (..., N, c)."""
        check_tokens("x", x, self.n)
        return x.sum(-2, keepdim=True) * self._weights(x)

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-key constants (..., N, 1) for z (..., N, m): the max over REAL keys for real keys,
        so padded keys never set their scale; a padded key's own row max for itself (its
        features are discarded, and this keeps them finite however large)."""
        row = z.amax(-1, keepdim=True)
        real = self.key_mask.to(z.device).unsqueeze(-1)
        c = row.masked_fill(~real, -torch.inf).amax(-2, keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # no real key: any constant
        return torch.where(real, c, row)

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero the padded keys' features, then unmasked linear attention (two GEMMs).

        A PADDED query whose denominator is 0 (zero-filled padding with ReLU/identity features)
        gets output 0 rather than failing the whole call; real queries are never guarded.
        Under autograd only phi_q, phi_k, v and the (..., N, 1) key weights are saved.
        """
        num, den = _PaddedProducts.apply(phi_q, phi_k, v, self._weights(phi_k))
        padded_query = ~self.key_mask.to(den.device)
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
        den = (phi_q @ phi_k.sum(-2).unsqueeze(-1)).squeeze(-1)
        return num, den

    @staticmethod
    def backward(ctx, g_num, g_den):
        phi_q, phi_k, v, w = ctx.saved_tensors
        kw = phi_k * w  # (..., N, m), leading dims broadcast with w's
        kv = kw.transpose(-1, -2) @ v  # (..., m, d)
        ks = kw.sum(-2)  # (..., m)
        dq = g_num @ kv.transpose(-1, -2) + g_den.unsqueeze(-1) * ks.unsqueeze(-2)
        d_kv = phi_q.transpose(-1, -2) @ g_num
        d_ks = (phi_q * g_den.unsqueeze(-1)).sum(-2)
        dk = (v @ d_kv.transpose(-1, -2) + d_ks.unsqueeze(-2)) * w
        dv = kw @ d_kv
        need = ctx.needs_input_grad
        return (dq.sum_to_size(phi_q.shape) if need[0] else None, dk.sum_to_size(phi_k.shape) if need[1] else None,
                dv.sum_to_size(v.shape) if need[2] else None, None)
