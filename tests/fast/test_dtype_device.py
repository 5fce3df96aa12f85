"""dtype and device behaviour of fast/ (docs/design.md "Inputs and outputs")."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fast
from fast import CausalMask, PackingMask, PaddingMask, favor_attention, masked_linear_attention
from tests.helpers import DEVICES, GenericMask, assert_unchanged, gen, positive, randn, unit_rows

HALF = [torch.float16, torch.bfloat16]


def _masks(n):
    return {
        "none": None,
        "causal": CausalMask(n, chunk=4),
        "causal-generic": GenericMask(CausalMask(n, chunk=4)),
        "packing": PackingMask(torch.arange(n) // 3),
        "padding": PaddingMask(torch.arange(n) < max(1, n - 2)),
    }


@pytest.mark.parametrize("kind", list(_masks(1)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_keeps_input_dtype_and_device(kind, dtype):
    g = gen(0)
    n = 10
    pq, pk, v = positive((2, n, 4), g, dtype), positive((2, n, 4), g, dtype), randn((2, n, 3), g, dtype)
    out = masked_linear_attention(pq, pk, v, _masks(n)[kind])
    assert out.dtype == dtype and out.device == v.device
    q, k = unit_rows((2, n, 4), g, dtype), unit_rows((2, n, 4), g, dtype)
    w = fast.gaussian_projection(8, 4, generator=g, dtype=dtype)
    out = favor_attention(q, k, v, w, _masks(n)[kind])
    assert out.dtype == dtype and out.device == v.device
    assert fast.softmax_attention(q, k, v).dtype == dtype


@pytest.mark.parametrize("kind", list(_masks(1)))
@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_masked_linear_attention_is_float32_rounded_once(kind, dtype):
    """Half inputs accumulate in float32 and are cast back (documented): against float32 on the same
    (exactly upcast) inputs, each entry differs by at most the final rounding, u = eps/2 of the half
    type, plus float32 round-off of the sums (< 1e-5 relative for sums of 10 terms)."""
    g = gen(1)
    n = 10
    pq, pk, v = (positive((2, n, 4), g, torch.float32).to(dtype), positive((2, n, 4), g, torch.float32).to(dtype),
                 randn((2, n, 3), g, torch.float32).to(dtype))
    out = masked_linear_attention(pq, pk, v, _masks(n)[kind])
    assert out.dtype == dtype
    ref = masked_linear_attention(pq.float(), pk.float(), v.float(), _masks(n)[kind])
    u = torch.finfo(dtype).eps / 2
    bound = (u + 1e-5) * ref.abs() + torch.finfo(dtype).smallest_normal
    assert bool(((out.float() - ref).abs() <= bound).all())


def _favor_bound(q, k, v, w, mask_dense, dtype):
    """First-order-free bound on |favor_attention(half) - favor_attention(float32)| per entry.

    In the half path the FAVOR+ exponent z = w.x - |x|^2/2 (x = q d^-1/4) is formed in the half type:
    with B = max_r,i (|w_r| |x_i| + |x_i|^2 / 2), rounding of W, of the length-d sums, of z - c and of
    exp and 1/sqrt(m) give each feature a relative error delta_f <= (d + 6) u B + 3u. A weight
    a_ij = phi_q_i . phi_k_j (positive terms) then has relative error delta_a <= 2 delta_f + 2u, and a
    convex combination out_i = sum_j a_ij v_j / sum_j a_ij moves by at most
    (exp(2 delta_a) - 1) * kappa_i, kappa_i = sum_j a_ij |v_j - out_i| / sum_j a_ij; the final cast
    adds u |out_i|.
    """
    u = torch.finfo(dtype).eps / 2
    q64, k64, v64, w64 = (t.double() for t in (q, k, v, w))
    d = q.shape[-1]
    s = d**-0.25
    x = torch.cat([q64 * s, k64 * s], dim=-2)
    big_b = float((x.norm(dim=-1)[..., :, None] * w64.norm(dim=-1) + 0.5 * (x * x).sum(-1)[..., :, None]).max())
    delta_f = (d + 6) * u * big_b + 3 * u
    delta_a = 2 * delta_f + 2 * u
    fq = fast.FavorPlus(w64, stabilize=False)
    a = fq(q64 * s) @ fq(k64 * s).transpose(-1, -2)
    if mask_dense is not None:
        a = a * mask_dense
    out = (a @ v64) / a.sum(-1, keepdim=True)
    kappa = (a[..., :, :, None] * (v64[..., None, :, :] - out[..., :, None, :]).abs()).sum(-2) / a.sum(-1)[..., None]
    return (math.exp(2 * delta_a) - 1) * kappa + u * out.abs() + 1e-5 * out.abs()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_favor_attention_close_to_float32(causal, dtype):
    g = gen(2)
    n, d = 12, 8
    q, k = unit_rows((2, n, d), g, torch.float32).to(dtype), unit_rows((2, n, d), g, torch.float32).to(dtype)
    v = randn((2, n, 3), g, torch.float32).to(dtype)
    w = fast.gaussian_projection(16, d, generator=g)
    mask = CausalMask(n, chunk=5) if causal else None
    out = favor_attention(q, k, v, w, mask)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    ref = favor_attention(q.float(), k.float(), v.float(), w, mask)
    dense = torch.ones(n, n, dtype=torch.float64).tril() if causal else None
    bound = _favor_bound(q, k, v, w, dense, dtype)
    assert bool(((out.double() - ref.double()).abs() <= bound).all())


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_softmax_keeps_dtype(dtype):
    g = gen(3)
    q, k, v = (randn((2, 6, 4), g, torch.float32).to(dtype) for _ in range(3))
    out = fast.softmax_attention(q, k, v)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_feature_maps_keep_dtype(dtype):
    """Deterministic maps keep the dtype; the projected (exp) maps compute half precisions in
    float32 (docs/design.md: half precisions accumulate in float32) so their features are float32."""
    g = gen(4)
    x = randn((5, 4), g, torch.float32).to(dtype)
    w = fast.gaussian_projection(6, 4, generator=g)
    for fmap in (fast.ReLU(), fast.EluPlusOne(), fast.Identity()):
        assert fmap(x).dtype == dtype
    expected = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    for fmap in (fast.FavorPlus(w), fast.Hyperbolic(w), fast.TrigRFF(w)):
        assert fmap(x).dtype == expected


def _dense_mask(kind: str, n: int) -> torch.Tensor:
    """The (N, N) float64 matrix of each ``_masks`` kind (and of the training test's kinds except the
    learnable Toeplitz one), written out from the masks' definitions."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    pattern = {"none": torch.ones(n, n, dtype=torch.bool), "causal": j <= i, "causal-generic": j <= i,
               "dense": j <= i, "sparse": (j == i) | (j == i - 1), "packing": i // 3 == j // 3,
               "packing5": i // 5 == j // 5, "padding": (j < max(1, n - 2)).expand(n, n),
               "padding3": (j < n - 3).expand(n, n)}[kind]
    return pattern.to(torch.float64)


