"""fast.masks.grf: WalkFeatures / GRFMask / GRFAsymMask against reference.masks.grf on identical walks."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fast import masked_linear_attention
from fast.graphs import Graph
from fast.operator import MaskOperator
from fast.masks.explicit import DenseMask
from fast.masks.grf import GRFAsymMask, GRFMask, WalkFeatures, grf_features
from fast.walks import sample_walks
from reference.masks import grf as ref
from tests.helpers import DEVICES
from tests.reference.masks.test_grf import small_graph, walks_dict


def graphs() -> dict[str, sp.csr_matrix]:
    grid = sp.csr_matrix(nx.to_scipy_sparse_array(nx.grid_2d_graph(3, 4), dtype=float))
    loops = sp.csr_matrix(np.array([[0.5, 1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 2.0, 3.0]]))  # self-loops at 0, 2
    return {"path": sp.csr_matrix(nx.to_scipy_sparse_array(nx.path_graph(7), dtype=float)), "grid": grid,
            "weighted": small_graph(), "loops": loops, "isolated": sp.csr_matrix((4, 4))}


WALK_MODES = {"halting": {"p_halt": 0.4}, "capped": {"p_halt": 0.5, "i_max": 2},
              "fixed": {"fixed_length": 3}, "antithetic": {"p_halt": 0.3, "antithetic": True},
              "repelling": {"p_halt": 0.3, "repelling": True}}

F = [1.0, -0.5, 0.3, 0.2, -0.1]


def sampled(adj, mode: str, seed: int, n_walkers: int = 4):
    return sample_walks(Graph.from_any(adj), n_walkers, generator=torch.Generator().manual_seed(seed), **WALK_MODES[mode])


def close(a: torch.Tensor, b: np.ndarray, dtype: torch.dtype, scale: float | None = None):
    """|a - b| <= tol * scale, tol 1e-12 (float64) or 1e-5 (float32), scale = max |b| by default."""
    b = np.asarray(b)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    scale = scale if scale is not None else max(np.abs(b).max(), 1e-300)
    err = np.abs(a.detach().cpu().double().numpy() - b).max()
    assert err <= tol * scale, (err, scale)


@pytest.mark.parametrize("mode", list(WALK_MODES))
@pytest.mark.parametrize("name", list(graphs()))
def test_features_equal_reference_on_sampled_walks(name, mode):
    adj = graphs()[name]
    walks = sampled(adj, mode, seed=len(name) + len(mode))
    g = WalkFeatures(Graph.from_any(adj), walks, torch.tensor(F, dtype=torch.float64))
    want = ref.grf_features(adj, walks.to_numpy(), F)
    close(g.to_dense(), want, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("device", DEVICES)
def test_products_equal_reference(dtype, device):
    """matmul / rmatmul / abs_matmul of GRFMask (independent and shared) and GRFAsymMask vs dense
    G_q G_k^T on identical walks, x with leading dims."""
    adj = small_graph()
    n = adj.shape[0]
    graph = Graph.from_any(adj, device=device)
    wq, wk = sampled(adj, "halting", 1), sampled(adj, "halting", 2)
    f = torch.tensor(F, dtype=torch.float64, device=device)
    fq, fk = WalkFeatures(graph, wq, f), WalkFeatures(graph, wk.to_numpy(), f)  # a dict of fields works too
    gq, gk = ref.grf_features(adj, wq.to_numpy(), F), ref.grf_features(adj, wk.to_numpy(), F)
    x = torch.randn(2, 3, n, 5, dtype=dtype, generator=torch.Generator().manual_seed(0)).to(device)
    xn = x.cpu().double().numpy()
    m = GRFMask(fq, fk)
    scale = np.abs(gq).max() * np.abs(gk).max() * n * np.abs(xn).max()
    close(m.matmul(x), gq @ gk.T @ xn, dtype, scale)
    close(m.rmatmul(x), gk @ gq.T @ xn, dtype, scale)
    # abs_matmul: the features of |f| (>= |G| entrywise: a pair summing prefixes of several t)
    aq, ak = (ref.grf_features(adj, w.to_numpy(), np.abs(F)) for w in (wq, wk))
    assert (aq >= np.abs(gq)).all() and (aq > np.abs(gq) + 1e-3).any()
    close(m.abs_matmul(x), aq @ ak.T @ xn, dtype, scale)
    assert m.matmul(x).dtype == dtype and m.matmul(x).shape == x.shape
    shared = GRFMask(fq)
    close(shared.matmul(x), gq @ gq.T @ xn, dtype, np.abs(gq).max() ** 2 * n * np.abs(xn).max())
    asym = GRFAsymMask(fq)
    close(asym.matmul(x), gq @ xn, dtype, np.abs(gq).max() * n * np.abs(xn).max())
    close(asym.rmatmul(x), gq.T @ xn, dtype, np.abs(gq).max() * n * np.abs(xn).max())
    close(asym.abs_matmul(x), aq @ xn, dtype, np.abs(aq).max() * n * np.abs(xn).max())
    assert isinstance(m, MaskOperator) and not m.nonnegative  # F has negative entries


def test_hand_built_walks_and_merging():
    """Path 0-1-2 (p_halt = 1/2), walk 0, 1, 2, 1, 2: loads 1, 2, 8, 16, 64; node 2 is visited at
    t = 2 and t = 4 (two entries of one pair); the 3-hop prefix ends at 1."""
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float))
    w = walks_dict(3, 1, 0.5, [[0, 1, 2, 1, 2], [1], [2]])
    f = torch.tensor([1.0, 0.5, 0.25, 0.125, 1 / 16], dtype=torch.float64)
    g = grf_features(Graph.from_any(adj), w, f)
    dense = g.to_dense()
    # loads: t=1: 1*1/0.5 = 2; t=2: 2*1*2/0.5 = 8; t=3: 8*1*1/0.5 = 16; t=4: 16*1*2/0.5 = 64
    np.testing.assert_allclose(dense[0].numpy(), [1.0, 0.5 * 2 + 0.125 * 16, 0.25 * 8 + 64 / 16], rtol=1e-15)
    np.testing.assert_allclose(dense.numpy(), ref.grf_features(adj, w, f.numpy()), rtol=1e-15)
    assert g.nnz == 5 and g.nnz_per_row.tolist() == [3, 1, 1]
    assert g.nnz_stats() == {"mean": 5 / 3, "max": 3}


def test_wide_key_path_builds_the_same_matrix(monkeypatch):
    """The fallback for N^2 (K + 1) >= 2^62 (pairs numbered first) gives the same G."""
    import fast.masks.grf as grf_module

    adj = graphs()["weighted"]
    walks = sampled(adj, "halting", 4, n_walkers=6)
    f = torch.tensor(F, dtype=torch.float64)
    want = WalkFeatures(Graph.from_any(adj), walks, f)
    monkeypatch.setattr(grf_module, "_KEY_LIMIT", 0)
    got = WalkFeatures(Graph.from_any(adj), walks, f)
    assert torch.equal(got.to_dense(), want.to_dense()) and not want.prefixes.one_per_pair
    for name in ("pair_row", "pair_col", "entry_pair", "entry_t", "perm_t", "crow_t", "col_t"):
        assert torch.equal(getattr(got.prefixes, name), getattr(want.prefixes, name)), name


def test_nnz_counts_distinct_visited_nodes():
    adj = graphs()["grid"]
    walks = sampled(adj, "halting", 5, n_walkers=4)
    k = 3  # f of length 4: prefixes of <= 3 hops
    g = WalkFeatures(Graph.from_any(adj), walks, torch.ones(k + 1, dtype=torch.float64))
    d = walks.to_numpy()
    want = []
    for i in range(adj.shape[0]):
        seen = set()
        for w in range(i * 4, i * 4 + 4):
            seen.update(d["nodes"][d["offsets"][w]:d["offsets"][w + 1]][:k + 1].tolist())
        want.append(len(seen))
    assert g.nnz_per_row.tolist() == want
    assert g.nnz_stats() == {"mean": sum(want) / len(want), "max": max(want)}
    assert GRFMask(g).nnz_stats() == g.nnz_stats()


def test_gradcheck_wrt_x_and_f():
    adj = small_graph()
    graph = Graph.from_any(adj)
    wq, wk = sampled(adj, "capped", 3, n_walkers=2), sampled(adj, "capped", 4, n_walkers=2)
    f = torch.tensor([0.9, -0.4, 0.3], dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, adj.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                    requires_grad=True)

    def masked(x, f):
        return GRFMask(WalkFeatures(graph, wq, f), WalkFeatures(graph, wk, f)).matmul(x)

    def transposed(x, f):
        return GRFMask(WalkFeatures(graph, wq, f), WalkFeatures(graph, wk, f)).rmatmul(x)

    def asym(x, f):
        return GRFAsymMask(WalkFeatures(graph, wq, f)).matmul(x)

    for fn in (masked, transposed, asym):
        assert torch.autograd.gradcheck(fn, (x, f))
    assert torch.autograd.gradgradcheck(masked, (x, f))
    # f alone (x constant): the Function still runs
    assert torch.autograd.gradcheck(lambda f: masked(x.detach(), f), (f,))


def test_f_gradient_matches_dense_autograd():
    """d/df of sum(w * (G_q G_k^T x)) equals autograd through the dense matrices built from f."""
    adj = graphs()["grid"]
    graph = Graph.from_any(adj)
    wq, wk = sampled(adj, "halting", 8), sampled(adj, "halting", 9)
    f = torch.tensor(F, dtype=torch.float64, requires_grad=True)
    m = GRFMask(WalkFeatures(graph, wq, f), WalkFeatures(graph, wk, f))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(adj.shape[0], 4, dtype=torch.float64, generator=gen)
    w = torch.randn(adj.shape[0], 4, dtype=torch.float64, generator=gen)
    (gf,) = torch.autograd.grad((w * m.matmul(x)).sum(), f)
    # dense: G(f) = sum_t f_t G(e_t), linear in f
    basis = [torch.as_tensor(ref.grf_features(adj, wq.to_numpy(), np.eye(5)[t])) for t in range(5)]
    basis_k = [torch.as_tensor(ref.grf_features(adj, wk.to_numpy(), np.eye(5)[t])) for t in range(5)]
    gq = sum(f[t] * basis[t] for t in range(5))
    gk = sum(f[t] * basis_k[t] for t in range(5))
    (want,) = torch.autograd.grad((w * (gq @ gk.T @ x)).sum(), f)
    torch.testing.assert_close(gf, want, rtol=1e-11, atol=1e-11 * want.abs().max().item())


def test_in_place_update_of_f_reaches_the_next_call():
    adj = small_graph()
    walks = sampled(adj, "halting", 6)
    f = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64, requires_grad=True)
    m = GRFMask(WalkFeatures(Graph.from_any(adj), walks, f))
    x = torch.randn(adj.shape[0], 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert m.nonnegative and list(m.parameters()) == [f]  # shared: f once
    with torch.no_grad():
        f[1] = -2.0  # what an optimiser step does
    g = ref.grf_features(adj, walks.to_numpy(), [1.0, -2.0, 0.25])
    close(m.matmul(x), g @ g.T @ x.numpy(), torch.float64)
    assert not m.nonnegative
    with torch.no_grad():
        f.mul_(0.0).add_(1.0)
    g = ref.grf_features(adj, walks.to_numpy(), [1.0, 1.0, 1.0])
    close(m.matmul(x), g @ g.T @ x.numpy(), torch.float64)
    assert m.nonnegative
    # a plain tensor (no grad) updated with copy_, float32 products (the cached CSR must follow)
    alpha = torch.tensor([1.0, 0.5], dtype=torch.float64)
    asym = GRFAsymMask(WalkFeatures(Graph.from_any(adj), walks, alpha))
    x32 = x.float()
    close(asym.matmul(x32), ref.grf_features(adj, walks.to_numpy(), [1.0, 0.5]) @ x.numpy(), torch.float32)
    alpha.copy_(torch.tensor([0.2, 3.0]))
    close(asym.matmul(x32), ref.grf_features(adj, walks.to_numpy(), [0.2, 3.0]) @ x.numpy(), torch.float32)
    close(asym.rmatmul(x32), ref.grf_features(adj, walks.to_numpy(), [0.2, 3.0]).T @ x.numpy(), torch.float32)


def test_masked_attention_through_the_driver_with_learnable_f():
    """fast.masked_linear_attention with GRFMask equals the DenseMask of G_q G_k^T, outputs and
    gradients (q-, k-, v-features and f)."""
    adj = graphs()["grid"]
    n = adj.shape[0]
    graph = Graph.from_any(adj)
    wq, wk = sampled(adj, "halting", 10), sampled(adj, "halting", 11)
    gen = torch.Generator().manual_seed(4)
    phi_q, phi_k = (torch.rand(2, n, 3, dtype=torch.float64, generator=gen) + 0.1 for _ in range(2))
    v = torch.randn(2, n, 4, dtype=torch.float64, generator=gen)
    f1 = torch.tensor([1.0, 0.6, 0.3], dtype=torch.float64, requires_grad=True)
    f2 = f1.detach().clone().requires_grad_(True)
    out = masked_linear_attention(phi_q, phi_k, v, GRFMask(WalkFeatures(graph, wq, f1), WalkFeatures(graph, wk, f1)))
    dense = (WalkFeatures(graph, wq, f2).to_dense() @ WalkFeatures(graph, wk, f2).to_dense().T)
    want = masked_linear_attention(phi_q, phi_k, v, DenseMask(dense))
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    (g1,) = torch.autograd.grad(out.square().sum(), f1)
    (g2,) = torch.autograd.grad(want.square().sum(), f2)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-12)


def test_monte_carlo_mean_of_fast_features():
    """The fast G of many walkers is within the Hoeffding bound of sum_{k <= i_max} f_k W^k (the
    per-walk range bounded by the largest possible load, here on a path with weights 1)."""
    adj = graphs()["path"]
    n, p_halt, i_max, n_walkers = adj.shape[0], 0.5, 2, 20000
    f = [1.0, 0.5, 0.25]
    walks = sample_walks(Graph.from_any(adj), n_walkers, p_halt=p_halt, i_max=i_max,
                         generator=torch.Generator().manual_seed(12))
    mean = WalkFeatures(Graph.from_any(adj), walks, torch.tensor(f, dtype=torch.float64)).to_dense().numpy()
    # one walk adds at most sum_t f_t (2 / (1 - p))^t to one entry: X_ij in [0, that]
    top = sum(f[t] * (2 / (1 - p_halt)) ** t for t in range(3))
    t = top * math.sqrt(math.log(2 * n * n / 1e-6) / (2 * n_walkers))
    assert np.abs(mean - ref.grf_expected_features(adj, f, i_max=i_max)).max() <= t


def test_bad_input():
    adj = small_graph()
    graph = Graph.from_any(adj)
    w = walks_dict(6, 1, 0.5, [[i] for i in range(6)])
    with pytest.raises(ValueError, match="f must be a non-empty 1-D"):
        WalkFeatures(graph, w, [])
    with pytest.raises(ValueError, match="f must be a non-empty 1-D"):
        WalkFeatures(graph, w, torch.ones(2, 2))
    with pytest.raises(ValueError, match="f contains non-finite"):
        WalkFeatures(graph, w, torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="f must be a floating tensor"):
        WalkFeatures(graph, w, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="graph of 5 nodes"):
        WalkFeatures(graph, walks_dict(5, 1, 0.5, [[i] for i in range(5)]), [1.0])
    with pytest.raises(ValueError, match="p_halt"):
        WalkFeatures(graph, {**w, "p_halt": 1.0}, [1.0])
    with pytest.raises(ValueError, match="not an edge"):
        WalkFeatures(graph, walks_dict(6, 1, 0.5, [[0, 2]] + [[i] for i in range(1, 6)]), [1.0, 1.0])
    with pytest.raises(TypeError, match="lacks"):
        WalkFeatures(graph, {"n_nodes": 6}, [1.0])
    g6 = WalkFeatures(graph, w, [1.0])
    g3 = WalkFeatures(Graph.from_any(sp.csr_matrix((3, 3))), walks_dict(3, 1, 0.5, [[0], [1], [2]]), [1.0])
    with pytest.raises(ValueError, match="one graph"):
        GRFMask(g6, g3)
    with pytest.raises(TypeError, match="features_q must be a WalkFeatures"):
        GRFMask(np.eye(6))
    with pytest.raises(ValueError, match="N=6"):
        GRFMask(g6).matmul(torch.ones(5, 2))


def test_inference_mode_f_is_followed_without_a_version_counter():
    """An inference tensor has no version counter: the CSR is rebuilt at every call, so an update
    made inside inference mode still reaches the next call."""
    adj = small_graph()
    walks = sampled(adj, "halting", 13)
    x = torch.ones(adj.shape[0], 2, dtype=torch.float64)
    with torch.inference_mode():
        f = torch.tensor([1.0, 0.5], dtype=torch.float64)
        m = GRFMask(WalkFeatures(Graph.from_any(adj), walks, f))
        y1 = m.matmul(x)
        f.mul_(2.0)
        y2 = m.matmul(x)
    torch.testing.assert_close(y2, 4 * y1)


# ------------------------------------------------------------ per-key stabilised attend (numerics)


def dense_of(mask) -> torch.Tensor:
    """The mask as a dense float64 (N, N) matrix, by its matmul on the identity."""
    return mask.matmul(torch.eye(mask.n, dtype=torch.float64))


def stabilised_inputs(n: int, lead: tuple = (2, 3), m: int = 4, d: int = 3, spread: float = 2.0, seed: int = 0):
    """(z, phi_q, v) float64: key exponents z (*lead, n, m) = spread * N(0, 1), query features in
    [0.1, 1.1), values N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    z = spread * torch.randn(*lead, n, m, generator=gen, dtype=torch.float64)
    phi_q = torch.rand(*lead, n, m, generator=gen, dtype=torch.float64) + 0.1
    v = torch.randn(*lead, n, d, generator=gen, dtype=torch.float64)
    return z, phi_q, v


