"""Peak memory: the one helper (``peak_memory``) and the child processes that use it.

Both the scale checks (measure.scale_worker.run_in_session: one ``python -m measure.scale_worker
--serve`` child serves every scale check of a run; ``run_scale_worker`` starts one child for one
request) and the memory-vs-N curves (``memory_curve`` -> ``python -m measure.memory``) measure in a
child process, with ``peak_memory`` around the measured calls, so the two agree by construction.

Method (CPU). The point is

    peak extra memory = peak resident set during the calls  -  resident set just before them,

i.e. what the computation needed on top of its inputs (set up before, untimed).

Which peak. ``getrusage(RUSAGE_SELF).ru_maxrss`` is monotone within a process, and misleads in
two measured ways: (1) set-up temporaries (a dense twin builds its N x N mask in float64 before
converting it) raise it above what the call needs, hiding the call's own peak; (2) on Linux it
also includes the PARENT's peak inherited across fork/exec, so children of a process that has just
run sweeps all read ~1.3 GiB. On Linux we therefore read the high-water mark of this process
alone, VmHWM in /proc/self/status, after resetting it to the current RSS
(``echo 5 > /proc/self/clear_refs``, Linux >= 4.0): each measurement is then independent of set-up
and of earlier sizes (method "VmHWM reset"). Elsewhere we fall back to ru_maxrss (method
"ru_maxrss"); a measurement whose peak stays below the running maximum is flagged
``resolved=False`` (an upper bound), which is why curves run sizes in increasing order (a
later impl in the same child then reads unresolved at its small sizes). On CUDA
the peak is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` and the baseline
``memory_allocated`` (method "cuda.max_memory_allocated"; docs/methods.md: never nvidia-smi).

Other caveats: the allocator may keep freed memory, inflating a baseline; children get glibc's
``MALLOC_MMAP_THRESHOLD_`` so large buffers are mmapped and returned to the OS on free (setting it
also turns off glibc's dynamic threshold, which would keep freed large buffers on the heap).
Resolution is a page, and libraries allocate lazily: the curve child makes a warm-up call at a
small N so one-time initialisation is not charged to the first point. All values are bytes.

Curve child: ``python -m measure.memory --mechanism ID --impl fast --sizes 1024 2048 ... [--impl
dense --sizes ...] [--variant NAME] [--device cpu] [--seed 0]`` (one child per mechanism: one torch
import, the impls in turn, each size in increasing order) prints one JSON object per line on
stdout: per impl first {"impl", "import_baseline_bytes", "method", "variant"}, then {"impl", "n",
"peak_bytes", "baseline_bytes", "resolved"} per size.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from results.schema import MemoryCurve, MemoryPoint

MIB = 1024 * 1024
#: glibc: allocations >= 64 KiB are mmapped (and unmapped on free); see the module docstring.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
#: The curve children also run one thread (memory, not speed, is measured; keeps 2 cores usable).
CURVE_ENV = {**MALLOC_ENV, "OMP_NUM_THREADS": "1"}
#: Quick mode caps the curve grids so each child stays within a few seconds.
QUICK_FAST_CAP = 2**15
QUICK_DENSE_CAP = 2**12
#: A curve child that runs longer than this is stopped; the sizes it finished are kept.
CHILD_TIMEOUT_S = 300.0

METHOD_HWM, METHOD_MAXRSS, METHOD_CUDA = "VmHWM reset", "ru_maxrss", "cuda.max_memory_allocated"


# ------------------------------------------------------------------------------ the helper


def _proc_status_bytes(name: str) -> int | None:
    """A "Vm..." line of /proc/self/status in bytes, None without procfs."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def maxrss_bytes() -> int:
    """ru_maxrss of this process in bytes (KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def rss_bytes() -> int:
    """Current resident set (VmRSS); without procfs, the running maximum (ru_maxrss)."""
    rss = _proc_status_bytes("VmRSS")
    return maxrss_bytes() if rss is None else rss


def reset_peak() -> bool:
    """Reset this process's RSS high-water mark (VmHWM) to the current RSS (Linux >= 4.0);
    False where that is unavailable (peaks are then monotone within the process)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _proc_status_bytes("VmHWM") is not None


