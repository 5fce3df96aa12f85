"""Bad inputs of the positional masks (Toeplitz, block-Toeplitz, low-rank, hypercube): each is
refused with the documented exception type and a message that names the argument, says what
was expected and what came (issue 10); sizes given as NumPy integers are accepted."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast import BlockToeplitzMask, HypercubeDiffusionMask, LowRankMask, ToeplitzMask
from reference.masks.hypercube import hypercube_mask
from reference.masks.toeplitz import block_toeplitz_mask
from tests.helpers import assert_unchanged, gen, np_, randn

# ------------------------------------------------------------------ NumPy integer sizes


@pytest.mark.parametrize("np_int", [np.int8, np.int32, np.int64, np.uint16])
def test_numpy_integer_sizes_are_accepted(np_int):
    shape = (np_int(2), np_int(3))
    table = torch.rand(3, 5, generator=gen(0), dtype=torch.float64)
    mask = BlockToeplitzMask(shape, table, n=np_int(6), max_chunk_bytes=np_int(100))
    assert mask.grid_shape == (2, 3) and type(mask.grid_shape[0]) is int and mask.n == 6
    assert mask.max_chunk_bytes == 100 and type(mask.max_chunk_bytes) is int
    x = randn((6, 2), gen(1))
    assert_unchanged(mask.matmul(x), torch.as_tensor(block_toeplitz_mask((2, 3), np_(table))) @ x, rtol=1e-12)
    assert ToeplitzMask.from_function(lambda r: torch.exp(-r), np_int(4)).n == 4
    assert BlockToeplitzMask.from_distance((np_int(2), np_int(2)), lambda r: 1.0 / (1.0 + r)).n == 4
    assert HypercubeDiffusionMask(np_int(8), 0.5).n == 8


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "100", None, np.float64(100.0)])
def test_max_chunk_bytes_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match=r"max_chunk_bytes must be a positive int .*got"):
        BlockToeplitzMask((2,), torch.ones(3), max_chunk_bytes=value)


@pytest.mark.parametrize("value", [np.int64(7), 5.0, True])
def test_n_must_match_the_grid(value):
    with pytest.raises(ValueError, match=r"= 6 tokens, but n="):
        BlockToeplitzMask((2, 3), torch.ones(3, 5), n=value)


@pytest.mark.parametrize("value", [torch.float16, torch.bfloat16, torch.int32, "float64", np.float64, None])
def test_transform_dtype_must_be_float32_or_float64(value):
    with pytest.raises(TypeError, match=r"transform_dtype must be one of torch.float32, torch.float64, got"):
        ToeplitzMask(torch.ones(3), transform_dtype=value)


# ------------------------------------------------------- from_function / from_distance


def _from_function(f, **kw):
    return ToeplitzMask.from_function(f, 4, **kw)  # 7 distances


def _from_distance(f, **kw):
    return BlockToeplitzMask.from_distance((2, 3), f, **kw)  # a (3, 5) table


BUILDERS = {"from_function": (_from_function, (7,)), "from_distance": (_from_distance, (3, 5))}


@pytest.mark.parametrize("which", list(BUILDERS))
@pytest.mark.parametrize("f, exc, match", [
    (lambda r: r[:-1], ValueError, r"f must return a tensor of shape \(.*\) .*got shape"),
    (lambda r: torch.stack([r, r]), ValueError, r"f must return a tensor of shape .*got shape \(2, "),
    (lambda r: r.reshape(-1)[:3], ValueError, r"f must return a tensor of shape .*got shape \(3,\)"),
    (lambda r: [1.0, 2.0], ValueError, r"f must return a tensor of shape .*got shape \(2,\)"),
    (lambda r: "abc", TypeError, r"f must return a real tensor .*got str"),
    (lambda r: None, TypeError, r"f must return .*got"),
    (lambda r: r * (1 + 1j), TypeError, r"f must return real values .*complex"),
    (lambda r: r * math.nan, ValueError, r"f returned non-finite values"),
    (lambda r: torch.exp(r * 1e3), ValueError, r"f returned non-finite values"),
])
def test_f_of_the_wrong_kind_is_refused_naming_f(which, f, exc, match):
    build, _ = BUILDERS[which]
    with pytest.raises(exc, match=match):
        build(f)


@pytest.mark.parametrize("which", list(BUILDERS))
def test_f_must_be_callable_and_dtype_floating(which):
    build, _ = BUILDERS[which]
    with pytest.raises(TypeError, match=r"f must be a callable .*got Tensor"):
        build(torch.ones(7))
    with pytest.raises(TypeError, match=r"dtype must be one of .*got torch.int64"):
        build(lambda r: r, dtype=torch.int64)


@pytest.mark.parametrize("which", list(BUILDERS))
def test_f_may_return_scalars_ints_bools_and_arrays_of_the_right_shape(which):
    build, shape = BUILDERS[which]
    assert torch.equal(build(lambda r: 2).table, torch.full(shape, 2.0))
    assert torch.equal(build(lambda r: np.float64(0.5)).table, torch.full(shape, 0.5))
    window = build(lambda r: r <= 1).table  # a hard window as a bool tensor
    assert window.dtype == torch.float32 and set(window.unique().tolist()) == {0.0, 1.0}
    as_array = build(lambda r: np.ones(tuple(r.shape))).table
    assert torch.equal(as_array, torch.ones(shape))


@given(extra=st.lists(st.integers(1, 4), min_size=0, max_size=2), cut=st.integers(0, 6),
       which=st.sampled_from(list(BUILDERS)))
@settings(max_examples=25, deadline=None)
def test_any_wrong_shape_from_f_is_a_value_error_naming_f(extra, cut, which):
    build, shape = BUILDERS[which]
    wrong = (*extra, shape[0] + cut + 1, *shape[1:])  # never the table's shape
    with pytest.raises(ValueError, match=r"f must return a tensor of shape"):
        build(lambda r: torch.ones(wrong))


# ------------------------------------------------------------------- block-Toeplitz axes


@given(axes=st.integers(8, 10), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=5, deadline=None)
def test_many_axes_work_instead_of_an_mkl_error(axes, seed):
    g = gen(seed)
    shape = tuple(int(s) for s in torch.randint(1, 3, (axes,), generator=g))
    table = randn(tuple(2 * s - 1 for s in shape), g)
    mask = BlockToeplitzMask(shape, table)
    x = randn((mask.n, 2), g)
    dense = torch.as_tensor(block_toeplitz_mask(shape, np_(table)))
    torch.testing.assert_close(mask.matmul(x), dense @ x, rtol=1e-10, atol=1e-10)


def test_table_of_the_wrong_shape_for_many_axes_names_table():
    with pytest.raises(ValueError, match=r"table must have shape \(3, 3, 3, 3, 3, 3, 3, 3\)"):
        BlockToeplitzMask((2,) * 8, torch.ones((3,) * 7))


# -------------------------------------------------------------------------- low-rank


@pytest.mark.parametrize("left, right", [
    (torch.ones(2, 4, 3), torch.ones(3, 3, 4)),
    (torch.ones(2, 5, 4, 3), torch.ones(4, 3, 4)),
])
def test_low_rank_factor_batches_must_broadcast(left, right):
    with pytest.raises(ValueError, match=r"left \(\.\.\., N, r\) and right \(\.\.\., r, N\) must have leading "
                                         r"\(batch\) dims that broadcast, got left \(.*\) and right \(.*\)"):
        LowRankMask(left, right)


@given(factor_batch=st.integers(2, 4), x_batch=st.integers(2, 5), heads=st.booleans())
@settings(max_examples=20, deadline=None)
def test_low_rank_factor_batch_not_matching_x_is_a_clear_error(factor_batch, x_batch, heads):
    if factor_batch == x_batch:
        x_batch += 1
    lead = (factor_batch, 1) if heads else (factor_batch,)
    mask = LowRankMask(torch.ones(*lead, 4, 2), torch.ones(*lead, 2, 4))
    x = torch.ones(x_batch, *((3,) if heads else ()), 4, 1)
    for product in (mask.matmul, mask.rmatmul, mask.abs_matmul):
        with pytest.raises(ValueError, match=r"x's leading \(batch\) dims .* do not broadcast with the factors' "
                                             r".*left .*right"):
            product(x)


def test_low_rank_wrong_x_is_named():
    mask = LowRankMask(torch.ones(4, 2), torch.ones(2, 4))
    with pytest.raises(ValueError, match="x must have N=4"):
        mask.abs_matmul(torch.ones(5, 1))
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        mask.matmul(torch.ones(4, 1, dtype=torch.int64))


# -------------------------------------------------------------------------- hypercube


@pytest.mark.parametrize("lam", [torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), torch.tensor([0.5]),
                                 np.array(0.5), np.float32(0.5), torch.tensor(1), np.array(1), 1])
def test_hypercube_accepts_scalar_lambdas(lam):
    mask = HypercubeDiffusionMask(8, lam)
    x = randn((8, 2), gen(3))
    value = float(np.asarray(lam.detach() if isinstance(lam, torch.Tensor) else lam).reshape(-1)[0])
    assert_unchanged(mask.matmul(x), HypercubeDiffusionMask(8, value).matmul(x), rtol=1e-12)
    dense = torch.as_tensor(hypercube_mask(8, value))  # exp(-lam L): M up to a positive constant
    scaled = dense / dense[0, 0]
    assert_unchanged(mask.matmul(x), scaled @ x, rtol=1e-12)


@pytest.mark.parametrize("lam, match", [
    (torch.tensor(0.5 + 0.1j), r"lam must be a positive real scalar .*complex"),
    (torch.tensor(True), r"lam must be a positive real scalar .*bool"),
    (torch.tensor([0.5, 0.5]), r"lam must be a positive real scalar .*shape \(2,\)"),
    (torch.tensor(-0.5), r"lam must be a positive finite diffusion time, got a tensor holding -0.5"),
    (torch.tensor(0), r"lam must be a positive finite diffusion time, got a tensor holding 0"),
    (torch.tensor(math.nan), r"lam must be a positive finite diffusion time"),
    (np.array([0.5, 0.5]), r"lam must be a positive finite diffusion time .*got ndarray"),
    (np.array("0.5"), r"lam must be a positive finite diffusion time .*got ndarray"),
    ("0.5", r"lam must be a positive finite diffusion time .*got str"),
    (None, r"lam must be a positive finite diffusion time .*got NoneType"),
])
def test_hypercube_bad_lambda_is_named(lam, match):
    with pytest.raises(ValueError, match=match):
        HypercubeDiffusionMask(8, lam)


@pytest.mark.parametrize("n", [np.int64(6), np.float64(8.0), "8"])
def test_hypercube_bad_n_is_named(n):
    with pytest.raises(ValueError, match=r"n must be a power of two, got"):
        HypercubeDiffusionMask(n, 0.5)