def check_stabilised_attend(mask, *, lead: tuple = (2, 3), seed: int = 0, spread: float = 2.0,
                            units: bool = True) -> None:
    """attend(phi_q, exp(z - c), v, key_log_scale=c) against the dense products of the TRUE features
    exp(z) (float64): the quotient to 1e-12 relative, and (units, a nonnegative mask) den_i =
    exp(-r_i) x the true den_i with r_i = max of c_j over the keys of row i (M_ij > 0); rows that
    see no key (0, 0) exactly. The plain attend (no key_log_scale) on the true features too."""
    n = mask.n
    z, phi_q, v = stabilised_inputs(n, lead, seed=seed, spread=spread)
    c = mask.key_stabilizer(z)
    assert c.shape == ((*lead, n, 1) if units else (*lead, 1, 1)) and not c.requires_grad
    c = c.expand(*lead, n, 1)  # as fast.favor_attention passes it
    phi_true = torch.exp(z)
    num, den = mask.attend(phi_q, torch.exp(z - c), v, key_log_scale=c)
    dense = dense_of(mask)
    terms = dense * torch.einsum("...im,...jm->...ij", phi_q, phi_true)  # (*lead, n, n)
    want_num, want_den = terms @ v, terms.sum(-1)
    seen = want_den != 0
    out = num / den.unsqueeze(-1)
    want = want_num / want_den.unsqueeze(-1)
    scale = (terms.abs() @ v.abs()) / want_den.abs().unsqueeze(-1)
    assert bool(((out - want).abs() <= 1e-12 * scale + 1e-300)[seen].all())
    assert bool((den[~seen] == 0).all()) and bool((num[~seen] == 0).all())
    assert bool(torch.isfinite(num).all()) and bool(torch.isfinite(den).all())
    if units:
        cj = c.squeeze(-1).unsqueeze(-2).expand(*lead, n, n)
        r = torch.where(dense > 0, cj, torch.full_like(cj, -torch.inf)).amax(-1)
        torch.testing.assert_close(den[seen], (want_den * torch.exp(-r))[seen], rtol=1e-12, atol=0)
    plain_num, plain_den = mask.attend(phi_q, phi_true, v)
    torch.testing.assert_close(plain_den, want_den, rtol=1e-12, atol=1e-300)
    torch.testing.assert_close(plain_num, want_num, rtol=1e-12, atol=1e-12 * float(want_num.abs().max()))


