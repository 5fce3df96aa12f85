"""In-process, interleaved timing sweeps, the one fit rule, exponent fits and crossovers
(docs/methods.md, "Complexity and speed").

All N of one (mechanism, variant, implementation) are timed in ONE process, interleaved round by
round (so slow drifts of the machine hit every N alike), and each point is the median over
rounds. asv runs every parameter in its own process, which here spreads by up to 2x: fit
exponents from these sweeps.

Two clocks. ``seconds`` / ``all_rounds`` are wall seconds per call (what a user waits; the report
draws them). A sweep on the CPU with one torch thread also records ``cpu_rounds``: the CPU seconds
per call of the whole process (user + system over all its threads, ``time.process_time``), read
around the same measurements. The work of such a call is single-threaded, so its CPU seconds are
its cost, and they do not count the time the thread waits for a core: on a loaded machine wall
times rise and scatter with the load while CPU seconds stay close to the idle wall times.
Contention (``wait_share``, ``machine_busy``): beside each CPU measurement the sweep records the
share of its wall time the timing thread did not run (1 - CPU / wall, ``wait_rounds``), and the
1-minute load average before and after (``load``), so a check can tell a busy machine from a
slow path. ``Sweep.cpu_view`` gives the sweep on that clock with each point the MINIMUM over rounds (load only
adds CPU time, through shared caches and memory bandwidth, so the least disturbed round is the
best estimate of the cost); verify.checks.complexity judges on it. ``merge_rounds`` pools the
rounds of a re-timed sweep with the first one (the checks' retry).

The fit rule (``fit_points``, used by every timing fit: sweeps, comparisons, the complexity
checks, the report): a point enters the fit when its time is at least MIN_FIT_S (faster points
are dominated by fixed overheads), but the largest FIT_MIN_POINTS sizes always do (all points
when there are fewer). ``fit_times`` applies it; ``fit_exponent`` is the plain log-log regression
underneath (also used for quantities that are not times, e.g. speed-up ratios and RMSEs, with the
rule applied to the times they come from).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch
from scipy import stats

from results.schema import Comparison, Fit, SweepResult

__all__ = ["BUSY_LOAD_PER_CPU", "BUSY_WAIT_SHARE", "wait_share", "load_average", "machine_busy", "MIN_MEASURE_S", "MIN_FIT_S", "FIT_MIN_POINTS", "CLOCKS", "Fit", "Sweep", "pinned_threads", "measure",
           "cpu_clock_applies", "sweep", "sweep_key", "merge_rounds", "fit_points", "fit_exponent", "fit_times",
           "crossover", "crossover_interval", "speedup_interval", "compare", "measured_crossover", "environment"]

#: Minimum wall time of one measurement; calls are repeated until it is reached.
MIN_MEASURE_S = 0.02
#: Points faster than this are dominated by fixed overheads and left out of fits (docs/methods.md).
MIN_FIT_S = 1e-3
#: ... but a fit always keeps at least the largest this many sizes (all of them when fewer).
FIT_MIN_POINTS = 4
#: Bootstrap replicates of the crossover interval (``crossover_interval``).
CROSSOVER_REPLICATES = 2000
#: The clocks a Sweep's seconds can be on, and how a point summarises its rounds on each.
CLOCKS = {"wall": "median", "cpu": "min"}
#: A sweep's machine was busy when the timing thread waited for a core this share of the wall time
#: of its measurements (median over them; 0-0.05 on an idle machine, about 0.5 beside one CPU
#: burner per core) ...
BUSY_WAIT_SHARE = 0.15
#: ... or when the other processes' load (the 1-minute load average less the timing thread) reached
#: this many per CPU: neighbours on the other cores share the caches and the memory bandwidth, which
#: raises CPU seconds per call (0-30% here) without any wait.
BUSY_LOAD_PER_CPU = 0.5


def wait_share(cpu_seconds: float, wall_seconds: float) -> float:
    """The share of a single-threaded measurement's wall time its thread did not run: 1 - CPU / wall,
    clipped to [0, 1] (0: it had a core throughout). NaN when the wall time is not positive.

    >>> from measure.timing import wait_share
    >>> wait_share(0.01, 0.04), wait_share(0.02, 0.02)
    (0.75, 0.0)
    """
    if not wall_seconds > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - cpu_seconds / wall_seconds))


def load_average() -> float | None:
    """The 1-minute load average (os.getloadavg), None where the system has none.

    >>> from measure.timing import load_average
    >>> load_average() is None or load_average() >= 0
    True
    """
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def machine_busy(load, waits, cpus: int | None = None) -> str | None:
    """Why the machine was too busy to trust a timing fit, or None: the median of ``waits`` (wait
    shares, NaN ignored) is at least BUSY_WAIT_SHARE, or the largest of ``load`` (1-minute load
    averages sampled around the sweeps; None entries ignored) less 1 (the timing thread itself) is at
    least BUSY_LOAD_PER_CPU x ``cpus`` (default os.cpu_count()).

    >>> from measure.timing import machine_busy
    >>> machine_busy([1.1, 0.9], [0.01, 0.02], cpus=2) is None
    True
    >>> machine_busy([4.2], [0.5, 0.6], cpus=2)
    'machine busy: load average 4.2 on 2 CPUs, the timing thread waited for a core 55% of its time'
    """
    cpus = cpus or os.cpu_count() or 1
    loads = [float(x) for x in (load or []) if x is not None and math.isfinite(x)]
    shares = np.asarray([w for w in (waits or []) if w is not None], float)
    shares = shares[np.isfinite(shares)]
    wait = float(np.median(shares)) if shares.size else None
    peak = max(loads) if loads else None
    if not ((wait is not None and wait >= BUSY_WAIT_SHARE)
            or (peak is not None and peak - 1.0 >= BUSY_LOAD_PER_CPU * cpus)):
        return None
    said = [] if peak is None else [f"load average {peak:.2g} on {cpus} CPUs"]
    if wait is not None:
        said.append(f"the timing thread waited for a core {wait:.0%} of its time")
    return "machine busy: " + ", ".join(said)


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


#: glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_MAX.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: glibc's defaults, restored after a sweep (the trim threshold's dynamic adjustment stays off).
_GLIBC_MMAP_MAX, _GLIBC_TRIM_THRESHOLD = 65536, 128 * 1024
#: M_TRIM_THRESHOLD -1: never trim the heap (mallopt(3)); any finite int (at most 2 GiB) is
#: exceeded by the temporaries of some sweep (softmax at N = 2^14: 1.75 GiB), see steady_heap.
_NO_TRIM = -1


def _libc():
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") else None
    except OSError:  # not glibc (macOS, musl): nothing to steady
        return None


@contextlib.contextmanager
def steady_heap():
    """Serve every allocation from the heap and keep freed memory there while a CPU sweep times.

    glibc serves a large request with a fresh mmap, above a threshold that adapts up to 32 MiB, and
    returns it to the kernel when freed: a call above that size then page-faults its buffers in
    again at every call, and below it reuses the heap. The fault cost is the kernel's, and its
    regime change bends a fit: packing at N = 2^16 (d = m = 16) took 33 538 faults and 53 of its
    81 ms of CPU per call in system time here, 9.5x the faults of N = 2^14, a slope of 1.45 where
    the arithmetic's is 0.97. With mmap off (M_MMAP_MAX = 0) and trimming off (M_TRIM_THRESHOLD
    -1, "disables trimming completely", mallopt(3)) the buffers of the warm-up call are reused.
    A finite threshold is not enough: softmax at N = 2^14 frees about 1.75 GiB of temporaries, and
    with a 1 GiB threshold glibc trimmed the heap in whichever later call's free merged them into
    the top chunk, which depended on the process's heap layout: in about half the processes N = 512
    paid 90-185 ms of system time per call for returning the pages (0.65 ms of user time, 100x its
    cost, no page faults) and the larger N faulted them back in. glibc only (elsewhere a no-op); the
    memory measurements run in child processes of their own and are not affected.
    """
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _NO_TRIM)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)  # the heap kept for the sweep goes back to the system


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)  # that device's queue (a bare call waits for the current one only)


def measure(runner: Callable[[], Any], device: str = "cpu", min_time: float = MIN_MEASURE_S) -> float:
    """Wall seconds per call of ``runner()``: repeat until ``min_time`` has passed, return the mean.

    ``sweep`` reads the process CPU time around this call as well (``cpu_clock_applies``), and
    counts the calls through a wrapper of the runner, so a replacement of this function (tests)
    needs only this signature.
    """
    calls, start = 0, time.perf_counter()
    while True:
        runner()
        _sync(device)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def cpu_clock_applies(device, threads: int | None) -> bool:
    """Whether a sweep records CPU seconds (``Sweep.cpu_rounds``): on the CPU with one pinned torch
    thread, where a call's work is single-threaded. Not on an accelerator (the host thread waits
    for the device), nor with several threads (OpenMP threads that spin while they wait count as
    CPU time)."""
    return str(device).split(":")[0] == "cpu" and threads == 1


class Counted:
    """``runner`` that counts its calls (CPU seconds per call = the CPU time of a measurement / calls).

    >>> from measure.timing import Counted
    >>> f = Counted(lambda: 2)
    >>> f(), f(), f.calls
    (2, 2, 2)
    """

    __slots__ = ("runner", "calls")

    def __init__(self, runner: Callable[[], Any]):
        self.runner, self.calls = runner, 0

    def __call__(self):
        self.calls += 1
        return self.runner()


# ------------------------------------------------------------------------------ the fit rule


def fit_points(sizes, seconds, min_seconds: float = MIN_FIT_S) -> np.ndarray:
    """Boolean mask of the points a timing fit uses: t >= min_seconds (overheads dominate faster
    points), but at least the largest FIT_MIN_POINTS sizes (or all, if fewer). The one rule."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    if sizes.shape != seconds.shape:
        raise ValueError(f"sizes and seconds must have the same length, got {sizes.shape} and {seconds.shape}")
    keep = seconds >= min_seconds
    if keep.sum() < FIT_MIN_POINTS:
        keep = np.zeros(len(sizes), bool)
        keep[np.argsort(sizes, kind="stable")[-FIT_MIN_POINTS:]] = True
    return keep


