"""Prefix reductions along one axis that run fast on CUDA: ``running_max``, the running maximum
the causal masks' FAVOR+ key constants are made of (fast.masks.sequence) and the Triton causal
scan reads (fast.kernels.causal_scan).

torch.cummax also returns the indices of its maxima, and its CUDA scan runs over few long rows
(S = batch x heads slices of N tokens) with little parallelism along a row (2.93 ms for 8 rows of
2^20 on an H100); what the causal paths need is the values alone. On CUDA long rows are formed by
recursive doubling (Hillis and Steele):
after step k every entry holds the maximum of the 2^k entries ending at it, so ceil(log2 N)
elementwise maxima over the whole tensor give the running maximum, each a pass that fills the GPU.
Maxima are exact, so both routes return the same values, bit for bit (NaN spreads forward in
both).
"""
from __future__ import annotations

import torch

__all__ = ["DOUBLING_MIN_LENGTH", "running_max"]

#: The shortest N for which CUDA takes the doubling route. Measured on one H100 (2026-11-28, float32,
#: 8 rows, medians of triton.testing.do_bench): N = 2^14 cummax 0.051 ms, doubling 0.33 ms (its 28
#: launches); 2^17 0.37 against 0.42; 2^20 2.93 against 0.77. Between 2^17 and 2^20 the doubling wins.
DOUBLING_MIN_LENGTH = 2 ** 18


def running_max(x: torch.Tensor, dim: int = -1, *, method: str | None = None) -> torch.Tensor:
    """r_i = max_{j <= i} x_j along ``dim`` (the values of torch.cummax), same shape and dtype as x.

    method None: "doubling" on CUDA for N >= DOUBLING_MIN_LENGTH (ceil(log2 N) elementwise maxima,
    O(N log N) work, each step one pass over the tensor), "cummax" (torch.cummax, O(N)) otherwise;
    either may be asked for on any device. Not differentiable (the causal paths take detached
    constants). ValueError naming x for a non-tensor or a 0-dim tensor, naming method otherwise.

    >>> import torch
    >>> from fast.prefix import running_max
    >>> x = torch.tensor([[1., 3., 2., 5., 4.]])
    >>> running_max(x).tolist(), torch.equal(running_max(x, method="doubling"), running_max(x))
    ([[1.0, 3.0, 3.0, 5.0, 5.0]], True)
    """
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        got = "a 0-dim tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a tensor with at least one axis, got {got}")
    n = x.shape[dim]
    if method is None:
        method = "doubling" if x.is_cuda and n >= DOUBLING_MIN_LENGTH else "cummax"
    if method not in ("doubling", "cummax"):
        raise ValueError(f"method must be None, 'doubling' or 'cummax', got {method!r}")
    if method == "cummax":
        return torch.cummax(x.detach(), dim=dim).values
    r = x.detach().movedim(dim, -1).contiguous()
    step = 1
    while step < n:
        nxt = torch.empty_like(r)
        nxt[..., :step] = r[..., :step]
        torch.maximum(r[..., step:], r[..., :-step], out=nxt[..., step:])
        r, step = nxt, 2 * step
    return r.movedim(-1, dim)