def far_keys_inputs(n: int, seed: int = 0, d: int = 4, m: int = 8, lead: tuple = (1, 2), top: float = 24.0):
    """(q, k, v, projection) float64 for fast.favor_attention whose key exponents fall smoothly along
    the node order: k_j = a_j e_1 with a_j from 0 to ``top``, so z_j ~ -a_j^2 / (2 sqrt d) spans
    ~top^2 / 4 = 144 units over the graph while a few hops span ~20. With the per-slice max the
    keys at the far end underflow in float32 (exp(-144) < 2^-126): their rows are refused."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.linspace(0.0, top, n, dtype=torch.float64)
    k = torch.zeros(*lead, n, d, dtype=torch.float64)
    k[..., 0] = a + 0.1 * torch.randn(*lead, n, generator=gen, dtype=torch.float64)
    q = 0.5 * torch.randn(*lead, n, d, generator=gen, dtype=torch.float64)
    v = torch.randn(*lead, n, 3, generator=gen, dtype=torch.float64)
    projection = torch.randn(m, d, generator=gen, dtype=torch.float64)
    return q, k, v, projection


def check_far_keys(mask, *, n: int, seed: int = 0) -> None:
    """favor_attention in float32 (and bfloat16) against float64 on far_keys_inputs: every row within
    1e-3 (bfloat16 1e-2) relative. With the per-slice stabiliser the float32 call raised
    DenominatorError (float32 cannot hold exp(-144))."""
    from fast import favor_attention

    q, k, v, projection = far_keys_inputs(n, seed)
    ref64 = favor_attention(q, k, v, projection, mask)
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 1e-2)):
        args = [t.to(dtype) for t in (q, k, v, projection)]
        want = ref64 if dtype == torch.float32 else favor_attention(*[t.double() for t in args], mask)
        out = favor_attention(*args, mask).double()
        err = (out - want).norm(dim=-1) / want.norm(dim=-1)
        assert float(err.max()) <= tol, (dtype, float(err.max()))


def path_walks(n: int, seed: int, **kw):
    adj = sp.csr_matrix(nx.to_scipy_sparse_array(nx.path_graph(n), dtype=float))
    walks = sample_walks(Graph.from_any(adj), 4, generator=torch.Generator().manual_seed(seed),
                         **(kw or {"p_halt": 0.5}))
    return Graph.from_any(adj), walks


HEAT_F = [1.0, 0.5, 0.125, 1.0 / 48.0]


@pytest.mark.parametrize("kind", ["independent", "shared", "asym"])
@pytest.mark.parametrize("name", ["grid", "weighted", "loops", "isolated"])
def test_stabilised_attend_equals_the_true_products(kind, name):
    adj = graphs()[name]
    graph = Graph.from_any(adj)
    f = torch.tensor(HEAT_F, dtype=torch.float64)
    fq = WalkFeatures(graph, sampled(adj, "halting", 1), f)
    mask = {"independent": lambda: GRFMask(fq, WalkFeatures(graph, sampled(adj, "halting", 2), f)),
            "shared": lambda: GRFMask(fq), "asym": lambda: GRFAsymMask(fq)}[kind]()
    assert mask.rescales_keys
    for lead in [(2, 3), (), (1,)]:
        check_stabilised_attend(mask, lead=lead, spread=3.0)


def test_stabilised_attend_rows_without_keys_and_zero_valued_entries():
    """f = (0, 1): every t = 0 pair (i, i) is stored with value 0. On the isolated graph no row sees a
    key: (0, 0), never NaN. On the path, the zero-valued self entries must not set a row's scale:
    with a huge c_i on every other node, the rows still come out in their own keys' units."""
    adj = graphs()["isolated"]
    mask = GRFAsymMask(WalkFeatures(Graph.from_any(adj), sampled(adj, "halting", 1), [0.0, 1.0]))
    check_stabilised_attend(mask)
    graph, walks = path_walks(9, 3)
    mask = GRFAsymMask(WalkFeatures(graph, walks, [0.0, 1.0]))
    check_stabilised_attend(mask, spread=40.0)
    both = GRFMask(WalkFeatures(graph, walks, [0.0, 1.0]), WalkFeatures(graph, path_walks(9, 4)[1], [0.0, 1.0]))
    check_stabilised_attend(both, spread=40.0)


