"""The stages of ``python -m measure``: each takes registry records and returns schema data.

The pipeline (measure.pipeline) calls them through this module's attributes, so tests can
replace one stage (monkeypatch) and run the rest for real.
"""
from __future__ import annotations

import inspect
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from results.schema import Comparison, MechanismInfo, MemoryCurve, SweepResult, VariantInfo, num

#: Threads the sweeps pin torch to (recorded in the environment).
SWEEP_THREADS = 1
#: Non-default variants: an N gets no further round once its timed measurements used this many
#: seconds (quick, full), as the old per-family tree stage did; the default variant's sweeps get
#: every round (the complexity checks reuse them).
VARIANT_POINT_BUDGET_S = {True: 0.5, False: 0.5}
#: Memory children run this many at a time (memory is per process: side by side does not disturb it).
MEMORY_JOBS = 2

Status = Callable[[str], None]


def _bar(total: int, desc: str, unit: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not progress)


def mechanism_info(mech) -> MechanismInfo:
    """The registry facts a report shows about one mechanism, variants included."""
    return MechanismInfo(
        id=mech.id, title=mech.title, source=mech.source, complexity=mech.complexity, exact=mech.exact,
        has_dense=mech.dense_setup is not None, notes=mech.notes,
        variants=[VariantInfo(v.name, v.title, v.sweep) for v in mech.all_variants],
        cost_factor_name=mech.cost_factor_name, scale=mech.scale, scale_train=mech.scale_train)


# ------------------------------------------------------------------------------ sweeps


def sweep_jobs(mechs, quick: bool) -> list[tuple]:
    """(mech, variant name, impl, sizes) to time: every mechanism's fast path and dense twin on its
    default variant (the mode's grids), then every other variant with sweep=True, fast path only, on
    its quick grid in both modes (15 tree variants at full grids took ~10 of a full report's minutes)."""
    jobs = []
    for m in mechs:
        default = m.default_variant
        jobs.append((m, default.name, "fast", m.sizes("fast", quick, default)))
        if m.dense_setup is not None:
            jobs.append((m, default.name, "dense", m.sizes("dense", quick, default)))
    for m in mechs:
        for v in m.all_variants[1:]:
            if v.sweep:  # quick grids in both modes: the variant views compare shapes, the budget is tight
                jobs.append((m, v.name, "fast", m.sizes("fast", True, v)))
    return jobs


def sweeps_stage(mechs, quick: bool, rounds: int, device: str, cache: dict, progress: bool = True,
                 status: Status = lambda msg: None) -> tuple[list[SweepResult], list[Comparison]]:
    """Time every job of ``sweep_jobs`` (measure.timing.sweep, threads pinned to SWEEP_THREADS,
    seed 0, results stored in ``cache``; non-default variants with VARIANT_POINT_BUDGET_S), fit
    them, and compare each default variant's fast path with its dense twin. One tqdm bar over all
    measurements. Never raises for one mechanism."""
    from measure.timing import Sweep, compare, sweep

    jobs = sweep_jobs(mechs, quick)
    sweeps: dict[tuple, Sweep] = {}
    results: list[SweepResult] = []
    with _bar(sum(rounds * len(j[3]) for j in jobs), "sweeps", "pt", progress) as bar:
        for m, vname, impl, sizes in jobs:
            bar.set_postfix_str(f"{m.id}/{vname}/{impl}")
            budget = None if vname == m.default_variant.name else VARIANT_POINT_BUDGET_S[quick]
            try:
                s = sweep(m, impl, sizes, variant=vname, rounds=rounds, device=device, threads=SWEEP_THREADS,
                          seed=0, progress=bar, cache=cache, point_budget=budget)
            except Exception as exc:  # noqa: BLE001 - bad records are reported, the others still run
                bar.update(rounds * len(sizes))
                s = Sweep(m.id, impl, str(device), "float32", SWEEP_THREADS, [], [], rounds, variant=vname,
                          error=f"{type(exc).__name__}: {exc}")
            if s.error:
                status(f"  sweep {m.id}/{vname}/{impl} stopped: {s.error}")
            sweeps[m.id, vname, impl] = s
            results.append(s.to_result())
    comparisons = []
    for m in mechs:
        key = (m.id, m.default_variant.name)
        fast, dense = sweeps.get((*key, "fast")), sweeps.get((*key, "dense"))
        if fast is None or dense is None or not fast.sizes or not dense.sizes:
            continue
        comparisons.append(compare(fast, dense))
    return results, comparisons


