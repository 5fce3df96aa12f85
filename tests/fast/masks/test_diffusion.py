"""fast/masks/diffusion.py: exp(-lam T) x by uniformized Taylor series against scipy's dense expm.

Tolerances come from the module's a priori bound: ||y - M x||_1 <= error_bound * norm_bound * ||x||_1
per column (infinity-norm for rmatmul), plus round-off of about u * (products) of that scale.
"""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from fast import masked_linear_attention
from fast.graphs import as_graph
from fast.masks.diffusion import KINDS, DiffusionMask, expm_action, plan_terms, poisson_tail
from reference.masks.diffusion import diffusion_mask, generator_matrix, random_walk_series

# ---------------------------------------------------------------------------- graphs (scipy csr)


def _csr(g: nx.Graph) -> sp.csr_matrix:
    return sp.csr_matrix(nx.to_scipy_sparse_array(g, nodelist=sorted(g.nodes), weight="weight", dtype=np.float64))


def path(n=12):
    return _csr(nx.path_graph(n))


def grid(a=5, b=7):
    return _csr(nx.convert_node_labels_to_integers(nx.grid_2d_graph(a, b)))


def regular(n=20, d=4, seed=3):
    return _csr(nx.random_regular_graph(d, n, seed=seed))


def weighted(n=16, seed=5):
    rng = np.random.default_rng(seed)
    g = nx.gnm_random_graph(n, 3 * n, seed=seed)
    for u, v in g.edges:
        g[u][v]["weight"] = float(rng.uniform(0.1, 3.0))
    return _csr(g)


def isolated_loops_components():
    """Two components (a triangle with a weighted self-loop, a 4-path), two isolated nodes."""
    tri = np.array([[0.5, 1, 1], [1, 0, 2.0], [1, 2.0, 0]])
    p4 = nx.to_numpy_array(nx.path_graph(4))
    return sp.csr_matrix(sp.block_diag([tri, np.zeros((1, 1)), p4, np.zeros((1, 1))]))


GRAPHS = {"path": path, "grid": grid, "regular": regular, "weighted": weighted, "mixed": isolated_loops_components}


def _x(n, c=3, seed=0, dtype=torch.float64, lead=()):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, n, c, generator=g, dtype=torch.float64).to(dtype)


def _col_err(y, ref, x, norm: str = "1"):
    """max over columns of ||y - ref|| / ||x|| in the 1- or infinity-norm (over the node axis)."""
    d = (y.detach() - ref).abs()
    if norm == "1":
        return float((d.sum(-2) / x.abs().sum(-2)).max())
    return float((d.amax(-2) / x.abs().amax(-2)).max())


# ---------------------------------------------------------------------------- against the dense reference


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lam", [0.0, 0.4, 3.0])
def test_matches_dense_expm_float64(graph, kind, lam):
    adj = GRAPHS[graph]()
    m = torch.as_tensor(diffusion_mask(adj, lam, kind))
    op = DiffusionMask(adj, lam, kind, tol=1e-12)
    x = _x(adj.shape[0])
    g = op.norm_bound
    assert _col_err(op.matmul(x), m @ x, x) <= 1e-10 * g
    assert _col_err(op.rmatmul(x), m.T @ x, x, "inf") <= 1e-10 * g
    if kind != "random-walk":  # symmetric kernels: both norms hold for both products
        assert _col_err(op.matmul(x), m @ x, x, "inf") <= 1e-10 * g
        assert torch.allclose(op.rmatmul(x), op.matmul(x), rtol=0, atol=1e-13 * g)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_dense_expm_float32(kind):
    adj = isolated_loops_components()
    m = torch.as_tensor(diffusion_mask(adj, 1.5, kind))
    x = _x(adj.shape[0], dtype=torch.float32)
    op = DiffusionMask(adj, 1.5, kind, tol=1e-7)
    y = op.matmul(x)
    assert y.dtype == torch.float32
    assert _col_err(y.double(), m @ x.double(), x.double()) <= 1e-5 * op.norm_bound
    half = op.matmul(x.half())  # half computes in float32
    assert half.dtype == torch.float16
    assert _col_err(half.double(), m @ x.half().double(), x.half().double()) <= 2e-3 * op.norm_bound


