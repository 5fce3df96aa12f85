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
from tests.helpers import DEVICES

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


U64 = 2.0**-53  # unit round-off of float64
U32 = 2.0**-24  # unit round-off of float32


def _cross_roundoff(op, graph, u: float) -> float:
    """Bound (per unit ||x||, before the factor norm_bound) on the difference between op's float64
    result and another implementation of the same plan computing in unit round-off u: the module's
    floor s m (r + 3) u for each side (u and U64), with r = max degree + 1 >= the stored entries per
    row of Bh (diagonal included), widened to s m (2 r + 3): the other side may sum the degrees, hence
    every entry of Bh, in another order (CUDA's index_add_ uses atomics) or round Bh to float32, a
    relative perturbation of each entry of at most r u that k products carry as k r u."""
    r = int(graph.degree.max()) + 1
    return op.products * (2 * r + 3) * (u + U64)


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_device_matches_cpu(device, kind):
    """The operator built on ``device`` (a Graph there, lam a float64 tensor there: the tensor-lam
    plan and the device's CSR kernels) against the CPU one built from scipy with a Python float
    (on CPU: two code paths; with CUDA: cuSPARSE against the CPU kernel). Same lam, so the same
    plan, and the outputs differ by round-off only: _cross_roundoff, far below the float32 unit
    a float32 cast or a float32 lam would leave (the old CUDA-only test built its lam with
    torch.tensor(1.2), a float32 1.2000000477: off by 1.4e-8 for random-walk, 2.9e-2 = 5.6e-9 g
    for adjacency on the H100)."""
    adj = weighted()
    graph = as_graph(adj, device=device)
    x = _x(adj.shape[0], c=5)
    cpu = DiffusionMask(adj, 1.2, kind, tol=1e-12)
    lam = torch.tensor(1.2, dtype=torch.float64, device=device)
    dev = DiffusionMask(graph, lam, kind, tol=1e-12)
    assert dev._planned_value == cpu._planned_value == 1.2
    assert (dev.steps, dev.terms) == (cpu.steps, cpu.terms)
    dense = torch.as_tensor(diffusion_mask(adj, 1.2, kind))
    for dtype, u in ((torch.float64, U64), (torch.float32, U32)):
        xd = x.to(device, dtype)
        x_in = xd.cpu().double()  # the rounded input: its rounding is not the operator's error
        tol = _cross_roundoff(cpu, graph, u) * cpu.norm_bound
        y = dev.matmul(xd)
        assert y.device.type == device and y.dtype == dtype
        assert _col_err(y.cpu().double(), cpu.matmul(x_in), x_in) <= tol
        yt = dev.rmatmul(xd)
        assert yt.device.type == device and yt.dtype == dtype
        assert _col_err(yt.cpu().double(), cpu.rmatmul(x_in), x_in, "inf") <= tol
        if dtype == torch.float64:  # and against the dense kernel: a defect shared by both paths shows here
            within = (dev.error_bound + _cross_roundoff(dev, graph, U64)) * cpu.norm_bound
            assert _col_err(y.cpu(), dense @ x, x) <= within
            assert _col_err(yt.cpu(), dense.T @ x, x, "inf") <= within
    # the learnable path on the device: d/dlam sum(M x) = 1^T (-T) M x (as test_gradient_of_lam_matches_minus_t_m_x)
    lam = torch.tensor(1.2, dtype=torch.float64, device=device, requires_grad=True)
    op = DiffusionMask(graph, lam, kind, tol=1e-13)
    op.matmul(x.to(device)).sum().backward()
    expected = float((-torch.as_tensor(generator_matrix(adj, kind)) @ dense @ x).sum())
    assert lam.grad.device.type == device
    assert float(lam.grad) == pytest.approx(expected, rel=1e-8, abs=1e-8 * op.norm_bound)


