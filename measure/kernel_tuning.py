"""python -m measure.kernel_tuning: the Triton causal scan's launch configurations, each checked
and then timed on one GPU, for choosing the defaults of fast.kernels.causal_scan.kernel_blocks.

    python -m measure.kernel_tuning [--device cuda] [--n 16384,131072] [--dtype float32,bfloat16]
        [--shape B,H,d,m] [--budget 150] [--candidates K] [--stable] [--out reports/out/kernel-tuning.json]

A candidate is a (chunk C, value block BD, warps) for the forward kernel and one for the backward
(the feature block BM is all m features, as kernel_blocks takes it). For each N, dtype and
candidate, in that order while ``--budget`` seconds last:

1. check: CausalMask.attend's (num, den) and the gradients of phi_q, phi_k and v under the
   candidate against those under the default configuration on the same positive features; the
   largest relative difference (Frobenius, per output) must stay within 2^-10 in float32 and
   2^-6 in bfloat16 (two summation orders of sums whose terms are positive or, for the
   gradients, of one sign per product: far below those; a wrong tile, mask or carry is O(1)).
   A candidate that fails is reported with its difference and never timed;
2. time: forward, and forward + backward, by measure.gpu.time_point (one warm-up call, which
   compiles, then the median of synchronised rounds).

The JSON (rewritten after every candidate, so a stopped run keeps what finished) lists every row
with its configuration, N, dtype, check and times, and names the fastest candidate per (N,
dtype, pass). Runs on a CPU too when TRITON_INTERPRET=1 was set before Triton's import (the test
does, at a tiny N: the interpreter's times mean nothing). Exit status 0, or 1 when a candidate
computed another function, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator

#: (forward (C, BD, warps), backward (C, BD, warps)): kernel_blocks' choices at m = d = 64 in float32
#: and in half precision first, then the defaults before the H100 sweep of 2026-11-28 (8 warps) and
#: their neighbours.
CANDIDATES = (
    ((16, 64, 4), (16, 64, 4)),
    ((32, 64, 4), (16, 64, 4)),
    ((32, 64, 8), (32, 32, 8)),
    ((16, 64, 2), (16, 64, 2)),
    ((16, 32, 4), (16, 32, 4)),
    ((32, 64, 4), (32, 64, 4)),
    ((64, 64, 4), (16, 64, 4)),
)
#: The largest relative difference a candidate may have from the default configuration.
AGREEMENT = {"float32": 2.0 ** -10, "bfloat16": 2.0 ** -6}
DEFAULT_OUT = Path("reports") / "out" / "kernel-tuning.json"


@contextlib.contextmanager
def launch_config(forward_config: tuple[int, int, int], backward_config: tuple[int, int, int]) -> Iterator[None]:
    """fast.kernels.causal_scan.kernel_blocks answering (C, BM, BD, warps) from the candidate (BM:
    every feature, as kernel_blocks takes it) while the block runs."""
    import fast.kernels.causal_scan as scan

    default = scan.kernel_blocks

    def blocks(m: int, d: int, backward: bool = False, dtype=None) -> tuple[int, int, int, int]:
        bm = default(m, d, backward, dtype)[1]
        c, bd, warps = backward_config if backward else forward_config
        return c, bm, bd, warps

    scan.kernel_blocks = blocks
    try:
        yield
    finally:
        scan.kernel_blocks = default


def _outputs(n: int, dtype: str, device: str, shape: tuple[int, int, int, int], stable: bool = False) -> list:
    """(num, den, d phi_q, d phi_k, d v) of CausalMask(n).attend on seeded positive features (with
    ``stable``, and per-key constants: the running maximum of Gaussian rows, spread 3)."""
    import torch
    import torch.nn.functional as F

    import fast

    b, h, d, m = shape
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q, k = ((F.elu(torch.randn(b, h, n, m, generator=g)) + 1).to(device, dt).requires_grad_() for _ in range(2))
    v = torch.randn(b, h, n, d, generator=g).to(device, dt).requires_grad_()
    c = None
    if stable:
        c = torch.cummax(3 * torch.randn(b, h, n, generator=g), dim=-1).values.unsqueeze(-1).to(device)
    num, den = fast.CausalMask(n).attend(q, k, v, key_log_scale=c)
    gn, gd = torch.randn(num.shape, generator=g).to(device, dt), torch.randn(den.shape, generator=g).to(device, dt)
    torch.autograd.backward((num, den), (gn, gd))
    return [t.detach().float() for t in (num, den, q.grad, k.grad, v.grad)]


def difference(got: list, want: list) -> float:
    """The largest relative Frobenius difference between matching tensors of got and want."""
    return max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got, want))


def tune(device: str, sizes: tuple[int, ...], dtypes: tuple[str, ...], shape: tuple[int, int, int, int],
         budget_s: float, out: Path | None = None, candidates=CANDIDATES, rounds: int = 3,
         stable: bool = False) -> dict:
    """The rows of the module doc (``rows``), the fastest candidate per (N, dtype, pass) (``best``)
    and the candidates not reached in ``budget_s`` (``not_run``); written to ``out`` after each row.
    stable: the stabilised scan (per-key constants, FAVOR+'s route: measure.gpu's "attend-stable")."""
    from measure.gpu import PASSES, causal_runner, time_point

    start = time.perf_counter()
    result: dict = {"device": device, "shape": dict(zip("BHdm", shape)), "stable": stable, "rows": [], "not_run": [],
                    "best": {}}
    impl = "attend-stable" if stable else "attend"

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))

    for n in sizes:
        for dtype in dtypes:
            want = None
            for fwd, bwd in candidates:
                row = {"n": n, "dtype": dtype, "forward_config": list(fwd), "backward_config": list(bwd)}
                if time.perf_counter() - start >= budget_s:
                    result["not_run"].append(row)
                    continue
                if want is None:
                    want = _outputs(n, dtype, device, shape, stable)  # the default configuration
                with launch_config(fwd, bwd):
                    row["difference"] = difference(_outputs(n, dtype, device, shape, stable), want)
                    row["agrees"] = row["difference"] <= AGREEMENT[dtype]
                    if row["agrees"]:
                        for pass_ in PASSES:
                            runner = causal_runner(impl, n, dtype, pass_, device, shape=shape)
                            row[pass_] = time_point(runner, device, rounds)
                result["rows"].append(row)
                save()
                print(f"kernel_tuning: N = {n:,} {dtype} forward {fwd} backward {bwd}: difference "
                      f"{row['difference']:.2e}" + "".join(f", {p} {row[p][len(row[p]) // 2] * 1e3:.3g} ms"
                                                            for p in PASSES if p in row), flush=True)
    for row in result["rows"]:
        for pass_ in PASSES:
            if pass_ not in row:
                continue
            key = f"{row['n']} {row['dtype']} {pass_}"
            median = row[pass_][len(row[pass_]) // 2]
            if key not in result["best"] or median < result["best"][key]["seconds"]:
                result["best"][key] = {"seconds": median, "forward_config": row["forward_config"],
                                       "backward_config": row["backward_config"]}
    result["seconds"] = round(time.perf_counter() - start, 2)
    save()
    return result


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.kernel_tuning", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu under TRITON_INTERPRET=1")
    ap.add_argument("--n", type=_ints, default=(2**14, 2**17), help="comma-separated N (default 16384,131072)")
    ap.add_argument("--dtype", default="float32,bfloat16", help="comma-separated dtypes among float32,bfloat16")
    ap.add_argument("--shape", type=_ints, default=(1, 8, 64, 64), help="B,H,d,m (default 1,8,64,64)")
    ap.add_argument("--budget", type=float, default=150.0, help="wall seconds (default 150)")
    ap.add_argument("--candidates", type=int, default=len(CANDIDATES),
                    help=f"time the first K of the {len(CANDIDATES)} candidates (default all)")
    ap.add_argument("--stable", action="store_true",
                    help="tune the stabilised scan (per-key constants, the route of causal FAVOR+)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"results JSON (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    dtypes = tuple(args.dtype.split(","))
    if any(d not in AGREEMENT for d in dtypes):
        ap.error(f"--dtype takes float32 and bfloat16, got {args.dtype!r}")
    if len(args.shape) != 4:
        ap.error(f"--shape takes B,H,d,m, got {args.shape}")
    if not args.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        ap.error("a CPU device needs TRITON_INTERPRET=1 (Triton's interpreter; its times mean nothing)")
    if not 1 <= args.candidates <= len(CANDIDATES):
        ap.error(f"--candidates takes 1 to {len(CANDIDATES)}, got {args.candidates}")
    from fast.kernels import dispatch

    if not args.device.startswith("cuda"):
        dispatch.CAUSAL_KERNEL = "force"  # CausalMask.attend takes the kernel on CPU tensors (interpreter)
    result = tune(args.device, args.n, dtypes, args.shape, args.budget, Path(args.out),
                  candidates=CANDIDATES[:args.candidates], stable=args.stable)
    for key, best in result["best"].items():
        print(f"fastest at {key}: forward {tuple(best['forward_config'])} backward "
              f"{tuple(best['backward_config'])}, {best['seconds'] * 1e3:.3g} ms")
    return 1 if any(not row["agrees"] for row in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
