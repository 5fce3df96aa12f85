"""fast/latent/nodeformer.py against reference/latent/nodeformer.py, graph isolation, log-space robustness, errors."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fast.latent.nodeformer as F
import fast.segments as segments
import reference.latent.nodeformer as R
from fast.graphs import Graph
from tests.helpers import DEVICES, EQUIV_TOL, gen, np_, randn, rel_frobenius

#: three graphs of uneven sizes (3, 5, 4 nodes)
N = 12
BATCH = torch.tensor([0] * 3 + [1] * 5 + [2] * 4)
SLICES = [(0, 3), (3, 8), (8, 12)]
#: a symmetric edge_index inside the three graphs: the path 0-1-2; the triangle 3-4-5 beside the edge
#: 6-7 with a self-loop on 7; the edge 8-9 plus two isolated nodes (10, 11). Its largest index is 9, so
#: the edge_index alone implies 10 nodes: every call passes N = 12 (q's N, or n=N) explicitly.
EDGES = torch.tensor([[0, 1, 1, 2, 3, 4, 4, 5, 5, 3, 6, 7, 7, 8, 9],
                      [1, 0, 2, 1, 4, 3, 5, 4, 3, 5, 7, 6, 7, 9, 8]])


def _adj() -> sp.csr_matrix:
    e = EDGES.numpy()
    return sp.csr_matrix((np.ones(e.shape[1]), (e[0], e[1])), shape=(N, N))


def _inputs(dtype=torch.float64, seed=0, m=8, d=4, dv=3, scale=1.0):
    g = gen(seed)
    q = randn((2, 2, N, d), g, dtype, scale)
    k = randn((2, 2, N, d), g, dtype, scale)
    v = randn((2, 2, N, dv), g, dtype)
    w = randn((m, d), g, dtype)
    return q, k, v, w


def _np(*ts):
    return [np_(t) for t in ts]


@pytest.fixture(params=["slices", "packing"])
def route(request, monkeypatch):
    """slices: few graphs, one GEMM pair per graph (the default); packing: the PackingMask segment-sum
    route of many graphs, with tiny edge and row blocks so the blocked loops run several times."""
    if request.param == "packing":
        monkeypatch.setattr(segments, "FEW_SEGMENTS", 0)
        monkeypatch.setattr(F, "EDGE_BLOCK_ELEMENTS", 40)
        monkeypatch.setattr(F, "ROWS_BLOCK_ELEMENTS", 40)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batched", [False, True])
def test_against_reference(dtype, batched, route):
    q, k, v, w = _inputs(dtype)
    batch = BATCH if batched else None
    bn = None if batch is None else batch.numpy()
    qn, kn, vn, wn = _np(q, k, v, w)
    tol = EQUIV_TOL[dtype]
    out = F.kernelized_softmax(q, k, v, w, tau=0.5, batch=batch)
    assert out.dtype == dtype and out.shape == v.shape
    assert rel_frobenius(out, R.kernelized_softmax(qn, kn, vn, wn, tau=0.5, batch=bn)) < tol
    noise = F.gumbel_noise((3, 2, 2, N), generator=gen(1), dtype=dtype)
    out = F.kernelized_gumbel_softmax(q, k, v, w, tau=0.25, noise=noise, batch=batch)
    assert rel_frobenius(out, R.kernelized_gumbel_softmax(qn, kn, vn, wn, np_(noise), tau=0.25, batch=bn)) < tol
    b = torch.tensor([0.3, -1.2], dtype=dtype)
    for order in (1, 2):
        for normalize in ("sym", None):
            out = F.nodeformer_attention(q, k, v, w, graph=EDGES, b=b[:order], order=order, normalize=normalize,
                                         noise=noise, batch=batch)
            ref = R.nodeformer_attention(qn, kn, vn, wn, graph=_adj(), b=np_(b[:order]), order=order,
                                         normalize=normalize, noise=np_(noise), batch=bn)
            assert rel_frobenius(out, ref) < tol
    rows = torch.tensor([0, 4, 11, 4])
    out = F.kernelized_attention_rows(q, k, w, rows, tau=0.5, batch=batch)
    ref = R.attention_weights(qn, kn, wn, tau=0.5, batch=bn)[..., rows.numpy(), :]
    assert out.shape == (2, 2, 4, N) and rel_frobenius(out, ref) < tol
    ell = F.edge_log_likelihood(q, k, w, EDGES, tau=0.5, batch=batch)
    assert ell.shape == (2, 2, N) and float(ell[..., 11].abs().max()) == 0.0  # isolated node
    assert rel_frobenius(ell, R.edge_log_likelihood(qn, kn, wn, _adj(), tau=0.5, batch=bn)) < tol
    loss = F.edge_loss(q, k, w, EDGES, tau=0.5, batch=batch)
    ref = R.edge_loss(qn, kn, wn, _adj(), tau=0.5, batch=bn)
    assert loss.dim() == 0 and abs(float(loss) - ref) <= tol * abs(ref)


def test_rows_are_distributions_within_their_graph():
    q, k, _, w = _inputs()
    pi = F.kernelized_attention_rows(q, k, w, torch.arange(N), tau=0.25, batch=BATCH)
    same = (BATCH[:, None] == BATCH[None, :])
    assert torch.equal(pi.masked_fill(same, 0.0), torch.zeros_like(pi))
    torch.testing.assert_close(pi.sum(-1), torch.ones(2, 2, N, dtype=torch.float64), rtol=1e-13, atol=1e-13)


def test_graphs_never_mix(route):
    """Perturbing one graph's q, k, v and noise leaves every other graph's outputs bit for bit unchanged."""
    q, k, v, w = _inputs()
    noise = F.gumbel_noise((2, 2, 2, N), generator=gen(3), dtype=torch.float64)
    s, e = SLICES[1]
    q2, k2, v2, n2 = q.clone(), k.clone(), v.clone(), noise.clone()
    q2[..., s:e, :] += 0.7
    k2[..., s:e, :] -= 0.4
    v2[..., s:e, :] *= 3.0
    n2[..., s:e] += 1.0
    calls = [
        lambda q, k, v, n: F.kernelized_softmax(q, k, v, w, tau=0.5, batch=BATCH),
        lambda q, k, v, n: F.kernelized_gumbel_softmax(q, k, v, w, noise=n, batch=BATCH),
        lambda q, k, v, n: F.nodeformer_attention(q, k, v, w, graph=EDGES, b=0.2, order=2, noise=n, batch=BATCH),
        lambda q, k, v, n: F.edge_log_likelihood(q, k, w, EDGES, batch=BATCH).unsqueeze(-1),
    ]
    others = torch.tensor([0, 1, 2, 8, 9, 10, 11])
    for call in calls:
        a, b = call(q, k, v, noise), call(q2, k2, v2, n2)
        assert torch.equal(a[..., others, :], b[..., others, :])
        assert not torch.equal(a[..., s:e, :], b[..., s:e, :])


def test_eval_mode_is_kernelized_softmax():
    q, k, v, w = _inputs()
    ref = F.kernelized_softmax(q, k, v, w, tau=0.25, batch=BATCH)
    out = F.kernelized_gumbel_softmax(q, k, v, w, tau=0.25, training=False, generator=gen(0), batch=BATCH)
    assert torch.equal(out, ref)
    out = F.nodeformer_attention(q, k, v, w, tau=0.25, training=False, batch=BATCH)
    assert torch.equal(out, ref)
    assert torch.equal(F.nodeformer_attention(q, k, v, w, tau=0.25, gumbel=False, batch=BATCH), ref)
    # training draws noise: the output moves
    assert not torch.allclose(F.kernelized_gumbel_softmax(q, k, v, w, tau=0.25, generator=gen(0)),
                              F.kernelized_softmax(q, k, v, w, tau=0.25))


@pytest.mark.parametrize("tau", [1e-3, 1e-6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_tau_is_finite(tau, dtype):
    """exp(g / tau) with g up to ~16 and |x|^2 / tau in the thousands: never inf or NaN (log space)."""
    q, k, v, w = _inputs(dtype, seed=4, scale=3.0)
    noise = F.gumbel_noise((4, 2, 2, N), generator=gen(5), dtype=dtype)
    for batch in (None, BATCH):
        out = F.kernelized_gumbel_softmax(q, k, v, w, tau=tau, noise=noise, batch=batch)
        assert torch.isfinite(out).all()
        # a convex combination of the values of the node's graph
        assert float(out.abs().max()) <= float(v.abs().max()) * (1 + 1e-5)
        assert torch.isfinite(F.kernelized_softmax(q, k, v, w, tau=tau, batch=batch)).all()
        assert torch.isfinite(F.edge_loss(q, k, w, EDGES, tau=tau, batch=batch))
    # at tiny tau each sample picks one key per query: the reference agrees (float64, same noise)
    if dtype == torch.float64 and tau == 1e-3:
        ref = R.kernelized_gumbel_softmax(*_np(q, k, v, w), np_(noise), tau=tau)
        assert rel_frobenius(F.kernelized_gumbel_softmax(q, k, v, w, tau=tau, noise=noise), ref) < 1e-8


def test_gumbel_noise_reproducible_and_global_rng_untouched():
    state = torch.random.get_rng_state()
    a = F.gumbel_noise((3, 5, 7), generator=gen(11))
    b = F.gumbel_noise((3, 5, 7), generator=gen(11))
    c = F.gumbel_noise((3, 5, 7))  # a fresh OS-seeded generator
    q, k, v, w = _inputs()
    F.kernelized_gumbel_softmax(q, k, v, w)
    F.nodeformer_attention(q, k, v, w, generator=gen(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.float32 and torch.isfinite(a).all()
    big = F.gumbel_noise((200_000,), generator=gen(12), dtype=torch.float64)
    assert abs(float(big.mean()) - np.euler_gamma) < 0.01  # Gumbel(0, 1): mean gamma, variance pi^2/6
    assert abs(float(big.var()) - np.pi ** 2 / 6) < 0.03
    # the generator route of kernelized_gumbel_softmax draws gumbel_noise((K, *k.shape[:-1])) in the compute
    # dtype (float64 here) on k's device
    noise = F.gumbel_noise((4, 2, 2, N), generator=gen(7), dtype=torch.float64)
    assert torch.equal(F.kernelized_gumbel_softmax(q, k, v, w, samples=4, generator=gen(7)),
                       F.kernelized_gumbel_softmax(q, k, v, w, noise=noise))


def _dense_pattern(power: int) -> torch.Tensor:
    a = torch.zeros(N, N, dtype=torch.float64)
    a[EDGES[0], EDGES[1]] = 1.0
    return (torch.linalg.matrix_power(a, power) > 0).double()


@pytest.mark.parametrize("normalize", ["sym", None])
def test_relational_bias_against_dense_powers(normalize):
    v = randn((2, N, 3), gen(8))
    b = torch.tensor([0.5, -0.25], dtype=torch.float64)
    orders = F.adjacency_orders(EDGES, 2, n=N)
    assert all(isinstance(a, Graph) for a in orders)
    expected = torch.zeros_like(v)
    for r in (1, 2):
        a = _dense_pattern(r)
        assert torch.equal(orders[r - 1].csr().to_dense(), a)
        if normalize == "sym":
            deg = a.sum(1)
            inv = torch.where(deg > 0, deg.clamp(min=1).rsqrt(), torch.zeros_like(deg))
            a = inv[:, None] * a * inv[None, :]
        expected = expected + torch.sigmoid(b[r - 1]) * (a @ v)
    out = F.relational_bias(v, EDGES, b, order=2, normalize=normalize)
    torch.testing.assert_close(out, expected, rtol=1e-13, atol=1e-13)
    # A_2 closes walks: node 0 (a path end) reaches itself and node 2, node 11 (isolated) nothing
    a2 = orders[1].csr().to_dense()
    assert a2[0, 0] == 1 and a2[0, 2] == 1 and a2[0, 1] == 0 and a2[11].sum() == 0
    # a float b is shared by every order; inputs from scipy and a Graph give the same
    same = F.relational_bias(v, _adj(), 0.5, order=2, normalize=normalize)
    torch.testing.assert_close(same, F.relational_bias(v, orders[0], torch.tensor([0.5, 0.5]).double(), order=2,
                                                       normalize=normalize), rtol=1e-14, atol=1e-14)


def test_gradcheck(route):
    g = gen(9)
    n, d, m = 5, 3, 4
    q, k, v = (randn((2, n, d), g).requires_grad_() for _ in range(3))
    w = randn((m, d), g)
    noise = F.gumbel_noise((2, 2, n), generator=gen(10), dtype=torch.float64)
    b = torch.tensor([0.1, -0.4], dtype=torch.float64, requires_grad=True)
    edges = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    batch = torch.tensor([0, 0, 0, 1, 1])
    torch.autograd.gradcheck(lambda q, k, v: F.kernelized_softmax(q, k, v, w, tau=0.5, batch=batch), (q, k, v))
    torch.autograd.gradcheck(lambda q, k, v, b: F.nodeformer_attention(q, k, v, w, graph=edges, b=b, order=2,
                                                                       noise=noise, tau=0.5), (q, k, v, b))
    torch.autograd.gradcheck(lambda q, k: F.edge_loss(q, k, w, edges, tau=0.5, batch=batch), (q, k))
    torch.autograd.gradcheck(lambda q, k: F.kernelized_attention_rows(q, k, w, [0, 3], tau=0.5), (q, k))


def test_edge_loss_large_inputs_float32():
    """std 8 q and k: exponents in the hundreds, float32: finite, and close to the float64 reference."""
    q, k, _, w = _inputs(torch.float32, seed=12, d=8, scale=8.0)
    for batch in (None, BATCH):
        bn = None if batch is None else batch.numpy()
        loss = F.edge_loss(q, k, w, EDGES, batch=batch)
        ell = F.edge_log_likelihood(q, k, w, EDGES, batch=batch)
        assert torch.isfinite(loss) and torch.isfinite(ell).all()
        ref = R.edge_log_likelihood(*_np(q, k, w), _adj(), batch=bn)
        assert np.isfinite(ref).all()
        # each exponent is a GEMM sum of d_qk products plus |x|^2/2, rounded with error ~ sqrt(d_qk) u Z
        # (random-walk round-off, u = 2^-24, Z = the largest exponent magnitude, ~280 here); log pi is a
        # difference of two log-sum-exps, each moved by at most that: |error| <= 2 sqrt(d_qk) u Z
        # (measured: 1.45 u Z, 2.4e-5 absolute, 1.6e-7 relative)
        bound = 2 * 8 ** 0.5 * 2.0 ** -24 * _largest_exponent(q, k, w, 1.0)
        assert float(np.abs(np_(ell) - ref).max()) <= bound
        (gq, gk) = torch.autograd.grad(F.edge_loss(q.requires_grad_(), k.requires_grad_(), w, EDGES, batch=batch),
                                       (q, k))
        assert torch.isfinite(gq).all() and torch.isfinite(gk).all()


def _largest_exponent(q, k, w, tau) -> float:
    """max |w.x| + |x|^2/2 over q's and k's rows, x = q d^(-1/4) / sqrt(tau), in float64."""
    q, k, w = q.detach().double(), k.detach().double(), w.double()
    s = q.shape[-1] ** -0.25 / tau ** 0.5
    return max(float((0.5 * (s * t).square().sum(-1)).max()) + float(((s * t) @ w.T).abs().max()) for t in (q, k))


def test_edge_log_likelihood_d128_std8_float32():
    """d = 128, std 8, tau = 0.25: exponents ~2e3 and log pi down to ~-600 (pi itself underflows float32
    and nearly float64). float32 is finite and within the round-off bound of the float64 reference."""
    g = gen(21)
    n, d, m = 64, 128, 16
    q, k = randn((2, n, d), g, scale=8.0), randn((2, n, d), g, scale=8.0)
    w = randn((m, d), g)
    ei = torch.randint(0, n, (2, 200), generator=g)
    ei = torch.cat([ei, ei.flip(0)], 1)
    adj = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0].numpy(), ei[1].numpy())), shape=(n, n))
    ref = R.edge_log_likelihood(*_np(q, k, w), adj, tau=0.25)
    assert np.isfinite(ref).all() and ref.min() < -300
    for dtype in (torch.float64, torch.float32):
        ell = F.edge_log_likelihood(q.to(dtype), k.to(dtype), w.to(dtype), ei, tau=0.25)
        assert ell.dtype == dtype and torch.isfinite(ell).all()
        # as in test_edge_loss_large_inputs_float32: |error| <= 2 sqrt(d) u Z (measured 3.0 u Z in float32)
        u = torch.finfo(dtype).eps / 2
        assert float(np.abs(np_(ell) - ref).max()) <= 2 * d ** 0.5 * u * _largest_exponent(q, k, w, 0.25)


@pytest.mark.parametrize("tau", [1e-7, 1e-20, 1e-38, 1e-40, 1e-45])
def test_float32_tiny_tau_is_finite_or_refused(tau):
    """float32 with tau below 1e-6: a finite result, or a ValueError naming tau with the numbers (the
    exponents |x|^2/2 ~ |q|^2 / (2 sqrt(d) tau) leave float32's range): never NaN or inf returned."""
    q, k, v, w = (t.float() for t in _inputs(seed=31))
    noise = F.gumbel_noise((2, 2, 2, N), generator=gen(32))
    calls = [lambda: F.kernelized_softmax(q, k, v, w, tau=tau, batch=BATCH),
             lambda: F.kernelized_gumbel_softmax(q, k, v, w, tau=tau, noise=noise),
             lambda: F.kernelized_attention_rows(q, k, w, [0, 5], tau=tau),
             lambda: F.edge_log_likelihood(q, k, w, EDGES, tau=tau, batch=BATCH),
             lambda: F.nodeformer_attention(q, k, v, w, graph=EDGES, b=0.1, tau=tau, noise=noise)]
    outcomes = set()
    for call in calls:
        try:
            out = call()
        except ValueError as exc:
            assert str(exc).startswith(f"tau = {tau!r} is too small"), str(exc)
            outcomes.add("refused")
        else:
            assert torch.isfinite(out).all()
            outcomes.add("finite")
    if tau >= 1e-20:
        assert outcomes == {"finite"}  # |x|^2/2 <= ~1e21 |q|^2: well inside float32
    if tau <= 1e-40:
        assert outcomes == {"refused"}  # s^2/2 = 1 / (2 sqrt(d) tau) > 3.4e38 before any data is read


def test_huge_noise_is_refused_by_name():
    q, k, v, w = (t.float() for t in _inputs(seed=33))
    huge = torch.full((2, 2, 2, N), 1e30)
    with pytest.raises(ValueError, match=r"noise / tau overflows torch.float32: max \|g\| / tau = 1e\+40"):
        F.kernelized_gumbel_softmax(q, k, v, w, tau=1e-10, noise=huge)
    with pytest.raises(ValueError, match=r"noise / tau overflows torch.float32"):
        F.kernelized_gumbel_softmax(q, k, v, w, noise=torch.full((2, 2, 2, N), 1e300, dtype=torch.float64))
    # finite in float64: log space keeps it (each sample picks the keys of largest noise, all equal here)
    out = F.kernelized_gumbel_softmax(*(t.double() for t in (q, k, v, w)), tau=1e-10, noise=huge.double())
    assert torch.isfinite(out).all()


def test_tau_requiring_grad_is_refused():
    q, k, v, w = _inputs()
    with pytest.raises(ValueError, match="tau must not require grad"):
        F.kernelized_softmax(q, k, v, w, tau=torch.tensor(0.5, dtype=torch.float64, requires_grad=True))
    out = F.kernelized_softmax(q, k, v, w, tau=torch.tensor(0.5, dtype=torch.float64))
    assert torch.equal(out, F.kernelized_softmax(q, k, v, w, tau=0.5))


@pytest.mark.parametrize("sizes", [[3] * 70, [2, 3] * 40, [1] * 66 + [40]], ids=["equal", "padded", "uneven"])
def test_many_graphs_match_reference_and_stay_independent(sizes):
    """More than FEW_SEGMENTS (64) graphs: equal sizes (viewed as (G, S) batches), similar sizes
    (padded to S rows) and one large graph among tiny ones (G S > 2 N: per-graph slices) all equal the
    dense reference, and perturbing one graph leaves every other graph's outputs bit for bit unchanged."""
    assert len(sizes) > segments.FEW_SEGMENTS
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    n = int(batch.numel())
    g = gen(40)
    q, k, v = randn((2, n, 4), g), randn((2, n, 4), g), randn((2, n, 3), g)
    w = randn((8, 4), g)
    noise = F.gumbel_noise((2, 2, n), generator=gen(41), dtype=torch.float64)
    qn, kn, vn, wn, bn = *_np(q, k, v, w), batch.numpy()
    tol = EQUIV_TOL[torch.float64]
    out = F.kernelized_softmax(q, k, v, w, tau=0.5, batch=batch)
    assert rel_frobenius(out, R.kernelized_softmax(qn, kn, vn, wn, tau=0.5, batch=bn)) < tol
    out = F.kernelized_gumbel_softmax(q, k, v, w, tau=0.25, noise=noise, batch=batch)
    assert rel_frobenius(out, R.kernelized_gumbel_softmax(qn, kn, vn, wn, np_(noise), tau=0.25, batch=bn)) < tol
    s = int(torch.tensor(sizes[:5]).sum())
    e = s + sizes[5]
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[..., s:e, :] += 0.7
    k2[..., s:e, :] -= 0.4
    v2[..., s:e, :] *= 3.0
    others = torch.cat([torch.arange(s), torch.arange(e, n)])
    for call in (lambda q, k, v: F.kernelized_softmax(q, k, v, w, batch=batch),
                 lambda q, k, v: F.kernelized_gumbel_softmax(q, k, v, w, noise=noise, batch=batch)):
        a, b = call(q, k, v), call(q2, k2, v2)
        assert torch.equal(a[..., others, :], b[..., others, :])
        assert not torch.equal(a[..., s:e, :], b[..., s:e, :])


@pytest.mark.parametrize("sizes", [[1] * 65, [1] * 64 + [2]], ids=["equal", "padded"])
def test_many_graphs_gradcheck(sizes):
    """The batched-GEMM routes of more than 64 graphs (a view, a zero-padded copy) are differentiable."""
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    n = int(batch.numel())
    g = gen(45)
    q, k, v = (randn((n, 2), g).requires_grad_() for _ in range(3))
    w = randn((3, 2), g)
    noise = F.gumbel_noise((2, n), generator=gen(46), dtype=torch.float64)
    torch.autograd.gradcheck(lambda q, k, v: F.kernelized_gumbel_softmax(q, k, v, w, noise=noise, batch=batch),
                             (q, k, v), fast_mode=True)


def test_one_sample():
    """K = 1: the Gumbel output is the one reweighted sample (the reference), drawn or given."""
    q, k, v, w = _inputs(seed=42)
    noise = F.gumbel_noise((1, 2, 2, N), generator=gen(43), dtype=torch.float64)
    out = F.kernelized_gumbel_softmax(q, k, v, w, noise=noise, batch=BATCH)
    ref = R.kernelized_gumbel_softmax(*_np(q, k, v, w), np_(noise), tau=0.25, batch=BATCH.numpy())
    assert rel_frobenius(out, ref) < EQUIV_TOL[torch.float64]
    assert torch.equal(F.kernelized_gumbel_softmax(q, k, v, w, samples=1, generator=gen(43), batch=BATCH), out)


def test_relational_bias_caches_on_the_graph():
    """A fast.Graph keeps its orders and normalised operators: the second call reuses them (same objects)
    and gives the same result as an edge_index input (rebuilt every call)."""
    from fast.graphs import as_graph

    v = randn((2, N, 3), gen(44))
    graph = as_graph(EDGES, n=N)
    first = F.relational_bias(v, graph, 0.3, order=2)
    ops = F._bias_operators(graph, 2, "sym")
    assert F._bias_operators(graph, 2, "sym")[0] is ops[0]
    assert torch.equal(F.relational_bias(v, graph, 0.3, order=2), first)
    torch.testing.assert_close(F.relational_bias(v, EDGES, 0.3, order=2), first, rtol=1e-15, atol=1e-15)
    assert torch.equal(F.relational_bias(v, graph, 0.3, order=1), F.relational_bias(v, EDGES, 0.3, order=1))


def test_bad_inputs():
    q, k, v, w = _inputs()
    noise = F.gumbel_noise((2, 2, 2, N), generator=gen(0), dtype=torch.float64)
    for tau in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tau must be a finite number > 0"):
            F.kernelized_softmax(q, k, v, w, tau=tau)
        with pytest.raises(ValueError, match="tau must be a finite number > 0"):
            F.edge_loss(q, k, w, EDGES, tau=tau)
    with pytest.raises(ValueError, match="samples must be an int >= 1"):
        F.kernelized_gumbel_softmax(q, k, v, w, samples=0)
    with pytest.raises(ValueError, match="projection must have m >= 1 rows"):
        F.kernelized_softmax(q, k, v, w[:0])
    with pytest.raises(ValueError, match=r"noise must have shape \(K, \*k.shape\[:-1\]\) = \(K, 2, 2, 12\)"):
        F.kernelized_gumbel_softmax(q, k, v, w, noise=noise[:, 0])
    bad = noise.clone()
    bad[0, 0, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="noise contains non-finite values"):
        F.kernelized_gumbel_softmax(q, k, v, w, noise=bad)
    with pytest.raises(ValueError, match="noise was given with training=False"):
        F.kernelized_gumbel_softmax(q, k, v, w, noise=noise, training=False)
    with pytest.raises(ValueError, match="samples = 3 disagrees with noise's K = 2"):
        F.kernelized_gumbel_softmax(q, k, v, w, noise=noise, samples=3)
    for order in (0, -1, 1.5):
        with pytest.raises(ValueError, match="order must be an int >= 1"):
            F.relational_bias(v, EDGES, 0.0, order=order)
        with pytest.raises(ValueError, match="order must be an int >= 1"):
            F.adjacency_orders(EDGES, order)
    with pytest.raises(ValueError, match=r"edge_index entries must be < n=12"):
        F.edge_loss(q, k, w, torch.tensor([[0, 12], [12, 0]]))
    with pytest.raises(ValueError, match=r"edge_index entries must be < n=12"):
        F.nodeformer_attention(q, k, v, w, graph=torch.tensor([[0, 12], [12, 0]]), b=0.0)
    with pytest.raises(ValueError, match=r"graph has an edge \(2, 3\) between two graphs of the batch"):
        F.edge_loss(q, k, w, torch.tensor([[2, 3], [3, 2]]), batch=BATCH)
    with pytest.raises(ValueError, match="batch must be sorted"):
        F.kernelized_softmax(q, k, v, w, batch=BATCH.flip(0))
    with pytest.raises(ValueError, match="batch has 11 entries but the inputs have N = 12"):
        F.kernelized_gumbel_softmax(q, k, v, w, batch=BATCH[:11])
    with pytest.raises(ValueError, match="graph was given without b"):
        F.nodeformer_attention(q, k, v, w, graph=EDGES)
    with pytest.raises(ValueError, match=r"b must be a float, a 0-dim tensor or a tensor of shape \(order,\) = \(2,\)"):
        F.relational_bias(v, EDGES, torch.zeros(3, dtype=torch.float64), order=2)
    with pytest.raises(ValueError, match='normalize must be "sym"'):
        F.relational_bias(v, EDGES, 0.0, normalize="row")
    with pytest.raises(ValueError, match=r"rows must be node ids in \[0, N = 12\)"):
        F.kernelized_attention_rows(q, k, w, [0, 12])
    for name in ("q", "k", "v", "w"):
        args = dict(q=q.clone(), k=k.clone(), v=v.clone(), w=w.clone())
        args[name].view(-1)[5] = float("nan")
        want = "projection" if name == "w" else name
        with pytest.raises(ValueError, match=f"{want} contains non-finite values"):
            F.kernelized_softmax(args["q"], args["k"], args["v"], args["w"], batch=BATCH)
        with pytest.raises(ValueError, match=f"{want} contains non-finite values"):
            F.kernelized_gumbel_softmax(args["q"], args["k"], args["v"], args["w"], noise=noise)
        if name != "v":
            with pytest.raises(ValueError, match=f"{want} contains non-finite values"):
                F.edge_loss(args["q"], args["k"], args["w"], EDGES)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        F.gumbel_noise((2, 3), generator=3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_extreme_exponents_match_reference(dtype):
    """|q|, |k| ~ 60 and tau = 1e-4: FAVOR+ exponents ~1e7 apart. The balanced features keep every
    denominator >= 1 (no DenominatorError, no inf/NaN) and the result is the reference's (which
    works in log space too): each query attends to its best key."""
    q, k, v, w = _inputs(dtype, seed=13, scale=30.0)
    for batch in (None, BATCH):
        bn = None if batch is None else batch.numpy()
        out = F.kernelized_softmax(q, k, v, w, tau=1e-4, batch=batch)
        assert rel_frobenius(out, R.kernelized_softmax(*_np(q, k, v, w), tau=1e-4, batch=bn)) < EQUIV_TOL[dtype]


def test_is_favor_attention_with_a_packing_mask():
    """Without noise, the kernelized softmax with a batch vector is fast.favor_attention of q, k
    scaled by 1/sqrt(tau) under fast.PackingMask(batch): the same maths, another stabiliser."""
    from fast import PackingMask, favor_attention

    q, k, v, w = _inputs(seed=14)
    tau = 0.3
    out = F.kernelized_softmax(q, k, v, w, tau=tau, batch=BATCH)
    ref = favor_attention(q / tau ** 0.5, k / tau ** 0.5, v, w, mask=PackingMask(BATCH))
    assert rel_frobenius(out, ref) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    """Half inputs compute in float32: attention and edge_log_likelihood come back in the input dtype,
    edge_loss in float32."""
    q, k, v, w = (t.to(dtype) for t in _inputs(seed=15))
    out = F.kernelized_gumbel_softmax(q, k, v, w, generator=gen(1), batch=BATCH)
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = F.kernelized_gumbel_softmax(*(t.float() for t in (q, k, v, w)), generator=gen(1), batch=BATCH)
    # same (half-rounded) inputs and noise, computed in float32 both times: the only difference is the final
    # rounding of the output to the half dtype, relative 2^-11 (float16) or 2^-8 (bfloat16) per entry
    assert rel_frobenius(out, ref) <= torch.finfo(dtype).eps
    ell = F.edge_log_likelihood(q, k, w, EDGES, batch=BATCH)
    assert ell.dtype == dtype and torch.isfinite(ell).all()
    loss = F.edge_loss(q, k, w, EDGES, batch=BATCH)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


@pytest.mark.parametrize("device", DEVICES)
def test_device_matches_cpu(device):
    """Every input on ``device`` (edge_index and batch too): the output stays there and equals the CPU
    run fed the scipy adjacency (same algorithm: float64 round-off, 1e-12) and the dense reference
    (EQUIV_TOL); generator routes draw where documented; edge_loss agrees with CPU and the reference."""
    q, k, v, w = _inputs(seed=16)
    dq, dk, dv, dw = (t.to(device) for t in (q, k, v, w))
    noise = F.gumbel_noise((3, 2, 2, N), generator=gen(2), dtype=torch.float64)
    cpu = F.nodeformer_attention(q, k, v, w, graph=_adj(), b=0.1, order=2, noise=noise, batch=BATCH)
    dev = F.nodeformer_attention(dq, dk, dv, dw, graph=EDGES.to(device), b=0.1, order=2, noise=noise.to(device),
                                 batch=BATCH.to(device))
    assert dev.device == dv.device
    assert rel_frobenius(dev, cpu) < 1e-12
    ref = R.nodeformer_attention(*_np(q, k, v, w), graph=_adj(), b=0.1, order=2, noise=np_(noise),
                                 batch=BATCH.numpy())
    assert rel_frobenius(dev, ref) < EQUIV_TOL[torch.float64]
    # a CPU generator with inputs on the device: K = 2 draws on the CPU in the compute dtype, moved
    out = F.kernelized_gumbel_softmax(dq, dk, dv, dw, samples=2, generator=gen(3))
    assert out.device == dv.device
    same = F.gumbel_noise((2, 2, 2, N), generator=gen(3), dtype=torch.float64)
    assert rel_frobenius(out, F.kernelized_gumbel_softmax(q, k, v, w, noise=same)) < 1e-12
    # no generator: a fresh OS-seeded one on the target device, drawn there in the compute dtype
    drawn = F.gumbel_noise((3, 5), device=device)
    assert drawn.device.type == device and drawn.dtype == torch.float32 and torch.isfinite(drawn).all()
    out = F.kernelized_gumbel_softmax(dq, dk, dv, dw, samples=2)
    assert out.device == dv.device and torch.isfinite(out).all()
    loss = F.edge_loss(dq, dk, dw, EDGES.to(device), batch=BATCH.to(device))
    assert loss.device == dv.device
    cpu_loss = float(F.edge_loss(q, k, w, _adj(), batch=BATCH))
    assert abs(float(loss) - cpu_loss) <= 1e-12 * abs(cpu_loss)
    ref_loss = R.edge_loss(*_np(q, k, w), _adj(), batch=BATCH.numpy())
    assert abs(float(loss) - ref_loss) <= EQUIV_TOL[torch.float64] * abs(ref_loss)


# ------------------------------------------------------------------ clear refusals (issue 24)


@pytest.mark.parametrize("shape", ["abc", (2, 2.5), (2, "3"), 2.0, (True, 2), None])
def test_gumbel_noise_shape_must_be_ints(shape):
    """"abc" used to fail inside int() ("invalid literal"), 2.5 was truncated to 2."""
    with pytest.raises(TypeError, match=r"shape must be an int or a sequence of ints, got "):
        F.gumbel_noise(shape, generator=gen(0))


def test_gumbel_noise_accepts_sizes_and_tensors_of_ints():
    g = F.gumbel_noise(torch.Size([2, 3]), generator=gen(0))
    assert g.shape == (2, 3)
    assert F.gumbel_noise((torch.tensor(2), np.int64(3)), generator=gen(0)).shape == (2, 3)


@pytest.fixture
def ram_8gib(monkeypatch):
    """memory_limit pinned to 8 GiB, so that a refusal does not depend on the test machine's RAM."""
    import fast.validation

    monkeypatch.setattr(fast.validation, "memory_limit", lambda device=None: 8 * 2**30)


def test_absurd_gumbel_sizes_are_refused_before_allocating(ram_8gib):
    with pytest.raises(MemoryError, match=r"shape = \(1000000000, 1000000000\) asks for the Gumbel noise .*TiB"):
        F.gumbel_noise((10**9, 10**9), generator=gen(0))
    q, k, v, w = (randn(s, gen(i)) for i, s in enumerate([(8, 4), (8, 4), (8, 3), (6, 4)]))
    with pytest.raises(MemoryError, match=r"samples = 1000000000 asks for 2 x the key features of every Gumbel sample"):
        F.kernelized_gumbel_softmax(q, k, v, w, samples=10**9, generator=gen(0))
    with pytest.raises(MemoryError, match=r"samples = 1000000000 asks for"):
        F.nodeformer_attention(q, k, v, w, samples=10**9, generator=gen(0))


def test_absurd_orders_and_rows_are_refused_before_allocating(ram_8gib):
    cycle = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 0, 0, 1, 2, 3]])
    with pytest.raises(MemoryError, match=r"order = 1000000000 asks for the adjacency orders"):
        F.adjacency_orders(cycle, 10**9)
    n = 100_000
    q = torch.zeros(n, 2)
    with pytest.raises(MemoryError, match=r"rows of R = 100000 node ids asks for 3 x the attention rows .* more than "
                                          r"this machine's memory \(RAM\), 8 GiB"):
        F.kernelized_attention_rows(q, q, torch.ones(3, 2), torch.arange(n))


def test_gumbel_device_and_attention_rows_that_are_not_ids_are_named():
    with pytest.raises(ValueError, match=r"device must name a torch device"):
        F.gumbel_noise(3, device="abc")
    q, w = randn((6, 4), gen(0)), randn((5, 4), gen(1))
    for rows in (None, {"a": 1}, object()):
        with pytest.raises(TypeError, match=r"rows must be a 1-D integer tensor or sequence of node ids"):
            F.kernelized_attention_rows(q, q, w, rows)


def test_a_graph_larger_than_the_inputs_says_where_n_came_from():
    """v of N = 5 rows with a 6-node graph: the error says n is the inputs' N (issue 24)."""
    cycle = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 4, 5]])
    with pytest.raises(ValueError, match=r"graph \(on the N = 5 nodes of the inputs\): edge_index entries must be < n=5"):
        F.relational_bias(randn((5, 3), gen(0)), cycle, 0.1)
