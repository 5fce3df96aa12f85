"""scale/<mechanism> and scale/<mechanism>-train: the fast path completes at N = 2^20, where a
dense N x N matrix cannot exist; -train runs forward + backward.

A deterministic, noise-free proof of sub-quadratic memory (docs/methods.md): one float32 N x N
matrix at N = 2^20 needs 4 TiB, this machine has 24 GiB. The check runs the fast path in a child
process (verify.memory.run_scale_worker) so its peak memory is its own, and passes if the output
is finite with the right shape, the peak memory above the pre-setup baseline stays below 1/1000
of one dense matrix, and one call finishes within TIME_LIMIT_S (generous: sub-quadratic time,
not speed, is the claim). The checks are generated from the registry: scale/<id> for every
record with ``scale=True``, scale/<id>-train for ``scale_train=True`` (default variant).
"""
from __future__ import annotations

from verify.mechanisms import mechanisms
from verify.registry import Mechanism
from verify.result import Check, Context, Outcome, judged

N = 2**20
TIME_LIMIT_S = 300.0
#: One dense float32 N x N matrix, and the pass threshold on peak memory: 1/1000 of it.
DENSE_BYTES = 4 * N * N
LIMIT_BYTES = DENSE_BYTES / 1000


def run_worker(mech_id: str, n: int, *, device: str, seed: int, calls: int, train: bool, timeout: float) -> dict:
    """The child process's report (verify.memory.run_scale_worker, the one memory helper)."""
    from verify.memory import run_scale_worker  # imported when run: --list needs no measuring code

    return run_scale_worker(mech_id, n, device=device, seed=seed, calls=calls, train=train, timeout=timeout)


def _run(mech: Mechanism, train: bool, ctx: Context) -> Outcome:
    # quick: one call (the first includes one-off costs such as a cached FFT spectrum: an upper bound)
    report = run_worker(mech.id, N, device=ctx.device, seed=ctx.seed, calls=1 if ctx.quick else 2, train=train,
                        timeout=TIME_LIMIT_S * 3)
    # the run's own peak above the process before any problem existed (inputs are O(N) too)
    used = report["peak_rss"] - report["baseline_rss"]
    call_s = min(report["first_s"], report["second_s"])
    what = "forward + backward" if train else "forward"
    reasons = []
    if not report["finite"]:
        reasons.append(f"{what}: non-finite values in the output")
    if report["shape"][-2] != N:
        reasons.append(f"output shape {report['shape']} lacks N={N}")
    if not used <= LIMIT_BYTES:
        reasons.append(f"peak memory {used / 2**30:.2f} GiB > {LIMIT_BYTES / 2**30:.2f} GiB")
    if not call_s <= TIME_LIMIT_S:
        reasons.append(f"one {what} call took {call_s:.1f} s > {TIME_LIMIT_S} s")
    details = {**report, "call_s": call_s, "peak_over_baseline_bytes": used, "dense_float32_bytes": DENSE_BYTES,
               "time_limit_s": TIME_LIMIT_S, "train": train,
               "statistic": f"peak memory of {what} above the pre-setup baseline (bytes)"}
    return judged(not reasons, used, reasons, **details)


def check_for(mech: Mechanism, train: bool = False) -> Check:
    """scale/<id> (train: scale/<id>-train) of one record (registered or not)."""
    if train:
        return Check(f"scale/{mech.id}-train", f"{mech.id}: forward + backward at N = 2^20 (dense float32 would need "
                     "4 TiB)", mech.source, "scale", run=lambda ctx: _run(mech, True, ctx), threshold=LIMIT_BYTES,
                     compare="<=", unit="bytes")
    return Check(f"scale/{mech.id}", f"{mech.id} at N = 2^20 (dense float32 would need 4 TiB)", mech.source, "scale",
                 run=lambda ctx: _run(mech, False, ctx), threshold=LIMIT_BYTES, compare="<=", unit="bytes")


def checks() -> list[Check]:
    """scale/<id> (and right after it scale/<id>-train) for every flagged record, in registry order."""
    out = []
    for m in mechanisms():
        if m.scale:
            out.append(check_for(m, False))
        if m.scale_train:
            out.append(check_for(m, True))
    return out