@pytest.mark.parametrize("kind", KINDS)
def test_batched_leading_dims(kind):
    adj = grid(3, 4)
    op = DiffusionMask(adj, 0.7, kind)
    x = _x(12, c=2, lead=(2, 3))
    y = op.matmul(x)
    assert y.shape == x.shape
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(y[i, j], op.matmul(x[i, j]), rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------- the a priori bound


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12])
def test_error_within_bound(kind, tol):
    adj = weighted()
    lam = 2.5
    m = torch.as_tensor(diffusion_mask(adj, lam, kind))
    op = DiffusionMask(adj, lam, kind, tol=tol)
    assert 0 < op.error_bound <= tol
    assert op.products == op.steps * op.terms
    x = _x(adj.shape[0], c=4, seed=1)
    roundoff = 50 * 2.2e-16 * op.products
    assert _col_err(op.matmul(x), m @ x, x) <= (op.error_bound + roundoff) * op.norm_bound
    assert _col_err(op.rmatmul(x), m.T @ x, x, "inf") <= (op.error_bound + roundoff) * op.norm_bound


@pytest.mark.parametrize("kind", ["laplacian", "random-walk"])
@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6])
def test_bound_is_attained_for_a_point_mass(kind, tol):
    """For x = e_i >= 0 and a column-stochastic Bh, the omitted mass is exactly P(Poisson(theta) > m)
    (one step): the bound is not loose, and the series' terms are what the module says."""
    adj = grid(4, 4)
    op = DiffusionMask(adj, 2.0, kind, tol=tol)
    assert op.steps == 1
    x = torch.zeros(16, 1, dtype=torch.float64)
    x[5] = 1.0
    m = torch.as_tensor(diffusion_mask(adj, 2.0, kind))
    err = float((m @ x - op.matmul(x)).sum())  # every omitted term is >= 0
    assert err == pytest.approx(op.error_bound, rel=1e-6)


def test_forced_steps_meet_the_bound():
    adj = regular()
    m = torch.as_tensor(diffusion_mask(adj, 3.0, "laplacian"))
    x = _x(20)
    for s in (2, 3, 7):
        op = DiffusionMask(adj, 3.0, tol=1e-9, steps=s)
        assert op.steps == s and op.error_bound <= 1e-9
        assert _col_err(op.matmul(x), m @ x, x) <= op.error_bound + 1e-13


def test_plan_minimises_products():
    """s = 1 is optimal without a per-step cap; the cap of adjacency forces theta <= 32 per step."""
    for theta, tol in [(0.5, 1e-8), (40.0, 1e-10), (1000.0, 1e-6)]:
        s, m, bound = plan_terms(theta, tol)
        assert s == 1 and bound <= tol
        assert poisson_tail(m - 1, theta) > tol  # m is the smallest admissible
        for s2 in range(2, 6):  # any other step count costs more products
            m2 = next(k for k in range(1, 5000) if s2 * poisson_tail(k, theta / s2) <= tol)
            assert s2 * m2 >= s * m
    s, m, bound = plan_terms(100.0, 1e-8, max_step_theta=32.0)
    assert s >= 4 and 100.0 / s <= 32.0 and bound <= 1e-8
    assert plan_terms(0.0, 1e-8) == (1, 1, 0.0)


def test_poisson_tail_values():
    assert poisson_tail(0, 1.0) == pytest.approx(1 - math.exp(-1), rel=1e-14)
    assert poisson_tail(2, 3.0) == pytest.approx(1 - math.exp(-3) * (1 + 3 + 4.5), rel=1e-13)
    assert poisson_tail(5, 0.0) == 0.0
    assert 0 < poisson_tail(400, 100.0) < 1e-50


def test_adjacency_caps_theta_per_step():
    adj = regular(n=20, d=4)
    op = DiffusionMask(adj, 20.0, "adjacency", tol=1e-8)  # Theta = 80
    assert op.steps >= 3 and 80.0 / op.steps <= 32.0
    assert op.norm_bound == pytest.approx(math.exp(80.0))
    m = torch.as_tensor(diffusion_mask(adj, 20.0, "adjacency"))
    x = _x(20)
    assert _col_err(op.matmul(x), m @ x, x) <= 1e-7 * op.norm_bound


