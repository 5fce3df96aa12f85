"""measure/roofline.py and verify/checks/perf.py: FLOP counts against hand counts, the fraction and
validity rule on planted seconds (no real timing decides a test here), Schema B's details, the
retry, a wrong output, every registered mechanism's perf/<id>, and the untimed cases and bare
primitives computing what they claim."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from measure import roofline as R
from results.check import Context
from verify import registry
from verify.checks import perf as P
from verify.mechanisms import get, mechanisms
from verify.mechanisms.positional import hypercube_flops, low_rank_flops
from verify.registry import Roofline

#: Schema B (PLAN.md): the details every perf/<id> result carries.
SCHEMA_B = {"baseline", "fraction", "target", "meets_target", "N", "d", "m", "dtype", "threads", "clock", "seconds",
            "baseline_seconds", "gflops", "gflops_executed", "peak_gflops", "flops_useful", "flops_executed", "what",
            "reasons"}


# ------------------------------------------------------------------------------ FLOP counts


def test_gemm_and_feature_map_counts_by_hand():
    assert R.gemm_flops(2) == 16.0 and R.gemm_flops(1024) == 2 * 1024**3
    # N = 5, d = 4, m = 3: projection 2*5*4*3 = 120; elementwise 5 * (3*4 + 4*3 + 1) = 125
    assert R.feature_map_flops(5, 4, 3) == 245.0


def test_linear_attention_count_by_hand():
    # N = 8, d = d_v = 2, m = 3: features 2 * (96 + 8 * 19) = 496; K'^T V 96; Q'(K'^T V) 96;
    # normaliser 48 + 48; division 16
    assert R.linear_attention_flops(8, 2, 3) == 800.0
    assert R.linear_attention_flops(8, 2, 3, slices=4) == 3200.0
    # d_v differs from d: K'^T V and Q'(K'^T V) 2 * 8 * 3 * 5 each, division 8 * 5
    assert R.linear_attention_flops(8, 2, 3, d_v=5) == 496 + 240 + 240 + 96 + 40


def test_the_gemm_terms_match_torchs_flop_counter():
    """The matmul terms of the useful count (projections, K'^T V, Q'(K'^T V), Q' (K'^T 1)) against
    torch's own FlopCounterMode on a plain torch computation of FAVOR+ linear attention."""
    n, d, m, dv = 32, 8, 6, 5
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    v, w = torch.randn(n, dv, generator=g), torch.randn(m, d, generator=g)
    with FlopCounterMode(display=False) as counter:
        pq = torch.exp(q @ w.T - (q * q).sum(-1, keepdim=True) / 2)
        pk = torch.exp(k @ w.T - (k * k).sum(-1, keepdim=True) / 2)
        num = pq @ (pk.T @ v)
        den = (pq @ pk.sum(0)[:, None])[:, 0]  # a matrix product (FlopCounterMode leaves mv uncounted)
        (num / den[:, None]).sum()
    gemm = counter.get_total_flops()
    elementwise = 2 * n * (3 * d + 4 * m + 1)
    not_a_matmul = 2 * n * m + n * dv  # K'^T 1 (a sum) and the division
    assert R.linear_attention_flops(n, d, m, dv) - elementwise - not_a_matmul == gemm


def test_causal_scan_count_by_hand():
    # N = 10, C = 4: nc = 3 chunks, Np = 12 padded tokens; d = d_v = 2 (e = 3), m = 3
    n, d, m, c = 10, 2, 3, 4
    fm = 2 * R.feature_map_flops(n, d, m) + n
    blocks = 2 * 12 * 4 + 2 * 12 * 4 * 3 + 12 * 4 + 2 * 12 * 4 * 3
    totals = 2 * 12 + 12 * 3 + 2 * 12 * 3 * 3 + 4 * 3 * 3 * 3
    reads = 2 * 12 + 12 * 3 + 2 * 12 * 3 * 3 + 12 * 3 + 10 * 2
    assert R.causal_scan_flops(n, d, m, c) == fm + blocks + totals + reads
    # C above N: one chunk of N tokens, nothing padded
    assert R.causal_scan_flops(10, d, m, 64) == R.causal_scan_flops(10, d, m, 10)
    # what it executes exceeds the useful count at the sizes perf times (C = 64, d = m = 64)
    assert R.causal_scan_flops(2**14, 64, 64, 64) > R.linear_attention_flops(2**14, 64, 64)
    assert R.causal_scan_flops(2**14, 64, 64, 64, slices=4) == 4 * R.causal_scan_flops(2**14, 64, 64, 64)


def test_softmax_count_by_hand():
    useful, executed = R.softmax_flops(4, 2)
    assert useful == 4 * 16 * 2 + 16  # 4 N^2 d + N^2
    assert executed == useful + 4 * 16 + 4 * 2
    assert R.softmax_flops(4, 2, slices=3) == (3 * useful, 3 * executed)


def test_low_rank_and_hypercube_counts_by_hand():
    assert low_rank_flops(SimpleNamespace(rank=16), 100, 64) == (4 * 100 * 16 * 64,) * 2
    # k = 12 bits in passes of 5, 5, 2: 2^6 + 2^6 + 2^3 = 136 FLOPs per entry executed, 3 k = 36 useful
    useful, executed = hypercube_flops(SimpleNamespace(k=12), 2**12, 10)
    assert (useful, executed) == (36 * 2**12 * 10, 136 * 2**12 * 10)


def test_gflops():
    assert R.gflops(2e9, 0.5) == 4.0
    assert R.gflops(None, 1.0) is None
    assert math.isnan(R.gflops(1e9, 0.0)) and math.isnan(R.gflops(1e9, math.nan))


# ------------------------------------------------------------------------------ fraction and validity


def test_best_and_spread():
    assert R.best([3.0, 1.0, 2.0]) == 1.0
    assert R.spread([1.0, 1.5, 2.0]) == pytest.approx(0.5)
    assert math.isnan(R.best([])) and math.isnan(R.best([1.0, math.inf])) and math.isnan(R.best([1.0, 0.0]))
    assert math.isnan(R.spread([1.0, math.nan]))


def test_validity_ceiling_floor_spread_and_cap():
    assert R.validity_ceiling(0.0, 0.01) == (1.0 + R.SLACK_FLOOR, R.SLACK_FLOOR)
    assert R.validity_ceiling(0.1, 0.05) == pytest.approx((1.3, 0.3))  # 2 x (0.1 + 0.05)
    assert R.validity_ceiling(2.0, 0.0) == (1.0 + R.SLACK_CAP, R.SLACK_CAP)
    assert R.validity_ceiling(math.nan, 0.0) == (1.0 + R.SLACK_CAP, R.SLACK_CAP)


def test_matmul_fraction_of_planted_seconds():
    # 1e9 useful FLOPs in 0.1 s = 10 GFLOP/s; a 2e9-FLOP GEMM in 0.05 s = 40 GFLOP/s: 0.25
    a = R.assess("matmul", [0.1, 0.1, 0.1], [0.05, 0.05, 0.05], flops_useful=1e9, peak_seconds=0.05, peak_flops=2e9)
    assert a.fraction == pytest.approx(0.25) and a.valid and a.ceiling == 1 + R.SLACK_FLOOR
    # the min over rounds is judged: a slow round changes nothing but the spread
    b = R.assess("matmul", [0.1, 0.3, 0.1], [0.05, 0.05, 0.05], flops_useful=1e9, peak_seconds=0.05, peak_flops=2e9)
    assert b.fraction == pytest.approx(0.25) and b.spreads["kernel"] == 0.0


def test_an_overcount_is_invalid():
    """Ten times the real FLOPs: 2.5 of the peak, above any ceiling (the cap is 2)."""
    a = R.assess("matmul", [0.1] * 3, [0.05] * 3, flops_useful=1e10, peak_seconds=0.05, peak_flops=2e9)
    assert not a.valid and a.fraction == pytest.approx(2.5)
    assert "above the validity ceiling" in a.reasons[0] and "FLOP count" in a.reasons[0]


def test_the_ceiling_follows_the_spread():
    """fraction 1.2: invalid on steady rounds (ceiling 1.1), valid when the rounds scatter by 10%
    (ceiling 1 + 2 (0.1 + 0) = 1.2)."""
    steady = R.assess("fft", [1.0, 1.0, 1.0], [1.2, 1.2, 1.2])
    assert steady.fraction == pytest.approx(1.2) and not steady.valid
    assert "faster than its bare fft" in steady.reasons[0]
    noisy = R.assess("fft", [1.0, 1.1, 1.2], [1.2, 1.2, 1.2])
    assert noisy.fraction == pytest.approx(1.2) and noisy.ceiling == pytest.approx(1.2) and noisy.valid


@pytest.mark.parametrize("kernel, base, match", [([math.nan, 1.0], [1.0, 1.0], "kernel's times"),
                                                 ([1.0, 1.0], [0.0, 1.0], "baseline's times")])
def test_non_finite_times_are_invalid(kernel, base, match):
    a = R.assess("scatter", kernel, base)
    assert not a.valid and match in a.reasons[0] and math.isnan(a.fraction)


def test_matmul_needs_a_count_and_a_peak():
    assert "FLOP count" in R.assess("matmul", [1.0], [1.0], flops_useful=None, peak_seconds=1.0,
                                    peak_flops=1.0).reasons[0]
    assert "no valid matmul peak" in R.assess("matmul", [1.0], [1.0], flops_useful=1.0, peak_seconds=math.nan,
                                              peak_flops=1.0).reasons[0]
    with pytest.raises(ValueError, match="baseline must be one of"):
        R.assess("csr", [1.0], [1.0])


def test_output_problems():
    assert R.output_problems(torch.zeros(2, 3), (2, 3)) == []
    assert "shape (3, 2)" in R.output_problems(torch.zeros(3, 2), (2, 3))[0]
    assert "1 non-finite" in R.output_problems(torch.tensor([[0.0, math.nan, 1.0]]), (1, 3))[0]
    assert "not a tensor" in R.output_problems((torch.zeros(1),), (1,))[0]


def test_interleaving_alternates_the_order_and_keeps_a_budget():
    seen = []

    def timer(runner, device, clock):
        seen.append(runner.__name__)
        return 1.0

    def a():
        return None

    def b():
        return None

    out = R.interleaved({"a": a, "b": b}, 4, clock="cpu", timer=timer, warm=False)
    assert seen == ["a", "b", "b", "a", "a", "b", "b", "a"] and out == {"a": [1.0] * 4, "b": [1.0] * 4}
    out = R.interleaved({"a": a, "b": b}, 4, clock="cpu", timer=timer, warm=False, budget=0.0, min_rounds=2)
    assert out == {"a": [1.0] * 2, "b": [1.0] * 2}
    with pytest.raises(ValueError, match="rounds"):
        R.interleaved({"a": a}, 0)


# ------------------------------------------------------------------------------ the check, planted


class _Timed:
    """A runner with a planted time per call (the timer reads ``seconds``), returning ``out``."""

    def __init__(self, seconds, out):
        self.seconds, self.out, self.calls = list(seconds), out, 0

    def __call__(self):
        return self.out

    def next(self) -> float:
        s = self.seconds[min(self.calls, len(self.seconds) - 1)]
        self.calls += 1
        return s


def _timer(gemm_seconds: float):
    def timer(runner, device, clock):
        return runner.next() if isinstance(runner, _Timed) else gemm_seconds
    return timer


def _planted(baseline: str, kernel_s, base_s=None, *, out=None, shape=(4, 2), flops=None, target=None,
             mech_id="planted") -> tuple:
    """A registry record (a copy of linear's) whose roofline case has planted runners."""
    kernel = _Timed(kernel_s, torch.zeros(shape) if out is None else out)
    base = None if base_s is None else _Timed(base_s, None)

    def case(mech, n, device, seed):
        return R.PerfCase(kernel=kernel, expected_shape=(4, 2), n=n, what="planted", baseline=base,
                          flops_useful=flops, flops_executed=flops, d=2, m=3, info={"planted": True})

    spec = Roofline(baseline, case, target=target, target_n=2**16 if target else None, quick_n=64, n=128)
    return dataclasses.replace(get("linear"), id=mech_id, roofline=spec), kernel


def test_matmul_check_on_planted_seconds_gives_schema_b():
    # kernel 1e9 FLOPs in 0.1 s (10 GFLOP/s) against a 1024 GEMM in 0.0537 s (~40 GFLOP/s)
    gemm_s = R.gemm_flops(1024) / 40e9
    mech, kernel = _planted("matmul", [0.1] * 5, flops=1e9, target=0.7)
    ctx = Context(quick=True)
    res = P.check_for(mech).result(P.measure_case(mech, ctx, timer=_timer(gemm_s)))
    d = res.details
    assert SCHEMA_B <= set(d)
    assert res.kind == "perf" and res.unit == "ratio" and res.compare == "<=" and res.status == "pass"
    assert res.statistic == pytest.approx(0.25) and d["fraction"] == res.statistic
    assert res.threshold == pytest.approx(1 + R.SLACK_FLOOR) and d["ceiling_slack"] == pytest.approx(R.SLACK_FLOOR)
    assert d["target"] == 0.7 and d["meets_target"] is False and d["target_n"] == 2**16
    assert "N = 64" in d["target_note"]
    assert d["gflops"] == pytest.approx(10.0) and d["peak_gflops"] == pytest.approx(40.0)
    assert d["baseline_seconds"] is None and d["seconds"] == 0.1 and d["N"] == 64
    assert (d["d"], d["m"], d["dtype"], d["threads"], d["reasons"]) == (2, 3, "float32", 1, [])
    assert d["planted"] is True and len(d["attempts"]) == 1 and d["rounds"] == R.ROUNDS[True]
    assert d["run_peak_gflops"] == pytest.approx(40.0) and d["run_peak_rounds"] == R.ROUNDS[True]
    # the run's GEMM was cached in the context, with this check's interleaved rounds
    (rate,) = [v for k, v in ctx.sweeps.items() if k[:2] == ("roofline", "matmul")]
    assert len(rate.rounds) == R.ROUNDS[True]


def test_the_gemm_is_made_once_per_run_and_each_check_judges_its_own_rounds():
    """Two checks in one run share the cached GEMM; the second ran while the GEMM was slower (a
    busier machine): its fraction uses the GEMM rounds beside its own kernel, the run's best is
    reported beside it."""
    ctx = Context(quick=True)
    results = []
    for mech_id, gemm_gflops in (("a", 40e9), ("b", 20e9)):
        mech, _ = _planted("matmul", [0.1] * 5, flops=1e9, mech_id=mech_id)
        out = P.measure_case(mech, ctx, timer=_timer(R.gemm_flops(1024) / gemm_gflops))
        results.append(out.details)
    (rate,) = [v for k, v in ctx.sweeps.items() if k[:2] == ("roofline", "matmul")]
    assert len(rate.rounds) == 2 * R.ROUNDS[True] and rate.gflops == pytest.approx(40.0)
    assert [d["fraction"] for d in results] == [pytest.approx(0.25), pytest.approx(0.5)]
    assert [d["peak_gflops"] for d in results] == [pytest.approx(40.0), pytest.approx(20.0)]
    assert results[1]["run_peak_gflops"] == pytest.approx(40.0)


def test_an_invalid_fraction_is_retimed_once_and_fails():
    gemm_s = R.gemm_flops(1024) / 40e9
    mech, kernel = _planted("matmul", [0.01] * 20, flops=1e9)  # 100 GFLOP/s against 40: 2.5 of the peak
    res = P.check_for(mech).result(P.measure_case(mech, Context(quick=True), timer=_timer(gemm_s)))
    assert res.status == "fail" and res.statistic == pytest.approx(2.5)
    assert len(res.details["attempts"]) == 2 and res.details["rounds"] == R.ROUNDS[True] + R.RETRY_ROUNDS[True]
    assert any("above the validity ceiling" in r for r in res.reasons)


def test_a_burst_of_load_is_outvoted_by_the_retry():
    """The first attempt's baseline rounds all slowed (a fraction of 1.3 with a steady spread), the
    retry's clean: pooled, the minima give the true 0.8 and the check passes."""
    mech, _ = _planted("fft", [1.0] * 10, [1.3] * 5 + [0.8] * 5)
    res = P.check_for(mech).result(P.measure_case(mech, Context(quick=True), timer=_timer(1.0)))
    assert res.status == "pass" and res.statistic == pytest.approx(0.8)
    assert [a["reasons"] != [] for a in res.details["attempts"]] == [True, False]


def test_fft_check_reports_the_bare_seconds():
    mech, _ = _planted("fft", [0.2] * 5, [0.15] * 5, target=1 / 1.5)
    res = P.check_for(mech).result(P.measure_case(mech, Context(quick=False), timer=_timer(1.0)))
    d = res.details
    assert res.status == "pass" and res.statistic == pytest.approx(0.75) and d["meets_target"] is True
    assert d["baseline_seconds"] == 0.15 and d["seconds"] == 0.2 and d["gflops"] is None and d["peak_gflops"] is None
    assert d["N"] == 128 and d["target_n"] == 2**16 and "N = 128" in d["target_note"]


@pytest.mark.parametrize("out, match", [(torch.zeros(3, 3), "shape"), (torch.full((4, 2), math.nan), "non-finite")])
def test_a_wrong_output_fails_without_a_retry(out, match):
    mech, _ = _planted("scatter", [0.2] * 5, [0.1] * 5, out=out)
    res = P.check_for(mech).result(P.measure_case(mech, Context(quick=True), timer=_timer(1.0)))
    assert res.status == "fail" and match in res.reasons[0] and len(res.details["attempts"]) == 1
    assert res.statistic == pytest.approx(0.5)  # the timing itself was fine


def test_a_record_without_a_roofline_is_skipped():
    mech = dataclasses.replace(get("linear"), id="bare", roofline=None)
    out = P.measure_case(mech, Context(quick=True))
    assert out.status == "skip" and "declares no roofline" in out.details["reason"]


# ------------------------------------------------------------------------------ the registry


def test_every_registered_mechanism_gets_perf_with_a_roofline():
    checks = P.checks()
    assert [c.id for c in checks] == [f"perf/{m.id}" for m in mechanisms()]
    for c, m in zip(checks, mechanisms()):
        assert isinstance(m.roofline, Roofline), m.id
        assert (c.kind, c.compare, c.unit, c.threshold, c.quick) == ("perf", "<=", "ratio", None, True)
        assert c.source == m.source and m.roofline.baseline in c.title


def test_the_issues_targets_and_baselines():
    spec = {m.id: m.roofline for m in mechanisms()}
    assert (spec["linear"].baseline, spec["linear"].target, spec["linear"].target_n) == ("matmul", 0.70, 2**16)
    assert (spec["causal"].baseline, spec["causal"].target, spec["causal"].target_n) == ("matmul", 0.50, 2**16)
    assert spec["linear"].n == 2**16 and spec["linear"].quick_n < 2**16
    for mid in ("toeplitz-1d", "block-toeplitz"):
        assert (spec[mid].baseline, spec[mid].target) == ("fft", pytest.approx(1 / 1.5))
    for mid in ("tree-exp", "tree-dc", "tree-diam"):
        assert (spec[mid].baseline, spec[mid].target) == ("scatter", None)
    for mid in ("softmax", "packing", "padding", "low-rank", "hypercube-gdk"):
        assert (spec[mid].baseline, spec[mid].target) == ("matmul", None)


def test_a_newly_registered_record_gets_its_perf_check(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(dataclasses.replace(get("padding"), id="padding-copy"))
    assert P.checks()[-1].id == "perf/padding-copy"


@pytest.mark.parametrize("kw, match", [(dict(baseline="csr"), "baseline must be one of"),
                                       (dict(case=None), "case must be callable"),
                                       (dict(target=1.5), "target must be a fraction"),
                                       (dict(target=0.0), "target must be a fraction"),
                                       (dict(quick_n=0), "quick_n must be a positive int"),
                                       (dict(n=True), "n must be a positive int")])
def test_roofline_refuses_bad_fields(kw, match):
    args = {"baseline": "matmul", "case": R.softmax_case, **kw}
    with pytest.raises(ValueError, match=match):
        Roofline(**args)


def test_mechanism_refuses_a_roofline_of_another_type():
    with pytest.raises(ValueError, match="roofline must be a verify.registry.Roofline"):
        dataclasses.replace(get("linear"), roofline="matmul")


# ------------------------------------------------------------------------------ the real cases, untimed


@pytest.mark.parametrize("mech_id", [m.id for m in mechanisms()])
def test_every_case_builds_and_its_kernel_computes_the_declared_output(mech_id):
    mech = get(mech_id)
    n = mech.admissible(256)
    with torch.inference_mode():
        case = mech.roofline.case(mech, n, "cpu", 0)
        assert R.output_problems(case.kernel(), case.expected_shape) == []
    assert case.n == n and case.what
    if mech.roofline.baseline == "matmul":
        assert case.flops_useful > 0 and case.baseline is None
        assert case.flops_executed is None or case.flops_executed >= case.flops_useful
    else:
        assert case.baseline is not None and case.flops_useful is None and case.columns == R.COLUMNS


def test_the_causal_case_times_the_default_chunk_and_counts_it():
    import fast

    case = get("causal").roofline.case(get("causal"), 256, "cpu", 0)
    chunk = fast.CausalMask(256).chunk_for(R.M, R.D)
    assert case.info["chunk"] == chunk
    assert case.flops_executed == R.causal_scan_flops(256, R.D, R.M, chunk, R.D, 4)


def test_attention_inputs_are_seeded_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    a = R.attention_inputs(16, seed=3)
    b = R.attention_inputs(16, seed=3)
    c = R.attention_inputs(16, seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], c[0])
    assert a[0].shape == (1, 4, 16, 64) and a[3].shape == (64, 64) and a[0].dtype == torch.float32


@pytest.mark.parametrize("grid, n_fft", [((7,), (16,)), ((3, 5), (6, 10))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bare_fft_transforms_the_same_columns_at_n_fft(grid, n_fft, dtype):
    """irfftn(rfftn(.)) of the padded columns gives them back: the bare runner transforms exactly
    the columns x (N, c) laid out on the grid, zero-padded to n_fft, in the dtype asked for."""
    x = torch.randn(int(np.prod(grid)), 3, generator=torch.Generator().manual_seed(1))
    out = R.bare_fft_runner(x, grid, n_fft, dtype)()
    assert out.shape == (3, *n_fft) and out.dtype == dtype
    crop = (slice(None),) + tuple(slice(0, s) for s in grid)
    assert torch.allclose(out[crop].double(), x.T.reshape(3, *grid).double(), atol=1e-5)
    pad = out.clone()
    pad[crop] = 0
    assert pad.abs().max() < 1e-5


def test_the_fft_case_uses_the_masks_n_fft_and_transform_dtype():
    mech = get("block-toeplitz")
    case = mech.roofline.case(mech, 256, "cpu", 0)
    op = mech.fast_mask(mech.problem(256, 0), "cpu")
    assert case.info["n_fft"] == list(op.n_fft) and case.info["grid_shape"] == list(op.grid_shape)
    assert case.info["transform_dtype"] == str(torch.promote_types(torch.float32, op.transform_dtype))[6:]
    assert case.baseline().dtype == torch.promote_types(torch.float32, op.transform_dtype)
    assert case.extra["bare_float32"]().dtype == torch.float32


def test_bare_scatter_sums_the_children_into_their_parents():
    parent = np.array([-1, 0, 0, 1, -1, 4])
    x = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    want = np.zeros((6, 2), np.float32)
    for i, p in enumerate(parent):
        if p >= 0:
            want[p] += x[i].numpy()
    assert np.array_equal(R.bare_scatter_runner(x, parent)().numpy(), want)


def test_the_perf_family_sits_after_complexity_and_before_scale():
    from verify.checks import all_checks

    families = list(dict.fromkeys(c.id.split("/")[0] for c in all_checks()))
    assert families.index("complexity") < families.index("perf") < families.index("scale")


def test_an_invalid_timing_leaves_strict_json():
    import json

    mech, _ = _planted("fft", [math.nan] * 10, [0.1] * 10)
    res = P.check_for(mech).result(P.measure_case(mech, Context(quick=True), timer=_timer(1.0)))
    assert res.status == "fail" and res.statistic is None and "kernel's times" in res.reasons[0]
    json.dumps(res.to_dict(), allow_nan=False)  # no NaN anywhere in the result


def test_case_factories_refuse_bad_arguments():
    with pytest.raises(ValueError, match="baseline must be one of"):
        R.mask_product_case("csr")
    with pytest.raises(ValueError, match="needs flops"):
        R.mask_product_case("matmul")
    with pytest.raises(ValueError, match="executed must be"):
        R.favor_case(None, executed="all")
