"""fast/graphs.py: the canonical Graph, its converters and their validation."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from fast.graphs import SYMMETRY_RTOL, Graph, as_graph, normalized_adjacency
from reference.graphs import adjacency as reference_adjacency
from verify import problems as P

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# torch says sparse CSR is "beta" when a test builds one: the kernels used here are stable
pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning")]


def _weighted_graph(n: int, seed: int, loops: bool = True, isolated: int = 2) -> sp.csr_matrix:
    """A symmetric weighted scipy graph with self-loops and ``isolated`` isolated nodes at the end."""
    rng = np.random.default_rng(seed)
    m = n - isolated
    a = sp.random(m, m, density=0.3, random_state=rng, format="coo")
    a = sp.triu(a, k=0 if loops else 1)
    a = (a + sp.triu(a, k=1).T).tocsr()
    a.data = np.round(a.data * 10) / 4 + 0.25  # weights in [0.25, 2.75], exactly representable
    a = sp.block_diag([a, sp.csr_matrix((isolated, isolated))], format="csr")
    a.sum_duplicates()
    return a


def _canonical_scipy(a) -> sp.csr_matrix:
    c = sp.csr_matrix(a, dtype=np.float64, copy=True)
    c.sum_duplicates()
    c.eliminate_zeros()
    c.sort_indices()
    return c


def _same(g: Graph, a) -> None:
    c = _canonical_scipy(a)
    assert g.n == c.shape[0]
    assert torch.equal(g.crow, torch.as_tensor(c.indptr, dtype=torch.int64))
    assert torch.equal(g.col, torch.as_tensor(c.indices, dtype=torch.int64))
    assert torch.equal(g.weight, torch.as_tensor(c.data))


def _check_invariants(g: Graph) -> None:
    assert g.crow.dtype == g.col.dtype == g.row.dtype == g.degree.dtype == torch.int64
    assert g.weight.dtype == g.weighted_degree.dtype == torch.float64
    assert g.crow.shape == (g.n + 1,) and int(g.crow[0]) == 0 and int(g.crow[-1]) == g.num_edges
    assert g.col.shape == g.weight.shape == g.row.shape == (g.num_edges,)
    keys = g.keys()
    assert bool((keys[1:] > keys[:-1]).all()), "rows sorted, columns sorted and unique within rows"
    assert torch.equal(keys, g.row * g.n + g.col)
    assert bool((g.weight > 0).all()) and bool(torch.isfinite(g.weight).all())
    assert torch.equal(g.degree, torch.bincount(g.row, minlength=g.n))
    dense = g.to_scipy().toarray()
    np.testing.assert_array_equal(dense, dense.T)
    np.testing.assert_allclose(g.weighted_degree.numpy(), dense.sum(axis=1), rtol=1e-15)


# ------------------------------------------------------------------------------ converters


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edge_index_round_trip_matches_scipy(seed):
    a = _weighted_graph(12, seed)
    coo = a.tocoo()
    rng = np.random.default_rng(seed)
    perm = rng.permutation(coo.nnz)  # any column order
    ei = np.stack([coo.row[perm], coo.col[perm]])
    g = Graph.from_any(torch.as_tensor(ei), edge_weight=torch.as_tensor(coo.data[perm]), n=12)
    _same(g, a)
    _check_invariants(g)
    assert (g.to_scipy() != a).nnz == 0
    # the ndarray form, and float32 weights, give the same graph
    g2 = Graph.from_any(ei, edge_weight=coo.data[perm].astype(np.float32), n=12)
    _same(g2, a)


def test_every_input_format_gives_the_same_graph():
    a = _weighted_graph(15, 4)
    coo = a.tocoo()
    ei = torch.as_tensor(np.stack([coo.row, coo.col]))
    w = torch.as_tensor(coo.data)
    G = nx.Graph()
    G.add_nodes_from(range(15))
    G.add_weighted_edges_from((int(i), int(j), float(x)) for i, j, x in zip(coo.row, coo.col, coo.data) if i <= j)
    inputs = {
        "edge_index": (ei, dict(edge_weight=w, n=15)),
        "ndarray": (ei.numpy(), dict(edge_weight=w.numpy(), n=15)),
        "torch coo": (torch.sparse_coo_tensor(ei, w, (15, 15)), {}),
        "torch coo coalesced": (torch.sparse_coo_tensor(ei, w, (15, 15)).coalesce(), {}),
        "torch csr": (torch.sparse_coo_tensor(ei, w, (15, 15)).to_sparse_csr(), {}),
        "torch csc": (torch.sparse_coo_tensor(ei, w, (15, 15)).to_sparse_csc(), {}),
        "scipy csr": (a, {}),
        "scipy csc": (a.tocsc(), {}),
        "scipy coo": (a.tocoo(), {}),
        "scipy lil": (a.tolil(), {}),
        "scipy dok": (a.todok(), {}),
        "scipy csr_array": (sp.csr_array(a), {}),
        "networkx": (G, {}),
    }
    for label, (x, kw) in inputs.items():
        g = Graph.from_any(x, **kw)
        _same(g, a)
        _check_invariants(g)
        assert g.device == torch.device("cpu"), label


def test_duplicates_are_summed_and_zeros_dropped():
    ei = torch.tensor([[0, 1, 0, 1, 1, 2, 2, 1], [1, 0, 1, 0, 2, 1, 2, 1]])
    w = torch.tensor([1.0, 2.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.0])  # (0,1) 2 = (1,0) 2; (1,2) 0 both ways
    g = as_graph(ei, edge_weight=w)
    assert g.n == 3
    assert g.to_scipy().toarray().tolist() == [[0, 2, 0], [2, 0, 0], [0, 0, 3]]
    assert g.degree.tolist() == [1, 1, 1]  # the self-loop counts once
    assert g.num_edges == 3
    # scipy input with explicit zeros and duplicates
    a = sp.coo_matrix(([1.0, 1.0, 0.0, 0.0], ([0, 0, 1, 2], [1, 1, 2, 1])), shape=(3, 3))
    g = as_graph(a, symmetrize=True)
    assert g.to_scipy().toarray().tolist() == [[0, 2, 0], [2, 0, 0], [0, 0, 0]]


def test_isolated_nodes_self_loops_components_and_n_one():
    g = as_graph(torch.zeros(2, 0, dtype=torch.int64), n=4)  # no edges at all
    assert g.n == 4 and g.num_edges == 0 and g.degree.tolist() == [0] * 4
    assert g.edge_weight(torch.tensor([0, 1]), torch.tensor([1, 1])).tolist() == [0.0, 0.0]
    g = as_graph(torch.tensor([[0], [0]]))
    assert g.n == 1 and g.degree.tolist() == [1] and g.weighted_degree.tolist() == [1.0]
    g = as_graph(torch.tensor([[0, 1], [1, 0]]), n=5)  # n beyond the largest index: isolated nodes
    assert g.degree.tolist() == [1, 1, 0, 0, 0]
    assert g.crow.tolist() == [0, 1, 2, 2, 2, 2]
    _check_invariants(g)


def test_networkx_relabels_in_node_order_and_handles_directed_and_multi():
    G = nx.Graph()
    G.add_nodes_from(["c", "a", "b"])
    G.add_edge("a", "b", weight=2.5)
    G.add_edge("c", "c")  # default weight 1
    g = as_graph(G)
    assert g.to_scipy().toarray().tolist() == [[1, 0, 0], [0, 0, 2.5], [0, 2.5, 0]]
    D = nx.DiGraph([(0, 1), (1, 2), (2, 1)])
    with pytest.raises(ValueError, match=r"not symmetric \(W\[0, 1\] = 1.0 but W\[1, 0\] = 0.0\)"):
        as_graph(D)
    assert as_graph(D, symmetrize=True).to_scipy().toarray().tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    M = nx.MultiGraph([(0, 1), (0, 1), (1, 1)])
    assert as_graph(M).to_scipy().toarray().tolist() == [[0, 2], [2, 1]]
    g = as_graph(nx.karate_club_graph())
    assert g.n == 34 and g.num_edges == 2 * 78


def test_symmetrize_uses_the_entrywise_max():
    a = sp.csr_matrix(np.array([[0, 1.0, 3.0], [2.0, 0, 0], [0, 0, 5.0]]))
    with pytest.raises(ValueError, match=r"graph is not symmetric \(W\[0, 1\] = 1.0 but W\[1, 0\] = 2.0\); "
                                         r"pass symmetrize=True to use max\(W, W\^T\)"):
        as_graph(a)
    g = as_graph(a, symmetrize=True)
    np.testing.assert_array_equal(g.to_scipy().toarray(), np.maximum(a.toarray(), a.toarray().T))
    # the offending pair is named with the caller's argument name
    with pytest.raises(ValueError, match=r"^adj is not symmetric"):
        Graph.from_any(a, name="adj")


def test_round_off_asymmetry_is_accepted_and_made_exact():
    w = 0.3
    w2 = w * (1 + 4 * np.finfo(float).eps)  # a few ulps apart: within SYMMETRY_RTOL
    assert w2 != w and abs(w2 - w) <= SYMMETRY_RTOL * w2
    g = as_graph(sp.csr_matrix(np.array([[0, w], [w2, 0]])))
    assert g.weight.tolist() == [w2, w2]
    too_far = w * (1 + 1e-9)
    with pytest.raises(ValueError, match="not symmetric"):
        as_graph(sp.csr_matrix(np.array([[0, w], [too_far, 0]])))


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_reference_adjacency(seed):
    rng = np.random.default_rng(seed)
    a = sp.random(10, 10, density=0.4, random_state=rng, format="csr")
    for symmetrize in (True,):
        g = as_graph(a, symmetrize=symmetrize)
        r = reference_adjacency(a, symmetrize=symmetrize)
        _same(g, r)
    s = a + a.T
    _same(as_graph(s), reference_adjacency(s))


# ------------------------------------------------------------------------------ methods


def test_edge_weight_is_vectorised_w_lookup():
    a = _weighted_graph(9, 3)
    g = as_graph(a)
    dense = a.toarray()
    u, v = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    np.testing.assert_array_equal(g.edge_weight(u, v).numpy(), dense)
    np.testing.assert_array_equal(g.edge_weight(torch.tensor(2), torch.arange(9)).numpy(), dense[2])


def test_csr_is_cached_and_takes_values():
    a = _weighted_graph(8, 5)
    g = as_graph(a)
    m = g.csr(torch.float32)
    assert m is g.csr(torch.float32) and m.layout == torch.sparse_csr and m.dtype == torch.float32
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.testing.assert_allclose((g.csr(torch.float64) @ x).numpy(), a.toarray() @ x.numpy(), rtol=1e-13)
    vals = torch.arange(g.num_edges, dtype=torch.float64, requires_grad=True)
    y = (g.csr(torch.float64, values=vals) @ x).sum()
    y.backward()
    assert vals.grad is not None and vals.grad.shape == (g.num_edges,)
    with pytest.raises(ValueError, match=r"values must have shape \(E,\)"):
        g.csr(torch.float64, values=torch.ones(3))


def test_normalized_adjacency():
    a = _weighted_graph(10, 6)  # with self-loops and two isolated nodes
    g = normalized_adjacency(as_graph(a))
    d = a.toarray().sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(a.toarray() > 0, a.toarray() / np.sqrt(np.outer(d, d)), 0.0)
    np.testing.assert_allclose(g.to_scipy().toarray(), expected, rtol=1e-15, atol=0)
    _check_invariants(g)
    assert g.degree.tolist() == as_graph(a).degree.tolist()
    with pytest.raises(TypeError, match="g must be a Graph"):
        normalized_adjacency(a)


@pytest.mark.parametrize("w", [1e300, 1e160, 1.0, 1e-170, 1e-200, 1e-300])
def test_normalized_adjacency_at_extreme_weight_scales(w):
    """A 3-path of weight w: every normalised weight is w / sqrt(w * 2w) = 1/sqrt(2) at any scale
    (w / sqrt(d_i d_j) gave 0 at 1e160, inf at 1e-170: d_i d_j over/underflowed)."""
    g = normalized_adjacency(as_graph(sp.csr_matrix(np.array([[0, w, 0], [w, 0, w], [0, w, 0]]))))
    np.testing.assert_allclose(g.weight.numpy(), np.full(4, 2 ** -0.5), rtol=4e-16, atol=0)
    dense = g.to_scipy().toarray()
    np.testing.assert_array_equal(dense, dense.T)  # exactly symmetric
    # scale invariance on a weighted graph with loops and isolated nodes: N(w A) = N(A)
    a = _weighted_graph(12, 7)
    scaled = sp.csr_matrix(a * w)
    dense = normalized_adjacency(as_graph(scaled)).to_scipy().toarray()
    np.testing.assert_array_equal(dense, dense.T)
    np.testing.assert_allclose(dense, normalized_adjacency(as_graph(a)).to_scipy().toarray(), rtol=1e-15, atol=0)


def test_graph_is_immutable_and_as_graph_passes_through():
    g = as_graph(P.path_graph(4))
    assert as_graph(g) is g and Graph.from_any(g) is g and g.to("cpu") is g
    for attr in ("n", "crow", "col", "weight", "degree"):
        with pytest.raises(AttributeError):
            setattr(g, attr, None)
    assert repr(g) == "Graph(n=4, num_edges=6, device=cpu)"


def test_pickle_round_trip_and_detached_weights():
    import pickle

    w = torch.tensor([2.0, 2.0], requires_grad=True)
    g = as_graph(torch.tensor([[0, 1], [1, 0]]), edge_weight=w)
    assert not g.weight.requires_grad and g.weight.tolist() == [2.0, 2.0]
    h = pickle.loads(pickle.dumps(g))
    assert h.n == g.n and torch.equal(h.col, g.col) and torch.equal(h.weight, g.weight)
    assert torch.equal(h.weighted_degree, g.weighted_degree)


def test_checked_constructor_refuses_non_canonical_parts():
    g = as_graph(P.path_graph(3))
    Graph(3, g.crow, g.col, g.weight, check=True)
    with pytest.raises(ValueError, match="sorted without duplicates"):
        Graph(3, g.crow, torch.tensor([1, 2, 0, 1]), g.weight, check=True)
    with pytest.raises(ValueError, match="finite and > 0"):
        Graph(3, g.crow, g.col, torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64), check=True)
    with pytest.raises(ValueError, match="not symmetric"):
        Graph(3, g.crow, g.col, torch.tensor([1.0, 2.0, 1.0, 1.0], dtype=torch.float64), check=True)


# ------------------------------------------------------------------------------ errors

EI = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])

BAD = [
    (dict(graph="x"), TypeError, r"graph must be a Graph, an edge_index \(2, E\) .* got str"),
    (dict(graph=[[0, 1], [1, 0]]), TypeError, "got list"),
    (dict(graph=torch.zeros(3, 2, dtype=torch.int64)), ValueError, r"edge_index must have shape \(2, E\), got \(3, 2\)"),
    (dict(graph=torch.zeros(2, 2, 2, dtype=torch.int64)), ValueError, r"shape \(2, E\), got \(2, 2, 2\)"),
    (dict(graph=torch.tensor([[0.0, 1.0], [1.0, 0.0]])), TypeError, "must hold integer indices, got dtype torch.float32"),
    (dict(graph=np.array([[True, False], [False, True]])), TypeError, "integer indices, got dtype bool"),
    (dict(graph=torch.tensor([[0, -1, 1], [-1, 0, 1]])), ValueError, "edge_index entries must be >= 0 .* got -1"),
    (dict(graph=torch.tensor([[0, -1], [-1, 0]]), n=2), ValueError, "edge_index entries must be >= 0 .* got -1"),
    (dict(graph=np.ones((3, 3))), ValueError, r"got \(3, 3\); a dense adjacency matrix \(n, n\) is not accepted"),
    (dict(graph=torch.tensor([[0.0, 1.0], [1.0, 0.0]])), TypeError, "dense adjacency matrix .* not accepted"),
    (dict(graph=EI, n=2), ValueError, r"must be < n=2 .* got 2; n must be at least max index \+ 1 = 3"),
    (dict(graph=torch.zeros(2, 0, dtype=torch.int64)), ValueError, r"n must be given .* \(n = 0 is refused\)"),
    (dict(graph=EI, n=0), ValueError, r"n \(the number of nodes of graph\) must be >= 1, got 0"),
    (dict(graph=EI, n=3.0), TypeError, "must be an int, got float"),
    (dict(graph=EI, edge_weight=torch.ones(3)), ValueError, r"edge_weight must have shape \(E,\) = \(4,\) .* got \(3,\)"),
    (dict(graph=EI, edge_weight=torch.tensor([1.0, float("nan"), 1.0, 1.0])), ValueError,
     r"edge weights must be finite, got nan at entry \(1, 0\)"),
    (dict(graph=EI, edge_weight=torch.tensor([1.0, 1.0, float("inf"), float("inf")])), ValueError,
     r"must be finite, got inf at entry \(1, 2\) \(2 non-finite in all\)"),
    (dict(graph=EI, edge_weight=torch.tensor([-1.0, -1.0, 1.0, 1.0])), ValueError,
     r"edge weights must be >= 0 .* got -1.0 at entry \(0, 1\)"),
    (dict(graph=EI, edge_weight=torch.tensor([1.0, 2.0, 1.0, 1.0])), ValueError,
     r"not symmetric \(W\[0, 1\] = 1.0 but W\[1, 0\] = 2.0\)"),
    (dict(graph=torch.tensor([[0], [1]])), ValueError, r"not symmetric \(W\[0, 1\] = 1.0 but W\[1, 0\] = 0.0\)"),
    (dict(graph=sp.csr_matrix((2, 3))), ValueError, r"must be a square sparse matrix \(n, n\), got shape \(2, 3\)"),
    (dict(graph=sp.csr_matrix((0, 0))), ValueError, r"n >= 1 nodes, got shape \(0, 0\)"),
    (dict(graph=sp.identity(3, format="csr"), n=4), ValueError, r"n=4 does not match graph's shape \(3, 3\)"),
    (dict(graph=sp.identity(3, format="csr"), edge_weight=np.ones(3)), ValueError, "edge_weight is only for an edge_index"),
    (dict(graph=sp.csr_matrix(np.array([[0, -2.0], [-2.0, 0]]))), ValueError, "must be >= 0"),
    (dict(graph=sp.csr_matrix(np.array([[0, 1j], [1j, 0]]))), TypeError, "real entries"),
    (dict(graph=torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2, 3), check_invariants=True)), ValueError, "square"),
    (dict(graph=torch.zeros(2, 3, 3).to_sparse()), ValueError, r"square sparse matrix \(n, n\), got shape \(2, 3, 3\)"),
    (dict(graph=nx.Graph()), ValueError, "n >= 1 nodes, got an empty networkx graph"),
    (dict(graph=nx.path_graph(3), n=4), ValueError, "n=4 does not match graph's 3 nodes"),
    (dict(graph=EI, symmetrize=1), TypeError, "symmetrize must be a bool"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_inputs_name_argument_expected_and_got(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Graph.from_any(**kwargs)


@pytest.mark.parametrize("make", [lambda a: torch.tensor(a), lambda a: np.array(a), lambda a: np.array(a, np.int32)])
def test_square_two_by_two_integer_input_is_ambiguous(make):
    """[[0, 1], [1, 0]] is an edge_index (edges 0->1, 1->0) or a 2 x 2 adjacency; reference.graphs
    reads it as the latter. fast refuses the guess and says how to disambiguate."""
    a = make([[0, 1], [1, 1]])  # as edge_index: 0->1, 1->1 (asymmetric); as adjacency: an edge and a loop
    with pytest.raises(ValueError, match=r"shape \(2, 2\) is ambiguous.*n=\.\.\..*scipy.sparse.csr_matrix"):
        as_graph(a)
    g = as_graph(a, n=2, symmetrize=True)  # n marks an edge_index
    assert g.to_scipy().toarray().tolist() == [[0.0, 1.0], [1.0, 1.0]]
    g = as_graph(make([[0, 1], [1, 0]]), edge_weight=np.array([2.0, 2.0]))  # so does edge_weight
    assert g.to_scipy().toarray().tolist() == [[0.0, 2.0], [2.0, 0.0]]
    dense = as_graph(sp.csr_matrix(np.asarray(make([[0, 1], [1, 1]]))))  # the adjacency, explicitly
    np.testing.assert_array_equal(dense.to_scipy().toarray(),
                                  reference_adjacency(np.asarray(make([[0, 1], [1, 1]]))).toarray())
    # wider edge_index arrays are unambiguous (not square)
    assert as_graph(make([[0, 1, 1], [1, 0, 1]])).n == 2


def test_graph_input_with_wrong_n_or_edge_weight():
    g = as_graph(EI)
    with pytest.raises(ValueError, match="n=5 does not match graph's 3 nodes"):
        Graph.from_any(g, n=5)
    with pytest.raises(ValueError, match="edge_weight is only for an edge_index input"):
        Graph.from_any(g, edge_weight=torch.ones(4))


def test_canonicalisation_of_a_64x64_grid_matches_scipy():
    a = P.grid_graph((64, 64))
    g = as_graph(a)
    _same(g, a)
    assert g.degree.max() == 4 and g.degree.min() == 2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_graph_on_a_device(device):
    """Built on ``device`` from scipy and from edge_index + edge_weight: the canonical CSR, products and
    the normalised adjacency match the CPU/scipy ones. The graph ends in 2 isolated nodes, which an
    edge_index cannot show: n=12 must be given (without it n = max index + 1 = 10)."""
    a = _weighted_graph(12, 7)
    g = as_graph(a, device=device)
    assert g.device.type == device and g.col.device.type == device and g.weighted_degree.device.type == device
    _same(g.to("cpu"), a)
    ei = torch.as_tensor(np.stack(a.nonzero())).to(device)
    w = torch.as_tensor(a[a.nonzero()].A1).to(device)
    assert as_graph(ei, edge_weight=w).n == 10  # the isolated nodes are lost without n
    g2 = as_graph(ei, edge_weight=w, n=12)
    assert g2.device.type == device
    _same(g2.to("cpu"), a)
    np.testing.assert_array_equal(g2.weighted_degree.cpu().numpy(), np.asarray(a.sum(axis=1)).ravel())
    x = torch.randn(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    np.testing.assert_allclose((g.csr(torch.float64) @ x).cpu().numpy(), a.toarray() @ x.cpu().numpy(), rtol=1e-12)
    np.testing.assert_array_equal(normalized_adjacency(g).to("cpu").weight.numpy(),
                                  normalized_adjacency(as_graph(a)).weight.numpy())


@given(st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.25])),
             max_size=20))))
def test_any_triples_symmetrized_match_dense_max(case):
    """Property: for any COO triples (duplicates, zeros, loops), from_any(symmetrize=True) is the
    canonical CSR of max(S, S^T) with S the duplicate-summed dense matrix, and the reference
    adjacency agrees."""
    n, triples = case
    rows = np.array([t[0] for t in triples], dtype=np.int64)
    cols = np.array([t[1] for t in triples], dtype=np.int64)
    vals = np.array([t[2] for t in triples], dtype=np.float64)
    dense = np.zeros((n, n))
    np.add.at(dense, (rows, cols), vals)
    expected = np.maximum(dense, dense.T)
    g = Graph.from_any(np.stack([rows, cols]).reshape(2, -1), edge_weight=vals, n=n, symmetrize=True)
    _check_invariants(g)
    np.testing.assert_array_equal(g.to_scipy().toarray(), expected)
    assert g.num_edges == int((expected > 0).sum())
    r = reference_adjacency(sp.coo_matrix((vals, (rows, cols)), shape=(n, n)), symmetrize=True)
    _same(g, r)


# ------------------------------------------------------------------ absurd sizes and raw conversions (issue 24)


CYCLE = torch.tensor([[0, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 0, 0, 1, 2, 3]])


def test_absurd_node_counts_are_refused_before_allocating():
    """n = 2^40 would need 24 TiB of per-node arrays: a MemoryError naming where n came from and the
    bytes, not the allocator's "can't allocate memory"."""
    with pytest.raises(MemoryError, match=r"n = 1099511627776 asks for .* TiB, more than"):
        as_graph(CYCLE, n=2**40)
    with pytest.raises(MemoryError, match=r"graph \(edge_index\) with largest node index 1099511627776 .*TiB"):
        as_graph(torch.tensor([[0, 2**40, 1], [2**40, 0, 1]]))
    with pytest.raises(MemoryError, match=r"graph of shape \(1099511627776, 1099511627776\) .*TiB"):
        as_graph(sp.coo_matrix(([1.0], ([0], [0])), shape=(2**40, 2**40)))