# ---------------------------------------------------------------------------- other solvers and identities


@pytest.mark.parametrize("graph", ["grid", "weighted", "mixed"])
@pytest.mark.parametrize("kind", KINDS)
def test_agrees_with_scipy_expm_multiply(graph, kind):
    adj = GRAPHS[graph]()
    t = sp.csr_matrix(generator_matrix(adj, kind))
    x = _x(adj.shape[0], c=4, seed=2)
    ref = torch.as_tensor(spla.expm_multiply(-1.3 * t, x.numpy()))
    y = expm_action(adj, x, 1.3, kind, tol=1e-12)
    assert _col_err(y, ref, x) <= 1e-10 * DiffusionMask(adj, 1.3, kind).norm_bound


def test_markov_identity():
    """exp(-lam L D^-1) = e^-lam sum_i lam^i / i! (W D^-1)^i, isolated nodes staying put."""
    adj = isolated_loops_components()
    lam = 2.2
    ref = torch.as_tensor(random_walk_series(adj, lam, terms=80))
    x = _x(adj.shape[0])
    op = DiffusionMask(adj, lam, "random-walk", tol=1e-13)
    assert op.beta == 1.0 and op.shift == 1.0
    assert _col_err(op.matmul(x), ref @ x, x) <= 1e-12
    # column-stochastic: mass is conserved
    ones = torch.ones(adj.shape[0], 1, dtype=torch.float64)
    torch.testing.assert_close(op.rmatmul(ones), ones, rtol=0, atol=1e-12)


def test_laplacian_kernel_is_doubly_stochastic_and_nonnegative():
    adj = weighted()
    op = DiffusionMask(adj, 1.7, tol=1e-13)
    n = adj.shape[0]
    ones = torch.ones(n, 1, dtype=torch.float64)
    torch.testing.assert_close(op.matmul(ones), ones, rtol=0, atol=1e-12)
    eye = torch.eye(n, dtype=torch.float64)
    assert bool((op.matmul(eye) >= 0).all()) and op.nonnegative


