"""verify/mechanisms/graph.py: the records gdk, rwgnk, power-series, grf and grf-asym.

The graphs behind the variants are what they claim (karate at N = 34 is the karate club), problems
are deterministic and hold only arrays, reference and fast agree per (batch, head) slice on every
variant (equivalence's own protocols, helpers.py), both sides consume the very walks stored in the
problem, draw re-samples the walks from the generator it is given and from nothing else, the
metrics are what they say, and the mask parameters reach the operators.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
import torch

import reference.walks as ref_walks
from fast.masks.diffusion import DiffusionMask
from fast.masks.grf import GRFAsymMask, GRFMask
from fast.masks.rwgnk import RWGNKMask
from reference.masks import power_series as ref_power_series
from tests.verify.mechanisms.helpers import (
    protocol_held_case,
    protocol_learnable_case,
    protocol_update_case,
    variant_reasons,
)
from verify.mechanisms import get, mechanisms
from verify.mechanisms import graph as M
from verify.problems import rng_for
from verify.registry import COST_FACTOR_CLASSES, EQUIVALENCE_BATCH

IDS = ("gdk", "rwgnk", "power-series", "grf", "grf-asym")
RANDOM = ("rwgnk", "grf", "grf-asym")
DEFAULT = {"gdk": "path", "rwgnk": "path", "power-series": "grid-2d", "grf": "grid-2d", "grf-asym": "path"}
# every graph record ends with "backward" (equivalence-only: gradient, matmul and rmatmul vs the dense mask)
OPTIONS = {"gdk": ["random-walk", "adjacency", "isolated-std8", "isolated-std8-random-walk", "edge-index",
                   "edge-index-one-way", "torch-sparse", "networkx", "to-scipy", "update", "learnable", "backward"],
           "rwgnk": ["alpha-1", "fixed-length", "backward"],
           "power-series": ["diffusion", "regularised-laplacian", "convolved", "update", "learnable", "backward"],
           "grf": ["karate", "shared-ensemble", "antithetic", "repelling", "deconvolved", "update", "learnable",
                   "backward"],
           "grf-asym": ["update", "learnable", "backward"]}
PARAMS = {"gdk": ("lam",), "rwgnk": (), "power-series": ("alpha",), "grf": ("f",), "grf-asym": ("alpha",)}


def _variants(ids=IDS, plain_only: bool = False):
    for mech_id in ids:
        for v in get(mech_id).all_variants:
            if not plain_only or v.protocol == "plain":
                yield mech_id, v.name


# ------------------------------------------------------------------------------------ records


def test_records_follow_positional_in_order():
    ids = [m.id for m in mechanisms()]
    assert [i for i in ids if i in IDS] == list(IDS)
    assert ids.index("gdk") > ids.index("hypercube-gdk")
    assert ids[ids.index("gdk"):ids.index("gdk") + 5] == list(IDS)


def test_record_fields():
    for mech_id in IDS:
        mech = get(mech_id)
        assert mech.linear and mech.fast_mask is not None and mech.roofline is not None
        assert mech.mask_params == PARAMS[mech_id]
        assert (mech.draw is M.walk_draw) == (mech_id in RANDOM)
        assert mech.complexity == ("N + E" if mech_id == "gdk" else "N")
    gdk = get("gdk")
    assert gdk.complexity in COST_FACTOR_CLASSES and gdk.cost_factor_name == "(N+E)/N"
    assert [m.id for m in mechanisms() if m.id in IDS and m.scale] == ["grf"]
    assert get("grf").scale_train


def test_variants_are_the_graph_families_default_first():
    for mech_id in IDS:
        mech = get(mech_id)
        swept = [v.name for v in mech.all_variants if v.sweep]
        assert swept[0] == DEFAULT[mech_id] == mech.default_variant.name
        assert sorted(swept) == sorted(g for g in M.GRAPH_FAMILIES if g != "karate")
        rest = [v.name for v in mech.all_variants if not v.sweep]
        assert rest == (OPTIONS[mech_id] if mech_id == "grf" else ["karate", *OPTIONS[mech_id]])
        for v in mech.all_variants:
            assert v.title
            assert v.protocol == (v.name if v.name in ("update", "learnable", "backward") else "plain")
            if v.name in M.GRAPH_FAMILIES:
                assert dict(v.params) == {"graph": v.name}


# ------------------------------------------------------------------------------------ graphs


def _undirected_unit(a, n):
    assert a.shape == (n, n) and a.format == "csr"
    assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
    assert np.all(a.data == 1.0)


@pytest.mark.parametrize("family", M.GRAPH_FAMILIES)
@pytest.mark.parametrize("n", [1, 2, 9, 37, 300])
def test_every_family_builds_at_any_n(family, n):
    a = M.graph_adjacency(family, n, seed=4)
    _undirected_unit(a, n)
    np.testing.assert_array_equal(a.toarray(), M.graph_adjacency(family, n, seed=4).toarray())


def test_grid_2d_rows_of_width_ceil_sqrt_n():
    a = M.grid_2d(1024)  # the full 32 x 32 grid
    deg = np.asarray(a.sum(1)).ravel()
    assert a.nnz == 2 * 2 * 32 * 31 and sorted(np.bincount(deg.astype(int)))[-3:] == [4, 120, 900]
    b = M.grid_2d(37)  # width 7: 5 full rows and a ragged row of 2
    assert b.nnz == 2 * (5 * 6 + 1 + 4 * 7 + 2)  # horizontal, then vertical edges
    assert b[35, 36] == 1 and b[35, 28] == 1 and b[34, 35] == 0
    assert M.grid_2d(1).nnz == 0


def test_families_have_their_degrees():
    n = 2000
    assert np.all(np.asarray(M.graph_adjacency("regular", n, 0).sum(1)).ravel() == M.REGULAR_DEGREE)
    er = np.asarray(M.graph_adjacency("erdos-renyi", n, 0).sum(1)).ravel()
    assert abs(er.mean() - M.ER_MEAN_DEGREE) < 0.3
    knn = np.asarray(M.graph_adjacency("knn", n, 0).sum(1)).ravel()
    assert knn.min() >= M.KNN_K and knn.mean() < 2 * M.KNN_K
    path = M.graph_adjacency("path", n, 0)
    assert path.nnz == 2 * (n - 1)


def test_karate_at_34_is_the_karate_club():
    a = M.graph_adjacency("karate", 34, seed=9)
    club = nx.to_scipy_sparse_array(nx.karate_club_graph(), nodelist=range(34), weight=None)
    np.testing.assert_array_equal(a.toarray(), (club.toarray() != 0).astype(float))
    assert a.nnz == 2 * 78
    tiled = M.graph_adjacency("karate", 70, seed=0)  # two clubs and the first two nodes of a third
    assert tiled.nnz == 2 * (2 * 78 + 1)
    p = get("gdk").problem(34, 0, "karate")
    np.testing.assert_array_equal(M.adjacency(p).toarray(), a.toarray())


# ------------------------------------------------------------------------------------ problems


def _extras_equal(p1, p2) -> bool:
    return p1.extras.keys() == p2.extras.keys() and all(
        np.array_equal(np.asarray(p1.extras[k]), np.asarray(p2.extras[k])) for k in p1.extras)


@pytest.mark.parametrize("mech_id, variant", list(_variants(plain_only=True)))
def test_problems_are_deterministic_arrays(mech_id, variant):
    mech = get(mech_id)
    p, again = mech.problem(37, 3, variant), mech.problem(37, 3, variant)
    assert _extras_equal(p, again)
    for a in ("q", "k", "v", "projection"):
        np.testing.assert_array_equal(getattr(p, a), getattr(again, a))
    assert all(isinstance(x, (np.ndarray, np.generic, str)) for x in p.extras.values())
    other = mech.problem(37, 4, variant)
    if mech_id in RANDOM:  # another seed, other walks
        assert not np.array_equal(p.extras["walks_nodes"], other.extras["walks_nodes"])
    adj = M.adjacency(p)
    params = dict(mech.variant(variant).params)
    alone = params.get("isolated", 0)  # gdk's isolated-std8: edgeless last nodes
    want = np.zeros((37, 37))
    want[:37 - alone, :37 - alone] = M.graph_adjacency(p_graph(mech, variant), 37 - alone, 3).toarray()
    if params.get("graph_input", "scipy") != "scipy":  # gdk's input forms: random weights on the same pattern
        assert (adj != adj.T).nnz == 0 and np.all((adj.data >= 0.5) & (adj.data <= 2.0))
        adj = (adj != 0).astype(float)
    _undirected_unit(adj.tocsr(), 37)
    np.testing.assert_array_equal(adj.toarray(), want)


def p_graph(mech, variant) -> str:
    return dict(mech.variant(variant).params).get("graph", mech.default_variant.name)


def test_grf_has_reid25_widths_and_the_others_verify_favor_s():
    p = get("grf").problem(37, 0, batch=EQUIVALENCE_BATCH)
    assert p.q.shape == p.k.shape == p.v.shape == (*EQUIVALENCE_BATCH, 37, M.D_GRF) == (2, 2, 37, 8)
    assert p.projection.shape == (8, 8)
    np.testing.assert_allclose(np.linalg.norm(p.q, axis=-1), 1.0)
    for mech_id in ("gdk", "rwgnk", "power-series", "grf-asym"):
        assert get(mech_id).problem(37, 0).q.shape == (37, 16)


def test_mask_parameters_are_the_named_kernels():
    k = np.arange(17)
    fact = np.array([math.factorial(i) for i in k], dtype=float)
    ps, grf, asym = get("power-series").problem(9, 0), get("grf").problem(9, 0), get("grf-asym").problem(9, 0)
    np.testing.assert_allclose(ps.extras["alpha"], 1.0 / fact, rtol=1e-15)
    np.testing.assert_allclose(asym.extras["alpha"], 1.0 / fact, rtol=1e-15)
    np.testing.assert_allclose(grf.extras["f"], 0.5**k / fact, rtol=1e-15)
    # f is the deconvolution of the heat kernel's alpha: sum_p f_p f_(k-p) = alpha_k
    np.testing.assert_allclose(np.convolve(grf.extras["f"], grf.extras["f"])[:17], 1.0 / fact, rtol=1e-13)
    np.testing.assert_allclose(ref_power_series.heat_alpha(1.0, 16), ps.extras["alpha"], rtol=1e-13)
    gdk = get("gdk").problem(9, 0)
    assert float(gdk.extras["lam"]) == 1.0 and str(gdk.extras["kind"]) == "laplacian"


def test_gdk_mask_is_far_from_the_identity():
    p = get("gdk").problem(64, 0)
    m = get("gdk").dense_mask(p)
    off = m - np.diag(np.diag(m))
    assert off.sum(1).min() > 0.3 and np.diag(m).max() < 0.7  # e^-L spreads mass to the neighbours
    assert np.all(m >= -1e-15)


# ------------------------------------------------------------------------------------ walks


@pytest.mark.parametrize("mech_id, variant", list(_variants(RANDOM, plain_only=True)))
def test_walks_are_the_reference_sampler_s_and_both_sides_read_them(mech_id, variant):
    mech = get(mech_id)
    n = 37
    p = mech.problem(n, 2, variant)
    adj = M.adjacency(p)
    kw = M._walk_options(p.extras)
    for prefix in M.walk_prefixes(p):
        fresh = ref_walks.sample_walks(adj, M.N_WALKERS, rng_for(2, M.WALK_SALTS[prefix]), **kw)
        stored = M.ref_walks_of(p, prefix)
        for a in M.WALK_ARRAYS:
            np.testing.assert_array_equal(getattr(stored, a), getattr(fresh, a))
        assert stored.p_halt == fresh.p_halt and stored.n_walkers == fresh.n_walkers == M.N_WALKERS
        on_fast = M.fast_walks_of(p, prefix, "cpu").to_numpy()
        for a in M.WALK_ARRAYS:
            np.testing.assert_array_equal(on_fast[a], getattr(stored, a))
    expected = {"grf": ("walks",) if variant == "shared-ensemble" else ("walks", "walks_k")}.get(mech_id, ("walks",))
    assert M.walk_prefixes(p) == expected


@pytest.mark.parametrize("mech_id", IDS)
@pytest.mark.parametrize("n", [1, 40])
def test_dense_mask_is_the_fast_operator(mech_id, n):
    mech = get(mech_id)
    p = mech.problem(n, 1)
    dense = mech.dense_mask(p)
    got = mech.fast_mask(p, "cpu").matmul(torch.eye(n, dtype=torch.float64)).numpy()
    assert dense.shape == got.shape == (n, n)
    np.testing.assert_allclose(got, dense, rtol=1e-10, atol=1e-12)
    assert np.all(dense >= -1e-15)  # nonnegative masks: positive denominators


def test_grf_ensembles_are_independent_unless_shared():
    p = get("grf").problem(200, 0)
    assert not np.array_equal(p.extras["walks_nodes"], p.extras["walks_k_nodes"])
    assert get("grf").fast_mask(p, "cpu").shared is False
    shared = get("grf").problem(200, 0, "shared-ensemble")
    assert "walks_k_nodes" not in shared.extras and get("grf").fast_mask(shared, "cpu").shared is True
    np.testing.assert_array_equal(shared.extras["walks_nodes"], p.extras["walks_nodes"])


def test_walk_options_reach_the_sampler():
    fixed = get("rwgnk").problem(50, 0, "fixed-length")
    assert np.all(fixed.extras["walks_length"] == M.FIXED_LENGTH) and "p_halt" not in fixed.extras
    halting = get("rwgnk").problem(50, 0)
    assert halting.extras["walks_length"].max() <= M.I_MAX and float(halting.extras["p_halt"]) == M.P_HALT
    anti = get("grf").problem(50, 0, "antithetic")
    assert bool(anti.extras["antithetic"]) and "antithetic" not in get("grf").problem(50, 0).extras
    assert bool(get("grf").problem(50, 0, "repelling").extras["repelling"])
    assert int(get("rwgnk").problem(50, 0, "alpha-1").extras["alpha"]) == 1


def test_large_n_walks_come_from_the_fast_sampler_deterministically(monkeypatch):
    monkeypatch.setattr(M, "REFERENCE_WALKS_MAX_N", 16)
    mech = get("grf")
    p, again = mech.problem(64, 5), mech.problem(64, 5)
    assert _extras_equal(p, again)
    for prefix in ("walks", "walks_k"):
        M.ref_walks_of(p, prefix).validate(M.adjacency(p))  # valid walks on the graph
    assert not np.array_equal(p.extras["walks_nodes"], p.extras["walks_k_nodes"])
    small = mech.problem(16, 5)  # at the threshold: still the reference sampler
    fresh = ref_walks.sample_walks(M.adjacency(small), 4, rng_for(5, 120), p_halt=0.5, i_max=16)
    np.testing.assert_array_equal(small.extras["walks_nodes"], fresh.nodes)


# ------------------------------------------------------------------------------------ draw


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("mech_id", RANDOM)
def test_draw_resamples_the_walks_from_the_generator(mech_id):
    mech = get(mech_id)
    p = mech.problem(37, 0, batch=EQUIVALENCE_BATCH)
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    a, b, c = mech.draw(p, _gen(7)), mech.draw(p, _gen(7)), mech.draw(p, _gen(8))
    assert torch.equal(states[0], torch.get_rng_state()) and random.getstate() == states[2]
    assert np.array_equal(states[1][1], np.random.get_state()[1])
    assert _extras_equal(a, b) and np.array_equal(a.projection, b.projection)
    assert a.projection.shape == p.projection.shape
    for prefix in M.walk_prefixes(p):
        key = f"{prefix}_nodes"
        assert not np.array_equal(a.extras[key], p.extras[key])  # re-sampled
        assert not np.array_equal(a.extras[key], c.extras[key])  # from the generator
        M.ref_walks_of(a, prefix).validate(M.adjacency(p))
    for name in ("graph_indices", "n_walkers", "p_halt", "i_max"):  # the rest stays
        np.testing.assert_array_equal(a.extras[name], p.extras[name])
    np.testing.assert_array_equal(a.q, p.q)
    out_a, out_b, out_c = (mech.fast(x, "cpu", torch.float64) for x in (a, b, c))
    assert torch.equal(out_a, out_b) and not torch.equal(out_a, out_c)
    np.testing.assert_allclose(out_a.numpy(), mech.reference(a), rtol=1e-10, atol=1e-12 * np.abs(p.v).max())


def test_fixed_length_draw_keeps_fixed_length():
    mech = get("rwgnk")
    a = mech.draw(mech.problem(20, 0, "fixed-length"), _gen(1))
    assert np.all(a.extras["walks_length"] == M.FIXED_LENGTH)


@pytest.mark.parametrize("mech_id", ["gdk", "power-series"])
def test_deterministic_masks_draw_only_the_projection(mech_id):
    mech = get(mech_id)
    p = mech.problem(20, 0)
    a = mech.draw(p, _gen(3))
    assert _extras_equal(a, p) and not np.array_equal(a.projection, p.projection)


# ------------------------------------------------------------------------------------ metrics


def test_lemma_3_2_bound():
    assert M.nnz_bound(4, 0.5) == 37.0  # docs/papers.md: n = 4, p = 0.5, delta = 0.01 -> 36 (+1)
    assert M.nnz_bound(100, 0.5) == 1401.0
    assert M.nnz_bound(4, 0.5, i_max=3) == 13.0


@pytest.mark.parametrize("variant", ["grid-2d", "path", "karate", "shared-ensemble"])
def test_grf_metrics(variant):
    mech = get("grf")
    for n in (1, 64, 1000):
        p = mech.problem(n, 0, variant)
        m = mech.metrics(p)
        assert set(m) == {"nnz per feature", "nnz per feature bound", "flops"}
        op = mech.fast_mask(p, "cpu")
        assert m["nnz per feature"] == pytest.approx(op.features_q.nnz_stats()["mean"], rel=1e-12)
        assert 1 <= m["nnz per feature"] <= m["nnz per feature bound"] == 37.0
        c = 8 * 8 + 8
        nnz = op.features_q.nnz + op.features_k.nnz
        assert m["flops"] > 2 * nnz * c
    flops = [mech.metrics(mech.problem(n, 0))["flops"] for n in (1024, 4096)]
    assert 3.5 < flops[1] / flops[0] < 4.5  # O(N)


def test_other_metrics():
    gdk = get("gdk")
    for v in ("path", "grid-2d", "adjacency"):
        p = gdk.problem(300, 0, v)
        assert gdk.metrics(p) == {"sparse products": float(DiffusionMask(
            M.fast_graph(p, "cpu"), 1.0, kind=str(p.extras["kind"]), tol=M.TOL_GDK).products)}
        assert gdk.cost_factor(p) == (300 + M.num_edges(p)) / 300
    assert gdk.cost_factor(gdk.problem(300, 0)) == (300 + 2 * 299) / 300
    rw = get("rwgnk")
    p = rw.problem(300, 0)
    m = rw.metrics(p)
    op = rw.fast_mask(p, "cpu")
    assert isinstance(op, RWGNKMask) and m["nnz per feature"] == pytest.approx(op.nnz / 300)
    assert rw.metrics(rw.problem(300, 0, "fixed-length"))["nnz per feature bound"] == 4 * M.FIXED_LENGTH + 1
    asym = get("grf-asym")
    p = asym.problem(300, 0)
    op = asym.fast_mask(p, "cpu")
    assert isinstance(op, GRFAsymMask) and isinstance(get("grf").fast_mask(get("grf").problem(9, 0), "cpu"), GRFMask)
    assert asym.metrics(p)["nnz per feature"] == pytest.approx(op.features.nnz / 300)
    assert get("power-series").metrics is None


FLOPS = {"gdk": M.gdk_product_flops, "rwgnk": M.rwgnk_product_flops, "power-series": M.power_series_product_flops,
         "grf": M.grf_product_flops, "grf-asym": M.grf_asym_product_flops}


@pytest.mark.parametrize("mech_id", IDS)
def test_roofline_is_the_mask_product_with_its_flop_count(mech_id):
    mech = get(mech_id)
    assert mech.roofline.baseline == "matmul"
    case = mech.roofline.case(mech, 256, "cpu", 0)
    op = mech.fast_mask(mech.problem(256, 0), "cpu")
    assert case.flops_useful == FLOPS[mech_id](op, 256, case.columns)[0] > 2 * 256 * case.columns
    assert case.flops_executed is None and tuple(case.kernel().shape) == (256, case.columns)


# ------------------------------------------------------------------------------------ equivalence


def _passes(mech_id: str, variant: str, n: int, seed: int = 5) -> None:
    mech = get(mech_id)
    v = mech.variant(variant)
    details, reasons = variant_reasons(mech, v, n, seed)
    assert not reasons, reasons
    assert details["protocol"] == v.protocol


@pytest.mark.parametrize("mech_id, variant", list(_variants(plain_only=True)))
def test_batched_problem_fast_equals_reference_per_slice(mech_id, variant):
    for n in (1, 37):
        _passes(mech_id, variant, n)


@pytest.mark.parametrize("mech_id", IDS)
def test_default_variant_at_300(mech_id):
    _passes(mech_id, get(mech_id).default_variant.name, 300)


@pytest.mark.parametrize("mech_id", [m for m in IDS if PARAMS[m]])
def test_mask_parameters_are_held_and_learnable(mech_id):
    mech = get(mech_id)
    protocol_held_case(mech, 37)
    protocol_update_case(mech, mech.variant("update"), 37)
    protocol_learnable_case(mech, mech.variant("learnable"), 37)


def test_gdk_update_replans():
    """An in-place change of lam (the update protocol) moves the plan with it."""
    mech = get("gdk")
    p = mech.problem(37, 0)
    lam = torch.tensor(1.0, dtype=torch.float64)
    op = mech.fast_mask(replace(p, extras={**p.extras, "lam": lam}), "cpu")
    x = torch.rand(37, 2, dtype=torch.float64, generator=_gen(0))
    op.matmul(x)
    before = op.products
    with torch.no_grad():
        lam.mul_(4.0)
    y = op.matmul(x).numpy()
    p4 = replace(p, extras={**p.extras, "lam": np.float64(4.0)})
    np.testing.assert_allclose(y, mech.dense_mask(p4) @ x.numpy(), rtol=1e-10)
    assert op.products > before


@pytest.mark.parametrize("mech_id", IDS)
def test_sweep_setup_under_inference_mode(mech_id):
    """measure.timing sweeps build and run the fast path under torch.inference_mode: the mask
    parameters made there must still work with operators that read their version counters."""
    mech = get(mech_id)
    p = mech.problem(64, 0)
    with torch.inference_mode():
        out = mech.fast_setup(p, "cpu", torch.float64)()
    np.testing.assert_allclose(out.numpy(), mech.reference(p), rtol=1e-9)


def _pow2(lo, hi):
    return tuple(2**p for p in range(lo, hi + 1))


@pytest.mark.parametrize("mech_id", IDS)
def test_sweep_grids(mech_id):
    mech = get(mech_id)
    cubic = mech_id == "gdk"  # a dense N x N expm (power-series: K sparse-dense products)
    assert mech.sizes("fast", True) == _pow2(7, 14) and mech.sizes("fast", False) == _pow2(7, 17)
    assert mech.sizes("dense", True) == _pow2(7, 11)  # gdk's quick speed-up test needs 2^11
    assert mech.sizes("dense", False) == (_pow2(7, 11) if cubic else _pow2(7, 12))
    for v in mech.all_variants[1:]:
        if v.sweep:
            assert mech.sizes("fast", True, v) == _pow2(7, 13) and mech.sizes("fast", False, v) == _pow2(7, 15)