# ------------------------------------------------------------------------------ memory


def memory_stage(mechs, quick: bool, device: str, progress: bool = True, jobs: int = MEMORY_JOBS,
                 status: Status = lambda msg: None) -> list[MemoryCurve]:
    """Peak memory vs N (measure.memory.memory_curves: one child per mechanism, its fast path then
    its dense twin, default variant, quick caps), ``jobs`` children at a time; curves in
    (mechanism, fast, dense) order."""
    from measure.memory import memory_curves, memory_sizes

    # one child per mechanism: a child's import (torch and the registry, ~5 s on 2 cores) is paid
    # once for both impls; with the dense twins stopping at 2^13 no child runs long enough for
    # another to queue behind its tail
    tasks = [(m.id, m.default_variant.name,
              [(impl, memory_sizes(m, impl, quick)) for impl in ("fast", "dense")
               if impl == "fast" or m.dense_setup is not None]) for m in mechs]
    lock = threading.Lock()
    with _bar(sum(len(s) for t in tasks for _, s in t[2]), "memory", "pt", progress) as bar:

        def tick():
            with lock:
                bar.update(1)

        def one(task):
            mech_id, vname, impls = task
            curves = memory_curves(mech_id, impls, variant=vname, device=device, on_point=tick)
            with lock:
                bar.update(sum(len(s) for _, s in impls) - sum(len(c.points) for c in curves))
            return curves

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            curves = [c for group in pool.map(one, tasks) for c in group]
    for c in curves:
        if c.error:
            status(f"  memory {c.mechanism}/{c.impl}: {c.error}")
    return curves


# ------------------------------------------------------------------------------ experiments


def favor_stage(quick: bool, progress: bool = True):
    """The FAVOR+ error-vs-m experiment (measure.experiments.favor_error)."""
    from measure.experiments import FAVOR_DRAWS, favor_error

    return favor_error(draws=FAVOR_DRAWS[quick], progress=progress)


#: Torch threads of the FAVOR+ accuracy stage: its calls are small (N <= 1024), and two threads on
#: a busy 2-core machine ran it ~10x slower than one (oversubscription).
ACCURACY_THREADS = 1


def favor_accuracy_stage(quick: bool, progress: bool = True):
    """FAVOR+ attention against exact softmax over (q, k std, m) (measure.experiments.favor_accuracy)
    at the mode's (N, seeds), torch pinned to ACCURACY_THREADS for the stage (restored after)."""
    import torch

    from measure.experiments import ACCURACY_SIZE, favor_accuracy

    n, seeds = ACCURACY_SIZE[quick]
    old = torch.get_num_threads()
    torch.set_num_threads(ACCURACY_THREADS)
    try:
        return favor_accuracy(n, seeds, progress=progress)
    finally:
        torch.set_num_threads(old)


def gallery_stage(mechs, progress: bool = True, status: Status = lambda msg: None):
    """The mask gallery (measure.experiments.mask_gallery) at N = 64."""
    from measure.experiments import mask_gallery

    mechs = list(mechs)
    with _bar(sum(m.dense_mask is not None for m in mechs), "mask gallery", "mask", progress) as bar:
        gallery = mask_gallery(mechs, progress=bar)
    for p in gallery.panels:
        if p.error:
            status(f"  mask gallery: {p.id} failed: {p.error}")
    return gallery


# ------------------------------------------------------------------------------ checks


def load_checks(path: str | Path) -> list:
    """Checks from a ``python -m verify --json`` file (a list of results; a {"checks": [...]} object
    is accepted too)."""
    from results.check import CheckResult

    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data.get("checks")
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of check results (python -m verify --json), "
                         f"got {type(data).__name__}")
    return [CheckResult(**{**r, "statistic": num(r.get("statistic")), "threshold": num(r.get("threshold"))})
            for r in data]


