"""sampling/<sampler>: the laws of the random draws fast/ makes itself (issue 24: the graph masks'
walks and NodeFormer's Gumbel noise were checked for reproducibility only, and a biased draw inside
a function that samples on its own reached no check). Statistical, fixed seeds (rng_for / torch
generators seeded from (seed, SALT)), false-failure rate check_alpha(quick) (docs/methods.md),
Bonferroni over every cell of a check.

sampling/walks   fast.walks.sample_walks on WALK_GRAPH (5 nodes, weighted, degrees 1..3) tiled into
                 COPIES disjoint copies (walks of different copies are independent). For every
                 route (CASES: fixed-length, halting with an i_max cap, uniform and weighted
                 neighbour choice, antithetic termination, repelling walks) and every start node i,
                 hop t <= cap and node j, the frequency of {the walk makes >= t hops and stands on j
                 after t} against its exact probability s_t (P^t)_ij (P = D^-1 A for "uniform",
                 D_w^-1 W for "weighted"; s_t = 1 for fixed-length walks, (1 - p_halt)^t for halting
                 ones up to the cap), and the frequency of every length l <= cap against its law
                 (fixed: l = cap; halting: p (1 - p)^l below the cap, (1 - p)^cap at it). Radius:
                 Bernstein (verify.stats.bernstein_radius, indicators: sigma^2 = p (1 - p), bound 1)
                 over n = COPIES x n_walkers independent walkers, or over the COPIES per-copy means
                 where the walkers of a node are coupled (antithetic pairs, repelling groups: the
                 mean of dependent indicators still has variance <= p (1 - p)). Statistic: the
                 largest |frequency - p| / radius (<= 1 passes).
sampling/gumbel  Kolmogorov-Smirnov distances against exact laws, radius from the DKW inequality
                 P(sup |F_n - F| > t) <= 2 exp(-2 n t^2) (Massart's constant): fast.gumbel_noise in
                 float32 and float64 against exp(-exp(-x)); and the noise that kernelized_gumbel_softmax,
                 nodeformer_attention and NodeFormerConv draw THEMSELVES (noise=None, their own
                 generator), read off their outputs: with q = k = 0 every kernel value is equal, so
                 on a graph of two nodes with v = (e_0, e_1) the weight of the second node in sample
                 s is sigmoid(g_s1 - g_s0) ~ Uniform(0, 1) exactly (the difference of two Gumbels is
                 logistic), and with K = 2 samples the output is the mean of two independent
                 uniforms: the triangular law F(x) = 2 x^2 (x <= 1/2), 1 - 2 (1 - x)^2. GUMBEL_DRAWS
                 pairs of nodes per call (a batch of two-node graphs, or one graph with leading dims).
                 A draw shared by the samples, the slices or the graphs, or a biased uniform, moves
                 the law by far more than the radius (about 0.023 at 20,000 draws).
sampling/projection
                 the FAVOR+ projection NodeFormerConv draws itself (redraw_projection, and forward with
                 redraw=True in training): a layer with m = 1 and out_dim = PROJECTION_WIDTH draws one
                 row per call, which is N(0, I_d) for iid and orthogonal features alike (an orthogonal
                 block's rows are dependent, a row's entries are not), so its d entries are iid N(0, 1):
                 KS distance of PROJECTION_DRAWS calls' entries against the normal CDF (DKW radius as
                 above), and of the successive differences (w_(t+1) - w_t) / sqrt 2 of the pooled
                 entries, N(0, 1) only when each call draws afresh and independently (a redraw that
                 keeps the old projection gives 0s). Torch pinned to one thread (small draws).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import scipy.special
import torch

import fast
from fast.latent.layers import NodeFormerConv
from measure.timing import pinned_threads
from results.check import Check, Context, Outcome, judged
from verify.problems import rng_for
from verify.stats import bernstein_radius, check_alpha

#: rng_for(seed, SALT, ...) and torch seeds from it (no other verify module uses 150).
SALT = 150
#: The walk graph: 5 nodes, weighted edges (u, v, w), degrees 2, 2, 3, 2, 1.
WALK_EDGES = ((0, 1, 1.0), (0, 2, 3.0), (1, 2, 1.0), (2, 3, 2.0), (3, 4, 1.0))
WALK_NODES = 5
COPIES = {True: 2000, False: 20000}
#: name -> (sample_walks options, walkers per node, walkers of a node independent)
CASES = {
    "fixed-length-uniform": ({"fixed_length": 3}, 8, True),
    "fixed-length-weighted": ({"fixed_length": 3, "choice": "weighted"}, 8, True),
    "fixed-length-capped": ({"fixed_length": 5, "i_max": 2}, 8, True),
    "halting-weighted-capped": ({"p_halt": 0.3, "i_max": 3, "choice": "weighted"}, 8, True),
    "halting-antithetic": ({"p_halt": 0.5, "i_max": 3, "antithetic": True}, 8, False),
    "halting-repelling": ({"p_halt": 0.5, "i_max": 3, "repelling": True}, 8, False),
}
GUMBEL_DRAWS = {True: 20_000, False: 200_000}
#: sampling/projection: calls per route (each draws PROJECTION_WIDTH entries) and the layer's out_dim.
PROJECTION_DRAWS = {True: 2_500, False: 25_000}
PROJECTION_WIDTH = 8


def walk_graph(copies: int) -> sp.csr_matrix:
    """WALK_GRAPH tiled into ``copies`` disjoint copies (block-diagonal, symmetric, weighted)."""
    u, v, w = (np.array(c) for c in zip(*WALK_EDGES))
    one = sp.coo_matrix((np.r_[w, w], (np.r_[u, v], np.r_[v, u])), shape=(WALK_NODES, WALK_NODES)).tocsr()
    return sp.block_diag([one] * copies, format="csr")


def transition(choice: str) -> np.ndarray:
    """P (5, 5): uniform over the neighbours, or proportional to the edge weights."""
    a = walk_graph(1).toarray()
    if choice == "uniform":
        a = (a != 0).astype(float)
    return a / a.sum(1, keepdims=True)


def walk_law(options: dict) -> tuple[int, np.ndarray, np.ndarray]:
    """(cap, occupancy (cap + 1, 5, 5) = s_t (P^t)_ij, length law (cap + 1,)) of one case's walks."""
    fixed = options.get("fixed_length")
    cap = fixed if fixed is not None else options["i_max"]
    if options.get("i_max") is not None:
        cap = min(cap, options["i_max"])
    p = transition(options.get("choice", "uniform"))
    keep = 1.0 if fixed is not None else 1.0 - options["p_halt"]
    occ = np.stack([keep**t * np.linalg.matrix_power(p, t) for t in range(cap + 1)])
    if fixed is not None:
        lengths = np.zeros(cap + 1)
        lengths[cap] = 1.0
    else:
        ph = options["p_halt"]
        lengths = np.array([ph * (1 - ph) ** l for l in range(cap)] + [(1 - ph) ** cap])
    return cap, occ, lengths


