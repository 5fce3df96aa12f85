"""FFT sizing shared by the FFT-based masks (Toeplitz, block-Toeplitz, the tree Hankel products)."""
from __future__ import annotations


def fast_fft_size(n: int) -> int:
    """The smallest 5-smooth integer (2^a 3^b 5^c) >= n, n >= 1: a size pocketfft and cuFFT
    transform fast. Prime lengths such as 2N - 1 can be ~3x slower (docs/methods.md)."""
    if n < 1:  # NumPy-only module (the tree planner imports it without torch): no fast.validation here
        raise ValueError(f"n must be >= 1, got {n}")
    best = 1 << (n - 1).bit_length()  # a power of two always qualifies
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best
