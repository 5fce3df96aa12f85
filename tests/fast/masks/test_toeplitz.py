"""fast/masks/toeplitz.py: the FFT operators equal the dense reference masks, exactly up to round-off.

The dense side is reference/masks/toeplitz.py (itself tested against coordinate loops). FFT
convolution has a normwise error bound |fl(M x) - M x|_inf <= C u log2(n_fft) |table|_2 |x_col|_2
(Higham Sec. 24.1), so comparisons scale by those norms: float64 to 1e-12, float32 to 1e-5
(u = 1.1e-16 / 6e-8 times log2(n_fft) <= ~12 times a small constant, with a wide margin).
"""
from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fast
from fast import BlockToeplitzMask, DenominatorError, ToeplitzMask, masked_linear_attention
from fast.masks.toeplitz import fast_fft_size
from reference.attention import masked_kernel_attention
from reference.masks.toeplitz import block_toeplitz_mask, l1_table, toeplitz_mask
from tests.helpers import F64_RTOL, GenericMask, assert_unchanged, gen, np_, positive, randn, rel_frobenius

seeds = st.integers(0, 2**31 - 1)
batches = st.sampled_from([(), (2,), (2, 3)])
dtypes = st.sampled_from([torch.float64, torch.float32])
grid_shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)
FFT_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _table(shape, g, dtype=torch.float64):
    return randn(tuple(2 * s - 1 for s in shape), g, dtype=dtype)


def _dense(shape, table, cls_token=False):
    return torch.as_tensor(block_toeplitz_mask(shape, np_(table), cls_token=cls_token))


def assert_fft_close(got: torch.Tensor, dense: torch.Tensor, table: torch.Tensor, x: torch.Tensor) -> None:
    """got == dense @ x (computed in float64 from the same rounded inputs) within the FFT bound."""
    assert got.shape == x.shape and got.dtype == x.dtype
    expected = dense @ x.double()
    scale = float(table.double().norm()) * float(x.double().norm(dim=-2).max()) + 1e-300
    err = float((got.double() - expected).abs().max()) if got.numel() else 0.0
    assert err <= FFT_RTOL[x.dtype] * scale, (err, scale)


# ------------------------------------------------------------------------------ fast_fft_size


def _five_smooth_upto(limit):
    out = sorted(2**a * 3**b * 5**c for a in range(14) for b in range(9) for c in range(7)
                 if 2**a * 3**b * 5**c <= limit)
    return out


def test_fast_fft_size_is_the_smallest_5_smooth_at_least_n():
    smooth = _five_smooth_upto(10_000)
    for n in range(1, 3001):
        assert fast_fft_size(n) == smooth[bisect.bisect_left(smooth, n)], n


def _is_prime(p):
    return p > 1 and all(p % q for q in range(2, math.isqrt(p) + 1))


def test_fast_fft_size_never_picks_a_prime_2n_minus_1():
    assert fast_fft_size(2 * 7 - 1) == 15  # N = 7: 13 is prime -> 15
    primes = [n for n in range(4, 1500) if _is_prime(2 * n - 1)]
    assert len(primes) > 100
    for n in primes:
        assert fast_fft_size(2 * n - 1) != 2 * n - 1
    assert ToeplitzMask(torch.ones(13)).n_fft == (15,)
    assert BlockToeplitzMask((7, 2), torch.ones(13, 3)).n_fft == (15, 3)


@pytest.mark.parametrize("n", [0, -3])
def test_fast_fft_size_rejects_non_positive(n):
    with pytest.raises(ValueError, match="n must be >= 1"):
        fast_fft_size(n)


# ------------------------------------------------------------------------------- matmul, 1-D