def test_lam_zero_is_identity_and_no_edges():
    adj = grid(3, 3)
    x = _x(9)
    for kind in KINDS:
        torch.testing.assert_close(DiffusionMask(adj, 0.0, kind).matmul(x), x, rtol=0, atol=0)
    empty = sp.csr_matrix((4, 4))
    for kind in KINDS:
        op = DiffusionMask(empty, 5.0, kind)
        torch.testing.assert_close(op.matmul(_x(4)), _x(4), rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_lam_and_x(kind):
    adj = isolated_loops_components()
    n = adj.shape[0]
    x0 = _x(n, c=2, seed=4)

    def f(lam, x):
        return DiffusionMask(adj, lam, kind, tol=1e-13).matmul(x)

    lam = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    x = x0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (lam, x), eps=1e-6, atol=1e-7)
    g = lambda x: DiffusionMask(adj, 0.8, kind, tol=1e-13).rmatmul(x)  # noqa: E731
    assert torch.autograd.gradcheck(g, (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_of_lam_matches_minus_t_m_x(kind):
    """d/dlam exp(-lam T) x = -T exp(-lam T) x (dense), also at lam = 0 (-T x)."""
    adj = weighted()
    t = torch.as_tensor(generator_matrix(adj, kind))
    x = _x(adj.shape[0], c=1, seed=6)
    u = _x(adj.shape[0], c=1, seed=7)
    for value in (0.0, 1.1):
        lam = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        op = DiffusionMask(adj, lam, kind, tol=1e-13)
        assert list(op.parameters()) == [lam]
        (u * op.matmul(x)).sum().backward()
        m = torch.as_tensor(diffusion_mask(adj, value, kind))
        expected = float((u * (-t @ m @ x)).sum())
        assert float(lam.grad) == pytest.approx(expected, rel=1e-8, abs=1e-8 * op.norm_bound)


def test_learnable_lam_replans_after_in_place_update():
    adj = grid(4, 4)
    lam = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    op = DiffusionMask(adj, lam, tol=1e-10)
    terms = op.terms
    with torch.no_grad():
        lam.add_(4.0)
    x = _x(16)
    y = op.matmul(x)
    assert op.terms > terms
    m = torch.as_tensor(diffusion_mask(adj, 4.5, "laplacian"))
    assert _col_err(y, m @ x, x) <= 1e-9
    with torch.no_grad():
        lam.fill_(-1.0)
    with pytest.raises(ValueError, match="lam must be a finite diffusion time >= 0"):
        op.matmul(x)


def test_through_masked_linear_attention():
    """The operator drives Algorithm 1 (generic path) and agrees with the dense mask."""
    adj = grid(3, 5)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.rand(15, 4, generator=gen, dtype=torch.float64), torch.rand(15, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(15, 3, generator=gen, dtype=torch.float64)
    op = DiffusionMask(adj, 0.9, "random-walk", tol=1e-13)
    dense = torch.as_tensor(diffusion_mask(adj, 0.9, "random-walk"))
    torch.testing.assert_close(masked_linear_attention(q, k, v, mask=op), masked_linear_attention(q, k, v, mask=dense),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_matches_cpu(kind):
    adj = weighted()
    x = _x(adj.shape[0], c=5)
    cpu = DiffusionMask(adj, 1.2, kind, tol=1e-12)
    gpu = DiffusionMask(as_graph(adj, device="cuda"), torch.tensor(1.2, device="cuda"), kind, tol=1e-12)
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        y = gpu.matmul(x.to("cuda", dtype))
        assert y.device.type == "cuda" and y.dtype == dtype
        assert _col_err(y.cpu().double(), cpu.matmul(x), x) <= rtol * cpu.norm_bound
        yt = gpu.rmatmul(x.to("cuda", dtype))
        assert _col_err(yt.cpu().double(), cpu.rmatmul(x), x, "inf") <= rtol * cpu.norm_bound
    lam = torch.tensor(1.2, device="cuda", dtype=torch.float64, requires_grad=True)
    DiffusionMask(as_graph(adj, device="cuda"), lam, kind).matmul(x.cuda()).sum().backward()
    assert lam.grad is not None and torch.isfinite(lam.grad)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("lam", [-0.1, math.nan, math.inf, "1", None, True, torch.tensor([1.0, 2.0]),
                                 torch.tensor(-1.0), torch.tensor(math.nan)])
def test_rejects_bad_lam(lam):
    with pytest.raises(ValueError, match="lam"):
        DiffusionMask(path(4), lam)


@pytest.mark.parametrize("kind", ["Laplacian", "normalized", None, 3])
def test_rejects_unknown_kind(kind):
    with pytest.raises(ValueError, match="kind must be one of"):
        DiffusionMask(path(4), 1.0, kind)


@pytest.mark.parametrize("tol", [0.0, 1.0, -1e-3, 2.0, math.nan, True, "1e-8", None])
def test_rejects_bad_tol(tol):
    with pytest.raises(ValueError, match="tol must be a real number in"):
        DiffusionMask(path(4), 1.0, tol=tol)


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_rejects_bad_steps(steps):
    with pytest.raises(ValueError, match="steps"):
        DiffusionMask(path(4), 1.0, steps=steps)


def test_rejects_bad_graphs():
    with pytest.raises(ValueError, match="not symmetric"):
        DiffusionMask(sp.csr_matrix(np.array([[0, 1.0], [0, 0]])), 1.0)
    with pytest.raises(ValueError):
        DiffusionMask(sp.csr_matrix(np.array([[0, -1.0], [-1.0, 0]])), 1.0)
    with pytest.raises(TypeError):
        DiffusionMask("graph", 1.0)


def test_rejects_bad_x():
    op = DiffusionMask(path(5), 1.0)
    with pytest.raises(ValueError, match="N=5"):
        op.matmul(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="x must have shape"):
        op.matmul(torch.zeros(5))
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        op.rmatmul(torch.zeros(5, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        op.matmul(np.zeros((5, 2)))
