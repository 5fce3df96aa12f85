"""perf/<mechanism>: the fast path's speed as a fraction of a roofline measured in the same run
(issue 11, docs/methods.md "Roofline"; the primitives and the rule in measure/roofline.py).

One check per registered mechanism, in --quick too. Each record's ``Roofline`` says what is timed
and against what: the fp32 matmul rate (attention drivers and GEMM-shaped mask products: achieved
GFLOP/s of the USEFUL FLOPs over the GEMM's GFLOP/s), the bare batched rfft/irfft of the same
columns (the FFT masks) or one bare scatter over the tree (the tree masks): bare seconds over the
mask product's seconds. statistic = that fraction (unit "ratio"); it is <= 1 for an honest
measurement.

What fails. The issue's targets (linear >= 0.70, causal >= 0.50 of the matmul rate at N = 2^16,
FFT masks within 1.5x of their transforms) are BENCHMARK targets, not pass/fail: they are reported
in details (target, meets_target, target_n; the quick run times a smaller N and says so). The check
fails only when the measurement is invalid:

- the fraction is above the validity ceiling (threshold, decided by the run): achieved above the
  measured peak, or a mask faster than the bare primitive it must run, means a wrong FLOP count or
  a wrong baseline. ceiling = 1 + clamp(2 (s_kernel + s_baseline), 0.10, 1.0), s = (median - min) /
  min of each series' rounds in this check (measure.roofline.validity_ceiling, details "spread",
  "ceiling_slack", "ceiling_rule");
- a time or the fraction is not finite and > 0;
- the timed output is wrong: not of the expected shape or not finite (cheap on purpose: the values
  are equivalence/<id>'s business).

Timing (a busy machine must not fail it): one torch thread on the CPU, CPU seconds of the process
per call, the minimum over rounds, kernel and baseline alternating within every round
(measure.roofline.interleaved). The matmul rate's GEMM is made once per run (cached in the Context,
measure.roofline.matmul_rate); every matmul-baseline check times it interleaved with its kernel and
judges against those rounds (peak_gflops: the same conditions as the kernel's, so a check's
fraction does not depend on when in the run it ran), and reports the run's best GEMM so far beside
it (run_peak_gflops; it rose by ~20% over one quick run on a loaded machine). A check whose first attempt is
invalid by its timings (not by its output) is re-timed once with RETRY_ROUNDS more rounds and judged
on all rounds pooled, as complexity/<id> does: load that hit one attempt is outvoted; a wrong count
fails both.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from measure import roofline as R
from measure.timing import pinned_threads
from results.check import Check, Context, Outcome, judged
from verify.mechanisms import mechanisms
from verify.registry import Mechanism


def _finite(x: Any) -> float | None:
    """x as a float, None for None or a value that is not finite (the JSON stays strict)."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _round(rounds: list[float]) -> list[float | None]:
    return [None if not math.isfinite(r) else float(f"{r:.6g}") for r in rounds]


def _target_fields(spec, fraction: float, n: int, quick: bool) -> dict:
    """target, meets_target, target_n and a note where the N timed is not the target's."""
    out: dict[str, Any] = {"target": spec.target, "target_n": spec.target_n, "meets_target": None}
    if spec.target is not None and math.isfinite(fraction):
        out["meets_target"] = bool(fraction >= spec.target)
    if spec.target is not None and spec.target_n is not None and n != spec.target_n:
        out["target_note"] = (f"{'quick' if quick else 'this'} run timed N = {n:,}; the target is stated at "
                              f"N = {spec.target_n:,} (the full run)")
    return out