def fit_exponent(sizes, values, confidence: float = 0.95, min_seconds: float | None = None) -> Fit:
    """Slope of log y vs log N with its two-sided ``confidence`` interval (docs/methods.md).

    A plain least-squares fit of every point given, unless ``min_seconds`` is set: then ``values``
    are times and only the points ``fit_points(sizes, values, min_seconds)`` keeps are fitted.
    ValueError with fewer than 3 points (no t-interval).
    """
    sizes, values = np.asarray(sizes, float), np.asarray(values, float)
    if min_seconds is not None:
        keep = fit_points(sizes, values, min_seconds)
        sizes, values = sizes[keep], values[keep]
    if len(sizes) < 3:
        raise ValueError(f"need >= 3 sizes to fit an exponent, got {len(sizes)}")
    if not (np.all(sizes > 0) and np.all(values > 0)):
        raise ValueError("a log-log fit needs positive sizes and values")
    x, y = np.log(sizes), np.log(values)
    res = stats.linregress(x, y)
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 2) * res.stderr
    robust = stats.theilslopes(y, x)[0]
    return Fit(float(res.slope), float(res.slope - half), float(res.slope + half), float(res.intercept),
               confidence, float(robust))


def fit_times(sizes, seconds, cost_factors=None, confidence: float = 0.95
              ) -> tuple[list[bool], Fit | None, Fit | None]:
    """The timing fit of one sweep: (fitted mask, fit of t vs N, fit of t / cost factor vs N).

    Points are chosen by ``fit_points`` on the raw times (the same points for both fits). A fit is
    None when fewer than 3 points are kept, or (cost fit) without cost factors at every point.
    """
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(sizes) == 0:
        return [], None, None
    keep = fit_points(sizes, seconds)
    fit = cost_fit = None
    if keep.sum() >= 3:
        fit = fit_exponent(sizes[keep], seconds[keep], confidence)
        if cost_factors is not None and len(cost_factors) == len(sizes) and all(
                c is not None and c > 0 for c in cost_factors):
            per = seconds / np.asarray(cost_factors, float)
            cost_fit = fit_exponent(sizes[keep], per[keep], confidence)
    return [bool(k) for k in keep], fit, cost_fit