def test_node_count_past_the_key_range_is_refused(monkeypatch):
    """On a machine with memory enough, n^2 must still fit the int64 keys i n + j."""
    import fast.validation

    from fast.graphs import MAX_NODES

    monkeypatch.setattr(fast.validation, "memory_limit", lambda device=None: 2**70)
    with pytest.raises(ValueError, match=r"n = 4294967296: a graph may have at most MAX_NODES"):
        as_graph(CYCLE, n=2**32)
    assert MAX_NODES**2 < 2**63 <= (MAX_NODES + 1) ** 2


@pytest.mark.parametrize("weights", [["a"] * 8, np.array(["1"] * 8), [1.0] * 7 + [None], [[1.0], [1.0, 2.0]] + [1.0] * 6])
def test_edge_weights_that_are_not_numbers_are_refused(weights):
    """Strings are refused, even "1" (numpy would convert it quietly), as are objects and ragged lists."""
    with pytest.raises(TypeError, match="edge_weight must be"):
        as_graph(CYCLE, edge_weight=weights)


def test_networkx_weights_that_are_not_numbers_are_refused():
    g = nx.path_graph(3)
    g[0][1]["weight"] = "2"
    with pytest.raises(TypeError, match=r"edge attribute 'weight' must be a real number, got str '2' on edge \(0, 1\)"):
        as_graph(g)


def test_a_device_that_is_not_one_is_named():
    with pytest.raises(ValueError, match=r'device must name a torch device \(e.g. "cpu", "cuda:0"'):
        as_graph(CYCLE, device="abc")