def test_float32_lam_is_used_at_its_stored_value():
    """A float32 tensor lam is the number it stores (torch.tensor(1.2) holds 1.2000000476837158), read
    in float64: the operator equals the one built from that float, exactly, and differs from lam = 1.2
    by far more than round-off (a comparison must hand both sides the same lam)."""
    adj = weighted()
    x = _x(adj.shape[0], c=2)
    lam32 = torch.tensor(1.2, dtype=torch.float32)
    for kind in KINDS:
        op = DiffusionMask(adj, lam32, kind, tol=1e-12)
        assert op._planned_value == float(lam32) != 1.2
        assert torch.equal(op.matmul(x), DiffusionMask(adj, float(lam32), kind, tol=1e-12).matmul(x))
        exact = DiffusionMask(adj, 1.2, kind, tol=1e-12)
        graph = as_graph(adj)
        assert _col_err(op.matmul(x), exact.matmul(x), x) > 100 * _cross_roundoff(exact, graph, U64) * exact.norm_bound


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


# ---------------------------------------------------------------------------- review fixes (large Theta, loops, limits)

def _path_laplacian_kernel(n: int, lam: float) -> np.ndarray:
    """exp(-lam L) of the n-path from its closed-form eigenpairs: eigenvalues 4 sin^2(pi k / 2n)
    (relative accuracy u, the zero one exact), eigenvectors cos(pi k (j + 1/2) / n) normalised."""
    k = np.arange(n)
    ev = 4.0 * np.sin(np.pi * k / (2 * n)) ** 2
    v = np.cos(np.pi * np.outer(np.arange(n) + 0.5, k) / n)
    v /= np.linalg.norm(v, axis=0)
    return (v * np.exp(-lam * ev)) @ v.T


@pytest.mark.parametrize("lam", [25.0, 100.0, 400.0])
@pytest.mark.parametrize("tol", [1e-8, 1e-10, 1e-12])
def test_large_theta_float64_within_bound_plus_roundoff(lam, tol):
    """8 x 8 grid, laplacian, Theta = 4 lam up to 1600, x = e_0 against the exact eigendecomposition
    (exp(-lam (L1 + L2)) = exp(-lam L1) (x) exp(-lam L1) on the grid). The error must stay within
    error_bound + the module's round-off floor s m (r + 3) u, r = 5 >= stored entries per row of Bh
    (4 neighbours and the diagonal). Poisson weights with log k! by a running sum missed it by 3-7x
    at tol = 1e-12 (measured now: |err - error_bound| <= 6e-16)."""
    a = grid(8, 8)
    k1 = _path_laplacian_kernel(8, lam)
    truth = np.kron(k1[:, 0], k1[:, 0])  # column 0 of the 2-D kernel (nodes i * 8 + j)
    op = DiffusionMask(a, lam, "laplacian", tol=tol)
    assert op.beta == 4.0 and op.error_bound <= tol
    x = torch.zeros(64, 1, dtype=torch.float64)
    x[0] = 1.0
    err = float(np.abs(op.matmul(x)[:, 0].numpy() - truth).sum())
    floor = op.products * (5 + 3) * U64
    assert err <= op.error_bound + floor
    # x = e_0 >= 0 and Bh column-stochastic: the omitted mass is exactly the tail, so the error equals
    # error_bound up to round-off (the old weights were off by -7.8e-12 .. +5.9e-12 at Theta = 1600)
    assert abs(err - op.error_bound) <= floor


def test_poisson_weights_are_accurate_at_large_theta():
    """The kept weights sum to 1 - tail(m) and match the Poisson pmf computed independently in
    extended precision (Python fractions-free: log-space with math.lgamma, and the mode ratio)."""
    op = DiffusionMask(grid(8, 8), 400.0, "laplacian", tol=1e-12)  # theta = 1600 in one step
    w = np.array(op._weights)
    assert op.steps == 1
    assert abs(w.sum() - (1.0 - op.error_bound)) <= 1e-14
    theta = 1600.0
    ref = np.array([math.exp(k * math.log(theta) - math.lgamma(k + 1) - theta) for k in range(len(w))])
    peak = int(np.argmax(ref))
    assert peak in (1599, 1600)
    # lgamma's absolute error (~ u * 1e4) bounds the reference's own accuracy: compare near the mode
    near = slice(peak - 120, peak + 121)
    np.testing.assert_allclose(w[near], ref[near], rtol=5e-12)