# ------------------------------------------------------------------------------ sweeps


@dataclass
class Sweep:
    """Median seconds per call for each N of one (mechanism, variant, implementation).

    all_rounds[r][i]: round r at sizes[i] (NaN: skipped by a point budget; seconds = the median of
    the rounds done). cpu_rounds[r][i]: the same measurement in CPU seconds of the process per call
    (``cpu_clock_applies``; None where not recorded). clock, summary: what seconds and all_rounds
    hold ("wall" and "median" for a measured sweep; ``cpu_view`` gives "cpu" and "min").
    point_budget: the sweep's (None: every round at every N). wait_rounds[r][i]: ``wait_share`` of
    that measurement (with cpu_rounds); load: the 1-minute load averages sampled before and after
    the sweep (``Sweep.busy``). cost_factors[i]:
    mech.cost_factor of the problem at sizes[i] (None without one); metrics: {name: [value at
    each size]} from mech.metrics. error, error_n: the first exception ("N = n: Type: message")
    and its N; larger N were not tried, the points before it are kept.
    """

    mechanism: str
    impl: str  # "fast" | "dense"
    device: str
    dtype: str
    threads: int | None
    sizes: list[int]
    seconds: list[float]
    rounds: int
    all_rounds: list[list[float]] = field(default_factory=list)
    variant: str = "default"
    seed: int = 0
    cost_factors: list[float] | None = None
    metrics: dict[str, list[float | None]] = field(default_factory=dict)
    error: str | None = None
    error_n: int | None = None
    point_budget: float | None = None
    cpu_rounds: list[list[float]] | None = None
    wait_rounds: list[list[float]] | None = None
    load: list[float | None] = field(default_factory=list)
    clock: str = "wall"
    summary: str = "median"

    def to_dict(self) -> dict:
        return asdict(self)

    def busy(self, cpus: int | None = None) -> str | None:
        """``machine_busy`` of this sweep's load samples and wait shares (None: it was not busy)."""
        waits = [w for row in (self.wait_rounds or []) for w in row]
        return machine_busy(self.load, waits, cpus)

    def cpu_view(self) -> "Sweep | None":
        """This sweep on the CPU clock: all_rounds = cpu_rounds and each point the minimum over its
        rounds (CLOCKS["cpu"]), the times verify.checks.complexity judges. None when CPU seconds
        were not recorded, or some point has no positive CPU time (a replaced ``measure``)."""
        if self.clock == "cpu":
            return self
        if not self.cpu_rounds or not self.sizes:
            return None
        table = np.asarray(self.cpu_rounds, float)
        if table.ndim != 2 or table.shape[1] != len(self.sizes):
            return None
        done = np.isfinite(table)
        if not done.any(axis=0).all() or not (table[done] > 0).all():
            return None
        mins = np.nanmin(table, axis=0)
        return replace(self, seconds=[float(x) for x in mins], all_rounds=table.tolist(), clock="cpu",
                       summary=CLOCKS["cpu"])

    def at_sizes(self, sizes) -> "Sweep":
        """This sweep restricted to ``sizes`` (each one of its sizes, kept in the sweep's order):
        every per-point field (seconds, rounds, CPU and wait rounds, cost factors, metrics) sliced
        alike. ValueError naming a size the sweep lacks.

        >>> from measure.timing import Sweep
        >>> s = Sweep("m", "fast", "cpu", "float32", 1, [1, 2, 4], [1.0, 2.0, 4.0], 1, [[1.0, 2.0, 4.0]])
        >>> s.at_sizes([4, 1]).sizes, s.at_sizes([4, 1]).all_rounds
        ([1, 4], [[1.0, 4.0]])
        """
        want = {int(n) for n in sizes}
        missing = sorted(want - set(self.sizes))
        if missing:
            raise ValueError(f"sizes {missing} are not among the sweep's {self.sizes}")
        keep = [i for i, n in enumerate(self.sizes) if n in want]

        def cols(rows):
            return None if rows is None else [[row[i] for i in keep] for row in rows]

        return replace(self, sizes=[self.sizes[i] for i in keep], seconds=[self.seconds[i] for i in keep],
                       all_rounds=cols(self.all_rounds) or [], cpu_rounds=cols(self.cpu_rounds),
                       wait_rounds=cols(self.wait_rounds),
                       cost_factors=None if self.cost_factors is None else [self.cost_factors[i] for i in keep],
                       metrics={k: [v[i] for i in keep] for k, v in self.metrics.items()},
                       error=self.error if self.error_n is None or self.error_n in want else None,
                       error_n=self.error_n if self.error_n in want else None)

    def fitted(self) -> list[bool]:
        """Which points the fit uses (``fit_points``)."""
        return fit_times(self.sizes, self.seconds)[0]

    def fit(self) -> Fit | None:
        """The exponent fit of time vs N under the one fit rule (None below 3 fitted points)."""
        return fit_times(self.sizes, self.seconds)[1]

    def to_result(self) -> SweepResult:
        """The results-JSON record (results.schema.SweepResult) with the fits filled in."""
        fitted, fit, cost_fit = fit_times(self.sizes, self.seconds, self.cost_factors)
        return SweepResult(
            mechanism=self.mechanism, variant=self.variant, impl=self.impl, device=self.device, dtype=self.dtype,
            threads=self.threads, rounds=self.rounds, sizes=list(self.sizes), seconds=list(self.seconds),
            all_rounds=[list(r) for r in self.all_rounds], fitted=fitted, fit=fit,
            cost_factors=None if self.cost_factors is None else list(self.cost_factors), cost_fit=cost_fit,
            metrics={k: list(v) for k, v in self.metrics.items()}, error=self.error, error_n=self.error_n)


