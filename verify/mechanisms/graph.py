"""Registry records: gdk, rwgnk, power-series, grf, grf-asym (choromanski22 Sec. 4, Thm. 4.1 and
Eq. 5; reid25 Eq. 10, Alg. 1 and App. D Alg. 2; docs/papers.md Sec. 3).

Every problem is FAVOR+ attention (verify.favor) times a graph-kernel mask on an undirected graph
of N nodes. What the mask needs lives in problem.extras as NumPy arrays only, so reference/ and
fast/ build their masks from identical numbers, and every registry consumer (np.asarray,
tobytes, array_equal, reproducibility's array walk) reads them:

- the graph: the canonical symmetric adjacency (unit weights) as CSR arrays ``graph_indptr``,
  ``graph_indices``, ``graph_data`` (``adjacency(problem)`` rebuilds the scipy matrix;
  reference.graphs.adjacency made it canonical: sorted, no duplicates, no explicit zeros);
- random walks (rwgnk, grf, grf-asym), sampled in make_problem by reference.walks.sample_walks
  from ``rng_for(seed, WALK_SALTS[side])`` (above N = REFERENCE_WALKS_MAX_N = 2^16, where the
  readable loop would take minutes, by fast.walks.sample_walks on the CPU from a torch.Generator
  seeded from (seed, salt)) and stored as the Walks' arrays ``walks_length``,
  ``walks_offsets``, ``walks_nodes`` (grf's independent key-side ensemble: ``walks_k_*``), with
  the sampling options ``n_walkers``, ``p_halt``, ``i_max`` or ``fixed_length`` (and
  ``antithetic`` / ``repelling`` when set). Both sides consume these very walks
  (reference.walks.Walks(**fields), fast.walks.Walks.from_arrays(**fields)), so equivalence is
  exact on identical samples. ``draw`` re-samples them with fast.walks.sample_walks from the
  torch.Generator it is given, beside the FAVOR+ projection (reproducibility/<id>).

The scipy matrix and a dict of walks, as the plan first said, would break those consumers
(np.asarray of a csr_matrix or a dict is a 0-d object array: tobytes differs per object and
array_equal raises), hence flat arrays.

Graphs (``GRAPH_FAMILIES``, every record declares all six as variants, its default first):
"path"; "grid-2d" (the ViT patch graph of reid25: rows of width ceil(sqrt N), 4-neighbourhood,
the last row ragged, so any N works and N = 2^20 is the 1024 x 1024 grid); "regular" (random
4-regular, verify.problems.random_regular); "erdos-renyi" (G(N, p) at mean degree 4);
"knn" (symmetrised 4-nearest-neighbour graph of uniform points in [0, 1]^3); "karate" (networkx's
karate club, verify.problems.karate_graph, tiled to reach N; sweep=False: one fixed graph).

Masks, with W = reference.graphs.normalized_adjacency (w_ij / sqrt(d_i d_j), spectral radius <= 1)
where a power series of W is meant:

- gdk: M = exp(-lam T), T in {L, L D^-1, -A} (``kind``) of the adjacency, lam = 1 (far from the
  identity: on a path every diagonal entry of exp(-L) is < 0.7, the rest of the row's mass goes
  to the neighbours); variants for the
  kinds "random-walk" and "adjacency", and "isolated-std8" (-random-walk): karate with isolated
  nodes and q, k of std 8, which only the exact per-key series serves in float32 (one constant
  per slice underflows an isolated node's own key); DiffusionMask's tol is TOL_GDK = 1e-12, well below
  equivalence's float64 1e-10. mask_params ("lam",). Complexity "N + E" with cost factor
  (N + |E|) / N. metrics: "sparse products" (steps x terms of the Taylor plan).
- rwgnk: Psi from the walks (lam = 0.5, alpha = 0; uniform neighbour choice, which on these
  unit-weight graphs is the natural walk P = D^-1 A of Eq. 5), M = Psi Psi^T; variants alpha = 1
  and fixed-length walks (FIXED_LENGTH = 3 hops). lam and alpha are plain numbers (RWGNKMask
  builds Psi once): no mask parameters. metrics: "nnz per feature" of Psi and its bound.
- power-series: M_alpha = sum_k alpha_k W^k, alpha the heat kernel exp(beta W) truncated at
  K_MAX: alpha_k = beta^k / k!, beta = 1. mask_params ("alpha",).
- grf: M_hat = G_q G_k^T from independent query- and key-side ensembles (reid25 Eq. 10, Alg. 1),
  f the deconvolution of the heat kernel, f_k = (beta / 2)^k / k! (k <= i_max), positive, so the
  mask is nonnegative; n_walkers = 4, p_halt = 0.5, i_max = 16 (E[M_hat] is the series capped at
  16 hops). Default graph grid-2d, and every grf problem has d = m = 8 (reid25's setting, the
  issue's for scale/grf and scale/grf-train at N = 2^20): q, k, v of width 8 and an 8 x 8
  projection (``graph_problem``: favor_problem's draws and batch magnitudes at width d, since
  favor_problem fixes 16; ``projection_draw`` redraws it at its own shape). Option
  variants: one shared ensemble (biased diagonal, documented), antithetic and repelling walks.
  mask_params ("f",). metrics: "nnz per feature" (mean nnz of a query-side feature row),
  "nnz per feature bound" (Lemma 3.2 at delta = 0.01: n ceil(b) + 1,
  b = log(1 - (1 - delta)^(1/n)) / log(1 - p_halt)), and "flops" (``grf_flops``).
- grf-asym: M_hat = G with f^(1) = alpha (one-hot key side, App. D, correctly normalised),
  alpha the heat kernel as power-series'. mask_params ("alpha",). metrics as rwgnk's.

Defaults: grid-2d for grf (the issue's scale setting) and for power-series (so the report's
gallery shows the exact M_alpha beside its GRF estimate on one 8 x 8 grid: grf's f is the
deconvolution of power-series' alpha on the same W), the path for the others (cheapest quick
sweeps: degree 2). Every graph builds at N = 1 (one isolated node). The "update" / "learnable"
protocol variants (equivalence-only) run the default problem with the mask parameter held by the
operator (verify.favor.mask_tensor hands a tensor over without copying; ``_param`` makes an array
an ordinary tensor even under the sweeps' inference_mode, whose tensors have no version counter).
Sweep grids: fast 2^7 .. 2^14 quick, 2^7 .. 2^17 full (the other graph variants 2^13 / 2^15);
dense 2^7 .. 2^11 quick, 2^12 full, one step less for gdk, whose dense mask is a dense N x N
expm (~20 s at N = 2^11 here).

Rooflines: no forest, so no bare scatter: perf/<id> times the mask product against the fp32
matmul rate with the product's useful FLOP count (the ``*_product_flops`` functions), reported
only.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import networkx as nx
import numpy as np
import scipy.sparse as sp
import torch

import fast
import reference.features as ref_features
import reference.graphs as ref_graphs
import reference.walks as ref_walks
from fast import walks as fast_walks
from fast.graphs import Graph, normalized_adjacency
from fast.masks.diffusion import DiffusionMask
from fast.masks.grf import GRFAsymMask, GRFMask, grf_features
from fast.masks import power_series as fast_power_series
from fast.masks.power_series import PowerSeriesMask
from fast.masks.rwgnk import RWGNKMask
from measure import roofline
from reference.masks import diffusion as ref_diffusion
from reference.masks import grf as ref_grf
from reference.masks import power_series as ref_power_series
from reference.masks import rwgnk as ref_rwgnk
from verify import problems
from verify.favor import D_QK, batch_magnitudes, favor_draw, favor_mechanism, favor_problem, mask_tensor, numpy_values
from verify.problems import Problem, qkv, rng_for
from verify.registry import Roofline, Variant, backward_variant, register

#: The graph families every record declares as variants (module docstring).
GRAPH_FAMILIES = ("path", "grid-2d", "regular", "erdos-renyi", "knn", "karate")
GRAPH_TITLES = {
    "path": "path 0 - 1 - ... - (N-1)",
    "grid-2d": "2-D grid, rows of width ceil(sqrt N), 4-neighbourhood (the ViT patch graph)",
    "regular": "random 4-regular graph",
    "erdos-renyi": "Erdos-Renyi G(N, p), mean degree 4",
    "knn": "symmetrised 4-NN graph of uniform points in [0, 1]^3",
    "karate": "Zachary's karate club (networkx), tiled to N nodes",
}
REGULAR_DEGREE = 4
ER_MEAN_DEGREE = 4.0
KNN_K = 4

#: Salts of rng_for(seed, salt) for the query-side (and only) and the key-side walk ensembles.
WALK_SALTS = {"walks": 120, "walks_k": 121}
#: Walks are sampled by reference.walks.sample_walks (a readable loop, ~13 us per walker) up to this
#: N, and by fast.walks.sample_walks on the CPU above it (2^20 x 4 walkers x 2 ensembles: ~110 s
#: with the loop, ~8 s vectorised), from a torch.Generator seeded from (seed, salt).
REFERENCE_WALKS_MAX_N = 2**16
#: The arrays of a Walks kept in extras (under a prefix); n_nodes is the problem's N.
WALK_ARRAYS = ("length", "offsets", "nodes")

LAM_GDK = 1.0
KINDS = ("laplacian", "random-walk", "adjacency")
#: rng_for(seed, QK_STD_SALT): gdk's q, k of a given std (gdk_problem's qk_std), QK_STD_SALT + 1 its edge
#: weights (graph_input); no other draw uses 122, 123.
QK_STD_SALT = 122
#: The graph forms gdk's variants hand fast/ (gdk_problem's graph_input; fast.as_graph's input kinds).
GRAPH_INPUTS = ("scipy", "edge-index", "edge-index-one-way", "torch-sparse", "networkx", "to-scipy")
#: gdk's "isolated-std8" variants: nodes without an edge, and the std of q, k (numerics' largest).
ISOLATED_NODES, ISOLATED_STD = 8, 8.0
#: DiffusionMask's a-priori tolerance: far below equivalence's float64 bound 1e-10.
TOL_GDK = 1e-12
LAM_RWGNK = 0.5
FIXED_LENGTH = 3
N_WALKERS = 4
P_HALT = 0.5
I_MAX = 16
BETA = 1.0
K_MAX = 16
#: power-series' coefficient routes (power_series_problem's ``coefficients``) and the regularised
#: Laplacian's sigma2 (radius (1 + sigma2) / sigma2 = 3 > rho(W) = 1).
COEFFICIENT_ROUTES = ("given", "diffusion", "regularised-laplacian", "convolved")
SIGMA2 = 0.5
#: reid25's setting for grf (d = m = 8); the other records keep verify.favor's 16.
D_GRF = 8
#: Lemma 3.2's failure probability for the "nnz per feature bound" metric.
NNZ_DELTA = 0.01


# ---------------------------------------------------------------------------------- graphs


def grid_2d(n: int) -> sp.csr_matrix:
    """The 2-D grid on exactly n nodes: row-major rows of width w = ceil(sqrt n) (the last one
    ragged), 4-neighbourhood; n = w^2 is the full w x w grid (2^20: 1024 x 1024)."""
    width = math.isqrt(n - 1) + 1
    rows = -(-n // width)
    return problems.grid_graph((rows, width))[:n, :n].tocsr()


def graph_adjacency(family: str, n: int, seed: int) -> sp.csr_matrix:
    """The canonical adjacency (n, n) float64 of ``family`` (GRAPH_FAMILIES) on n nodes."""
    if family not in GRAPH_FAMILIES:
        raise ValueError(f"graph must be one of {GRAPH_FAMILIES}, got {family!r}")
    if family == "path":
        a = problems.path_graph(n)
    elif family == "grid-2d":
        a = grid_2d(n)
    elif family == "regular":
        a = problems.random_regular(n, REGULAR_DEGREE, seed)
    elif family == "erdos-renyi":
        a = problems.erdos_renyi(n, min(1.0, ER_MEAN_DEGREE / (n - 1)) if n > 1 else 0.0, seed)
    elif family == "knn":
        a = problems.knn_graph(n, k=KNN_K, seed=seed)
    else:
        a = problems.karate_graph(n)
    return ref_graphs.adjacency(a)


def graph_extras(adj: sp.csr_matrix) -> dict[str, np.ndarray]:
    """The CSR arrays of ``adj`` as problem extras (module docstring)."""
    return {"graph_indptr": np.asarray(adj.indptr, dtype=np.int64),
            "graph_indices": np.asarray(adj.indices, dtype=np.int64),
            "graph_data": np.asarray(adj.data, dtype=np.float64)}


def adjacency(p: Problem) -> sp.csr_matrix:
    """The problem's adjacency (N, N) as scipy CSR float64."""
    e = p.extras
    return sp.csr_matrix((e["graph_data"], e["graph_indices"], e["graph_indptr"]), shape=(p.n, p.n))