def measure_case(mech: Mechanism, ctx: Context, timer=None) -> Outcome:
    """perf/<id> of one mechanism (see the module doc); timer(runner, device, clock) -> seconds
    replaces the clock in tests (measure.roofline.interleaved)."""
    spec = mech.roofline
    if spec is None:
        return Outcome("skip", None, {"reason": f"{mech.id} declares no roofline (Mechanism.roofline)",
                                      "reasons": []})
    n = mech.admissible(spec.size(ctx.quick))
    rounds = R.ROUNDS[ctx.quick]
    with pinned_threads(R.THREADS), torch.inference_mode():
        ctx.note(f"perf/{mech.id}: N = {n:,}")
        case = spec.case(mech, n, ctx.device, ctx.seed)
        out = case.kernel()  # the warm-up call, whose output is checked
        R.sync(ctx.device)
        output_reasons = R.output_problems(out, case.expected_shape)
        del out
        clock = R.clock_for(ctx.device)
        rate = R.matmul_rate(ctx.sweeps, ctx.device, ctx.seed) if spec.baseline == "matmul" else None
        runners = {"kernel": case.kernel}
        if rate is not None:
            runners["baseline"] = rate.runner
        else:
            runners["baseline"] = case.baseline
            runners.update(case.extra)
        for name in list(runners)[1:]:  # the kernel was warmed up above
            runners[name]()
        taken = R.interleaved(runners, rounds, ctx.device, clock, timer, warm=False, budget=R.BUDGET_S[ctx.quick],
                              min_rounds=R.MIN_ROUNDS)
        attempts = []

        def judge() -> R.Assessment:
            if rate is not None:
                return R.assess("matmul", taken["kernel"], taken["baseline"], flops_useful=case.flops_useful,
                                peak_seconds=R.best(taken["baseline"]),
                                peak_flops=R.gemm_flops(rate.size))
            return R.assess(spec.baseline, taken["kernel"], taken["baseline"])

        a = judge()
        attempts.append({"rounds": len(taken["kernel"]), "fraction": _finite(a.fraction), "ceiling": a.ceiling,
                         "reasons": list(a.reasons)})
        if not a.valid and not output_reasons:
            ctx.note(f"perf/{mech.id}: invalid on {rounds} rounds; re-timing with {R.RETRY_ROUNDS[ctx.quick]} more")
            again = R.interleaved(runners, R.RETRY_ROUNDS[ctx.quick], ctx.device, clock, timer, warm=False,
                                  budget=R.BUDGET_S[ctx.quick], min_rounds=R.MIN_ROUNDS)
            for name, values in again.items():
                taken[name] = taken[name] + values
            a = judge()
            attempts.append({"rounds": len(taken["kernel"]), "fraction": _finite(a.fraction), "ceiling": a.ceiling,
                             "reasons": list(a.reasons)})
        if rate is not None:
            rate.add(taken["baseline"])  # the run's GEMM rounds (its best is reported beside this check's)

    seconds = R.best(taken["kernel"])
    details: dict[str, Any] = {
        "baseline": spec.baseline, "fraction": _finite(a.fraction),
        **_target_fields(spec, a.fraction, n, ctx.quick),
        "N": n, "d": case.d, "m": case.m, "columns": case.columns, "dtype": "float32",
        "threads": R.THREADS, "clock": clock, "device": str(ctx.device),
        "seconds": _finite(seconds),
        "baseline_seconds": None if rate is not None else _finite(R.best(taken["baseline"])),
        "gflops": None, "gflops_executed": None, "peak_gflops": None,
        "flops_useful": case.flops_useful, "flops_executed": case.flops_executed,
        "fraction_of": ("useful FLOPs per second / the fp32 matmul rate" if rate is not None
                        else f"bare {spec.baseline} seconds / the mask product's seconds"),
        "what": case.what,
        "rounds": len(taken["kernel"]),
        "spread": {k: _finite(v) for k, v in a.spreads.items()},
        "ceiling_slack": a.slack, "ceiling_rule": R.CEILING_RULE,
        "rounds_seconds": {k: _round(v) for k, v in taken.items()},
        "attempts": attempts, **case.info,
    }
    if rate is not None:
        peak_s = R.best(taken["baseline"])
        details.update({
            "gflops": _finite(R.gflops(case.flops_useful, seconds)),
            "gflops_executed": _finite(R.gflops(case.flops_executed, seconds)),
            "peak_gflops": _finite(R.gflops(R.gemm_flops(rate.size), peak_s)),
            "peak_seconds": _finite(peak_s), "matmul_size": rate.size,
            "run_peak_gflops": _finite(rate.gflops), "run_peak_rounds": len(rate.rounds)})
    for name in case.extra:
        details[f"{name}_seconds"] = _finite(R.best(taken[name]))
    reasons = output_reasons + a.reasons
    outcome = judged(not reasons, _finite(a.fraction), reasons, **details)
    outcome.threshold = a.ceiling  # the validity ceiling: decided by this run's spreads
    return outcome


def check_for(m: Mechanism) -> Check:
    """perf/<id> of one record (registered or not). Its threshold (the validity ceiling) is decided
    by the run: declared None, returned in the Outcome."""
    base = m.roofline.baseline if m.roofline is not None else "none"
    return Check(f"perf/{m.id}", f"{m.id}: speed as a fraction of the {base} roofline", m.source, "perf",
                 run=lambda ctx: measure_case(m, ctx), threshold=None, compare="<=", unit="ratio")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()]
