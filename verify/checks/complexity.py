"""complexity/<mechanism>: the fast path's fitted exponent lies in its claimed class.

docs/methods.md: in-process interleaved sweep (verify.timing.sweep, one thread), least-squares slope
of log t vs log N with a 95% t-interval. N and N log N cannot be told apart by slope (the local
slope of N log N is 1 + 1/ln N), so sub-quadratic claims are one-sided: the upper CI must stay
below CLASS_UPPER; quadratic claims need the lower CI above 1.8. Where a dense twin exists, its
slope is reported beside the fast one and the speed-up t_dense / t_fast must grow with N
(lower CI of its log-log slope > 0); the crossover N is reported. "N diam" (Lemma 6.2) divides
each time by the problem's diameter and tests class N on the quotient.
"""
from __future__ import annotations

import time

import numpy as np

from verify.registry import Mechanism, mechanisms
from verify.result import Check, CheckResult, Context
from verify.timing import MIN_FIT_S, crossover, fit_exponent, fit_points, sweep

#: One-sided upper bounds on the fitted slope for each sub-quadratic class (docs/methods.md).
CLASS_UPPER = {"N": 1.35, "N log N": 1.4, "N log^2 N": 1.5}
#: Lower bound for quadratic claims (and what a dense twin is expected to show).
QUADRATIC_LOWER = 1.8
ROUNDS = {True: 3, False: 5}


def _run(mech: Mechanism, ctx: Context) -> CheckResult:
    start = time.perf_counter()
    rounds = ROUNDS[ctx.quick]
    fs = sweep(mech, "fast", mech.quick_fast_sizes if ctx.quick else mech.fast_sizes, rounds=rounds,
               device=ctx.device, seed=ctx.seed)
    ff = fit_exponent(fs.sizes, fs.seconds, min_seconds=MIN_FIT_S)
    details = {"fast": {"sizes": fs.sizes, "seconds": fs.seconds, "fit": ff.to_dict()}, "threads": fs.threads,
               "rounds": rounds, "claimed": mech.complexity}
    reasons = []
    if mech.complexity == "N diam":
        # O(N diam): time / diam(N) must scale like N (the problem fixes how diam grows with N)
        diam = [mech.extra_factor(mech.make_problem(n, ctx.seed)) for n in fs.sizes]
        keep = fit_points(np.asarray(fs.sizes, float), np.asarray(fs.seconds, float), MIN_FIT_S)  # by raw time
        per_diam = [t / d for t, d in zip(fs.seconds, diam)]
        ff = fit_exponent(np.asarray(fs.sizes)[keep], np.asarray(per_diam)[keep])
        details["fast"]["diameters"] = diam
        details["fast"]["fit_time_over_diam"] = ff.to_dict()
        threshold, statistic = CLASS_UPPER["N"], ff.high
        if ff.high >= threshold:
            reasons.append(f"upper CI of time/diam slope {ff.high:.2f} >= {threshold}")
    elif mech.complexity == "N^2":
        threshold, statistic = QUADRATIC_LOWER, ff.low
        if ff.low <= QUADRATIC_LOWER:
            reasons.append(f"lower CI {ff.low:.2f} <= {QUADRATIC_LOWER}")
    elif mech.complexity in CLASS_UPPER:
        threshold, statistic = CLASS_UPPER[mech.complexity], ff.high
        if ff.high >= threshold:
            reasons.append(f"upper CI {ff.high:.2f} >= {threshold}")
    else:
        return CheckResult(f"complexity/{mech.id}", f"complexity class of {mech.id}", mech.source, "complexity",
                           "skip", ff.slope, None, details={**details, "reason": f"no slope test for {mech.complexity}"})
    if mech.dense_setup is not None:
        ds = sweep(mech, "dense", mech.quick_dense_sizes if ctx.quick else mech.dense_sizes, rounds=rounds,
                   device=ctx.device, seed=ctx.seed)
        fd = fit_exponent(ds.sizes, ds.seconds, min_seconds=MIN_FIT_S)
        common = sorted(set(fs.sizes) & set(ds.sizes))
        tf, td = dict(zip(fs.sizes, fs.seconds)), dict(zip(ds.sizes, ds.seconds))
        ratio = [td[n] / tf[n] for n in common]
        details["dense"] = {"sizes": ds.sizes, "seconds": ds.seconds, "fit": fd.to_dict()}
        details["speedup"] = {"sizes": common, "dense_over_fast": ratio}
        details["crossover_n"] = crossover(fs, ds)
        if len(common) >= 3:
            fr = fit_exponent(common, ratio)
            details["speedup"]["fit"] = fr.to_dict()
            if fr.low <= 0:
                reasons.append(f"speed-up over the dense twin does not grow with N (slope CI low {fr.low:.2f})")
        if fd.low <= QUADRATIC_LOWER:
            details["dense_note"] = (f"dense twin's lower CI {fd.low:.2f} <= {QUADRATIC_LOWER}: overheads at "
                                     "small N flatten it; reported, not failed")
    details["reasons"] = reasons
    return CheckResult(
        id=f"complexity/{mech.id}", title=f"{mech.id} runs in O({mech.complexity})", source=mech.source,
        kind="complexity", status="fail" if reasons else "pass", statistic=statistic, threshold=threshold,
        seconds=time.perf_counter() - start, details=details)


def checks() -> list[Check]:
    return [Check(f"complexity/{m.id}", f"{m.id} runs in O({m.complexity})", m.source, "complexity",
                  run=lambda ctx, m=m: _run(m, ctx)) for m in mechanisms()]
