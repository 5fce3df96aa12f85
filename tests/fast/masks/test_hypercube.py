"""fast/masks/hypercube.py: the Kronecker operator equals the dense t^popcount(i xor j) matrix.

Dense rows are built independently: a popcount table from bin(i).count("1"). The product sums
N positive weights times x, so the error is a small multiple of u * k * (M |x|) entrywise; the
comparisons allow 1e-12 (float64) / 1e-5 (float32) of M |x|.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast import HypercubeDiffusionMask, masked_linear_attention
from fast.masks.hypercube import GROUP_BITS
from reference.attention import masked_kernel_attention
from reference.masks.hypercube import hypercube_mask
from tests.helpers import DEVICES, GenericMask, gen, np_, positive, randn, rel_frobenius

seeds = st.integers(0, 2**31 - 1)
RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}
POPCOUNT = np.array([bin(i).count("1") for i in range(1 << 12)])


def _dense_rows(rows: np.ndarray, n: int, t: float) -> np.ndarray:
    return t ** POPCOUNT[rows[:, None] ^ np.arange(n)[None, :]]


def _assert_rows_close(got, x, rows, t):
    """got[..., rows, :] == M[rows] @ x within RTOL * (M[rows] |x|)."""
    n = x.shape[-2]
    m = torch.as_tensor(_dense_rows(rows, n, t))
    expected = m @ x.double()
    scale = m @ x.double().abs()
    err = (got[..., rows, :].double() - expected).abs()
    assert bool((err <= RTOL[x.dtype] * scale + 1e-300).all()), float((err / scale).max())


def test_group_bits_leave_several_groups_in_range():
    assert 2 * GROUP_BITS < 12  # k = 0..12 below covers one partial, one full and several groups


@pytest.mark.parametrize("k", range(0, 13))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matmul_equals_dense_t_to_the_popcount(k, dtype):
    n, lam = 1 << k, 0.7
    g = gen(k)
    x = randn((2, n, 3), g, dtype=dtype)
    mask = HypercubeDiffusionMask(n, lam)
    assert mask.k == k and mask.n == n
    out = mask.matmul(x)
    assert out.shape == x.shape and out.dtype == dtype
    rows = np.arange(n) if n <= 256 else np.sort(np.random.default_rng(k).choice(n, 64, replace=False))
    _assert_rows_close(out, x, rows, math.tanh(lam))


@pytest.mark.parametrize("k", [0, 1, 4, 5, 6, 8])
def test_operator_equals_reference_hypercube_mask(k):
    n = 1 << k
    dense = HypercubeDiffusionMask(n, 0.3).matmul(torch.eye(n, dtype=torch.float64))
    np.testing.assert_allclose(np_(dense), hypercube_mask(n, 0.3), rtol=1e-13, atol=0)


@pytest.mark.parametrize("bits", range(0, 7))
def test_group_factor_is_kron_of_two_by_two_factors(bits):
    mask = HypercubeDiffusionMask(64, 0.4)
    t = math.tanh(0.4)
    expected = np.ones((1, 1))
    for _ in range(bits):
        expected = np.kron(expected, np.array([[1.0, t], [t, 1.0]]))
    got = mask.group_factor(bits)
    assert got.shape == (1 << bits, 1 << bits) and got.dtype == torch.float64
    np.testing.assert_allclose(np_(got), expected, rtol=1e-14)
    assert float(mask.t()) == pytest.approx(t, rel=1e-15)


@given(k=st.integers(0, 8), lam=st.floats(0.05, 5.0), c=st.integers(1, 3),
       batch=st.sampled_from([(), (2,), (2, 3)]), seed=seeds)
@settings(max_examples=40)
def test_batched_matmul_equals_dense(k, lam, c, batch, seed):
    n = 1 << k
    x = randn((*batch, n, c), gen(seed))
    _assert_rows_close(HypercubeDiffusionMask(n, lam).matmul(x), x, np.arange(n), math.tanh(lam))


def test_large_lambda_gives_all_ones():
    x = randn((16, 2), gen(0))
    out = HypercubeDiffusionMask(16, 20.0).matmul(x)  # tanh(20) == 1.0 in float64
    np.testing.assert_allclose(np_(out), np.broadcast_to(np_(x).sum(0), (16, 2)), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n", [2, 64])  # one group; two groups (5 + 1 bits)
def test_gradcheck_learnable_lambda(n):
    lam = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    x = randn((n, 2), gen(n)).requires_grad_()
    assert torch.autograd.gradcheck(lambda lam, x: HypercubeDiffusionMask(n, lam).matmul(x), (lam, x))


def test_lambda_gradient_matches_the_derivative_of_tanh_power():
    """d/dlam sum(M x) = sum_ij dist t^(dist - 1) (1 - t^2) x_j, t = tanh(lam)."""
    n, lam0 = 32, 0.8
    lam = torch.tensor(lam0, dtype=torch.float64, requires_grad=True)
    x = randn((n, 1), gen(3))
    HypercubeDiffusionMask(n, lam).matmul(x).sum().backward()
    t = math.tanh(lam0)
    dist = POPCOUNT[np.arange(n)[:, None] ^ np.arange(n)[None, :]]
    expected = float((dist * t ** np.maximum(dist - 1, 0) * (1 - t * t) @ np_(x)).sum())
    assert float(lam.grad) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_device_matmul_equals_dense(device, dtype):
    """On each device (CUDA: cuBLAS batched GEMMs), with lam a float or a float64 tensor on that
    device: M x and |M| x equal the dense rows within RTOL of M |x| (a float32 factor or TF32 GEMM
    in a float64 product would miss 1e-12 by 1e4), and the lam gradient is tanh's (k = 7: a full and
    a partial group)."""
    k, lam0 = 7, 0.7
    n, t = 1 << k, math.tanh(lam0)
    x = randn((2, n, 3), gen(k), dtype=dtype).to(device)
    for lam in (lam0, torch.tensor(lam0, dtype=torch.float64, device=device)):
        mask = HypercubeDiffusionMask(n, lam)
        for out in (mask.matmul(x), mask.abs_matmul(x)):
            assert out.device.type == device and out.dtype == dtype
            _assert_rows_close(out.cpu(), x.cpu(), np.arange(n), t)
    lam = torch.tensor(lam0, dtype=torch.float64, device=device, requires_grad=True)
    x64 = x.double()
    HypercubeDiffusionMask(n, lam).matmul(x64).sum().backward()
    dist = POPCOUNT[np.arange(n)[:, None] ^ np.arange(n)[None, :]]
    expected = float((dist * t ** np.maximum(dist - 1, 0) * (1 - t * t) @ np_(x64.sum(0))).sum())
    assert lam.grad.device.type == device
    assert float(lam.grad) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_input_returns_half(half):
    x = torch.rand(2, 64, 3, generator=gen(1)).to(half)
    mask = HypercubeDiffusionMask(64, 0.5)
    out = mask.matmul(x)
    assert out.dtype == half
    assert rel_frobenius(out, mask.matmul(x.float())) <= 2 * torch.finfo(half).eps


@given(k=st.integers(0, 7), m=st.integers(1, 4), d=st.integers(1, 3), seed=seeds, generic=st.booleans())
@settings(max_examples=30)
def test_attention_equals_dense_masked_kernel_attention(k, m, d, seed, generic):
    n = 1 << k
    g = gen(seed)
    pq, pk, v = positive((2, n, m), g), positive((2, n, m), g), randn((2, n, d), g)
    mask = HypercubeDiffusionMask(n, 0.5)
    out = masked_linear_attention(pq, pk, v, GenericMask(mask) if generic else mask)
    expected = masked_kernel_attention(np_(pq), np_(pk), np_(v), hypercube_mask(n, 0.5))
    assert rel_frobenius(out, expected) <= 1e-12


@pytest.mark.parametrize("n", [0, 3, 6, 12, -4, True, 2.0, 1023])
def test_rejects_n_not_a_power_of_two(n):
    with pytest.raises(ValueError, match="n must be a power of two"):
        HypercubeDiffusionMask(n, 0.5)


@pytest.mark.parametrize("lam", [0.0, -1.0, math.inf, -math.inf, math.nan, True, "0.5",
                                 torch.tensor(0.0), torch.tensor(math.inf), torch.tensor([0.5, 0.5]), torch.tensor(0)])
def test_rejects_bad_lambda(lam):
    with pytest.raises(ValueError, match="lam"):
        HypercubeDiffusionMask(8, lam)


@pytest.mark.parametrize("n, lam", [(np.int64(4), 0.5), (4, np.float32(0.5))])
def test_numpy_scalars_are_accepted(n, lam):
    assert HypercubeDiffusionMask(n, lam).n == 4


def test_matmul_rejects_wrong_x():
    mask = HypercubeDiffusionMask(8, 0.5)
    with pytest.raises(ValueError, match="x must have N=8"):
        mask.matmul(torch.ones(4, 2))
    with pytest.raises(TypeError, match="x"):
        mask.matmul(torch.ones(8, 2, dtype=torch.int32))


def test_attention_backward_with_a_learnable_lambda_at_one_node():
    """N = 1: M = [[1]] does not depend on lam, so the attention's backward must give lam no
    gradient (None) and the inputs theirs, not fail with "does not require grad"."""
    lam = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    g = gen(3)
    phi_q, phi_k = randn((2, 1, 4), g).exp().requires_grad_(), randn((2, 1, 4), g).exp().requires_grad_()
    v = randn((2, 1, 3), g).requires_grad_()
    masked_linear_attention(phi_q, phi_k, v, HypercubeDiffusionMask(1, lam)).sum().backward()
    assert lam.grad is None
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (phi_q, phi_k, v))


def test_integer_and_zero_dim_lambdas_are_accepted():
    """A 0-d integer tensor or NumPy array is a diffusion time like the Python number it holds."""
    x = randn((8, 2), gen(4))
    expected = HypercubeDiffusionMask(8, 1.0).matmul(x)
    for lam in (torch.tensor(1), np.array(1.0), np.int64(1)):
        torch.testing.assert_close(HypercubeDiffusionMask(8, lam).matmul(x), expected, rtol=0, atol=0)


def test_nonnegative_and_abs_matmul_follow_the_sign_of_tanh_lambda():
    """Entries t^dist with t = tanh(lam): >= 0 for lam >= 0. A learnable lam changed in place to a
    negative value makes odd-distance entries negative; nonnegative reads the current lam, and
    abs_matmul is the product with |t|^dist = |M|."""
    lam = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    mask = HypercubeDiffusionMask(16, lam)
    x = randn((16, 3), gen(5))
    dense = torch.as_tensor(_dense_rows(np.arange(16), 16, math.tanh(0.4)))
    assert mask.nonnegative and bool((dense >= 0).all())
    torch.testing.assert_close(mask.abs_matmul(x), dense @ x, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        lam.mul_(-1.0)
    dense = torch.as_tensor(_dense_rows(np.arange(16), 16, math.tanh(-0.4)))
    assert not mask.nonnegative and bool((dense < 0).any())
    torch.testing.assert_close(mask.matmul(x), dense @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mask.abs_matmul(x), dense.abs() @ x, rtol=1e-12, atol=1e-12)


def test_one_element_parameter_lam_is_the_leaf_an_optimiser_updates():
    """lam of shape (1,) is held as given (not a reshaped view), so parameters() hands the
    optimiser the leaf itself."""

    lam = torch.nn.Parameter(torch.tensor([0.5], dtype=torch.float64))
    op = HypercubeDiffusionMask(8, lam)
    assert op.lam is lam and [p is lam for p in op.parameters()] == [True]
    opt = torch.optim.SGD(list(op.parameters()), lr=0.1)
    op.matmul(torch.ones(8, 2, dtype=torch.float64)).sum().backward()
    opt.step()
    assert float(lam.detach()) != 0.5 and op.t().shape == ()
