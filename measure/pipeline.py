"""Run the stages in order and assemble one results.schema.Results (see measure)."""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from measure import stages
from measure.environment import LoadLog, environment
from results.schema import Results

DEFAULT_OUT = Path("reports") / "out" / "results.json"
ROUNDS = {True: 3, False: 5}  # quick, full: the complexity checks' rounds, so their sweeps are shared


@dataclass
class Options:
    """What one run measures (the CLI's flags; tests build it directly)."""

    quick: bool = False
    device: str = "cpu"
    rounds: int | None = None  # None: ROUNDS[quick]
    only: list[str] = field(default_factory=list)  # mechanism ids; empty: all
    skip_variants: bool = False
    skip_memory: bool = False
    skip_verify: bool = False
    verify_full: bool = False
    verify_json: str | None = None
    progress: bool = True
    argv: list[str] | None = None  # recorded as the command; None: sys.argv
    skip_training: bool = False  # the training demo (issue 13; stages.training_stage); --only skips it too
    skip_peers: bool = False  # the quick peer suite (stages.peers_stage); --only skips it too
    skip_history: bool = False  # asv's exponents for this commit (stages.history_stage); --only skips it too
    skip_distributed: bool = False  # sharded attention's scaling (stages.distributed_stage); --only skips it too

    @property
    def sweep_rounds(self) -> int:
        return self.rounds or ROUNDS[self.quick]


def status(msg: str) -> None:
    print(f"[measure] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stage(name: str, seconds: dict[str, float], load: LoadLog, threads: int):
    """Time one stage, sample the load at its start and end, print status lines."""
    status(f"{name} ...")
    load.start(name, threads)
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 2)
        load.end(name)
        status(f"{name} done in {seconds[name]:.1f} s")


