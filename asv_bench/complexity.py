"""The fitted complexity exponent of every registered mechanism's fast path, across commits.

One class per registered mechanism (same names as in attention.py), no parameters:

    complexity.causal.track_exponent      unit "exponent"

The value is the slope of log t against log N from a small in-process sweep of the default
variant's fast path: measure.timing.sweep over EXPONENT_POINTS sizes a factor GRID_FACTOR apart
(4 points over 64x = 1.8 decades), one torch thread, SWEEP_ROUNDS interleaved rounds, median per
N; then the project's one fit rule (measure.timing.fit_times: points under MIN_FIT_S are left
out, but the largest four always enter, so with four points all of them do), kept to 4
significant digits (common.significant). For a mechanism
with a cost factor (complexity "N diam": the diameter) the fitted quantity is time / cost
factor, the points chosen by raw time, as verify's complexity check does. So every value reads
against the exponent of the class without log factors: about 1 for "N" (below at these N, where
fixed per-call costs still show: far below for the cheapest, e.g. difformer ~0.5, as
docs/benchmarks.md explains), a little above 1 for "N log N", about 2 for "N^2".

Why here, and how it differs from verify: asv spreads time_attention's points over separate
processes (up to 2x apart on our 2-core machines), so a slope fitted from them is noise; this
sweep times all N in one process, as docs/methods.md asks. It is shorter than the complexity
check's (4 points, 3 rounds, top N at most the quick sweep's), so the 23 mechanisms take about
40 s per commit here; the pass/fail thresholds stay in verify/checks/complexity.py. A jump
in this series across commits means a change altered how the fast path scales, not only its
speed.

The top N of each grid comes from the class (TOP_N), capped by the mechanism's quick sweep grid;
one call at the top takes ~0.05-1 s here. The grid is fixed per mechanism (not adapted to the
measured speed), so commits are compared on the same N.
"""
from __future__ import annotations

import inspect

import numpy as np

from verify.registry import Mechanism

try:  # the timing module in measure/ from issue 22 on; older commits (asv runs them) keep it in verify/
    from measure import timing
except ImportError:
    from verify import timing

MIN_FIT_S, fit_exponent, fit_points, sweep = timing.MIN_FIT_S, timing.fit_exponent, timing.fit_points, timing.sweep
#: The one fit rule as a function, from this issue on; older commits: applied from fit_points and
#: fit_exponent below.
fit_times = getattr(timing, "fit_times", None)

from . import common

#: Sizes per sweep, and the factor between neighbours: 4 points over 4^3 = 64x (1.8 decades).
EXPONENT_POINTS = 4
GRID_FACTOR = 4
#: Interleaved rounds of the sweep (median per N); each measurement lasts >= 20 ms.
SWEEP_ROUNDS = 3
#: Largest N by claimed class: one fast call there takes ~0.05-1 s on our machines
#: (linear 55 ms at 2^16; block-toeplitz, the costliest, 1.1 s at 2^15).
TOP_N = {"N": 2**16, "N log N": 2**15, "N log^2 N": 2**14, "N diam": 2**14, "N + E": 2**14, "N^2": 2**12}
#: For a class TOP_N does not list.
DEFAULT_TOP_N = 2**14


def exponent_grid(mech: Mechanism) -> list[int]:
    """The N of ``mech``'s exponent sweep, ascending (fewer than EXPONENT_POINTS: not run).

    top = min(TOP_N[class], the largest N of the quick fast sweep), then top / GRID_FACTOR^k for
    k = EXPONENT_POINTS-1 .. 0, each mapped to an N the mechanism is defined at.
    """
    quick = getattr(mech, "quick_fast_sizes", None) or mech.fast_sizes
    top = min(TOP_N.get(mech.complexity, DEFAULT_TOP_N), max(quick))
    wanted = [top // GRID_FACTOR**k for k in reversed(range(EXPONENT_POINTS))]
    return sorted({common.admissible(mech, n) for n in wanted if n >= 2})


def _sweep_kwargs(mech: Mechanism) -> dict:
    """The default variant, where this commit's measure.timing.sweep takes one."""
    if "variant" in inspect.signature(sweep).parameters and hasattr(mech, "default_variant"):
        return {"variant": mech.default_variant.name}
    return {}


def _fit(sizes, seconds, cost_factors) -> float:
    """The fitted slope under the installed commit's fit rule (with cost factors: of t / factor)."""
    if fit_times is not None:  # the one fit rule, measure.timing.fit_times (this issue on)
        _, fit, cost_fit = fit_times(sizes, seconds, cost_factors)
        chosen = fit if cost_factors is None else cost_fit
        if chosen is None:
            raise ValueError(f"too few points to fit at N = {list(sizes)} (seconds {list(seconds)})")
        return chosen.slope
    # older commits: the same rule from its parts (points chosen by raw time)
    n, t = np.asarray(sizes, float), np.asarray(seconds, float)
    keep = fit_points(n, t, MIN_FIT_S)
    y = t if cost_factors is None else t / np.asarray(cost_factors, float)
    return fit_exponent(n[keep], y[keep]).slope


def fitted_exponent(mech: Mechanism, sizes: list[int], rounds: int = SWEEP_ROUNDS) -> float:
    """Sweep ``mech``'s fast path over ``sizes`` in this process and return the fitted slope.

    With a cost factor, the slope of (seconds / cost factor) vs N on the points the raw times
    qualify; without one, of seconds vs N. A sweep that stopped on an error raises it (asv then
    shows the benchmark as failed for this commit).
    """
    result = sweep(mech, "fast", tuple(sizes), rounds=rounds, threads=1, seed=common.SEED, **_sweep_kwargs(mech))
    if getattr(result, "error", None):
        raise RuntimeError(f"{mech.id}: the exponent sweep stopped at {result.error}")
    factor = common.cost_factor(mech)
    cost_factors = None
    if factor is not None:
        cost_factors = getattr(result, "cost_factors", None) or [
            float(factor(common.make_problem(mech, int(k)))) for k in result.sizes]
    return _fit(result.sizes, result.seconds, cost_factors)


class _ExponentBenchmark:
    """Template of the generated classes (the leading underscore hides it from asv)."""

    mechanism: Mechanism  # set on each generated class
    sizes: list[int]  # set on each generated class
    unit = "exponent"
    # One process per commit: the sweep interleaves its own rounds in-process.
    rounds = 1
    timeout = 300.0

    def setup(self):
        common.pin_threads()
        if len(self.sizes) < EXPONENT_POINTS:
            raise NotImplementedError(f"{self.mechanism.id}: exponent grid {self.sizes} has fewer than "
                                      f"{EXPONENT_POINTS} sizes (registry fast sizes too small)")

    def track_exponent(self):
        return common.significant(fitted_exponent(self.mechanism, self.sizes))


def _benchmark_class(mech: Mechanism) -> type:
    sizes = exponent_grid(mech)
    what = "time / " + (getattr(mech, "cost_factor_name", "") or "cost factor") if common.cost_factor(mech) else "time"
    return type(
        common.class_name(mech.id),
        (_ExponentBenchmark,),
        {
            "__module__": __name__,
            "__doc__": f"{mech.id}: fitted exponent of {what} vs N of the fast path at N = {sizes} "
                       f"(claim O({mech.complexity})).",
            "mechanism": mech,
            "sizes": sizes,
        },
    )


def _register_all() -> None:
    common.install_classes(globals(), [_benchmark_class(mech) for mech in common.mechanisms()])


_register_all()