def peak_rss_bytes() -> int:
    """VmHWM (bytes), else ru_maxrss."""
    hwm = _proc_status_bytes("VmHWM")
    return maxrss_bytes() if hwm is None else hwm


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


@dataclass
class Peak:
    """One measurement of ``peak_memory``: absolute bytes; ``extra`` = peak - baseline (>= 0).

    resolved: False when only ru_maxrss was available and it did not move (``peak`` is then the
    running maximum, an upper bound on this measurement's peak)."""

    method: str
    baseline: int
    peak: int = 0
    resolved: bool = True

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.baseline)


def freeze_survivors() -> None:
    """Collect cyclic garbage once, then move every object alive now (torch, the registry, its
    imports: about 200,000 objects) out of the cycle collector's view (``gc.freeze``), so that each
    later ``gc.collect()`` walks only what was made after: 0.5-0.7 s per collect before, a few
    microseconds after, on our 2-core machines. The memory children collect around every point (the
    full grid spent about half of its time there). Frozen objects are still freed when their last
    reference goes; only cycles among them are never collected, and the imports hold none that
    should be.

    >>> import gc
    >>> from measure.memory import freeze_survivors
    >>> freeze_survivors()
    >>> gc.get_freeze_count() > 0
    True
    >>> gc.unfreeze()
    """
    import gc

    gc.collect()
    gc.freeze()


def peak_method(device: str = "cpu") -> str:
    """The method ``peak_memory`` uses on ``device`` here (see the module docstring)."""
    if _is_cuda(device):
        return METHOD_CUDA
    return METHOD_HWM if reset_peak() else METHOD_MAXRSS


@contextlib.contextmanager
def peak_memory(device: str = "cpu"):
    """Measure the peak memory of the enclosed block: ``with peak_memory() as pk: run()``, then
    ``pk.peak``, ``pk.baseline``, ``pk.extra`` (bytes), ``pk.method``, ``pk.resolved``.

    CPU: VmHWM reset to the current RSS on entry, read on exit (ru_maxrss fallback); CUDA:
    torch.cuda peak statistics reset on entry, max_memory_allocated on exit (synchronised).
    """
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        pk = Peak(METHOD_CUDA, int(torch.cuda.memory_allocated(device)))
        try:
            yield pk
        finally:
            torch.cuda.synchronize(device)
            pk.peak = int(torch.cuda.max_memory_allocated(device))
        return
    if reset_peak():
        pk = Peak(METHOD_HWM, rss_bytes())
        try:
            yield pk
        finally:
            pk.peak = peak_rss_bytes()
        return
    pk = Peak(METHOD_MAXRSS, rss_bytes())
    before = maxrss_bytes()
    try:
        yield pk
    finally:
        pk.peak = maxrss_bytes()
        pk.resolved = pk.peak > before


# ------------------------------------------------------------------------------ child processes


def _tail(text: str, lines: int = 1) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def worker_argv(mech_id: str, n: int, *, device: str = "cpu", seed: int = 0, calls: int = 2, train: bool = False,
                threads: int | None = None, reference=None, reference_threads: int = 1,
                stop_ratio: float | None = None, budget: float | None = None) -> list[str]:
    """The worker's command-line arguments for one request (None: the flag is not passed)."""
    argv = [mech_id, str(int(n)), "--device", str(device), "--seed", str(int(seed)), "--calls", str(int(calls))]
    argv += ["--train"] if train else []
    if threads is not None:
        argv += ["--threads", str(int(threads))]
    if reference:
        argv += ["--reference", *(str(int(r)) for r in reference), "--reference-threads", str(int(reference_threads))]
    for flag, value in (("--stop-ratio", stop_ratio), ("--budget", budget)):
        if value is not None:
            argv += [flag, repr(float(value))]
    return argv


