"""fast/features.py: feature maps against reference/features.py on the same projection, the
stabiliser's structure, and gaussian_projection (orthogonality, reproducibility, RNG hygiene)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fast
import reference.features as ref_features
from tests.helpers import assert_unchanged, gen, np_, randn, unit_rows

seeds = st.integers(0, 2**31 - 1)

#: float64 elementwise maps (exp, cos, a length-d dot product): relative error a few ulps * d.
FEATURE_RTOL = 1e-12


def _assert_np_close(got: torch.Tensor, expected: np.ndarray, rtol=FEATURE_RTOL):
    np.testing.assert_allclose(np_(got), expected, rtol=rtol, atol=rtol * float(np.abs(expected).max()))


@pytest.mark.parametrize("batch", [(), (2, 3)])
@pytest.mark.parametrize(
    "make_fast, ref_name",
    [
        (lambda w: fast.FavorPlus(w, stabilize=False), "favor+"),
        (lambda w: fast.Hyperbolic(w, stabilize=False), "hyperbolic"),
        (lambda w: fast.TrigRFF(w), "trig"),
        (lambda w: fast.ReLU(), "relu"),
        (lambda w: fast.EluPlusOne(), "elu+1"),
        (lambda w: fast.Identity(), "identity"),
    ],
    ids=["favor+", "hyperbolic", "trig", "relu", "elu+1", "identity"],
)
def test_feature_maps_match_reference(make_fast, ref_name, batch):
    g = gen(4)
    x = randn((*batch, 9, 6), g, scale=0.7)
    w = fast.gaussian_projection(10, 6, generator=g, dtype=torch.float64)
    fmap = make_fast(w)
    expected = ref_features.feature_map(ref_name, np_(x), np_(w))
    for is_query in (False, True):  # without a stabiliser the role does not matter
        got = fmap(x, is_query=is_query)
        assert got.shape == expected.shape and got.dtype == torch.float64
        _assert_np_close(got, expected)


@pytest.mark.parametrize("cls", [fast.FavorPlus, fast.Hyperbolic])
def test_stabiliser_is_per_slice_for_keys_and_per_row_for_queries(cls):
    """log phi_stabilised - log phi_plain = -c, with c = max of the exponent over ONE (batch, head)
    slice for keys and over one row for queries (docs/papers.md Sec. 0, stabiliser)."""
    g = gen(5)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    # slices of very different magnitudes so that their maxima differ
    x = randn((2, 3, 7, 4), g) * torch.tensor([0.2, 1.0, 2.5], dtype=torch.float64)[None, :, None, None]
    plain, stab = cls(w, stabilize=False), cls(w, stabilize=True)
    exponent = torch.log(plain(x)) + 0.5 * math.log(plain(x).shape[-1])  # the z inside exp
    for is_query, dims in ((False, (-2, -1)), (True, (-1,))):
        shift = torch.log(stab(x, is_query=is_query)) - torch.log(plain(x))
        c = exponent.amax(dim=dims, keepdim=True)
        # the shift is -c, broadcast: constant inside each slice (keys) / row (queries)
        assert_unchanged(shift, (-c).expand_as(shift), rtol=1e-12)
        assert float(stab(x, is_query=is_query).max()) <= 1.0  # the largest exp is exp(0) / sqrt(m)
    key_c = exponent.amax(dim=(-2, -1))
    assert len(torch.unique(key_c)) == key_c.numel()  # the slices really have different constants


@pytest.mark.parametrize("halving", [True, False])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 16, 17, 24, 31, 32, 33, 48, 63, 64, 100])
def test_row_max_is_amax_exactly(monkeypatch, m, halving):
    """row_max (the stabilisers' row maxima, halving the columns at short widths on the CPU, here
    forced or kept below its size threshold) equals amax bit for bit, NaN and inf included, at
    every width, odd ones too, and never writes its input."""
    if halving:
        monkeypatch.setattr(fast.features, "ROW_MAX_HALVING_FROM", 0)
    g = gen(11)
    p = randn((2, 3, 9, m), g).float()
    p[0, 0, 1, m // 2] = float("nan")
    p[0, 1, 2, m - 1] = float("inf")
    p[1, 2, 3, 0] = -float("inf")
    before = p.clone()
    got, want = fast.features.row_max(p), p.amax(-1, keepdim=True)
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert bool(got[0, 0, 1].isnan()) and torch.equal(p.isnan(), before.isnan())
    assert torch.equal(p.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_in_place_is_exp_within_the_exponent_rounding(dtype):
    """fast.features.exp_ (2^(z log2 e) on the CPU): in place; exp(0) = 1 exactly and every result in
    [0, 1] for z <= 0 (the stabilisers' guarantee); relative error at most (2 |z| + 4) u against
    float64 exp: two roundings of the exponent (log2 e to the dtype, the product), each |z| u after
    the factor ln 2 log2 e = 1, plus the exp2's own (a few u); and the gradient is the result's."""
    u = torch.finfo(dtype).eps / 2
    spread = -torch.rand(4000, generator=gen(12), dtype=torch.float64).to(dtype) * 80
    z = torch.cat([torch.zeros(1, dtype=dtype), spread, torch.tensor([-1e-30, -87.0], dtype=dtype)])
    got = z.clone()
    assert fast.features.exp_(got) is got
    want = torch.exp(z.double())
    assert float(got[0]) == 1.0 and bool((got >= 0).all()) and bool((got <= 1).all())
    rel = ((got.double() - want).abs() / want)
    assert bool((rel <= (2 * z.double().abs() + 4) * u).all()), float((rel / ((2 * z.double().abs() + 4) * u)).max())
    leaf = z[:50].clone().requires_grad_()
    out = fast.features.exp_(leaf * 1)  # in place on a fresh non-leaf, as the features' GEMM output
    (grad,) = torch.autograd.grad(out.sum(), leaf)
    assert_unchanged(grad, out.detach(), rtol=4 * u)


@given(seed=seeds, n=st.integers(1, 6))
def test_query_features_are_rowwise(seed, n):
    """Changing one query row never changes another row's stabilised features."""
    g = gen(seed)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    x = unit_rows((n + 1, 4), g)
    fm = fast.FavorPlus(w)
    x2 = x.clone()
    x2[0] = 30.0 * x2[0]
    assert_unchanged(fm(x2, is_query=True)[1:], fm(x, is_query=True)[1:])


def test_positive_maps_are_positive_and_flags_are_right():
    g = gen(6)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=torch.float64)
    x = randn((20, 4), g, scale=2.0)
    for fmap in (fast.FavorPlus(w), fast.Hyperbolic(w), fast.EluPlusOne()):
        assert fmap.positive
        assert bool((fmap(x) > 0).all())
    for fmap in (fast.TrigRFF(w), fast.ReLU(), fast.Identity()):
        assert not fmap.positive
    assert bool((fast.TrigRFF(w)(x) < 0).any())  # the trig map can be negative: the flag matters
    assert fast.FavorPlus(w).m == 8 and fast.Hyperbolic(w)(x).shape[-1] == 16


