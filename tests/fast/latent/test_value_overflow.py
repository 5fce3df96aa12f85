"""The latent-graph attentions on values whose sums overflow where the output does not (issue 24).

Every output here is an average of v's entries (DIFFormer's and SGFormer's scores are >= 0; the
kernelized softmax's are kernel weights; the Gumbel form averages K such outputs), so it is finite
for any finite v, while the sums inside reach N max |v| (K max |v| for the mean over samples).
Constant values give the exact answer (that value); random values near the maximum are compared
with the float64 reference (float32 inputs) or with 2^k f(v 2^-k), which is exact (float64).
"""
from __future__ import annotations

import pytest
import torch

import fast.segments as segments
import reference.latent.simple_attention as ref
from fast import gaussian_projection
from fast.latent.nodeformer import (gumbel_noise, kernelized_gumbel_softmax, kernelized_softmax,
                                    nodeformer_attention)
from fast.latent.simple_attention import difformer_attention, sgformer_attention
from fast.scaling import times_pow2
from tests.helpers import EQUIV_TOL, gen, np_, rel_frobenius

SIMPLE = {"difformer": (difformer_attention, ref.difformer_attention),
          "sgformer": (sgformer_attention, ref.sgformer_attention)}
#: the largest float32 / float64 constants of the issue's kind: N max |v| overflows at these N
CONSTANTS = [(torch.float32, 12, 3e38), (torch.float32, 2048, 2e35), (torch.float32, 12, torch.finfo(torch.float32).max),
             (torch.float64, 12, 1.7e308), (torch.float64, 2048, 1e305), (torch.float64, 2048, torch.finfo(torch.float64).max)]


@pytest.fixture(params=["few graphs", "many graphs"])
def route(request, monkeypatch):
    """few: a loop over each graph's contiguous slice (the default); many: the segment-sum routes."""
    if request.param == "many graphs":
        monkeypatch.setattr(segments, "FEW_SEGMENTS", 0)
    return request.param


def rel_error_bound(n: int, terms: int, dtype: torch.dtype) -> float:
    """Worst-case relative error of an average over n nodes whose num and den each sum at most
    n * terms products (gamma_{n terms + 2} each, plus the quotient's rounding)."""
    return 2 * (n * terms + 3) * torch.finfo(dtype).eps / 2


def near_max(shape, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    big = torch.finfo(dtype).max
    mag = (0.25 + 0.75 * torch.rand(*shape, generator=g, dtype=torch.float64)) * big
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mag).to(dtype)


def qk(n: int, dtype: torch.dtype, lead=(), d_qk: int = 4, seed: int = 0):
    g = gen(seed)
    return (torch.randn(*lead, n, d_qk, generator=g, dtype=dtype) + 1.0,
            torch.randn(*lead, n, d_qk, generator=g, dtype=dtype) + 1.0)


# SGFormer's weights may be negative (q~ . k~ < 0), so its z is no average and is not clamped to v's
# range: at the maximum itself, round-off may carry it past (DIFFormer's is clamped)
@pytest.mark.parametrize("name, dtype, n, val", [(name, *c) for name in SIMPLE for c in CONSTANTS
                                                 if name == "difformer" or c[2] != torch.finfo(c[0]).max])
def test_simple_attention_of_constant_values_is_that_value(name, dtype, n, val):
    q, k = qk(n, dtype)
    out = SIMPLE[name][0](q, k, torch.full((n, 3), val, dtype=dtype))
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rel_error_bound(n, 4, dtype)


