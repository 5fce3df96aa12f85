"""fast/masks/toeplitz.py: the FFT operators equal the dense reference masks, exactly up to round-off.

The dense side is reference/masks/toeplitz.py (itself tested against coordinate loops). FFT
convolution has a normwise error bound |fl(M x) - M x|_inf <= C u log2(n_fft) |table|_1 |x_col|_2
(Higham Sec. 24.1; BlockToeplitzMask.roundoff_bound), so comparisons scale by such norms (with
|table|_2 <= |table|_1, the tighter side): float64 to 1e-12, float32 to 1e-5 (u = 1.1e-16 / 6e-8
times log2(n_fft) <= ~12 times a small constant, with a wide margin; float32 inputs transform in
float64 by default, so their error is mostly the final rounding to float32).
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


# ------------------------------------------------------------------- never a stale spectrum


def _dense_now(mask):
    return _dense(mask.grid_shape, mask.table.detach(), mask.cls_token)


def _change_in_place(table, how):
    """Double the table in place without moving its version counter (``.data``, inference mode)
    or through an ordinary in-place op (under no_grad, as an optimiser step does)."""
    if how == "data":
        table.data.mul_(2.0)
    elif how == "inference_mode":
        with torch.inference_mode():
            table.mul_(2.0)
    else:
        with torch.no_grad():
            table.mul_(2.0)


@pytest.mark.parametrize("how", ["data", "inference_mode", "no_grad"])
@pytest.mark.parametrize("shape, cls_token", [((6,), False), ((3, 4), True), ((2, 3, 2), False)])
def test_products_follow_in_place_changes_of_the_table(how, shape, cls_token):
    """``op.matmul(x); c.data.mul_(2); op.matmul(x)`` used to return the old product (a cached
    spectrum keyed on the version counter, which ``.data`` and inference mode bypass)."""
    g = gen(21)
    if how == "inference_mode":
        with torch.inference_mode():  # an inference tensor can only be changed in inference mode
            table = _table(shape, g)
    else:
        table = _table(shape, g)
    mask = BlockToeplitzMask(shape, table, cls_token=cls_token)
    x = randn((2, mask.n, 3), g)
    before = [mask.matmul(x), mask.rmatmul(x), mask.transposed().matmul(x), mask.abs_matmul(x)]
    _change_in_place(table, how)
    dense = _dense_now(mask)
    after = [mask.matmul(x), mask.rmatmul(x), mask.transposed().matmul(x), mask.abs_matmul(x)]
    for got, was, expected in zip(after, before, [dense @ x, dense.T @ x, dense.T @ x, dense.abs() @ x]):
        assert not torch.allclose(got, was)  # the change is visible (it doubles the grid part)
        assert_unchanged(got, expected, rtol=1e-12)


@pytest.mark.parametrize("how", ["data", "inference_mode"])
def test_toeplitz_attention_follows_in_place_changes(how):
    g = gen(22)
    n = 9
    if how == "inference_mode":
        with torch.inference_mode():
            coeffs = torch.rand(2 * n - 1, generator=g, dtype=torch.float64) + 0.1
    else:
        coeffs = torch.rand(2 * n - 1, generator=g, dtype=torch.float64) + 0.1
    mask = ToeplitzMask(coeffs)
    pq, pk, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)
    masked_linear_attention(pq, pk, v, mask)
    if how == "data":
        coeffs.data[: n - 1] = 0.0  # a non-uniform change: the attention output moves
    else:
        with torch.inference_mode():
            coeffs[: n - 1] = 0.0
    out = masked_linear_attention(pq, pk, v, mask)
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), toeplitz_mask(np_(coeffs)))
    assert rel_frobenius(out, expected) <= 1e-12
    assert mask.nonnegative


def test_nonnegative_is_read_from_the_current_table():
    coeffs = torch.ones(5)
    mask = ToeplitzMask(coeffs)
    assert mask.nonnegative
    coeffs.data[0] = -1.0
    assert not mask.nonnegative


def test_spectrum_is_the_current_tables_and_carries_grad_of_a_learnable_table():
    table = torch.rand(3, 5, generator=gen(1), dtype=torch.float64, requires_grad=True)
    mask = BlockToeplitzMask((2, 3), table)
    s1 = mask.spectrum(torch.device("cpu"), torch.float64)
    assert s1.requires_grad and s1.dtype == torch.complex128 and s1.shape == (mask.n_fft[0], mask.n_fft[1] // 2 + 1)
    assert mask.spectrum("cpu", torch.float32).dtype == torch.complex64
    with torch.no_grad():
        table.mul_(3.0)
    s2 = mask.spectrum(torch.device("cpu"), torch.float64)
    torch.testing.assert_close(s2, 3.0 * s1.detach(), rtol=1e-13, atol=1e-13)


def test_rmatmul_is_the_transpose_and_transposed_is_a_copy():
    g = gen(23)
    shape = (3, 4)
    mask = BlockToeplitzMask(shape, _table(shape, g), cls_token=True)
    x = randn((mask.n, 2), g)
    dense = _dense_now(mask)
    assert_unchanged(mask.rmatmul(x), dense.T @ x, rtol=1e-12)
    t = mask.transposed()
    assert t is not mask.transposed()  # built afresh: nothing cached
    assert_unchanged(t.matmul(x), dense.T @ x, rtol=1e-12)


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
# The driver (fast.masked_linear_attention) guards the division; the operator gives it
# ``nonnegative``, ``abs_matmul`` and ``roundoff_bound`` (the contract of fast.operator).


def test_exactly_zero_denominator_raises():
    """coeffs (xi(-1), xi(0), xi(1)) = (-1, 1, 1), phi = 1: den_0 = xi(0) + xi(-1) = 0 exactly."""
    mask = ToeplitzMask(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    assert not mask.nonnegative
    ones = torch.ones(2, 1, dtype=torch.float64)
    with pytest.raises(DenominatorError, match="round-off|zero"):
        masked_linear_attention(ones, ones, randn((2, 3), gen(0)), mask)


@pytest.mark.parametrize("n", [3, 5, 16, 37])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cancelling_denominator_raises_never_nan(n, dtype):
    """Row 0 sums xi(0), xi(-1), ..., xi(-(N-1)) = coeffs[N-1], ..., coeffs[0]: dyadic coefficients
    (exact in both dtypes) whose sum is exactly 0, so the computed den_0 is pure round-off."""
    g = gen(n)
    coeffs = (torch.randint(16, 64, (2 * n - 1,), generator=g) / 64.0).to(torch.float64)
    coeffs[0] = -coeffs[1:n].sum()
    mask = ToeplitzMask(coeffs.to(dtype))
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


def _favor_draw(std, seed, n=256, d=64, m=128):
    """float32 q, k (entries of std ``std``), v, and a Gaussian projection W (m, d)."""
    g = gen(seed)
    q, k = std * torch.randn(n, d, generator=g), std * torch.randn(n, d, generator=g)
    v = torch.randn(n, d, generator=g)
    return q, k, v, fast.gaussian_projection(m, d, generator=g)


@pytest.mark.parametrize("std, seed", [(2.0, 1), (3.0, 0), (3.0, 1), (3.0, 2)])
def test_realistic_float32_favor_attention_is_accepted_and_accurate(std, seed):
    """d = 64, N = 256, q, k entries of std 2 and 3 with exp(-|i - j| / 10): these draws were
    refused (DenominatorError at 1 to 3 of 256 queries) when the transforms ran in float32,
    whose normwise round-off (~6e-8 of the column's largest key) swamped the denominators of
    queries that see only small keys. float64 transforms: every row within 1e-3 relative of the
    float64 run of the same estimator (same projection, inputs converted exactly)."""
    n = 256
    q, k, v, w = _favor_draw(std, seed, n)
    mask32 = ToeplitzMask.from_function(lambda r: torch.exp(-0.1 * r), n)
    out = fast.favor_attention(q, k, v, w, mask32)
    assert out.dtype == torch.float32
    mask64 = ToeplitzMask.from_function(lambda r: torch.exp(-0.1 * r), n, dtype=torch.float64)
    ref = fast.favor_attention(q.double(), k.double(), v.double(), w.double(), mask64)
    rel = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert float(rel.max()) <= 1e-3, float(rel.max())


def test_float32_transforms_are_still_available_and_bounded():
    """transform_dtype=torch.float32: the float32 transforms, with float32's unit round-off in the bound."""
    g = gen(24)
    coeffs = torch.rand(2 * 40 - 1, generator=g) + 0.1
    fast32 = ToeplitzMask(coeffs, transform_dtype=torch.float32)
    exact = ToeplitzMask(coeffs)
    x = torch.rand(40, 3, generator=g)
    assert fast32.transform_dtype == torch.float32 and exact.transform_dtype == torch.float64
    ratio = fast32.roundoff_bound(x) / exact.roundoff_bound(x)
    torch.testing.assert_close(ratio, torch.full((3,), 2.0**29), rtol=1e-5, atol=0)  # u32 / u64
    dense = torch.as_tensor(toeplitz_mask(np_(coeffs)))
    assert_fft_close(fast32.matmul(x), dense, coeffs, x)
    # float64 inputs transform in float64 whatever transform_dtype says
    x64 = x.double()
    assert_unchanged(fast32.matmul(x64), dense @ x64, rtol=1e-13)


def _spiky(n, c, g, dtype):
    """Columns of 10^(-30..0) magnitudes: a few large entries and many tiny ones (FAVOR+ keys)."""
    return torch.pow(10.0, -30 * torch.rand(n, c, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype, transform", [(torch.float64, torch.float64), (torch.float32, torch.float64),
                                              (torch.float32, torch.float32)])
@pytest.mark.parametrize("shape, cls_token, signed", [((50,), False, False), ((50,), False, True),
                                                      ((6, 7), True, False), ((3, 4, 5), False, True)])
def test_roundoff_bound_covers_the_error(dtype, transform, shape, cls_token, signed):
    """|fl(M x) - M x| <= roundoff_bound(x) (per column) + the final rounding to x's dtype
    (u |M x| entrywise), with M x from a dense float64 product of the same (exact) inputs."""
    g = gen(25)
    table = (randn if signed else lambda sh, g: torch.rand(*sh, generator=g, dtype=torch.float64))(
        tuple(2 * s - 1 for s in shape), g)
    mask = BlockToeplitzMask(shape, table.to(dtype), cls_token=cls_token, transform_dtype=transform)
    x = _spiky(mask.n, 4, g, dtype)
    dense = _dense(shape, table.to(dtype), cls_token)
    exact = dense @ x.double()
    err = (mask.matmul(x).double() - exact).abs()
    allowed = mask.roundoff_bound(x).double().unsqueeze(-2) + torch.finfo(dtype).eps * exact.abs()
    assert bool((err <= allowed).all())
    assert mask.roundoff_bound(x).dtype == dtype and mask.roundoff_bound(x).shape == (4,)
    # the bound is not vacuous: within ~1e5 of the observed normwise error of the transforms
    if transform == torch.float64:
        assert float(mask.roundoff_bound(x).double().max()) <= 1e-9 * float(exact.abs().max())


# ---------------------------------------------------------------------- rows that see no key


def test_rows_that_see_no_key_are_exactly_zero_with_the_full_gradient():
    """Strictly causal table (xi(delta) = 0 for delta <= 0): row 0 of M sees no key, its product is
    exactly 0 (not FFT noise); d(row)/d(table) still reaches the zero entries (a learnable table)."""
    n = 6
    coeffs = torch.cat([torch.zeros(n, dtype=torch.float64),
                        torch.rand(n - 1, generator=gen(26), dtype=torch.float64) + 0.5])
    mask = ToeplitzMask(coeffs)
    x = torch.rand(2, n, 3, generator=gen(27), dtype=torch.float64) + 1.0
    out = mask.matmul(x)
    assert bool((out[..., 0, :] == 0).all()) and bool((out[..., 1:, :] != 0).all())
    assert bool((mask.rmatmul(x)[..., n - 1, :] == 0).all())  # the last column of M is empty
    assert bool((mask.matmul(x.float())[..., 0, :] == 0).all())
    learn = coeffs.clone().requires_grad_()
    got = torch.autograd.grad(ToeplitzMask(learn).matmul(x).sum(), learn)[0]
    ref_learn = learn.detach().clone().requires_grad_()
    dense = torch.stack([torch.stack([ref_learn[i - j + n - 1] for j in range(n)]) for i in range(n)])
    expected = torch.autograd.grad((dense @ x).sum(), ref_learn)[0]
    assert_unchanged(got, expected, rtol=1e-12)
    assert float(expected[n - 1]) != 0  # the gradient of xi(0), a zero entry, is not zero


def test_attention_rows_that_see_no_key_follow_the_no_key_policy():
    n = 6
    coeffs = torch.cat([torch.zeros(n, dtype=torch.float64),
                        torch.rand(n - 1, generator=gen(28), dtype=torch.float64) + 0.5])
    g = gen(29)
    pq, pk, v = positive((n, 2), g), positive((n, 2), g), randn((n, 3), g)
    with pytest.raises(DenominatorError, match="no key"):
        masked_linear_attention(pq, pk, v, ToeplitzMask(coeffs))
    out = masked_linear_attention(pq, pk, v, ToeplitzMask(coeffs), no_key="zero")
    assert bool((out[0] == 0).all())
    dense = toeplitz_mask(np_(coeffs))
    expected = masked_kernel_attention(np_(pq)[1:], np_(pk), np_(v), dense[1:])
    assert rel_frobenius(out[1:], expected) <= 1e-12


# ------------------------------------------------------------------------- many axes


def test_eight_and_more_axes_work():
    """MKL refuses transforms of 8 or more axes; they go in groups of 3 axes per call."""
    g = gen(30)
    for shape in [(2,) * 8, (1, 2, 1, 2, 1, 1, 2, 1, 2)]:
        table = _table(shape, g)
        mask = BlockToeplitzMask(shape, table)
        x = randn((2, mask.n, 2), g)
        assert_fft_close(mask.matmul(x), _dense(shape, table), table, x)
        assert_unchanged(mask.rmatmul(x), _dense(shape, table).T @ x, rtol=1e-11)


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
    (lambda: ToeplitzMask.from_function(lambda d: 1.0 / d, 3), ValueError, "f returned non-finite"),  # inf at 0
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


@pytest.mark.parametrize("log", ["all", "partial"])
def test_log_coefficients_of_minus_inf_are_named_when_queries_see_no_key(log):
    """Log-coefficients -inf give weight 0: the queries left with no key are refused naming the
    coefficients (issue 24: the message said only "their mask row is all zero")."""
    n = 4
    b = torch.full((2 * n - 1,), -torch.inf)
    if log == "partial":
        b[n:] = 0.0  # offsets i - j >= 1 only: query 0 sees no key
    g = gen(0)
    q, k, v = positive((n, 3), g), positive((n, 3), g), randn((n, 2), g)
    count = n if log == "all" else 1
    with pytest.raises(DenominatorError, match=rf"{count} of {n} queries see no key \(their mask row is all zero: coeffs "
                                               rf"is 0 at every offset they reach \(a log_coeffs entry of -inf gives 0\)"):
        masked_linear_attention(q, k, v, ToeplitzMask.from_log_coefficients(b))
    table = torch.full((3, 3), -torch.inf)
    with pytest.raises(DenominatorError, match=r"table is 0 at every offset they reach \(a log_table entry of -inf"):
        masked_linear_attention(positive((4, 3), g), positive((4, 3), g), randn((4, 2), g),
                                BlockToeplitzMask.from_log_table((2, 2), table))


def test_absurd_sizes_are_refused_before_allocating():
    """n = 2^40 or a 2^20 x 2^20 grid: a MemoryError naming n or shape and the bytes (issue 24)."""
    with pytest.raises(MemoryError, match=r"n = 1099511627776 asks for 4 x the coefficients and their spectrum .*TiB"):
        ToeplitzMask.from_function(lambda d: torch.exp(-d), 2**40)
    with pytest.raises(MemoryError, match=r"shape = \(1048576, 1048576\) asks for the grid offsets .*TiB"):
        BlockToeplitzMask.from_distance((2**20, 2**20), lambda d: torch.exp(-d))