@given(n=st.integers(1, 40), c=st.integers(1, 3), batch=batches, dtype=dtypes, seed=seeds)
@example(n=1, c=1, batch=(), dtype=torch.float64, seed=0)
@example(n=2, c=2, batch=(), dtype=torch.float64, seed=1)
@example(n=7, c=2, batch=(2,), dtype=torch.float64, seed=2)    # 2N - 1 = 13, prime
@example(n=8, c=3, batch=(), dtype=torch.float32, seed=3)      # even N
@example(n=37, c=1, batch=(2, 3), dtype=torch.float64, seed=4)  # prime N, 2N - 1 = 73 prime
def test_toeplitz_matmul_equals_dense(n, c, batch, dtype, seed):
    g = gen(seed)
    coeffs = randn((2 * n - 1,), g, dtype=dtype)  # asymmetric, signed
    x = randn((*batch, n, c), g, dtype=dtype)
    mask = ToeplitzMask(coeffs)
    assert mask.n == n and mask.coeffs is coeffs
    dense = torch.as_tensor(toeplitz_mask(np_(coeffs)))
    assert_fft_close(mask.matmul(x), dense, coeffs, x)


# ------------------------------------------------------------------------------- matmul, d-D


@given(shape=grid_shapes, c=st.integers(1, 3), batch=batches, dtype=dtypes, seed=seeds, cls_token=st.booleans())
@example(shape=(1, 1), c=1, batch=(), dtype=torch.float64, seed=0, cls_token=False)
@example(shape=(3, 5), c=2, batch=(2, 3), dtype=torch.float64, seed=1, cls_token=False)
@example(shape=(5, 3), c=2, batch=(), dtype=torch.float64, seed=2, cls_token=True)
@example(shape=(2, 3, 4), c=2, batch=(2,), dtype=torch.float64, seed=3, cls_token=False)
@example(shape=(4, 1, 3), c=3, batch=(), dtype=torch.float32, seed=4, cls_token=True)
@example(shape=(1,), c=1, batch=(), dtype=torch.float64, seed=5, cls_token=True)  # CLS + one node
def test_block_toeplitz_matmul_equals_dense(shape, c, batch, dtype, seed, cls_token):
    g = gen(seed)
    table = _table(shape, g, dtype)
    mask = BlockToeplitzMask(shape, table, cls_token=cls_token)
    n = math.prod(shape) + int(cls_token)
    assert mask.n == n and mask.grid_shape == shape and mask.cls_token == cls_token
    x = randn((*batch, n, c), g, dtype=dtype)
    assert_fft_close(mask.matmul(x), _dense(shape, table, cls_token), table, x)


def test_block_toeplitz_batched_heads_are_independent():
    """x (B, H, N, c): each (b, h) slice is transformed on its own (no mixing across leading dims)."""
    g = gen(11)
    shape = (3, 4)
    mask = BlockToeplitzMask(shape, _table(shape, g), cls_token=True)
    x = randn((2, 3, 13, 2), g)
    out = mask.matmul(x)
    for b in range(2):
        for h in range(3):
            assert_unchanged(out[b, h], mask.matmul(x[b, h]), rtol=1e-13)


@pytest.mark.parametrize("shape, cls_token", [((9,), False), ((3, 4), True), ((2, 3, 2), False)])
def test_chunked_transforms_equal_one_batch(shape, cls_token, monkeypatch):
    g = gen(3)
    table = _table(shape, g)
    x = randn((2, math.prod(shape) + int(cls_token), 5), g)
    whole = BlockToeplitzMask(shape, table, cls_token=cls_token).matmul(x)
    calls = []
    real = torch.fft.rfftn
    monkeypatch.setattr(torch.fft, "rfftn", lambda *a, **k: calls.append(1) or real(*a, **k))
    tiny = BlockToeplitzMask(shape, table, cls_token=cls_token, max_chunk_bytes=1)
    chunked = tiny.matmul(x)
    assert len(calls) == 1 + 2 * 5  # the spectrum, then one transform per column: chunking ran
    assert_unchanged(chunked, whole, rtol=F64_RTOL)


