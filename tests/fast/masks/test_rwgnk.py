"""fast.masks.rwgnk: RWGNKMask (choromanski22 Eq. 5) against reference.masks.rwgnk on identical walks."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fast.graphs import Graph
from fast.masks.rwgnk import RWGNKMask, rwgnk_features
from fast.walks import sample_walks
from reference.masks import rwgnk as ref
from tests.fast.masks.test_grf import close, graphs
from tests.helpers import DEVICES
from tests.reference.masks.test_grf import small_graph, walks_dict

MODES = {"halting": {"p_halt": 0.4, "choice": "weighted"}, "capped": {"p_halt": 0.3, "i_max": 2, "choice": "weighted"},
         "fixed": {"fixed_length": 3, "choice": "weighted"}, "uniform": {"p_halt": 0.5}}


@pytest.mark.parametrize("alpha", [0, 1])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(graphs()))
def test_features_equal_reference_on_sampled_walks(name, mode, alpha):
    adj = graphs()[name]
    walks = sample_walks(Graph.from_any(adj), 3, generator=torch.Generator().manual_seed(len(name)), **MODES[mode])
    psi = rwgnk_features(Graph.from_any(adj), walks, 0.7, alpha).to_dense()
    close(psi, ref.rwgnk_features(adj, walks.to_numpy(), 0.7, alpha), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [0, 1])
def test_mask_equals_reference(alpha, device, dtype):
    adj = small_graph()
    n = adj.shape[0]
    walks = sample_walks(Graph.from_any(adj), 4, p_halt=0.3, choice="weighted", generator=torch.Generator().manual_seed(2))
    m = RWGNKMask(Graph.from_any(adj, device=device), walks.to_numpy(), 0.8, alpha)
    k = ref.rwgnk_mask(adj, walks.to_numpy(), 0.8, alpha)
    x = torch.randn(2, n, 3, dtype=dtype, generator=torch.Generator().manual_seed(0)).to(device)
    scale = np.abs(k).max() * n * x.abs().max().item()
    close(m.matmul(x), k @ x.cpu().double().numpy(), dtype, scale)
    assert m.has_rmatmul
    torch.testing.assert_close(m.rmatmul(x), m.matmul(x))
    assert m.nonnegative and list(m.parameters()) == [] and m.matmul(x).dtype == dtype


def test_hand_built_walks_and_nnz():
    """Path 0-1-2, walk 0, 1, 2, 1 with lam = 1/2: Psi row 0 = [1, 1/2 + 1/8, 1/4] (3 entries)."""
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float))
    w = walks_dict(3, 1, 0.5, [[0, 1, 2, 1], [1], [2, 1]])
    psi = rwgnk_features(Graph.from_any(adj), w, 0.5).to_dense()
    np.testing.assert_allclose(psi.numpy(), [[1.0, 0.625, 0.25], [0.0, 1.0, 0.0], [0.0, 0.5, 1.0]], rtol=1e-15)
    m = RWGNKMask(Graph.from_any(adj), w, 0.5, 0)
    assert m.nnz == 6 and m.nnz_per_row.tolist() == [3, 1, 2] and m.nnz_stats() == {"mean": 2.0, "max": 3}


def test_gradient_wrt_x():
    adj = small_graph()
    walks = sample_walks(Graph.from_any(adj), 2, p_halt=0.5, choice="weighted", generator=torch.Generator().manual_seed(3))
    m = RWGNKMask(Graph.from_any(adj), walks, 0.6, 1)
    x = torch.randn(adj.shape[0], 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m.matmul, (x,))


def test_bad_input():
    adj = small_graph()
    graph = Graph.from_any(adj)
    w = walks_dict(6, 1, 0.5, [[i] for i in range(6)])
    with pytest.raises(ValueError, match="lam must be a finite real >= 0"):
        RWGNKMask(graph, w, -0.5)
    with pytest.raises(ValueError, match="lam must be a finite real >= 0"):
        RWGNKMask(graph, w, float("inf"))
    with pytest.raises(TypeError, match="lam must be a real number"):
        RWGNKMask(graph, w, "0.5")
    with pytest.raises(ValueError, match="alpha must be 0 or 1"):
        RWGNKMask(graph, w, 0.5, alpha=0.5)
    with pytest.raises(ValueError, match="graph of 3 nodes"):
        RWGNKMask(graph, walks_dict(3, 1, 0.5, [[0], [1], [2]]), 0.5)
    with pytest.raises(ValueError, match="p_halt"):
        RWGNKMask(graph, {**w, "p_halt": 1.0}, 0.5)
    with pytest.raises(ValueError, match="does not follow an edge"):
        RWGNKMask(graph, walks_dict(6, 1, 0.5, [[0, 2]] + [[i] for i in range(1, 6)]), 0.5)


def test_monte_carlo_psi_rows_approach_the_closed_form():
    """Psi (alpha = 0) from fast.walks' weighted sampler, many walkers: within the Hoeffding bound
    of e_h^T (I - rho P)^-1 (each walk's f_h(i) lies in [0, 1 / (1 - lam)]; union over N^2 entries
    at 1e-6)."""
    import math

    adj = small_graph()
    n, lam, p_halt, n_walkers = adj.shape[0], 0.6, 0.3, 20000
    walks = sample_walks(Graph.from_any(adj), n_walkers, p_halt=p_halt, choice="weighted",
                         generator=torch.Generator().manual_seed(21))
    psi = rwgnk_features(Graph.from_any(adj), walks, lam, 0).to_dense().numpy()
    t = (1 / (1 - lam)) * math.sqrt(math.log(2 * n * n / 1e-6) / (2 * n_walkers))
    assert np.abs(psi - ref.rwgnk_expected_frequencies(adj, lam, p_halt=p_halt)).max() <= t


# ------------------------------------------------------------ per-key stabilised attend (numerics)


@pytest.mark.parametrize("lam", [0.6, 0.0])  # lam = 0 stores zero-valued entries (prefixes of length >= 1)
@pytest.mark.parametrize("alpha", [0, 1])
@pytest.mark.parametrize("name", ["grid", "weighted", "loops", "isolated"])
def test_stabilised_attend_equals_the_true_products(name, alpha, lam):
    from tests.fast.masks.test_grf import check_stabilised_attend

    adj = graphs()[name]
    walks = sample_walks(Graph.from_any(adj), 3, generator=torch.Generator().manual_seed(2), **MODES["halting"])
    mask = RWGNKMask(Graph.from_any(adj), walks, lam, alpha)
    assert mask.rescales_keys
    for lead in [(2, 3), ()]:
        check_stabilised_attend(mask, lead=lead, spread=3.0 if lam else 40.0)


def test_stabilised_float32_matches_float64_where_the_slice_max_underflows():
    from tests.fast.masks.test_grf import check_far_keys, path_walks

    graph, walks = path_walks(40, 5, p_halt=0.5, choice="weighted")
    check_far_keys(RWGNKMask(graph, walks, 0.8, 0), n=40)


def test_stabilised_attend_gradcheck():
    from tests.fast.masks.test_grf import stabilised_inputs

    adj = small_graph()
    n = adj.shape[0]
    walks = sample_walks(Graph.from_any(adj), 2, generator=torch.Generator().manual_seed(3), **MODES["capped"])
    mask = RWGNKMask(Graph.from_any(adj), walks, 0.7, 1)
    z, phi_q, v = stabilised_inputs(n, (2,), m=2, d=2, spread=3.0, seed=7)
    c = mask.key_stabilizer(z)
    inputs = (phi_q.requires_grad_(True), torch.exp(z - c).requires_grad_(True), v.requires_grad_(True))
    assert torch.autograd.gradcheck(lambda pq, pk, vv: mask.attend(pq, pk, vv, key_log_scale=c), inputs)
    assert torch.autograd.gradgradcheck(lambda pq, pk, vv: mask.attend(pq, pk, vv, key_log_scale=c), inputs)


def test_a_learnable_lam_is_refused_saying_so():
    from fast.graphs import as_graph
    from fast.masks.rwgnk import RWGNKMask
    from fast.walks import sample_walks
    from verify.problems import path_graph

    g = as_graph(path_graph(5))
    walks = sample_walks(g, 2, p_halt=0.5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="not learnable"):
        RWGNKMask(g, walks, torch.tensor(0.5, requires_grad=True))
    RWGNKMask(g, walks, torch.tensor(0.5))  # a plain tensor is a number


# ------------------------------------------------------------------ lam^t beyond float64 (issue 24)


def _cycle_walks(seed: int = 0):
    g = Graph.from_any(torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 4, 5]]))
    return g, sample_walks(g, 2, fixed_length=4, generator=torch.Generator().manual_seed(seed))


def test_lam_whose_powers_overflow_is_refused_naming_lam_and_what_would_do():
    """lam^4 = 1e800: the error names lam and the walk length, not "Psi contains non-finite values";
    the lam and the walk cap it suggests both work."""
    import re

    g, walks = _cycle_walks()
    with pytest.raises(ValueError, match=r"lam = 1e\+200: the discounted visit frequencies lam\^t / n_walkers of "
                                         r"rwgnk's Psi overflow float64 \(lam\^4 for the longest walk, 4 hops\)") as info:
        RWGNKMask(g, walks, 1e200)
    text = str(info.value)
    lam_ok = float(re.search(r"lam <= ([0-9.e+]+) keeps", text).group(1))
    hops_ok = int(re.search(r"walks of at most (\d+) hops", text).group(1))
    assert bool(torch.isfinite(rwgnk_features(g, walks, lam_ok * (1 - 1e-3)).values()).all())
    short = sample_walks(g, 2, fixed_length=hops_ok, generator=torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(rwgnk_features(g, short, 1e200).values()).all())


@pytest.mark.parametrize("lam", [1e100, 1e200, 1e-200, 0.5])
def test_alpha_one_rows_are_finite_unit_rows_for_any_lam(lam):
    """alpha = 1 divides each row by its norm: finite for any lam, even where lam^t or its square
    overflows float64 (before: rows of 0 at lam = 1e100, "non-finite" at 1e200). Checked against
    the rows formed in log space by hand, term by term."""
    import math

    g, walks = _cycle_walks(1)
    psi = rwgnk_features(g, walks, lam, alpha=1).to_dense()
    assert bool(torch.isfinite(psi).all())
    torch.testing.assert_close(psi.norm(dim=1), torch.ones(6, dtype=torch.float64), rtol=1e-15, atol=0)
    nodes, offsets = walks.nodes.tolist(), walks.offsets.tolist()
    for h in range(6):
        terms = {}
        for w in range(2 * h, 2 * h + 2):
            for t, u in enumerate(nodes[offsets[w]:offsets[w + 1]]):
                terms.setdefault(u, []).append(t)
        top = max(t * math.log(lam) for ts in terms.values() for t in ts)  # the row's largest log term
        row = {u: sum(math.exp(t * math.log(lam) - top) for t in ts) for u, ts in terms.items()}
        norm = math.sqrt(sum(x * x for x in row.values()))
        want = torch.zeros(6, dtype=torch.float64)
        for u, x in row.items():
            want[u] = x / norm
        # exp(x) carries x's rounding, |x| u relative: |x| <= 4 |log lam| = 1842 here, 2e-13 on each side
        torch.testing.assert_close(psi[h], want, rtol=4 * abs(math.log(lam)) * 2**-52 * 2 + 1e-15, atol=1e-300)