def _walk_frequencies(walks, copies: int, n_walkers: int, cap: int, independent: bool):
    """Per-walker (or per-copy mean) indicators, shaped (samples, 5 starts, ...): occupancy
    (cap + 1, 5) and lengths (cap + 1,) per start, as float arrays."""
    w = walks.to_numpy()
    length, offsets, nodes = (np.asarray(w[k]) for k in ("length", "offsets", "nodes"))
    offsets = offsets[:length.size]  # walk w's nodes are nodes[offsets[w] : offsets[w] + length[w] + 1]
    walk = np.arange(length.size)
    start = walk // n_walkers
    occ = np.zeros((length.size, cap + 1, WALK_NODES))
    for t in range(cap + 1):
        on = length >= t
        occ[walk[on], t, nodes[offsets[on] + t] % WALK_NODES] = 1.0
    lens = np.zeros((length.size, cap + 1))
    lens[walk, np.minimum(length, cap)] = 1.0
    # walks are node-major: (copy, start, walker)
    occ = occ.reshape(copies, WALK_NODES, n_walkers, cap + 1, WALK_NODES)
    lens = lens.reshape(copies, WALK_NODES, n_walkers, cap + 1)
    if independent:
        return (occ.transpose(0, 2, 1, 3, 4).reshape(-1, WALK_NODES, cap + 1, WALK_NODES),
                lens.transpose(0, 2, 1, 3).reshape(-1, WALK_NODES, cap + 1))
    return occ.mean(2), lens.mean(2)