def test_chunked_attend_equals_one_batch():
    g = gen(4)
    shape = (4, 5)
    log_table = randn((7, 9), g, scale=0.5)
    pq, pk, v = positive((2, 20, 6), g), positive((2, 20, 6), g), randn((2, 20, 3), g)
    whole = masked_linear_attention(pq, pk, v, BlockToeplitzMask.from_log_table(shape, log_table))
    tiny = masked_linear_attention(pq, pk, v, BlockToeplitzMask.from_log_table(shape, log_table, max_chunk_bytes=1))
    assert_unchanged(tiny, whole, rtol=F64_RTOL)


# --------------------------------------------------------------------------- constructors


@given(n=st.integers(1, 30), seed=seeds)
@example(n=1, seed=0)
@example(n=7, seed=1)
def test_from_function_causal_is_zero_above_the_diagonal(n, seed):
    mask = ToeplitzMask.from_function(lambda d: torch.exp(-d.double() / 3.0), n, causal=True, dtype=torch.float64)
    coeffs = mask.coeffs
    assert torch.equal(coeffs[: n - 1], torch.zeros(n - 1, dtype=torch.float64))  # offsets < 0: exactly 0
    expected = np.tril(np.exp(-np.abs(np.subtract.outer(np.arange(n), np.arange(n))) / 3.0))
    np.testing.assert_array_equal(toeplitz_mask(np_(coeffs)), expected)
    dense = mask.matmul(torch.eye(n, dtype=torch.float64))
    assert_unchanged(dense, torch.as_tensor(expected), rtol=1e-13)
    # causal attention: outputs ignore future tokens (up to FFT round-off, inputs of equal scale)
    g = gen(seed)
    t = int(torch.randint(0, n, (), generator=g))
    pq, pk, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)
    out = masked_linear_attention(pq, pk, v, mask)
    pq2, pk2, v2 = pq.clone(), pk.clone(), v.clone()
    pq2[t + 1:], pk2[t + 1:], v2[t + 1:] = positive((n - t - 1, 3), g), positive((n - t - 1, 3), g), randn((n - t - 1, 2), g)
    out2 = masked_linear_attention(pq2, pk2, v2, mask)
    assert_unchanged(out2[: t + 1], out[: t + 1], rtol=1e-12)


def test_from_function_symmetric_and_scalar_results():
    mask = ToeplitzMask.from_function(lambda d: 1.0 / (1.0 + d.double()), 4, dtype=torch.float64)
    assert mask.coeffs.dtype == torch.float64
    np.testing.assert_array_equal(np_(mask.coeffs), 1.0 / (1.0 + np.abs(np.arange(-3, 4))))
    const = ToeplitzMask.from_function(lambda d: 2.0, 3)  # a Python scalar broadcasts
    assert const.coeffs.dtype == torch.float32 and torch.equal(const.coeffs, torch.full((5,), 2.0))
    x = randn((3, 2), gen(0), dtype=torch.float32)
    assert_fft_close(const.matmul(x), torch.full((3, 3), 2.0, dtype=torch.float64), const.coeffs, x)


def test_from_log_coefficients_with_minus_inf():
    b = torch.tensor([-math.inf, 0.5, -1.0, 0.0, -math.inf, 2.0, -math.inf], dtype=torch.float64)
    mask = ToeplitzMask.from_log_coefficients(b)
    assert mask.nonnegative and mask.n == 4
    assert torch.equal(mask.coeffs == 0, torch.isinf(b))
    x = randn((2, 4, 3), gen(1))
    assert_fft_close(mask.matmul(x), torch.as_tensor(toeplitz_mask(np.exp(np_(b)))), mask.coeffs, x)