def _dense_attention(pq, pk, v, m):
    """sum_j M_ij (phi_q_i . phi_k_j) v_j / sum_j M_ij (phi_q_i . phi_k_j), formed densely (differentiable)."""
    a = (pq @ pk.transpose(-1, -2)) * m
    return (a @ v) / a.sum(-1, keepdim=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(_masks(1)))
def test_outputs_on_input_device(device, kind):
    """Inputs on ``device``, the mask built on CPU (its index tensors are moved by the operators): the
    output is on the inputs' device and equals dense masked attention on CPU up to float64 round-off."""
    g = gen(5)
    n = 10
    pq, pk, v = positive((2, n, 4), g), positive((2, n, 4), g), randn((2, n, 3), g)
    dq, dk, dv = (t.to(device) for t in (pq, pk, v))
    out = masked_linear_attention(dq, dk, dv, _masks(n)[kind])
    assert out.device == dv.device
    assert_unchanged(out.cpu(), _dense_attention(pq, pk, v, _dense_mask(kind, n)))


@pytest.mark.parametrize("other", [d for d in DEVICES if d != "cpu"] + ["meta"])
def test_mixed_devices_are_refused(other):
    """phi_q on ``other``, phi_k and v on CPU: ValueError before any data is read (the meta device holds
    none, so it stands in for a second device where there is no GPU)."""
    g = gen(6)
    pq, pk, v = positive((5, 3), g), positive((5, 3), g), randn((5, 2), g)
    with pytest.raises(ValueError, match="one device"):
        masked_linear_attention(pq.to(other), pk, v)


