"""Select, run and report checks: the engine behind ``python -m verify`` and the report."""
from __future__ import annotations

import json
import math
import operator
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from results.check import Check, CheckResult, Context
from verify.checks import all_checks


def check_seed(seed) -> int:
    """A base seed: an int >= 0 (numpy's SeedSequence, behind every check's generators, refuses
    negative seeds; torch would wrap them). Returns it; ValueError otherwise."""
    try:
        value = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        value = None
    if value is None or value < 0:
        raise ValueError(f"the seed must be an int >= 0 (numpy.random.SeedSequence refuses negative seeds), got {seed!r}")
    return value


def check_device(device) -> str:
    """A device the checks can measure on: a torch device string that parses, is not "meta" (it
    holds no data: nothing can be computed or measured on it), and can hold a tensor on this
    machine (cuda without CUDA, an absent cuda:N, mps or xpu without support are refused).
    Returns it unchanged; ValueError naming the device and what was expected otherwise."""
    import torch

    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"the device must be a torch device string such as cpu, cuda or cuda:1, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"the device must be a torch device string such as cpu, cuda or cuda:1, got {device!r} "
                         f"({exc})") from None
    if dev.type == "meta":
        raise ValueError(f"the device {device!r} holds no data, so no check can compute or measure anything on it; "
                         f"use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"the device {device!r}: CUDA is not available on this machine")
    try:
        torch.zeros(1, device=dev)
    except Exception as exc:  # an absent index, a backend torch was not built with, ...
        raise ValueError(f"the device {device!r} cannot hold a tensor on this machine "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    return device


def check_belongs_to(check_id: str, mech_id: str) -> bool:
    """Whether a check id is about one mechanism (or, generally, has that name after its family):
    "<family>/<id>", "<family>/<id>/...", and the scale family's "<family>/<id>-<suffix>"
    (scale/linear-train). O(len(check_id)).

        >>> from verify.runner import check_belongs_to
        >>> check_belongs_to("scale/linear-train", "linear"), check_belongs_to("equivalence/linear-x", "linear")
        (True, False)
    """
    family, _, tail = check_id.partition("/")
    return tail == mech_id or tail.startswith(mech_id + "/") or (family == "scale" and tail.startswith(mech_id + "-"))


def _names(checks: list[Check]) -> list[str]:
    """The names after the family ("nodeformer" of equivalence/nodeformer, "tree-dc" of
    equivalence/tree-dc/path), in the checks' order: the bare values --only accepts besides id
    prefixes."""
    return list(dict.fromkeys(c.id.split("/")[1] for c in checks))


def _matches(check_id: str, value: str, names: set[str]) -> bool:
    """--only's rule: the id starts with value, or value is a name (_names; a mechanism id, say) and
    the check is about it (check_belongs_to: scale/nodeformer-train is about nodeformer)."""
    return check_id.startswith(value) or (value in names and check_belongs_to(check_id, value))


#: the most suggestions an unknown --only value lists (the rest are counted)
_SUGGESTIONS = 12


def _suggest(value: str, checks: list[Check]) -> str:
    """The error for an --only value that matches no check, with 'did you mean' suggestions: the
    valid values that contain it (for a bare value the names after the family, such as mechanism
    ids; for one with a "/" the ids and family prefixes), else difflib's close matches."""
    ids, names = [c.id for c in checks], _names(checks)
    paths = list(dict.fromkeys([cid.partition("/")[0] + "/" for cid in ids] + ids))
    pools = (paths, names) if "/" in value else (names, paths)
    low = value.lower()
    near = next((hits for pool in pools if (hits := [x for x in pool if low in x.lower()])), [])
    if not near:
        import difflib

        near = next((hits for pool in pools if (hits := difflib.get_close_matches(value, pool, n=6, cutoff=0.6))), [])
    why = "no id starts with it" + ("" if "/" in value else " and no check id has it as its name (a mechanism id)")
    lines = [f"--only {value} matches no check: {why}"]
    if near:
        more = len(near) - _SUGGESTIONS
        lines.append("did you mean: " + ", ".join(near[:_SUGGESTIONS]) + (f" (and {more} more)" if more > 0 else ""))
    lines.append("python -m verify --list shows every id")
    return "\n".join(lines)


def select(checks: list[Check], only: list[str] | None = None, quick: bool = False,
           exclude: list[str] | None = None) -> list[Check]:
    """Keep quick checks in quick mode, and those that any value of ``only`` selects: an id prefix
    (``equivalence/``, ``scale/causal``, an exact id), or a name after a family, such as a
    mechanism id (``nodeformer``: every check about it, check_belongs_to); then drop those whose
    id starts with a value of ``exclude`` (the GPU run keeps its timed families apart this way).

    Raises ValueError if a value of ``only`` matches no check at all (a typo should not pass as
    "all green"; the message suggests ids that contain it or are close to it), if the quick
    selection is empty because every match is a full-only check, or if ``only`` holds an empty
    prefix (it would select everything), and if ``exclude`` holds an empty prefix (it would drop
    everything) or drops the whole selection.
    """
    chosen = [c for c in checks if (c.quick or not quick)]
    if exclude is not None and any(not isinstance(p, str) or not p for p in exclude):
        raise ValueError(f"--exclude needs non-empty check id prefixes (an empty one would drop every check), "
                         f"got {exclude}")
    if only is not None and any(not isinstance(p, str) or not p for p in only):
        raise ValueError(f"--only needs non-empty check id prefixes (an empty one would select every check), "
                         f"got {only}")
    if only:
        names = set(_names(checks))
        unknown = [p for p in only if not any(_matches(c.id, p, names) for c in checks)]
        if unknown:
            raise ValueError("\n".join(_suggest(p, checks) for p in unknown))
        chosen = [c for c in chosen if any(_matches(c.id, p, names) for p in only)]
        if not chosen:
            full = [c.id for c in checks if any(_matches(c.id, p, names) for p in only)]
            more = f" (and {len(full) - _SUGGESTIONS} more)" if len(full) > _SUGGESTIONS else ""
            raise ValueError(f"--only {' '.join(only)} matches no check of --quick, only checks that run without "
                             f"--quick: {', '.join(full[:_SUGGESTIONS])}{more}")
    if exclude:
        kept = [c for c in chosen if not any(c.id.startswith(p) for p in exclude)]
        if not kept:
            raise ValueError(f"--exclude {' '.join(exclude)} drops every one of the {len(chosen)} selected checks")
        chosen = kept
    return chosen


def select_shard(checks: list[Check], shard: tuple[int, int], durations: dict[str, float] | None = None) -> list[Check]:
    """The checks of shard ``shard = (I, K)`` of a selection: the I-th (from 1) of K disjoint parts
    of about equal recorded duration, in the selection's order (verify.shard.partition). ValueError
    unless 1 <= I <= K."""
    from verify.shard import shard_ids

    index, count = shard
    keep = set(shard_ids([c.id for c in checks], index, count, durations))
    return [c for c in checks if c.id in keep]


def run_checks(
    quick: bool = True,
    only: list[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
    sweeps: dict | None = None,
    on_result: Callable[[CheckResult, int, int], None] | None = None,
    shard: tuple[int, int] | None = None,
    durations: dict[str, float] | None = None,
    exclude: list[str] | None = None,
) -> list[CheckResult]:
    """Run the selected checks with a progress bar and return their results.

    A check that raises is reported as a failure with its traceback in ``details``; it never
    stops the others. A bad seed or device, or an ``only`` that selects nothing, raises ValueError
    before any check runs (check_seed, check_device, select). shard (I, K): run only the I-th
    (from 1) of K disjoint parts of the selection, balanced on ``durations`` ({id: seconds};
    verify.shard.partition); that part may be empty. exclude: id prefixes to leave out (select). sweeps: a cache of measured sweeps
    shared by every check's Context (results.check.Context.sweeps; e.g. measure's, so
    complexity checks reuse its sweeps). on_result(result, i, total): called as each check
    finishes (i counts from 1), so a caller can print it and save what finished before a run is
    stopped (``python -m verify`` prints ``progress_line`` and rewrites its JSON there).
    """
    check_seed(seed)
    check_device(device)
    sweeps = {} if sweeps is None else sweeps
    chosen = select(all_checks(), only, quick, exclude)
    if shard is not None:
        chosen = select_shard(chosen, shard, durations)
    results: list[CheckResult] = []
    bar = tqdm(chosen, desc="verify", unit="check", disable=not progress, leave=False)
    for i, check in enumerate(bar, 1):
        bar.set_postfix_str(check.id)
        ctx = Context(quick=quick, device=device, seed=seed, note=bar.set_postfix_str, sweeps=sweeps)
        start = time.perf_counter()
        try:
            res = check.evaluate(ctx)
        except Exception as exc:  # report, do not hide
            res = check.error_result(exc, traceback.format_exc())
        res.seconds = time.perf_counter() - start
        results.append(res)
        if on_result is not None:
            on_result(res, i, len(chosen))
    return results


def seed_sweep(
    seeds: int, quick: bool = True, only: list[str] | None = None, device: str = "cpu", progress: bool = True
) -> dict[str, dict]:
    """Run the selected checks for seeds 0..seeds-1 and count failures per check id.

    This measures the real false-failure rate of each check (docs/methods.md: "a separate seed
    sweep measures the real false-failure rate; record it"). Returns
    {id: {"runs": seeds, "failures": k, "failed_seeds": [...], "rate": k / seeds}}.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an int >= 1, got {seeds!r}")
    check_device(device)
    select(all_checks(), only, quick)  # a selection of nothing fails now, not after the first seed
    counts: dict[str, dict] = {}
    for seed in tqdm(range(seeds), desc="seeds", disable=not progress):
        for r in run_checks(quick=quick, only=only, device=device, seed=seed, progress=False):
            c = counts.setdefault(r.id, {"runs": 0, "failures": 0, "failed_seeds": []})
            c["runs"] += 1
            if r.status == "fail":
                c["failures"] += 1
                c["failed_seeds"].append(seed)
    for c in counts.values():
        c["rate"] = c["failures"] / c["runs"]
    return counts


def _number(x: float) -> str:
    return f"{x:.3g}"


def format_value(x, unit: str = "") -> str:
    """A statistic or threshold for people: bytes as KiB/MiB/GiB/TiB, seconds as s/ms/us, else 3
    significant digits; None as "-"."""
    if x is None:
        return "-"
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return str(x)
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if unit == "bytes":
        size = abs(x)
        for name, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if size >= scale:
                return f"{x / scale:.3g} {name}"
        return f"{x:.0f} B"
    if unit == "seconds":
        size = abs(x)
        if size >= 1 or size == 0:
            return f"{x:.3g} s"
        if size >= 1e-3:
            return f"{x * 1e3:.3g} ms"
        return f"{x * 1e6:.3g} us"
    return _number(x)


#: Units format_value writes into the value itself; the others get the unit column.
_IN_VALUE = ("bytes", "seconds")


def format_table(results: list[CheckResult]) -> str:
    """A fixed-width table (id, source, status, statistic, compare, threshold, unit, seconds), the
    tally, and then, for every failing check, its reasons (details["reasons"], or the error)."""
    head = ("id", "source", "status", "statistic", "pass if", "threshold", "unit", "seconds")
    rows = [head]
    for r in results:
        rows.append((r.id, r.source, r.status.upper() if r.status == "fail" else r.status,
                     format_value(r.statistic, r.unit), r.compare or "-",
                     format_value(r.threshold, r.unit), "-" if r.unit in _IN_VALUE or not r.unit else r.unit,
                     f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n_pass = sum(r.status == "pass" for r in results)
    n_fail = sum(r.status == "fail" for r in results)
    n_skip = sum(r.status == "skip" for r in results)
    unsettled = [r for r in results if r.status == "inconclusive"]
    lines.append("(pass if: statistic <op> threshold, plus any further conditions a failing check lists below)")
    lines.append(f"\n{n_pass} passed, {n_fail} failed, {n_skip} skipped"
                 + (f", {len(unsettled)} inconclusive (neither passed nor failed)" if unsettled else ""))
    failing = [r for r in results if r.status == "fail"]
    if failing:
        lines.append("\nWhy they failed:")
        for r in failing:
            lines.append(f"{r.id}:")
            lines.extend(f"  - {reason}" for reason in r.reasons)
    if unsettled:
        lines.append("\nWhy they could not conclude:")
        lines.extend(f"{r.id}:\n  - {r.details.get('reason') or 'no reason recorded'}" for r in unsettled)
    return "\n".join(lines)


def progress_line(res: CheckResult, i: int, total: int) -> str:
    """One finished check in one line: ``[  3/173] pass  id  statistic <= threshold  (1.2 s)``,
    with a failure's first reason after it."""
    width = len(str(total))
    status = res.status.upper() if res.status == "fail" else res.status
    value = format_value(res.statistic, res.unit)
    if res.compare and res.threshold is not None:
        value += f" {res.compare} {format_value(res.threshold, res.unit)}"
    line = f"[{i:>{width}}/{total}] {status:<4}  {res.id}  {value}  ({res.seconds:.1f} s)"
    reasons = res.reasons or ([str(res.details["reason"])] if res.status == "inconclusive"
                              and isinstance(res.details, dict) and res.details.get("reason") else [])
    return f"{line}: {reasons[0]}" if reasons else line


def write_text(path: str | Path, text: str) -> None:
    """Write text to path, creating its parent folders. Atomic: the text goes to a temporary file
    in the same folder, which then replaces ``path``, so a reader (or a run killed mid-write)
    never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(results: list[CheckResult], path: str | Path) -> None:
    """Write the results as a JSON list in the docs/design.md schema (parent folders are created;
    atomic, so ``python -m verify`` can rewrite it after every check)."""
    write_text(path, json.dumps([r.to_dict() for r in results], indent=2))


def write_sweep_json(counts: dict[str, dict], path: str | Path) -> None:
    """Write seed_sweep's counts as a JSON object {id: {runs, failures, failed_seeds, rate}}
    (parent folders are created, as for write_json)."""
    write_text(path, json.dumps(counts, indent=2))