def run_scale_worker(mech_id: str, n: int, *, device: str = "cpu", seed: int = 0, calls: int = 2,
                     train: bool = False, timeout: float = 900.0, threads: int | None = None,
                     reference: Sequence[int] | None = None, reference_threads: int = 1,
                     stop_ratio: float | None = None, budget: float | None = None) -> dict:
    """Run ``python -m measure.scale_worker`` (one fast path at N in a child process) and return its
    JSON report (keys: see measure.scale_worker). mech_id: a registry id or ``module:attribute`` of
    an unregistered record (the child then gets this process's sys.path, so it imports what this
    process can); threads, reference, reference_threads, stop_ratio, budget: the worker's
    --threads, --reference, --reference-threads, --stop-ratio, --budget (None: not passed).
    RuntimeError naming the mechanism and N, with the child's stderr tail, if it fails;
    subprocess.TimeoutExpired after ``timeout`` seconds of wall time (a backstop: the worker's own
    --stop-ratio / --budget stops a slow call far earlier)."""
    cmd = [sys.executable, "-m", "measure.scale_worker"] + worker_argv(
        mech_id, n, device=device, seed=seed, calls=calls, train=train, threads=threads, reference=reference,
        reference_threads=reference_threads, stop_ratio=stop_ratio, budget=budget)
    env = {**os.environ, **MALLOC_ENV}
    if ":" in mech_id:  # a record outside the registry: its module must import in the child too
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"scale worker for {mech_id} at N={n}{' (train)' if train else ''} exited with "
                           f"status {proc.returncode}:\n{proc.stderr[-2000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"scale worker for {mech_id} at N={n} printed no JSON ({exc}): "
                           f"{proc.stdout[-500:]!r}") from None


def memory_sizes(mech, impl: str, quick: bool, variant: str | None = None) -> tuple[int, ...]:
    """The N grid of a memory curve: the sweep grid (increasing), capped in quick mode."""
    sizes = mech.sizes(impl, quick, variant)
    if quick:
        cap = QUICK_FAST_CAP if impl == "fast" else QUICK_DENSE_CAP
        sizes = tuple(n for n in sizes if n <= cap) or tuple(sorted(sizes))[:1]
    return tuple(sorted(sizes))


def memory_curve(mech_id: str, impl: str, sizes: Iterable[int], *, variant: str | None = None,
                 device: str = "cpu", seed: int = 0, on_point: Callable[[], None] | None = None,
                 timeout: float = CHILD_TIMEOUT_S) -> MemoryCurve:
    """One (mechanism, impl) curve in a child of its own (``memory_curves`` with one task)."""
    return memory_curves(mech_id, [(impl, sizes)], variant=variant, device=device, seed=seed,
                         on_point=on_point, timeout=timeout)[0]


