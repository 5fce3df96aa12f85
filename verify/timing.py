"""In-process, interleaved timing sweeps and exponent fits (docs/methods.md, "Complexity and speed").

All N of one mechanism are timed in ONE process, interleaved round by round (so slow drifts of
the machine hit every N alike), and each point is the median over rounds. asv runs every
parameter in its own process, which here spreads by up to 2x: fit exponents from these sweeps.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy import stats

#: Minimum wall time of one measurement; calls are repeated until it is reached.
MIN_MEASURE_S = 0.02


@contextlib.contextmanager
def pinned_threads(n: int | None = 1):
    """Pin torch intra-op threads for a fit (docs/methods.md), restoring the previous setting."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure(runner, device: str = "cpu", min_time: float = MIN_MEASURE_S) -> float:
    """Seconds per call of ``runner()``: repeat until ``min_time`` has passed, return the mean."""
    calls, start = 0, time.perf_counter()
    while True:
        runner()
        _sync(device)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


@dataclass
class Sweep:
    """Median seconds per call for each N of one (mechanism, implementation)."""

    mechanism: str
    impl: str  # "fast" | "dense"
    device: str
    dtype: str
    threads: int | None
    sizes: list[int]
    seconds: list[float]
    rounds: int
    all_rounds: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def sweep(
    mech,
    impl: str = "fast",
    sizes: tuple[int, ...] | None = None,
    *,
    rounds: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = 1,
    seed: int = 0,
    progress=None,
) -> Sweep:
    """Time ``mech`` (a registry Mechanism) over ``sizes``, interleaved over ``rounds``.

    Setup (inputs to tensors, mask operators) is untimed; one warm-up call per N precedes timing.
    progress: optional tqdm-like object with ``update(1)`` called after each measurement.
    """
    if impl not in ("fast", "dense"):
        raise ValueError(f"impl must be 'fast' or 'dense', got {impl!r}")
    setup = mech.fast_setup if impl == "fast" else mech.dense_setup
    if setup is None:
        raise ValueError(f"mechanism {mech.id!r} has no {impl} implementation")
    sizes = tuple(sizes or (mech.fast_sizes if impl == "fast" else mech.dense_sizes))
    with pinned_threads(threads), torch.inference_mode():
        runners = []
        for n in sizes:
            r = setup(mech.make_problem(n, seed), device, dtype)
            r()  # warm-up
            _sync(device)
            runners.append(r)
        table = np.zeros((rounds, len(sizes)))
        for i in range(rounds):
            for j, r in enumerate(runners):
                table[i, j] = measure(r, device)
                if progress is not None:
                    progress.update(1)
    return Sweep(mech.id, impl, str(device), str(dtype).replace("torch.", ""), threads, list(sizes),
                 list(np.median(table, axis=0)), rounds, table.tolist())


@dataclass
class Fit:
    """log t = intercept + slope log N: least squares with a t-interval, plus Theil-Sen.

    ``low``/``high`` bound ``slope`` at ``confidence`` (Student t with len(N) - 2 dof);
    ``robust_slope`` is the Theil-Sen median slope, reported as a cross-check on outliers.
    """

    slope: float
    low: float
    high: float
    intercept: float
    confidence: float
    robust_slope: float

    def to_dict(self) -> dict:
        return asdict(self)


#: Points faster than this are dominated by fixed overheads and left out of fits (docs/methods.md).
MIN_FIT_S = 1e-3


def fit_points(sizes, seconds, min_seconds: float = 0.0) -> np.ndarray:
    """Boolean mask of the points a fit uses: t >= min_seconds (overheads dominate faster
    points), but at least the largest 4 (or all, if fewer)."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    keep = seconds >= min_seconds
    if keep.sum() < 4:
        keep = np.zeros(len(sizes), bool)
        keep[np.argsort(sizes)[-4:]] = True
    return keep


def fit_exponent(sizes, seconds, confidence: float = 0.95, min_seconds: float = 0.0) -> Fit:
    """Slope of log t vs log N with its two-sided ``confidence`` interval (docs/methods.md).

    min_seconds: fit only the points ``fit_points`` keeps.
    """
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    keep = fit_points(sizes, seconds, min_seconds)
    sizes, seconds = sizes[keep], seconds[keep]
    x, y = np.log(sizes), np.log(seconds)
    if len(x) < 3:
        raise ValueError(f"need >= 3 sizes to fit an exponent, got {len(x)}")
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 2) * res.stderr
    robust = stats.theilslopes(y, x)[0]
    return Fit(float(res.slope), float(res.slope - half), float(res.slope + half), float(res.intercept),
               confidence, float(robust))


def crossover(fast: Sweep, dense: Sweep) -> float | None:
    """The N where the fast path starts beating its dense twin, from the measured ratio.

    Log-log interpolation of t_dense / t_fast between the common sizes where it crosses 1.
    If fast already wins at the smallest common N, that N is returned (an upper bound on the
    crossover); if dense wins at every common N, the two fitted lines are extrapolated; None if
    they never meet.
    """
    common = sorted(set(fast.sizes) & set(dense.sizes))
    tf, td = dict(zip(fast.sizes, fast.seconds)), dict(zip(dense.sizes, dense.seconds))
    ratio = [td[n] / tf[n] for n in common]
    if common and ratio[0] >= 1:
        return float(common[0])
    for (n0, r0), (n1, r1) in zip(zip(common, ratio), zip(common[1:], ratio[1:])):
        if r0 < 1 <= r1:
            frac = -math.log(r0) / (math.log(r1) - math.log(r0))
            return float(math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0))))
    ff, fd = fit_exponent(fast.sizes, fast.seconds), fit_exponent(dense.sizes, dense.seconds)
    if fd.slope <= ff.slope:
        return None
    return float(math.exp((ff.intercept - fd.intercept) / (fd.slope - ff.slope)))


def environment() -> dict:
    """Facts that qualify a timing: threads, torch version, CPU count."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
    }
