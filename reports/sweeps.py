"""In-process timing sweeps for every registered mechanism, with exponent fits and crossovers.

Thin layer over verify.timing (docs/methods.md, "Complexity and speed"): each (mechanism, impl) is
timed in ONE process over its whole N grid, interleaved over rounds, threads pinned to 1 by
``verify.timing.sweep``. The registry is iterated, never listed: a mechanism registered later
appears here with no wiring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
from tqdm.auto import tqdm

from verify.timing import MIN_FIT_S, Fit, Sweep, crossover, fit_exponent, fit_points, sweep

#: Threads the sweeps pin torch to (stated in the report).
SWEEP_THREADS = 1


@dataclass
class ImplTiming:
    """One implementation's sweep and its log-log fit (None when fewer than 3 sizes)."""

    sweep: Sweep
    fit: Fit | None

    def to_dict(self) -> dict:
        return {"sweep": self.sweep.to_dict(), "fit": None if self.fit is None else self.fit.to_dict()}


@dataclass
class MechanismTiming:
    """Fast path (and dense twin, if any) of one mechanism, plus the crossover N estimate.

    crossover: verify.timing.crossover's estimate of the smallest N where fast beats dense (the
    smallest common N if fast already wins there, else where the fitted lines meet, possibly
    extrapolated); None if it never does or there is no dense twin.
    measured_crossover: the smallest timed N from which fast beats dense at every larger common
    N, None if that does not happen inside the timed range (a cross-check on the estimate).
    """

    mechanism: str
    fast: ImplTiming
    dense: ImplTiming | None
    crossover: float | None
    measured_crossover: int | None = None

    def speedups(self) -> tuple[list[int], list[float]]:
        """t_dense / t_fast at the N both sweeps measured (empty without a dense twin)."""
        if self.dense is None:
            return [], []
        tf = dict(zip(self.fast.sweep.sizes, self.fast.sweep.seconds))
        td = dict(zip(self.dense.sweep.sizes, self.dense.sweep.seconds))
        common = sorted(set(tf) & set(td))
        return common, [td[n] / tf[n] for n in common]

    def to_dict(self) -> dict:
        sizes, ratio = self.speedups()
        return {
            "mechanism": self.mechanism,
            "fast": self.fast.to_dict(),
            "dense": None if self.dense is None else self.dense.to_dict(),
            "crossover": self.crossover,
            "measured_crossover": self.measured_crossover,
            "speedup": {"sizes": sizes, "t_dense_over_t_fast": ratio},
        }


def sweep_sizes(mech, impl: str, quick: bool) -> tuple[int, ...]:
    """The registry's N grid for ``impl`` ("fast" | "dense") in quick or full mode."""
    if impl == "fast":
        return tuple(mech.quick_fast_sizes if quick else mech.fast_sizes)
    return tuple(mech.quick_dense_sizes if quick else mech.dense_sizes)


def fit_sweep(s: Sweep) -> Fit | None:
    """The exponent fit the report shows: points under MIN_FIT_S are overhead-dominated and left
    out (verify.timing keeps at least the largest 4); None for grids of < 3 sizes, which have no
    t-interval (the points are still shown)."""
    return fit_exponent(s.sizes, s.seconds, min_seconds=MIN_FIT_S) if len(s.sizes) >= 3 else None


def fitted_mask(sizes, seconds) -> np.ndarray:
    """Which points ``fit_sweep`` uses (verify.timing.fit_points with MIN_FIT_S), so the figure
    can draw the left-out points hollow."""
    return fit_points(sizes, seconds, MIN_FIT_S)


def analyse(fast: Sweep, dense: Sweep | None) -> MechanismTiming:
    """Fit both sweeps and estimate the crossover (pure: usable on injected or loaded sweeps)."""
    ft = ImplTiming(fast, fit_sweep(fast))
    dt = None if dense is None else ImplTiming(dense, fit_sweep(dense))
    timing = MechanismTiming(fast.mechanism, ft, dt, None)
    if dt is not None and ft.fit is not None and dt.fit is not None:
        timing.crossover = crossover(fast, dense)
    sizes, ratio = timing.speedups()
    # Walk down from the largest common N while fast still wins: noise at one small N must not
    # make the crossover look earlier than it is.
    for n, r in zip(reversed(sizes), reversed(ratio)):
        if r <= 1.0:
            break
        timing.measured_crossover = n
    return timing


def run_sweeps(
    mechs: Iterable,
    quick: bool,
    device: str = "cpu",
    rounds: int = 3,
    progress: bool = True,
) -> dict[str, MechanismTiming]:
    """Sweep every mechanism's fast path and dense twin; one tqdm bar over all measurements."""
    mechs = list(mechs)
    jobs = [(m, impl) for m in mechs for impl in ("fast", "dense")
            if impl == "fast" or m.dense_setup is not None]
    total = sum(rounds * len(sweep_sizes(m, impl, quick)) for m, impl in jobs)
    out: dict[str, MechanismTiming] = {}
    with tqdm(total=total, desc="sweeps", unit="pt", disable=not progress) as bar:
        done: dict[str, dict[str, Sweep]] = {}
        for m, impl in jobs:
            bar.set_postfix_str(f"{m.id}/{impl}")
            done.setdefault(m.id, {})[impl] = sweep(
                m, impl, sweep_sizes(m, impl, quick), rounds=rounds, device=device,
                threads=SWEEP_THREADS, progress=bar)
        for m in mechs:
            out[m.id] = analyse(done[m.id]["fast"], done[m.id].get("dense"))
    return out