@pytest.mark.parametrize("device", DEVICES)
def test_projection_from_a_generator_on_the_device(device):
    """A generator on ``device`` draws there: W lands on ``device`` (given or not), float32 by default,
    reproducible from the seed; orthogonal=True runs the batched QR there (rows of a block orthogonal)."""
    def gdev(seed):
        return torch.Generator(device=device).manual_seed(seed)

    for orthogonal in (False, True):
        w = fast.gaussian_projection(6, 4, orthogonal=orthogonal, generator=gdev(0), device=device)
        assert w.device.type == device and w.dtype == torch.float32 and w.shape == (6, 4)
        assert np.isfinite(w.cpu().numpy()).all()
        w = fast.gaussian_projection(6, 4, orthogonal=orthogonal, generator=gdev(0))  # device=None: the generator's
        assert w.device.type == device
    a = fast.gaussian_projection(8, 4, orthogonal=True, generator=gdev(1), dtype=torch.float64)
    assert torch.equal(a, fast.gaussian_projection(8, 4, orthogonal=True, generator=gdev(1), dtype=torch.float64))
    for block in a.cpu().split(4):
        gram = block @ block.T
        norms = block.norm(dim=1)
        off = (gram - torch.diag(gram.diagonal())).abs()
        # float64 QR: orthogonality to a few u d (~1e-15) relative to the rows' lengths
        assert bool((off <= 1e-12 * norms[:, None] * norms[None, :]).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["toeplitz-learnable", "dense", "sparse", "causal", "padding", "packing"])
def test_training_matches_dense(device, kind):
    """Forward and the recomputing backward (block_cols=4: several column blocks) on ``device``, the mask
    built on CPU (the learnable Toeplitz one from log-coefficients on ``device``), equal dense masked
    attention and its autograd gradients on CPU (float64 round-off)."""
    import scipy.sparse as sp

    g = gen(7)
    n = 33
    pq, pk, v = positive((2, n, 4), g), positive((2, n, 4), g), randn((2, n, 3), g)
    b = randn((2 * n - 1,), g, scale=0.3)
    # detach: on CPU .to() returns the very input, whose requires_grad would leak into the dense pass
    leaves = [t.to(device).detach().requires_grad_() for t in (pq, pk, v, b)]
    mask = {"toeplitz-learnable": lambda: fast.ToeplitzMask.from_log_coefficients(leaves[3]),
            "dense": lambda: torch.ones(n, n, dtype=torch.float64).tril(),
            "sparse": lambda: sp.eye(n, format="csr") + sp.eye(n, k=-1, format="csr"),
            "causal": lambda: CausalMask(n, chunk=4),
            "padding": lambda: PaddingMask(torch.arange(n) < n - 3),
            "packing": lambda: PackingMask(torch.arange(n) // 5)}[kind]()
    out = masked_linear_attention(*leaves[:3], mask, block_cols=4)
    assert out.device == leaves[2].device
    out.square().sum().backward()
    assert all(t.grad is None or t.grad.device == t.device for t in leaves)

    dense_leaves = [t.detach().clone().requires_grad_() for t in (pq, pk, v, b)]
    if kind == "toeplitz-learnable":  # M_ij = exp(b[i - j + N - 1]) (offsets -(N-1)..N-1)
        offset = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1
        m = dense_leaves[3].exp()[offset]
    else:
        m = _dense_mask({"padding": "padding3", "packing": "packing5"}.get(kind, kind), n)
    ref = _dense_attention(*dense_leaves[:3], m)
    grads = torch.autograd.grad(ref.square().sum(), dense_leaves, allow_unused=True)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-10, atol=1e-12)
    for t, expected in zip(leaves, grads):
        if expected is None:  # b feeds only the Toeplitz mask
            assert t.grad is None
        else:
            torch.testing.assert_close(t.grad.cpu(), expected, rtol=1e-10, atol=1e-12)
