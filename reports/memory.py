"""Peak memory of each fast path and its dense twin vs N, one subprocess per (mechanism, impl).

Method (CPU). One child process per (mechanism, impl) runs the sizes in INCREASING order. For
each N it builds the problem and the runner (untimed setup), takes the CURRENT resident set
(VmRSS) as the baseline, runs the computation once and reads the peak resident set; the point is

    peak(N) = peak RSS during the call  -  RSS after imports and problem setup,

i.e. the extra memory the computation itself needed on top of its inputs.

Which peak. ``getrusage(RUSAGE_SELF).ru_maxrss`` is monotone within a process, and we measured
two ways it misleads here: (1) setup temporaries (a dense twin builds its N x N mask in float64
before converting it) raise it above what the call needs, so the call's own peak is hidden;
(2) on Linux ru_maxrss also includes the PARENT's peak inherited across fork/exec, so children of
the report process (which has just run the sweeps) all read ~1.3 GiB. On Linux we therefore
read the same high-water mark of this process alone, VmHWM in /proc/self/status, and reset it to
the current RSS before each call (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0): each point
is then independent of setup and of earlier sizes. Elsewhere we fall back to ru_maxrss; a size
whose peak stays below the running maximum is then flagged ``resolved=False`` (an upper bound),
which is why sizes go in increasing order. ``MemoryCurve.method`` records which was used.

Other caveats: the allocator may keep freed memory, inflating the baseline; the child sets
glibc's ``MALLOC_MMAP_THRESHOLD_`` so large buffers are mmapped and returned to the OS on free.
Resolution is a page, and libraries allocate lazily: a warm-up call at a small N precedes the
measurements so one-time initialisation is not charged to the first point. On CUDA the child
uses ``torch.cuda.max_memory_allocated`` after a reset instead (docs/methods.md: never nvidia-smi).

Run as ``python -m reports.memory --mechanism ID --impl fast --sizes 1024 2048 ...``: the child
prints one JSON object per size on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Iterable

from tqdm.auto import tqdm

MIB = 1024.0 * 1024.0
#: glibc: allocations >= 64 KiB are mmapped (and unmapped on free); setting it also turns off
#: glibc's dynamic threshold, which would otherwise keep freed large buffers on the heap.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024), "OMP_NUM_THREADS": "1"}
#: Quick mode caps the N grids so the subprocesses stay within a few seconds each.
QUICK_FAST_CAP = 2**15
QUICK_DENSE_CAP = 2**12
#: A child that runs longer than this is stopped; the sizes it finished are kept.
CHILD_TIMEOUT_S = 300.0


@dataclass
class MemoryPoint:
    """Peak extra memory (MiB) of one call at size n, and the baseline it was measured against."""

    n: int
    peak_mib: float
    baseline_mib: float
    resolved: bool = True  # False: ru_maxrss did not move, peak_mib is an upper bound


@dataclass
class MemoryCurve:
    """All sizes of one (mechanism, impl); ``error`` holds what stopped the child, if anything."""

    mechanism: str
    impl: str
    device: str
    points: list[MemoryPoint] = field(default_factory=list)
    import_baseline_mib: float | None = None
    method: str = ""  # "VmHWM reset" | "ru_maxrss" | "cuda.max_memory_allocated"
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def mib_text(mib: float) -> str:
    """A memory size for people: "39.8 MiB", "2.05 GiB"."""
    return f"{mib / 1024:.3g} GiB" if mib >= 1024 else f"{mib:.3g} MiB"


def memory_sizes(mech, impl: str, quick: bool) -> tuple[int, ...]:
    """The N grid to measure: the sweep grid, capped in quick mode (keeps the run short)."""
    from reports.sweeps import sweep_sizes

    sizes = sweep_sizes(mech, impl, quick)
    if quick:
        cap = QUICK_FAST_CAP if impl == "fast" else QUICK_DENSE_CAP
        sizes = tuple(n for n in sizes if n <= cap) or sizes[:1]
    return tuple(sorted(sizes))


# ------------------------------------------------------------------------------------ child


def _maxrss_mib() -> float:
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / MIB if sys.platform == "darwin" else rss / 1024.0  # bytes on macOS, KiB on Linux


def _proc_status_mib(field_name: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return None


def _current_rss_mib() -> float:
    rss = _proc_status_mib("VmRSS")
    return _maxrss_mib() if rss is None else rss  # no procfs (macOS): the running maximum


def _reset_peak() -> bool:
    """Reset this process's RSS high-water mark to the current RSS (Linux >= 4.0); False if
    unavailable, in which case peaks are monotone within the process (see module docstring)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status_mib("VmHWM") is not None
    except OSError:
        return False