def num_edges(p: Problem) -> int:
    """|E|: stored (directed) entries of the adjacency, 2 x the undirected edges."""
    return int(p.extras["graph_indices"].size)


def fast_graph(p: Problem, device) -> Graph:
    return Graph.from_any(adjacency(p), device=device)


# ---------------------------------------------------------------------------------- walks


def _walk_options(e: dict) -> dict[str, Any]:
    """sample_walks' keyword options recorded in extras."""
    kw: dict[str, Any] = {}
    if "fixed_length" in e:
        kw["fixed_length"] = int(e["fixed_length"])
    else:
        kw["p_halt"] = float(e["p_halt"])
        if "i_max" in e:
            kw["i_max"] = int(e["i_max"])
    for flag in ("antithetic", "repelling"):
        if flag in e:
            kw[flag] = bool(e[flag])
    return kw


def walk_fields(p: Problem, prefix: str = "walks") -> dict[str, Any]:
    """The Walks fields under ``prefix`` (n_nodes, n_walkers, p_halt, length, offsets, nodes)."""
    e = p.extras
    return {"n_nodes": p.n, "n_walkers": int(e["n_walkers"]),
            "p_halt": 0.0 if "fixed_length" in e else float(e["p_halt"]),
            **{a: np.asarray(e[f"{prefix}_{a}"]) for a in WALK_ARRAYS}}


