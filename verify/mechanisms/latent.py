"""Registry records: nodeformer, nodeformer-gumbel, relational-bias, edge-loss, difformer, sgformer
(wu22 Eqs. 5, 7, 8, 10; the tutorial's simple attention; SGFormer; docs/papers.md Sec. 4).

Every problem is a PyG-style batch of graphs: ``graphs`` graphs of one family (verify.mechanisms.
graph.GRAPH_FAMILIES) concatenated along N, their adjacencies block-diagonal, and a sorted batch
vector saying which graph each node belongs to. What the records need lives in problem.extras as
flat NumPy arrays (the consumers of verify.mechanisms.graph's module doc):

- ``graph_indptr``, ``graph_indices``, ``graph_data``: the block-diagonal adjacency (CSR, unit
  weights), ``batch_index`` (N,) int64 sorted, ``graphs`` the number of graphs;
- nodeformer-gumbel: ``noise`` (K, *batch, N), Gumbel(0, 1) per sample, leading slice and KEY node
  (rng_for(seed, NOISE_SALT)), and ``tau``;
- relational-bias: ``b`` (order,), ``order``, ``normalize``; every record: ``tau``.

One graph (graphs = 1, the default variants, sweeps and scale) runs the fast paths with batch None
(their plain GEMM path). A batch is GRAPHS = 3 graphs of uneven sizes (about N/2, N/3, N/6) plus
a graph of ONE node, labelled 0, 1, 3, 4 (label 2 is an empty graph, which the batch vector
contract allows; ``graph_sizes``, ``batch_labels``), so equivalence checks that no graph's output
reads another graph's nodes (NodeFormer's key sums, DIFFormer's and SGFormer's Frobenius norms and
the edge loss's denominators are per graph), and the one-node and empty-label edge cases. The
records that read edges (relational-bias, edge-loss) run such a batch of every graph family; the
all-pair records (nodeformer, nodeformer-gumbel, difformer, sgformer) read no edge, so the family
would only set the sizes: they run one batch.

difformer and sgformer shift q and k (SHIFT_DIF, SHIFT_SG; ``latent_problem``): on
random unit rows their score term moves the outputs by ~1e-5, below float32's tolerance, so
equivalence could not see an error in it there.

Widths: d_qk = d_v = D_LATENT = 32 (the issue's scale setting, N = 2^20 at d = 32) and an m = 32
FAVOR+ projection (NodeFormer's default is m = 30), drawn as verify.mechanisms.graph.graph_problem
draws them (favor_problem's seeds and batch magnitude profile at width 32).

Temperatures: tau = 1 (Eq. 5 as printed: the kernel exp(q.k / sqrt(d))) for nodeformer,
relational-bias and edge-loss; TAU_GUMBEL = 0.25 (NodeFormer's default) for nodeformer-gumbel, with
K = GUMBEL_SAMPLES = 3 samples (the default 10 only multiplies the cost).

Dense twins (dense_setup, issue 23): every record also has an O(N^2) torch twin of the same
function, its (N, N) kernel or score matrix formed explicitly and masked by the same-graph
matrix (the adjacency for the bias and edge terms), so that the sweeps give each a crossover
against dense attention (quick, 2^7 .. 2^11: about 0.5-0.8 s of timing each).

Rooflines: perf/<id> times the forward of the user-facing function on (1, 4, N, 64) inputs with
m = 64 (measure.roofline.attention_inputs) against the fp32 matmul rate with its useful FLOP count
(``*_flops`` below), reported only.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

import fast
import reference.latent.nodeformer as ref_nodeformer
import reference.latent.simple_attention as ref_simple
from measure import roofline
from verify.mechanisms.graph import (GRAPH_FAMILIES, GRAPH_TITLES, QUICK, adjacency, graph_adjacency, graph_extras,
                                     graph_problem, num_edges, projection_draw)
from verify.problems import Problem, rng_for
from fast.segments import FEW_SEGMENTS
from verify.registry import Mechanism, Roofline, Variant, backward_variant, register

D_LATENT = 32
#: Graphs per problem in the graph variants (uneven sizes: WEIGHTS).
GRAPHS = 3
WEIGHTS = (3, 2, 1)
TAU = 1.0
TAU_GUMBEL = 0.25
GUMBEL_SAMPLES = 3
NOISE_SALT = 130
SHIFT_SALT = 131
#: The shifts of q and k (latent_problem): sgformer's common shift of the order of the batch
#: profile's quiet keys (norm 32), so the score term reaches every slice (1e-3 .. 4e-2 relative);
#: difformer's signed shift 4: its score term moves each slice by >= 3e-4 at N = 300, while a
#: one-node graph whose key got the minus sign keeps its denominator 1 + q~.k~ >= ~1/17 (at 32 it
#: cancels to ~1e-3 and float32 loses 1e-4 there: measured 1.2e-4 at N = 1).
SHIFT_SG = 32.0
SHIFT_DIF = 4.0
#: Graph labels skip this value in batches of more than GAP_LABEL graphs (batch_labels).
GAP_LABEL = 2
#: Graphs of the "many-graphs" variants: more than fast.segments.FEW_SEGMENTS, so the fast paths take
#: their "many small" routes (batched layouts, vectorised segment sums) rather than a loop over graphs.
MANY_GRAPHS = FEW_SEGMENTS + 6
#: Size profiles of a batch (graph_sizes): "uneven" (WEIGHTS, a one-node graph, a label gap), "even"
#: (sizes differing by at most one, a one-node graph, a label gap: at N = 300 and MANY_GRAPHS the
#: padded layout of fast.latent.nodeformer) and "equal" (sizes differing by at most one, no one-node
#: graph, no gap: at N = 300 and 75 graphs all of 4 nodes, the equal-size view).
SIZE_PROFILES = ("uneven", "even", "equal")
#: relational-bias: sigmoid(B_BIAS) ~ 0.62 per order.
B_BIAS = 0.5
#: latent_problem's rare=True: q times 2^-60 (a power of two: exact in both dtypes).
RARE_SCALE = 2.0**-60
#: relational-bias's fast routes (latent_problem's route).
ROUTES = ("attention", "parts", "dense")

# ---------------------------------------------------------------------------------- problems


def graph_sizes(n: int, graphs: int, profile: str = "uneven") -> list[int]:
    """Sizes (each >= 1) summing to n: one graph for graphs = 1; otherwise min(graphs, n) graphs in
    proportion WEIGHTS (cycled; profile "even" / "equal": sizes differing by at most one, at least 2
    for "even") and, when
    n > graphs (not for "equal"), one more graph of ONE node at the end (the edge case of a batch: a
    node that attends only to itself, an isolated node of the edge loss)."""
    if profile not in SIZE_PROFILES:
        raise ValueError(f"profile must be one of {SIZE_PROFILES}, got {profile!r}")
    if int(graphs) <= 1 or n == 1:
        return [n]
    if profile != "uneven":  # "even": at least 2 nodes per graph but the lone one (N = 64 differs from "equal")
        lone = profile == "even" and n > graphs
        count = min(int(graphs), (n - lone) // 2 if profile == "even" else n)
        parts = np.array_split(np.arange(n - lone), max(1, count))
        return [len(a) for a in parts] + [1] * lone
    lone = n > graphs
    rest = n - lone
    g = max(1, min(int(graphs), rest))
    weights = np.array([WEIGHTS[i % len(WEIGHTS)] for i in range(g)], dtype=float)
    sizes = np.maximum(1, np.floor(rest * weights / weights.sum()).astype(int))
    sizes[0] += rest - sizes.sum()  # the remainder (or an excess from the max(1, .)) to the largest
    return [int(s) for s in sizes] + [1] * lone


def batch_labels(count: int, gap: bool = True) -> np.ndarray:
    """Graph labels 0, 1, 3, 4, ...: label GAP_LABEL is skipped (an empty graph, which the batch
    vector contract allows) once there are more than GAP_LABEL graphs (gap=False: 0 .. count-1)."""
    labels = np.arange(count, dtype=np.int64)
    return np.where(labels >= GAP_LABEL, labels + 1, labels) if gap and count > GAP_LABEL else labels


def batched_adjacency(family: str, n: int, seed: int, graphs: int,
                      profile: str = "uneven") -> tuple[sp.csr_matrix, np.ndarray]:
    """(block-diagonal adjacency (N, N), sorted batch vector (N,) int64) of the graphs of ``graph_sizes``."""
    sizes = graph_sizes(n, graphs, profile)
    blocks = [graph_adjacency(family, s, seed + 7919 * i) for i, s in enumerate(sizes)]
    adj = blocks[0] if len(blocks) == 1 else sp.block_diag(blocks, format="csr")
    # a gap needs a label left below N (check_batch allocates max label + 1 <= N graphs)
    batch = np.repeat(batch_labels(len(sizes), gap=profile != "equal" and len(sizes) < n), sizes)
    return sp.csr_matrix(adj), batch


def latent_problem(n: int, seed: int, *, batch: tuple[int, ...] = (), graph: str = "grid-2d", graphs: int = 1,
                   profile: str = "uneven", tau: float = TAU, gumbel: bool = False, samples: int = GUMBEL_SAMPLES, b: float = B_BIAS,
                   order: int = 1, normalize: str | None = "sym", shift: float = 0.0,
                   signed_keys: bool = False, rare: bool = False, route: str = "attention") -> Problem:
    """The problem of every latent-graph record (module doc): q, k, v (*batch, N, 32), W (32, 32).

    shift: q and k plus ``shift`` times one fixed unit vector c (SHIFT_SALT); with ``signed_keys``
    each key gets +-shift c (a fixed random sign per key). On random unit rows the score term of
    DIFFormer / SGFormer, q~_u . sum k~ (resp. q~_u . K~^T V), moves the outputs by ~1e-5, below
    float32's 1e-4 tolerance, so equivalence could not see an error in it. SGFormer's constant
    term is N_g v_u, and a common shift makes its score term ~1/N_g of it (1e-3 .. 4e-2 at
    N = 37 .. 300, measured per slice); DIFFormer's constant term is sum v, which a common shift
    only rescales (the score term becomes ~uniform attention again), so its keys take signed
    shifts: q~_u . K~^T V ~ sum_w sign_w v_w / N_g is then no multiple of sum v.

    rare: inputs that send DIFFormer / SGFormer down their rare (materialised) route: q times
    RARE_SCALE = 2^-60 (its norm below float32's window, the folded path's 2^-42) and, in a batch,
    the keys of the second graph all zero (a zero norm: k~ = 0 in both dtypes). route: "attention"
    (nodeformer_attention) or "parts" (relational-bias: kernelized_softmax plus one relational_bias
    call per order of adjacency_orders, the public pieces a user composes) or "dense" (difformer,
    sgformer: the dense twin on fast.frobenius_normalize's q~, k~).
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    adj, batch_index = batched_adjacency(graph, n, seed, graphs, profile)
    sizes = graph_sizes(n, graphs, profile)
    extras: dict[str, Any] = {**graph_extras(adj), "batch_index": batch_index, "graphs": len(sizes),
                              "tau": float(tau), "b": np.full(int(order), float(b)), "order": int(order),
                              "normalize": normalize}
    p = graph_problem(n, seed, adj, tuple(batch), D_LATENT)
    if shift:
        rng = rng_for(seed, SHIFT_SALT)
        c = rng.standard_normal(D_LATENT)
        c *= float(shift) / np.linalg.norm(c)
        signs = rng.choice([-1.0, 1.0], size=(n, 1)) if signed_keys else np.ones((n, 1))
        p = replace(p, q=p.q + c, k=p.k + signs * c)
    if rare:
        k = p.k.copy()
        if len(sizes) > 1:
            k[..., sizes[0]:sizes[0] + sizes[1], :] = 0.0
        p = replace(p, q=p.q * RARE_SCALE, k=k)
    extras["route"], extras["rare"] = route, bool(rare)
    if gumbel:
        u = rng_for(seed, NOISE_SALT).uniform(size=(int(samples), *p.k.shape[:-1]))
        extras["noise"] = -np.log(-np.log(np.clip(u, np.finfo(float).tiny, 1.0 - 2.0**-53)))
    return replace(p, extras={**p.extras, **extras})


def batch_of(p: Problem) -> np.ndarray | None:
    """The batch vector, or None for one graph (the fast paths' plain route)."""
    return None if p.extras["graphs"] == 1 else p.extras["batch_index"]


def _fast_batch(p: Problem, device) -> torch.Tensor | None:
    b = batch_of(p)
    return None if b is None else torch.as_tensor(b, device=device)


def gumbel_draw(p: Problem, generator: torch.Generator) -> Problem:
    """The problem with its projection drawn by fast.gaussian_projection and its Gumbel noise by
    fast.gumbel_noise, both from ``generator`` (reproducibility/<id>)."""
    p = projection_draw(p, generator)
    g = fast.gumbel_noise(tuple(p.extras["noise"].shape), generator=generator, device=generator.device,
                          dtype=torch.float64)
    return replace(p, extras={**p.extras, "noise": g.cpu().numpy()})


def _tensors(p: Problem, device, dtype, requires_grad: bool) -> list[torch.Tensor]:
    out = [torch.as_tensor(a, device=device, dtype=dtype) for a in (p.q, p.k, p.v, p.projection)]
    if requires_grad:
        out[:3] = [t.detach().clone().requires_grad_(True) for t in out[:3]]
    return out


def _graph(p: Problem, device) -> fast.Graph:
    return fast.Graph.from_any(adjacency(p), device=device)


# ---------------------------------------------------------------------------------- fast / reference


def _nodeformer_setup(p: Problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = _tensors(p, device, dtype, requires_grad)
    batch = _fast_batch(p, device)
    tau = p.extras["tau"]
    return lambda: fast.kernelized_softmax(q, k, v, w, tau=tau, batch=batch)


def _nodeformer_ref(p: Problem) -> np.ndarray:
    return ref_nodeformer.kernelized_softmax(p.q, p.k, p.v, p.projection, tau=p.extras["tau"], batch=batch_of(p))


def _gumbel_setup(p: Problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = _tensors(p, device, dtype, requires_grad)
    batch = _fast_batch(p, device)
    # the noise is mask data, not an activation: float32 at least (bfloat16 noise would move
    # g / tau = 4 g by up to ~0.08, an 8% key weight, which no input rounding accounts for)
    noise = torch.as_tensor(p.extras["noise"], device=device, dtype=torch.promote_types(dtype, torch.float32))
    tau = p.extras["tau"]
    return lambda: fast.kernelized_gumbel_softmax(q, k, v, w, tau=tau, noise=noise, training=True, batch=batch)


def _gumbel_ref(p: Problem) -> np.ndarray:
    return ref_nodeformer.kernelized_gumbel_softmax(p.q, p.k, p.v, p.projection, p.extras["noise"],
                                                    tau=p.extras["tau"], batch=batch_of(p))


def _bias(p: Problem, device, dtype) -> torch.Tensor:
    return torch.as_tensor(p.extras["b"], device=device, dtype=dtype)


def _relational_setup(p: Problem, device, dtype, requires_grad: bool = False):
    q, k, v, w = _tensors(p, device, dtype, requires_grad)
    batch, graph, b = _fast_batch(p, device), _graph(p, device), _bias(p, device, dtype)
    e = p.extras
    if e.get("route", "attention") == "parts":
        def parts():
            orders = fast.adjacency_orders(graph, e["order"])
            out = fast.kernelized_softmax(q, k, v, w, tau=e["tau"], batch=batch)
            for r, a_r in enumerate(orders):  # A_r's own pattern at order 1 is A_r
                out = out + fast.relational_bias(v, a_r, b[r], order=1, normalize=e["normalize"], batch=batch)
            return out
        return parts
    return lambda: fast.nodeformer_attention(q, k, v, w, graph=graph, b=b, order=e["order"],
                                             normalize=e["normalize"], tau=e["tau"], gumbel=False, training=False,
                                             batch=batch)


def _relational_ref(p: Problem) -> np.ndarray:
    e = p.extras
    return ref_nodeformer.nodeformer_attention(p.q, p.k, p.v, p.projection, adj=adjacency(p), b=e["b"],
                                               order=e["order"], normalize=e["normalize"], tau=e["tau"],
                                               batch=batch_of(p))


def _edge_setup(p: Problem, device, dtype, requires_grad: bool = False):
    q, k, _, w = _tensors(p, device, dtype, requires_grad)
    batch, graph = _fast_batch(p, device), _graph(p, device)
    tau = p.extras["tau"]
    return lambda: fast.edge_log_likelihood(q, k, w, graph, tau=tau, batch=batch).unsqueeze(-1)


def _edge_ref(p: Problem) -> np.ndarray:
    return ref_nodeformer.edge_log_likelihood(p.q, p.k, p.projection, adjacency(p), tau=p.extras["tau"],
                                              batch=batch_of(p))[..., None]


def _simple_setup(fn, own_value: bool):
    """fn (difformer_attention / sgformer_attention) on the problem; route "dense": the dense twin
    (_simple_dense), whose q~ and k~ are fast.frobenius_normalize's (the public normaliser's check)."""
    def setup(p: Problem, device, dtype, requires_grad: bool = False):
        if p.extras.get("route", "attention") == "dense":
            return _simple_dense(own_value)(p, device, dtype, requires_grad)
        q, k, v, _ = _tensors(p, device, dtype, requires_grad)
        batch = _fast_batch(p, device)
        return lambda: fn(q, k, v, batch=batch)
    return setup


def _simple_ref(fn):
    return lambda p: fn(p.q, p.k, p.v, batch=batch_of(p))


# ---------------------------------------------------------------------------------- dense twins
#
# The O(N^2) torch twins (verify.dense's role for the masked FAVOR+ records): the same function as
# the fast path, with the (N, N) matrices formed explicitly, so that the sweeps time a fair race in
# one framework and each record gets a crossover. The FAVOR+ features are fast.favor_features'
# (stabilised: per-query constants and one per slice for the keys, which cancel in every
# normalisation below); the graph mask is the block-diagonal "same graph" matrix.


def _same_graph(p: Problem, device, dtype) -> torch.Tensor:
    return torch.as_tensor(_packing_dense(p), device=device, dtype=dtype)


def _dense_kernel(p: Problem, device, dtype, requires_grad: bool):
    """(A, v, same): A = phi(q) phi(k)^T (..., N, N) at wu22 Eq. 5's 1/sqrt(tau) scaling, v, and
    the same-graph mask (N, N); A as a closure of the tensors, so that it is timed."""
    q, k, v, w = _tensors(p, device, dtype, requires_grad)
    s = p.extras["tau"] ** -0.5
    same = _same_graph(p, device, dtype)

    def kernel(extra_keys: torch.Tensor | None = None) -> torch.Tensor:
        phi_q, phi_k = fast.favor_features(q * s, k * s, w)
        if extra_keys is not None:
            phi_k = phi_k * extra_keys[..., :, None]
        return (phi_q @ phi_k.transpose(-1, -2)) * same
    return kernel, v, same


def _nodeformer_dense(p: Problem, device, dtype, requires_grad: bool = False):
    kernel, v, _ = _dense_kernel(p, device, dtype, requires_grad)

    def run():
        a = kernel()
        return (a @ v) / a.sum(-1, keepdim=True)
    return run


def _gumbel_dense(p: Problem, device, dtype, requires_grad: bool = False):
    kernel, v, _ = _dense_kernel(p, device, dtype, requires_grad)
    g = torch.as_tensor(p.extras["noise"], device=device, dtype=torch.promote_types(dtype, torch.float32))
    tau = p.extras["tau"]

    def run():
        outs = []
        for gs in g:  # exp(g / tau) per key, less its slice maximum (a constant that cancels)
            scale = torch.exp((gs - gs.amax(-1, keepdim=True)) / tau).to(v.dtype)
            a = kernel(scale)
            outs.append((a @ v) / a.sum(-1, keepdim=True))
        return torch.stack(outs).mean(0)
    return run


def _normalized_orders(p: Problem, device, dtype) -> list[torch.Tensor]:
    """[A~_1, ..., A~_order] dense (N, N): the 0/1 pattern of A^r, D^-1/2 A D^-1/2 under "sym"."""
    a = sp.csr_matrix((adjacency(p) != 0).astype(float))
    out, power = [], a
    for r in range(p.extras["order"]):
        power = power if r == 0 else sp.csr_matrix(power @ a)  # set-up, sparse: not timed
        pattern = torch.as_tensor(power.toarray() > 0, device=device).to(dtype)
        if p.extras["normalize"] == "sym":
            deg = pattern.sum(1)
            inv = torch.where(deg > 0, deg.clamp(min=1) ** -0.5, torch.zeros_like(deg))
            pattern = inv[:, None] * pattern * inv[None, :]
        out.append(pattern)
    return out


def _relational_dense(p: Problem, device, dtype, requires_grad: bool = False):
    kernel, v, _ = _dense_kernel(p, device, dtype, requires_grad)
    orders = _normalized_orders(p, device, dtype)
    gates = torch.sigmoid(_bias(p, device, dtype))

    def run():
        a = kernel()
        out = (a @ v) / a.sum(-1, keepdim=True)
        for gate, ar in zip(gates, orders):
            out = out + gate * (ar @ v)
        return out
    return run


def _edge_dense(p: Problem, device, dtype, requires_grad: bool = False):
    kernel, _, _ = _dense_kernel(p, device, dtype, requires_grad)
    edges = torch.as_tensor(_adjacency_dense(p) != 0, device=device)
    deg = edges.sum(1).clamp(min=1).to(dtype)

    def run():
        a = kernel()
        log_pi = torch.log(a) - torch.log(a.sum(-1, keepdim=True))
        return (torch.where(edges, log_pi, torch.zeros_like(log_pi)).sum(-1) / deg).unsqueeze(-1)
    return run


def _simple_dense(own_value: bool):
    """DIFFormer (own_value False) / SGFormer (True) with the masked score matrix
    M = same (1 + q~ k~^T) formed explicitly, q~ and k~ fast.frobenius_normalize's."""

    def setup(p: Problem, device, dtype, requires_grad: bool = False):
        q, k, v, _ = _tensors(p, device, dtype, requires_grad)
        batch, same = _fast_batch(p, device), _same_graph(p, device, dtype)
        sizes = same.sum(-1, keepdim=True)

        def run():
            qn = fast.frobenius_normalize(q, batch=batch)
            kn = fast.frobenius_normalize(k, batch=batch)
            dots = same * (qn @ kn.transpose(-1, -2))
            den = sizes + dots.sum(-1, keepdim=True)
            num = (sizes * v if own_value else same @ v) + dots @ v
            return num / den
        return run
    return setup


def _packing_dense(p: Problem) -> np.ndarray:
    """The (N, N) mask of the all-pair mechanisms: 1 within a graph, 0 across."""
    b = p.extras["batch_index"]
    return (b[:, None] == b[None, :]).astype(float)


def _packing_fast(p: Problem, device):
    b = batch_of(p)
    return None if b is None else fast.PackingMask(torch.as_tensor(b, device=device))


def _adjacency_dense(p: Problem) -> np.ndarray:
    return adjacency(p).toarray()


def cost_factor_n_plus_e(p: Problem) -> float:
    """(N + |E|) / N (class "N + E"); |E| the stored entries of the adjacency."""
    return (p.n + num_edges(p)) / p.n


# ---------------------------------------------------------------------------------- perf cases

#: perf/<id>: (1, 4, N, 64) inputs, m = 64 (measure.roofline.attention_inputs).
PERF_BATCH, PERF_D, PERF_M = roofline.BATCH, roofline.D, roofline.M


def _perf_case(kind: str):
    def case(mech: Mechanism, n: int, device, seed: int) -> roofline.PerfCase:
        q, k, v, w = roofline.attention_inputs(n, device, seed)
        slices = int(np.prod(PERF_BATCH))
        lin = roofline.linear_attention_flops(n, PERF_D, PERF_M, PERF_D, slices)
        info: dict[str, Any] = {"batch": list(PERF_BATCH)}
        if kind == "nodeformer":
            run, flops = (lambda: fast.kernelized_softmax(q, k, v, w)), lin
        elif kind == "gumbel":
            gen = torch.Generator(device=device).manual_seed(seed)
            noise = fast.gumbel_noise((GUMBEL_SAMPLES, *k.shape[:-1]), generator=gen, device=device)
            run = lambda: fast.kernelized_gumbel_softmax(q, k, v, w, tau=TAU_GUMBEL, noise=noise)  # noqa: E731
            # the features of q and k once (the noise is added to the key exponents afterwards),
            # then per sample: the noise (N m adds), both products and normalisers, the division,
            # and the mean over the K outputs (N d per sample)
            per_sample = n * PERF_M + 4.0 * n * PERF_M * PERF_D + 4.0 * n * PERF_M + 2.0 * n * PERF_D
            flops = slices * (2 * roofline.feature_map_flops(n, PERF_D, PERF_M) + GUMBEL_SAMPLES * per_sample)
            info["samples"] = GUMBEL_SAMPLES
        elif kind in ("relational", "edge"):
            p = mech.problem(n, seed)
            graph, e = _graph(p, device), num_edges(p)
            info["edges"] = e
            if kind == "relational":
                b = torch.full((1,), B_BIAS, device=device)
                run = lambda: fast.nodeformer_attention(q, k, v, w, graph=graph, b=b, gumbel=False,  # noqa: E731
                                                        training=False, tau=TAU)
                flops = lin + slices * 2.0 * e * PERF_D
            else:
                run = lambda: fast.edge_log_likelihood(q, k, w, graph, tau=TAU)  # noqa: E731
                # features, the key sums (N m), one LSE over m per edge (~3 m) and per node
                flops = slices * (2 * roofline.feature_map_flops(n, PERF_D, PERF_M) + n * PERF_M
                                  + 3.0 * (e + n) * PERF_M)
        else:  # difformer / sgformer: two norms, K~^T V, K~^T 1, Q~ (.), the division
            fn = fast.difformer_attention if kind == "difformer" else fast.sgformer_attention
            run = lambda: fn(q, k, v)  # noqa: E731
            flops = slices * (4.0 * n * PERF_D + 4.0 * n * PERF_D * PERF_D + 4.0 * n * PERF_D + 2.0 * n * PERF_D)
        shape = (*PERF_BATCH, n) if kind == "edge" else tuple(v.shape)
        what = (f"fast ({mech.id}) forward, (B, H, N, d) = ({PERF_BATCH[0]}, {PERF_BATCH[1]}, {n}, {PERF_D}), "
                f"m = {PERF_M}; useful FLOPs / CPU seconds vs the fp32 matmul rate")
        return roofline.PerfCase(kernel=run, expected_shape=shape, n=n, what=what, flops_useful=float(flops),
                                 flops_executed=None, d=PERF_D, m=PERF_M, info=info)
    return case


def _roofline(kind: str) -> Roofline:
    return Roofline("matmul", _perf_case(kind))


# ---------------------------------------------------------------------------------- records

#: Sweep grids: the graph package's (fast 2^7 .. 2^14 quick, 2^17 full; dense 2^7 .. 2^11 / 2^12).
SIZES = QUICK
#: The batched graph variants are equivalence-only for the all-pair records (the family sets only
#: the graph sizes there), swept on the shorter grid for the two that read edges.
FAMILY_SIZES = dict(quick_fast_sizes=tuple(2**p for p in range(7, 14)), fast_sizes=tuple(2**p for p in range(7, 16)))


def batched_variants(default: str, *, reads_edges: bool) -> tuple[Variant, ...]:
    """One graph of ``default`` first; then batches of GRAPHS graphs plus a one-node graph, labels
    with a gap (``graph_sizes``, ``batch_labels``): of every family for the records that read the
    edges (relational-bias, edge-loss), one batch for the all-pair records, which read no edge
    (the family would only set the sizes, six copies of one problem)."""
    one = Variant(default, f"one graph: {GRAPH_TITLES[default]}", params={"graph": default})
    sizes = f"{GRAPHS} graphs (~N/2, N/3, N/6) and a one-node graph, labels 0, 1, 3, 4"
    if not reads_edges:
        batches = (Variant("batch", f"{sizes} (graphs never mix)", params={"graph": default, "graphs": GRAPHS},
                           sweep=False),)
    else:
        batches = tuple(Variant(f"{g}-batch", f"{sizes}, each a {GRAPH_TITLES[g]}",
                                params={"graph": g, "graphs": GRAPHS}, sweep=g != "karate",
                                **(FAMILY_SIZES if g != "karate" else {}))
                        for g in GRAPH_FAMILIES)
    return (one, *batches, *many_graph_variants(default, every=not reads_edges))


def rare_variants(default: str) -> tuple[Variant, ...]:
    """DIFFormer's and SGFormer's rare route (the materialised q~, k~ of fast.latent.simple_attention, its
    robust norms): "rare-path" one graph with q 2^-60 (float32 leaves the folded path's window; float64
    keeps it), "rare-path-batch" a batch whose second graph has all-zero keys (both dtypes)."""
    return (Variant("rare-path", "one graph, q times 2^-60: float32 takes the rare (materialised) route",
                    params={"graph": default, "rare": True}, sweep=False),
            Variant("rare-path-batch", f"{GRAPHS} graphs and a one-node graph, q times 2^-60, the second graph's "
                    "keys zero: the rare route in both dtypes", params={"graph": default, "graphs": GRAPHS,
                                                                       "rare": True}, sweep=False))


def normalize_variants(default: str) -> tuple[Variant, ...]:
    """fast.frobenius_normalize, the public normaliser, through the dense twin (route "dense"): its
    folded route per graph ("frobenius-normalize-batch"), its robust route on one graph in float32
    ("frobenius-normalize": q 2^-60) and on a batch with a zero graph ("frobenius-normalize-rare")."""
    sizes = f"{GRAPHS} graphs and a one-node graph"
    return (Variant("frobenius-normalize", "one graph, q times 2^-60: the dense scores on frobenius_normalize's q~, "
                    "k~ (its robust route in float32)", params={"graph": default, "rare": True, "route": "dense"},
                    sweep=False),
            Variant("frobenius-normalize-batch", f"{sizes}: the dense scores on frobenius_normalize's per-graph q~, k~",
                    params={"graph": default, "graphs": GRAPHS, "route": "dense"}, sweep=False),
            Variant("frobenius-normalize-rare", f"{sizes}, q times 2^-60, the second graph's keys zero: "
                    "frobenius_normalize's robust route per graph", sweep=False,
                    params={"graph": default, "graphs": GRAPHS, "rare": True, "route": "dense"}))


def many_graph_variants(default: str, every: bool = True) -> tuple[Variant, ...]:
    """Equivalence-only variants past the few/many dispatch (fast.segments.few_segments): MANY_GRAPHS
    graphs of sizes differing by at most one plus a one-node graph and a label gap ("many-graphs":
    at N = 300 fast.latent.nodeformer's padded layout, the simple attention's vectorised path), 75
    graphs of one size ("many-equal": at N = 300 the equal-size view), and the gradient of the one-graph
    problem and of the many-graph batch ("backward", "many-graphs-backward"; at N = 37 the batch has
    19 graphs, the loop over slices). every=False (the records that read edges, whose all-pair part is
    kernelized_softmax's, run by the nodeformer record): "many-graphs", "many-equal" and "backward"."""
    many = {"graph": default, "graphs": MANY_GRAPHS, "profile": "even"}
    out = (Variant("many-graphs", f"{MANY_GRAPHS} graphs of near-equal size, a one-node graph and a label gap",
                   params=many, sweep=False),
           Variant("many-equal", "75 graphs of one size (4 nodes at N = 300), labels 0 .. 74",
                   params={"graph": default, "graphs": 75, "profile": "equal"}, sweep=False),
           backward_variant(title="one graph, q, k, v leaves requiring grad: gradient vs the reference's"))
    if not every:
        return out
    return (*out, backward_variant("many-graphs-backward", f"{MANY_GRAPHS} graphs (many-graphs): gradient vs the "
                                   "reference's", **many))


def _problem(**fixed):
    def make(n: int, seed: int, **kw) -> Problem:
        return latent_problem(n, seed, **{**fixed, **kw})
    return make


register(Mechanism(
    id="nodeformer", title="NodeFormer kernelized softmax message passing", source="wu22 Eq. 5", complexity="N",
    make_problem=_problem(), reference=_nodeformer_ref, fast_setup=_nodeformer_setup, dense_setup=_nodeformer_dense,
    dense_mask=_packing_dense, variants=batched_variants("grid-2d", reads_edges=False), **SIZES,
    linear=True, fast_mask=_packing_fast, draw=projection_draw, scale=True, scale_train=True,
    roofline=_roofline("nodeformer"),
    notes=f"FAVOR+ of q d^-1/4 / sqrt(tau), tau = {TAU}, m = d = {D_LATENT}; a batch vector keeps graphs apart.",
))
register(Mechanism(
    id="nodeformer-gumbel", title="NodeFormer kernelized Gumbel-softmax (K samples)", source="wu22 Eqs. 6-7, 14-17",
    complexity="N", make_problem=_problem(gumbel=True, tau=TAU_GUMBEL), reference=_gumbel_ref,
    fast_setup=_gumbel_setup, dense_setup=_gumbel_dense, dense_mask=_packing_dense, variants=batched_variants("grid-2d", reads_edges=False),
    **SIZES, exact=True, draw=gumbel_draw, roofline=_roofline("gumbel"),
    notes=(f"tau = {TAU_GUMBEL}, K = {GUMBEL_SAMPLES} samples of Gumbel noise per key node (given: equivalence is "
           "exact on identical noise), the mean of the K normalised outputs."),
))
register(Mechanism(
    id="relational-bias", title="NodeFormer relational bias sigma(b) A v", source="wu22 Eq. 8", complexity="N + E",
    make_problem=_problem(), reference=_relational_ref, fast_setup=_relational_setup, dense_setup=_relational_dense,
    dense_mask=_adjacency_dense,
    variants=(*batched_variants("grid-2d", reads_edges=True),
              Variant("raw", "grid-2d, raw adjacency (Eq. 8 as printed)", params={"normalize": None}, sweep=False),
              Variant("order-2", "grid-2d, orders 1 and 2 (walks of exactly 2 hops), one bias each",
                      params={"order": 2}, sweep=False),
              Variant("parts", "grid-2d batch, orders 1 and 2 by the public pieces: kernelized_softmax + "
                      "relational_bias of each adjacency_orders pattern", sweep=False,
                      params={"order": 2, "route": "parts", "graphs": GRAPHS})),
    **SIZES, cost_factor=cost_factor_n_plus_e, cost_factor_name="(N+E)/N", roofline=_roofline("relational"),
    notes=f"kernelized softmax (tau = {TAU}) + sigmoid(b) D^-1/2 A D^-1/2 v, b = {B_BIAS}.",
))
register(Mechanism(
    id="edge-loss", title="NodeFormer edge-level loss terms (log-space)", source="wu22 Eqs. 10, 12",
    complexity="N + E", make_problem=_problem(), reference=_edge_ref, fast_setup=_edge_setup, dense_setup=_edge_dense,
    dense_mask=_adjacency_dense, variants=batched_variants("grid-2d", reads_edges=True), **SIZES,
    cost_factor=cost_factor_n_plus_e, cost_factor_name="(N+E)/N", roofline=_roofline("edge"), output_columns=1,
    notes=("output: the per-node terms l_u = (1/d_u) sum_{v in N(u)} log pi_uv as (..., N, 1); the loss is "
           "-(1/N) sum_u l_u (fast.edge_loss)."),
))
register(Mechanism(
    id="difformer", title="DIFFormer simple attention", source="the tutorial (DIFFormer)", complexity="N",
    make_problem=_problem(shift=SHIFT_DIF, signed_keys=True), reference=_simple_ref(ref_simple.difformer_attention),
    fast_setup=_simple_setup(fast.difformer_attention, own_value=False), dense_setup=_simple_dense(own_value=False),
    dense_mask=_packing_dense,
    variants=(*batched_variants("grid-2d", reads_edges=False), *rare_variants("grid-2d"),
              *normalize_variants("grid-2d")), **SIZES, roofline=_roofline("difformer"),
    notes="(sum_v v_v + q~ . sum_v k~_v v_v^T) / (N + q~ . sum_w k~_w), Frobenius norms per graph over heads.",
))
register(Mechanism(
    id="sgformer", title="SGFormer simple global attention", source="SGFormer", complexity="N",
    make_problem=_problem(shift=SHIFT_SG), reference=_simple_ref(ref_simple.sgformer_attention),
    fast_setup=_simple_setup(fast.sgformer_attention, own_value=True), dense_setup=_simple_dense(own_value=True),
    dense_mask=_packing_dense,
    variants=(*batched_variants("grid-2d", reads_edges=False), *rare_variants("grid-2d")), **SIZES, scale=True,
    scale_train=True, roofline=_roofline("sgformer"),
    notes="(N v_u + q~ . sum_v k~_v v_v^T) / (N + q~ . sum_w k~_w), Frobenius norms per graph over heads.",
))
