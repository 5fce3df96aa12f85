"""Child process of the scale checks: run one fast path once at a large N and report JSON.

    python -m verify.scale_worker MECHANISM N [--device cpu] [--seed 0]

Runs in its own process so that its peak RSS (ru_maxrss) belongs to this problem alone.
Prints one JSON object: setup_s, first_s, second_s (the last call), calls_s (all), baseline_rss (before setup), after_setup_rss,
peak_rss (bytes; the peak mark is reset after setup where Linux allows, so it is the run's peak),
finite, shape.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) so the run's peak excludes setup (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """VmHWM from /proc/self/status (bytes), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify.scale_worker")
    ap.add_argument("mechanism")
    ap.add_argument("n", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=2, help="timed calls (>= 1); the report keeps each")
    args = ap.parse_args(argv)

    import torch

    from verify.registry import get

    mech = get(args.mechanism)
    baseline = _rss_now()
    t0 = time.perf_counter()
    runner = mech.fast_setup(mech.make_problem(args.n, args.seed), args.device, torch.float32)
    setup_s = time.perf_counter() - t0
    after_setup = _rss_now()
    reset = _reset_peak()
    timings = []
    with torch.inference_mode():
        for _ in range(max(1, args.calls)):
            t0 = time.perf_counter()
            out = runner()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - t0)
            finite = bool(torch.isfinite(out).all())
            shape = list(out.shape)
            del out
    peak = _peak_rss()
    report = {"mechanism": mech.id, "n": args.n, "setup_s": setup_s, "first_s": timings[0],
              "second_s": timings[-1], "calls_s": timings, "baseline_rss": baseline, "after_setup_rss": after_setup,
              "peak_rss": peak, "peak_reset_after_setup": reset, "finite": finite,
              "shape": shape, "threads": torch.get_num_threads(), "device": args.device}
    if args.device.startswith("cuda"):
        report["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
