"""distributed/<case>: sharded attention on 2 and 4 gloo ranks equals one process on the whole
sequence (issue 26), for every case of verify.sharding (linear, linear-causal, packing, padding,
favor, favor-causal, kernelized-softmax, gumbel, sgformer, difformer).

Protocol. For each world size in WORLDS, verify.ranks starts that many processes on 127.0.0.1
(gloo, a free port, one torch thread each); every rank draws the whole problem from the seed, keeps
its contiguous slice along N (fast.distributed.shard_bounds) and runs the sharded function on it,
forward and backward of <G, out>, in float64 and float32. The checking process runs fast/'s
one-process function on the whole problem in the same dtype. Per rank, case and dtype, the
relative Frobenius error of the rank's output rows, and of its gradient rows of each input,
against the same rows of the one-process run (verify.checks.equivalence.slice_errors, per
(batch, head) slice where there are such). Bounds: float64 FLOAT64_TOL = 1e-12 (the issue's;
the sharded sums differ from one process's only in the order of their terms: O(log(world) u)
relative per sum, u = 1.1e-16, times the condition of the division), float32 the equivalence
bound (verify.checks.equivalence.TOL["float32"]). The statistic is the worst error over its bound
(ranks, worlds, dtypes, output and gradients), <= 1 to pass.

Cost: all ten cases run in ONE launch per world size (2 + 4 = 6 processes, each importing
torch; 12 to 17 s for the ten on two cores at load 2 to 4), cached per (seed, world) for the
family's checks of one run, so ``--only distributed/linear`` costs as much as the whole family.
A launch that fails (a rank exits non-zero) or hangs past LAUNCH_TIMEOUT seconds fails every
case it carried with the rank's error, after every rank's process group is killed
(verify.ranks). A case whose sharded function raises fails on its own; a case whose
fast.distributed function this checkout lacks is skipped, saying so. The bytes each rank sent
(fast.distributed.count_communication, forward and backward) go into the details.
"""
from __future__ import annotations

import time

import numpy as np

from results.check import Check, Context, Outcome, judged
from verify.checks.equivalence import TOL, slice_errors

#: world sizes every case runs at
WORLDS = (2, 4)
#: float64 bound on sharded vs one process (relative Frobenius error)
FLOAT64_TOL = 1e-12
BOUNDS = {"float64": FLOAT64_TOL, "float32": TOL["float32"]}
#: seconds one launch (start-up of its ranks included) may take before every rank is killed
LAUNCH_TIMEOUT = 120.0
THRESHOLD = 1.0

#: (seed, world) -> the ranks' answers of one launch, or the launch's error message
_LAUNCHES: dict[tuple[int, int], list | str] = {}


def launch(seed: int, world: int) -> list | str:
    """Every case on ``world`` gloo ranks (cached per seed and world in this process): the ranks'
    answers (verify.sharding.rank_cases), or the RankError's message where the launch failed."""
    from verify.ranks import RankError, run_ranks
    from verify.sharding import DTYPES, available

    key = (seed, world)
    if key not in _LAUNCHES:
        start = time.perf_counter()
        try:
            answers = run_ranks("verify.sharding:rank_cases", world,
                                {"seed": seed, "cases": available(), "dtypes": list(DTYPES)},
                                timeout=LAUNCH_TIMEOUT)
            for a in answers:
                a["launch_seconds"] = time.perf_counter() - start
            _LAUNCHES[key] = answers
        except RankError as exc:
            _LAUNCHES[key] = str(exc)
    return _LAUNCHES[key]


def _errors(expected: dict, got: dict, rows: tuple[int, int]) -> dict[str, float]:
    """Worst per-slice relative error of the output and of each gradient, on the rank's rows."""
    start, stop = rows
    out = {"out": float(np.max(slice_errors(expected["out"].narrow(-2, start, stop - start).numpy(), got["out"])))}
    for name, g in got["grads"].items():
        e = expected["grads"][name]
        dim = -2 if e.dim() >= 2 else -1
        out[f"grad_{name}"] = float(np.max(slice_errors(e.narrow(dim, start, stop - start).numpy(), g)))
    return out


def judge(case_id: str, seed: int, launches: dict[int, list | str]) -> Outcome:
    """The Outcome of distributed/<case_id> from each world size's launch ({world: the ranks'
    answers, or the launch's error}): every rank's rows against the one-process run."""
    from verify.sharding import DTYPES, single_process

    single = {dt: single_process(case_id, seed, dt) for dt in DTYPES}
    reasons: list[str] = []
    worst, where = 0.0, None
    per_world: dict = {}
    for world, answers in launches.items():
        if isinstance(answers, str):
            reasons.append(f"{world} ranks: the launch failed: {answers}")
            per_world[world] = {"error": answers}
            continue
        info: dict = {"launch_seconds": round(answers[0].get("launch_seconds", 0.0), 2), "ranks": {}}
        for a in answers:
            r = a["rank"]
            if case_id in a["errors"]:
                reasons.append(f"{world} ranks: rank {r} raised: {a['errors'][case_id].strip().splitlines()[-1]}")
                info["ranks"][r] = {"error": a["errors"][case_id]}
                continue
            rows = a["bounds"][case_id]
            rank_info = {"rows": list(rows), "bytes_sent": a["bytes"].get(case_id)}
            for dt in DTYPES:
                errs = _errors(single[dt], a["runs"][case_id][dt], rows)
                rank_info[dt] = errs
                for what, e in errs.items():
                    ratio = e / BOUNDS[dt] if np.isfinite(e) else float("inf")  # NaN is never a pass
                    if where is None or ratio > worst:
                        worst, where = ratio, f"{world} ranks, rank {r}, {dt} {what}"
                    if not ratio <= THRESHOLD:
                        reasons.append(f"{world} ranks, rank {r}, {dt} {what}: relative error {e:.3g} > "
                                       f"{BOUNDS[dt]:g}")
            info["ranks"][r] = rank_info
        per_world[world] = info
    # a launch or a case that raised measured nothing: no statistic can pass then
    statistic = float("inf") if reasons and worst <= THRESHOLD else worst
    return judged(not reasons, statistic, reasons, worst=where, worlds=per_world,
                  float64_threshold=BOUNDS["float64"], float32_threshold=BOUNDS["float32"],
                  backend="gloo on 127.0.0.1, CPU, one torch thread per rank", timeout_s=LAUNCH_TIMEOUT,
                  statistic="max over world sizes, ranks, dtypes, the output and the input gradients of the "
                            "relative Frobenius error against one process, over its bound (float64 "
                            f"{BOUNDS['float64']:g}, float32 {BOUNDS['float32']:g})")


def _run(case_id: str, ctx: Context) -> Outcome:
    from verify.sharding import CASE_FUNCTIONS, available

    if case_id not in available():  # said in the table, never a silent pass
        return Outcome("skip", None, {"reason": f"fast.distributed has no {CASE_FUNCTIONS[case_id]} in this checkout"})
    return judge(case_id, ctx.seed, {world: launch(ctx.seed, world) for world in WORLDS})


def checks() -> list[Check]:
    from verify.sharding import CASE_TITLES

    return [Check(f"distributed/{cid}", f"sharded == one process on {' and '.join(map(str, WORLDS))} gloo ranks: "
                  f"{title}", "issue 26", "equivalence", run=lambda ctx, cid=cid: _run(cid, ctx),
                  threshold=THRESHOLD, compare="<=", unit="ratio")
            for cid, title in CASE_TITLES.items()]