def test_from_log_table_and_from_distance():
    g = gen(2)
    shape = (3, 4)
    b = randn((5, 7), g)
    b[0, 0] = -math.inf
    mask = BlockToeplitzMask.from_log_table(shape, b, cls_token=True, n=13)
    assert mask.nonnegative and mask.table[0, 0] == 0
    x = randn((13, 2), g)
    assert_fft_close(mask.matmul(x), _dense(shape, torch.exp(b), cls_token=True), mask.table, x)

    dist = BlockToeplitzMask.from_distance(shape, lambda r: torch.exp(-r.double() / 2), dtype=torch.float64)
    np.testing.assert_allclose(np_(dist.table), l1_table(lambda r: np.exp(-r / 2), shape), rtol=1e-15)
    assert BlockToeplitzMask.from_distance((2, 2), lambda r: r).table.dtype == torch.float32


def test_nonnegative_flag():
    assert ToeplitzMask(torch.tensor([0.0, 1.0, 2.0])).nonnegative
    assert not ToeplitzMask(torch.tensor([0.0, 1.0, -1e-30])).nonnegative


# -------------------------------------------------------------------------- spectrum cache


def test_spectrum_is_cached_per_device_and_dtype():
    """Computed once per (device, dtype): later calls return one cached tensor (the first call's
    result shares its storage: the cache holds its detached view)."""
    mask = ToeplitzMask(torch.rand(9, generator=gen(0), dtype=torch.float64))
    first = mask.spectrum(torch.device("cpu"), torch.float64)
    s64 = mask.spectrum(torch.device("cpu"), torch.float64)
    assert mask.spectrum("cpu", torch.float64) is s64 and s64.data_ptr() == first.data_ptr()
    mask.matmul(torch.ones(5, 1, dtype=torch.float64))
    assert mask.spectrum(torch.device("cpu"), torch.float64) is s64  # matmul used the cache too
    s32 = mask.spectrum(torch.device("cpu"), torch.float32)
    assert s32.dtype == torch.complex64 and s64.dtype == torch.complex128
    assert mask.spectrum(torch.device("cpu"), torch.float32) is mask.spectrum(torch.device("cpu"), torch.float32)
    assert {key[:2] for key in mask._spectra} == {("cpu", torch.float64), ("cpu", torch.float32)}
    assert s64.shape == (mask.n_fft[0] // 2 + 1,)


def test_spectrum_of_a_learnable_table_is_recomputed_and_carries_grad():
    table = torch.rand(3, 5, generator=gen(1), dtype=torch.float64, requires_grad=True)
    mask = BlockToeplitzMask((2, 3), table)
    s1 = mask.spectrum(torch.device("cpu"), torch.float64)
    s2 = mask.spectrum(torch.device("cpu"), torch.float64)
    assert s1 is not s2 and s1.requires_grad
    assert mask._spectra == {}


@pytest.mark.parametrize("which", ["from_function", "from_distance"])
def test_float64_constructors_evaluate_f_in_float64(which):
    f = lambda d: torch.exp(-d / 3.0)  # noqa: E731  the natural way to write a decay
    if which == "from_function":
        got = ToeplitzMask.from_function(f, 6, dtype=torch.float64).coeffs
        expected = np.exp(-np.abs(np.arange(-5, 6)) / 3.0)
    else:
        got = BlockToeplitzMask.from_distance((3, 4), f, dtype=torch.float64).table
        expected = l1_table(lambda r: np.exp(-r / 3.0), (3, 4))
    np.testing.assert_allclose(np_(got), expected, rtol=1e-15)


def test_learnable_table_evaluated_under_no_grad_sees_in_place_updates():
    table = torch.ones(5, dtype=torch.float64, requires_grad=True)
    mask = ToeplitzMask(table)
    x = torch.eye(3, dtype=torch.float64)
    with torch.no_grad():
        before = mask.matmul(x)  # evaluation
        table.mul_(2.0)          # optimizer step
        after = mask.matmul(x)   # next evaluation
    assert_unchanged(after, 2.0 * before, rtol=1e-13)


# ------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("shape, cls_token", [((4,), False), ((2, 3), True)])
def test_gradcheck_learnable_table(shape, cls_token):
    g = gen(5)
    table = _table(shape, g).requires_grad_()
    x = randn((math.prod(shape) + int(cls_token), 2), g).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, x: BlockToeplitzMask(shape, t, cls_token=cls_token).matmul(x), (table, x))