def _walks(ctx: Context, cases=None, sampler=None) -> Outcome:
    cases = CASES if cases is None else cases
    sampler = sampler or fast.sample_walks
    copies = COPIES[ctx.quick]
    alpha = check_alpha(ctx.quick)
    laws = {name: walk_law(opts) for name, (opts, _, _) in cases.items()}
    cells = sum(WALK_NODES * (cap + 1) * (WALK_NODES + 1) for cap, _, _ in laws.values())
    delta = alpha / cells
    graph = fast.as_graph(walk_graph(copies))
    worst, rows, reasons = 0.0, [], []
    for i, (name, (opts, n_walkers, independent)) in enumerate(cases.items()):
        cap, occ_law, len_law = laws[name]
        gen = torch.Generator().manual_seed(int(rng_for(ctx.seed, SALT, i).integers(2**62)))
        walks = sampler(graph, n_walkers, generator=gen, **opts)
        occ, lens = _walk_frequencies(walks, copies, n_walkers, cap, independent)
        n = occ.shape[0]
        case_worst, where = 0.0, ""
        for s in range(WALK_NODES):
            for what, freq, law in (("occupancy", occ[:, s].mean(0), occ_law[:, s, :]),
                                    ("length", lens[:, s].mean(0), len_law)):
                radius = np.vectorize(lambda p: bernstein_radius(math.sqrt(p * (1 - p)), 1.0, n, delta))(law)
                ratio = np.abs(freq - law) / radius
                k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
                if ratio[k] > case_worst:
                    case_worst = float(ratio[k])
                    where = f"start {s}, {what} {tuple(int(x) for x in k)}: {freq[k]:.4g} vs {law[k]:.4g}"
        rows.append({"case": name, "options": {k: v for k, v in opts.items()}, "walkers": n_walkers,
                     "samples": n, "independent_walkers": independent, "worst_ratio": case_worst, "worst": where})
        if not case_worst <= 1.0:
            reasons.append(f"{name}: frequency off its exact law by {case_worst:.3g} radii at {where}")
        worst = max(worst, case_worst)
    return judged(not reasons, worst, reasons, cases=rows, alpha=alpha, delta_per_cell=delta, cells=cells,
                  copies=copies, statistic="max over routes, starts, hops and nodes of |frequency - exact "
                                           "probability| / Bernstein radius")


# ------------------------------------------------------------------------------ Gumbel


def gumbel_cdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.exp(-x))