def _child(mech_id: str, impl: str, sizes: list[int], device: str, seed: int) -> None:
    import gc

    import torch

    from verify.registry import get

    torch.set_num_threads(1)
    mech = get(mech_id)
    setup = mech.fast_setup if impl == "fast" else mech.dense_setup
    if setup is None:
        raise SystemExit(f"mechanism {mech_id!r} has no {impl} implementation")
    cuda = str(device).startswith("cuda")
    with torch.inference_mode():
        try:  # warm-up at a small N: lazy library initialisation is not charged to a point
            setup(mech.make_problem(max(16, min(sizes) // 4), seed), device, torch.float32)()
        except Exception:  # noqa: BLE001 - a mechanism may refuse tiny N; the warm-up is optional
            pass
        gc.collect()
        method = "cuda.max_memory_allocated" if cuda else ("VmHWM reset" if _reset_peak() else "ru_maxrss")
        print(json.dumps({"import_baseline_mib": _current_rss_mib(), "method": method}), flush=True)
        for n in sizes:
            runner = setup(mech.make_problem(n, seed), device, torch.float32)
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated() / MIB
                out = runner()
                torch.cuda.synchronize()
                peak, resolved = torch.cuda.max_memory_allocated() / MIB, True
            elif method == "VmHWM reset":
                # Setup temporaries (e.g. a float64 dense mask) and earlier sizes no longer count.
                _reset_peak()
                base = _current_rss_mib()
                out = runner()
                peak, resolved = _proc_status_mib("VmHWM"), True
            else:
                base, before = _current_rss_mib(), _maxrss_mib()
                out = runner()
                peak = _maxrss_mib()
                resolved = peak > before
            del out, runner
            gc.collect()
            print(json.dumps({"n": n, "peak_mib": max(0.0, peak - base), "baseline_mib": base,
                              "resolved": resolved}), flush=True)


# ----------------------------------------------------------------------------------- parent


def measure_curve(mech_id: str, impl: str, sizes: Iterable[int], device: str = "cpu", seed: int = 0,
                  on_point=None, timeout: float = CHILD_TIMEOUT_S) -> MemoryCurve:
    """Run one child process and collect its points; ``on_point()`` is called after each size."""
    cmd = [sys.executable, "-m", "reports.memory", "--mechanism", mech_id, "--impl", impl,
           "--device", device, "--seed", str(seed), "--sizes", *map(str, sizes)]
    curve = MemoryCurve(mech_id, impl, device)
    env = {**os.environ, **CHILD_ENV}
    # stderr goes to a file: a chatty child must never block on a full pipe we are not reading.
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        # The timer kills this child (by its own pid) if it hangs; its stdout then closes.
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                rec = json.loads(line)
                if "import_baseline_mib" in rec:
                    curve.import_baseline_mib, curve.method = rec["import_baseline_mib"], rec["method"]
                    continue
                curve.points.append(MemoryPoint(**rec))
                if on_point is not None:
                    on_point()
            rc = proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        stderr = err.read()
    if rc != 0:
        tail = stderr.strip().splitlines()[-1:] or [""]
        curve.error = f"child exited with status {rc} after {len(curve.points)} sizes: {tail[0]}"
    return curve


def run_memory(mechs: Iterable, quick: bool, device: str = "cpu", jobs: int = 2,
               progress: bool = True) -> dict[str, dict[str, MemoryCurve]]:
    """Peak memory curves {mechanism id: {impl: MemoryCurve}} for every mechanism.

    Children run ``jobs`` at a time: memory is per process, so running them side by side does not
    disturb the numbers (unlike timing, which is never done concurrently).
    """
    mechs = list(mechs)
    tasks = [(m.id, impl, memory_sizes(m, impl, quick)) for m in mechs for impl in ("fast", "dense")
             if impl == "fast" or m.dense_setup is not None]
    out: dict[str, dict[str, MemoryCurve]] = {m.id: {} for m in mechs}
    lock = threading.Lock()
    with tqdm(total=sum(len(s) for _, _, s in tasks), desc="memory", unit="pt", disable=not progress) as bar:

        def tick():
            with lock:
                bar.update(1)

        def one(task):
            mech_id, impl, sizes = task
            return measure_curve(mech_id, impl, sizes, device, on_point=tick)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for curve in pool.map(one, tasks):
                out[curve.mechanism][curve.impl] = curve
    return out


def main(argv: list[str] | None = None) -> None:
    """Child entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m reports.memory", description="peak memory child")
    ap.add_argument("--mechanism", required=True)
    ap.add_argument("--impl", choices=("fast", "dense"), required=True)
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    _child(args.mechanism, args.impl, sorted(args.sizes), args.device, args.seed)


if __name__ == "__main__":
    main()
