"""Bad inputs to fast/'s drivers and feature maps (issue 10's list): each raises the documented
exception type with a message that names the argument, says what was expected and what came.

Shapes are drawn with hypothesis where the case is a family (a mask for another N, leading dims
that do not broadcast); each example is a few tiny tensors.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast import (CausalMask, DenseMask, EluPlusOne, FavorPlus, Hyperbolic, Identity, MaskOperator, PackingMask,
                  PaddingMask, ReLU, TrigRFF, favor_attention, favor_features, gaussian_projection,
                  masked_linear_attention, softmax_attention)
from tests.helpers import gen, positive, randn

FEW = settings(max_examples=15, deadline=None)


def _mask_for(kind: str, n: int) -> object:
    return {"causal": lambda: CausalMask(n),
            "packing": lambda: PackingMask(torch.arange(n) // 2),
            "padding": lambda: PaddingMask(torch.arange(n) < max(1, n - 1)),
            "dense": lambda: torch.ones(n, n),
            "ndarray": lambda: np.ones((n, n))}[kind]()


# ------------------------------------------------------------------ a mask for another N


@FEW
@given(n=st.integers(1, 12), other=st.integers(1, 12), kind=st.sampled_from(["causal", "packing", "padding", "dense",
                                                                            "ndarray"]))
def test_favor_attention_mask_for_another_n(n, other, kind):
    """Refused before the key stabiliser runs (a packing/padding mask for another N used to fail
    inside it with a broadcast RuntimeError)."""
    if n == other:
        return
    g = gen(n * 13 + other)
    q, k, v = randn((2, n, 4), g), randn((2, n, 4), g), randn((2, n, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    mask = _mask_for(kind, other)
    pattern = rf"mask is for N={other} tokens but q, k have N={n}, {n}"
    with pytest.raises(ValueError, match=pattern):
        favor_attention(q, k, v, w, mask)
    with pytest.raises(ValueError, match=pattern):
        favor_features(q, k, w, mask)
    with pytest.raises(ValueError, match=rf"mask is for N={other} tokens but phi_q, phi_k have N={n}, {n}"):
        masked_linear_attention(q.exp(), k.exp(), v, mask)


def test_favor_attention_with_a_mask_refuses_n_q_different_from_n():
    g = gen(1)
    q, k, v = randn((5, 4), g), randn((6, 4), g), randn((6, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match="mask is for N=6 tokens but q, k have N=5, 6"):
        favor_attention(q, k, v, w, CausalMask(6))


def test_batched_packing_ids_with_unbatched_inputs_name_the_mask():
    """Packing ids (B, N) with unbatched q, k: the mask's leading dims do not fit k's; the error
    names the ids (PackingMask's own check) or, failing that, the driver's check of the mask's
    key_stabilizer (it used to be a phi_q/phi_k mismatch the user never passed)."""
    g = gen(2)
    q, k, v = randn((6, 4), g), randn((6, 4), g), randn((6, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]])
    with pytest.raises(ValueError, match=r"segment_ids of shape \(2, 6\)|mask.key_stabilizer\(z\) must return .* "
                                         r"got \(2, 6, 1\)"):
        favor_attention(q, k, v, w, PackingMask(ids))


# ------------------------------------------------------------------ what counts as a mask


class NoN:
    def matmul(self, x):
        return x


class NoneN:
    n = None

    def matmul(self, x):
        return x


class SubclassWithoutN(MaskOperator):
    def _matmat(self, x):
        return x


class FloatN:
    n = 6.0

    def matmul(self, x):
        return x


@pytest.mark.parametrize("mask, exc, pattern", [
    (NoN(), TypeError, r"mask \(.*NoN\) has no n \(the number of tokens N\)"),
    (NoneN(), TypeError, r"mask.n must be a positive int .* got NoneType None"),
    (SubclassWithoutN(), TypeError, r"mask \(.*SubclassWithoutN\) has no n"),
    (FloatN(), TypeError, r"mask.n must be a positive int .* got float 6.0"),
    (object(), TypeError, r"mask must be a MaskOperator \(with n and matmul\), a \(\.\.\., N, N\) tensor or NumPy "
                          r"array, a torch sparse tensor or a scipy.sparse matrix; got object"),
    (6, TypeError, r"mask must be a MaskOperator .* got int"),
    ("causal", TypeError, r"mask must be a MaskOperator .* got str"),
    ([[1.0] * 6] * 6, TypeError, r"mask must be a MaskOperator .* got list"),
])
def test_mask_that_is_not_a_mask(mask, exc, pattern):
    """Never "mask is for N=None": an object without a usable n is a TypeError naming mask and what
    is accepted."""
    g = gen(3)
    q, k, v = randn((6, 4), g), randn((6, 4), g), randn((6, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    for call in (lambda: favor_attention(q, k, v, w, mask), lambda: masked_linear_attention(q.exp(), k.exp(), v, mask),
                 lambda: favor_features(q, k, w, mask)):
        with pytest.raises(exc, match=pattern):
            call()


def test_tensor_ndarray_and_numpy_integer_n_are_accepted():
    """Power for the cases above: what the errors say is accepted is accepted."""
    g = gen(4)
    q, k, v = randn((6, 4), g), randn((6, 4), g), randn((6, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    dense = torch.tril(torch.ones(6, 6, dtype=torch.float64))
    expected = favor_attention(q, k, v, w, CausalMask(6))
    for mask in (dense, dense.numpy(), dense.bool()):
        torch.testing.assert_close(favor_attention(q, k, v, w, mask), expected, rtol=1e-12, atol=0)

    class NumpyN(NoN):
        n = np.int64(6)

        def matmul(self, x):
            return dense @ x

    torch.testing.assert_close(favor_attention(q, k, v, w, NumpyN()), expected, rtol=1e-12, atol=0)


# ------------------------------------------------------------ a user operator's wrong results


class UserMask:
    def __init__(self, n=6):
        self.n = n
        self.dense = torch.tril(torch.ones(n, n, dtype=torch.float64))

    def matmul(self, x):
        return self.dense @ x


class ShortRows(UserMask):
    def matmul(self, x):
        return (self.dense @ x)[..., :-1, :]


class ExtraColumn(UserMask):
    def matmul(self, x):
        return torch.cat([self.dense @ x, x[..., :1]], dim=-1)


class ListResult(UserMask):
    def matmul(self, x):
        return (self.dense @ x).tolist()


class AttendOne(UserMask):
    def attend(self, phi_q, phi_k, v):
        return (phi_q @ phi_k.mT * self.dense) @ v


class AttendShortDen(UserMask):
    def attend(self, phi_q, phi_k, v):
        a = phi_q @ phi_k.mT * self.dense
        return a @ v, a.sum(-1)[..., :-1]


class AttendWrongD(UserMask):
    def attend(self, phi_q, phi_k, v):
        a = phi_q @ phi_k.mT * self.dense
        return a @ v[..., :1], a.sum(-1)[..., :]


class AbsWrong(UserMask):
    nonnegative = False

    def abs_matmul(self, x):
        return x[..., :1, :]


class RoundoffWrong(UserMask):
    nonnegative = True

    def roundoff_bound(self, x):
        return torch.zeros(x.shape[-1] + 1, dtype=x.dtype)


class StabiliserWrong(UserMask):
    def key_stabilizer(self, z):
        return z[..., :2, :1].amax(-1, keepdim=True).expand(*z.shape[:-2], 2, 3)


@pytest.mark.parametrize("cls, exc, pattern", [
    (ShortRows, ValueError, r"mask.matmul\(x\) must return shape \(\.\.\., N, c\) = \(\.\.\., 6, \d\).* got \(2, 5, \d\)"),
    (ExtraColumn, ValueError, r"mask.matmul\(x\) must return shape .* ExtraColumn"),
    (ListResult, TypeError, r"mask.matmul\(x\) must return a torch.Tensor, got list"),
    (AttendOne, ValueError, r"mask.attend must return \(num \(\.\.\., 6, 3\), den \(\.\.\., 6\)\).* got Tensor"),
    (AttendShortDen, ValueError, r"mask.attend must return .* got \(\(2, 6, 3\), \(2, 5\)\)"),
    (AttendWrongD, ValueError, r"mask.attend must return \(num \(\.\.\., 6, 3\).* got \(\(2, 6, 1\), \(2, 6\)\)"),
    (AbsWrong, ValueError, r"mask.abs_matmul\(x\) must return shape \(\.\.\., N, c\) = \(\.\.\., 6, 4\).* got \(2, 1, 4\)"),
    (RoundoffWrong, ValueError, r"mask.roundoff_bound\(x\) must return shape \(2, 4\).* got \(5,\)"),
])
def test_user_operator_returning_the_wrong_shape(cls, exc, pattern):
    g = gen(5)
    pq, pk, v = positive((2, 6, 4), g), randn((2, 6, 4), g), randn((2, 6, 3), g)
    with pytest.raises(exc, match=pattern):
        masked_linear_attention(pq, pk, v, cls())
    with pytest.raises(exc, match=pattern):  # without autograd too (no parameter probe)
        with torch.no_grad():
            masked_linear_attention(pq, pk, v, cls())


def test_user_key_stabilizer_returning_the_wrong_shape():
    g = gen(6)
    q, k, v = randn((2, 6, 4), g), randn((2, 6, 4), g), randn((2, 6, 3), g)
    w = gaussian_projection(4, 4, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mask.key_stabilizer\(z\) must return constants broadcastable to z "
                                         r"\(2, 6, 4\).* got \(2, 2, 3\)"):
        favor_attention(q, k, v, w, StabiliserWrong())


# ------------------------------------------------------------------------------ softmax


@FEW
@given(lead_q=st.lists(st.integers(1, 3), min_size=1, max_size=2), lead_k=st.lists(st.integers(1, 3), min_size=1,
                                                                                 max_size=2))
def test_softmax_leading_dims_that_do_not_broadcast(lead_q, lead_k):
    """Checked before SDPA (whose broadcast RuntimeError named no argument)."""
    compatible = all(a == b or 1 in (a, b) for a, b in zip(reversed(lead_q), reversed(lead_k)))
    g = gen(7)
    q, k, v = randn((*lead_q, 5, 4), g), randn((*lead_k, 5, 4), g), randn((*lead_k, 5, 3), g)
    if compatible:
        assert softmax_attention(q, k, v).shape[-2:] == (5, 3)
        return
    with pytest.raises(ValueError, match=re.escape("q, k, v must have leading (batch, head) dims that broadcast "
                                                   f"together, got q {tuple(q.shape)}, k {tuple(k.shape)}")):
        softmax_attention(q, k, v)


@FEW
@given(rows=st.integers(1, 7), cols=st.integers(1, 7), batch=st.sampled_from([(), (1,), (2,), (3,), (2, 1)]))
def test_softmax_logits_mask_shape(rows, cols, batch):
    """logits_mask must broadcast to (..., N_q, N) = (2, 4, 5); anything else is a ValueError naming
    it, before SDPA."""
    g = gen(8)
    q, k, v = randn((2, 4, 3), g), randn((2, 5, 3), g), randn((2, 5, 2), g)
    logits = torch.zeros(*batch, rows, cols, dtype=torch.float64)
    fits = rows in (1, 4) and cols in (1, 5) and (len(batch) == 0 or (len(batch) == 1 and batch[0] in (1, 2)))
    if fits:
        assert softmax_attention(q, k, v, logits).shape == (2, 4, 2)
        return
    with pytest.raises(ValueError, match=re.escape("logits_mask must broadcast to (..., N_q, N) = (2, 4, 5)") + ".* got "
                       + re.escape(f"shape {tuple(logits.shape)}")):
        softmax_attention(q, k, v, logits)


@pytest.mark.parametrize("value, exc, pattern", [
    (float("nan"), ValueError, "logits_mask must hold finite logits or -inf, got NaN or \\+inf"),
    (float("inf"), ValueError, "logits_mask must hold finite logits or -inf"),
])
def test_softmax_logits_mask_values(value, exc, pattern):
    g = gen(9)
    q, k, v = randn((4, 3), g), randn((4, 3), g), randn((4, 2), g)
    logits = torch.zeros(4, 4, dtype=torch.float64)
    logits[1, 2] = value
    with pytest.raises(exc, match=pattern):
        softmax_attention(q, k, v, logits)


@pytest.mark.parametrize("logits", [torch.zeros(4, 4, dtype=torch.int64), np.zeros((4, 4)), [[0.0] * 4] * 4])
def test_softmax_logits_mask_type(logits):
    g = gen(10)
    q, k, v = randn((4, 3), g), randn((4, 3), g), randn((4, 2), g)
    with pytest.raises(TypeError, match="logits_mask must be a floating tensor .* got"):
        softmax_attention(q, k, v, logits)


# -------------------------------------------------------------------- gaussian_projection


@pytest.mark.parametrize("generator, got", [(0, "int"), (7, "int"), (np.random.default_rng(0), "numpy.Generator"),
                                            (np.random.RandomState(0), "numpy.RandomState"), ("seed", "str")])
def test_gaussian_projection_generator_must_be_a_torch_generator(generator, got):
    with pytest.raises(TypeError, match=rf"generator must be a torch.Generator or None .* got {got}"):
        gaussian_projection(4, 3, generator=generator)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.complex128,
                                   torch.uint8, np.float32, "float32", float])
def test_gaussian_projection_dtype_must_be_a_real_float(dtype):
    with pytest.raises(TypeError, match=r"dtype must be a real floating torch.dtype .* got"):
        gaussian_projection(4, 3, generator=gen(0), dtype=dtype)


@FEW
@given(m=st.integers(1, 9), d=st.integers(1, 9), kind=st.sampled_from([np.int64, np.int32, np.uint8, int]))
def test_gaussian_projection_accepts_numpy_integer_sizes(m, d, kind):
    w = gaussian_projection(kind(m), kind(d), generator=gen(1))
    assert w.shape == (m, d) and w.dtype == torch.float32
    assert torch.equal(w, gaussian_projection(m, d, generator=gen(1)))


@pytest.mark.parametrize("m", [np.float64(4.0), 4.5, np.int64(0), np.int64(-2), True])
def test_gaussian_projection_non_integer_sizes_name_m(m):
    with pytest.raises(ValueError, match="m must be a positive integer, got"):
        gaussian_projection(m, 3, generator=gen(0))


# --------------------------------------------------------------------------- feature maps


@pytest.mark.parametrize("make", [EluPlusOne, ReLU, Identity,
                                  lambda: FavorPlus(torch.ones(4, 3)), lambda: Hyperbolic(torch.ones(4, 3)),
                                  lambda: TrigRFF(torch.ones(4, 3))])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_feature_maps_refuse_non_floating_input_naming_x(make, dtype):
    x = torch.ones(5, 3).to(dtype)
    with pytest.raises(TypeError, match=rf"x must be a floating tensor .* got {dtype}"):
        make()(x)


@pytest.mark.parametrize("make", [EluPlusOne, ReLU, Identity])
def test_elementwise_feature_maps_refuse_non_tensors_naming_x(make):
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        make()([[1.0, 2.0]])


# ----------------------------------------------------------------------- NumPy integers


def test_numpy_integer_sizes_are_accepted_by_the_drivers():
    g = gen(11)
    pq, pk, v = positive((6, 4), g), positive((6, 4), g), randn((6, 3), g)
    expected = masked_linear_attention(pq, pk, v, CausalMask(6), block_cols=3)
    got = masked_linear_attention(pq, pk, v, CausalMask(np.int64(6), chunk=np.int32(4)), block_cols=np.int64(3))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    dense = DenseMask(torch.tril(torch.ones(6, 6)))
    torch.testing.assert_close(masked_linear_attention(pq, pk, v, dense, block_cols=np.int16(3)), expected,
                               rtol=1e-12, atol=0)


@FEW
@given(lead_q=st.lists(st.integers(1, 3), max_size=2), lead_k=st.lists(st.integers(1, 3), max_size=2))
def test_favor_attention_q_and_k_leading_dims_must_agree(lead_q, lead_k):
    """Named as q and k (not as the features phi_q, phi_k the caller never passed)."""
    g = gen(12)
    q, k, v = randn((*lead_q, 5, 4), g), randn((*lead_k, 5, 4), g), randn((*lead_k, 5, 3), g)
    w = gaussian_projection(6, 4, generator=g, dtype=torch.float64)
    if lead_q == lead_k:
        assert favor_attention(q, k, v, w).shape == (*lead_k, 5, 3)
        return
    with pytest.raises(ValueError, match=re.escape(f"q and k must share leading (batch, head) dims, got "
                                                   f"{tuple(q.shape)} and {tuple(k.shape)}")):
        favor_attention(q, k, v, w)