def select_mechanisms(only: list[str]):
    """The registry's mechanisms, or those named in ``only`` (KeyError listing the known ids)."""
    from verify.mechanisms import mechanisms

    mechs = mechanisms()
    if not only:
        return mechs
    known = {m.id for m in mechs}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise KeyError(f"unknown mechanism(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [m for m in mechs if m.id in only]


def _without_variants(mech):
    """``mech`` restricted to its default variant (--skip-variants)."""
    from dataclasses import replace

    return replace(mech, variants=mech.variants[:1]) if len(mech.variants) > 1 else mech


def collect(opts: Options) -> Results:
    """Run every stage that ``opts`` asks for and return the Results (no file written)."""
    import torch

    mechs = select_mechanisms(opts.only)
    timed = [_without_variants(m) for m in mechs] if opts.skip_variants else mechs
    rounds = opts.sweep_rounds
    load = LoadLog()
    res = Results(environment(opts.quick, opts.device, rounds, stages.SWEEP_THREADS, opts.argv),
                  [stages.mechanism_info(m) for m in mechs])
    secs = res.stage_seconds
    errors: dict[str, str] = {}
    cache: dict = {}
    status(f"{'quick' if opts.quick else 'full'} measurement of {len(mechs)} mechanisms: "
           f"{', '.join(m.id for m in mechs)}")

    # Timing first, in a process that has done nothing else yet.
    with _stage("sweeps", secs, load, stages.SWEEP_THREADS):
        res.sweeps, res.comparisons = stages.sweeps_stage(timed, opts.quick, rounds, opts.device, cache,
                                                          opts.progress, status)
    if not opts.skip_memory:
        with _stage("memory", secs, load, stages.MEMORY_JOBS):
            res.memory = _guard("memory", errors, lambda: stages.memory_stage(
                mechs, opts.quick, opts.device, opts.progress, status=status)) or []
    with _stage("favor_error", secs, load, 1):
        res.favor_error = _guard("favor_error", errors, lambda: stages.favor_stage(opts.quick, opts.progress))
    with _stage("favor_accuracy", secs, load, stages.ACCURACY_THREADS):
        res.favor_accuracy = _guard("favor_accuracy", errors,
                                    lambda: stages.favor_accuracy_stage(opts.quick, opts.progress))
    with _stage("gallery", secs, load, 1):
        res.gallery = _guard("gallery", errors, lambda: stages.gallery_stage(mechs, opts.progress, status))
    if opts.verify_json:
        res.checks = stages.load_checks(opts.verify_json)
        res.checks_note = f"Results loaded from {opts.verify_json}."
    elif opts.skip_verify:
        res.checks_note = "Checks not run (--skip-verify)."
    else:
        with _stage("checks", secs, load, torch.get_num_threads()):
            res.checks, res.checks_note = stages.checks_stage(
                not opts.verify_full, opts.device, cache, [m.id for m in mechs] if opts.only else None,
                opts.progress, status)
    if opts.only and not opts.skip_training:
        status("training demo skipped: --only restricts the run to some mechanisms (the demo is about none)")
    elif not opts.skip_training:
        with _stage("training", secs, load, 1):
            res.training = _guard("training", errors, lambda: stages.training_stage(
                opts.quick, opts.progress, status))
    if opts.only and not opts.skip_distributed:
        status("distributed scaling skipped: --only restricts the run to some mechanisms")
    elif not opts.skip_distributed:
        from measure.distributed import THREADS_PER_RANK, WORLDS

        with _stage("distributed", secs, load, THREADS_PER_RANK * max(WORLDS)):
            res.distributed = _guard("distributed", errors, lambda: stages.distributed_stage(opts.quick, status))
    from measure.suites import HISTORY_THREADS, PEER_THREADS

    for name, skip, threads, run in (
            ("peers", opts.skip_peers, PEER_THREADS, lambda: stages.peers_stage(opts.device, opts.quick, status)),
            ("history", opts.skip_history, HISTORY_THREADS, lambda: stages.history_stage(status))):
        if opts.only and not skip:
            status(f"{name} skipped: --only restricts the run to some mechanisms")
        elif not skip:
            with _stage(name, secs, load, threads):
                note = _guard(name, errors, run)
            if note:
                res.environment[f"{name}_run"] = note
    res.environment["load"] = load.summary()
    res.environment["load_warning"] = load.warning()
    if errors:
        res.environment["stage_errors"] = errors
    if res.environment["load_warning"]:
        status(f"WARNING: {res.environment['load_warning']}")
    return res


def _guard(name: str, errors: dict[str, str], fn):
    """Run one stage; an exception is recorded (environment["stage_errors"]) instead of raised."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the JSON should still hold the other stages
        errors[name] = f"{type(exc).__name__}: {exc}"
        status(f"{name} failed: {errors[name]}")
        return None


def summary_lines(res: Results) -> list[str]:
    """One line per sweep and the checks' tally, for the terminal."""
    lines = []
    for s in res.sweeps:
        slope = "-" if s.fit is None else f"{s.fit.slope:.2f} [{s.fit.low:.2f}, {s.fit.high:.2f}]"
        extra = f"  cost fit {s.cost_fit.slope:.2f}" if s.cost_fit else ""
        err = f"  STOPPED at N = {s.error_n}" if s.error else ""
        lines.append(f"  {s.mechanism:<16} {s.variant:<18} {s.impl:<5} slope {slope}{extra}{err}")
    for c in res.comparisons:
        if c.crossover is None:
            cross = "never (in fits)"
        else:
            lo = "-" if c.crossover_low is None else f"{c.crossover_low:,.0f}"
            hi = "-" if c.crossover_high is None else f"{c.crossover_high:,.0f}"
            cross = f"{c.crossover:,.0f} [{lo}, {hi}]" + (" extrapolated" if c.extrapolated else "")
        lines.append(f"  {c.mechanism:<16} crossover {cross}")
    if res.checks is not None:
        fails = [r.id for r in res.checks if r.status == "fail"]
        unsure = [r.id for r in res.checks if r.status == "inconclusive"]
        lines.append(f"checks: {len(res.checks) - len(fails)} of {len(res.checks)} not failed"
                     + (f"; FAILED: {', '.join(fails)}" if fails else "")
                     + (f"; inconclusive: {', '.join(unsure)}" if unsure else ""))
    return lines