def sweep_key(mech_id: str, variant: str, impl: str, sizes, rounds: int, device, seed: int,
              point_budget: float | None = None) -> tuple:
    """The key of a sweep in a cache (results.check.Context.sweeps): (mechanism, variant, impl,
    sizes, rounds, device, seed), plus ("point_budget", s) for a sweep taken with one."""
    key = (mech_id, variant, impl, tuple(int(n) for n in sizes), int(rounds), str(device), int(seed))
    return key if point_budget is None else key + (("point_budget", float(point_budget)),)


def covering_sweep(cache: dict | None, mech_id: str, variant: str, impl: str, sizes, rounds: int, device,
                   seed: int, dtype: str = "float32", threads: int | None = 1) -> "Sweep | None":
    """A cached sweep that answers for a request on ``sizes`` and ``rounds``: same mechanism, variant,
    impl, device, seed, dtype and threads, no point budget, no error, every requested N among its
    sizes and at least as many rounds (None if there is none). measure's full sweeps cover the
    quick grid, so the checks of a report fit the very sweep the report shows (one exponent)."""
    want = {int(n) for n in sizes}
    for key, hit in (cache or {}).items():
        if len(key) != 7 or key[:3] != (mech_id, variant, impl) or key[5:] != (str(device), int(seed)):
            continue
        if (hit.error is None and hit.dtype == dtype and hit.threads == threads and key[4] >= rounds
                and want <= set(hit.sizes)):
            return hit
    return None


