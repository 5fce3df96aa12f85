"""Planted bugs in the graph-kernel and latent-graph routes that verify once missed (issue 24): each
is monkeypatched into fast/, and the verify check that reaches its route must fail on it while the
real code passes. The routes: the transposed products (rmatmul) and the backward of the
asymmetric masks, the "many small graphs" side of fast.segments.few_segments, the nn.Module layers,
and the random draws fast/ makes itself (walks, Gumbel noise).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fast
import fast.latent.layers as fast_layers
import fast.latent.nodeformer as fast_nodeformer
import fast.latent.simple_attention as fast_simple
from fast.masks.diffusion import DiffusionMask
from fast.masks.grf import StabilisedProduct, WalkFeatures
from results.check import Context
from verify.checks import equivalence, layers, sampling
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