def test_self_loop_does_not_inflate_the_plan():
    """The laplacian shift is c = max_i (d_i - w_ii): a self-loop cancels in L = D - W, so a loop of
    weight 100 must not raise Theta (with c = d_max = 101 it planned ~560 products, not ~35)."""
    loops = sp.csr_matrix(np.array([[100.0, 1, 0], [1, 0, 1], [0, 1, 0]]))
    bare = sp.csr_matrix(np.array([[0.0, 1, 0], [1, 0, 1], [0, 1, 0]]))
    x = _x(3, c=3, seed=8)
    m = torch.as_tensor(diffusion_mask(loops, 5.0, "laplacian"))
    for tol in (1e-6, 1e-10, 1e-12):
        op = DiffusionMask(loops, 5.0, "laplacian", tol=tol)
        assert op.shift == op.beta == 2.0  # max off-diagonal degree (node 1), not d_max = 101
        assert op.products <= 60
        floor = op.products * (3 + 3) * U64
        assert _col_err(op.matmul(x), m @ x, x) <= op.error_bound + floor
        assert _col_err(op.rmatmul(x), m.T @ x, x, "inf") <= op.error_bound + floor
        # exp(-lam L) does not see the loop at all: the same products as the loop-free graph
        torch.testing.assert_close(op.matmul(x), DiffusionMask(bare, 5.0, tol=tol).matmul(x), rtol=0, atol=1e-14)
    eye = torch.eye(3, dtype=torch.float64)
    assert bool((DiffusionMask(loops, 5.0).matmul(eye) >= 0).all())


def test_one_element_parameter_lam_is_the_leaf_an_optimiser_updates():
    lam = torch.nn.Parameter(torch.tensor([0.5], dtype=torch.float64))
    adj = path(6)
    op = DiffusionMask(adj, lam, tol=1e-12)
    params = list(op.parameters())
    assert len(params) == 1 and params[0] is lam
    opt = torch.optim.SGD(op.parameters(), lr=0.25)
    x, u = _x(6, c=2, seed=9), _x(6, c=2, seed=10)
    loss = (u * op.matmul(x)).sum()
    loss.backward()
    assert lam.grad.shape == (1,)
    t = torch.as_tensor(generator_matrix(adj, "laplacian"))
    expected = float((u * (-t @ torch.as_tensor(diffusion_mask(adj, 0.5, "laplacian")) @ x)).sum())
    grad = float(lam.grad.detach())
    assert grad == pytest.approx(expected, rel=1e-9)
    opt.step()
    assert float(lam.detach()) == 0.5 - 0.25 * grad
    m = torch.as_tensor(diffusion_mask(adj, float(lam.detach()), "laplacian"))
    assert _col_err(op.matmul(x), m @ x, x) <= 1e-11  # the step is seen (replanned)


def test_refuses_absurd_plans():
    from fast.masks.diffusion import MAX_PRODUCTS

    heavy = sp.csr_matrix(np.array([[0, 1e6], [1e6, 0]]))  # beta = 1e6: ~1e6 products
    with pytest.raises(ValueError, match=r"lam=1\.0.*beta = 1000000\.0.*MAX_PRODUCTS = 100000"):
        DiffusionMask(heavy, 1.0)
    # just under MAX_PRODUCTS in Theta, over it in products (m ~ Theta + z sqrt(Theta))
    near = sp.csr_matrix(np.array([[0, 1.0], [1.0, 0]]))
    with pytest.raises(ValueError, match=r"needs \d+ sparse products per call"):
        DiffusionMask(near, MAX_PRODUCTS - 100.0, tol=1e-12)  # beta = 1
    ok = DiffusionMask(near, 1000.0)
    assert ok.products <= MAX_PRODUCTS
    # a learnable lam that grows absurd is refused at the next product
    lam = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    op = DiffusionMask(near, lam)
    with torch.no_grad():
        lam.fill_(1e7)
    with pytest.raises(ValueError, match="MAX_PRODUCTS"):
        op.matmul(_x(2))


