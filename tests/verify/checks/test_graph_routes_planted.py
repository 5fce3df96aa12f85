"""Planted bugs in the graph-kernel and latent-graph routes that verify once missed (issue 24): each
is monkeypatched into fast/, and the verify check that reaches its route must fail on it while the
real code passes. The routes: the transposed products (rmatmul) and the backward of the
asymmetric masks, the "many small graphs" side of fast.segments.few_segments, the nn.Module layers,
the random draws fast/ makes itself (walks, Gumbel noise, NodeFormerConv's projections), DIFFormer's / SGFormer's rare (materialised)
route and fast.frobenius_normalize, the public relational_bias and adjacency_orders, fast.as_graph's
input forms and Graph.to_scipy, fast.masks.power_series' coefficient builders, DiffusionMask's
exact per-key route, and the redo of overflowed sums (fast.scaling) in each of its callers
(numerics/value-overflow).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import fast
import fast.attention as fast_attention
import fast.graphs as fast_graphs
import fast.latent.layers as fast_layers
import fast.latent.nodeformer as fast_nodeformer
import fast.latent.simple_attention as fast_simple
import fast.masks.diffusion as fast_diffusion
import fast.masks.power_series as fast_power_series
import fast.operator as fast_operator
import fast.scaling
from fast.masks.diffusion import DiffusionMask
from fast.masks.grf import StabilisedProduct, WalkFeatures
from results.check import Context
from verify.checks import equivalence, layers, numerics, sampling
from verify.mechanisms import get


def _equivalence(mech_id: str, variant: str):
    mech = get(mech_id)
    return equivalence.check_for(dataclasses.replace(mech, variants=(mech.variant(variant),)))


def _check(family, check_id: str):
    return next(c for c in family.checks() if c.id == check_id)


# ------------------------------------------------------------------------------ the planted copies


def _rmatmul_without_transpose(self, x):
    """WalkFeatures.rmatmul = G x instead of G^T x (a wrong transpose)."""
    return self.matmul(x)


def _stabilised_rmatmat_without_transpose(self, x):
    """StabilisedProduct._rmatmat with the query side applied untransposed: M'^T x = K' (Q' x)."""
    y = self.q_side.product(self._flat(x), transpose=False)  # BUG: Q'^T
    if self.k_side is not None:
        y = self.k_side.product(y)
    return y.view(x.shape)


def _diffusion_rmatmat_is_matmat(self, x):
    """DiffusionMask._rmatmat = exp(-lam T) x: wrong for the asymmetric kind L D^-1."""
    return self._matmat(x)


_PAD = fast_nodeformer._Layout.pad


def _pad_with_ones(self, x, fill=0.0):
    """_Layout.pad filling the padded rows with 1 instead of 0: in the padded layout (many graphs of
    near-equal size) the slots past a graph's last node then act as keys of value 1."""
    return _PAD(self, x, 1.0 if fill == 0.0 else fill)  # BUG: the fill of the attention's rows


_FOLDED_MANY = fast_simple._folded_many


def _folded_many_without_constant(qw, kw, vw, bi, joint, own_value):
    """fast.latent.simple_attention._folded_many with the constant term (sum v, or N_g v_u) dropped from
    the numerator (a dropped term on the "many small graphs" side only)."""
    d_qk, d = qw.shape[-1], vw.shape[-1]
    ssq, ssk = fast_simple._sumsq(qw, bi, joint), fast_simple._sumsq(kw, bi, joint)
    empty = fast_simple._empty_graphs(bi, ssq)
    scale = (torch.rsqrt(ssq + empty) * torch.rsqrt(ssk + empty)).unsqueeze(-1)
    state = bi.segment_outer(kw, vw) * scale
    ksum = bi.segment_sum(kw).unsqueeze(-1) * scale
    res = bi.apply_state(qw, torch.cat([state, ksum], dim=-1))
    counts = bi.gather(bi.sizes.to(qw.dtype).unsqueeze(-1))
    num, den = res[..., :d], res[..., d:] + counts  # BUG: + const dropped
    return num / den, torch.ones((), dtype=torch.bool)


def _heads_wrong_split(t, heads):
    """fast.latent.layers._heads splitting (N, H d) as (H, N, d) by a plain reshape (the rows mixed)."""
    return t.reshape(heads, t.shape[0], -1)  # BUG: should be reshape(N, H, d).transpose(0, 1)


def _qkv_keys_from_queries(self, x):
    """NodeFormerConv._qkv with the keys projected by W_q (a wiring bug)."""
    q = fast_layers._heads(self.w_q(x), self.heads)
    return q, q, fast_layers._heads(self.w_v(x), self.heads)


_GUMBEL = fast_nodeformer.gumbel_noise


def _gumbel_shared_by_samples(shape, **kw):
    """gumbel_noise drawing one sample and repeating it K times (the samples not independent)."""
    return _GUMBEL(tuple(shape[1:]), **kw).expand(*shape).contiguous()


def _gumbel_missing_log(shape, **kw):
    """gumbel_noise returning -log(U) (exponential noise: the outer log forgotten) instead of
    -log(-log U). (A biased uniform such as U^2 would only shift every g by -log 2, which no
    softmax can see; this changes the law of the differences: Laplace, not logistic.)"""
    return torch.exp(-_GUMBEL(shape, **kw))  # -log U = exp(-g) for g = -log(-log U)


_SAMPLE_WALKS = fast.sample_walks


def _walks_one_hop_short(graph, n_walkers, **kw):
    """sample_walks whose fixed-length walks make one hop fewer than asked (an off-by-one)."""
    if kw.get("fixed_length"):
        kw = {**kw, "fixed_length": kw["fixed_length"] - 1}
    return _SAMPLE_WALKS(graph, n_walkers, **kw)


def _walks_ignore_weights(graph, n_walkers, **kw):
    """sample_walks treating choice="weighted" as uniform."""
    return _SAMPLE_WALKS(graph, n_walkers, **{**kw, "choice": "uniform"})


def _walks_halt_too_often(graph, n_walkers, **kw):
    """sample_walks halting with probability 1.2 p_halt (a biased draw)."""
    if kw.get("p_halt") is not None:
        kw = {**kw, "p_halt": min(0.95, 1.2 * kw["p_halt"])}
    return _SAMPLE_WALKS(graph, n_walkers, **kw)


_NORMALIZE_ROBUST = fast_simple._normalize_robust


def _normalize_robust_l1(x, bi, joint):
    """_normalize_robust with the rescaled sums of squares taken as sums of |y| (an L1 norm), the
    materialised (rare) route of DIFFormer / SGFormer only."""
    y = _NORMALIZE_ROBUST(x, bi, joint)  # y = x / ||x||_F per graph: turn it into x / ||x||_1
    l2 = fast_simple._per_graph(fast_simple._node_reduce(y * y, joint), bi)  # 1 (0 for a zero graph)
    l1 = fast_simple._per_graph(fast_simple._node_reduce(y.abs(), joint), bi)
    ratio = torch.where(l1 > 0, l2.sqrt() / torch.where(l1 > 0, l1, torch.ones_like(l1)), torch.ones_like(l1))
    return y * fast_simple._to_nodes(ratio, bi)


_NORMALIZE_PLAIN = fast_simple._normalize_plain


def _normalize_plain_batch_ignored(x, bi, joint):
    """_normalize_plain (frobenius_normalize's common route) with one norm over all graphs of the batch."""
    out, sumsq = _NORMALIZE_PLAIN(x, None, joint)  # BUG: every graph divided by the whole batch's norm
    return out, fast_simple._sumsq(x, bi, joint)


_MATERIALISED = fast_simple._materialised


def _materialised_one_graph_without_constant(qw, kw, vw, bi, joint, own_value):
    """_materialised with the constant term (sum v, or N v_u) dropped for one graph (bi None)."""
    if bi is not None:
        return _MATERIALISED(qw, kw, vw, bi, joint, own_value)
    n = qw.shape[-2]
    qn, kn = fast_simple._normalize_robust(qw, None, joint), fast_simple._normalize_robust(kw, None, joint)
    num = qn @ (kn.transpose(-1, -2) @ vw)  # BUG: + const dropped
    den = qn @ kn.sum(-2, keepdim=True).transpose(-1, -2) + n
    floor = fast_simple._floor(torch.full((1, 1), float(n), dtype=qw.dtype, device=qw.device), qw.shape[-1], qw.dtype)
    return num / den, den, floor


_RELATIONAL_BIAS = fast.relational_bias


def _relational_bias_ignores_normalize(v, graph, b, **kw):
    """fast.relational_bias applying the raw adjacency whatever ``normalize`` says."""
    return _RELATIONAL_BIAS(v, graph, b, **{**kw, "normalize": None})


_ADJACENCY_ORDERS = fast.adjacency_orders


def _adjacency_orders_not_powered(graph, order, **kw):
    """fast.adjacency_orders returning A_1 for every order (the products never taken)."""
    return _ADJACENCY_ORDERS(graph, 1, **kw) * order


def _attend_exact_is_optimistic(self, phi_q, phi_k, v, key_log_scale):
    """DiffusionMask's exact route replaced by the optimistic one (one constant per slice): the route
    that refused isolated nodes' rows at std 8 in float32."""
    return self.attend_optimistic(phi_q, phi_k, v, key_log_scale)[0]


def _times_pow2_twice(x, e):
    """fast.scaling.times_pow2 with the power one too high (x 2^(e + 1)): a redo that multiplies back
    wrongly (or rescales v wrongly)."""
    return fast.scaling.times_pow2(x, e + 1)


def _diffusion_alpha_wrong_factorial(beta, k_max):
    """fast.masks.power_series.diffusion_alpha with (k + 1)! for k! (another shape, not a constant factor,
    which normalised attention could not see)."""
    k = torch.arange(k_max + 1, dtype=torch.float64)
    return math.exp(-beta) * beta**k / torch.exp(torch.lgamma(k + 2.0))


def _regularised_laplacian_alpha_wrong_ratio(sigma2, k_max, graph=None):
    """regularised_laplacian_alpha with the ratio 1 / (1 + sigma2) for sigma2 / (1 + sigma2)."""
    k = torch.arange(k_max + 1, dtype=torch.float64)
    return (1.0 + sigma2) ** -(k + 1)


_DECONVOLVE = fast_power_series.deconvolve


def _deconvolve_wrong_terms(alpha):
    """deconvolve whose f_k come out divided by sqrt(k + 1) (a wrong recursion past f_0)."""
    f = _DECONVOLVE(alpha)
    return f * torch.arange(1, f.shape[0] + 1, dtype=f.dtype) ** -0.5  # BUG: f_k / sqrt(k + 1)


_CONVOLVE = fast_power_series.convolve


def _convolve_squares_only(f, k_max=None):
    """convolve keeping only the terms f_p f_q with p = q (the cross terms dropped)."""
    alpha = torch.zeros(2 * f.shape[0] - 1, dtype=f.dtype)
    alpha[0::2] = f * f
    return alpha[:k_max + 1] if k_max is not None else alpha


def _redraw_keeps_projection(self):
    """NodeFormerConv.redraw_projection drawing nothing (the old projection kept)."""


_GAUSSIAN_PROJECTION = fast_layers.gaussian_projection


def _orthogonal_rows_not_rescaled(m, d, *, orthogonal=True, generator=None, **kw):
    """gaussian_projection (as the layers call it) leaving orthogonal rows at unit length (the chi(d)
    lengths forgotten): each entry ~ N(0, 1/d), not N(0, 1)."""
    w = _GAUSSIAN_PROJECTION(m, d, orthogonal=orthogonal, generator=generator, **kw)
    return w / w.norm(dim=-1, keepdim=True) if orthogonal else w


_AS_WEIGHT_TENSOR = fast_graphs._as_weight_tensor


def _edge_weights_dropped(weight, name, device):
    """fast.graphs' edge_weight conversion returning ones (an edge_index's weights dropped)."""
    return torch.ones_like(_AS_WEIGHT_TENSOR(weight, name, device))


_TO_SCIPY = fast_graphs.Graph.to_scipy


def _to_scipy_pattern_only(self):
    """Graph.to_scipy exporting the sparsity pattern with unit weights (the weights dropped)."""
    a = _TO_SCIPY(self)
    a.data[:] = 1.0
    return a


_CANONICAL = fast_graphs._canonical


def _symmetrize_by_mean(rows, cols, w, n, symmetrize, name):
    """fast.graphs._canonical taking (W + W^T) / 2 for max(W, W^T) when asked to symmetrize (halves an
    edge given in one direction only)."""
    if not symmetrize:
        return _CANONICAL(rows, cols, w, n, symmetrize, name)
    return _CANONICAL(torch.cat([rows, cols]), torch.cat([cols, rows]), torch.cat([w, w]) / 2, n, False, name)


def _overflow(*ids: str):
    return lambda: numerics.value_overflow_check(ids=ids)


#: name -> (check factory, [(owner, attribute, planted)])
PLANTED = {
    "grf-asym-rmatmul-not-transposed": (
        lambda: _equivalence("grf-asym", "backward"), [(WalkFeatures, "rmatmul", _rmatmul_without_transpose)]),
    "grf-asym-backward-product-not-transposed": (
        lambda: _equivalence("grf-asym", "backward"),
        [(StabilisedProduct, "_rmatmat", _stabilised_rmatmat_without_transpose)]),
    "gdk-random-walk-rmatmul-is-matmul": (
        lambda: _equivalence("gdk", "backward"), [(DiffusionMask, "_rmatmat", _diffusion_rmatmat_is_matmat)]),
    "nodeformer-padded-layout-pads-with-ones": (
        lambda: _equivalence("nodeformer", "many-graphs"), [(fast_nodeformer._Layout, "pad", _pad_with_ones)]),
    "difformer-many-graphs-wrong-constant": (
        lambda: _equivalence("difformer", "many-graphs"),
        [(fast_simple, "_folded_many", _folded_many_without_constant)]),
    "layers-heads-split-wrong": (
        lambda: _check(layers, "layers/difformer"), [(fast_layers, "_heads", _heads_wrong_split)]),
    "nodeformer-conv-keys-from-queries": (
        lambda: _check(layers, "layers/nodeformer-conv"),
        [(fast_layers.NodeFormerConv, "_qkv", _qkv_keys_from_queries)]),
    "gumbel-shared-by-samples": (
        lambda: _check(sampling, "sampling/gumbel"), [(fast_nodeformer, "gumbel_noise", _gumbel_shared_by_samples)]),
    "gumbel-missing-log": (
        lambda: _check(sampling, "sampling/gumbel"), [(fast_nodeformer, "gumbel_noise", _gumbel_missing_log)]),
    "walks-one-hop-short": (
        lambda: _check(sampling, "sampling/walks"), [(fast, "sample_walks", _walks_one_hop_short)]),
    "walks-ignore-weights": (
        lambda: _check(sampling, "sampling/walks"), [(fast, "sample_walks", _walks_ignore_weights)]),
    "walks-halt-too-often": (
        lambda: _check(sampling, "sampling/walks"), [(fast, "sample_walks", _walks_halt_too_often)]),
    "redraw-keeps-projection": (
        lambda: _check(sampling, "sampling/projection"),
        [(fast_layers.NodeFormerConv, "redraw_projection", _redraw_keeps_projection)]),
    "orthogonal-rows-not-rescaled": (
        lambda: _check(sampling, "sampling/projection"),
        [(fast_layers, "gaussian_projection", _orthogonal_rows_not_rescaled)]),
    # the rare (materialised) route of DIFFormer / SGFormer and the public normaliser
    "simple-attention-robust-norm-l1": (
        lambda: _equivalence("difformer", "rare-path-batch"),
        [(fast_simple, "_normalize_robust", _normalize_robust_l1)]),
    "sgformer-materialised-one-graph-without-constant": (
        lambda: _equivalence("sgformer", "rare-path"),
        [(fast_simple, "_materialised", _materialised_one_graph_without_constant)]),
    "frobenius-normalize-batch-ignored": (
        lambda: _equivalence("difformer", "frobenius-normalize-batch"),
        [(fast_simple, "_normalize_plain", _normalize_plain_batch_ignored)]),
    "frobenius-normalize-robust-l1": (
        lambda: _equivalence("difformer", "frobenius-normalize"),
        [(fast_simple, "_normalize_robust", _normalize_robust_l1)]),
    # the public pieces of NodeFormer's relational bias
    "relational-bias-ignores-normalize": (
        lambda: _equivalence("relational-bias", "parts"),
        [(fast, "relational_bias", _relational_bias_ignores_normalize)]),
    "adjacency-orders-not-powered": (
        lambda: _equivalence("relational-bias", "parts"), [(fast, "adjacency_orders", _adjacency_orders_not_powered)]),
    # the graph input forms of fast.as_graph
    "edge-index-weights-dropped": (
        lambda: _equivalence("gdk", "edge-index"), [(fast_graphs, "_as_weight_tensor", _edge_weights_dropped)]),
    "to-scipy-weights-dropped": (
        lambda: _equivalence("gdk", "to-scipy"), [(fast_graphs.Graph, "to_scipy", _to_scipy_pattern_only)]),
    "symmetrize-by-mean": (
        lambda: _equivalence("gdk", "edge-index-one-way"), [(fast_graphs, "_canonical", _symmetrize_by_mean)]),
    # the public coefficient builders of fast.masks.power_series
    "diffusion-alpha-wrong-factorial": (
        lambda: _equivalence("power-series", "diffusion"),
        [(fast_power_series, "diffusion_alpha", _diffusion_alpha_wrong_factorial)]),
    "regularised-laplacian-alpha-wrong-ratio": (
        lambda: _equivalence("power-series", "regularised-laplacian"),
        [(fast_power_series, "regularised_laplacian_alpha", _regularised_laplacian_alpha_wrong_ratio)]),
    "convolve-squares-only": (
        lambda: _equivalence("power-series", "convolved"), [(fast_power_series, "convolve", _convolve_squares_only)]),
    "deconvolve-wrong-terms": (
        lambda: _equivalence("grf", "deconvolved"), [(fast_power_series, "deconvolve", _deconvolve_wrong_terms)]),
    # DiffusionMask's exact per-key route
    "gdk-exact-route-per-slice": (
        lambda: _equivalence("gdk", "isolated-std8"), [(DiffusionMask, "attend_exact", _attend_exact_is_optimistic)]),
    "gdk-random-walk-exact-route-per-slice": (
        lambda: _equivalence("gdk", "isolated-std8-random-walk"),
        [(DiffusionMask, "attend_exact", _attend_exact_is_optimistic)]),
    # the redo of overflowed sums (fast.scaling) where each caller uses it
    "driver-redo-wrong-power": (_overflow("gdk", "grf"), [(fast_attention, "times_pow2", _times_pow2_twice)]),
    # (of the shipped masks only the FFT products overflow inside where M x does not, at these inputs)
    "operator-matmul-redo-wrong-power": (_overflow("toeplitz-1d"), [(fast_operator, "times_pow2", _times_pow2_twice)]),
    "simple-attention-redo-wrong-power": (_overflow("difformer", "sgformer"),
                                          [(fast_simple, "times_pow2", _times_pow2_twice)]),
    "relational-bias-redo-wrong-power": (_overflow("relational_bias"),
                                         [(fast_nodeformer, "times_pow2", _times_pow2_twice)]),
    "expm-action-redo-wrong-power": (_overflow("expm_action"), [(fast_diffusion, "times_pow2", _times_pow2_twice)]),
    "gumbel-mean-not-shifted": (_overflow("nodeformer-gumbel"),
                                [(fast_nodeformer, "_mean_shift", lambda v, samples: None)]),  # K outputs summed raw
}


@pytest.fixture(scope="module")
def good_results():
    """Each check on the real code, run once (several planted bugs share a check)."""
    return {}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_fails_its_check_and_the_real_code_passes(name, monkeypatch, good_results):
    make, patches = PLANTED[name]
    check = make()
    key = (check.id, check.title)  # equivalence of one variant: the title is the record's, the id too
    if key not in good_results:
        good_results[key] = check.evaluate(Context(quick=True))
    good = good_results[key]
    assert good.status == "pass", good.details["reasons"]
    for owner, attr, planted in patches:
        monkeypatch.setattr(owner, attr, planted)
    bad = check.evaluate(Context(quick=True))
    assert bad.status == "fail", (name, bad.statistic)
    assert bad.details["reasons"]
    assert bad.statistic > bad.threshold


def test_rmatmul_bug_is_named_at_the_rmatmul_product(monkeypatch):
    """The public rmatmul's error is reported under its own key, the gradient's under the gradient."""
    monkeypatch.setattr(WalkFeatures, "rmatmul", _rmatmul_without_transpose)
    bad = _equivalence("grf-asym", "backward").evaluate(Context(quick=True))
    errors = bad.details["variants"]["backward"]["errors"]
    assert errors["float64/N=300/rmatmul"] > 1e-2 and errors["float64/N=300/matmul"] <= equivalence.TOL["float64"]


def test_backward_bug_fails_the_gradient_only(monkeypatch):
    monkeypatch.setattr(StabilisedProduct, "_rmatmat", _stabilised_rmatmat_without_transpose)
    bad = _equivalence("grf-asym", "backward").evaluate(Context(quick=True))
    assert bad.details["float64_max_rel_error"] <= equivalence.TOL["float64"]  # the forward is right
    assert bad.details["worst_component"] == "gradient"
    assert any("gradient of q, k and v" in r for r in bad.details["reasons"])