def mean_of_two_uniforms_cdf(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return np.where(x <= 0.5, 2 * x**2, 1 - 2 * (1 - x) ** 2)


def ks_distance(sample: np.ndarray, cdf) -> float:
    """sup_x |F_n(x) - F(x)| of a 1-D sample against a continuous CDF."""
    x = np.sort(np.asarray(sample, dtype=np.float64).ravel())
    f = cdf(x)
    n = x.size
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def dkw_radius(n: int, delta: float) -> float:
    """t with P(sup |F_n - F| > t) <= delta (DKW with Massart's constant): sqrt(ln(2/delta) / (2n))."""
    return math.sqrt(math.log(2.0 / delta) / (2.0 * n))


def _pairs(draws: int):
    """Inputs of a batch of ``draws`` two-node graphs: q = k = 0 (N, 1), v = (e_0, e_1) per graph
    (N, 2), projection (1, 1), batch (N,)."""
    n = 2 * draws
    q = torch.zeros(n, 1, dtype=torch.float64)
    v = torch.eye(2, dtype=torch.float64).repeat(draws, 1)
    batch = torch.arange(draws).repeat_interleave(2)
    return q, v, torch.ones(1, 1, dtype=torch.float64), batch


def _zeroed_layer(gen: torch.Generator) -> NodeFormerConv:
    """NodeFormerConv(2, 2), one head, m = 1, K = 2, tau = 1, no relational bias, with W_q = W_k = 0
    and W_v = W_o = I (no biases): out = z, q = k = 0, v = x."""
    layer = NodeFormerConv(2, 2, heads=1, m=1, tau=1.0, samples=2, relational_bias=False, generator=gen).double()
    with torch.no_grad():
        for lin, weight in ((layer.w_q, 0.0), (layer.w_k, 0.0), (layer.w_v, 1.0), (layer.w_o, 1.0)):
            lin.weight.copy_(weight * torch.eye(2, dtype=torch.float64))
            lin.bias.zero_()
    return layer.train()


def gumbel_routes(draws: int) -> dict:
    """name -> (draw(generator) -> 1-D sample, its exact CDF)."""
    q, v, w, batch = _pairs(draws)
    lead_q = torch.zeros(draws, 2, 1, dtype=torch.float64)
    lead_v = torch.eye(2, dtype=torch.float64).expand(draws, 2, 2)
    two = mean_of_two_uniforms_cdf
    return {
        "gumbel_noise/float32": (lambda g: fast.gumbel_noise((draws,), generator=g), gumbel_cdf),
        "gumbel_noise/float64": (lambda g: fast.gumbel_noise((draws,), generator=g, dtype=torch.float64), gumbel_cdf),
        "kernelized_gumbel_softmax/batch": (
            lambda g: fast.kernelized_gumbel_softmax(q, q, v, w, tau=1.0, samples=2, generator=g, batch=batch)[0::2, 1],
            two),
        "kernelized_gumbel_softmax/leading-dims": (
            lambda g: fast.kernelized_gumbel_softmax(lead_q, lead_q, lead_v, w, tau=1.0, samples=2, generator=g)[:, 0, 1],
            two),
        "nodeformer_attention/batch": (
            lambda g: fast.nodeformer_attention(q, q, v, w, tau=1.0, samples=2, generator=g, batch=batch)[0::2, 1], two),
        "NodeFormerConv/batch": (lambda g: _zeroed_layer(g)(v, batch=batch)[0][0::2, 1], two),
    }


def _gumbel(ctx: Context, routes=None) -> Outcome:
    draws = GUMBEL_DRAWS[ctx.quick]
    routes = gumbel_routes(draws) if routes is None else routes
    alpha = check_alpha(ctx.quick)
    delta = alpha / len(routes)
    radius = dkw_radius(draws, delta)
    rows, reasons, worst = [], [], 0.0
    for i, (name, (draw, cdf)) in enumerate(routes.items()):
        gen = torch.Generator().manual_seed(int(rng_for(ctx.seed, SALT, 100 + i).integers(2**62)))
        with torch.no_grad():
            sample = draw(gen).detach().double().cpu().numpy()
        dist = ks_distance(sample, cdf)
        rows.append({"route": name, "ks_distance": dist, "radius": radius, "draws": int(sample.size)})
        if not dist <= radius:
            reasons.append(f"{name}: Kolmogorov-Smirnov distance {dist:.3g} to its exact law > DKW radius {radius:.3g}")
        worst = max(worst, dist / radius)
    return judged(not reasons, worst, reasons, routes=rows, alpha=alpha, delta_per_route=delta, draws=draws,
                  statistic="max over routes of the KS distance to the exact law / the DKW radius")


def normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + scipy.special.erf(np.asarray(x) / math.sqrt(2.0)))


