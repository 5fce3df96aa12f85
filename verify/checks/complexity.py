"""complexity/<mechanism>: the fast path's fitted exponent lies in its claimed class.

docs/methods.md: in-process interleaved sweep (measure.timing.sweep, one thread) of the default
variant, least-squares slope of log t vs log N with a 95% t-interval. N and N log N cannot be told
apart by slope (the local slope of N log N is 1 + 1/ln N), so sub-quadratic claims are one-sided:
the upper CI must stay below CLASS_UPPER; quadratic claims need the lower CI above 1.8. A class
with a cost factor (verify.registry.COST_FACTOR_CLASSES, e.g. "N diam" = N times the forest's
diameter) divides each time by the problem's cost factor (Mechanism.cost_factor) and tests the
base class on the quotient. Where a dense twin exists, its slope is reported beside the fast one
and the speed-up t_dense / t_fast must grow with N: the lower end of a 95% interval of its log-log
slope (over the common N the fit rule keeps) must be > 0. That interval is a percentile bootstrap
over rounds (measure.timing.speedup_interval): it covers round-to-round timing noise, not the shape
of the speed-up curve. The t-interval of the speed-up fit (reported as details["speedup"]["fit"])
counts the curve's bends over its 4-5 points (overheads at small N, the dense twin's cache steps) as
noise with 2-3 degrees of freedom: it was [0.56, 1.80] for tree-dc on an idle machine, and a load
shift at one end pushed it below 0. The crossover N is reported.

A loaded machine (docs/methods.md, "Timing under load"). These keep other work on the machine
from failing a correct fast path (with the speed-up interval above), and none lets a wrong one pass:

- The clock. On the CPU the sweeps run one torch thread, and the check judges CPU seconds of the
  process per call (measure.timing.Sweep.cpu_view), not wall seconds: the time the thread waits for
  a core is not counted, so a CPU-burning neighbour on every core leaves the times close to the
  idle ones. Each point is the MINIMUM over rounds (load only adds CPU time, through shared caches
  and memory bandwidth: the least disturbed round is the best estimate of the cost). On an
  accelerator the clock stays wall seconds (median over rounds).
- One retry. A check that does not pass on its first sweeps re-times them once with RETRY_ROUNDS
  more rounds (not cached) and decides on all rounds pooled, so a burst of load during one sweep
  is outvoted. A real regression fails both times; it costs only the retry's time.
- Inconclusive is not failed, but only when the interval is wide and the estimate right. After
  the retry, a test that still does not pass is "inconclusive" (status "inconclusive",
  details["inconclusive"] = True, details["reason"]) when its point estimate passes the
  threshold by a margin (the slope at most threshold - SLOPE_MARGIN for "<", at least threshold +
  SLOPE_MARGIN for ">"; a speed-up slope of at least SPEEDUP_MARGIN, where a correct fast path
  against an N^2 twin shows about 1) and only its interval crosses the threshold.
- A busy machine cannot fail a check, only an implementation can. Every sweep records the share
  of each measurement's wall time its thread waited for a core and the load average around it
  (measure.timing.Sweep.busy). When the final attempt's sweeps ran on a busy machine, a test that
  does not pass is "inconclusive: machine busy" unless it fails by more than load can explain:
  a slope whose whole interval lies LOAD_SLACK beyond the threshold (lower CI >= 1.65 for class N;
  a quadratic fast path reads about 2), or a speed-up whose whole interval lies below
  SPEEDUP_MARGIN. Load raises CPU seconds per call by tens of percent, more at large working sets,
  which bends a slope by tenths, never by 0.3 over two decades with a whole interval beyond it.
  On a quiet machine an estimate on the wrong side of the threshold, or within the margin of it,
  fails: a quadratic fast path (slope ~2 against 1.35) or a speed-up that does not grow (slope ~0)
  fails, loaded and idle.

details["attempts"] lists each attempt's rounds, fits and verdict; details["clock"] the clock;
details["fast"]["seconds"] stay the sweep's wall medians (the report's), "cpu_seconds" beside them
are the judged times, and "fit_wall" the wall-clock fit for comparison.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from measure.timing import compare as timing_compare
from measure.timing import covering_sweep, merge_rounds, speedup_interval
from measure.timing import FIT_MIN_POINTS, fit_times, sweep
from results.check import Check, Context, Outcome, judged
from verify.mechanisms import mechanisms
from verify.registry import COST_FACTOR_CLASSES, Mechanism

#: One-sided upper bounds on the fitted slope for each sub-quadratic class (docs/methods.md).
CLASS_UPPER = {"N": 1.35, "N log N": 1.4, "N log^2 N": 1.5}
#: Lower bound for quadratic claims (and what a dense twin is expected to show).
QUADRATIC_LOWER = 1.8
ROUNDS = {True: 3, False: 5}
#: Rounds of the one re-timing of a check that did not pass on its first sweeps (pooled with them).
RETRY_ROUNDS = {True: 3, False: 5}
#: After the retry, a slope test that does not pass is inconclusive (not failed) only if its point
#: estimate passes the threshold by at least this much (exponent units) and only the interval
#: crosses it.
SLOPE_MARGIN = 0.2
#: ... and a speed-up test (lower CI of the speed-up slope > 0) only if the speed-up slope is at
#: least this (a correct fast path against an O(N^2) twin: about 1).
SPEEDUP_MARGIN = 0.5
#: On a busy machine (measure.timing.Sweep.busy) a slope test fails only when its whole interval lies
#: this far beyond the threshold (exponent units): what load can bend a slope by, at most.
LOAD_SLACK = 0.3
#: On an accelerator a call costs a floor (kernel launches, host reads) that the quick grid may
#: never leave: a slope over such times says nothing about the work. A size counts as having left
#: the floor when its time is at least this multiple of the sweep's smallest time; with fewer than
#: measure.timing.FIT_MIN_POINTS such sizes the check is skipped, saying so (the class is judged on
#: the CPU, and at N = 2^20 by scale/<id> on the device, where a quadratic term costs 16-32x its
#: class line). A path whose time grows past the floor over the grid's last sizes is judged, and a
#: quadratic one fails, on the device too: t = floor + c N^2 is judged once c N_max^2 >= 192 floors.
LAUNCH_FACTOR = 4.0


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
    """measure.timing.sweep of the default variant on the mode's grid, through the ctx.sweeps cache
    (a sweep measure already took for the report is reused when it covers the grid with at least
    as many rounds, timing.covering_sweep, and judged at the mode's grid only: the check means the
    same in a report as in ``python -m verify``. The full grid's extra octaves of the cheapest
    paths fit their top four points, 2^14-2^17, across the step out of the cache (difformer: 2.4
    ms at 2^15, 5.9 at 2^16), which left a correct O(N) path at upper CI 1.37 on a quiet machine;
    the report's figure still fits the whole sweep)."""
    sizes = mech.sizes(impl, ctx.quick)
    covering = covering_sweep(ctx.sweeps, mech.id, mech.default_variant.name, impl, sizes, rounds, ctx.device,
                              ctx.seed)
    if covering is not None:  # the same measurements, judged on the check's own grid
        return covering.at_sizes(sizes)
    return sweep(mech, impl, sizes, variant=None, rounds=rounds, device=ctx.device, seed=ctx.seed, cache=ctx.sweeps)


def _retime(mech: Mechanism, measured, ctx: Context):
    """``measured`` with RETRY_ROUNDS more rounds on its sizes (a fresh sweep, not cached), pooled."""
    again = sweep(mech, measured.impl, measured.sizes, variant=None, rounds=RETRY_ROUNDS[ctx.quick],
                  device=ctx.device, seed=ctx.seed, cache=None)
    return merge_rounds(measured, again)


def judged_times(s):
    """The view of a sweep the check judges: CPU seconds, minimum over rounds, where recorded
    (measure.timing.Sweep.cpu_view); else the sweep itself (wall seconds, median over rounds)."""
    return s.cpu_view() or s


def _sweep_details(s, view) -> dict:
    """sizes, seconds (the sweep's wall medians, as the report draws them), error; with the CPU clock
    also cpu_seconds (the judged times: minimum over rounds)."""
    out = {"sizes": list(s.sizes), "seconds": list(s.seconds), "error": s.error, "clock": view.clock}
    if view is not s:
        out["cpu_seconds"] = list(view.seconds)
    return out


def _fit_dict(fit) -> dict | None:
    return None if fit is None else fit.to_dict()


@dataclass
class _Judgement:
    """One attempt's verdict: statistic, reasons it fails (an estimate on the wrong side, or too
    close), reasons it is only unproven (the estimate passes by the margin, the interval does not),
    and the details of the fits."""

    statistic: float | None
    failed: list[str] = field(default_factory=list)
    unsure: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    #: tests that failed on a busy machine by less than load can explain (``busy_allows``)
    loaded: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "fail" if self.failed else "inconclusive" if self.unsure or self.loaded else "pass"


def busy_allows(fit, compare: str, threshold: float) -> bool:
    """Whether load can explain a slope test that ``fit`` fails: False only when its whole interval
    lies LOAD_SLACK beyond ``threshold`` (lower CI >= threshold + LOAD_SLACK for "<", upper CI
    <= threshold - LOAD_SLACK for ">"). A planted quadratic (slope ~2 against 1.35) is not allowed.

    >>> from measure.timing import Fit
    >>> from verify.checks.complexity import busy_allows
    >>> busy_allows(Fit(1.5, 1.4, 1.6, 0.0, 0.95, 1.5), "<", 1.35)  # a bent linear path
    True
    >>> busy_allows(Fit(2.0, 1.9, 2.1, 0.0, 0.95, 2.0), "<", 1.35)  # a quadratic one
    False
    """
    if compare == "<":
        return fit.low < threshold + LOAD_SLACK
    return fit.high > threshold - LOAD_SLACK


def _one_sided(fit, compare: str, threshold: float, margin: float, what: str, where: str) -> tuple[str, str]:
    """("pass" | "unsure" | "fail", reason) of the test "interval end compare threshold" on ``fit``.
    unsure: the end fails but the point estimate passes by ``margin`` (a wide interval)."""
    if compare == "<":
        if fit.high < threshold:
            return "pass", ""
        reason = f"upper CI {fit.high:.2f} of the {what} is not < {threshold:g}{where}"
        if fit.slope <= threshold - margin:
            return "unsure", f"{reason}, though its estimate {fit.slope:.2f} is (interval too wide to decide)"
        return "fail", f"{reason} (estimate {fit.slope:.2f})"
    if fit.low > threshold:
        return "pass", ""
    reason = f"lower CI {fit.low:.2f} of the {what} is not > {threshold:g}{where}"
    if fit.slope >= threshold + margin:
        return "unsure", f"{reason}, though its estimate {fit.slope:.2f} is (interval too wide to decide)"
    return "fail", f"{reason} (estimate {fit.slope:.2f})"


def sweeps_busy(fs, ds) -> str | None:
    """measure.timing.machine_busy over the fast and dense sweeps of an attempt together (their load
    samples and wait shares), None when the machine was not busy.

    >>> from measure.timing import Sweep
    >>> from verify.checks.complexity import sweeps_busy
    >>> s = Sweep("m", "fast", "cpu", "float32", 1, [8], [1.0], 1, wait_rounds=[[0.6]], load=[1.0, 1.1])
    >>> sweeps_busy(s, None).startswith("machine busy: load average 1.1 on ")
    True
    """
    from measure.timing import machine_busy

    load = list(fs.load) + (list(ds.load) if ds is not None else [])
    waits = [w for s in (fs, ds) if s is not None for row in (s.wait_rounds or []) for w in row]
    return machine_busy(load, waits)


def _judge(mech: Mechanism, fs, ds, ctx: Context) -> _Judgement:
    """The claim's tests on one attempt's sweeps (fast ``fs``, dense ``ds`` or None), judged on
    ``judged_times`` of each; a failing test goes to ``loaded`` when the sweeps ran on a busy
    machine (``sweeps_busy``) and ``busy_allows`` it."""
    busy = sweeps_busy(fs, ds)
    compare, threshold = claim_rule(mech.complexity)
    tested = tested_class(mech.complexity)
    fv = judged_times(fs)
    # the one fit rule (measure.timing.fit_times): the points, the fit of t and of t / cost factor
    fitted, ff, cost_fit = fit_times(fv.sizes, fv.seconds, fs.cost_factors)
    wall_fit = fit_times(fs.sizes, fs.seconds)[1] if fv is not fs else ff
    j = _Judgement(None)
    j.details["fast"] = {**_sweep_details(fs, fv), "fitted": fitted, "fit": _fit_dict(ff),
                         "fit_wall": _fit_dict(wall_fit)}
    if fs.error:
        j.failed.append(f"the fast sweep stopped: {fs.error}")
    fit, quantity = ff, "time"
    if mech.complexity in COST_FACTOR_CLASSES:
        # O(N factor): time / factor(N) must scale like the base class (the problem fixes how the
        # factor grows with N); the points are the ones the fit rule chose by raw time
        name = mech.cost_factor_name
        fit, quantity = cost_fit, f"time / {name}"
        j.details["fast"].update({"cost_factor_name": name, "cost_factors": fs.cost_factors,
                                  f"fit_time_over_{name}": _fit_dict(fit)})
    if fit is None:
        j.failed.append(f"fewer than 3 timed points to fit ({len(fs.sizes)} measured)")
    else:
        end = "upper" if compare == "<" else "lower"
        j.statistic = fit.high if compare == "<" else fit.low
        j.details["statistic"] = f"{end} 95% CI of the log-log slope of {quantity} (class {tested})"
        verdict, reason = _one_sided(fit, compare, threshold, SLOPE_MARGIN, f"{quantity} slope", f" (class {tested})")
        if verdict == "fail" and busy and busy_allows(fit, compare, threshold):
            j.loaded.append(reason)
        elif verdict != "pass":
            (j.failed if verdict == "fail" else j.unsure).append(reason)
    if busy:
        j.details["busy"] = busy
    if ds is not None:
        dv = judged_times(ds)
        fd = fit_times(dv.sizes, dv.seconds)[1]
        comparison = timing_compare(fv, dv, seed=ctx.seed)
        j.details["dense"] = {**_sweep_details(ds, dv), "fit": _fit_dict(fd)}
        j.details["speedup"] = {"sizes": comparison.sizes, "dense_over_fast": comparison.speedup}
        j.details["crossover_n"] = comparison.crossover
        j.details["crossover_interval"] = [comparison.crossover_low, comparison.crossover_high]
        if ds.error:
            j.failed.append(f"the dense sweep stopped: {ds.error}")
        if comparison.speedup_fit is not None:
            fr = comparison.speedup_fit
            j.details["speedup"]["fit"] = fr.to_dict()
            # judged: the slope's interval from round-to-round noise (timing.speedup_interval); the
            # t-interval of the fit (reported) counts the curve's shape as noise too
            low, high = speedup_interval(fv, dv, seed=ctx.seed)
            j.details["speedup"]["interval"] = [low, high]
            j.details["speedup"]["interval_method"] = "percentile bootstrap over rounds (timing.speedup_interval)"
            if low is None:  # fewer than 2 rounds: the t-interval
                low, j.details["speedup"]["interval_method"] = fr.low, "t-interval of the fit (too few rounds)"
            if not low > 0:
                reason = f"speed-up over the dense twin does not grow with N (slope CI low {low:.2f}"
                top = fr.high if high is None else high
                if busy and top >= SPEEDUP_MARGIN:  # load can flatten a speed-up, not make it all < 0.5
                    j.loaded.append(f"{reason}, estimate {fr.slope:.2f}, CI high {top:.2f})")
                elif fr.slope >= SPEEDUP_MARGIN:
                    j.unsure.append(f"{reason}, though its estimate {fr.slope:.2f} grows: interval too wide to decide)")
                else:
                    j.failed.append(f"{reason}, estimate {fr.slope:.2f})")
        if fd is not None and fd.low <= QUADRATIC_LOWER:
            j.details["dense_note"] = (f"dense twin's lower CI {fd.low:.2f} <= {QUADRATIC_LOWER}: overheads at "
                                       "small N flatten it; reported, not failed")
    return j


def _attempt(j: _Judgement, rounds: int) -> dict:
    """The record of one attempt in details["attempts"]."""
    fast = j.details.get("fast", {})
    name = fast.get("cost_factor_name")
    return {"rounds": rounds, "verdict": j.verdict, "statistic": j.statistic,
            "fit": fast.get(f"fit_time_over_{name}") if name else fast.get("fit"),
            "speedup_fit": j.details.get("speedup", {}).get("fit"),
            "speedup_interval": j.details.get("speedup", {}).get("interval"), "busy": j.details.get("busy"),
            "reasons": j.failed + j.loaded + j.unsure}


def launch_bound(s, device) -> str | None:
    """Why sweep ``s`` on ``device`` cannot judge a class (None on the CPU, where time is work, or
    when at least FIT_MIN_POINTS sizes take LAUNCH_FACTOR x the smallest time or more)."""
    if str(device).split(":")[0] == "cpu" or not s.sizes:
        return None
    times = [t for t in s.seconds if t == t]  # NaN-free
    above = sum(t >= LAUNCH_FACTOR * min(times) for t in times) if times else 0
    if above >= FIT_MIN_POINTS:
        return None
    return (f"launch-bound on {device}: {above} of {len(s.sizes)} sizes ({s.impl}, N up to {max(s.sizes):,}) take "
            f"at least {LAUNCH_FACTOR:g}x the smallest time ({min(times) * 1e3:.3g} ms), fewer than the "
            f"{FIT_MIN_POINTS} a fit needs: the times are the device's per-call floor, not the work. The class is "
            f"judged on the CPU (python -m verify --only complexity/), and scale/<id> bounds the time at N = 2^20 "
            f"on this device")


def _run(mech: Mechanism, ctx: Context) -> Outcome:
    rule = claim_rule(mech.complexity)
    rounds = ROUNDS[ctx.quick]
    variant = mech.default_variant
    fs = _sweep(mech, "fast", ctx, rounds)
    if rule is None:
        fv = judged_times(fs)
        ff = fit_times(fv.sizes, fv.seconds)[1]
        return Outcome("skip", None if ff is None else ff.slope,
                       {"fast": {**_sweep_details(fs, fv), "fit": _fit_dict(ff)}, "threads": fs.threads,
                        "rounds": fs.rounds, "claimed": mech.complexity, "variant": variant.name, "clock": fv.clock,
                        "reasons": [], "reason": f"no slope test for {mech.complexity}"})
    ds = _sweep(mech, "dense", ctx, rounds) if mech.dense_setup is not None else None
    floor = launch_bound(fs, ctx.device)
    dense_floor = launch_bound(ds, ctx.device) if ds is not None else None
    if dense_floor is not None:  # the twin never left its floor: no speed-up test, the slope test stands
        ds = None
    if floor is not None:
        fv = judged_times(fs)
        return Outcome("skip", None, {"fast": _sweep_details(fs, fv), "threads": fs.threads, "rounds": fs.rounds,
                                      "claimed": mech.complexity, "variant": variant.name, "clock": fv.clock,
                                      "reasons": [], "reason": floor})
    j = _judge(mech, fs, ds, ctx)
    attempts = [_attempt(j, fs.rounds)]
    if j.verdict != "pass" and not fs.error and not (ds is not None and ds.error):
        ctx.note(f"{mech.id}: {j.verdict} on {fs.rounds} rounds; re-timing with {RETRY_ROUNDS[ctx.quick]} more")
        fs = _retime(mech, fs, ctx)
        ds = _retime(mech, ds, ctx) if ds is not None else None
        j = _judge(mech, fs, ds, ctx)
        attempts.append(_attempt(j, fs.rounds))
    details = {**j.details, "threads": fs.threads, "rounds": fs.rounds, "claimed": mech.complexity,
               "variant": variant.name, "clock": j.details["fast"]["clock"], "attempts": attempts}
    if dense_floor is not None:
        details["speedup_skipped"] = dense_floor
    if j.failed:
        return judged(False, j.statistic, j.failed + j.loaded + j.unsure, **details)
    if j.loaded:
        busy = j.details["busy"]
        reason = (f"inconclusive: {busy} (not a failure: after {fs.rounds} rounds these tests fail by less than "
                  f"load can explain; rerun on a quieter machine): " + "; ".join(j.loaded + j.unsure))
        return Outcome("inconclusive", j.statistic, {**details, "inconclusive": True, "reason": reason, "reasons": []})
    if j.unsure:
        reason = (f"inconclusive after {fs.rounds} rounds (not a failure: the estimates pass, the intervals are too "
                  "wide to decide): " + "; ".join(j.unsure))
        return Outcome("inconclusive", j.statistic, {**details, "inconclusive": True, "reason": reason, "reasons": []})
    return judged(True, j.statistic, [], **details)


def check_for(m: Mechanism) -> Check:
    """complexity/<id> of one record (registered or not)."""
    rule = claim_rule(m.complexity)
    compare, threshold = rule if rule else ("", None)
    return Check(f"complexity/{m.id}", f"{m.id} runs in O({m.complexity})", m.source, "complexity",
                 run=lambda ctx: _run(m, ctx), threshold=threshold, compare=compare, unit="exponent")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()]