def test_hyperbolic_kernel_identity():
    """phi(x).phi(y) = (1/m) sum_r cosh(w_r.(x+y)) exp(-(|x|^2+|y|^2)/2), exactly."""
    g = gen(7)
    w = fast.gaussian_projection(12, 5, generator=g, dtype=torch.float64)
    x, y = randn((6, 5), g, scale=0.5), randn((6, 5), g, scale=0.5)
    fm = fast.Hyperbolic(w, stabilize=False)
    got = fm(x) @ fm(y).T
    s = x[:, None, :] + y[None, :, :]
    expected = torch.cosh(s @ w.T).mean(-1) * torch.exp(-0.5 * ((x * x).sum(-1)[:, None] + (y * y).sum(-1)[None, :]))
    assert_unchanged(got, expected, rtol=1e-12)


def test_trig_kernel_identity():
    """phi(x).phi(y) = exp((|x|^2+|y|^2)/2) (1/m) sum_r cos(w_r.(x-y)): catches a cos/sin swap."""
    g = gen(8)
    w = fast.gaussian_projection(12, 5, generator=g, dtype=torch.float64)
    x, y = randn((6, 5), g, scale=0.5), randn((6, 5), g, scale=0.5)
    fm = fast.TrigRFF(w)
    got = fm(x) @ fm(y).T
    diff = x[:, None, :] - y[None, :, :]
    expected = torch.cos(diff @ w.T).mean(-1) * torch.exp(0.5 * ((x * x).sum(-1)[:, None] + (y * y).sum(-1)[None, :]))
    assert_unchanged(got, expected, rtol=1e-12)


# ----------------------------------------------------------------------- gaussian_projection


@pytest.mark.parametrize("m, d", [(8, 4), (10, 4), (3, 5), (16, 16)])
def test_orthogonal_projection_blocks(m, d):
    w = fast.gaussian_projection(m, d, orthogonal=True, generator=gen(9), dtype=torch.float64)
    assert w.shape == (m, d) and w.dtype == torch.float64
    norms = w.norm(dim=1)
    for start in range(0, m, d):
        block = w[start: start + d]
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        # QR in float64 gives orthonormal rows to ~1e-15; rescaling keeps them orthogonal
        assert float(off.abs().max()) <= 1e-12 * float(norms.max()) ** 2
    # rows carry independent chi(d) lengths, not a common length
    assert float(norms.max() - norms.min()) > 1e-3 * float(norms.max())


def test_iid_projection_is_not_orthogonal():
    """Power check for the block test above: iid rows are not orthogonal."""
    w = fast.gaussian_projection(4, 4, generator=gen(9), dtype=torch.float64)
    gram = w @ w.T
    assert float((gram - torch.diag(torch.diagonal(gram))).abs().max()) > 1e-3


@pytest.mark.parametrize("orthogonal", [False, True])
def test_projection_reproducible_from_explicit_generator(orthogonal):
    a = fast.gaussian_projection(10, 4, orthogonal=orthogonal, generator=gen(123))
    b = fast.gaussian_projection(10, 4, orthogonal=orthogonal, generator=gen(123))
    c = fast.gaussian_projection(10, 4, orthogonal=orthogonal, generator=gen(124))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("orthogonal", [False, True])
def test_projection_with_generator_leaves_global_rng_alone(orthogonal):
    before = torch.get_rng_state()
    fast.gaussian_projection(10, 4, orthogonal=orthogonal, generator=gen(1))
    assert torch.equal(torch.get_rng_state(), before)


def test_projection_without_generator_leaves_global_rng_alone():
    before = torch.get_rng_state()
    try:
        fast.gaussian_projection(10, 4)
    except (TypeError, ValueError):
        pass  # refusing to draw without an explicit generator is also acceptable
    assert torch.equal(torch.get_rng_state(), before)


def test_projection_dtype_and_device_arguments():
    w = fast.gaussian_projection(5, 3, generator=gen(0), dtype=torch.float64, device="cpu")
    assert w.dtype == torch.float64 and w.device.type == "cpu"
    w32 = fast.gaussian_projection(5, 3, generator=gen(0))
    assert w32.dtype == torch.float32  # the documented default

