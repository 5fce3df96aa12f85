"""scale/<mechanism>: the fast path completes at N = 2^20, where a dense N x N matrix cannot exist.

A deterministic, noise-free proof of sub-quadratic memory (docs/methods.md): one float32 N x N
matrix at N = 2^20 needs 4 TiB, this machine has 24 GiB. The check runs the fast path in a
child process (verify.scale_worker) so its peak RSS is its own, and passes if the output is
finite with the right shape, the peak memory stays below 1/1000 of one dense matrix, and one
call finishes within TIME_LIMIT_S (generous: sub-quadratic time, not speed, is the claim).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from verify.result import Check, CheckResult, Context

N = 2**20
TIME_LIMIT_S = 300.0
#: Mechanisms proven at scale in this issue; later families add theirs.
SCALE_MECHANISMS = {"linear": "choromanski22 Eq. 3", "causal": "choromanski22 Sec. 3.1",
                    "block-toeplitz": "choromanski22 Sec. 3.2, Lemma 3.3 (a 1024 x 1024 grid, d = m = 16)",
                    "tree-exp": "choromanski22 Lemma 3.5 (random recursive forest)"}


def run_worker(mech_id: str, n: int, device: str, seed: int, timeout: float, calls: int = 2) -> dict:
    """Run verify.scale_worker in a child process and return its JSON report."""
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "verify.scale_worker", mech_id, str(n), "--device", device,
                           "--seed", str(seed), "--calls", str(calls)], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"scale worker for {mech_id} at N={n} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _run(mech_id: str, source: str, ctx: Context) -> CheckResult:
    start = time.perf_counter()
    # quick: one call (the first includes one-off costs such as a cached FFT spectrum: an upper bound)
    report = run_worker(mech_id, N, ctx.device, ctx.seed, timeout=TIME_LIMIT_S * 3, calls=1 if ctx.quick else 2)
    dense_bytes = 4 * N * N
    limit = dense_bytes / 1000
    # the run's own peak above the process before any problem existed (inputs are O(N) too)
    used = report["peak_rss"] - report["baseline_rss"]
    call_s = min(report["first_s"], report["second_s"])
    reasons = []
    if not report["finite"]:
        reasons.append("output has non-finite values")
    if report["shape"][-2] != N:
        reasons.append(f"output shape {report['shape']} lacks N={N}")
    if used > limit:
        reasons.append(f"peak memory {used / 2**30:.2f} GiB > {limit / 2**30:.2f} GiB")
    if call_s > TIME_LIMIT_S:
        reasons.append(f"one call took {call_s:.1f} s > {TIME_LIMIT_S} s")
    return CheckResult(
        id=f"scale/{mech_id}", title=f"{mech_id} at N = 2^20 (dense float32 would need 4 TiB)", source=source,
        kind="scale", status="fail" if reasons else "pass", statistic=used, threshold=limit,
        seconds=time.perf_counter() - start,
        details={**report, "call_s": call_s, "peak_over_baseline_bytes": used, "dense_float32_bytes": dense_bytes,
                 "time_limit_s": TIME_LIMIT_S, "statistic": "peak RSS above the pre-setup baseline (bytes)",
                 "reasons": reasons})


def checks() -> list[Check]:
    return [Check(f"scale/{mid}", f"{mid} at N = 2^20", src, "scale", run=lambda ctx, m=mid, s=src: _run(m, s, ctx))
            for mid, src in SCALE_MECHANISMS.items()]
