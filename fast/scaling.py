"""Exact power-of-two rescaling of values, against sums that overflow where the result does not.

Attention is linear in v: out(v) = 2^s out(v 2^-s) for any integer s per column of v. A product
by a power of two is exact in floating point (the result in the normal range), and every sum,
product and quotient of the rescaled numbers is the rescaled result rounded alike, so a driver
whose numerator overflowed (the sums reach |v| times a row's denominator, N times |v| for
weights that sum to N) can redo it on v 2^-s and multiply back: the intermediates then stay
below the dtype's largest number, and the result overflows only where the true one does.
``value_shift`` picks s per (leading slice, column), ``times_pow2`` applies 2^s as two normal
factors (no subnormal power of two, so flush-to-zero modes cannot turn it into 0). Entries of v
below 2^(s + emin) (emin the dtype's smallest normal exponent: -126 in float32) become subnormal
on the way and round there: an absolute error of at most 2^(s + emin - p) per entry (p the
mantissa bits), far below the rescaled sum's own round-off. ``within_values`` clamps an output
that is a convex combination of v's rows into v's range, so that round-off at the maximum itself
cannot overflow when 2^s multiplies it back. The drivers use these only on the rare path, after a
flag read in their one host read says a numerator is not finite.
"""
from __future__ import annotations

import math

import torch

__all__ = ["max_exponent", "pow2", "times_pow2", "value_shift", "within_values"]


def max_exponent(dtype: torch.dtype) -> int:
    """E with finfo(dtype).max < 2^E (128 for float32, 1024 for float64). O(1).

    >>> import torch
    >>> from fast.scaling import max_exponent
    >>> max_exponent(torch.float32), max_exponent(torch.float64)
    (128, 1024)
    """
    return math.frexp(torch.finfo(dtype).max)[1]


def pow2(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2.0 ** e exactly, in ``dtype`` (float32 or float64), for an integer tensor e within the
    normal exponent range (|e| < max_exponent - 1), built from its exponent bits (exp2 and pow are
    not promised exact on every device). Same shape and device as e; O(numel). ValueError for
    another dtype.

    >>> import torch
    >>> from fast.scaling import pow2
    >>> pow2(torch.tensor([-126, 0, 3, 127]), torch.float32).tolist() == [2.0 ** -126, 1.0, 8.0, 2.0 ** 127]
    True
    """
    if dtype == torch.float32:
        return ((e.to(torch.int32) + 127) << 23).view(torch.float32)
    if dtype == torch.float64:
        return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)
    raise ValueError(f"pow2 builds float32 or float64 powers of two (fast/ computes in those), got {dtype}")


def times_pow2(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x * 2^e for an integer tensor e broadcastable to x (|e| <= 2 (max_exponent - 2)), by two
    products with normal powers of two 2^(e // 2) and 2^(e - e // 2): exact wherever the result is
    a normal number (and both factors stay normal, unlike 2^-128 in float32). Differentiable in x
    (the factors are constants). O(numel), two passes.

    >>> import torch
    >>> from fast.scaling import times_pow2
    >>> x = torch.tensor([3e38, 1.5])
    >>> y = times_pow2(x, torch.tensor([-128, 2]))
    >>> y.tolist() == [x[0].item() * 2.0 ** -128, 6.0], bool(torch.equal(times_pow2(y, torch.tensor([128, -2])), x))
    (True, True)
    """
    a = torch.div(e, 2, rounding_mode="floor")
    return x * pow2(a, x.dtype) * pow2(e - a, x.dtype)


def value_shift(v: torch.Tensor, bound: float | torch.Tensor | None = None) -> torch.Tensor:
    """The shift s >= 0 (int, (..., 1, d)) per leading slice and column of values v (..., N, d):
    the least s with max_j |v_jc| 2^-s bound <= finfo.max / 4, where ``bound`` (a number or a
    tensor, read as its largest |entry|) bounds the factor the sums multiply |v| by (a row's
    denominator for nonnegative weights: num_i <= den_i max |v|); None: s puts every column's
    largest |entry| in [0.5, 1) (its own bound 1, for sums whose growth is unknown). Clipped to
    2 (max_exponent - 2), times_pow2's range. No host read; O(N d).

    >>> import torch
    >>> from fast.scaling import value_shift
    >>> v = torch.tensor([[3e38, 1.0], [1.0, 2.0]])
    >>> value_shift(v, 12.0).tolist(), value_shift(v).tolist()     # 3e38 * 12 / 2^6 < max / 4; 2 -> [0.5, 1)
    ([[6, 0]], [[128, 2]])
    """
    emax = max_exponent(v.dtype)
    with torch.no_grad():
        if v.numel() == 0:
            return torch.zeros((*v.shape[:-2], 1, v.shape[-1]), dtype=torch.int64, device=v.device)
        top = v.detach().abs().amax(dim=-2, keepdim=True)
        s = torch.frexp(top).exponent.to(torch.int64)  # top < 2^s
        if bound is not None:
            b = bound.detach().abs().amax().to(v.dtype) if isinstance(bound, torch.Tensor) else float(abs(bound))
            e_b = torch.frexp(torch.as_tensor(b, dtype=v.dtype, device=v.device)).exponent.to(torch.int64)
            s = s + e_b - (emax - 2)  # |v| 2^-s bound < 2^(emax - 2) = 2^emax / 4
        return s.clamp_(0, 2 * (emax - 2))


def within_values(out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """out (..., N_q, d) clamped per column into [min(0, min_j v_jc), max(0, max_j v_jc)], v (..., N, d)
    (leading dims broadcasting). For outputs that are convex combinations of v's rows (nonnegative
    weights; 0 for a row that sees no key), where only round-off can leave that range: at values
    within a few units in the last place of the dtype's maximum, the average of a constant column
    would otherwise round past it and overflow when multiplied back. O(N d), the rare path only.

    >>> import torch
    >>> from fast.scaling import within_values
    >>> within_values(torch.tensor([[1.0000001, -0.5]]), torch.tensor([[1.0, 2.0], [0.5, 3.0]])).tolist()
    [[1.0, 0.0]]
    """
    with torch.no_grad():
        lo, hi = v.detach().amin(-2, keepdim=True), v.detach().amax(-2, keepdim=True)
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    return torch.clamp(out, min=lo, max=hi)
