"""Child process of the scale checks: run one fast path at a large N and report JSON.

    python -m verify.scale_worker MECHANISM N [--device cpu] [--seed 0] [--calls 2] [--train]

Runs in its own process so that its peak memory belongs to this problem alone (the parent calls
it through verify.memory.run_scale_worker). The peak is read by verify.memory.peak_memory (VmHWM
reset after set-up, ru_maxrss fallback; on CUDA also torch.cuda.max_memory_allocated), the same
helper the memory-vs-N curves use.

--train: the runner is built with requires_grad=True (Mechanism.fast_setup(problem, device,
dtype, requires_grad=True): q, k, v are leaves that require grad) and each call runs the forward
pass and ``out.sum().backward()``, so the peak covers the tensors autograd saves for backward
(scale/<id>-train). Without it, calls run forward only under torch.inference_mode().

Prints one JSON object (bytes, seconds): mechanism, n, train, setup_s, first_s, second_s (the last
call), calls_s (all), baseline_rss (before set-up), after_setup_rss, peak_rss (absolute; the peak
mark is reset after set-up where Linux allows, so it is the calls' peak), peak_method,
peak_reset_after_setup, finite (the output of every call), shape, threads, device, and on CUDA
cuda_max_allocated.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verify.scale_worker")
    ap.add_argument("mechanism")
    ap.add_argument("n", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=2, help="timed calls (>= 1); the report keeps each")
    ap.add_argument("--train", action="store_true", help="forward + out.sum().backward() per call, inputs require grad")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"N must be >= 1, got {args.n}")

    import torch

    from verify.mechanisms import get
    from verify.memory import METHOD_HWM, peak_memory, rss_bytes

    mech = get(args.mechanism)
    cuda = args.device.startswith("cuda")
    baseline = rss_bytes()
    t0 = time.perf_counter()
    problem = mech.problem(args.n, args.seed)
    if args.train:
        runner = mech.fast_setup(problem, args.device, torch.float32, requires_grad=True)
    else:
        runner = mech.fast_setup(problem, args.device, torch.float32)
    del problem
    setup_s = time.perf_counter() - t0
    after_setup = rss_bytes()
    timings, finite, shape = [], True, []
    mode = torch.enable_grad() if args.train else torch.inference_mode()
    with peak_memory("cpu") as pk, (peak_memory(args.device) if cuda else contextlib.nullcontext()) as cuda_pk, mode:
        for _ in range(max(1, args.calls)):
            t0 = time.perf_counter()
            out = runner()
            if args.train:
                out.sum().backward()
            if cuda:
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - t0)
            finite = finite and bool(torch.isfinite(out.detach()).all())
            shape = list(out.shape)
            del out
    report = {"mechanism": mech.id, "n": args.n, "train": bool(args.train), "setup_s": setup_s,
              "first_s": timings[0], "second_s": timings[-1], "calls_s": timings, "baseline_rss": baseline,
              "after_setup_rss": after_setup, "peak_rss": pk.peak, "peak_method": pk.method,
              "peak_reset_after_setup": pk.method == METHOD_HWM, "finite": finite, "shape": shape,
              "threads": torch.get_num_threads(), "device": args.device}
    if cuda:
        report["cuda_max_allocated"] = cuda_pk.peak
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