def test_adjacency_fixed_steps_cannot_overflow():
    """steps=1 at theta = 800 > 709 made the weights theta^k / k! overflow (inf / NaN output)."""
    adj = path(4)  # d_max = 2
    with pytest.raises(ValueError, match=r"steps=1 leaves theta = .*ADJACENCY_STEP_THETA.*steps >= 25"):
        DiffusionMask(adj, 400.0, "adjacency", steps=1)
    with pytest.raises(ValueError, match="ADJACENCY_STEP_THETA"):
        DiffusionMask(adj, 20.0, "adjacency", steps=1)  # theta = 40 > 32: float32 steps could overflow
    op = DiffusionMask(adj, 20.0, "adjacency", steps=2, tol=1e-10)  # theta = 20 per step
    m = torch.as_tensor(diffusion_mask(adj, 20.0, "adjacency"))
    x = _x(4)
    y = op.matmul(x)
    assert bool(torch.isfinite(y).all())
    assert _col_err(y, m @ x, x) <= (op.error_bound + op.products * 6 * U64) * op.norm_bound


def test_inference_mode_parameters_work():
    """A lam made under torch.inference_mode keeps no version counter (the sweeps build their
    operators there): planning must not read one."""
    from verify.problems import path_graph

    g = as_graph(path_graph(30))
    with torch.inference_mode():
        lam = torch.tensor(0.5, dtype=torch.float64)
        x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        y = DiffusionMask(g, lam).matmul(x)
        z = DiffusionMask(g, 0.5).matmul(x)
    assert torch.equal(y, z)


def test_column_blocks_give_the_same_product_and_gradients(monkeypatch):
    """Where the series runs on column blocks (CPU, working set over CHAIN_CACHE_BYTES), every column
    is the one-block column up to round-off, and so is the gradient of x and of a learnable lam.
    Not bit for bit: MKL's sparse product on AVX-512 sums a row's entries in an order that depends
    on how many columns it is given (1.8e-15 apart at 40 against 20 columns), so the bound is the
    module's cross-implementation one (_cross_roundoff, both sides in float64; a block that took the
    wrong columns or skipped a term is off by O(1)). Per column of the gradient of
    sum(M x) + |M^T x|^2, that is M^T 1 + 2 M (M^T x) with ||M||_1 = 1 (laplacian kind), the
    bound applies to each product and to the error M^T x carries into the last one."""
    from fast.masks import diffusion

    adj = weighted()
    n = adj.shape[0]
    x = _x(n, c=40, lead=(2,))
    assert diffusion.chain_columns(n, 80, 8) == 80  # fits: one block
    monkeypatch.setattr(diffusion, "CHAIN_CACHE_BYTES", 4 * n * 8 * 20)  # 20 columns of float64 per block
    assert diffusion.chain_columns(n, 80, 8) == 20 and diffusion.chain_columns(n, 80, 4) == 40
    monkeypatch.setattr(diffusion, "MIN_CHAIN_COLUMNS", 16)
    assert diffusion.chain_columns(n * 4, 80, 8) == 16

    def run(blocked: bool):
        if not blocked:
            monkeypatch.setattr(diffusion, "CHAIN_CACHE_BYTES", 2**40)
        else:
            monkeypatch.setattr(diffusion, "CHAIN_CACHE_BYTES", 4 * n * 8 * 20)
        lam = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        xi = x.clone().requires_grad_()
        op = DiffusionMask(adj, lam, "laplacian", tol=1e-12)
        y, yt = op.matmul(xi), op.rmatmul(xi)
        (y.sum() + (yt * yt).sum()).backward()
        return y.detach(), yt.detach(), xi.grad, lam.grad, op

    one, many = run(False), run(True)
    op = one[4]
    assert op.norm_bound == 1.0
    tau = _cross_roundoff(op, as_graph(adj), U64)  # per unit ||w||_1 of each product's input w
    assert _col_err(many[0], one[0], x) <= tau and _col_err(many[1], one[1], x) <= tau
    one_norm = lambda t: t.abs().sum(-2)  # noqa: E731 (per column)
    grad_bound = tau * (n + 2 * one_norm(one[1]) + 2 * one_norm(x))
    assert bool((one_norm(many[2] - one[2]) <= grad_bound).all())
    assert float(many[3]) == pytest.approx(float(one[3]), rel=1e-12)