def _projection_layer(gen: torch.Generator, orthogonal: bool, redraw: bool = False) -> NodeFormerConv:
    """NodeFormerConv(1, PROJECTION_WIDTH), one head, m = 1 (one row per draw), in training mode."""
    return NodeFormerConv(1, PROJECTION_WIDTH, heads=1, m=1, samples=1, relational_bias=False, gumbel=False,
                          orthogonal=orthogonal, redraw=redraw, generator=gen).double().train()


def projection_routes(draws: int) -> dict:
    """name -> draw(generator) -> (draws, PROJECTION_WIDTH) array of the successive projections."""
    def redraws(orthogonal: bool):
        def draw(gen):
            layer = _projection_layer(gen, orthogonal)
            out = []
            for _ in range(draws):
                layer.redraw_projection()
                out.append(layer.projection[0].clone())
            return torch.stack(out)
        return draw

    def forwards(gen):
        layer = _projection_layer(gen, orthogonal=True, redraw=True)
        x = torch.zeros(2, 1, dtype=torch.float64)
        out = []
        for _ in range(draws):
            layer(x)
            out.append(layer.projection[0].clone())
        return torch.stack(out)

    return {"redraw_projection/iid": redraws(False), "redraw_projection/orthogonal": redraws(True),
            "forward(redraw=True)/orthogonal": forwards}


def _projection(ctx: Context, routes=None) -> Outcome:
    draws = PROJECTION_DRAWS[ctx.quick]
    routes = projection_routes(draws) if routes is None else routes
    alpha = check_alpha(ctx.quick)
    delta = alpha / (2 * len(routes))  # two laws per route
    rows, reasons, worst = [], [], 0.0
    with pinned_threads(1):
        for i, (name, draw) in enumerate(routes.items()):
            gen = torch.Generator().manual_seed(int(rng_for(ctx.seed, SALT, 200 + i).integers(2**62)))
            with torch.no_grad():
                w = draw(gen).detach().double().cpu().numpy()
            laws = (("entries", w.ravel()), ("successive differences", (w[1:] - w[:-1]).ravel() / math.sqrt(2)))
            for law, sample in laws:
                radius = dkw_radius(sample.size, delta)
                dist = ks_distance(sample, normal_cdf)
                rows.append({"route": name, "law": law, "ks_distance": dist, "radius": radius,
                             "draws": int(sample.size)})
                if not dist <= radius:
                    reasons.append(f"{name}: the {law} are not N(0, 1): Kolmogorov-Smirnov distance {dist:.3g} > DKW "
                                   f"radius {radius:.3g}")
                worst = max(worst, dist / radius)
    return judged(not reasons, worst, reasons, routes=rows, alpha=alpha, delta_per_law=delta, draws=draws,
                  statistic="max over routes and laws of the KS distance to N(0, 1) / the DKW radius")


def checks() -> list[Check]:
    return [
        Check("sampling/walks", "fast.sample_walks' hops and lengths follow their exact laws on every route",
              "choromanski22 Sec. 4.2; reid25 Eq. 10", "statistical", run=_walks, threshold=1.0, compare="<=",
              unit="ratio"),
        Check("sampling/gumbel", "Gumbel noise, drawn alone or inside the NodeFormer functions and layer, follows "
              "its law", "wu22 Eqs. 6-7", "statistical", run=_gumbel, threshold=1.0, compare="<=", unit="ratio"),
        Check("sampling/projection", "NodeFormerConv's own FAVOR+ projections (redraw_projection, forward with "
              "redraw) are fresh N(0, I) rows", "Performer Lemma 1; wu22 Eq. 4", "statistical", run=_projection,
              threshold=1.0, compare="<=", unit="ratio"),
    ]