def _walk_arrays(walks: Any, prefix: str) -> dict[str, np.ndarray]:
    """The arrays of a reference Walks (or a fast one's to_numpy() dict) under ``prefix``."""
    get = walks.get if isinstance(walks, dict) else (lambda name: getattr(walks, name))
    return {f"{prefix}_{a}": np.asarray(get(a), dtype=np.int64) for a in WALK_ARRAYS}


def walk_prefixes(p: Problem) -> tuple[str, ...]:
    return tuple(pre for pre in WALK_SALTS if f"{pre}_nodes" in p.extras)


def ref_walks_of(p: Problem, prefix: str = "walks") -> ref_walks.Walks:
    return ref_walks.Walks(**walk_fields(p, prefix))


def fast_walks_of(p: Problem, prefix: str, device) -> fast_walks.Walks:
    return fast_walks.Walks.from_arrays(**walk_fields(p, prefix), device=device)


def _sample_extras(adj: sp.csr_matrix, seed: int, prefixes: tuple[str, ...], n_walkers: int, p_halt: float | None,
                   i_max: int | None, fixed_length: int | None, antithetic: bool = False,
                   repelling: bool = False) -> dict[str, Any]:
    """The walk options and every ensemble of ``prefixes``, sampled by the reference sampler."""
    options: dict[str, Any] = {"n_walkers": np.int64(n_walkers)}
    if fixed_length is not None:
        options["fixed_length"] = np.int64(fixed_length)
    else:
        options["p_halt"] = np.float64(p_halt)
        if i_max is not None:
            options["i_max"] = np.int64(i_max)
    if antithetic:
        options["antithetic"] = np.bool_(True)
    if repelling:
        options["repelling"] = np.bool_(True)
    kw = _walk_options(options)
    n = adj.shape[0]
    graph = Graph.from_any(adj) if n > REFERENCE_WALKS_MAX_N else None
    for prefix in prefixes:
        if graph is None:
            w = ref_walks.sample_walks(adj, n_walkers, rng_for(seed, WALK_SALTS[prefix]), **kw)
        else:  # the readable loop costs ~13 us per walker: fast/'s sampler, seeded the same way
            gen = torch.Generator().manual_seed(_torch_seed(seed, WALK_SALTS[prefix]))
            w = fast_walks.sample_walks(graph, n_walkers, generator=gen, **kw).to_numpy()
        options.update(_walk_arrays(w, prefix))
    return options


def _torch_seed(seed: int, salt: int) -> int:
    """A 63-bit torch seed from (seed, salt) through SeedSequence, as rng_for's entropy."""
    return int(np.random.SeedSequence([int(seed), int(salt)]).generate_state(1, dtype=np.uint64)[0] >> 1)


def walk_draw(p: Problem, generator: torch.Generator) -> Problem:
    """The problem with its FAVOR+ projection (of its own shape (m, d)) drawn by
    fast.gaussian_projection and every walk ensemble re-sampled by fast.walks.sample_walks, all
    from ``generator`` (reproducibility/<id>); q, k, v, the graph and the options stay."""
    p = projection_draw(p, generator)
    g = fast_graph(p, generator.device)
    extras = dict(p.extras)
    kw = _walk_options(p.extras)
    for prefix in walk_prefixes(p):
        w = fast_walks.sample_walks(g, int(p.extras["n_walkers"]), generator=generator, **kw)
        extras.update(_walk_arrays(w.to_numpy(), prefix))
    return replace(p, extras=extras)