def checks_stage(quick: bool, device: str, cache: dict, only_mechanisms: list[str] | None = None,
                 progress: bool = True, status: Status = lambda msg: None) -> tuple[list | None, str]:
    """Run verify.runner.run_checks (quick or full) sharing the sweep cache, so complexity/<id>
    reuses the sweeps of the same grid; returns (results or None, note). only_mechanisms: run only
    the checks about these mechanisms (``verify.runner.check_belongs_to``)."""
    from results.check import Context
    from verify.runner import check_belongs_to, run_checks

    mode = "--quick" if quick else "full"
    kwargs: dict = {"quick": quick, "device": device, "progress": progress}
    if only_mechanisms:
        from verify.checks import all_checks

        ids = [c.id for c in all_checks() if any(check_belongs_to(c.id, m) for m in only_mechanisms)]
        if not ids:
            return None, f"no check is about {', '.join(only_mechanisms)}: checks not run"
        kwargs["only"] = ids
    params = inspect.signature(run_checks).parameters
    if "sweeps" in params:
        kwargs["sweeps"] = cache
        shared = "sharing the sweep stage's cache"
    elif "context" in params:
        kwargs["context"] = Context(quick=quick, device=device, sweeps=cache)
        shared = "sharing the sweep stage's cache"
    else:
        shared = "without the sweep cache (run_checks takes none): complexity checks timed again"
    if "on_result" in params:  # a line per finished check, as python -m verify prints them
        from verify.runner import progress_line

        kwargs["on_result"] = lambda res, i, total: status(progress_line(res, i, total))
    note = f"python -m verify {mode}, run by measure {shared}."
    try:
        return run_checks(**kwargs), note
    except Exception as exc:  # noqa: BLE001 - the JSON should still hold everything else
        note = f"verify could not run: {type(exc).__name__}: {exc}"
        status(note)
        return None, note


# ------------------------------------------------------------------------------ training demo (issue 13)


def training_stage(quick: bool, progress: bool = True, status: Status = lambda msg: None):
    """The training demo (measure.training.train_all): NodeFormer, SGFormer, DIFFormer and an MLP
    on the small graphs of measure.datasets, several seeds each (3 seeds x 80 epochs quick,
    5 x 150 full), torch pinned to measure.training.THREADS thread(s) while it runs."""
    from measure.training import table, train_all

    res = train_all(quick=quick, progress=progress, status=status)
    for line in table(res):
        status(f"  {line}")
    return res


def distributed_stage(quick: bool, status: Status = lambda msg: None):
    """Sharded attention on 1, 2 and 4 gloo ranks (measure.distributed.scaling): weak and strong
    scaling, bytes sent per rank against N, world size 1 on CUDA where a GPU is present."""
    from measure.distributed import scaling

    res = scaling(quick, status=status)
    for p in res.points:
        eff = "" if p.efficiency is None else f", efficiency {p.efficiency:.2f} [{p.efficiency_low:.2f}, " \
                                              f"{p.efficiency_high:.2f}]"
        status(f"  {p.kind} {p.world} rank(s), N = {p.n}: median {p.median:.3f} s{eff}")
    return res


# ------------------------------------------------------------------------------ the suites beside the package


def peers_stage(device: str, quick: bool = False, status: Status = lambda msg: None) -> str:
    """The peer suite's quick grid and summary (measure.suites.run_peers; ``quick``: one width):
    the one-line note the environment records ("quick peer grid on cpu in 35 s", or why it did
    not run)."""
    from measure.suites import run_peers

    run = run_peers(device, status, quick=quick)
    status(f"  peers: {run.note}" + ("" if run.ok else f" (the Peers section says so; {run.command} runs it)"))
    return run.note


def history_stage(status: Status = lambda msg: None) -> str:
    """asv's exponent benchmarks for this commit (measure.suites.run_history): the note, as
    peers_stage."""
    from measure.suites import run_history

    run = run_history(status)
    status(f"  history: {run.note}" + ("" if run.ok else f" (the History section says so; {run.command} runs asv)"))
    return run.note