def sweep(
    mech,
    impl: str = "fast",
    sizes: tuple[int, ...] | None = None,
    *,
    variant: str | None = None,
    rounds: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = 1,
    seed: int = 0,
    progress=None,
    cache: dict | None = None,
    point_budget: float | None = None,
) -> Sweep:
    """Time ``mech`` (a registry Mechanism) on ``variant`` over ``sizes``, interleaved over ``rounds``.

    sizes: None takes the registry's full grid, ``mech.sizes(impl, False, variant)``.
    variant: a registry variant name (None: the default variant).
    Setup (problem, cost factor, metrics, tensors, mask operators) is untimed; one warm-up call per
    N precedes timing. An exception at one N (setup or timing) is recorded in ``error``/``error_n``
    and stops larger N; the points before it are kept (never raises for it).
    progress: optional tqdm-like object; ``update(k)`` adds up to rounds * len(sizes) in all.
    cache: a dict (results.check.Context.sweeps) keyed by ``sweep_key``: a hit with the same dtype
    and threads is returned without timing; a miss is stored.
    point_budget: seconds of timed measurements after which an N gets no further round (at least
    one round each; its skipped rounds are NaN in ``all_rounds`` and ``seconds`` is the median of
    the rounds done). None: every N gets every round. Slow points are the least noisy, so this
    trades little precision for much time (measure uses it for the non-default variants).
    CPU seconds: where ``cpu_clock_applies(device, threads)``, every measurement also records the
    process CPU seconds per call in ``cpu_rounds`` (``Sweep.cpu_view``); the wall times are
    unchanged by it.
    """
    if impl not in ("fast", "dense"):
        raise ValueError(f"impl must be 'fast' or 'dense', got {impl!r}")
    setup = mech.fast_setup if impl == "fast" else mech.dense_setup
    if setup is None:
        raise ValueError(f"mechanism {mech.id!r} has no {impl} implementation")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    v = mech.variant(variant)
    sizes = tuple(int(n) for n in (sizes if sizes is not None else mech.sizes(impl, False, v)))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be a non-empty sequence of positive N, got {sizes}")
    dtype_name = str(dtype).replace("torch.", "")
    if point_budget is not None and not point_budget > 0:
        raise ValueError(f"point_budget must be > 0 seconds or None, got {point_budget!r}")
    key = sweep_key(mech.id, v.name, impl, sizes, rounds, device, seed, point_budget)
    total = rounds * len(sizes)
    if cache is not None and key in cache:
        hit = cache[key]
        if hit.dtype == dtype_name and hit.threads == threads:
            if progress is not None:
                progress.update(total)
            return hit
    done = 0
    error = error_n = None
    ok_sizes: list[int] = []
    cost: list[float | None] = []
    metric_rows: list[dict] = []
    on_host = str(device).split(":")[0] == "cpu"
    load_before = load_average()
    with pinned_threads(threads), torch.inference_mode(), (steady_heap() if on_host else contextlib.nullcontext()):
        runners = []
        for n in sizes:
            try:
                problem = mech.problem(n, seed, v)
                cf = None if mech.cost_factor is None else float(mech.cost_factor(problem))
                mt = {} if mech.metrics is None else dict(mech.metrics(problem) or {})
                r = setup(problem, device, dtype)
                del problem  # the runner holds what it needs
                r()  # warm-up
                _sync(device)
            except Exception as exc:  # noqa: BLE001 - recorded on the sweep, larger N not tried
                error, error_n = f"N = {n:,}: {type(exc).__name__}: {exc}", n
                break
            runners.append(r)
            ok_sizes.append(n)
            cost.append(cf)
            metric_rows.append(mt)
        table = np.full((rounds, len(runners)), np.nan)
        on_cpu = cpu_clock_applies(device, threads)
        cpu_table = np.full((rounds, len(runners)), np.nan)
        wait_table = np.full((rounds, len(runners)), np.nan)
        spent = np.zeros(len(runners))  # seconds of timed measurements per N (point_budget)
        width = len(runners)
        for i in range(rounds):
            for j in range(width):
                if i > 0 and point_budget is not None and spent[j] >= point_budget:
                    continue  # this N has had its time; its later rounds stay NaN
                try:
                    counted = Counted(runners[j])
                    c0, t0 = time.process_time(), time.perf_counter()
                    t = measure(counted, device)
                    wall = time.perf_counter() - t0
                    spent[j] += wall
                    cpu = time.process_time() - c0
                    if not (math.isfinite(t) and t > 0):
                        raise ValueError(f"timing gave {t} s")
                    if on_cpu and counted.calls:
                        cpu_table[i, j] = cpu / counted.calls
                        wait_table[i, j] = wait_share(cpu, wall)
                except Exception as exc:  # noqa: BLE001 - same as a setup failure at this N
                    error, error_n = f"N = {ok_sizes[j]:,}: {type(exc).__name__}: {exc}", ok_sizes[j]
                    width = j
                    break
                table[i, j] = t
                done += 1
                if progress is not None:
                    progress.update(1)
        del runners
    if progress is not None and done < total:
        progress.update(total - done)  # the points not measured after an error
    ok_sizes, cost, metric_rows, table = ok_sizes[:width], cost[:width], metric_rows[:width], table[:, :width]
    cpu_table, wait_table = cpu_table[:, :width], wait_table[:, :width]
    names = list(dict.fromkeys(k for row in metric_rows for k in row))
    metrics = {k: [None if row.get(k) is None else float(row[k]) for row in metric_rows] for k in names}
    result = Sweep(
        mechanism=mech.id, impl=impl, device=str(device), dtype=dtype_name, threads=threads, sizes=ok_sizes,
        seconds=[float(x) for x in np.nanmedian(table, axis=0)] if width else [], rounds=rounds,
        all_rounds=table.tolist() if width else [], variant=v.name, seed=seed,
        cost_factors=None if mech.cost_factor is None else cost, metrics=metrics, error=error, error_n=error_n,
        point_budget=point_budget, cpu_rounds=cpu_table.tolist() if on_cpu and width else None,
        wait_rounds=wait_table.tolist() if on_cpu and width else None, load=[load_before, load_average()])
    if cache is not None:
        cache[key] = result
    return result