@pytest.mark.parametrize("kind", ["independent", "shared", "asym"])
def test_stabilised_float32_matches_float64_where_the_slice_max_underflows(kind):
    n = 40
    graph, wq = path_walks(n, 5)
    _, wk = path_walks(n, 6)
    f = torch.tensor(HEAT_F, dtype=torch.float64)
    mask = {"independent": lambda: GRFMask(WalkFeatures(graph, wq, f), WalkFeatures(graph, wk, f)),
            "shared": lambda: GRFMask(WalkFeatures(graph, wq, f)),
            "asym": lambda: GRFAsymMask(WalkFeatures(graph, wq, f))}[kind]()
    check_far_keys(mask, n=n)


def test_stabilised_attend_gradcheck_with_f():
    adj = small_graph()
    graph = Graph.from_any(adj)
    n = adj.shape[0]
    wq, wk = sampled(adj, "capped", 3, n_walkers=2), sampled(adj, "capped", 4, n_walkers=2)
    z, phi_q, v = stabilised_inputs(n, (2,), m=2, d=2, spread=3.0, seed=7)
    c = z.amax(-1, keepdim=True)
    phi_k = torch.exp(z - c)
    f = torch.tensor([0.9, 0.4, 0.3], dtype=torch.float64, requires_grad=True)
    inputs = (phi_q.requires_grad_(True), phi_k.requires_grad_(True), v.requires_grad_(True), f)

    def two_sided(pq, pk, vv, ff):
        return GRFMask(WalkFeatures(graph, wq, ff), WalkFeatures(graph, wk, ff)).attend(pq, pk, vv, key_log_scale=c)

    def asym(pq, pk, vv, ff):
        return GRFAsymMask(WalkFeatures(graph, wq, ff)).attend(pq, pk, vv, key_log_scale=c)

    for fn in (two_sided, asym):
        assert torch.autograd.gradcheck(fn, inputs)
    # double backward: the block-diagonal value gradient's differentiable (gather) path, S = 2
    assert torch.autograd.gradgradcheck(two_sided, inputs)
    # constant f: the adjoint backward of masked_products (rmatmul of the per-call operator)
    fc = f.detach()
    assert torch.autograd.gradcheck(lambda pq, pk, vv: two_sided(pq, pk, vv, fc), inputs[:3])
    assert torch.autograd.gradcheck(lambda pq, pk, vv: asym(pq, pk, vv, fc), inputs[:3])


