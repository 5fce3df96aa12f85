"""complexity/<mechanism>: the fast path's fitted exponent lies in its claimed class.

docs/methods.md: in-process interleaved sweep (verify.timing.sweep, one thread) of the default
variant, least-squares slope of log t vs log N with a 95% t-interval. N and N log N cannot be told
apart by slope (the local slope of N log N is 1 + 1/ln N), so sub-quadratic claims are one-sided:
the upper CI must stay below CLASS_UPPER; quadratic claims need the lower CI above 1.8. A class
with a cost factor (verify.registry.COST_FACTOR_CLASSES, e.g. "N diam" = N times the forest's
diameter) divides each time by the problem's cost factor (Mechanism.cost_factor) and tests the
base class on the quotient. Where a dense twin exists, its slope is reported beside the fast one
and the speed-up t_dense / t_fast must grow with N (lower CI of its log-log slope > 0); the
crossover N is reported.
"""
from __future__ import annotations

from verify.mechanisms import mechanisms
from verify.registry import COST_FACTOR_CLASSES, Mechanism
from verify.result import Check, Context, Outcome, judged
from verify.timing import compare as timing_compare
from verify.timing import covering_sweep
from verify.timing import fit_times, sweep

#: One-sided upper bounds on the fitted slope for each sub-quadratic class (docs/methods.md).
CLASS_UPPER = {"N": 1.35, "N log N": 1.4, "N log^2 N": 1.5}
#: Lower bound for quadratic claims (and what a dense twin is expected to show).
QUADRATIC_LOWER = 1.8
ROUNDS = {True: 3, False: 5}


def tested_class(complexity: str) -> str:
    """The class whose slope is tested: the base class of a cost-factor class, else the class."""
    return COST_FACTOR_CLASSES.get(complexity, complexity)


def claim_rule(complexity: str) -> tuple[str, float] | None:
    """(compare, threshold) of the slope test for a claimed class: ("<", upper) on the upper CI
    for sub-quadratic classes, (">", 1.8) on the lower CI for N^2; None: no slope test."""
    base = tested_class(complexity)
    if base == "N^2":
        return ">", QUADRATIC_LOWER
    if base in CLASS_UPPER:
        return "<", CLASS_UPPER[base]
    return None


def _sweep(mech: Mechanism, impl: str, ctx: Context, rounds: int):
    """verify.timing.sweep of the default variant on the mode's grid, through the ctx.sweeps cache
    (a sweep verify.measure already took for the report is reused, on the same grid or on a larger
    one with at least as many rounds, timing.covering_sweep: one exponent per sweep)."""
    sizes = mech.sizes(impl, ctx.quick)
    covering = covering_sweep(ctx.sweeps, mech.id, mech.default_variant.name, impl, sizes, rounds, ctx.device,
                              ctx.seed)
    if covering is not None:  # a larger grid with at least as many rounds: the same claim, more evidence
        return covering
    return sweep(mech, impl, sizes, variant=None, rounds=rounds, device=ctx.device, seed=ctx.seed, cache=ctx.sweeps)


def _sweep_details(s) -> dict:
    return {"sizes": list(s.sizes), "seconds": list(s.seconds), "error": s.error}


def _run(mech: Mechanism, ctx: Context) -> Outcome:
    rule = claim_rule(mech.complexity)
    rounds = ROUNDS[ctx.quick]
    variant = mech.default_variant
    fs = _sweep(mech, "fast", ctx, rounds)
    # the one fit rule (verify.timing.fit_times): the points, the fit of t and of t / cost factor
    fitted, ff, cost_fit = fit_times(fs.sizes, fs.seconds, fs.cost_factors)
    details = {"fast": {**_sweep_details(fs), "fitted": fitted, "fit": None if ff is None else ff.to_dict()},
               "threads": fs.threads, "rounds": rounds, "claimed": mech.complexity, "variant": variant.name}
    if rule is None:
        return Outcome("skip", None if ff is None else ff.slope,
                       {**details, "reasons": [], "reason": f"no slope test for {mech.complexity}"})
    compare, threshold = rule
    tested = tested_class(mech.complexity)
    reasons = []
    if fs.error:
        reasons.append(f"the fast sweep stopped: {fs.error}")
    fit, quantity = ff, "time"
    if mech.complexity in COST_FACTOR_CLASSES:
        # O(N factor): time / factor(N) must scale like the base class (the problem fixes how the
        # factor grows with N); the points are the ones the fit rule chose by raw time
        name = mech.cost_factor_name
        fit, quantity = cost_fit, f"time / {name}"
        details["fast"].update({"cost_factor_name": name, "cost_factors": fs.cost_factors,
                                f"fit_time_over_{name}": None if fit is None else fit.to_dict()})
    statistic = None
    if fit is None:
        reasons.append(f"fewer than 3 timed points to fit ({len(fs.sizes)} measured)")
    elif compare == "<":
        statistic = fit.high
        details["statistic"] = f"upper 95% CI of the log-log slope of {quantity} (class {tested})"
        if not statistic < threshold:
            reasons.append(f"upper CI {statistic:.2f} of the {quantity} slope is not < {threshold} (class {tested})")
    else:
        statistic = fit.low
        details["statistic"] = f"lower 95% CI of the log-log slope of {quantity} (class {tested})"
        if not statistic > threshold:
            reasons.append(f"lower CI {statistic:.2f} of the {quantity} slope is not > {threshold} (class {tested})")
    if mech.dense_setup is not None:
        ds = _sweep(mech, "dense", ctx, rounds)
        fd = fit_times(ds.sizes, ds.seconds)[1]
        comparison = timing_compare(fs, ds, seed=ctx.seed)
        details["dense"] = {**_sweep_details(ds), "fit": None if fd is None else fd.to_dict()}
        details["speedup"] = {"sizes": comparison.sizes, "dense_over_fast": comparison.speedup}
        details["crossover_n"] = comparison.crossover
        details["crossover_interval"] = [comparison.crossover_low, comparison.crossover_high]
        if ds.error:
            reasons.append(f"the dense sweep stopped: {ds.error}")
        if comparison.speedup_fit is not None:
            fr = comparison.speedup_fit
            details["speedup"]["fit"] = fr.to_dict()
            if not fr.low > 0:
                reasons.append(f"speed-up over the dense twin does not grow with N (slope CI low {fr.low:.2f})")
        if fd is not None and fd.low <= QUADRATIC_LOWER:
            details["dense_note"] = (f"dense twin's lower CI {fd.low:.2f} <= {QUADRATIC_LOWER}: overheads at "
                                     "small N flatten it; reported, not failed")
    return judged(not reasons, statistic, reasons, **details)


def check_for(m: Mechanism) -> Check:
    """complexity/<id> of one record (registered or not)."""
    rule = claim_rule(m.complexity)
    compare, threshold = rule if rule else ("", None)
    return Check(f"complexity/{m.id}", f"{m.id} runs in O({m.complexity})", m.source, "complexity",
                 run=lambda ctx: _run(m, ctx), threshold=threshold, compare=compare, unit="exponent")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()]