def test_gradcheck_learnable_log_coefficients_through_attention():
    g = gen(6)
    n = 5
    b = randn((2 * n - 1,), g, scale=0.5).requires_grad_()
    pq, pk, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)
    assert torch.autograd.gradcheck(lambda b: masked_linear_attention(pq, pk, v, ToeplitzMask.from_log_coefficients(b)), (b,))


# ------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_input_returns_half(half):
    g = gen(7)
    shape = (3, 4)
    mask = BlockToeplitzMask(shape, torch.rand(5, 7, generator=g) + 0.5, cls_token=True)
    x = torch.rand(2, 13, 3, generator=g).to(half)
    out = mask.matmul(x)
    assert out.dtype == half and out.shape == x.shape
    expected = mask.matmul(x.float())
    assert rel_frobenius(out, expected) <= 2 * torch.finfo(half).eps  # one rounding to half at the end


# ---------------------------------------------------------------------- attention vs dense


@given(shape=grid_shapes, cls_token=st.booleans(), batch=batches, m=st.integers(1, 4), d=st.integers(1, 3),
       seed=seeds, generic=st.booleans())
@settings(max_examples=50)
@example(shape=(7,), cls_token=False, batch=(), m=2, d=2, seed=0, generic=False)
@example(shape=(3, 5), cls_token=True, batch=(2, 2), m=3, d=2, seed=1, generic=False)
@example(shape=(1,), cls_token=False, batch=(), m=1, d=1, seed=2, generic=True)
def test_attention_equals_dense_masked_kernel_attention(shape, cls_token, batch, m, d, seed, generic):
    g = gen(seed)
    log_table = randn(tuple(2 * s - 1 for s in shape), g)  # asymmetric positive mask exp(b)
    mask = BlockToeplitzMask.from_log_table(shape, log_table, cls_token=cls_token)
    n = mask.n
    pq, pk, v = positive((*batch, n, m), g), positive((*batch, n, m), g), randn((*batch, n, d), g)
    out = masked_linear_attention(pq, pk, v, GenericMask(mask) if generic else mask)
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), block_toeplitz_mask(shape, np.exp(np_(log_table)), cls_token))
    assert rel_frobenius(out, expected) <= 1e-12


def test_attention_float32_and_favor_features():
    g = gen(8)
    n = 33
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    q, k, v = randn((2, n, 4), g, scale=0.5), randn((2, n, 4), g, scale=0.5), randn((2, n, 3), g)
    fmap = fast.FavorPlus(w)
    pq, pk = fmap(q, is_query=True), fmap(k)
    b = -torch.arange(-(n - 1), n, dtype=torch.float64).abs() / 5.0
    dense = toeplitz_mask(np.exp(np_(b)))
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), dense)
    out64 = masked_linear_attention(pq, pk, v, ToeplitzMask.from_log_coefficients(b))
    assert rel_frobenius(out64, expected) <= 1e-12
    out32 = masked_linear_attention(pq.float(), pk.float(), v.float(), ToeplitzMask.from_log_coefficients(b.float()))
    assert out32.dtype == torch.float32
    assert rel_frobenius(out32, expected) <= 1e-5


# ----------------------------------------------------------------------- denominator guard