def test_signed_f_keeps_one_constant_per_slice():
    """Signed f: key_stabilizer gives the per-slice max (the guard's abs_matmul floor needs equal
    constants); attend with it is the plain product."""
    adj = graphs()["grid"]
    mask = GRFMask(WalkFeatures(Graph.from_any(adj), sampled(adj, "halting", 1), F))
    assert not mask.nonnegative
    z, _, _ = stabilised_inputs(adj.shape[0])
    c = mask.key_stabilizer(z)
    assert c.shape == (2, 3, 1, 1) and torch.equal(c, z.amax(dim=(-2, -1), keepdim=True))
    check_stabilised_attend(mask, units=False)


def test_bad_key_log_scale():
    adj = graphs()["grid"]
    mask = GRFMask(WalkFeatures(Graph.from_any(adj), sampled(adj, "halting", 1), HEAT_F))
    z, phi_q, v = stabilised_inputs(adj.shape[0])
    with pytest.raises(ValueError, match="key_log_scale"):
        mask.attend(phi_q, torch.exp(z), v, key_log_scale=torch.zeros(2, 3, adj.shape[0]))
    with pytest.raises(ValueError, match="key_log_scale"):
        mask.attend(phi_q, torch.exp(z), v, key_log_scale=torch.zeros(5, adj.shape[0], 1))


def test_float32_values_survive_loads_beyond_float32_range():
    """A load above float32's max times a tiny f_t is a moderate value: formed in float64, the
    float32 product is finite and matches float64 (heavy weights, fixed-length walks)."""
    from fast.graphs import as_graph
    from fast.masks.grf import GRFAsymMask, grf_features
    from fast.walks import sample_walks
    from verify.problems import path_graph

    g = as_graph(path_graph(6) * 1e13)
    walks = sample_walks(g, 2, fixed_length=3, generator=torch.Generator().manual_seed(0))
    f = torch.tensor([1.0, 1e-13, 1e-26, 1e-39], dtype=torch.float64)
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = GRFAsymMask(grf_features(g, walks, f)).matmul(x)
    got = GRFAsymMask(grf_features(g, walks, f)).matmul(x.float())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