def projection_draw(p: Problem, generator: torch.Generator) -> Problem:
    """verify.favor.favor_draw for a projection of any shape (m, d) (grf's is 8 x 8)."""
    m, d = p.projection.shape
    if (m, d) == (16, D_QK):
        return favor_draw(p, generator)
    w = fast.gaussian_projection(m, d, generator=generator, device=generator.device, dtype=torch.float64)
    return replace(p, projection=w.cpu().numpy())


def nnz_per_row(p: Problem, prefix: str = "walks", terms: int | None = None) -> np.ndarray:
    """(N,) number of distinct nodes (u_t, t < terms) the walks of each start node visit: the nnz
    of its feature row (GRF's phi_hat, RWGNK's Psi row). terms None: every prefix."""
    f = walk_fields(p, prefix)
    length, offsets, nodes = f["length"], f["offsets"], f["nodes"]
    walk = np.repeat(np.arange(length.size), length + 1)
    t = np.arange(nodes.size) - offsets[walk]
    keep = t < terms if terms is not None else np.ones(nodes.size, dtype=bool)
    start = walk[keep] // f["n_walkers"]
    keys = np.unique(start * p.n + nodes[keep])
    return np.bincount(keys // p.n, minlength=p.n)


def nnz_bound(n_walkers: int, p_halt: float, delta: float = NNZ_DELTA, i_max: int | None = None) -> float:
    """reid25 Lemma 3.2: with probability >= 1 - delta a feature row has at most n ceil(b) + 1
    nonzeros, b = log(1 - (1 - delta)^(1/n)) / log(1 - p_halt) (n = 4, p = 0.5: 37); a cap of
    i_max hops gives n min(ceil(b), i_max) + 1."""
    b = math.ceil(math.log(1.0 - (1.0 - delta) ** (1.0 / n_walkers)) / math.log(1.0 - p_halt))
    return float(n_walkers * (b if i_max is None else min(b, i_max)) + 1)


# ---------------------------------------------------------------------------------- problems


def graph_problem(n: int, seed: int, adj: sp.csr_matrix, batch: tuple[int, ...], d: int, **extras) -> Problem:
    """FAVOR+ inputs (favor_problem; width d for q, k, v and an m = d projection when d != 16)
    with the CSR arrays of the adjacency ``adj`` and ``extras``."""
    extras = {**graph_extras(adj), **extras}
    if d == D_QK:
        return favor_problem(n, seed, batch=batch, **extras)
    # favor_problem's widths are fixed at 16: the same draws at width d (its seeds and the batch
    # magnitude profile), for reid25's d = m = 8
    batch = tuple(int(b) for b in batch)
    q, k, v = qkv(n, d, d, batch=batch, seed=seed)
    w = ref_features.gaussian_projection(d, d, rng_for(seed, 10))
    if batch:
        k, v = batch_magnitudes(k, v, w, seed)
    return Problem(n=n, seed=seed, q=q, k=k, v=v, projection=w, extras=extras)


def heat_alpha(beta: float, k_max: int) -> np.ndarray:
    """alpha_k = beta^k / k!, k = 0..k_max: exp(beta W) truncated."""
    return np.array([beta**k / math.factorial(k) for k in range(k_max + 1)])


def heat_f(beta: float, k_max: int) -> np.ndarray:
    """f_k = (beta / 2)^k / k!: the deconvolution of heat_alpha (sum_p f_p f_(k-p) = beta^k / k!)."""
    return heat_alpha(beta / 2.0, k_max)


def gdk_problem(n: int, seed: int, *, graph: str = "path", kind: str = "laplacian", lam: float = LAM_GDK,
                isolated: int = 0, qk_std: float | None = None, graph_input: str = "scipy",
                batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs, a graph and the diffusion time lam (0-d) of M = exp(-lam T), T by ``kind``.

    isolated: the last min(isolated, n - 1) nodes have no edge (the graph family on the others);
    qk_std: q and k replaced by qk_std * N(0, 1) entries (rng_for(seed, QK_STD_SALT)), the scale at
    which a node that sees few keys loses them all to underflow under one constant per slice;
    graph_input (GRAPH_INPUTS): the form the fast path is handed the graph in ("scipy", the default;
    "edge-index" a PyG edge_index with edge_weight; "edge-index-one-way" each edge once with
    symmetrize=True; "torch-sparse" a COO tensor; "networkx" a weighted nx.Graph; "to-scipy" the
    edge_index form's Graph exported by Graph.to_scipy and converted back): the other forms
    carry random weights in [0.5, 2] (rng_for(seed, QK_STD_SALT + 1)), so a conversion that drops or
    misplaces them changes M."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if graph_input not in GRAPH_INPUTS:
        raise ValueError(f"graph_input must be one of {GRAPH_INPUTS}, got {graph_input!r}")
    alone = min(int(isolated), n - 1)
    adj = graph_adjacency(graph, n - alone, seed)
    if alone:
        adj = sp.csr_matrix(sp.block_diag([adj, sp.csr_matrix((alone, alone))], format="csr"))
    if graph_input != "scipy":  # symmetric random weights on the same pattern
        upper = sp.triu(adj, k=1).tocoo()
        w = rng_for(seed, QK_STD_SALT + 1).uniform(0.5, 2.0, upper.nnz)
        half = sp.csr_matrix((w, (upper.row, upper.col)), shape=adj.shape)
        adj = ref_graphs.adjacency(half + half.T)
    p = graph_problem(n, seed, adj, batch, D_QK, lam=np.float64(lam), kind=kind, graph_input=graph_input)
    if qk_std is not None:
        rng = rng_for(seed, QK_STD_SALT)
        p = replace(p, q=qk_std * rng.standard_normal(p.q.shape), k=qk_std * rng.standard_normal(p.k.shape))
    return p


def rwgnk_problem(n: int, seed: int, *, graph: str = "path", lam: float = LAM_RWGNK, alpha: int = 0,
                  fixed_length: int | None = None, n_walkers: int = N_WALKERS, p_halt: float = P_HALT,
                  i_max: int = I_MAX, batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs, a graph, one walk ensemble (halting, or ``fixed_length`` hops), lam, alpha."""
    adj = graph_adjacency(graph, n, seed)
    walks = _sample_extras(adj, seed, ("walks",), n_walkers, None if fixed_length is not None else p_halt,
                           None if fixed_length is not None else i_max, fixed_length)
    return graph_problem(n, seed, adj, batch, D_QK, lam=np.float64(lam), alpha=np.int64(alpha), **walks)


def power_series_problem(n: int, seed: int, *, graph: str = "grid-2d", beta: float = BETA, k_max: int = K_MAX,
                         coefficients: str = "given", batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs, a graph and alpha (K_MAX + 1,) of the heat kernel exp(beta W).

    coefficients (COEFFICIENT_ROUTES): "given" (alpha an array, both sides read it); "diffusion",
    "regularised-laplacian" (sigma2 = SIGMA2), "convolved" (alpha = convolve(f), f the heat kernel's
    deconvolution): each side computes alpha with its own function (reference.masks.power_series for
    the reference, fast.masks.power_series for the fast path, the regularised Laplacian's radius
    certified on the graph first), so those public coefficient builders are compared too."""
    adj = graph_adjacency(graph, n, seed)
    if coefficients == "given":
        alpha = heat_alpha(beta, k_max)
    elif coefficients == "diffusion":
        alpha = ref_power_series.diffusion_alpha(beta, k_max)
    elif coefficients == "regularised-laplacian":
        alpha = ref_power_series.regularised_laplacian_alpha(SIGMA2, k_max, ref_graphs.normalized_adjacency(adj))
    elif coefficients == "convolved":
        alpha = ref_power_series.convolve(heat_f(beta, k_max), k_max)
    else:
        raise ValueError(f"coefficients must be one of {COEFFICIENT_ROUTES}, got {coefficients!r}")
    return graph_problem(n, seed, adj, batch, D_QK, alpha=alpha, coefficients=coefficients,
                         beta=np.float64(beta), k_max=np.int64(k_max))


def grf_problem(n: int, seed: int, *, graph: str = "grid-2d", beta: float = BETA, n_walkers: int = N_WALKERS,
                p_halt: float = P_HALT, i_max: int = I_MAX, shared: bool = False, antithetic: bool = False,
                repelling: bool = False, d: int = D_GRF, deconvolved: bool = False,
                batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs of width d, a graph, f (i_max + 1,) of the heat kernel and two independent
    walk ensembles (one when ``shared``: the biased-diagonal option). deconvolved: f = deconvolve(alpha)
    of the heat kernel's alpha, computed by each side's own deconvolve (the fast path's by
    fast.masks.power_series.deconvolve)."""
    adj = graph_adjacency(graph, n, seed)
    prefixes = ("walks",) if shared else ("walks", "walks_k")
    walks = _sample_extras(adj, seed, prefixes, n_walkers, p_halt, i_max, None, antithetic, repelling)
    if deconvolved:  # f from alpha by each side's own deconvolve (the public coefficient builder)
        return graph_problem(n, seed, adj, batch, d, f=ref_power_series.deconvolve(heat_alpha(beta, i_max)),
                             deconvolve_beta=np.float64(beta), **walks)
    return graph_problem(n, seed, adj, batch, d, f=heat_f(beta, i_max), **walks)


def grf_asym_problem(n: int, seed: int, *, graph: str = "path", beta: float = BETA, n_walkers: int = N_WALKERS,
                     p_halt: float = P_HALT, i_max: int = I_MAX, batch: tuple[int, ...] = ()) -> Problem:
    """FAVOR+ inputs, a graph, alpha (i_max + 1,) of the heat kernel and one walk ensemble."""
    adj = graph_adjacency(graph, n, seed)
    walks = _sample_extras(adj, seed, ("walks",), n_walkers, p_halt, i_max, None)
    return graph_problem(n, seed, adj, batch, D_QK, alpha=heat_alpha(beta, i_max), **walks)


# ---------------------------------------------------------------------------------- masks


def _param(p: Problem, name: str, device) -> torch.Tensor:
    """The mask parameter ``name`` as a tensor: a tensor in extras is held as given
    (verify.favor.mask_tensor: no copy); an array becomes an ordinary tensor even under the
    sweeps' torch.inference_mode (an inference tensor has no version counter, which DiffusionMask
    and WalkFeatures read to follow in-place updates)."""
    value = p.extras[name]
    if isinstance(value, torch.Tensor):
        return mask_tensor(value, device)
    with torch.inference_mode(False):
        return mask_tensor(value, device)


def _gdk_dense(p: Problem) -> np.ndarray:
    return ref_diffusion.diffusion_mask(adjacency(p), float(numpy_values(p.extras["lam"])), str(p.extras["kind"]))


def _graph_as_given(p: Problem, device) -> Graph:
    """The problem's graph in the form ``graph_input`` names (gdk_problem), converted by fast.as_graph."""
    form = str(p.extras.get("graph_input", "scipy"))
    if form == "scipy":
        return fast_graph(p, device)
    coo = adjacency(p).tocoo()
    if form == "edge-index-one-way":
        keep = coo.row < coo.col
        index = torch.as_tensor(np.stack([coo.row[keep], coo.col[keep]]), device=device)
        return fast.as_graph(index, n=p.n, edge_weight=torch.as_tensor(coo.data[keep], device=device),
                             symmetrize=True)
    index = torch.as_tensor(np.stack([coo.row, coo.col]), device=device)
    weight = torch.as_tensor(coo.data, device=device)
    if form == "edge-index":
        return fast.as_graph(index, n=p.n, edge_weight=weight)
    if form == "torch-sparse":
        return fast.as_graph(torch.sparse_coo_tensor(index, weight, (p.n, p.n), check_invariants=True))
    if form == "to-scipy":  # Graph's export, the user's way back to SciPy, read in again
        return fast.as_graph(fast.as_graph(index.cpu(), n=p.n, edge_weight=weight.cpu()).to_scipy()).to(device)
    g = nx.Graph()  # "networkx"
    g.add_nodes_from(range(p.n))
    g.add_weighted_edges_from((int(u), int(v), float(w)) for u, v, w in zip(coo.row, coo.col, coo.data) if u < v)
    return fast.as_graph(g).to(device)


def _gdk_fast(p: Problem, device) -> DiffusionMask:
    return DiffusionMask(_graph_as_given(p, device), _param(p, "lam", device), kind=str(p.extras["kind"]),
                         tol=TOL_GDK)


def _rwgnk_dense(p: Problem) -> np.ndarray:
    return ref_rwgnk.rwgnk_mask(adjacency(p), ref_walks_of(p), float(p.extras["lam"]), int(p.extras["alpha"]))


def _rwgnk_fast(p: Problem, device) -> RWGNKMask:
    return RWGNKMask(fast_graph(p, device), fast_walks_of(p, "walks", device), float(p.extras["lam"]),
                     int(p.extras["alpha"]))


def _power_series_dense(p: Problem) -> np.ndarray:
    return ref_power_series.power_series_mask(ref_graphs.normalized_adjacency(adjacency(p)),
                                              numpy_values(p.extras["alpha"]))


def _power_series_fast(p: Problem, device) -> PowerSeriesMask:
    w = normalized_adjacency(fast_graph(p, device))
    route, e = str(p.extras.get("coefficients", "given")), p.extras
    if route == "given":
        alpha = _param(p, "alpha", device)
    elif route == "diffusion":
        alpha = fast_power_series.diffusion_alpha(float(e["beta"]), int(e["k_max"]))
    elif route == "regularised-laplacian":
        alpha = fast_power_series.regularised_laplacian_alpha(SIGMA2, int(e["k_max"]), graph=w)
    else:  # "convolved"
        alpha = fast_power_series.convolve(fast_power_series.deconvolve(fast_power_series.heat_alpha(
            float(e["beta"]), int(e["k_max"]))), int(e["k_max"]))
    return PowerSeriesMask(w, alpha.to(device) if isinstance(alpha, torch.Tensor) else alpha)


def _key_prefix(p: Problem) -> str:
    return "walks_k" if "walks_k_nodes" in p.extras else "walks"


def _grf_dense(p: Problem) -> np.ndarray:
    w = ref_graphs.normalized_adjacency(adjacency(p))
    return ref_grf.grf_mask(w, ref_walks_of(p), ref_walks_of(p, _key_prefix(p)), numpy_values(p.extras["f"]))


def _grf_fast(p: Problem, device) -> GRFMask:
    w = normalized_adjacency(fast_graph(p, device))
    if "deconvolve_beta" in p.extras:  # f = deconvolve(alpha) by fast's own function (grf_problem)
        e = p.extras
        f = fast_power_series.deconvolve(fast_power_series.heat_alpha(float(e["deconvolve_beta"]),
                                                                      int(e["f"].shape[0]) - 1)).to(device)
    else:
        f = _param(p, "f", device)
    features_q = grf_features(w, fast_walks_of(p, "walks", device), f)
    if "walks_k_nodes" not in p.extras:  # one shared ensemble
        return GRFMask(features_q, None)
    return GRFMask(features_q, grf_features(w, fast_walks_of(p, "walks_k", device), f))


def _grf_asym_dense(p: Problem) -> np.ndarray:
    w = ref_graphs.normalized_adjacency(adjacency(p))
    return ref_grf.grf_asym_mask(w, ref_walks_of(p), numpy_values(p.extras["alpha"]))


def _grf_asym_fast(p: Problem, device) -> GRFAsymMask:
    w = normalized_adjacency(fast_graph(p, device))
    return GRFAsymMask(grf_features(w, fast_walks_of(p, "walks", device), _param(p, "alpha", device)))


# ---------------------------------------------------------------------------------- metrics, costs


def cost_factor_n_plus_e(p: Problem) -> float:
    """(N + |E|) / N: gdk's cost factor (class "N + E"); |E| the stored entries of the adjacency."""
    return (p.n + num_edges(p)) / p.n


def gdk_metrics(p: Problem) -> dict[str, float]:
    """DiffusionMask's plan at the problem: "sparse products" = steps x terms (products with T per
    column block)."""
    op = _gdk_fast(p, "cpu")
    return {"sparse products": float(int(op.steps) * int(op.terms))}


def _nnz_metrics(p: Problem, terms: int | None) -> dict[str, float]:
    nnz = nnz_per_row(p, "walks", terms)
    out = {"nnz per feature": float(nnz.mean())}
    if "p_halt" in p.extras:
        i_max = int(p.extras["i_max"]) if "i_max" in p.extras else None
        out["nnz per feature bound"] = nnz_bound(int(p.extras["n_walkers"]), float(p.extras["p_halt"]), NNZ_DELTA,
                                                 i_max)
    else:  # fixed-length walks: at most L new nodes per walk
        out["nnz per feature bound"] = float(int(p.extras["n_walkers"]) * int(p.extras["fixed_length"]) + 1)
    return out


def grf_flops(p: Problem) -> float:
    """Useful FLOPs of one GRF-masked linear attention call (Algorithm 1) per (batch, head) slice:
    the FAVOR+ features of q and k (2 x measure.roofline.feature_map_flops), the key-side columns
    X = [phi_k (x) v, phi_k] (N m d_v products), the sparse products G_k^T X and G_q (G_k^T X) on
    c = m d_v + m columns (2 nnz(G_k) c + 2 nnz(G_q) c), the contraction of each row with phi_q
    (2 N m d_v + 2 N m) and the division (N d_v). All O(N) at bounded nnz per row (reid25 Fig. 3's
    quantity, at its d = m = 8)."""
    n, d = p.q.shape[-2], p.q.shape[-1]
    m, d_v = p.projection.shape[0], p.v.shape[-1]
    c = m * d_v + m
    nnz_q = nnz_per_row(p, "walks", len(p.extras["f"])).sum()
    nnz_k = nnz_per_row(p, _key_prefix(p), len(p.extras["f"])).sum()
    return float(2 * roofline.feature_map_flops(n, d, m) + n * m * d_v + 2 * (nnz_q + nnz_k) * c
                 + 2 * n * m * d_v + 2 * n * m + n * d_v)


def grf_metrics(p: Problem) -> dict[str, float]:
    """nnz per feature (mean over the query-side rows, prefixes t < len(f)), its Lemma 3.2 bound
    and the useful FLOPs of the masked attention (grf_flops)."""
    return {**_nnz_metrics(p, len(p.extras["f"])), "flops": grf_flops(p)}


def grf_asym_metrics(p: Problem) -> dict[str, float]:
    return _nnz_metrics(p, len(p.extras["alpha"]))


def rwgnk_metrics(p: Problem) -> dict[str, float]:
    return _nnz_metrics(p, None)


# ---------------------------------------------------------------------------------- rooflines


def gdk_product_flops(op, n: int, c: int) -> tuple[float, None]:
    """(useful, None): steps x terms products with T (|E| + N stored entries: the adjacency and
    the diagonal) at 2 (|E| + N) c FLOPs each, plus the Taylor sum's scale-and-add (2 N c per term)."""
    e = float(op.graph.num_edges)
    products = float(int(op.steps) * int(op.terms))
    return products * (2.0 * (e + n) * c + 2.0 * n * c), None


def power_series_product_flops(op, n: int, c: int) -> tuple[float, None]:
    """(useful, None): Horner, K products with W (2 |E| c) and K scale-and-adds (2 N c)."""
    k = float(op.terms)
    return k * (2.0 * float(op.graph.num_edges) * c + 2.0 * n * c), None


def rwgnk_product_flops(op, n: int, c: int) -> tuple[float, None]:
    """(useful, None): Psi (Psi^T x), two sparse products of 2 nnz(Psi) c FLOPs."""
    return 4.0 * float(op.nnz) * c, None


def grf_product_flops(op, n: int, c: int) -> tuple[float, None]:
    """(useful, None): G_q (G_k^T x), 2 (nnz(G_q) + nnz(G_k)) c FLOPs."""
    return 2.0 * float(op.features_q.nnz + op.features_k.nnz) * c, None


def grf_asym_product_flops(op, n: int, c: int) -> tuple[float, None]:
    """(useful, None): G x, 2 nnz(G) c FLOPs."""
    return 2.0 * float(op.features.nnz) * c, None


# ---------------------------------------------------------------------------------- records


def graph_variants(default: str, **sizes) -> tuple[Variant, ...]:
    """The six graph families, ``default`` first (the record's grids); the others swept on
    ``sizes``, karate not at all (sweep=False: one fixed graph, tiled)."""
    return (Variant(default, GRAPH_TITLES[default], params={"graph": default}),
            *(Variant(g, GRAPH_TITLES[g], params={"graph": g}, sweep=g != "karate", **(sizes if g != "karate" else {}))
              for g in GRAPH_FAMILIES if g != default))


def protocol_variants(what: str) -> tuple[Variant, ...]:
    """"update" and "learnable" variants of the default problem (equivalence-only)."""
    return (Variant("update", f"{what} changed in place between two calls of one operator", sweep=False,
                    protocol="update"),
            Variant("learnable", f"{what} a leaf that requires grad: forward and gradient", sweep=False,
                    protocol="learnable"))



#: Quick sweeps: 2^7 .. 2^14 fast, 2^7 .. 2^11 dense; full: 2^7 .. 2^17 fast, 2^7 .. 2^12 dense.
QUICK = dict(quick_fast_sizes=tuple(2**p for p in range(7, 15)), quick_dense_sizes=tuple(2**p for p in range(7, 12)),
             dense_sizes=tuple(2**p for p in range(7, 13)))
#: gdk's dense mask is a dense N x N computation (scipy.linalg.expm: 2.5 s at N = 2^11, ~20 s at
#: 2^12 on an AVX-512 Xeon), so its full dense grid stops one step earlier (2^11), where the quick
#: one also stops: the speed-up test needs the twin's last octave, where its N^2 work shows. At
#: 2^7..2^10 both paths are still mostly per-call overhead and the speed-up grows at a slope of
#: only ~0.25, which 3 rounds on a shared machine could not tell from 0. power-series' dense mask
#: is K sparse-dense products (0.6 s at 2^11): the common grids.
QUICK_DENSE_N3 = {**QUICK, "dense_sizes": tuple(2**p for p in range(7, 12))}
#: The non-default graph variants sweep shorter (each is a whole extra sweep in measure).
FAMILY_SIZES = dict(quick_fast_sizes=tuple(2**p for p in range(7, 14)), fast_sizes=tuple(2**p for p in range(7, 16)))


def _matmul_roofline(flops) -> Roofline:
    return Roofline("matmul", roofline.mask_product_case("matmul", flops=flops))


register(favor_mechanism(
    "gdk", "Graph diffusion kernel exp(-lam T), truncated Taylor action", "choromanski22 Thm. 4.1", "N + E",
    problem=gdk_problem, dense_mask=_gdk_dense, fast_mask=_gdk_fast, **QUICK_DENSE_N3,
    variants=(*graph_variants("path", **FAMILY_SIZES),
              *(Variant(k, f"path, T = {t}", params={"kind": k}, sweep=False)
                for k, t in (("random-walk", "L D^-1"), ("adjacency", "-A"))),
              # the exact per-key route (DiffusionMask.attend_exact): under one constant per slice float32
              # refuses these (an isolated node sees only its own key, which underflows); karate, whose
              # small diameter keeps the truncated series within float64's tolerance at std 8
              *(Variant(f"isolated-std8{suffix}", f"karate (tiled) and {ISOLATED_NODES} isolated nodes, q, k of std "
                        f"{ISOLATED_STD:g}, T = {t}: the per-key series", sweep=False,
                        params={"graph": "karate", "isolated": ISOLATED_NODES, "qk_std": ISOLATED_STD, "kind": k})
                for k, t, suffix in (("laplacian", "L", ""), ("random-walk", "L D^-1", "-random-walk"))),
              # the graph input forms fast.as_graph converts (weighted, so dropped weights change M)
              *(Variant(form, f"path, random weights, the graph given as {what}", params={"graph_input": form},
                        sweep=False)
                for form, what in (("edge-index", "edge_index + edge_weight"),
                                   ("edge-index-one-way", "each edge once, symmetrize=True"),
                                   ("torch-sparse", "a torch sparse COO tensor"), ("networkx", "a weighted nx.Graph"),
                                   ("to-scipy", "fast.Graph.to_scipy's export, read back"))),
              *protocol_variants("the diffusion time lam"),
              backward_variant(kind="random-walk")),  # L D^-1: the asymmetric kind, rmatmul != matmul
    mask_params=("lam",), cost_factor=cost_factor_n_plus_e, cost_factor_name="(N+E)/N", metrics=gdk_metrics,
    roofline=_matmul_roofline(gdk_product_flops),
    notes=f"M = exp(-lam L), L = D - A, lam = {LAM_GDK}, tol {TOL_GDK:g}; kinds L D^-1 and -A as variants.",
))
register(favor_mechanism(
    "rwgnk", "Random-walk graph node kernel Psi Psi^T (GKAT)", "choromanski22 Sec. 4.2, Eq. 5", "N",
    problem=rwgnk_problem, dense_mask=_rwgnk_dense, fast_mask=_rwgnk_fast, **QUICK,
    variants=(*graph_variants("path", **FAMILY_SIZES),
              Variant("alpha-1", "path, alpha = 1: Psi(h) = f_h / |f_h|", params={"alpha": 1}, sweep=False),
              Variant("fixed-length", f"path, walks of exactly {FIXED_LENGTH} hops", params={"fixed_length": FIXED_LENGTH},
                      sweep=False),
              backward_variant()),
    draw=walk_draw, metrics=rwgnk_metrics, roofline=_matmul_roofline(rwgnk_product_flops),
    notes=f"lam = {LAM_RWGNK}, alpha = 0, {N_WALKERS} walkers per node, p_halt = {P_HALT}, i_max = {I_MAX}.",
))
register(favor_mechanism(
    "power-series", "Exact power series sum_k alpha_k W^k, Horner", "reid25 Eq. 2 (M_alpha)", "N",
    problem=power_series_problem, dense_mask=_power_series_dense, fast_mask=_power_series_fast, **QUICK,
    variants=(*graph_variants("grid-2d", **FAMILY_SIZES),
              *(Variant(c, f"grid-2d, alpha by {what} (each side's own function)", params={"coefficients": c},
                        sweep=False)
                for c, what in (("diffusion", "diffusion_alpha"),
                                ("regularised-laplacian", f"regularised_laplacian_alpha (sigma2 = {SIGMA2:g}, "
                                                          "radius certified on the graph)"),
                                ("convolved", "convolve(deconvolve(alpha))"))),
              *protocol_variants("alpha"), backward_variant()),
    mask_params=("alpha",), roofline=_matmul_roofline(power_series_product_flops),
    notes=f"alpha_k = beta^k / k! (heat kernel exp(beta W)), beta = {BETA}, k <= {K_MAX}, W = D^-1/2 A D^-1/2.",
))
register(favor_mechanism(
    "grf", "Graph random features G_q G_k^T", "reid25 Eq. 10, Alg. 1", "N",
    problem=grf_problem, dense_mask=_grf_dense, fast_mask=_grf_fast, **QUICK,
    variants=(*graph_variants("grid-2d", **FAMILY_SIZES),
              Variant("shared-ensemble", "grid-2d, one walk ensemble on both sides (biased diagonal)",
                      params={"shared": True}, sweep=False),
              Variant("antithetic", "grid-2d, antithetic termination", params={"antithetic": True}, sweep=False),
              Variant("repelling", "grid-2d, repelling walks", params={"repelling": True}, sweep=False),
              Variant("deconvolved", "grid-2d, f = deconvolve(alpha) by each side's own function",
                      params={"deconvolved": True}, sweep=False),
              *protocol_variants("f"), backward_variant()),
    scale=True, scale_train=True, mask_params=("f",), draw=walk_draw, metrics=grf_metrics,
    roofline=_matmul_roofline(grf_product_flops),
    notes=(f"f_k = (beta/2)^k / k! (heat kernel), {N_WALKERS} walkers, p_halt = {P_HALT}, i_max = {I_MAX}, "
           f"d = m = {D_GRF}, independent ensembles."),
))
register(favor_mechanism(
    "grf-asym", "Asymmetric GRF, one-hot key side", "reid25 App. D, Alg. 2 (normalisation corrected)", "N",
    problem=grf_asym_problem, dense_mask=_grf_asym_dense, fast_mask=_grf_asym_fast, **QUICK,
    variants=(*graph_variants("path", **FAMILY_SIZES), *protocol_variants("alpha"),
              backward_variant()),  # G is not symmetric: the backward's rmatmul is G^T
    mask_params=("alpha",), draw=walk_draw, metrics=grf_asym_metrics,
    roofline=_matmul_roofline(grf_asym_product_flops),
    notes=f"alpha_k = beta^k / k!, {N_WALKERS} walkers, p_halt = {P_HALT}, i_max = {I_MAX}.",
))