def memory_curves(mech_id: str, tasks: Sequence[tuple[str, Iterable[int]]], *, variant: str | None = None,
                  device: str = "cpu", seed: int = 0, on_point: Callable[[], None] | None = None,
                  timeout: float = CHILD_TIMEOUT_S) -> list[MemoryCurve]:
    """Curves of one mechanism for each (impl, sizes) of ``tasks``, in ONE child process (one torch
    import instead of one per impl; every point resets the peak mark, so the impls do not see each
    other's peaks where VmHWM can be reset). ``on_point()`` after each point. Never raises for the
    child: what stopped it (exit status, timeout) goes to the ``error`` of every curve it left
    unfinished; finished sizes stay."""
    tasks = [(impl, [int(n) for n in sizes]) for impl, sizes in tasks]
    if not tasks:
        return []
    cmd = [sys.executable, "-m", "measure.memory", "--mechanism", mech_id, "--device", str(device),
           "--seed", str(int(seed))]
    for impl, sizes in tasks:
        cmd += ["--impl", impl, "--sizes", *map(str, sizes)]
    if variant is not None:
        cmd += ["--variant", variant]
    curves = {impl: MemoryCurve(mech_id, variant or "", impl, str(device)) for impl, _ in tasks}
    env = {**os.environ, **CURVE_ENV}
    killed = threading.Event()
    # stderr goes to a file: a chatty child must never block on a full pipe we are not reading.
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)

        def kill():  # this child only, by its own handle
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            for line in proc.stdout:
                rec = json.loads(line)
                curve = curves[rec.pop("impl")]
                if "method" in rec:
                    curve.import_baseline_bytes, curve.method = rec["import_baseline_bytes"], rec["method"]
                    curve.variant = rec.get("variant", curve.variant)
                    continue
                curve.points.append(MemoryPoint(**rec))
                if on_point is not None:
                    on_point()
            rc = proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        stderr = err.read()
    for impl, sizes in tasks:
        curve = curves[impl]
        if len(curve.points) == len(sizes):
            continue
        if killed.is_set():
            curve.error = f"stopped after {timeout:.0f} s with {len(curve.points)} of {len(sizes)} sizes done"
        elif rc != 0:
            curve.error = (f"child exited with status {rc} after {len(curve.points)} of {len(sizes)} sizes: "
                           f"{_tail(stderr)}")
        else:
            curve.error = f"child ended after {len(curve.points)} of {len(sizes)} sizes"
    return [curves[impl] for impl, _ in tasks]


def _curve_child(mech_id: str, tasks: list[tuple[str, list[int]]], variant: str | None, device: str,
                 seed: int) -> None:
    import gc

    import torch

    from verify.mechanisms import get

    torch.set_num_threads(1)
    mech = get(mech_id)
    v = mech.variant(variant)
    for impl, sizes in tasks:
        setup = mech.fast_setup if impl == "fast" else mech.dense_setup
        if setup is None:
            raise SystemExit(f"mechanism {mech_id!r} has no {impl} implementation")
        with torch.inference_mode():
            try:  # warm-up at a small N: lazy library initialisation is not charged to a point
                setup(mech.problem(mech.admissible(max(16, min(sizes) // 4)), seed, v), device, torch.float32)()
            except Exception:  # noqa: BLE001 - a mechanism may refuse tiny N; the warm-up is optional
                pass
            freeze_survivors()  # each gc.collect() below then costs microseconds, not 0.5 s
            print(json.dumps({"impl": impl, "import_baseline_bytes": rss_bytes(), "method": peak_method(device),
                              "variant": v.name}), flush=True)
            for n in sorted(sizes):
                runner = setup(mech.problem(n, seed, v), device, torch.float32)
                gc.collect()
                with peak_memory(device) as pk:  # set-up temporaries and earlier sizes no longer count
                    out = runner()
                del out, runner
                gc.collect()
                print(json.dumps({"impl": impl, "n": n, "peak_bytes": pk.extra, "baseline_bytes": pk.baseline,
                                  "resolved": pk.resolved}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Curve child entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m measure.memory", description="peak memory vs N (child process)")
    ap.add_argument("--mechanism", required=True)
    ap.add_argument("--impl", choices=("fast", "dense"), action="append", required=True,
                    help="an implementation; repeat --impl X --sizes ... for several in one child")
    ap.add_argument("--sizes", type=int, nargs="+", action="append", required=True,
                    help="the N of the --impl before it")
    ap.add_argument("--variant", default=None, help="registry variant name (default: the mechanism's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if len(args.impl) != len(args.sizes):
        ap.error(f"give one --sizes per --impl, got {len(args.impl)} --impl and {len(args.sizes)} --sizes")
    if len(set(args.impl)) != len(args.impl):
        ap.error(f"each --impl once, got {args.impl}")
    if min(min(s) for s in args.sizes) < 1:
        ap.error(f"--sizes must be positive, got {args.sizes}")
    _curve_child(args.mechanism, list(zip(args.impl, args.sizes)), args.variant, args.device, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
