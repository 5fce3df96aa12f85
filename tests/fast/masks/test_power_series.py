"""fast/masks/power_series.py: Horner's M_alpha x against the dense reference and a dense torch
polynomial, the coefficient helpers against their definitions, gradients and bad input.

The Horner product sums K + 1 terms of products with W >= 0; with the normalised W (row sums ~1)
its round-off is a few u K of sum_k |alpha_k| W^k |x|, so comparisons allow 1e-12 (float64) and
1e-5 (float32) of that scale (abs_matmul gives it)."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import reference.masks.power_series as ref
from fast import masked_linear_attention
from fast.graphs import as_graph, normalized_adjacency
from fast.masks.power_series import (
    PowerSeriesMask,
    check_series_radius,
    convolve,
    deconvolve,
    diffusion_alpha,
    heat_alpha,
    regularised_laplacian_alpha,
    regularised_laplacian_radius,
    spectral_radius_bounds,
)
from reference.graphs import adjacency as ref_adjacency
from reference.graphs import normalized_adjacency as ref_normalized
from tests.helpers import DEVICES

RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _graphs():
    rng = np.random.default_rng(1)
    g = nx.gnm_random_graph(30, 70, seed=2)
    for u, v in g.edges:
        g[u][v]["weight"] = float(rng.uniform(0.2, 2.0))
    mixed = sp.block_diag([np.array([[1.0, 2, 0], [2, 0, 1], [0, 1, 0]]), np.zeros((2, 2)),
                           nx.to_numpy_array(nx.cycle_graph(5))])
    return {
        "path": nx.path_graph(17),
        "grid": nx.convert_node_labels_to_integers(nx.grid_2d_graph(4, 6)),
        "weighted": g,
        "mixed": sp.csr_matrix(mixed),  # self-loop, isolated nodes, several components
        "karate": nx.Graph(list(nx.karate_club_graph().edges())),
    }


GRAPHS = _graphs()
ALPHAS = {"positive": [0.5, 0.3, 0.2, 0.1, 0.05], "signed": [1.0, -0.7, 0.4, -0.2], "constant": [2.5]}


def _x(n, c=3, seed=0, dtype=torch.float64, lead=()):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, n, c, generator=g, dtype=torch.float64).to(dtype)


def _assert_close(op, got, expected, x):
    scale = op.abs_matmul(x.abs().double())
    err = (got.double() - expected).abs()
    assert bool((err <= RTOL[x.dtype] * scale + 1e-300).all()), float((err / scale).nan_to_num().max())


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("alpha", list(ALPHAS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference(graph, alpha, dtype):
    g = normalized_adjacency(as_graph(GRAPHS[graph]))
    w_ref = ref_normalized(ref_adjacency(GRAPHS[graph]))
    m = torch.as_tensor(ref.power_series_mask(w_ref, ALPHAS[alpha]))
    op = PowerSeriesMask(g, torch.tensor(ALPHAS[alpha], dtype=dtype))
    x = _x(g.n, dtype=dtype)
    y = op.matmul(x)
    assert y.dtype == dtype and y.shape == x.shape
    _assert_close(op, y, m @ x.double(), x)
    _assert_close(op, op.rmatmul(x), m.T @ x.double(), x)
    assert op.nonnegative == (alpha != "signed")


def test_horner_equals_dense_torch_polynomial_unnormalised_w():
    """W used as given (here the raw weighted adjacency, spectral radius > 1); batched leading dims."""
    g = as_graph(GRAPHS["weighted"])
    w = g.csr().to_dense()
    alpha = torch.tensor([0.3, -0.1, 0.02, 0.004], dtype=torch.float64)
    dense = sum(a * torch.linalg.matrix_power(w, k) for k, a in enumerate(alpha))
    x = _x(30, c=2, lead=(2, 3))
    op = PowerSeriesMask(g, alpha)
    torch.testing.assert_close(op.matmul(x), dense @ x, rtol=1e-12, atol=1e-12)
    assert op.terms == 3


def test_abs_matmul_bounds_signed_mask():
    g = normalized_adjacency(as_graph(GRAPHS["karate"]))
    alpha = torch.tensor(ALPHAS["signed"], dtype=torch.float64)
    w = g.csr().to_dense()
    dense_abs = sum(abs(float(a)) * torch.linalg.matrix_power(w, k) for k, a in enumerate(alpha))
    x = _x(34).abs()
    torch.testing.assert_close(PowerSeriesMask(g, alpha).abs_matmul(x), dense_abs @ x, rtol=1e-12, atol=1e-14)
    m = torch.as_tensor(ref.power_series_mask(ref_normalized(ref_adjacency(GRAPHS["karate"])), alpha.numpy()))
    assert bool((m.abs() <= dense_abs + 1e-15).all())


def test_alpha_is_held_not_copied():
    g = normalized_adjacency(as_graph(GRAPHS["grid"]))
    alpha = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    op = PowerSeriesMask(g, alpha)
    assert op.alpha is alpha and list(op.parameters()) == [alpha]
    x = _x(24)
    with torch.no_grad():
        alpha[1] = -0.5
    assert not op.nonnegative
    w = g.csr().to_dense()
    torch.testing.assert_close(op.matmul(x).detach(), 0.5 * x - 0.5 * (w @ x), rtol=1e-13, atol=1e-13)


def test_nonnegative_is_cached_per_alpha_version():
    """``nonnegative`` reads alpha (a host sync on CUDA) only when alpha._version changed: every
    in-place update is seen, and an unchanged alpha is not re-read (shown by an edit through
    .data, which the version counter misses, until refresh_sign())."""
    g = normalized_adjacency(as_graph(GRAPHS["grid"]))
    alpha = torch.tensor([0.5, 0.25], dtype=torch.float64)
    op = PowerSeriesMask(g, alpha)
    assert op.nonnegative
    alpha.mul_(-1.0)
    assert not op.nonnegative
    alpha.abs_()
    assert op.nonnegative
    alpha[1] = -1e-300
    assert not op.nonnegative
    alpha.data[1] = 0.0  # bypasses the version counter: the cached sign stays
    assert not op.nonnegative
    assert op.refresh_sign() and op.nonnegative
    learn = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    op = PowerSeriesMask(g, learn)
    assert op.nonnegative
    opt = torch.optim.SGD([learn], lr=1.0)
    (op.matmul(_x(24)).sum() * 10).backward()
    opt.step()  # an optimiser step is an in-place update too
    assert op.nonnegative == bool((learn.detach() >= 0).all())
    with torch.no_grad():
        learn.fill_(-1.0)
    assert not op.nonnegative


def test_factorisation_through_the_operator():
    """M_convolve(f) x = Phi (Phi x) with Phi = sum_k f_k W^k (reid25: M_alpha = Phi Phi^T)."""
    g = normalized_adjacency(as_graph(GRAPHS["path"]))
    f = torch.tensor([0.8, 0.4, -0.1], dtype=torch.float64)
    phi = PowerSeriesMask(g, f)
    x = _x(17)
    torch.testing.assert_close(PowerSeriesMask(g, convolve(f)).matmul(x), phi.matmul(phi.matmul(x)),
                               rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------- coefficients


def test_deconvolve_convolve_round_trip_and_reference():
    gen = torch.Generator().manual_seed(3)
    for k in (0, 1, 4, 10):
        f = torch.randn(k + 1, generator=gen, dtype=torch.float64)
        f[0] = f[0].abs() + 0.1
        torch.testing.assert_close(deconvolve(convolve(f, k_max=k)), f, rtol=1e-12, atol=1e-12)
        full = deconvolve(convolve(f))
        torch.testing.assert_close(full[: k + 1], f, rtol=1e-12, atol=1e-12)
        assert bool((full[k + 1:].abs() < 1e-11).all())
        np.testing.assert_allclose(convolve(f).numpy(), ref.convolve(f.numpy()), rtol=1e-14, atol=1e-15)
        alpha = f.abs() + 0.05
        np.testing.assert_allclose(deconvolve(alpha).numpy(), ref.deconvolve(alpha.numpy()), rtol=1e-12, atol=1e-14)
    assert convolve(torch.tensor([1.0, 2.0]), k_max=4).tolist() == [1.0, 4.0, 4.0, 0.0, 0.0]


def test_heat_deconvolution_and_named_kernels():
    for beta in (0.5, 2.0, -1.0):
        f = deconvolve(heat_alpha(beta, 12))
        expected = torch.tensor([(beta / 2) ** k / math.factorial(k) for k in range(13)], dtype=torch.float64)
        torch.testing.assert_close(f, expected, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(heat_alpha(beta, 30).numpy(), ref.heat_alpha(beta, 30), rtol=1e-13)
        np.testing.assert_allclose(diffusion_alpha(beta, 30).numpy(), ref.diffusion_alpha(beta, 30), rtol=1e-13)
    np.testing.assert_allclose(regularised_laplacian_alpha(0.7, 25).numpy(), ref.regularised_laplacian_alpha(0.7, 25),
                               rtol=1e-13)
    assert float(heat_alpha(2.0, 300)[-1]) == pytest.approx(math.exp(300 * math.log(2.0) - math.lgamma(301)), rel=1e-10)


def test_spectral_radius_bounds_bracket_the_eigenvalue():
    for name in ("karate", "weighted", "mixed", "path"):
        rho = ref.spectral_radius(ref_adjacency(GRAPHS[name]))
        lo, hi = spectral_radius_bounds(as_graph(GRAPHS[name]))
        assert lo <= rho * (1 + 1e-12) and rho <= hi * (1 + 1e-12)
        assert hi - lo <= 1e-6 * rho
    lo, hi = spectral_radius_bounds(normalized_adjacency(as_graph(GRAPHS["karate"])))
    assert lo <= 1 + 1e-12 <= hi + 2e-12 and hi - lo < 1e-6
    assert spectral_radius_bounds(as_graph(sp.csr_matrix((3, 3)))) == (0.0, 0.0)


def test_divergence_error_names_the_radius():
    a = as_graph(GRAPHS["karate"])  # rho = 6.7257
    assert regularised_laplacian_radius(0.2) == 6.0
    with pytest.raises(ValueError, match=r"converges for spectral radius\(W\) < 6\.0 .*spectral radius is 6\.725"):
        regularised_laplacian_alpha(0.2, 5, graph=a)
    lo, hi = check_series_radius(a, 11.0)
    assert hi < 11.0
    assert regularised_laplacian_alpha(0.1, 3, graph=a).shape == (4,)
    # the normalised adjacency (rho = 1) converges for every sigma2
    regularised_laplacian_alpha(1e3, 3, graph=normalized_adjacency(a))


# ---------------------------------------------------------------------------- autograd


def test_gradcheck_alpha_and_x():
    g = normalized_adjacency(as_graph(GRAPHS["mixed"]))
    x0 = _x(g.n, c=2, seed=5)

    def f(alpha, x):
        return PowerSeriesMask(g, alpha).matmul(x)

    alpha = torch.tensor([0.4, -0.3, 0.2, 0.1], dtype=torch.float64, requires_grad=True)
    x = x0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (alpha, x))
    assert torch.autograd.gradcheck(lambda f_: PowerSeriesMask(g, convolve(f_)).matmul(x0),
                                    (torch.tensor([0.9, 0.2, -0.1], dtype=torch.float64, requires_grad=True),))


def test_learnable_alpha_through_masked_linear_attention():
    g = normalized_adjacency(as_graph(GRAPHS["grid"]))
    gen = torch.Generator().manual_seed(0)
    q, k = torch.rand(24, 4, generator=gen, dtype=torch.float64), torch.rand(24, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(24, 3, generator=gen, dtype=torch.float64)
    alpha = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64, requires_grad=True)
    out = masked_linear_attention(q, k, v, mask=PowerSeriesMask(g, alpha))
    dense_alpha = alpha.detach().clone().requires_grad_(True)
    w = g.csr().to_dense()
    dense = dense_alpha[0] * torch.eye(24, dtype=torch.float64) + dense_alpha[1] * w + dense_alpha[2] * (w @ w)
    out_d = masked_linear_attention(q, k, v, mask=dense)
    torch.testing.assert_close(out, out_d, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    out_d.sum().backward()
    torch.testing.assert_close(alpha.grad, dense_alpha.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_device_matches_reference(device):
    """The operator built from a Graph and alpha on ``device`` keeps x's device and dtype and matches the
    dense reference within the Horner bound (abs_matmul's scale from the CPU operator); the spectral
    radius bounds, computed there, bracket rho = 1 of the normalised adjacency."""
    g = normalized_adjacency(as_graph(GRAPHS["weighted"]))
    alpha = torch.tensor(ALPHAS["signed"], dtype=torch.float64)
    m = torch.as_tensor(ref.power_series_mask(ref_normalized(ref_adjacency(GRAPHS["weighted"])), ALPHAS["signed"]))
    cpu = PowerSeriesMask(g, alpha)
    op = PowerSeriesMask(g.to(device), alpha.to(device))
    x = _x(30, c=4)
    for dtype in (torch.float64, torch.float32):
        xd = x.to(dtype)
        y = op.matmul(xd.to(device))
        assert y.device.type == device and y.dtype == dtype
        _assert_close(cpu, y.cpu(), m @ xd.double(), xd)
    lo, hi = spectral_radius_bounds(g.to(device))
    assert lo <= 1 + 1e-9 and hi >= 1 - 1e-9


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("alpha, error, match", [
    ([], ValueError, "non-empty 1-D"),
    (torch.zeros(0), ValueError, "non-empty 1-D"),
    (torch.ones(2, 2), ValueError, "non-empty 1-D"),
    (torch.tensor(1.0), ValueError, "non-empty 1-D"),
    ([1.0, math.nan], ValueError, "non-finite"),
    (torch.tensor([1.0, math.inf]), ValueError, "non-finite"),
    (torch.tensor([1j]), TypeError, "real"),
    (["a"], TypeError, "real"),
])
def test_rejects_bad_alpha(alpha, error, match):
    with pytest.raises(error, match=match):
        PowerSeriesMask(as_graph(GRAPHS["path"]), alpha)


def test_rejects_bad_input():
    g = as_graph(GRAPHS["path"])
    op = PowerSeriesMask(g, [1.0, 0.5])
    with pytest.raises(ValueError, match="N=17"):
        op.matmul(torch.zeros(16, 2))
    with pytest.raises(TypeError, match="floating"):
        op.matmul(torch.zeros(17, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="not symmetric"):
        PowerSeriesMask(sp.csr_matrix(np.array([[0, 1.0], [0, 0]])), [1.0])
    with pytest.raises(ValueError, match="alpha_0 > 0"):
        deconvolve([0.0, 1.0])
    with pytest.raises(ValueError, match="k_max"):
        convolve([1.0], k_max=-1)
    with pytest.raises(ValueError, match="sigma2 must be >= 0"):
        regularised_laplacian_alpha(-1.0, 3)
    with pytest.raises(ValueError, match="beta must be a finite real"):
        heat_alpha(math.nan, 3)


def test_inference_mode_alpha_reads_its_sign_every_time():
    """An alpha made under torch.inference_mode has no version counter: the sign is re-read."""
    from verify.problems import path_graph

    g = as_graph(path_graph(20))
    with torch.inference_mode():
        alpha = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
        op = PowerSeriesMask(g, alpha)
        assert op.nonnegative
        alpha[1] = -0.5
        assert not op.nonnegative


# ------------------------------------------------------------ per-key stabilised attend (numerics)


@pytest.mark.parametrize("alpha", [[0.5, 0.3, 0.2, 0.1, 0.05], [0.0, 1.0], [0.0, 0.0, 1.0], [2.5]])
@pytest.mark.parametrize("graph", ["grid", "weighted", "mixed"])
def test_stabilised_attend_equals_the_true_products(graph, alpha):
    """Including alpha_k = 0 (alpha = (0, 1): M = W, a row without self-loop must not take its own
    key's constant) and the mixed graph's isolated nodes (rows of M = W that see no key: (0, 0))."""
    from tests.fast.masks.test_grf import check_stabilised_attend

    mask = PowerSeriesMask(normalized_adjacency(as_graph(GRAPHS[graph])), torch.tensor(alpha, dtype=torch.float64))
    assert mask.rescales_keys
    for lead in [(2, 3), ()]:
        check_stabilised_attend(mask, lead=lead, spread=3.0)
    check_stabilised_attend(mask, spread=40.0)


def test_stabilised_float32_matches_float64_where_the_slice_max_underflows():
    from tests.fast.masks.test_grf import check_far_keys

    check_far_keys(PowerSeriesMask(normalized_adjacency(as_graph(nx.path_graph(40))), heat_alpha(1.0, 4)), n=40)


def test_stabilised_attend_gradcheck_with_alpha():
    from tests.fast.masks.test_grf import stabilised_inputs

    g = normalized_adjacency(as_graph(GRAPHS["mixed"]))
    z, phi_q, v = stabilised_inputs(g.n, (2,), m=2, d=2, spread=3.0, seed=7)
    c = z.amax(-1, keepdim=True)
    alpha = torch.tensor([0.5, 0.3, 0.0, 0.1], dtype=torch.float64, requires_grad=True)
    inputs = (phi_q.requires_grad_(True), torch.exp(z - c).requires_grad_(True), v.requires_grad_(True))

    def attend(pq, pk, vv, a):
        return PowerSeriesMask(g, a).attend(pq, pk, vv, key_log_scale=c)

    assert torch.autograd.gradcheck(attend, (*inputs, alpha))
    # constant alpha: the adjoint backward (the per-call operator's rmatmul)
    assert torch.autograd.gradcheck(lambda pq, pk, vv: attend(pq, pk, vv, alpha.detach()), inputs)


def test_signed_alpha_keeps_one_constant_per_slice():
    from tests.fast.masks.test_grf import check_stabilised_attend, stabilised_inputs

    mask = PowerSeriesMask(normalized_adjacency(as_graph(GRAPHS["grid"])), ALPHAS["signed"])
    z, _, _ = stabilised_inputs(mask.n)
    c = mask.key_stabilizer(z)
    assert torch.equal(c, z.amax(dim=(-2, -1), keepdim=True))
    check_stabilised_attend(mask, units=False)


def test_no_key_rows_through_favor_attention():
    """M = W on a graph with isolated nodes: their rows see no key; no_key="zero" gives 0 there and
    the other rows equal the float64 dense products; "raise" raises."""
    from fast import DenominatorError, favor_attention
    from tests.fast.masks.test_grf import far_keys_inputs

    mask = PowerSeriesMask(normalized_adjacency(as_graph(GRAPHS["mixed"])), [0.0, 1.0])
    q, k, v, w = far_keys_inputs(mask.n, top=4.0)
    out = favor_attention(q.float(), k.float(), v.float(), w.float(), mask, no_key="zero")
    empty = mask.matmul(torch.ones(mask.n, 1, dtype=torch.float64))[:, 0] == 0
    assert bool(empty.any()) and bool((out[..., empty, :] == 0).all())
    want = favor_attention(q, k, v, w, mask, no_key="zero")
    assert float((out.double() - want).abs().max()) <= 1e-4 * float(want.abs().max())
    with pytest.raises(DenominatorError):
        favor_attention(q, k, v, w, mask)


# ------------------------------------------------------------------ clear refusals (issue 24)


def test_series_helpers_refuse_bad_arguments_naming_them():
    from fast.masks.power_series import check_series_radius, heat_alpha, spectral_radius_bounds

    path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    for kw, match in (({"max_iter": "abc"}, r"max_iter must be an int >= 1"), ({"max_iter": 0}, r"max_iter must be"),
                      ({"rtol": None}, r"rtol must be a finite real number"), ({"rtol": -1.0}, r"rtol must be a real >= 0"),
                      ({"stop_below": "x"}, r"stop_below must be None or a real number")):
        with pytest.raises(ValueError, match=match):
            spectral_radius_bounds(path, **kw)
    for radius in ("abc", None, 0.0, float("nan")):
        with pytest.raises(ValueError, match=r"radius must be a positive real"):
            check_series_radius(path, radius)
    with pytest.raises(MemoryError, match=r"k_max = 10000000000000 asks for 2 x the series coefficients"):
        heat_alpha(1.0, 10**13)