@pytest.mark.parametrize("name", list(SIMPLE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_simple_attention_batched_near_max_against_reference(name, dtype, route):
    fn, dense = SIMPLE[name]
    sizes = (5, 40, 9)
    batch = torch.repeat_interleave(torch.tensor([0, 1, 3]), torch.tensor(sizes))  # label 2: an empty graph
    n = sum(sizes)
    q, k = qk(n, dtype, lead=(2, 2))
    v = near_max((2, 2, n, 3), gen(1), dtype)
    out = fn(q, k, v, batch=batch)
    assert torch.isfinite(out).all()
    e = 0 if dtype == torch.float32 else 600  # float64: the reference on v 2^-600, compared so (exact)
    want = dense(np_(q), np_(k), np_(v) * 2.0 ** -e, batch=batch.numpy())
    assert rel_frobenius(out.double() * 2.0 ** -e, want) <= EQUIV_TOL[dtype]  # the norms overflow unscaled


def test_sgformer_own_value_term_alone_overflows():
    """N v_u overflows before the division while every other sum stays finite (the issue's N = 2048,
    v = 2e35 in float32: 2048 * 2e35 > 3.4e38), so the common path's own flags must see it."""
    n, val = 2048, 2e35
    q, k = qk(n, torch.float32, seed=3)
    out = sgformer_attention(q, k, torch.full((n, 2), val))
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rel_error_bound(n, 4, torch.float32)


@pytest.mark.parametrize("dtype, n, val", CONSTANTS)
def test_kernelized_softmax_of_constant_values_is_that_value(dtype, n, val):
    q, k = (0.1 * t for t in qk(n, dtype))  # a flat kernel: den_i near N m, so N = 2048 overflows at 2e35
    w = gaussian_projection(16, 4, generator=gen(2), dtype=dtype)
    out = kernelized_softmax(q, k, torch.full((n, 3), val, dtype=dtype), w)
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rel_error_bound(n, 16, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernelized_softmax_is_homogeneous_in_huge_values(dtype, route):
    n, k_ = 60, 64 if dtype == torch.float32 else 512
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([10, 30, 20]))
    q, k = qk(n, dtype, lead=(2,))
    w = gaussian_projection(8, 4, generator=gen(3), dtype=dtype)
    v = near_max((2, n, 3), gen(4), dtype)
    out = kernelized_softmax(q, k, v, w, tau=0.5, batch=batch)
    want = times_pow2(kernelized_softmax(q, k, times_pow2(v, torch.tensor(-k_)), w, tau=0.5, batch=batch),
                      torch.tensor(k_))
    assert torch.isfinite(out).all() and torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("at_max", [False, True])
def test_gumbel_mean_over_samples_of_huge_values(dtype, at_max):
    """The mean over K = 10 samples sums 10 outputs near the maximum: each is finite, their sum is not.
    At the maximum itself the mean's round-off must not carry it past (it is clamped to v's range)."""
    n = 30
    q, k = qk(n, dtype)
    w = gaussian_projection(8, 4, generator=gen(5), dtype=dtype)
    noise = gumbel_noise((10, n), generator=gen(6), dtype=dtype)
    val = torch.finfo(dtype).max if at_max else 3e38 if dtype == torch.float32 else 1.7e308
    out = kernelized_gumbel_softmax(q, k, torch.full((n, 3), val, dtype=dtype), w, noise=noise)
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rel_error_bound(n, 8, dtype) + 10 * torch.finfo(dtype).eps
    v = near_max((n, 3), gen(7), dtype)
    e = 16 if dtype == torch.float32 else 128
    out = kernelized_gumbel_softmax(q, k, v, w, noise=noise)
    want = times_pow2(kernelized_gumbel_softmax(q, k, times_pow2(v, torch.tensor(-e)), w, noise=noise), torch.tensor(e))
    assert torch.isfinite(out).all() and torch.equal(out, want)


def test_gumbel_mean_of_ordinary_values_unchanged():
    """Values far from the maximum take no shift: the mean is the plain one, bit for bit."""
    n = 30
    q, k = qk(n, torch.float32)
    w = gaussian_projection(8, 4, generator=gen(5))
    noise = gumbel_noise((10, n), generator=gen(6))
    v = torch.randn(n, 3, generator=gen(8))
    out = kernelized_gumbel_softmax(q, k, v, w, noise=noise)
    per_sample = torch.stack([kernelized_gumbel_softmax(q, k, v, w, noise=noise[i:i + 1]) for i in range(10)])
    assert torch.allclose(out, per_sample.mean(0), rtol=1e-6, atol=1e-7)


def test_nodeformer_attention_of_huge_values():
    n, val = 12, 3e38
    q, k = qk(n, torch.float32)
    w = gaussian_projection(8, 4, generator=gen(9))
    out = nodeformer_attention(q, k, torch.full((n, 2), val), w, gumbel=False)
    assert torch.isfinite(out).all()
    assert float(((out.double() - val) / val).abs().max()) <= rel_error_bound(n, 8, torch.float32)


def star(n: int) -> torch.Tensor:
    """Edges of a star with centre 0: the centre's row of D^-1/2 A D^-1/2 sums to sqrt(n - 1)."""
    leaves = torch.arange(1, n)
    return torch.stack([torch.cat([torch.zeros(n - 1, dtype=torch.long), leaves]),
                        torch.cat([leaves, torch.zeros(n - 1, dtype=torch.long)])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("order", [1, 2])
def test_relational_bias_gate_shrinks_an_overflowing_product(dtype, order):
    """A~ v overflows at the star's centre (sqrt(49) max |v|) while sigmoid(-5) A~ v is finite."""
    import reference.latent.nodeformer as ref_nf
    from fast.latent.nodeformer import relational_bias
    n = 50
    edges = star(n)
    v = near_max((n, 3), gen(10), dtype).abs()
    out = relational_bias(v, edges, -5.0, order=order)
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj[edges[0], edges[1]] = 1.0
    e = 0 if dtype == torch.float32 else 600  # float64: the reference on v 2^-600, compared so (exact)
    want = ref_nf.relational_bias(np_(v) * 2.0 ** -e, adj.numpy(), -5.0, order=order)
    assert torch.isfinite(out).all()
    assert rel_frobenius(out.double() * 2.0 ** -e, want) <= EQUIV_TOL[dtype]


def test_nodeformer_attention_bias_term_of_huge_values():
    n = 50
    q, k = qk(n, torch.float32)
    w = gaussian_projection(8, 4, generator=gen(11))
    v = torch.full((n, 2), 3e38)
    out = nodeformer_attention(q, k, v, w, graph=star(n), b=-6.0, gumbel=False)
    bias = torch.sigmoid(torch.tensor(-6.0, dtype=torch.float64)) * torch.full((n, 2), 3e38, dtype=torch.float64)
    bias[0] *= (n - 1) ** 0.5  # the centre: sqrt(49) times the leaves' value
    bias[1:] /= (n - 1) ** 0.5  # a leaf: its one neighbour (the centre, degree 49) over sqrt(49)
    want = float(v[0, 0]) + bias  # kernelized softmax of a constant is that constant
    assert torch.isfinite(out).all()
    assert float(((out.double() - want) / want).abs().max()) <= rel_error_bound(n, 8, torch.float32)


def test_bfloat16_values_near_float32s_maximum():
    """bfloat16 reaches float32's range: its sums overflow the float32 compute dtype like float32's."""
    n = 40
    q, k = (t.bfloat16() for t in qk(n, torch.float32))
    w = gaussian_projection(8, 4, generator=gen(12)).bfloat16()
    v = torch.full((n, 3), 3e38).bfloat16()
    for out in (difformer_attention(q, k, v), sgformer_attention(q, k, v), kernelized_softmax(q, k, v, w),
                kernelized_gumbel_softmax(q, k, v, w, generator=gen(13))):
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert float(((out.double() - v.double()) / v.double()).abs().max()) <= 2 ** -7  # bfloat16's eps
