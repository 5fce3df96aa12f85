"""FFT sizing shared by the FFT-based masks (Toeplitz, block-Toeplitz, the tree Hankel products)."""
from __future__ import annotations


def fast_fft_size(n: int) -> int:
    """The smallest 5-smooth integer (2^a 3^b 5^c) >= n, n >= 1: a length pocketfft and cuFFT
    transform fast, where a prime length such as 2N - 1 is slow (docs/papers.md Sec. 1, the
    circulant embedding of a Toeplitz mask). O(log^3 n) integer steps. ValueError for n < 1.

        >>> from fast.fft import fast_fft_size
        >>> fast_fft_size(13), fast_fft_size(1999), fast_fft_size(1024)
        (15, 2000, 1024)
    """
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