def test_exactly_zero_denominator_raises():
    """coeffs (xi(-1), xi(0), xi(1)) = (-1, 1, 1), phi = 1: den_0 = xi(0) + xi(-1) = 0 exactly."""
    mask = ToeplitzMask(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    assert not mask.nonnegative
    ones = torch.ones(2, 1, dtype=torch.float64)
    with pytest.raises(DenominatorError, match="not positive"):
        masked_linear_attention(ones, ones, randn((2, 3), gen(0)), mask)


@pytest.mark.parametrize("n", [3, 5, 16, 37])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nearly_zero_denominator_raises_never_nan(n, dtype):
    g = gen(n)
    coeffs = torch.rand(2 * n - 1, generator=g, dtype=torch.float64) + 0.5
    coeffs[0] = -coeffs[1:n].sum()  # row 0 sums xi(0), xi(-1), ..., xi(-(N-1)) = coeffs[N-1], ..., coeffs[0]
    mask = ToeplitzMask(coeffs.to(dtype), cls_token=False)
    ones = torch.ones(2, n, 1, dtype=dtype)
    with pytest.raises(DenominatorError):
        masked_linear_attention(ones, ones, randn((2, n, 2), g, dtype=dtype), mask)


def test_small_but_resolved_denominator_does_not_raise():
    """den_0 = 1e-3, far above the round-off floor (~1e-15): a negative table alone is not refused."""
    c = torch.tensor([-1.0 + 1e-3, 1.0, 1.0], dtype=torch.float64)
    ones = torch.ones(2, 1, dtype=torch.float64)
    v = randn((2, 2), gen(1))
    out = masked_linear_attention(ones, ones, v, ToeplitzMask(c))
    expected = masked_kernel_attention(np_(ones), np_(ones), np_(v), toeplitz_mask(np_(c)))
    assert rel_frobenius(out, expected) <= 1e-10


@given(shape=grid_shapes, seed=seeds, scale=st.sampled_from([1.0, 1e-3, 1e3]), dtype=dtypes)
@settings(max_examples=40)
def test_positive_mask_never_raises(shape, seed, scale, dtype):
    g = gen(seed)
    mask = BlockToeplitzMask.from_log_table(shape, randn(tuple(2 * s - 1 for s in shape), g, dtype=dtype, scale=3.0))
    n = mask.n
    out = masked_linear_attention(positive((n, 3), g, dtype, scale), positive((n, 3), g, dtype, scale),
                                  randn((n, 2), g, dtype), mask)
    assert bool(torch.isfinite(out).all())


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("make, exc, match", [
    (lambda: BlockToeplitzMask((2, 3), torch.ones(3, 5), n=7), ValueError, r"n=7"),
    (lambda: BlockToeplitzMask((2, 3), torch.ones(3, 5), cls_token=True, n=6), ValueError, r"n=6"),
    (lambda: BlockToeplitzMask((), torch.ones(())), ValueError, "shape"),
    (lambda: BlockToeplitzMask((0, 2), torch.ones(1, 3)), ValueError, "shape"),
    (lambda: BlockToeplitzMask((2, 2.5), torch.ones(3, 4)), TypeError, "shape"),
    (lambda: BlockToeplitzMask(4, torch.ones(7)), TypeError, "shape"),
    (lambda: BlockToeplitzMask((2, 2), torch.ones(3, 4)), ValueError, "table must have shape"),
    (lambda: BlockToeplitzMask((2, 2), torch.ones(9)), ValueError, "table must have shape"),
    (lambda: BlockToeplitzMask((2,), torch.tensor([1.0, math.nan, 1.0])), ValueError, "table"),
    (lambda: BlockToeplitzMask((2,), torch.tensor([1.0, math.inf, 1.0])), ValueError, "table"),
    (lambda: BlockToeplitzMask((2,), torch.tensor([1, 1, 1])), TypeError, "table"),
    (lambda: BlockToeplitzMask((2,), [1.0, 1.0, 1.0]), TypeError, "table"),
    (lambda: BlockToeplitzMask((2,), torch.ones(3), max_chunk_bytes=0), ValueError, "max_chunk_bytes"),
    (lambda: BlockToeplitzMask((2,), torch.ones(3), max_chunk_bytes=1.5), ValueError, "max_chunk_bytes"),
    (lambda: BlockToeplitzMask.from_log_table((2,), torch.tensor([0.0, math.nan, 0.0])), ValueError, "log_table"),
    (lambda: BlockToeplitzMask.from_log_table((2,), torch.tensor([0.0, math.inf, 0.0])), ValueError, "log_table"),
    (lambda: BlockToeplitzMask.from_log_table((2,), torch.tensor([0.0, 800.0, 0.0], dtype=torch.float64)),
     ValueError, "overflows"),
    (lambda: BlockToeplitzMask.from_log_table((2,), torch.tensor([0.0, 100.0, 0.0])), ValueError, "overflows"),  # float32
    (lambda: ToeplitzMask(torch.ones(4)), ValueError, "coeffs"),
    (lambda: ToeplitzMask(torch.ones(3, 3)), ValueError, "coeffs"),
    (lambda: ToeplitzMask(torch.ones(0)), ValueError, "coeffs"),
    (lambda: ToeplitzMask([1.0, 1.0, 1.0]), ValueError, "coeffs"),
    (lambda: ToeplitzMask(torch.ones(5), n=4), ValueError, r"n=4"),
    (lambda: ToeplitzMask.from_log_coefficients(torch.tensor([0.0, math.nan, 0.0])), ValueError, "log_coeffs"),
    (lambda: ToeplitzMask.from_log_coefficients(torch.tensor([0.0, math.inf, 0.0])), ValueError, "log_coeffs"),
    (lambda: ToeplitzMask.from_log_coefficients(torch.tensor([0.0, 1e3, 0.0], dtype=torch.float64)),
     ValueError, "exp\\(log_coeffs\\) overflows"),
    (lambda: ToeplitzMask.from_log_coefficients(torch.tensor([0, 1, 0])), TypeError, "log_coeffs"),
    (lambda: ToeplitzMask.from_function(lambda d: d * 1.0, 0), ValueError, "n must be a positive integer"),
    (lambda: ToeplitzMask.from_function(lambda d: d * 1.0, True), ValueError, "n must be a positive integer"),
    (lambda: ToeplitzMask.from_function(lambda d: d * 1.0, 2.5), ValueError, "n must be a positive integer"),
    (lambda: ToeplitzMask.from_function(lambda d: 1.0 / d, 3), ValueError, "coeffs"),  # inf at distance 0
])
def test_bad_input_is_refused_naming_the_argument(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize("coeffs", [torch.tensor([1.0, math.nan, 1.0]), torch.tensor([1, 1, 1])])
def test_toeplitz_coefficient_errors_name_coeffs(coeffs):
    with pytest.raises((ValueError, TypeError), match="coeffs"):
        ToeplitzMask(coeffs)


@pytest.mark.parametrize("x, exc, match", [
    (torch.ones(5, 2), ValueError, "x must have N=6"),
    (torch.ones(2, 7, 2), ValueError, "x must have N=6"),
    (torch.ones(6), ValueError, "x"),
    (torch.ones(6, 2, dtype=torch.int64), TypeError, "x"),
    (np.ones((6, 2)), TypeError, "x"),
])
def test_matmul_rejects_wrong_x(x, exc, match):
    with pytest.raises(exc, match=match):
        BlockToeplitzMask((2, 3), torch.ones(3, 5)).matmul(x)


def test_attention_rejects_mask_of_another_size():
    mask = ToeplitzMask(torch.ones(9))
    ones = torch.ones(4, 2)
    with pytest.raises(ValueError, match="mask is for N=5"):
        masked_linear_attention(ones, ones, ones, mask)


def test_mask_built_in_inference_mode_works_in_and_out_of_it():
    """Inference tensors have no version counter; the spectrum cache must not need one."""
    x = randn((6, 2), gen(7))
    with torch.inference_mode():
        mask = ToeplitzMask(randn((11,), gen(8)))
        inside = mask.matmul(x)
        again = mask.matmul(x)
    outside = mask.matmul(x)
    dense = torch.as_tensor(toeplitz_mask(np_(mask.coeffs)))
    for got in (inside, again, outside):
        assert_fft_close(got, dense, mask.coeffs, x)