def merge_rounds(first: Sweep, again: Sweep) -> Sweep:
    """``first`` with the rounds of ``again`` (the same mechanism, variant, impl, device, dtype,
    threads and clock, re-timed) appended: rounds add up, each point is summarised over all of
    them (median of wall seconds; ``cpu_view`` takes the minimum of the CPU ones). The sizes are
    ``first``'s; a size ``again`` lacks (it stopped early) has NaN rounds there, and its error is
    kept when ``first`` has none. cpu_rounds are pooled only when both have them."""
    differ = {k: (getattr(first, k), getattr(again, k)) for k in
              ("mechanism", "variant", "impl", "device", "dtype", "threads", "clock")
              if getattr(first, k) != getattr(again, k)}
    if differ:
        raise ValueError(f"merge_rounds needs two sweeps of the same kind; (first, again) differ in {differ}")
    if first.clock != "wall":
        raise ValueError("merge_rounds pools measured sweeps (clock 'wall'); take cpu_view() of the result")
    at = {n: i for i, n in enumerate(again.sizes)}

    def aligned(rows) -> list[list[float]]:  # again's rounds on first's sizes
        return [[float(row[at[n]]) if n in at else math.nan for n in first.sizes] for row in rows]

    rows = [list(map(float, r)) for r in first.all_rounds] + aligned(again.all_rounds)
    cpu = waits = None
    if first.cpu_rounds is not None and again.cpu_rounds is not None:
        cpu = [list(map(float, r)) for r in first.cpu_rounds] + aligned(again.cpu_rounds)
    if first.wait_rounds is not None and again.wait_rounds is not None:
        waits = [list(map(float, r)) for r in first.wait_rounds] + aligned(again.wait_rounds)
    table = np.asarray(rows, float).reshape(len(rows), len(first.sizes))
    with np.errstate(all="ignore"):
        seconds = [float(np.nanmedian(c)) if np.isfinite(c).any() else math.nan for c in table.T]
    return replace(first, seconds=seconds, all_rounds=rows, rounds=first.rounds + again.rounds, cpu_rounds=cpu,
                   wait_rounds=waits, load=list(first.load) + list(again.load),
                   error=first.error or again.error, error_n=first.error_n if first.error else again.error_n)


# ------------------------------------------------------------------------------ crossover


def _line(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float] | None:
    """(slope, intercept) of log t vs log N by least squares, or None with < 3 points."""
    if len(sizes) < 3:
        return None
    x, y = np.log(sizes), np.log(seconds)  # closed form: the bootstrap calls this thousands of times
    dx = x - x.mean()
    slope = float(dx @ (y - y.mean()) / (dx @ dx))
    return slope, float(y.mean() - slope * x.mean())


def _summarise(table: np.ndarray, summary: str, axis: int) -> np.ndarray:
    """The point of each N from its rounds: Sweep.summary "min" (a cpu_view) or "median"."""
    return np.min(table, axis=axis) if summary == "min" else np.median(table, axis=axis)


#: log of the largest extrapolated crossover: beyond it (lines that are nearly parallel) "never".
_MAX_LOG_N = math.log(sys.float_info.max) - 1.0


def _crossover(nf, tf, keep_f, nd, td, keep_d) -> tuple[float | None, str]:
    """(estimate, how) from one pair of timing curves; how is "below" (fast wins at the smallest
    common N: the estimate is that N, an upper bound), "interpolated", "extrapolated" or "never"
    (estimate None; also when nearly parallel lines would meet beyond the largest float).
    keep_*: the points the extrapolation fits use (the fit rule)."""
    df, dd = dict(zip(nf, tf)), dict(zip(nd, td))
    common = sorted(set(df) & set(dd))
    ratio = [dd[n] / df[n] for n in common]
    if common and ratio[0] >= 1:
        return float(common[0]), "below"
    for (n0, r0), (n1, r1) in zip(zip(common, ratio), zip(common[1:], ratio[1:])):
        if r0 < 1 <= r1:
            frac = -math.log(r0) / (math.log(r1) - math.log(r0))
            return float(math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0)))), "interpolated"
    lf, ld = _line(nf[keep_f], tf[keep_f]), _line(nd[keep_d], td[keep_d])
    if lf is None or ld is None or ld[0] <= lf[0]:
        return None, "never"
    log_n = (lf[1] - ld[1]) / (ld[0] - lf[0])
    if not log_n < _MAX_LOG_N:  # nearly parallel lines (a noisy bootstrap replicate): beyond any float N
        return None, "never"
    return float(math.exp(log_n)), "extrapolated"


