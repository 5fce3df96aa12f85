"""Child process of the scale checks: run one fast path at a large N and report JSON.

    python -m verify.scale_worker MECHANISM N [--device cpu] [--seed 0] [--calls 2] [--train]
        [--threads T] [--reference N1 N2 ...] [--reference-threads 1] [--stop-ratio R] [--budget S]

MECHANISM is a registry id (``causal``) or ``module:attribute`` naming a Mechanism record that
is not registered (``tests.verify.planted_mechanisms:HIDDEN_QUADRATIC``: a test plants a record
without adding it to the library).

Runs in its own process so that its peak memory belongs to this problem alone (the parent calls
it through verify.memory.run_scale_worker). The peak is read by verify.memory.peak_memory (VmHWM
reset after set-up, ru_maxrss fallback; on CUDA also torch.cuda.max_memory_allocated), the same
helper the memory-vs-N curves use.

--train: the runner is built with requires_grad=True (Mechanism.fast_setup(problem, device,
dtype, requires_grad=True): q, k, v are leaves that require grad) and each call runs the forward
pass and ``out.sum().backward()``, so the peak covers the tensors autograd saves for backward
(scale/<id>-train). Without it, calls run forward only under torch.inference_mode().

Clock. Each call is timed twice: wall seconds (perf_counter) and the process's CPU seconds
(time.process_time: user + system of all its threads). On CPU the judged clock is CPU seconds:
time the process waits for a core (other processes on a busy machine) does not count, and with
OpenMP's passive wait policy (set here before torch loads, unless the environment sets one) an
idle thread sleeps instead of spinning, so the CPU seconds of a large call are its work whatever
the thread count (measured on the 2-core EPYC, 1 vs 2 threads: linear 2^20 1.39 vs 1.61 s, causal
2^20 train 5.2 vs 5.9 s, block-toeplitz 2^18 11.1 vs 11.1 s). On CUDA the clock is the wall
(after torch.cuda.synchronize()). ``timed_s`` holds the judged clock per call.

--threads T: torch.set_num_threads(T) for the calls at N (default: torch's own choice).

--reference N1 N2 ...: before the large problem, time the same call (forward, or forward +
backward with --train) on the default variant at these N with --reference-threads torch threads
(default 1, as the sweeps; at small N the CPU seconds of several threads include their wake-up
and hand-over costs, 2x for linear at 2^15): one warm-up call at N_min / 16 (library start-up),
then --calls timed calls at each, the minimum on the judged clock. The class line of the record's complexity
through them (``class_line``: c = max over the references of t / g(N)) predicts the call at N:
``predicted_s`` = c g(N) (x the problem's cost factor for "N diam").

--stop-ratio R (needs --reference) and --budget S: stop early. A call whose judged clock passes
min(R x predicted_s, S) is not waited for: a watchdog thread prints the report so far with
``stopped: true`` and ``stopped_after_s`` (that call's clock when it stopped: a lower bound on its
time) and ends the process (status 0). A hidden quadratic then costs seconds, not hours.

Prints one JSON object (bytes, seconds): mechanism, complexity, n, train, setup_s, first_s,
second_s (wall of the first and last call), calls_s (wall, all), calls_cpu_s (CPU, all), timed_s
(the judged clock, all), clock ("cpu" | "wall"), baseline_rss (before set-up), after_setup_rss,
peak_rss (absolute; the peak mark is reset after set-up where Linux allows, so it is the calls'
peak), peak_method, peak_reset_after_setup, finite (the output of every call), shape, threads,
omp_wait_policy, device, cost_factor (at N; None without one), reference ({sizes, threads,
seconds, calls_s, cost_factors, per_unit, coefficient} or None), predicted_s (None without
references), budget_s (the stop time per call, or None), stopped, stopped_after_s, and on CUDA
cuda_max_allocated. A stopped report lacks the unfinished call in the lists.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import sys
import threading
import time

#: How often the watchdog reads the clock (seconds of sleep between readings).
WATCH_INTERVAL_S = 0.05
#: Classes with a per-problem cofactor and their base class (verify.registry.COST_FACTOR_CLASSES).
_BASE = {"N": lambda x: x, "N log N": lambda x: x * math.log(x), "N log^2 N": lambda x: x * math.log(x) ** 2,
         "N^2": lambda x: x * x}


# ------------------------------------------------------------------------------ the class line


def class_size(complexity: str, n: float, cost_factor: float | None = None) -> float:
    """g(n) of a complexity class: n, n ln n, n ln^2 n, n^2; a cost-factor class ("N diam") is its
    base class times ``cost_factor`` (required then). ValueError for another class."""
    from verify.registry import COST_FACTOR_CLASSES

    base = COST_FACTOR_CLASSES.get(complexity, complexity)
    if base not in _BASE:
        raise ValueError(f"no class line for complexity {complexity!r}; known: {sorted(_BASE)}")
    g = _BASE[base](float(n))
    if complexity in COST_FACTOR_CLASSES:
        if cost_factor is None or not cost_factor > 0:
            raise ValueError(f"complexity {complexity!r} needs a positive cost factor, got {cost_factor!r}")
        g *= float(cost_factor)
    return g


def class_line(sizes, seconds, complexity: str, cost_factors=None) -> tuple[float, list[float]]:
    """(c, per_unit): per_unit[i] = seconds[i] / g(sizes[i]) and c = max(per_unit), the class line
    t = c g(N) through the slowest of the points. Why the max: time per class unit grows as the data
    leave the caches (linear: 7.5e-7 s per N at 2^14-2^15, 1.0e-6 at 2^16, 1.4e-6 at 2^20 on the
    2-core EPYC, 8 MiB L3), and timing noise only adds time, so the max errs towards a larger
    prediction (passing), never a smaller one. ValueError without points."""
    if len(sizes) == 0 or len(sizes) != len(seconds):
        raise ValueError(f"need as many seconds as sizes (>= 1), got {len(sizes)} sizes and {len(seconds)} seconds")
    cf = [None] * len(sizes) if cost_factors is None else list(cost_factors)
    per = [float(t) / class_size(complexity, n, c) for n, t, c in zip(sizes, seconds, cf)]
    return max(per), per


# ------------------------------------------------------------------------------ loading and timing


def load_mechanism(spec: str):
    """The record named by ``spec``: a registry id, or ``module:attribute`` (dotted attribute
    allowed) for a Mechanism that is not registered. ValueError naming ``spec`` otherwise."""
    from verify.registry import Mechanism

    if ":" not in spec:
        from verify.mechanisms import get

        return get(spec)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"mechanism spec {spec!r}: use 'module:attribute' or a registry id")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Mechanism):
        raise ValueError(f"mechanism spec {spec!r} names a {type(obj).__name__}, not a verify.registry.Mechanism")
    return obj


class _Clock:
    """The judged clock of one device: CPU seconds of this process on CPU, wall on CUDA."""

    def __init__(self, cuda: bool):
        self.name = "wall" if cuda else "cpu"
        self.now = time.perf_counter if cuda else time.process_time


class _Watchdog:
    """Stops the process once the call in progress has run longer than ``budget`` on ``clock``:
    prints ``report() | {stopped: true, stopped_after_s}`` as the JSON report, then os._exit(0)."""

    def __init__(self, clock: _Clock, budget: float, report):
        self.clock, self.budget, self.report = clock, budget, report
        self.started: float | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        while not self.done.wait(WATCH_INTERVAL_S):
            started = self.started
            if started is None:
                continue
            elapsed = self.clock.now() - started
            if elapsed > self.budget:
                rep = {**self.report(), "stopped": True, "stopped_after_s": elapsed}
                sys.stdout.write(json.dumps(rep))
                sys.stdout.flush()
                os._exit(0)  # the call in progress is not waited for: that is the point


def _call(runner, train: bool, cuda: bool):
    import torch

    out = runner()
    if train:
        out.sum().backward()
    if cuda:
        torch.cuda.synchronize()
    return out


def _setup(mech, problem, device: str, train: bool):
    import torch

    if train:
        return mech.fast_setup(problem, device, torch.float32, requires_grad=True)
    return mech.fast_setup(problem, device, torch.float32)


def reference(mech, sizes, *, device: str, seed: int, train: bool, clock: _Clock, threads: int, calls: int) -> dict:
    """The call (forward, or forward + backward with ``train``) at each N of ``sizes`` on the
    default variant with ``threads`` torch threads (restored after): one warm-up call at a
    16x smaller N, then ``calls`` timed calls each, the minimum on ``clock``; and the class line through
    them (``class_line``)."""
    import torch

    cuda = device.startswith("cuda")
    sizes = sorted(int(n) for n in sizes)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    mode = torch.enable_grad() if train else torch.inference_mode()
    rows, cost = [], []
    try:
        with mode:
            # first call of the process, at a small N: library start-up costs stay out of the times
            small = mech.problem(mech.admissible(max(16, sizes[0] // 16)), seed)
            _call(_setup(mech, small, device, train), train, cuda)
            del small
            for n in sizes:
                problem = mech.problem(n, seed)
                cost.append(None if mech.cost_factor is None else float(mech.cost_factor(problem)))
                runner = _setup(mech, problem, device, train)
                del problem
                times = []
                for _ in range(max(1, calls)):
                    t0 = clock.now()
                    _call(runner, train, cuda)
                    times.append(clock.now() - t0)
                rows.append(times)
                del runner
    finally:
        torch.set_num_threads(old)
    seconds = [min(r) for r in rows]
    coefficient, per_unit = class_line(sizes, seconds, mech.complexity, None if mech.cost_factor is None else cost)
    return {"sizes": sizes, "threads": threads, "seconds": seconds, "calls_s": rows,
            "cost_factors": None if mech.cost_factor is None else cost, "per_unit": per_unit,
            "coefficient": coefficient}


# ------------------------------------------------------------------------------ entry point


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify.scale_worker")
    ap.add_argument("mechanism", help="registry id, or module:attribute of a Mechanism record")
    ap.add_argument("n", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=2, help="timed calls (>= 1) at N and at each reference N")
    ap.add_argument("--train", action="store_true", help="forward + out.sum().backward() per call, inputs require grad")
    ap.add_argument("--threads", type=int, default=None, help="torch threads at N (default: torch's choice)")
    ap.add_argument("--reference", type=int, nargs="+", default=None, metavar="N_REF",
                    help="time the same call at these N first: the class line through them predicts N")
    ap.add_argument("--reference-threads", type=int, default=1, help="torch threads of the reference calls")
    ap.add_argument("--stop-ratio", type=float, default=None, metavar="R",
                    help="stop a call at R x the predicted time (needs --reference)")
    ap.add_argument("--budget", type=float, default=None, metavar="S", help="stop a call after S seconds")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"N must be >= 1, got {args.n}")
    for name in ("threads", "reference_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.reference is not None and min(args.reference) < 1:
        ap.error(f"--reference sizes must be >= 1, got {args.reference}")
    for name in ("stop_ratio", "budget"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if args.stop_ratio is not None and args.reference is None:
        ap.error("--stop-ratio needs --reference (the prediction it multiplies)")

    if "torch" not in sys.modules:  # read when OpenMP loads (with torch): idle threads sleep, not spin
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    old_threads = torch.get_num_threads()
    try:
        report = _run(args, load_mechanism(args.mechanism))
    finally:
        torch.set_num_threads(old_threads)  # main() also runs in-process (tests)
    json.dump(report, sys.stdout)
    return 0


def _run(args, mech) -> dict:
    """References (optional), set-up at N, the timed calls under the watchdog: the report."""
    import gc

    import torch

    from verify.memory import METHOD_HWM, peak_memory, peak_rss_bytes, rss_bytes

    cuda = args.device.startswith("cuda")
    clock = _Clock(cuda)
    ref = None
    if args.reference is not None:
        ref = reference(mech, args.reference, device=args.device, seed=args.seed, train=args.train, clock=clock,
                        threads=args.reference_threads, calls=args.calls)
        gc.collect()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    baseline = rss_bytes()
    t0 = time.perf_counter()
    problem = mech.problem(args.n, args.seed)
    cost_factor = None if mech.cost_factor is None else float(mech.cost_factor(problem))
    runner = _setup(mech, problem, args.device, args.train)
    del problem
    setup_s = time.perf_counter() - t0
    after_setup = rss_bytes()
    predicted = None if ref is None else ref["coefficient"] * class_size(mech.complexity, args.n, cost_factor)
    limits = [x for x in (args.budget, None if args.stop_ratio is None else args.stop_ratio * predicted)
              if x is not None]
    budget = min(limits) if limits else None
    walls, cpus, timed, finite, shape = [], [], [], True, []
    report = {"mechanism": mech.id, "complexity": mech.complexity, "n": args.n, "train": bool(args.train),
              "setup_s": setup_s, "baseline_rss": baseline, "after_setup_rss": after_setup,
              "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "device": args.device, "clock": clock.name, "cost_factor": cost_factor, "reference": ref,
              "predicted_s": predicted, "budget_s": budget, "stopped": False, "stopped_after_s": None}

    def so_far(pk=None) -> dict:
        peak = pk.peak if pk is not None and pk.peak else peak_rss_bytes()
        return {**report, "first_s": walls[0] if walls else None, "second_s": walls[-1] if walls else None,
                "calls_s": list(walls), "calls_cpu_s": list(cpus), "timed_s": list(timed), "peak_rss": peak,
                "finite": finite, "shape": list(shape)}

    mode = torch.enable_grad() if args.train else torch.inference_mode()
    dog = _Watchdog(clock, budget, so_far) if budget is not None else contextlib.nullcontext()
    with peak_memory("cpu") as pk, (peak_memory(args.device) if cuda else contextlib.nullcontext()) as cuda_pk, \
            mode, dog:
        report.update(peak_method=pk.method, peak_reset_after_setup=pk.method == METHOD_HWM)
        for _ in range(max(1, args.calls)):
            w0, c0 = time.perf_counter(), time.process_time()
            if budget is not None:
                dog.started = clock.now()
            out = _call(runner, args.train, cuda)
            if budget is not None:
                dog.started = None
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            timed.append(walls[-1] if cuda else cpus[-1])
            finite = finite and bool(torch.isfinite(out.detach()).all())
            shape = list(out.shape)
            del out
    final = so_far(pk)
    if cuda:
        final["cuda_max_allocated"] = cuda_pk.peak
    return final


if __name__ == "__main__":
    sys.exit(main())
