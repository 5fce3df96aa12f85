"""Child process of the scale checks: run one fast path at a large N and report JSON.

    python -m measure.scale_worker MECHANISM N [--device cpu] [--seed 0] [--calls 2] [--train]
        [--threads T] [--reference N1 N2 ...] [--reference-threads 1] [--stop-ratio R] [--budget S]
    python -m measure.scale_worker --serve      (one request per stdin line, one report per stdout line)

MECHANISM is a registry id (``causal``) or ``module:attribute`` naming a Mechanism record that
is not registered (``tests.verify.planted_mechanisms:HIDDEN_QUADRATIC``: a test plants a record
without adding it to the library).

Runs in a process of its own, apart from the parent's sweeps and caches (measure.memory.run_scale_worker
starts one per request; the scale checks keep one ``--serve`` child for the whole run, see Serving).
The peak is read by measure.memory.peak_memory (VmHWM reset after set-up, ru_maxrss fallback; on
CUDA also torch.cuda.max_memory_allocated after reset_peak_memory_stats), the same helper the
memory-vs-N curves use, so each request's peak is its own.

Serving (``--serve``, client ``WorkerSession``, ``run_in_session``). Each line on stdin is
{"argv": [the arguments above]}; each reply is one line {"report": ...} or {"error": "..."} with
"exiting": true when the child ends after it (an error, a stopped call, or no VmHWM reset: then
a later request needs a fresh child to have a peak of its own). Why one child for every scale
check of a run: a child per check paid process start, ``import torch``, the registry and (on a
GPU) CUDA initialisation twelve times over, and scale/<id>-train regenerated the very problem
that scale/<id> had just built (grf at 2^20: graph, walks and q, k, v, 5-8 s of NumPy and CPU
torch; the latent graphs 6-9 s). The child keeps the problems of the last (mechanism, seed) it
saw (``ProblemCache``: the references and N), so scale/<id>-train reuses scale/<id>'s (and
drops them after a --train request or one for a record without scale_train); the
baseline of the memory check is taken with the problem already resident (it is not part of
what set-up and the calls add), and fast set-up never writes into a problem (tests check it).
Protocol lines go to the real stdout; anything else printed in the child goes to stderr.

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
cuda_max_allocated (torch.cuda.max_memory_allocated over the calls, bytes) with
cuda_baseline_allocated (memory_allocated before set-up), warmup_s (wall of the warm-up at N;
None on CPU), stopped_in ("warm-up" | "call" | None) and problem_reused (the problem at N came
from the serving child's cache). Where a request's wall time went: problem_s (building the
problem at N, ~0 when reused), setup_s, reference_s (all of the references, their problems
included), warmup_s, calls_s; through run_in_session also child_started (this request paid a
child's start: interpreter, torch, registry). A stopped report lacks the unfinished call in the lists.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from measure.memory import worker_argv  # the request's arguments, one builder for both ways of starting a worker

#: How often the watchdog reads the clock (seconds of sleep between readings).
WATCH_INTERVAL_S = 0.05
#: CUDA: timed calls per N at least (a call costs milliseconds; the minimum counts).
CUDA_MIN_CALLS = 3
#: CUDA: the watchdog budget of the warm-up call at N is at least this (one-off costs included).
CUDA_WARMUP_MIN_S = 60.0
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


def _print_report(report: dict) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


class _Watchdog:
    """Stops the process once the call in progress has run longer than ``budget`` on ``clock``:
    ``emit(report() | {stopped: true, stopped_after_s, stopped_in})`` (default: print it as the
    JSON report), then os._exit(0). ``arm(budget, phase)`` before a call, ``disarm()`` after."""

    def __init__(self, clock: _Clock, budget: float, report, emit=_print_report):
        self.clock, self.budget, self.report, self.emit = clock, budget, report, emit
        self.started: float | None = None
        self.phase = "call"
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def arm(self, budget: float, phase: str = "call") -> None:
        self.budget, self.phase = budget, phase
        self.started = self.clock.now()

    def disarm(self) -> None:
        self.started = None

    def _watch(self) -> None:
        while not self.done.wait(WATCH_INTERVAL_S):
            started = self.started
            if started is None:
                continue
            elapsed = self.clock.now() - started
            if elapsed > self.budget:
                self.emit({**self.report(), "stopped": True, "stopped_after_s": elapsed, "stopped_in": self.phase})
                os._exit(0)  # the call in progress is not waited for: that is the point


def _sync(cuda: bool) -> None:
    """Wait for the GPU's queue (CUDA only): a clock started before would count earlier work."""
    if cuda:
        import torch

        torch.cuda.synchronize()


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