def _curves(fast: Sweep, dense: Sweep):
    nf, tf = np.asarray(fast.sizes, float), np.asarray(fast.seconds, float)
    nd, td = np.asarray(dense.sizes, float), np.asarray(dense.seconds, float)
    keep_f = fit_points(nf, tf) if len(nf) else np.zeros(0, bool)
    keep_d = fit_points(nd, td) if len(nd) else np.zeros(0, bool)
    return nf, tf, keep_f, nd, td, keep_d


def crossover(fast: Sweep, dense: Sweep) -> float | None:
    """The N where the fast path starts beating its dense twin, from the measured ratio.

    Log-log interpolation of t_dense / t_fast between the common sizes where it crosses 1.
    If fast already wins at the smallest common N, that N is returned (an upper bound on the
    crossover); if dense wins at every common N, the two fitted lines (fit rule: ``fit_points``)
    are extrapolated; None if they never meet.
    """
    return _crossover(*_curves(fast, dense))[0]


def crossover_interval(fast: Sweep, dense: Sweep, confidence: float = 0.95,
                       replicates: int = CROSSOVER_REPLICATES, seed: int = 0) -> tuple[float | None, float | None]:
    """A ``confidence`` interval on ``crossover(fast, dense)`` by a percentile bootstrap over rounds.

    Method: each replicate redraws, independently for every N of both sweeps, ``rounds`` of that
    N's per-round times with replacement and takes their median (as the sweep does; the minimum
    for a sweep whose summary is "min", ``Sweep.cpu_view``), then
    recomputes the crossover by the same rule (interpolation, or extrapolation of fits over the
    points the fit rule chose on the measured medians). A replicate where the lines never meet
    counts as +inf. The bounds are the lower (1 - confidence)/2 and upper (1 + confidence)/2
    empirical quantiles (conservative "lower"/"higher" order statistics); a bound that is +inf
    is None (not bounded above). When fast already wins at the smallest common N the crossover is
    not bounded below (low None).

    What it covers: round-to-round timing noise at each N. It does not cover systematic error
    (e.g. a cost model that bends outside the measured range when extrapolating), and with 3
    rounds a resampled median takes only the observed values, so the interval is coarse.
    (None, None) when either sweep has fewer than 2 rounds or no per-round times.
    """
    if not (0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    nf, tf, keep_f, nd, td, keep_d = _curves(fast, dense)
    rf, rd = np.asarray(fast.all_rounds, float), np.asarray(dense.all_rounds, float)
    if rf.ndim != 2 or rd.ndim != 2 or min(rf.shape[0], rd.shape[0]) < 2 \
            or rf.shape[1] != len(nf) or rd.shape[1] != len(nd) or len(nf) == 0 or len(nd) == 0:
        return None, None
    point, how = _crossover(nf, tf, keep_f, nd, td, keep_d)
    rng = np.random.default_rng(seed)

    def medians(table: np.ndarray, summary: str) -> np.ndarray:  # (replicates, n): bootstrap summaries per N
        r, n = table.shape
        idx = rng.integers(0, r, size=(replicates, r, n))
        return _summarise(table[idx, np.arange(n)[None, None, :]], summary, axis=1)

    # rounds a point budget skipped (NaN) count as that N's summary of the rounds done
    rf = np.where(np.isnan(rf), np.asarray(tf)[None, :], rf)
    rd = np.where(np.isnan(rd), np.asarray(td)[None, :], rd)
    bf, bd = medians(rf, fast.summary), medians(rd, dense.summary)
    est = np.empty(replicates)
    for b in range(replicates):
        x = _crossover(nf, bf[b], keep_f, nd, bd[b], keep_d)[0]
        est[b] = math.inf if x is None else x
    alpha = 1.0 - confidence
    low = float(np.quantile(est, alpha / 2, method="lower"))
    high = float(np.quantile(est, 1 - alpha / 2, method="higher"))
    if how == "below":
        low = None
    return (None if low is None or not math.isfinite(low) else low), (high if math.isfinite(high) else None)


def speedup_interval(fast: Sweep, dense: Sweep, confidence: float = 0.95, replicates: int = CROSSOVER_REPLICATES,
                     seed: int = 0) -> tuple[float | None, float | None]:
    """A ``confidence`` interval on the slope of ``compare``'s speed-up fit (log t_dense / t_fast vs
    log N) from round-to-round timing noise, by a percentile bootstrap over rounds.

    The points are the ones the speed-up fit uses (the common N where both times pass the fit
    rule, on the measured summaries), fixed. Each replicate redraws, for every such N of both
    sweeps, that N's rounds with replacement, summarises them as the sweep does (the median; the
    minimum for a ``Sweep.cpu_view``) and refits the least-squares slope; the bounds are the
    (1 -+ confidence)/2 empirical quantiles ("lower"/"higher" order statistics).

    What it covers, and what not: the t-interval of the speed-up fit treats the curvature of the
    speed-up curve over 4-5 points (overheads at small N, the dense twin's cache steps) as noise,
    with 2-3 degrees of freedom, so it was wide even on an idle machine (tree-dc: slope 1.18,
    [0.56, 1.80]) and a load shift at one end could push it below 0. This interval asks only whether
    the speed-up grows across the measured grid beyond the scatter of the rounds; the curve's shape
    is not noise for that question. (None, None) with fewer than 3 points or 2 rounds in a sweep.
    """
    if not (0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tf, td = dict(zip(fast.sizes, fast.seconds)), dict(zip(dense.sizes, dense.seconds))
    common = sorted(set(tf) & set(td))
    if len(common) < 3:
        return None, None
    keep = fit_points(common, [min(tf[n], td[n]) for n in common])
    sizes = [n for n, k in zip(common, keep) if k]
    rf, rd = np.asarray(fast.all_rounds, float), np.asarray(dense.all_rounds, float)
    if len(sizes) < 3 or rf.ndim != 2 or rd.ndim != 2 or min(rf.shape[0], rd.shape[0]) < 2 \
            or rf.shape[1] != len(fast.sizes) or rd.shape[1] != len(dense.sizes):
        return None, None
    cf, cd = [fast.sizes.index(n) for n in sizes], [dense.sizes.index(n) for n in sizes]
    # rounds a point budget skipped (NaN) count as that N's summary of the rounds done
    rf = np.where(np.isnan(rf[:, cf]), np.asarray([tf[n] for n in sizes])[None, :], rf[:, cf])
    rd = np.where(np.isnan(rd[:, cd]), np.asarray([td[n] for n in sizes])[None, :], rd[:, cd])
    rng = np.random.default_rng(seed)

    def redrawn(table: np.ndarray, summary: str) -> np.ndarray:  # (replicates, points)
        r, n = table.shape
        idx = rng.integers(0, r, size=(replicates, r, n))
        return _summarise(table[idx, np.arange(n)[None, None, :]], summary, axis=1)

    y = np.log(redrawn(rd, dense.summary)) - np.log(redrawn(rf, fast.summary))
    dx = np.log(np.asarray(sizes, float))
    dx = dx - dx.mean()
    slopes = (y - y.mean(axis=1, keepdims=True)) @ dx / (dx @ dx)
    alpha = 1.0 - confidence
    return (float(np.quantile(slopes, alpha / 2, method="lower")),
            float(np.quantile(slopes, 1 - alpha / 2, method="higher")))


def measured_crossover(sizes, speedup) -> int | None:
    """The smallest timed N from which fast wins (t_dense / t_fast > 1) at every larger common N;
    None if fast does not win at the largest. Walking down from the largest N, noise at one small
    N cannot make the crossover look earlier than it is."""
    out = None
    for n, r in zip(reversed(list(sizes)), reversed(list(speedup))):
        if r <= 1.0:
            break
        out = int(n)
    return out


def compare(fast: Sweep, dense: Sweep, confidence: float = 0.95, replicates: int = CROSSOVER_REPLICATES,
            seed: int = 0) -> Comparison:
    """Fast path vs dense twin (results.schema.Comparison): speed-up at the common N, its fit,
    the crossover with its interval (``crossover_interval``), the measured crossover.

    The speed-up fit uses the common N where both times pass the fit rule (``fit_points`` on
    min(t_fast, t_dense): at least the largest 4), None below 3 points.
    """
    tf, td = dict(zip(fast.sizes, fast.seconds)), dict(zip(dense.sizes, dense.seconds))
    common = sorted(set(tf) & set(td))
    ratio = [td[n] / tf[n] for n in common]
    speedup_fit = None
    if len(common) >= 3:
        keep = fit_points(common, [min(tf[n], td[n]) for n in common])
        if keep.sum() >= 3:
            speedup_fit = fit_exponent(np.asarray(common, float)[keep], np.asarray(ratio)[keep], confidence)
    curves = _curves(fast, dense)
    point, how = _crossover(*curves)
    low, high = crossover_interval(fast, dense, confidence, replicates, seed)
    return Comparison(mechanism=fast.mechanism, variant=fast.variant, sizes=[int(n) for n in common],
                      speedup=[float(r) for r in ratio], speedup_fit=speedup_fit, crossover=point,
                      crossover_low=low, crossover_high=high,
                      measured_crossover=measured_crossover(common, ratio), extrapolated=how == "extrapolated")


def environment() -> dict:
    """Facts that qualify a timing: threads, torch version, CPU count."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
    }