# ---------------------------------------------------------------------------- per-key stabilised attend (issue 24)


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("kind", KINDS)
def test_stabilised_attend_equals_the_true_products(graph, kind):
    """attend(phi_q, exp(z - c), v, key_log_scale=c) = the dense products of the true features exp(z),
    in each row's own units (den_i = exp(-r_i) x the true den_i, r_i the largest c_j the row sees),
    for constants 3 and 40 units apart, lam = 0 (M = I) included."""
    from tests.fast.masks.test_grf import check_stabilised_attend

    for lam in (0.0, 0.7, 3.0):
        mask = DiffusionMask(GRAPHS[graph](), lam, kind, tol=1e-12)
        assert mask.rescales_keys
        for lead in [(2, 3), ()]:
            check_stabilised_attend(mask, lead=lead, spread=3.0)
        check_stabilised_attend(mask, spread=40.0)


def test_key_stabilizer_is_one_constant_per_key():
    mask = DiffusionMask(isolated_loops_components(), 0.5, "random-walk")
    z = torch.randn(2, 9, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 30
    assert torch.equal(mask.key_stabilizer(z), z.amax(-1, keepdim=True))


def _isolated64(seed: int = 0) -> sp.csr_matrix:
    """56 nodes with 80 random edges and 8 isolated nodes (64 in all)."""
    g = nx.gnm_random_graph(56, 80, seed=seed)
    g.add_nodes_from(range(56, 64))
    return _csr(g)


@pytest.mark.parametrize("graph", ["mixed", "isolated64"])
def test_float32_refuses_only_what_float64_refuses_at_std_8(graph):
    """The issue's measurement: favor_attention with DiffusionMask, q and k entries of std 8 (d = 16,
    m = 16), 30 draws per graph (10 per kind; 60 in all), float32 against float64. Each draw is refused
    by float32 exactly when float64 refuses it, and every row that comes back agrees with float64 to
    1e-3 relative. With one constant per slice float32 refused 1 of the 4 draws per kind on "mixed"
    and 4 of 4 on "isolated64" (an isolated node sees only its own key, which underflowed)."""
    from fast import DenominatorError, favor_attention

    adj = isolated_loops_components() if graph == "mixed" else _isolated64()
    n = adj.shape[0]
    for kind in KINDS:
        mask = DiffusionMask(adj, 1.0, kind)
        for seed in range(10):
            g = torch.Generator().manual_seed(seed)
            q, k = (8 * torch.randn(n, 16, generator=g, dtype=torch.float64) for _ in range(2))
            v, w = torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(16, 16, generator=g, dtype=torch.float64)
            results = []
            for dtype in (torch.float64, torch.float32):
                try:
                    results.append(favor_attention(q.to(dtype), k.to(dtype), v.to(dtype), w.to(dtype), mask).double())
                except DenominatorError:
                    results.append(None)
            want, got = results
            assert (want is None) == (got is None), (kind, seed, "float32 refused" if got is None else "float64 refused")
            if want is not None:
                row = (got - want).norm(dim=-1) / want.norm(dim=-1)
                assert float(row.max()) <= 1e-3, (kind, seed, float(row.max()))


@pytest.mark.parametrize("route", ["exact", "optimistic"])
@pytest.mark.parametrize("kind", KINDS)
def test_stabilised_attend_gradcheck(kind, route):
    """Gradients of the stabilised attend (route "exact": per-key constants; "optimistic": the plain
    series on keys brought to one constant per slice, trusted on these inputs) reach phi_q, phi_k, v
    and a learnable lam (gradcheck)."""
    from tests.fast.masks.test_grf import stabilised_inputs

    adj = isolated_loops_components()
    z, phi_q, v = stabilised_inputs(adj.shape[0], (2,), m=2, d=2, spread=3.0, seed=7)
    c = z.amax(-1, keepdim=True)
    phi_k = torch.exp(z - c)
    lam = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    inputs = (phi_q.requires_grad_(True), phi_k.requires_grad_(True), v.requires_grad_(True))
    if route == "optimistic":
        (_, trusted) = DiffusionMask(adj, lam, kind, tol=1e-12).attend_optimistic(*inputs, c)
        assert bool(trusted)

    def f(pq, pk, vv, ll):
        mask = DiffusionMask(adj, ll, kind, tol=1e-12)
        if route == "exact":
            return mask.attend(pq, pk, vv, key_log_scale=c)
        return mask.attend_optimistic(pq, pk, vv, c)[0]

    assert torch.autograd.gradcheck(f, (*inputs, lam))
    assert torch.autograd.gradcheck(lambda pq, pk, vv: f(pq, pk, vv, 0.6), inputs)


@pytest.mark.parametrize("dtype, val", [(torch.float32, 1e37), (torch.float64, 4e306)])
@pytest.mark.parametrize("kind", ["random-walk", "laplacian"])
def test_expm_action_near_the_maximum_matches_the_dense_exponential(kind, dtype, val):
    """exp(-lam T) x for x within a factor 40 of the dtype's maximum (issue 24): on a star the
    random-walk series' powers B^k x reach about the centre's degree times |x| while every entry of
    the result stays finite; expm_action must return it (redone on x 2^-s, exact), within the a
    priori bound of the dense exponential (computed on x 2^-600 in float64, an exact scaling)."""
    n = 50
    leaves = torch.arange(1, n)
    edges = torch.stack([torch.cat([torch.zeros(n - 1, dtype=torch.long), leaves]),
                         torch.cat([leaves, torch.zeros(n - 1, dtype=torch.long)])])
    x = torch.full((n, 2), val, dtype=dtype)
    x[1::2, 1] *= 0.5
    out = expm_action(edges, x, 0.5, kind=kind, tol=1e-12)
    assert torch.isfinite(out).all()
    op = DiffusionMask(edges, 0.5, kind, tol=1e-12)
    m = torch.as_tensor(diffusion_mask(as_graph(edges).csr().to_dense().numpy(), 0.5, kind))
    xs = x.double() * 2.0 ** -600
    roundoff = 50 * torch.finfo(dtype).eps / 2 * op.products
    assert _col_err(out.double() * 2.0 ** -600, m @ xs, xs) <= (op.error_bound + roundoff) * op.norm_bound


# ---------------------------------------------------------------------------- plan arguments (issue 24)


@pytest.mark.parametrize("kw, match", [
    ({"theta_total": "abc"}, r"theta_total must be a finite real >= 0"),
    ({"theta_total": float("nan")}, r"theta_total must be a finite real >= 0"),
    ({"tol": "abc"}, r"tol must be a real number in \(0, 1\)"),
    ({"tol": float("nan")}, r"tol must be a real number in \(0, 1\)"),  # used to allocate gigabytes
    ({"steps": 0}, r"steps must be None \(planned\) or an int >= 1"),
    ({"max_step_theta": "x"}, r"max_step_theta must be a positive real"),
])
def test_plan_terms_refuses_bad_arguments_naming_them(kw, match):
    args = {"theta_total": 1.0, "tol": 1e-8, **kw}
    with pytest.raises(ValueError, match=match):
        plan_terms(args.pop("theta_total"), args.pop("tol"), **args)


def test_absurd_theta_is_refused_before_allocating(monkeypatch):
    import fast.validation

    monkeypatch.setattr(fast.validation, "memory_limit", lambda device=None: 2**30)
    with pytest.raises(MemoryError, match=r"theta_total = 1000000000000000.0 asks for 4 x the Poisson weights and tails"):
        plan_terms(1e15, 1e-8)
    with pytest.raises(MemoryError, match=r"m = 3, theta = 1000000000000000.0 asks for"):
        poisson_tail(3, 1e15)


def test_stabilised_series_column_blocks_and_uncached_products_agree(monkeypatch):
    """The CPU column blocks (chain_columns) and the path that forms each scaled product at each use
    (past SCALED_CACHE_BYTES) compute the same products as one block with cached ones, up to the
    order in which a sparse product sums a row (MKL's depends on the number of columns on AVX-512).
    The scaled products and the step weights are nonnegative, so each side's error is at most the
    module's per-product round-off (_cross_roundoff) times the same series applied to |x|, entry by
    entry; attend adds the contraction with phi_q (m terms) and is bounded through |v|."""
    import fast.masks.diffusion as diffusion
    from tests.fast.masks.test_grf import stabilised_inputs

    graph, m = grid(), 4
    mask = DiffusionMask(graph, 0.8, "random-walk", tol=1e-12)
    z, phi_q, v = stabilised_inputs(mask.n, (2, 3), m=m, d=3, spread=20.0, seed=3)
    c = mask.key_stabilizer(z).expand(2, 3, mask.n, 1)
    x = torch.randn(2, 3, mask.n, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    series = lambda: diffusion.StabilisedSeries(mask, c.reshape(6, mask.n))  # noqa: E731
    want, scale = series().matmul(x), series().matmul(x.abs())
    kappa = _cross_roundoff(mask, as_graph(graph), U64)

    def within(got, want, scale, k=kappa):
        return bool(((got - want).abs() <= k * scale).all())

    monkeypatch.setattr(diffusion, "CHAIN_CACHE_BYTES", 4 * 6 * mask.n * 8 * 16)  # 16 columns per block
    assert diffusion.chain_columns(6 * mask.n, 40, 8) == 16
    assert within(series().matmul(x), want, scale)
    monkeypatch.setattr(diffusion, "SCALED_CACHE_BYTES", 0)
    assert within(series().matmul(x), want, scale)
    num, den = mask.attend(phi_q, torch.exp(z - c), v, key_log_scale=c)
    monkeypatch.undo()
    num0, den0 = mask.attend(phi_q, torch.exp(z - c), v, key_log_scale=c)
    num_scale, _ = mask.attend(phi_q, torch.exp(z - c), v.abs(), key_log_scale=c)
    k = kappa + 2 * (m + 1) * U64
    assert within(num, num0, num_scale, k) and within(den, den0, den0, k)


def _spy_on_stabilised_series(monkeypatch) -> list[int]:
    """Count the StabilisedSeries built (the exact per-key route) from here on."""
    import fast.masks.diffusion as diffusion

    calls: list[int] = []
    original = diffusion.StabilisedSeries

    class Spy(original):
        def __init__(self, *args, **kwargs):
            calls.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(diffusion, "StabilisedSeries", Spy)
    return calls


@pytest.mark.parametrize("graph", ["mixed", "isolated64"])
def test_ordinary_inputs_take_the_optimistic_route_and_extreme_ones_the_exact(graph, monkeypatch):
    """favor_attention with DiffusionMask runs the plain series (one constant per slice) on ordinary
    inputs: q, k of std 1 build no StabilisedSeries, forward or backward, and give the exact route's
    result and gradients (float64, to round-off). At std 8 (the draws of the float32 test above) the
    optimistic denominators are not trusted and the exact per-key series runs."""
    from fast import DenominatorError, favor_attention
    from fast.operator import MaskOperator

    adj = isolated_loops_components() if graph == "mixed" else _isolated64()
    n = adj.shape[0]
    calls = _spy_on_stabilised_series(monkeypatch)
    exact_routes = 0
    for kind in KINDS:
        mask = DiffusionMask(adj, 1.0, kind)
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            q, k = (torch.randn(n, 16, generator=g, dtype=torch.float64) for _ in range(2))
            v, w = torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(16, 16, generator=g, dtype=torch.float64)
            for dtype in (torch.float32, torch.float64):
                favor_attention(q.to(dtype), k.to(dtype), v.to(dtype), w.to(dtype), mask)
            inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = favor_attention(*inputs, w, mask)
            grads = torch.autograd.grad((out * out).sum(), inputs)
            assert not calls, (kind, seed)
            with monkeypatch.context() as patch:  # the exact route, forced
                patch.setattr(DiffusionMask, "attend_optimistic", MaskOperator.attend_optimistic)
                ref_inputs = [t.clone().requires_grad_(True) for t in (q, k, v)]
                ref = favor_attention(*ref_inputs, w, mask)
                ref_grads = torch.autograd.grad((ref * ref).sum(), ref_inputs)
            assert calls
            calls.clear()
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=0)
            for a, b in zip(grads, ref_grads):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12 * float(b.abs().max()))
            g = torch.Generator().manual_seed(seed)
            q, k = (8 * torch.randn(n, 16, generator=g, dtype=torch.float32) for _ in range(2))
            try:
                favor_attention(q, k, v.float(), w.float(), mask)
            except DenominatorError:
                pass
            exact_routes += bool(calls)
            calls.clear()
    # with one constant per slice an isolated node's own key underflows at std 8 (test above)
    assert exact_routes >= (9 if graph == "isolated64" else 1)
