"""Sequence masks as operators: causal, packing, padding (choromanski22 Sec. 3.1).

All act on x: (..., N, c) and never build N x N.
"""
from __future__ import annotations

import torch

from fast.validation import broadcast_shape, check_positive_int, check_tokens


class CausalMask:
    """M_ij = 1 if j <= i. ``matmul`` is a prefix sum; ``attend`` is the chunked scan.

    Chunked scan with chunk C: split N into N/C chunks; inside a chunk the C x C block of
    phi_q phi_k^T is masked lower-triangular and applied densely (a GEMM); across chunks each
    chunk's queries read the running state S = sum over earlier chunks of phi_k^T v (m x d) and
    z = sum phi_k (m). The states of all chunks are formed at once by a prefix sum over the
    N/C chunk totals, so the work is O(N C (m + d) + N m d) in GEMMs rather than the memory-bound
    cumsum of N outer products (~100x slower on CPU, docs/methods.md).
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

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of causal linear attention by the chunked scan."""
        n, c = self.n, min(self.chunk, self.n)
        pad = (-n) % c
        if pad:  # zero keys add nothing; padded queries are cut off below
            phi_q, phi_k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
        q = phi_q.unflatten(-2, (-1, c))  # (..., nc, C, m)
        k = phi_k.unflatten(-2, (-1, c))
        vv = v.unflatten(-2, (-1, c))  # (..., nc, C, d)
        tri = self._triangle(c, q.device)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~tri, 0.0)  # intra-chunk block
        num = scores @ vv
        den = scores.sum(-1)
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


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Prefix sum that excludes the current entry (shift, not subtract: no cancellation)."""
    inc = torch.cumsum(x, dim=dim)
    zero = torch.zeros_like(inc.narrow(dim, 0, 1))
    return torch.cat([zero, inc.narrow(dim, 0, inc.shape[dim] - 1)], dim=dim)


class PackingMask:
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


class PaddingMask:
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
        """
        phi_k = phi_k * self._weights(phi_k)
        kv = phi_k.transpose(-1, -2) @ v
        num = phi_q @ kv
        den = (phi_q @ phi_k.sum(-2).unsqueeze(-1)).squeeze(-1)
        padded_query = ~self.key_mask.to(den.device)
        den = torch.where(padded_query & (den == 0), torch.ones_like(den), den)
        return num, den