class ProblemCache:
    """The problems (default variant) of ONE (mechanism spec, seed), by N: a request for another
    spec or seed drops them first, so at most one mechanism's problems stay resident. Used by the
    serving child so that scale/<id>-train reuses what scale/<id> built (module docstring)."""

    def __init__(self):
        self.key: tuple | None = None
        self.problems: dict[int, object] = {}
        self.hits = 0

    def get(self, spec: str, mech, n: int, seed: int):
        if self.key != (spec, int(seed)):
            self.key, self.problems = (spec, int(seed)), {}
        if n in self.problems:
            self.hits += 1
        else:
            self.problems[n] = mech.problem(n, seed)
        return self.problems[n]

    def clear(self) -> None:
        self.key, self.problems = None, {}


def _problem_source(mech, seed: int, cache: ProblemCache | None, spec: str | None):
    """n -> the default-variant problem at n (from ``cache`` when given)."""
    if cache is None:
        return lambda n: mech.problem(n, seed)
    return lambda n: cache.get(spec or mech.id, mech, n, seed)


def reference(mech, sizes, *, device: str, seed: int, train: bool, clock: _Clock, threads: int, calls: int,
              problem=None) -> dict:
    """The call (forward, or forward + backward with ``train``) at each N of ``sizes`` on the
    default variant with ``threads`` torch threads (restored after): one warm-up call at a
    16x smaller N, then ``calls`` timed calls each, the minimum on ``clock``; and the class line through
    them (``class_line``). CUDA: also one warm-up call at each N, synchronised starts and at least
    CUDA_MIN_CALLS timed calls (module docstring). problem: n -> Problem (default mech.problem(n, seed))."""
    import torch

    cuda = device.startswith("cuda")
    problem_at = _problem_source(mech, seed, None, None) if problem is None else problem
    if cuda:
        calls = max(calls, CUDA_MIN_CALLS)
    sizes = sorted(int(n) for n in sizes)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    mode = torch.enable_grad() if train else torch.inference_mode()
    rows, cost = [], []
    try:
        with mode:
            # first call of this mechanism (in this process), at a small N: library start-up costs stay out
            small = problem_at(mech.admissible(max(16, sizes[0] // 16)))
            _call(_setup(mech, small, device, train), train, cuda)
            del small
            for n in sizes:
                p = problem_at(n)
                cost.append(None if mech.cost_factor is None else float(mech.cost_factor(p)))
                runner = _setup(mech, p, device, train)
                del p
                if cuda:  # one-off costs of a new size on the GPU (module docstring)
                    _call(runner, train, cuda)
                times = []
                for _ in range(max(1, calls)):
                    _sync(cuda)
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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m measure.scale_worker",
                                 epilog="python -m measure.scale_worker --serve: one request (these arguments as "
                                        "{\"argv\": [...]}) per stdin line, one JSON reply per stdout line")
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
    return ap


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The worker's arguments (SystemExit with argparse's message on stderr when they are bad)."""
    ap = _parser()
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
    return args


def _import_torch():
    if "torch" not in sys.modules:  # read when OpenMP loads (with torch): idle threads sleep, not spin
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    return torch


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--serve"]:
        return serve()
    args = parse_args(argv)
    torch = _import_torch()
    old_threads = torch.get_num_threads()
    try:
        report = _run(args, load_mechanism(args.mechanism))
    finally:
        torch.set_num_threads(old_threads)  # main() also runs in-process (tests)
    json.dump(report, sys.stdout)
    return 0


def serve(requests=None) -> int:
    """The serving loop (module docstring, Serving): reads requests until EOF on stdin (or from
    the iterable ``requests`` of lines, for tests), answers each on the real stdout. Returns 0."""
    torch = _import_torch()
    if requests is None:
        proto = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints (Python or C) must not reach the channel
        requests = sys.stdin
    else:
        proto = sys.stdout

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    cache = ProblemCache()
    threads = torch.get_num_threads()
    for line in requests:
        if not line.strip():
            continue
        try:
            args = parse_args(list(json.loads(line)["argv"]))
            mech = load_mechanism(args.mechanism)
            report = _run(args, mech, cache=cache, spec=args.mechanism,
                          emit=lambda rep: reply({"report": rep, "exiting": True}))
            answer = {"report": report, "exiting": not report.get("peak_reset_after_setup", False)}
            if args.train or not mech.scale_train:  # scale/<id>-train comes right after scale/<id>, or never:
                cache.clear()  # nothing will reuse these, so an idle child holds no problem
        except SystemExit as exc:  # argparse: its message is on stderr
            answer = {"error": f"invalid arguments (status {exc.code}; argparse's message is on stderr)",
                      "exiting": True}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it; the child ends
            traceback.print_exc()
            answer = {"error": f"{type(exc).__name__}: {exc}", "exiting": True}
        finally:
            torch.set_num_threads(threads)
        reply(answer)
        if answer["exiting"]:  # after an error (a CUDA one can poison the context) or without a peak reset
            break
        _release(args.device)
    return 0


def _release(device: str) -> None:
    """Between requests: free what the last one left (its problems stay in the cache)."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _run(args, mech, cache: ProblemCache | None = None, spec: str | None = None, emit=_print_report) -> dict:
    """References (optional), set-up at N, the timed calls under the watchdog: the report.
    cache: the serving child's ProblemCache (None: problems are built here and dropped after);
    emit: how the watchdog delivers a stopped report."""
    import gc

    import torch

    from measure.memory import METHOD_HWM, freeze_survivors, peak_memory, peak_rss_bytes, rss_bytes

    freeze_survivors()  # the gc.collect() calls below then walk only this request's objects
    cuda = args.device.startswith("cuda")
    clock = _Clock(cuda)
    problem_at = _problem_source(mech, args.seed, cache, spec)
    calls = max(1, args.calls) if not cuda else max(args.calls, CUDA_MIN_CALLS)
    ref = None
    r0 = time.perf_counter()
    if args.reference is not None:
        ref = reference(mech, args.reference, device=args.device, seed=args.seed, train=args.train, clock=clock,
                        threads=args.reference_threads, calls=args.calls, problem=problem_at)
        gc.collect()
    reference_s = time.perf_counter() - r0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hits = cache.hits if cache is not None else 0
    p0 = time.perf_counter()
    problem = problem_at(args.n)
    problem_s = time.perf_counter() - p0
    reused = cache is not None and cache.hits > hits
    cost_factor = None if mech.cost_factor is None else float(mech.cost_factor(problem))
    # the baselines hold the problem (resident while the calls run, cached or not): what set-up
    # and the calls add on top of it is measured, the inputs on the device included
    gc.collect()
    _sync(cuda)
    cuda_baseline = int(torch.cuda.memory_allocated(args.device)) if cuda else None
    baseline = rss_bytes()
    t0 = time.perf_counter()
    runner = _setup(mech, problem, args.device, args.train)
    _sync(cuda)
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
              "predicted_s": predicted, "budget_s": budget, "stopped": False, "stopped_after_s": None,
              "stopped_in": None, "warmup_s": None, "cuda_baseline_allocated": cuda_baseline,
              "problem_reused": reused, "problem_s": problem_s, "reference_s": reference_s}

    def so_far(pk=None) -> dict:
        peak = pk.peak if pk is not None and pk.peak else peak_rss_bytes()
        rep = {**report, "first_s": walls[0] if walls else None, "second_s": walls[-1] if walls else None,
               "calls_s": list(walls), "calls_cpu_s": list(cpus), "timed_s": list(timed), "peak_rss": peak,
               "finite": finite, "shape": list(shape)}
        if cuda:  # the peak so far (reset on entering the measured block); final reports read it synchronised
            rep["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(args.device))
        return rep

    mode = torch.enable_grad() if args.train else torch.inference_mode()
    dog = _Watchdog(clock, budget, so_far, emit) if budget is not None else None
    with peak_memory("cpu") as pk, (peak_memory(args.device) if cuda else contextlib.nullcontext()) as cuda_pk, \
            mode, (dog if dog is not None else contextlib.nullcontext()):
        report.update(peak_method=pk.method, peak_reset_after_setup=pk.method == METHOD_HWM)
        if cuda:  # warm-up at N: one-off costs of the GPU (module docstring), not timed
            if dog is not None:
                dog.arm(max(budget, CUDA_WARMUP_MIN_S), "warm-up")
            w0 = time.perf_counter()
            out = _call(runner, args.train, cuda)
            report["warmup_s"] = time.perf_counter() - w0
            if dog is not None:
                dog.disarm()
            del out
        for _ in range(calls):
            _sync(cuda)
            w0, c0 = time.perf_counter(), time.process_time()
            if dog is not None:
                dog.arm(budget)
            out = _call(runner, args.train, cuda)
            if dog is not None:
                dog.disarm()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            timed.append(walls[-1] if cuda else cpus[-1])
            finite = finite and bool(torch.isfinite(out.detach()).all())
            shape = list(out.shape)
            del out
    final = so_far(pk)
    if cuda:
        final["cuda_max_allocated"] = cuda_pk.peak
    del runner, problem
    return final


# ------------------------------------------------------------------------------ the client of --serve




class WorkerSession:
    """One ``python -m measure.scale_worker --serve`` child at a time, serving requests in turn; a
    new one is started when none is alive (first request, or the last one ended: see Serving).

    ``request(argv, timeout, what)`` -> the report; RuntimeError naming ``what`` with the child's
    error and stderr tail when it fails or dies; subprocess.TimeoutExpired (the child is killed)
    when no reply comes within ``timeout`` wall seconds. ``close()`` ends the child (EOF on its
    stdin). ``started`` counts the children started. Thread-safe (one request at a time)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.started = 0
        self._lock = threading.Lock()
        self._lines: queue.Queue | None = None
        self._err = None

    def _cmd(self) -> list[str]:
        return [sys.executable, "-m", "measure.scale_worker", "--serve"]

    def _start(self) -> None:
        from measure.memory import MALLOC_ENV

        env = {**os.environ, **MALLOC_ENV}
        # a record outside the registry (module:attribute) must import in the child as it does here
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self._err = tempfile.TemporaryFile(mode="w+")  # never a pipe nobody reads
        self.proc = subprocess.Popen(self._cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, env=env)
        self._lines = queue.Queue()
        threading.Thread(target=_read_lines, args=(self.proc.stdout, self._lines), daemon=True).start()
        self.started += 1

    def _stderr_tail(self, chars: int = 2000) -> str:
        if self._err is None:
            return ""
        self._err.flush()
        self._err.seek(0)
        return self._err.read()[-chars:]

    def _discard(self, kill: bool = False) -> None:
        """Forget the child: killed (by its own handle) or waited for, briefly."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()

    def request(self, argv: list[str], timeout: float, what: str) -> dict:
        with self._lock:
            line = json.dumps({"argv": list(argv)}) + "\n"
            for attempt in (0, 1):
                if self.proc is None or self.proc.poll() is not None:
                    self._discard()
                    self._start()
                try:
                    self.proc.stdin.write(line)
                    self.proc.stdin.flush()
                    break
                except OSError:  # the child ended between requests: once more with a fresh one
                    self._discard()
                    if attempt:
                        raise
            try:
                got = self._lines.get(timeout=timeout)
            except queue.Empty:
                self._discard(kill=True)
                raise subprocess.TimeoutExpired(self._cmd(), timeout) from None
            if got is None:
                rc = self.proc.wait()
                tail = self._stderr_tail()
                self._discard()
                raise RuntimeError(f"scale worker for {what} exited with status {rc} without a report:\n{tail}")
            try:
                reply = json.loads(got)
            except json.JSONDecodeError as exc:
                self._discard(kill=True)
                raise RuntimeError(f"scale worker for {what} printed no JSON ({exc}): {got[-500:]!r}") from None
            if reply.get("exiting"):
                self._discard()
            if "error" in reply:
                raise RuntimeError(f"scale worker for {what} failed: {reply['error']}\n{self._stderr_tail()}")
            return reply["report"]

    def close(self) -> None:
        with self._lock:
            if self.proc is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()  # EOF: the serving loop ends
                self._discard()


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)  # EOF


_SESSION: WorkerSession | None = None


def session() -> WorkerSession:
    """This process's WorkerSession (started on first use, closed at exit)."""
    global _SESSION
    if _SESSION is None:
        import atexit

        _SESSION = WorkerSession()
        atexit.register(_SESSION.close)
    return _SESSION


def run_in_session(mech_id: str, n: int, *, timeout: float, **options) -> dict:
    """One request to this process's WorkerSession: the report of ``python -m measure.scale_worker``
    with ``worker_argv(mech_id, n, **options)``; errors as WorkerSession.request."""
    what = f"{mech_id} at N={int(n)}{' (train)' if options.get('train') else ''}"
    s = session()
    before = s.started
    report = s.request(worker_argv(mech_id, n, **options), timeout, what)
    return {**report, "child_started": s.started > before}


if __name__ == "__main__":
    sys.exit(main())
